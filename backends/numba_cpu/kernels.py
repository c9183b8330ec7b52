"""Numba kernel templates and the scalar functions they are instantiated with.

Note [Kernel cache]: templates are closures over module-level scalar functions. Numba's
on-disk cache (``cache=True``) keys a closure by its code and the pickled closure cells;
a module-level function pickles by name, so every (template, scalar function) pair gets
its own stable cache entry. Numba invalidates the cache by the timestamp of the file
that defines the template, so the scalar functions live in this same file: edit one and
every kernel is recompiled, never served stale.

Every kernel is compiled for an explicit signature (``instantiate``, through
``lamina.backends.jit``) and called through its compiled entry point, skipping Numba's
per-call type dispatch.

Families (one template each): unary, binary and ternary elementwise (a flat loop for the
contiguous fast path, a strided loop for everything else), reductions and
arg-reductions over the rows of a 2-D view, and integer matmul. Complex dtypes use the
same templates with complex scalar functions (Note [Complex scalar functions]).
"""

import cmath
import ctypes
import math
import operator
import platform

import numpy as np

from lamina.backends import jit
from lamina.backends.jit import jitable

# ---------------------------------------------------------------- scalar functions
# Arithmetic


@jitable
def add(x, y):
    return x + y


@jitable
def subtract(x, y):
    return x - y


@jitable
def multiply(x, y):
    return x * y


@jitable
def divide(x, y):
    return x / y


@jitable
def floor_divide(x, y):
    return x // y  # ints: x // 0 is 0 under the numpy error model, as in NumPy


@jitable
def int_floor_divide(x, y):
    # Signed ints: Numba returns 0 for MIN // -1 (int64); NumPy wraps to MIN, as -x does.
    if y == -1:
        return -x
    return x // y


@jitable
def remainder(x, y):
    return x % y


@jitable
def power(x, y):
    return x**y  # floats only: see int_power


@jitable
def _power_by_squaring(base, y, r):
    """base ** y for y >= 0, starting from r = 1 of base's type (a literal 1 would
    turn uint64 arithmetic into float64)."""
    while y:
        if y & 1:
            r *= base
        base *= base
        y >>= 1
    return r


@jitable
def int_power(x, y):
    # Exponentiation by squaring in 64 bits, truncated on store: wraps like NumPy for
    # every exponent (Numba's ``int ** int`` switches to float pow above 2**16).
    # A negative exponent is refused before the kernel runs (numba_cpu's
    # refuse_negative_exponent; raising here breaks parallel loops); 0 keeps the
    # unchecked path (lamina.layers "checks" off) from looping forever.
    if y < 0:
        return x - x
    return _power_by_squaring(np.int64(x), y, np.int64(1))


@jitable
def uint_power(x, y):
    return _power_by_squaring(np.uint64(x), y, np.uint64(1))


@jitable
def maximum(x, y):
    return x if x > y or x != x else y  # NaN propagates, as in NumPy and PyTorch


@jitable
def minimum(x, y):
    return x if x < y or x != x else y


@jitable
def atan2(x, y):
    return math.atan2(x, y)


@jitable
def copysign(x, y):
    return math.copysign(x, y)


@jitable
def hypot(x, y):
    # the larger magnitude times sqrt(1 + r**2), r = smaller / larger, in selects, so
    # that the loop vectorizes (libm's hypot, a call per element, took 2x PyTorch's
    # time); an infinity wins over NaN (C99), two zeros give 0
    one = type(x)(1.0)
    a, b = abs(x), abs(y)
    big = a if a > b else b
    small = b if a > b else a
    r = small / big
    h = big * math.sqrt(one + r * r)
    h = big if small == 0 else h
    return type(x)(math.inf) if a == math.inf or b == math.inf else h


# Comparison and logic (the output is bool; the inputs share one dtype)


@jitable
def equal(x, y):
    return x == y


@jitable
def not_equal(x, y):
    return x != y


@jitable
def greater(x, y):
    return x > y


@jitable
def greater_equal(x, y):
    return x >= y


@jitable
def less(x, y):
    return x < y


@jitable
def less_equal(x, y):
    return x <= y


@jitable
def logical_and(x, y):
    return bool(x) and bool(y)


@jitable
def logical_or(x, y):
    return bool(x) or bool(y)


@jitable
def logical_xor(x, y):
    return bool(x) != bool(y)


# Bitwise (integers and bool)


@jitable
def bitwise_and(x, y):
    return x & y


@jitable
def bitwise_or(x, y):
    return x | y


@jitable
def bitwise_xor(x, y):
    return x ^ y


@jitable
def bitwise_left_shift(x, y):
    # Shifting by 64 or more (or a negative count) is undefined in LLVM; NumPy gives 0.
    # Narrower types are computed in 64 bits and truncated on store, which agrees.
    if y < 0 or y >= 64:
        return x - x
    return x << y


@jitable
def bitwise_right_shift(x, y):
    if y < 0 or y >= 64:
        # ~0, not x - x - 1: a literal 1 would make uint64 results float64 (and lossy)
        return ~(x - x) if x < 0 else x - x
    return x >> y


# Unary


@jitable
def identity(x):
    return x


@jitable
def negative(x):
    return -x


@jitable
def absolute(x):
    return abs(x)  # abs(-0.0) is +0.0 (Array API, NumPy); ints wrap: abs(-128) is -128


@jitable
def square(x):
    return x * x


@jitable
def abs_square(x):
    return x.real * x.real + x.imag * x.imag  # |x|**2 of a complex x, without the sqrt


@jitable
def sign(x):
    if x > 0:
        return x // x  # a one of x's own type (a literal 1 would turn uint64 into float)
    if x < 0:
        return -(x // x)
    return x  # zero


@jitable
def float_sign(x):
    # Not x // x: inf // inf is NaN. Both zeros give +0 and NaN gives NaN, as in NumPy.
    if x > 0:
        return 1.0
    if x < 0:
        return -1.0
    if x == 0:
        return 0.0
    return x


@jitable
def bitwise_invert(x):
    return ~x


@jitable
def logical_not(x):
    return not x


@jitable
def isnan(x):
    return x != x


@jitable
def isinf(x):
    return math.isinf(x)


@jitable
def isfinite(x):
    return math.isfinite(x)


@jitable
def always_true(x):
    return True


@jitable
def always_false(x):
    return False


@jitable
def signbit(x):
    return math.copysign(1.0, x) < 0


@jitable
def round_half_even(x):
    return np.round(x)


@jitable
def reciprocal(x):
    return 1.0 / x  # float32 x: computed in float64 and rounded once on store


def _nextafter(name, float_t, int_t):
    """np.nextafter for one float type, by x's bits: one step of the integer they read
    as, toward y -- away from zero adds one ulp to the magnitude -- in selects, not
    branches, so that the loop vectorizes (libm's nextafter, which NumPy and Numba call
    per element, took ~6 ns an element). From a zero the step is the smallest
    subnormal of y's sign; x == y gives y (its sign of zero) and a NaN operand NaN."""
    sign = int_t(np.iinfo(int_t).min)

    def nextafter(x, y):
        bits, ybits = float_t(x).view(int_t), float_t(y).view(int_t)
        step = bits + int_t(1) if (y > x) == (bits >= 0) else bits - int_t(1)
        step = (ybits & sign) | int_t(1) if x == 0 else step
        step = ybits if x == y else step
        return x + y if x != x or y != y else int_t(step).view(float_t)

    nextafter.__name__ = nextafter.__qualname__ = name
    globals()[name] = jitable(nextafter)  # module-level: it pickles by name (Note [Kernel cache])


_nextafter("float32_nextafter", np.float32, np.int32)
_nextafter("float64_nextafter", np.float64, np.int64)


def _math(name, fn):
    """A float scalar function calling ``fn`` (math.* or np.*), named for the cache."""
    scalar = jitable(lambda x: fn(x))
    scalar.__name__ = scalar.__qualname__ = name
    globals()[name] = scalar  # module-level, so it pickles by name (Note [Kernel cache])
    return scalar


for _name, _fn in [
    ("exp", math.exp),
    ("expm1", math.expm1),
    ("log", np.log),
    ("log1p", np.log1p),
    ("log2", np.log2),
    ("log10", np.log10),
    ("sqrt", np.sqrt),
    ("sin", math.sin),
    ("cos", math.cos),
    ("tan", math.tan),
    ("asin", np.arcsin),
    ("acos", np.arccos),
    ("atan", math.atan),
    ("sinh", math.sinh),
    ("cosh", math.cosh),
    ("tanh", math.tanh),
    ("asinh", math.asinh),
    ("acosh", np.arccosh),
    ("atanh", np.arctanh),
    ("floor", np.floor),
    ("ceil", np.ceil),
    ("trunc", np.trunc),
]:
    _math("float_" + _name, _fn)


# ---------------------------------------------------------------- vector math
# Note [Vector math]: Numba has no vector math library here (Intel's SVML is not a
# dependency), so math.exp in a loop is one libm call per element and the loop stays
# scalar. These functions are written so that LLVM vectorizes the loops that call them,
# as SLEEF's and NumPy's SIMD loops are: a range reduction, a polynomial, and the
# special cases as selects (no branch, no call, no table). Their results do not depend
# on the loop they run in (same instructions for every element, the FMA contraction
# fixed by ``contract``). The float32 ones compute in float32. Maximum errors, measured
# (tests/test_transcendental.py) over ~10**6 float32 values spread over every bit
# pattern against float64, and over random float64 bit patterns, [-800, 800] and [-2, 2]
# against long double:
#
#   function   float32   float64
#   exp        0.96 ulp  0.97 ulp   (subnormal results too)
#   log        0.76 ulp  0.78 ulp
#   tanh       1.20 ulp  1.24 ulp
#   sigmoid    2.26 ulp  2.51 ulp   (1 / (1 + exp(-|x|)), times exp(-|x|) below 0)
#   erf        4.77 ulp  libm's     (a rational function; no vector float64 erf yet)
#   logaddexp  2.59 ulp  2.47 ulp   (of the largest of |max(x, y)|, log1p(t) and
#                                    t |x - y|, t = exp(-|x - y|); NumPy's: 2.59, 2.31)
#
# Special values follow C99 (and so the Array API): exp(-inf) = 0, exp(inf) = inf,
# log(0) = -inf, log(x < 0) = NaN, tanh(+-inf) = +-1, tanh(-0.0) = -0.0, NaN in, NaN
# out. Kernels call them by x's type through vector_exp, vector_log, vector_tanh,
# vector_sigmoid and vector_erf. On AVX-512 machines the loops that call them run
# 512-bit vectors, as NumPy's SIMD loops do (``wide_vectors``; Note [Vector width] in
# lamina.backends.jit): see Note [NumPy SIMD loops] in elementwise.py for where each
# serves.
# Kernels in other files that call these (nn/activation.py) close over the stamp of this
# file, so that Numba's cache, keyed by their own file, recompiles them when it changes
# (Note [Kernel cache]).
VECTOR_OPTIONS = dict(fastmath=frozenset({"contract"}), **jit.CALLEE)
_WIDE_VECTORS = set()


def wide_vectors(fn):
    """Mark scalar function ``fn``: the loops instantiated with it compile for 512-bit
    vectors (Note [Vector width] in lamina.backends.jit); what this file's vector math
    computes per element pays for them, where a loop that only moves memory would not."""
    _WIDE_VECTORS.add(fn)
    return fn


def vector_width(fn):
    """The vector width the loops of scalar function ``fn`` compile for (None: the
    host's preferred one)."""
    return jit.WIDE if fn in _WIDE_VECTORS else None


def _float32s(*coefficients):
    return tuple(np.float32(c) for c in coefficients)


LN2 = math.log(2.0)
_F32_TINY = np.float32(np.finfo(np.float32).smallest_normal)
_F64_TINY = np.finfo(np.float64).smallest_normal
# float32 exp: Cephes' expf, on [-ln(2)/2, ln(2)/2]; beyond its limits the result is 0 or inf
_EXP_F32 = _float32s(
    1.9875691500e-4,
    1.3981999507e-3,
    8.3334519073e-3,
    4.1665795894e-2,
    1.6666665459e-1,
    5.0000001201e-1,
)
_EXP_F32_LIMITS = np.float32(-104.0), np.float32(89.0)
# float64 exp: Taylor's series to r**13 (|r| <= ln(2)/2: the rest is below 2**-60)
_EXP_F64 = tuple(1.0 / math.factorial(k) for k in range(13, 1, -1))
_EXP_F64_LIMITS = -746.0, 710.0
# log: Cephes' logf on [sqrt(1/2) - 1, sqrt(2) - 1]; fdlibm's log (its Lg1..Lg7) for float64
_LOG_F32 = _float32s(
    7.0376836292e-2,
    -1.1514610310e-1,
    1.1676998740e-1,
    -1.2420140846e-1,
    1.4249322787e-1,
    -1.6668057665e-1,
    2.0000714765e-1,
    -2.4999993993e-1,
    3.3333331174e-1,
)
_LOG_F64_EVEN = 1.531383769920937332e-01, 2.222219843214978396e-01, 3.999999999940941908e-01
_LOG_F64_ODD = (
    1.479819860511658591e-01, 1.818357216161805012e-01, 2.857142874366239149e-01,
    6.666666666666735130e-01,
)  # fmt: skip
# ln(2) in two parts: the first has few bits, so that k * it is exact for any exponent k
_LN2_F32 = np.float32(0.693359375), np.float32(-2.12194440e-4)
_LN2_F64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10
# tanh below 0.625: Cephes' tanhf polynomial and tanh's rational function
_TANH_F32 = _float32s(
    -5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1
)
_TANH_F64_P = -9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3
_TANH_F64_Q = 1.0, 1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3
# erf: XLA's and Eigen's rational function of float32 erf on [-4, 4], x P(x^2) / Q(x^2)
_ERF_F32_P = _float32s(
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
_ERF_F32_Q = _float32s(
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
)


@jitable(**VECTOR_OPTIONS)
def _horner(x, coefficients):
    """The polynomial with these coefficients (highest degree first) at x."""
    p = coefficients[0]
    for c in coefficients[1:]:
        p = p * x + c
    return p


@jitable(**VECTOR_OPTIONS)
def float32_exp(x):
    lo, hi = _EXP_F32_LIMITS
    # the clamp keeps n in int32 (NaN becomes lo: its r below stays NaN)
    clamped = x if x > lo else lo
    n = np.rint((clamped if clamped < hi else hi) * np.float32(1.4426950408889634))
    r = x - n * _LN2_F32[0] - n * _LN2_F32[1]
    p = _horner(r, _EXP_F32) * r * r + r + np.float32(1.0)
    # times 2**n as two powers of two, so that subnormal results keep their bits
    k = np.int32(n)
    half = k >> 1
    y = p * np.int32((half + 127) << 23).view(np.float32)
    y = y * np.int32((k - half + 127) << 23).view(np.float32)
    y = np.float32(0.0) if x <= lo else y  # NaN stays NaN
    return np.float32(np.inf) if x >= hi else y


@jitable(**VECTOR_OPTIONS)
def float64_exp(x):
    lo, hi = _EXP_F64_LIMITS
    clamped = x if x > lo else lo
    n = np.rint((clamped if clamped < hi else hi) * 1.4426950408889634)
    r = x - n * _LN2_F64[0] - n * _LN2_F64[1]
    p = _horner(r, _EXP_F64) * r * r + r + 1.0
    k = np.int64(n)
    half = k >> 1
    y = p * np.int64((half + 1023) << 52).view(np.float64)
    y = y * np.int64((k - half + 1023) << 52).view(np.float64)
    y = 0.0 if x <= lo else y  # NaN stays NaN
    return np.inf if x >= hi else y


@jitable(**VECTOR_OPTIONS)
def _log_special(x, y):
    """log's result y, or its value at inf, 0, a negative x or NaN."""
    y = y if x < np.inf else x
    y = y if x > 0 else (-np.inf if x == 0 else np.nan)
    return y if x == x else x


@jitable(**VECTOR_OPTIONS)
def float32_log(x):
    # x = m * 2**e with m in [sqrt(1/2), sqrt(2)): log(x) = e log(2) + log(1 + (m - 1));
    # a subnormal x is scaled by 2**23 first
    # (Numba computes int32 arithmetic in int64; each step cast back to int32 lets LLVM
    # keep the vector lanes 32 bits wide: half the instructions. Where an int32 step
    # would wrap, x is not positive and _log_special replaces the result.)
    tiny = x < _F32_TINY
    bits = np.float32(x * np.float32(8388608.0) if tiny else x).view(np.int32)
    bits = np.int32(bits - np.int32(0x3F3504F3))  # the bits of sqrt(1/2)
    e = np.float32(np.int32(bits >> 23)) - (np.float32(23.0) if tiny else np.float32(0.0))
    f = np.int32((bits & np.int32(0x007FFFFF)) + np.int32(0x3F3504F3)).view(np.float32)
    f -= np.float32(1.0)
    z = f * f
    y = _horner(f, _LOG_F32) * f * z + e * _LN2_F32[1] - np.float32(0.5) * z
    return _log_special(x, f + y + e * _LN2_F32[0])


@jitable(**VECTOR_OPTIONS)
def float64_log(x):
    tiny = x < _F64_TINY
    bits = np.float64(x * 18014398509481984.0 if tiny else x).view(np.int64)  # 2**54
    bits -= np.int64(0x3FE6A09E667F3BCD)
    e = np.float64(bits >> 52) - (54.0 if tiny else 0.0)
    f = np.int64((bits & np.int64(0x000FFFFFFFFFFFFF)) + np.int64(0x3FE6A09E667F3BCD))
    f = f.view(np.float64) - 1.0
    half_square = 0.5 * f * f
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    r = z * _horner(w, _LOG_F64_ODD) + w * _horner(w, _LOG_F64_EVEN)
    y = e * _LN2_F64[0] - ((half_square - (s * (half_square + r) + e * _LN2_F64[1])) - f)
    return _log_special(x, y)


@jitable(**VECTOR_OPTIONS)
def float32_tanh(x):
    a = abs(x)
    z = x * x
    small = _horner(z, _TANH_F32) * z * x + x
    big = np.float32(1.0) - np.float32(2.0) / (float32_exp(a + a) + np.float32(1.0))
    return math.copysign(small if a < np.float32(0.625) else big, x)  # tanh(-0.0) is -0.0


# inlined by Numba: LLVM finds it too large to inline, and then the loop stays scalar
@jitable(inline="always", **jit.CALLEE)
def float64_tanh(x):
    # one division for both ranges: x + x z P(z) / Q(z) below 0.625, else 1 - 2 / (e**2|x| + 1)
    a = abs(x)
    z = x * x
    small = a < 0.625
    num = x * z * _horner(z, _TANH_F64_P) if small else 2.0
    t = num / (_horner(z, _TANH_F64_Q) if small else float64_exp(a + a) + 1.0)
    return math.copysign(x + t if small else 1.0 - t, x)  # tanh(-0.0) is -0.0


@jitable(**VECTOR_OPTIONS)
def float32_sigmoid(x):
    e = float32_exp(-abs(x))  # never overflows; below 0, e / (1 + e) keeps tiny results
    s = np.float32(1.0) / (np.float32(1.0) + e)
    return s if x >= 0 else e * s


@jitable(**VECTOR_OPTIONS)
def float64_sigmoid(x):
    e = float64_exp(-abs(x))
    s = 1.0 / (1.0 + e)
    return s if x >= 0 else e * s


@jitable(**VECTOR_OPTIONS)
def float32_erf(x):
    # one division and no exp: 3.5x faster than an exp-based erff, at 4.8 ulp; beyond 4
    # erf rounds to +-1 (the comparisons keep NaN, which compares false)
    c = np.float32(4.0) if x > np.float32(4.0) else x
    c = np.float32(-4.0) if c < np.float32(-4.0) else c
    z = c * c
    return c * (_horner(z, _ERF_F32_P) / _horner(z, _ERF_F32_Q))  # (c p) / q underflows


@jitable
def float64_erf(x):
    return math.erf(x)  # libm's, one element at a time: no vector float64 erf yet


@wide_vectors
def vector_exp(x):
    """exp of a float32 or float64 x: float32_exp or float64_exp by x's type (in kernels;
    Note [Vector math]); likewise vector_tanh, vector_erf and vector_sigmoid."""


@wide_vectors
def vector_log(x):
    """log by x's float type (vector_exp)."""


@wide_vectors
def vector_tanh(x):
    """tanh by x's float type (vector_exp)."""


def vector_erf(x):
    """erf by x's float type (vector_exp)."""


@wide_vectors
def vector_sigmoid(x):
    """1 / (1 + exp(-x)) by x's float type (vector_exp)."""


def _lower_vector_math(numba):
    from numba.extending import overload

    def by_type(float32_fn, float64_fn):
        def implementation(x):
            fn = float32_fn if x == numba.types.float32 else float64_fn
            return lambda x: fn(x)

        return implementation

    for generic, float32_fn, float64_fn in [
        (vector_exp, float32_exp, float64_exp),
        (vector_log, float32_log, float64_log),
        (vector_tanh, float32_tanh, float64_tanh),
        (vector_erf, float32_erf, float64_erf),
        (vector_sigmoid, float32_sigmoid, float64_sigmoid),
    ]:
        # inlined into the caller's IR: a call in between keeps LLVM from vectorizing
        overload(generic, inline="always")(by_type(float32_fn, float64_fn))


jit.on_load(_lower_vector_math)


@wide_vectors
@jitable(inline="always", **jit.CALLEE)
def logaddexp(x, y):
    # max(x, y) + log1p(exp(-|x - y|)) with the vector math (Note [Vector math]), so the
    # loop vectorizes: log1p(t) for t = exp(...) in (0, 1] is log(u), u = 1 + t, plus
    # the rounding error of u, (t - (u - 1)) / u, exact by Sterbenz (tiny t: u = 1 and
    # the result t). Equal operands add log(2): for the infinities of one sign x - y is
    # NaN; a NaN operand gives NaN
    c = type(x)
    m = x if x > y or x != x else y
    t = vector_exp(-abs(x - y))
    u = c(1.0) + t
    log1p = vector_log(u) + (t - (u - c(1.0))) / u
    return x + c(LN2) if x == y else m + log1p


# ---------------------------------------------------------------- activations
# The nn activations that take no parameter are elementwise operators in all but their
# namespace (Note [Pointwise activations] in nn/activation.py): their scalar functions
# live here, beside the templates that instantiate them (Note [Kernel cache]). They
# compute in the data's dtype (type(x): its constants too) with the vector math above;
# gelu's are inlined by Numba, since LLVM finds them too large to inline, and a call
# left in the loop keeps it scalar.

SQRT_HALF = 1.0 / math.sqrt(2.0)
TANH_GELU_BETA = math.sqrt(2.0 / math.pi)
TANH_GELU_KAPPA = 0.044715


@jitable
def relu(x):
    # NaN and -0.0 pass unchanged, as in PyTorch (its clamp_min(x, 0))
    return type(x)(0.0) if x < 0 else x


# silu as PyTorch computes it, x / (1 + exp(-x)): -inf gives NaN (-inf / inf) there too
@wide_vectors
@jitable(inline="always", **jit.CALLEE)
def silu(x):
    return x / (type(x)(1.0) + vector_exp(-x))


@wide_vectors
@jitable(inline="always", **jit.CALLEE)
def gelu(x):
    c = type(x)
    return c(0.5) * x * (c(1.0) + vector_erf(x * c(SQRT_HALF)))


# 0.5 x (1 + tanh(u)) is x / (1 + exp(-2u)): one exp where tanh takes two branches, and
# no cancellation where tanh(u) nears -1
@wide_vectors
@jitable(inline="always", **jit.CALLEE)
def gelu_tanh(x):
    c = type(x)
    inner = c(TANH_GELU_BETA) * (x + c(TANH_GELU_KAPPA) * x * x * x)
    return x / (c(1.0) + vector_exp(c(-2.0) * inner))


# tanh's and sigmoid's gradients from their results (tanh_backward, sigmoid_backward):
# the formulas' products and difference in their order, one pass instead of three


@jitable
def tanh_grad(g, y):
    return g * (type(y)(1.0) - y * y)


@jitable
def sigmoid_grad(g, y):
    return g * y * (type(y)(1.0) - y)


# ---------------------------------------------------------------- complex scalar functions
# Note [Complex scalar functions]: complex tensors run the same templates as real ones,
# instantiated with these scalar functions (elementwise.py picks them by dtype kind).
# The Array API's complex special cases are C99 Annex G's (exp(1e300 + 0j) is inf + 0j,
# sin(nan j) is nan j); Numba's cmath does not follow them (inf + nan j, nan + nan j),
# but the C library's complex functions do, and NumPy calls the same ones. So the
# transcendental functions call libm's cexp, csin, ... (complex128; complex64 is
# computed in complex128 and rounded once on store, as float32 math is). Arithmetic
# follows NumPy's own loops: naive products, Smith's quotient, NumPy's power and sign.
# A platform without them (or whose complex ABI is not two doubles in registers, as on
# x86-64 and AArch64) gets Numba's cmath, with its special values.

_LIBM_ABI = platform.system() in ("Linux", "Darwin") and platform.machine().lower() in (
    "x86_64",
    "amd64",
    "aarch64",
    "arm64",
)
_libm = []  # [libm], loaded when Numba is (ctypes.util.find_library runs ldconfig)


def _libm_function(name):
    """libm's function ``name`` (a ctypes function), or None where it is missing."""
    if not _LIBM_ABI:
        return None
    if not _libm:
        import ctypes.util

        _libm.append(ctypes.CDLL(ctypes.util.find_library("m") or None))
    return getattr(_libm[0], name, None)


def _libm_complex(name, arity, fallback):
    """libm's complex128 function ``name`` (cexp, cpow, ...) for kernels: a module-level
    function (it pickles by name) computing ``fallback`` in Python, which kernels call
    as a Numba intrinsic made when Numba loads (Note [Lazy Numba]), or as ``fallback``
    (Numba's cmath) where libm lacks it. A ``double complex`` is passed and returned as
    two doubles (what clang lowers it to on x86-64 and AArch64), so the call needs no
    Numba type for C complex numbers."""
    symbol = "lamina_" + name  # registered once, for this process's JIT linker

    if arity == 1:

        def call(z):
            return fallback(z)
    else:

        def call(x, y):
            return fallback(x, y)

    call.__name__ = call.__qualname__ = "libm_" + name

    def lower(numba):
        from numba.extending import intrinsic, overload

        fn = _libm_function(name)
        if fn is None:
            if arity == 1:
                overload(call)(lambda z: lambda z: fallback(z))
            else:
                overload(call)(lambda x, y: lambda x, y: fallback(x, y))
            return

        import llvmlite.binding as llvm
        from llvmlite import ir
        from numba.core import cgutils

        llvm.add_symbol(symbol, ctypes.cast(fn, ctypes.c_void_p).value)
        c128 = numba.types.complex128

        def codegen(context, builder, sig, args):
            f64 = ir.DoubleType()
            fnty = ir.FunctionType(ir.LiteralStructType([f64, f64]), [f64] * (2 * arity))
            callee = cgutils.get_or_insert_function(builder.module, fnty, symbol)
            parts = []
            for a in args:
                z = context.make_complex(builder, c128, a)
                parts += [z.real, z.imag]
            r = builder.call(callee, parts)
            out = context.make_complex(builder, c128)
            out.real, out.imag = builder.extract_value(r, 0), builder.extract_value(r, 1)
            return out._getvalue()

        # explicit parameters: Numba lowers a typer's *args as a star-argument tuple
        if arity == 1:

            @intrinsic
            def unary(typingctx, z):
                return c128(c128), codegen

            overload(call)(lambda z: lambda z: unary(z))
        else:

            @intrinsic
            def binary(typingctx, x, y):
                return c128(c128, c128), codegen

            overload(call)(lambda x, y: lambda x, y: binary(x, y))

    jit.on_load(lower)
    return call


for _name, _fallback in [
    ("exp", cmath.exp),
    ("log", cmath.log),
    ("sqrt", cmath.sqrt),
    ("sin", cmath.sin),
    ("cos", cmath.cos),
    ("tan", cmath.tan),
    ("asin", cmath.asin),
    ("acos", cmath.acos),
    ("atan", cmath.atan),
    ("sinh", cmath.sinh),
    ("cosh", cmath.cosh),
    ("tanh", cmath.tanh),
    ("asinh", cmath.asinh),
    ("acosh", cmath.acosh),
    ("atanh", cmath.atanh),
]:
    globals()["libm_c" + _name] = _call = _libm_complex("c" + _name, 1, _fallback)
    _math("complex_" + _name, _call)  # module-level, above: it pickles by name

_LOG2E, _LOG10E = 1.0 / math.log(2.0), 1.0 / math.log(10.0)


# NumPy's own formulas (C has no complex expm1, log1p, log2, log10); a real factor
# scales each part, as a complex product would turn inf * 0 into nan


@jitable
def complex_log2(x):
    r = complex_log(x)  # noqa: F821 (made by _math above)
    return complex(r.real * _LOG2E, r.imag * _LOG2E)


@jitable
def complex_log10(x):
    r = complex_log(x)  # noqa: F821
    return complex(r.real * _LOG10E, r.imag * _LOG10E)


@jitable
def complex_expm1(x):
    a = math.sin(x.imag / 2)
    # + 0.0: an exact zero real part is +0, as exp(a) cos(b) - 1 is (the Array API's
    # expm1(-0 + 0j) = 0 + 0j, where the product of expm1(-0) = -0 keeps the sign)
    return complex(
        math.expm1(x.real) * math.cos(x.imag) - 2 * a * a + 0.0,
        math.exp(x.real) * math.sin(x.imag),
    )


@jitable
def complex_log1p(x):
    re = x.real + 1.0
    return complex(math.log(math.hypot(re, x.imag)), math.atan2(x.imag, re))


libm_cpow = _libm_complex("cpow", 2, operator.pow)


@jitable
def _cpow(x, y):
    return libm_cpow(x, y)


@jitable
def complex_divide(x, y):
    """NumPy's complex quotient (Smith's algorithm; x / 0 is a complex inf or nan)."""
    ar, ai, br, bi = x.real, x.imag, y.real, y.imag
    abs_br, abs_bi = abs(br), abs(bi)
    if abs_br >= abs_bi:
        if abs_br == 0 and abs_bi == 0:
            return complex(ar / abs_br, ai / abs_br)
        rat = bi / br
        scl = 1.0 / (br + bi * rat)
        return complex((ar + ai * rat) * scl, (ai - ar * rat) * scl)
    rat = br / bi
    scl = 1.0 / (bi + br * rat)
    return complex((ar * rat + ai) * scl, (ai * rat - ar) * scl)


@jitable
def complex_reciprocal(x):
    """NumPy's 1 / x for complex x (Smith's algorithm with a numerator of 1)."""
    re, im = x.real, x.imag
    if abs(im) <= abs(re):
        r = im / re
        d = re + im * r
        return complex(1.0 / d, -r / d)
    r = re / im
    d = re * r + im
    return complex(r / d, -1.0 / d)


@jitable
def complex_power(x, y):
    """NumPy's complex power: x**0 is 1, 0**y is 0 for real(y) > 0 (else nan), integer
    exponents below 100 in magnitude by repeated squaring, libm's cpow otherwise."""
    one = complex(1.0, 0.0)
    if y.real == 0 and y.imag == 0:
        return one
    if x.real == 0 and x.imag == 0:
        return complex(0.0, 0.0) if y.real > 0 else complex(np.nan, np.nan)
    small_integer = y.imag == 0 and abs(y.real) < 100 and y.real == int(y.real)
    if not small_integer:
        return _cpow(np.complex128(x), np.complex128(y))
    n = int(y.real)
    if n == 1:
        return np.complex128(x)
    if n == 2:
        return np.complex128(x * x)
    if n == 3:
        return np.complex128(x * (x * x))
    m, mask, acc, p = abs(n), 1, one, np.complex128(x)
    while True:
        if m & mask:
            acc = acc * p
        mask <<= 1
        if m < mask:
            break
        p = p * p
    return complex_divide(one, acc) if n < 0 else acc


@jitable
def complex_sign(x):
    """NumPy 2's sign: x / |x|, 0 at 0, nan + nan j for nan; an infinite x points along
    its infinite axis (1j for inf j), nan + nan j when both parts are infinite."""
    re, im = x.real, x.imag
    m = abs(x)
    if m != m:
        return complex(np.nan, np.nan)
    if m == np.inf:
        if math.isinf(re):
            return (
                complex(np.nan, np.nan) if math.isinf(im) else complex(math.copysign(1.0, re), 0.0)
            )
        return complex(0.0, math.copysign(1.0, im))
    if m == 0:
        return x - x
    return complex(re / m, im / m)


@jitable
def complex_isnan(x):
    return cmath.isnan(x)


@jitable
def complex_isinf(x):
    return cmath.isinf(x)


@jitable
def complex_isfinite(x):
    return cmath.isfinite(x)


@jitable
def complex_round(x):
    return np.round(x)  # each part halves to even


@jitable
def conjugate(x):
    return x.conjugate()


@jitable
def real_part(x):
    return x.real


@jitable
def imag_part(x):
    return x.imag


# ---------------------------------------------------------------- templates
# Each template takes the scalar function and ``loop`` (``range``, or ``prange`` for the
# parallel variant, compiled only once an input is big enough to need it). ``loop`` is a
# closure cell, so it is part of the cache key (Note [Kernel cache]). A unary or binary
# operator's serial loops are the C core's instead (Note [C loops by address] in
# backends/jit.py): these templates are its parallel variants, its in-place loop and a
# ternary operator's loops.


def unary_flat(fn, loop):
    def kernel(x, out):
        for i in loop(out.size):
            out[i] = fn(x[i])

    return kernel


def binary_flat(fn, loop):
    def kernel(a, b, out):
        for i in loop(out.size):
            out[i] = fn(a[i], b[i])

    return kernel


def binary_scalar(fn, loop):
    """A contiguous tensor with a scalar (``x * 2.0``, ``2.0 - x``): ``v`` is the
    scalar, already of the tensor's dtype (the entry point converts the Python number),
    ``scalar_first`` says on which side of ``fn`` it goes."""

    def kernel(a, v, out, scalar_first):
        if scalar_first:
            for i in loop(out.size):
                out[i] = fn(v, a[i])
        else:
            for i in loop(out.size):
                out[i] = fn(a[i], v)

    return kernel


# Note [In-place loops]: ``x1 op= x2`` reads and writes x1 at the same index, which
# is safe to vectorize, but passed to binary_flat as both an input and the output, x1
# fails LLVM's runtime overlap check and the loop runs one element at a time: measured
# on 589,824 float32, ``p -= g`` took 235 us that way against 68 us for binary_inplace,
# ``p -= 0.5`` 184 against 48 (``a - b`` into a new array: 96 us).


def binary_inplace(fn, loop):
    """``out = fn(out, b)`` elementwise on a contiguous ``out``: ``b`` has its size, or
    one element (a scalar, or a size-1 tensor broadcast over ``out``)."""

    def kernel(out, b):
        if b.size == 1:
            v = b[0]
            for i in loop(out.size):
                out[i] = fn(out[i], v)
        else:
            for i in loop(out.size):
                out[i] = fn(out[i], b[i])

    return kernel


def ternary_flat(fn, loop):
    def kernel(a, b, c, out):
        for i in loop(out.size):
            out[i] = fn(a[i], b[i], c[i])

    return kernel


def ternary_scalars(fn, loop):
    """A contiguous tensor with two scalars (clip's bounds, ``where(cond, 1.0, 0.0)``):
    a strided loop over the broadcast scalars took ~1.7 ns per element, this one 0.3."""

    def kernel(a, v, w, out):
        for i in loop(out.size):
            out[i] = fn(a[i], v, w)

    return kernel


@jitable
def _row_start(r, shape, strides, offset):
    """Element offset of row ``r`` (all dims but the last) of one strided operand."""
    rem = np.int64(r)  # a prange index is unsigned: uint64 % int64 would be float64
    for d in range(shape.size - 2, -1, -1):
        offset += (rem % shape[d]) * strides[d]
        rem //= shape[d]
    return offset


# Strided operands are (buffer, offset, strides): a flat 1-D view of the memory the
# operand spans, the element offset of its first element, and its element strides
# (0 where broadcast, negative where flipped). ``shape`` is the iteration shape.
# The row count is computed before the loop: ``loop(rows if inner else 0)`` keeps Numba
# from turning the prange into a parallel loop (it silently ran serially).


@jitable
def _rows(shape):
    """Rows (all dims but the last) of the iteration shape; 0 when it is empty."""
    rows = 1
    for d in range(shape.size - 1):
        rows *= shape[d]
    if shape[shape.size - 1] == 0:
        rows = 0
    return rows


# The last (innermost) dimension's strides are read once per call; when they are all 1
# the inner loop runs over row slices indexed from 0 (no multiplications, no negative-
# index wraparound), which LLVM vectorizes: a contiguous tensor plus a broadcast row,
# the bias-add pattern, runs this way.


def unary_strided(fn, loop):
    def kernel(out, oo, os, x, xo, xs, shape):
        last = shape.size - 1
        inner, so, sx = shape[last], os[last], xs[last]
        for r in loop(_rows(shape)):  # not out.size // inner: out may be a strided view
            o, i = _row_start(r, shape, os, oo), _row_start(r, shape, xs, xo)
            if so == 1 and sx == 1:
                ro, rx = out[o : o + inner], x[i : i + inner]
                for j in range(inner):
                    ro[j] = fn(rx[j])
            else:
                for j in range(inner):
                    out[o + j * so] = fn(x[i + j * sx])

    return kernel


def binary_strided(fn, loop):
    def kernel(out, oo, os, a, ao, as_, b, bo, bs, shape):
        last = shape.size - 1
        inner, so, sa, sb = shape[last], os[last], as_[last], bs[last]
        for r in loop(_rows(shape)):
            o, i, k = (
                _row_start(r, shape, os, oo),
                _row_start(r, shape, as_, ao),
                _row_start(r, shape, bs, bo),
            )
            if so == 1 and sa == 1 and sb == 1:
                ro, ra, rb = out[o : o + inner], a[i : i + inner], b[k : k + inner]
                for j in range(inner):
                    ro[j] = fn(ra[j], rb[j])
            else:
                for j in range(inner):
                    out[o + j * so] = fn(a[i + j * sa], b[k + j * sb])

    return kernel


def ternary_strided(fn, loop):
    def kernel(out, oo, os, a, ao, as_, b, bo, bs, c, co, cs, shape):
        last = shape.size - 1
        inner, so, sa, sb, sc = shape[last], os[last], as_[last], bs[last], cs[last]
        for r in loop(_rows(shape)):
            o, i, k, m = (
                _row_start(r, shape, os, oo),
                _row_start(r, shape, as_, ao),
                _row_start(r, shape, bs, bo),
                _row_start(r, shape, cs, co),
            )
            for j in range(inner):
                out[o + j * so] = fn(a[i + j * sa], b[k + j * sb], c[m + j * sc])

    return kernel


# Ternary scalar functions


@jitable
def where(cond, x, y):
    return x if cond else y


@jitable
def clip(x, lo, hi):
    # NaN in x propagates; a NaN bound propagates too (as in NumPy).
    if lo != lo or hi != hi:
        return lo + hi
    return minimum(maximum(x, lo), hi)


# Reductions over the rows of a 2-D view ``x`` (rows kept, columns reduced) into ``out``.
# ``out``'s dtype is the accumulator: float64 for floating sums, int64/uint64 for
# integer sums, the input dtype for max/min, bool for all/any.
#
# Note [Vector reductions]: a fold runs at memory speed only if LLVM vectorizes it, and
# it vectorizes only a fold whose steps it may reorder. So the reduction kernels are
# compiled with floating-point reassociation (jit.REASSOCIATE: one accumulator in the
# source becomes several vector accumulators in the machine code); max and min step
# with LLVM's NaN-propagating maximum/minimum (fold_max, fold_min), which it vectorizes,
# where a compare-and-select with a NaN test stays one element at a time; all and any
# step with a bitwise and/or, not a short-circuit branch. Floating sums accumulate in
# float64, so a float32 sum is rounded once, at the end (more accurate than NumPy's
# pairwise float32 sums); rows are folded in _BLOCK-long blocks, so a float64 sum's
# rounding error grows with the number of blocks, not with the row's length.

_BLOCK = 4096


def reduce_rows(step, loop):
    """Each row is folded block by block: a block's steps into a partial result (the
    loop LLVM vectorizes, Note [Vector reductions]), the partials into the row's
    result. The caller fills ``out`` with the start value (0, 1, x[:, 0], True, False):
    an identity of ``step`` or idempotent under it, so every partial may start from it."""

    def kernel(x, out):
        for r in loop(x.shape[0]):
            start = acc = out[r]
            for b in range(0, x.shape[1], _BLOCK):
                block = x[r, b : b + _BLOCK]
                part = start
                for j in range(block.shape[0]):
                    part = step(part, block[j])
                acc = step(acc, part)
            out[r] = acc

    return kernel


def reduce_columns(step, loop):
    """reduce_rows for a column-major view, given as its C-contiguous transpose ``y``
    (y's columns are the rows to fold): memory is read in order, four rows of y
    updating every accumulator (a loop that vectorizes; four, so that each accumulator
    is loaded and stored once per four steps). Serial: ``loop`` is unused."""

    def kernel(y, out):
        n = y.shape[0]
        body = n - n % 4
        for j in range(0, body, 4):
            for r in range(y.shape[1]):
                acc = step(step(out[r], y[j, r]), y[j + 1, r])
                out[r] = step(step(acc, y[j + 2, r]), y[j + 3, r])
        for j in range(body, n):
            for r in range(y.shape[1]):
                out[r] = step(out[r], y[j, r])

    return kernel


def deviations_rows(square, loop):
    """var's second pass: each row's sum of ``square(x - mean[r])`` (the squared
    modulus for complex rows) added to ``m2`` (float64, zeroed). The terms are never
    negative, so the vector accumulators of Note [Vector reductions] need no blocks."""

    def kernel(x, m2, mean):
        for r in loop(x.shape[0]):
            mu, q = mean[r], m2[r]
            for j in range(x.shape[1]):
                q += square(x[r, j] - mu)
            m2[r] = q

    return kernel


def deviations_columns(square, loop):
    """deviations_rows for a column-major view, given as its C-contiguous transpose
    (as reduce_columns). Serial: ``loop`` is unused."""

    def kernel(y, m2, mean):
        for j in range(y.shape[0]):
            for r in range(y.shape[1]):
                m2[r] += square(y[j, r] - mean[r])

    return kernel


_ARG_BLOCK = 256


def arg_reduce_rows(fold, loop):
    """argmax/argmin (``fold``: fold_max, fold_min) of each row into ``out``, its value
    into ``best``: the first index of the row's maximum (minimum) or of its first NaN,
    as in NumPy. Two vectorized passes over a row in L1: its extreme value (extreme),
    then the first index of a value equal to it (first_index). A row longer than
    _ARG_BLOCK is folded block by block, keeping the first block that beats the blocks
    before it, the only one then searched (short rows skip that loop: it took 1.3x
    their time, 100 rows of 100 float32)."""
    largest = fold is fold_max

    def kernel(x, out, best):
        for r in loop(x.shape[0]):
            row, at = x[r], 0
            if row.shape[0] <= _ARG_BLOCK:
                b = extreme(row, row[0], largest)
            else:
                b = row[0]
                for s in range(0, row.shape[0], _ARG_BLOCK):
                    part = extreme(row[s : s + _ARG_BLOCK], b, largest)
                    if part != b and b == b:  # beaten (-0.0 ties 0.0), unless by a NaN
                        b, at = part, s
            block = row[at : at + _ARG_BLOCK]
            first = first_index(block, b)
            out[r], best[r] = at + first, block[first]

    return kernel


def arg_reduce_columns(fold, loop):
    """arg_reduce_rows for a column-major view, given as its C-contiguous transpose
    ``y`` (as reduce_columns); ``best`` arrives holding y's first row, ``out`` zeros.
    Serial: ``loop`` is unused."""

    def kernel(y, out, best):
        for j in range(y.shape[0]):
            for r in range(y.shape[1]):
                b = best[r]
                if fold(y[j, r], b) != b and b == b:  # once NaN, a column is done
                    best[r], out[r] = y[j, r], j

    return kernel


def extreme_rows(fold, loop):
    """max/min (``fold``: fold_max, fold_min) of each row into ``out``, which holds
    each row's first value (extreme); no blocks, a max has no rounding error to bound."""
    largest = fold is fold_max

    def kernel(x, out):
        for r in loop(x.shape[0]):
            out[r] = extreme(x[r], out[r], largest)

    return kernel


@jitable
def extreme(values, start, largest):
    """The largest (``largest``, else the smallest) of ``start`` and ``values``, NaN if
    one is: an integer fold of their order keys (Note [Order keys]), decoded once.
    Callers pass ``largest`` as a constant, which LLVM folds into a vectorized loop."""
    key = order_max(start) if largest else order_min(start)
    for j in range(values.shape[0]):
        x = values[j]
        key = fold_max(key, order_max(x)) if largest else fold_min(key, order_min(x))
    return from_order(key, start)


@jitable
def first_index(values, v):
    """The index of the first of ``values`` equal to ``v``, one of them; of the first
    NaN if ``v`` is NaN (an early exit: NaN is rare). Otherwise a min-fold, not an
    early exit: it vectorizes, better with 32-bit indices."""
    if v != v:
        j = 0
        while values[j] == values[j]:
            j += 1
        return j
    first = n = np.int32(values.shape[0])
    for j in range(values.shape[0]):
        first = min(first, np.int32(j) if values[j] == v else n)
    return first


def fold_max(acc, x):
    """max's step, in kernels LLVM's maximum (Note [Vector reductions]): NaN wins."""
    return acc if acc > x or acc != acc else x


def fold_min(acc, x):
    """min's step, in kernels LLVM's minimum: NaN wins."""
    return acc if acc < x or acc != acc else x


def _lower_folds(numba):
    """fold_max and fold_min as intrinsics: llvm.maximum/llvm.minimum for floats (they
    propagate NaN), a compare-and-select for integers and bool."""
    from llvmlite import ir
    from numba.core import cgutils
    from numba.extending import intrinsic, overload

    def lower(fold, llvm_name, compare):
        def codegen(context, builder, sig, args):
            a, b = args
            t = sig.return_type
            if isinstance(t, numba.types.Float):
                fnty = ir.FunctionType(a.type, [a.type, a.type])
                name = f"llvm.{llvm_name}.f{t.bitwidth}"
                callee = cgutils.get_or_insert_function(builder.module, fnty, name)
                return builder.call(callee, args)
            signed = isinstance(t, numba.types.Integer) and t.signed
            icmp = builder.icmp_signed if signed else builder.icmp_unsigned
            return builder.select(icmp(compare, a, b), a, b)

        @intrinsic
        def step(typingctx, acc, x):
            return (acc(acc, x), codegen) if acc == x else None

        overload(fold)(lambda acc, x: lambda acc, x: step(acc, x))

    lower(fold_max, "maximum", ">")
    lower(fold_min, "minimum", "<")


jit.on_load(_lower_folds)


# Note [Order keys]: max, min, argmax, argmin and softmax's row maxima fold integers,
# not floats (extreme): a float's order key is its bits as a signed integer of its
# width with the magnitude flipped for negative values, so that keys order as the
# values do, with -0.0 below 0.0 (as llvm.maximum has it), and every NaN the highest
# key (order_max) or the lowest (order_min); a key decodes (from_order) to its value,
# a NaN for a NaN's. An integer fold vectorizes to a few instructions per vector, where
# llvm.maximum on floats takes several more (the kernels on 100 rows of 100 float32:
# argmax 6.5 -> 3.4 us, max 2.8 -> 1.1 us; one row of 10**4: 1.7 -> 1.0, 1.3 -> 0.9).
# Integers and bool are their own keys. argmax then searches for the first value equal
# to the extreme (first_index), so -0.0 and 0.0 tie as they compare, and the first NaN
# wins.


def order_max(x):
    """x's order key for max (Note [Order keys]): NaN above every value."""
    return x


def order_min(x):
    """x's order key for min: NaN below every value."""
    return x


def from_order(key, like):
    """The value of order key ``key``, of ``like``'s type."""
    return key


_INFINITY_BITS = {32: 0x7F800000, 64: 0x7FF0000000000000}


def _lower_order_keys(numba):
    from llvmlite import ir
    from numba.extending import intrinsic, overload

    def identity_for_integers(float_fn):
        def typed(x):
            if isinstance(x, numba.types.Float):
                return lambda x: float_fn(x)
            return lambda x: x

        return typed

    def lower_order(order, nan_highest):
        @intrinsic
        def float_key(typingctx, x):
            width = x.bitwidth

            def codegen(context, builder, sig, args):
                t = ir.IntType(width)
                bits = builder.bitcast(args[0], t)
                top = (1 << (width - 1)) - 1
                negative = builder.icmp_signed("<", bits, ir.Constant(t, 0))
                key = builder.select(negative, builder.xor(bits, ir.Constant(t, top)), bits)
                magnitude = builder.and_(bits, ir.Constant(t, top))
                nan = builder.icmp_signed(">", magnitude, ir.Constant(t, _INFINITY_BITS[width]))
                return builder.select(nan, ir.Constant(t, top if nan_highest else -top - 1), key)

            return getattr(numba.types, f"int{width}")(x), codegen

        overload(order)(identity_for_integers(float_key))

    lower_order(order_max, True)
    lower_order(order_min, False)

    @intrinsic
    def float_value(typingctx, key, like):
        def codegen(context, builder, sig, args):
            k = args[0]
            top = ir.Constant(k.type, (1 << (like.bitwidth - 1)) - 1)
            negative = builder.icmp_signed("<", k, ir.Constant(k.type, 0))
            bits = builder.select(negative, builder.xor(k, top), k)
            return builder.bitcast(bits, context.get_value_type(like))

        return like(key, like), codegen

    def typed_value(key, like):
        if isinstance(like, numba.types.Float):
            return lambda key, like: float_value(key, like)
        return lambda key, like: key

    overload(from_order)(typed_value)


jit.on_load(_lower_order_keys)


@jitable
def add_absolute(acc, x):
    """vector_norm's ord-1 step. reduce_rows folds the partial results with the step
    too: they are never negative, so abs leaves them as they are (likewise
    max_absolute and min_absolute)."""
    return acc + abs(x)


@jitable
def max_absolute(acc, x):
    """vector_norm's ord-inf step: NaN wins (fold_max)."""
    return fold_max(acc, abs(x))


@jitable
def min_absolute(acc, x):
    """vector_norm's ord--inf step: NaN wins (fold_min)."""
    return fold_min(acc, abs(x))


@jitable
def logical_and_reduce(acc, x):
    return acc & (x != 0)  # bitwise, not short-circuit: Note [Vector reductions]


@jitable
def logical_or_reduce(acc, x):
    return acc | (x != 0)


def scan_rows(step, loop):
    """The running fold of each row of a 2-D view ``x`` into ``out`` (same rows,
    ``out.shape[1] - x.shape[1]`` leading columns holding ``init``, the identity, an
    int, when the scan includes it). ``out``'s dtype is the accumulator."""

    def kernel(x, out, init):
        n = x.shape[1]
        lead = out.shape[1] - n
        for r in loop(x.shape[0]):
            acc = type(out[r, 0])(init)  # in out's dtype
            if lead:
                out[r, 0] = acc
            for j in range(n):
                acc = step(acc, x[r, j])
                out[r, lead + j] = acc

    return kernel


def matmul_int(loop):
    """Batched integer matmul, (B, M, K) @ (B, K, N) -> (B, M, N); floats use BLAS."""

    def kernel(a, b, out):
        for p in loop(out.shape[0]):
            for i in range(out.shape[1]):
                for j in range(out.shape[2]):
                    acc = out[p, i, j] - out[p, i, j]
                    for k in range(a.shape[2]):
                        acc += a[p, i, k] * b[p, k, j]
                    out[p, i, j] = acc

    return kernel


# ---------------------------------------------------------------- C loops
# Note [C loops]: the contiguous loops of the C core's fast path (dispatch/csrc/fastpath.c),
# compiled with numba.cfunc and called by address: pointers and a length, no arrays to
# unbox (~2,000 instructions of a Numba entry point's ~2,500 on the seed's 100
# elements). The scalar form gets the Python scalar as a double, int64 or uint64 (by
# the dtype's kind) and casts it to the dtype once, as the Numba entry point of
# binary_scalar converts it at its boundary. The pure-Python core and the backend's
# general path run the same loops, called by address from a kernel per signature of
# dtypes (``*_at`` below): both cores compute with one compiled loop per operator and
# dtype.


def unary_cloop(fn):
    def loop(x, out, n):
        for i in range(n):
            out[i] = fn(x[i])

    return loop


def binary_cloop(fn):
    def loop(a, b, out, n):
        for i in range(n):
            out[i] = fn(a[i], b[i])

    return loop


def unary_strided_cloop(fn):
    """The ufunc inner loop of the C core's general path (Note [C loops]): element
    strides, possibly 0 (broadcast) or negative."""

    def loop(x, out, n, sx, so):
        for i in range(n):
            out[i * so] = fn(x[i * sx])

    return loop


def binary_strided_cloop(fn):
    def loop(a, b, out, n, sa, sb, so):
        for i in range(n):
            out[i * so] = fn(a[i * sa], b[i * sb])

    return loop


def scalar_cloop(fn, cast):
    def loop(a, v, out, n, scalar_first):
        w = cast(v)
        if scalar_first:
            for i in range(n):
                out[i] = fn(w, a[i])
        else:
            for i in range(n):
                out[i] = fn(a[i], w)

    return loop


# The C loops above called by address (Note [C loops by address] in backends/jit.py):
# one kernel per signature of dtypes runs every operator's loop of that signature, for
# the pure-Python core's contiguous path and the general path's serial loops. A strided
# operand is as the strided templates take it (buffer, element offset, element strides);
# the loop runs once per row of the iteration shape.


def unary_flat_at(address, x, out):
    jit.call_address(address, (x.ctypes.data, out.ctypes.data, out.size))


def binary_flat_at(address, a, b, out):
    jit.call_address(address, (a.ctypes.data, b.ctypes.data, out.ctypes.data, out.size))


def scalar_at(address, a, v, out, scalar_first):
    """``v``: the scalar, converted by the entry point to the type the C loop takes
    (SCALAR_ARGUMENT) and cast by the loop to the dtype."""
    first = np.int32(scalar_first)
    jit.call_address(address, (a.ctypes.data, v, out.ctypes.data, out.size, first))


def unary_strided_at(address, out, oo, os, x, xo, xs, shape):
    last = shape.size - 1
    inner, so, sx = shape[last], os[last], xs[last]
    po, wo = np.int64(out.ctypes.data), out.itemsize
    px, wx = np.int64(x.ctypes.data), x.itemsize
    for r in range(_rows(shape)):
        o, i = _row_start(r, shape, os, oo), _row_start(r, shape, xs, xo)
        jit.call_address(address, (px + i * wx, po + o * wo, inner, sx, so))


def binary_strided_at(address, out, oo, os, a, ao, as_, b, bo, bs, shape):
    last = shape.size - 1
    inner, so, sa, sb = shape[last], os[last], as_[last], bs[last]
    po, wo = np.int64(out.ctypes.data), out.itemsize
    pa, wa = np.int64(a.ctypes.data), a.itemsize
    pb, wb = np.int64(b.ctypes.data), b.itemsize
    for r in range(_rows(shape)):
        o = _row_start(r, shape, os, oo)
        i, k = _row_start(r, shape, as_, ao), _row_start(r, shape, bs, bo)
        jit.call_address(address, (pa + i * wa, pb + k * wb, po + o * wo, inner, sa, sb, so))


def fold_at(address, x, out):
    """A fold's C loop (``fold_rows_cloop``, ``fold_columns_cloop``) called by address
    over contiguous (rows, cols) x (Note [C loops by address] in backends/jit.py)."""
    jit.call_address(address, (x.ctypes.data, out.ctypes.data, x.shape[0], x.shape[1]))


def fold_beside_at(address, x, out, beside):
    """The same, for ``arg_rows_cloop`` and ``arg_columns_cloop``."""
    pointers = (x.ctypes.data, out.ctypes.data, beside.ctypes.data)
    jit.call_address(address, (*pointers, x.shape[0], x.shape[1]))


def fold_rows_cloop(kernel):
    """A reduction of the C core's (Note [C loops]): ``kernel`` (reduce_rows, jitable)
    over a contiguous (rows, cols) array into rows results."""

    def loop(x, out, rows, cols):
        kernel(jit.numba.carray(x, (rows, cols)), jit.numba.carray(out, rows))

    return loop


def rows_cloop(kernel):
    """An operator along the last axis of the C core's (Note [C rows] in
    dispatch/csrc/fastpath.c): ``kernel`` (jitable) from a contiguous (rows, cols)
    array into another."""

    def loop(x, out, rows, cols):
        kernel(jit.numba.carray(x, (rows, cols)), jit.numba.carray(out, (rows, cols)))

    return loop


def fold_columns_cloop(kernel):
    """reduce_columns over a contiguous (rows, cols) array into cols results."""

    def loop(x, out, rows, cols):
        kernel(jit.numba.carray(x, (rows, cols)), jit.numba.carray(out, cols))

    return loop


def arg_rows_cloop(kernel):
    """arg_reduce_rows over a contiguous (rows, cols) array: each row's index into
    ``out`` (int64), its value into ``best`` (holding each row's first value); also
    deviations_rows, with each row's mean as ``best`` (Note [C moments] in
    dispatch/csrc/fastpath.c)."""

    def loop(x, out, best, rows, cols):
        carray = jit.numba.carray
        kernel(carray(x, (rows, cols)), carray(out, rows), carray(best, rows))

    return loop


def arg_columns_cloop(kernel):
    """arg_reduce_columns (deviations_columns) over a contiguous (rows, cols) array
    into cols results."""

    def loop(x, out, best, rows, cols):
        carray = jit.numba.carray
        kernel(carray(x, (rows, cols)), carray(out, cols), carray(best, cols))

    return loop


def _cast(name, fn):
    """A module-level cast to dtype ``name`` (it pickles by name: Note [Kernel cache])."""
    cast = jitable(lambda v: fn(v))
    cast.__name__ = cast.__qualname__ = "cast_" + name
    globals()["cast_" + name] = cast
    return cast


@jitable
def cast_bool(v):
    return v != 0


CASTS = {
    name: _cast(name, getattr(np, name))
    for name in (
        "int8 int16 int32 int64 uint8 uint16 uint32 uint64 float32 float64 complex64 "
        "complex128".split()
    )
}
CASTS["bool"] = cast_bool
# a complex loop gets a real Python scalar as a double (a Python complex takes the
# general path: Note [Scalar fast path])
SCALAR_ARGUMENT = {"f": "float64", "c": "float64", "i": "int64", "u": "uint64", "b": "int64"}


def c_loop(template, fn, comp, out, ins, cache=True):
    """``template`` instantiated with scalar function ``fn`` for computation dtype
    ``comp``, inputs ``ins`` and output dtype ``out``, compiled as a cfunc
    (``jit.c_loop`` builds it and takes its address)."""
    types = jit.types

    def ptr(d, bool_type=types.uint8):  # a bool is a byte: Numba stores its i1 as uint8
        return types.CPointer(bool_type if d.kind == "b" else jit.numba.from_dtype(d.np))

    if template in (fold_rows_cloop, fold_columns_cloop, rows_cloop):  # fn: the compiled kernel
        # Numba's booleans: on uint8, all/any would widen each step to int64 and run
        # ~7x slower (Note [Vector reductions])
        sig = types.void(
            ptr(ins[0], types.boolean), ptr(out, types.boolean), types.int64, types.int64
        )
        return jit.compile_cfunc(template(fn), sig, cache, fastmath=jit.REASSOCIATE)
    elif template in (arg_rows_cloop, arg_columns_cloop):
        # out: the indices (var's squared deviations); beside them, in the dtype of the
        # last input, the best values (the means)
        value, beside = ptr(ins[0], types.boolean), ptr(ins[-1], types.boolean)
        sig = types.void(value, ptr(out), beside, types.int64, types.int64)
        return jit.compile_cfunc(template(fn), sig, cache, fastmath=jit.REASSOCIATE)
    elif template in (unary_strided_cloop, binary_strided_cloop):
        strides = (types.int64,) * (len(ins) + 1)
        sig = types.void(*map(ptr, ins), ptr(out), types.int64, *strides)
    elif template is scalar_cloop:
        scalar = getattr(types, SCALAR_ARGUMENT[comp.kind])
        sig = types.void(ptr(ins[0]), scalar, ptr(out), types.int64, types.int32)
        loop = scalar_cloop(fn, CASTS[comp.name])
        return jit.compile_cfunc(loop, sig, cache, vector_width=vector_width(fn))
    else:
        sig = types.void(*map(ptr, ins), ptr(out), types.int64)
    return jit.compile_cfunc(template(fn), sig, cache, vector_width=vector_width(fn))


# ---------------------------------------------------------------- compilation


def instantiate(template, args, signature):
    """Compile ``template(*args)`` for one explicit signature and return its entry point
    (Note [Kernel signatures] in ``lamina.backends.jit``); a ``prange`` loop argument
    compiles the parallel variant; a first argument marked ``wide_vectors``, 512-bit
    vectors."""
    parallel, width = args[-1] is jit.prange, vector_width(args[0])
    return jit.compile_kernel(template(*args), signature, parallel=parallel, vector_width=width)
