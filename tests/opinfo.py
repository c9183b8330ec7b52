"""An OpInfo-style sample database for lamina's elementwise operators.

For every unary and binary operator of ``dispatch/operators.py`` this module records,
independently of lamina's own tables:

* ``rule`` / ``result`` -- which dtype kinds it accepts and what its result dtype is
  (checked against the declarative list by ``test_elementwise``, so the two cannot
  drift apart silently);
* ``dtypes`` -- the dtypes the tests run it on. Every kernel numba_cpu compiles costs
  ~0.1-0.3 s cold, so most operators get one dtype per accepted *kind* (a signed and an
  unsigned integer, float32, float64, bool where accepted), rotated between operators
  so that every dtype is covered by several; ``add``, ``equal`` and ``negative`` get a
  full sweep, and the promotion tests lean on those;
* ``ref`` -- the NumPy function lamina must agree with;
* sample pools -- special values per dtype (extremes, signed zeros, infinities, NaN,
  halves for rounding; for complex dtypes every pair of a smaller set of them, the
  standard's complex special cases), restricted per operand where an operator's domain
  differs from the samples' (integer ``pow`` with a negative exponent raises).

Complex kernels are compiled per dtype too, so most operators that take complex run on
complex128 only, a few (those the promotion tests and the C core's scalar path lean
on) on complex64 as well.

Sample *layouts* (contiguous, 0-d, empty, broadcast, transposed, stepped, reversed) are
built here too, as pairs of (lamina tensor, the same view of the NumPy array), so a
test checks both what a kernel computes and that lamina's views reach it correctly.
"""

import zlib
from dataclasses import dataclass

import numpy as np

import lamina as lm

BOOL = ("bool",)
SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
FLOATS = ("float32", "float64")
COMPLEX = ("complex64", "complex128")
NUMERIC = SIGNED + UNSIGNED + FLOATS
ALL_DTYPES = BOOL + NUMERIC + COMPLEX

# dtype kinds each rule of dispatch/operators.py accepts (NumPy kind letters)
ACCEPTS = {
    "any": "biufc",
    "real": "biuf",
    "numeric": "iufc",
    "real_numeric": "iuf",
    "float": "fc",
    "real_float": "f",
    "complex": "c",
    "int": "iu",
    "intbool": "biu",
}
PROMOTES_TO_FLOAT = ("float", "real_float")  # ints and bool are computed in float64

# Float tolerances: numba_cpu calls libm (or LLVM intrinsics), NumPy its own SIMD loops;
# both are within a few ulp. Complex results are compared by modulus (a part much
# smaller than the other may differ by more than its own ulps). Integers and bools
# must be equal.
RTOL = {"float32": 1e-5, "float64": 1e-12, "complex64": 1e-5, "complex128": 1e-12}


def lm_dtype(name):
    return getattr(lm, name)  # lm.bool is lamina's bool dtype


# ---------------------------------------------------------------- sample pools

FLOAT_SPECIALS = [
    0.0,
    -0.0,
    0.5,
    -0.5,
    1.0,
    -1.0,
    1.5,
    -2.5,
    2.5,
    3.0,
    0.1,
    -7.25,
    0.001,
    20.0,
    100.0,
    np.inf,
    -np.inf,
    np.nan,
]


def int_specials(name):
    info = np.iinfo(name)
    vals = [
        info.min,
        info.min + 1,
        -100,
        -7,
        -2,
        -1,
        0,
        1,
        2,
        3,
        7,
        100,
        200,
        info.max - 1,
        info.max,
    ]
    return sorted({int(v) for v in vals if info.min <= v <= info.max})


# the parts of the complex special values: every pair of them is one value
COMPLEX_PARTS = [0.0, -0.0, 0.5, -1.5, 2.0, 0.001, -20.0, np.inf, -np.inf, np.nan]


def specials(name):
    """The special values of one dtype, as a 1-D NumPy array of that dtype."""
    if name == "bool":
        return np.array([False, True])
    if name in FLOATS:
        return np.array(FLOAT_SPECIALS, name)
    if name in COMPLEX:
        return np.array([complex(a, b) for a in COMPLEX_PARTS for b in COMPLEX_PARTS], name)
    return np.array(int_specials(name), name)


def shift_counts(name):
    """Shift counts: in range, at and past the width (NumPy gives 0 / -1), negative."""
    if name in BOOL + FLOATS + COMPLEX:  # promoted to another dtype (bool << int8 is int8)
        return specials(name)
    bits = np.iinfo(name).bits
    vals = [0, 1, 2, 3, bits - 1, bits, bits + 1, 63, 64, 65, -1, -2]
    info = np.iinfo(name)
    return np.array(sorted({v for v in vals if info.min <= v <= info.max}), name)


def nonnegative(name):
    """Integer ``pow`` exponents: negative ones raise (tested on their own)."""
    v = specials(name)
    return v[v >= 0] if name in SIGNED + UNSIGNED else v


# ---------------------------------------------------------------- operator database


@dataclass(frozen=True)
class OpInfo:
    name: str
    arity: int
    rule: str  # a key of ACCEPTS
    result: str  # "same" | "bool" | "real"
    dtypes: tuple  # the dtypes the tests run it on
    ref: object  # the NumPy function
    dunder: object = None  # operator-module function for the Tensor operator, if any
    inplace: object = None  # operator-module in-place function (``+=``), if any
    rhs: object = None  # dtype name -> pool for the second operand (default: specials)
    # Whether -0.0 and +0.0 results must match too (NumPy's sign of zero).
    signed_zero: bool = True

    def pool(self, dtype, operand=0):
        if operand == 1 and self.rhs is not None:
            return self.rhs(dtype)
        return specials(dtype)

    def __repr__(self):
        return self.name


def expm1(x):
    """NumPy's expm1, but an exact zero real part of a complex result is +0, as the
    Array API's expm1(-0 + 0j) = 0 + 0j (NumPy keeps expm1(-0)'s sign there)."""
    out = np.array(np.expm1(x))
    if out.dtype.kind == "c":
        out.real += 0.0
    return out


def _ops():
    import operator as O

    ops = []

    def unary(name, rule, dtypes, ref, result="same", **kw):
        ops.append(OpInfo(name, 1, rule, result, tuple(dtypes.split()), ref, **kw))

    def binary(name, rule, dtypes, ref, result="same", **kw):
        ops.append(OpInfo(name, 2, rule, result, tuple(dtypes.split()), ref, **kw))

    # Unary numeric (integer variants of floor/ceil/trunc/round are the identity and keep
    # the dtype, as in NumPy 2 and the Array API).
    unary(
        "abs",
        "numeric",
        "int8 uint16 float32 float64 complex64 complex128",
        np.abs,
        result="real",
        dunder=O.abs,
    )
    unary("negative", "numeric", " ".join(NUMERIC + COMPLEX), np.negative, dunder=O.neg)
    unary("positive", "numeric", "int32 uint64 float32 complex128", np.positive, dunder=O.pos)
    unary("square", "numeric", "int16 uint32 float32 float64 complex128", np.square)
    unary("conj", "numeric", "int8 float64 complex64 complex128", np.conj)
    unary("real", "numeric", "uint8 float32 complex64 complex128", np.real, result="real")
    unary("imag", "complex", "complex64 complex128", np.imag, result="real")
    unary("sign", "numeric", "int64 uint8 float32 float64 complex128", np.sign)
    unary("floor", "real_numeric", "int16 float32 float64", np.floor)
    unary("ceil", "real_numeric", "uint8 float32 float64", np.ceil)
    unary("trunc", "real_numeric", "int64 float32 float64", np.trunc)
    unary("round", "numeric", "int32 float32 float64 complex128", np.round)
    # Unary float: ints and bool are computed in float64 (the f64 kernel, nothing new
    # to compile), so one of them rides along with each operator; complex128 each.
    floats = [
        ("exp", np.exp, "int8 complex64"),
        ("expm1", expm1, "uint8"),
        ("log", np.log, "int64"),
        ("log1p", np.log1p, "int16"),
        ("log2", np.log2, "uint16"),
        ("log10", np.log10, "bool"),
        ("sqrt", np.sqrt, "int32 complex64"),
        ("sin", np.sin, "uint32"),
        ("cos", np.cos, "int8"),
        ("tan", np.tan, "uint64"),
        ("asin", np.arcsin, "int16"),
        ("acos", np.arccos, "bool"),
        ("atan", np.arctan, "int64"),
        ("sinh", np.sinh, "uint8"),
        ("cosh", np.cosh, "int32"),
        ("tanh", np.tanh, "uint16"),
        ("asinh", np.arcsinh, "int8"),
        ("acosh", np.arccosh, "uint32"),
        ("atanh", np.arctanh, "bool"),
        # 1.0 is weak: float32 stays; complex takes NumPy's own reciprocal loop
        ("reciprocal", lambda x: np.reciprocal(x) if x.dtype.kind == "c" else 1.0 / x, "int32"),
    ]
    for name, ref, extra in floats:
        unary(name, "float", f"float32 float64 complex128 {extra}", ref)
    unary("bitwise_invert", "intbool", "bool int8 uint64", np.invert, dunder=O.invert)
    unary("logical_not", "any", "bool int16 float64 complex128", np.logical_not, result="bool")
    unary("isfinite", "any", "float32 float64 int64 bool complex128", np.isfinite, result="bool")
    unary("isinf", "any", "float32 float64 uint8 bool complex64", np.isinf, result="bool")
    unary("isnan", "any", "float32 float64 bool uint32 complex128", np.isnan, result="bool")
    unary("signbit", "real_float", "float32 float64 int8", np.signbit, result="bool")

    # Binary numeric
    binary("add", "numeric", " ".join(NUMERIC + COMPLEX), np.add, dunder=O.add, inplace=O.iadd)
    binary(
        "subtract",
        "numeric",
        "int8 uint8 int64 float32 float64 complex128",
        np.subtract,
        dunder=O.sub,
        inplace=O.isub,
    )
    binary(
        "multiply",
        "numeric",
        "int16 uint32 float32 float64 complex64 complex128",
        np.multiply,
        dunder=O.mul,
        inplace=O.imul,
    )
    binary(
        "floor_divide",
        "real_numeric",
        "int8 int64 uint16 float32 float64",
        np.floor_divide,
        dunder=O.floordiv,
        inplace=O.ifloordiv,
    )
    binary(
        "remainder",
        "real_numeric",
        "int16 int64 uint8 float32 float64",
        np.remainder,
        dunder=O.mod,
        inplace=O.imod,
    )
    binary(
        "pow",
        "numeric",
        "int32 uint8 int64 float32 float64 complex128",
        np.power,
        dunder=O.pow,
        inplace=O.ipow,
        rhs=nonnegative,
    )
    binary("maximum", "real_numeric", "int8 uint64 float32 float64", np.maximum)
    binary("minimum", "real_numeric", "int32 uint16 float32 float64", np.minimum)
    # Binary float
    binary(
        "divide",
        "float",
        "float32 float64 int16 complex64 complex128",
        np.divide,
        dunder=O.truediv,
        inplace=O.itruediv,
    )
    binary("atan2", "real_float", "float32 float64 uint8", np.arctan2)
    binary("copysign", "real_float", "float32 float64 int32", np.copysign)
    binary("hypot", "real_float", "float32 float64 int8", np.hypot)
    binary("logaddexp", "real_float", "float32 float64 uint16", np.logaddexp)
    binary("nextafter", "real_float", "float32 float64 int8", np.nextafter)
    # Bitwise
    binary(
        "bitwise_and", "intbool", "bool int32 uint8", np.bitwise_and, dunder=O.and_, inplace=O.iand
    )
    binary("bitwise_or", "intbool", "bool int64 uint16", np.bitwise_or, dunder=O.or_, inplace=O.ior)
    binary(
        "bitwise_xor", "intbool", "bool int8 uint64", np.bitwise_xor, dunder=O.xor, inplace=O.ixor
    )
    binary(
        "bitwise_left_shift",
        "int",
        "int8 int64 uint32",
        np.left_shift,
        dunder=O.lshift,
        inplace=O.ilshift,
        rhs=shift_counts,
    )
    binary(
        "bitwise_right_shift",
        "int",
        "int16 int32 uint8 uint64",
        np.right_shift,
        dunder=O.rshift,
        inplace=O.irshift,
        rhs=shift_counts,
    )
    # Comparison and logic (complex numbers are equal or not, but have no order)
    binary("equal", "any", " ".join(ALL_DTYPES), np.equal, result="bool", dunder=O.eq)
    binary(
        "not_equal",
        "any",
        "bool int16 uint32 float64 complex128",
        np.not_equal,
        result="bool",
        dunder=O.ne,
    )
    binary("greater", "real", "bool int8 uint64 float32", np.greater, result="bool", dunder=O.gt)
    binary(
        "greater_equal",
        "real",
        "bool int64 uint8 float64",
        np.greater_equal,
        result="bool",
        dunder=O.ge,
    )
    binary("less", "real", "bool int32 uint16 float32", np.less, result="bool", dunder=O.lt)
    binary(
        "less_equal", "real", "bool int16 uint64 float64", np.less_equal, result="bool", dunder=O.le
    )
    binary("logical_and", "any", "bool int8 float32 complex128", np.logical_and, result="bool")
    binary("logical_or", "any", "bool uint16 float64 complex128", np.logical_or, result="bool")
    binary("logical_xor", "any", "bool int64 float32 complex128", np.logical_xor, result="bool")
    return {op.name: op for op in ops}


OPS = _ops()
UNARY = [op for op in OPS.values() if op.arity == 1]
BINARY = [op for op in OPS.values() if op.arity == 2]


# Operators whose integer kernels only copy or truth-test (floor of an int is the int,
# isnan of an int is False): one integer kind covers them. Every other operator is run
# on a signed and an unsigned integer dtype, and on bool where it takes bool.
ONE_INTEGER_KIND = {
    "conj",
    "real",
    "floor",
    "ceil",
    "trunc",
    "round",
    "logical_not",
    "isfinite",
    "isinf",
    "isnan",
    "logical_and",
    "logical_or",
    "logical_xor",
}


def op_dtype_params(ops):
    """(op, dtype) pairs for pytest parametrization, with readable ids."""
    import pytest

    return [pytest.param(op, d, id=f"{op.name}-{d}") for op in ops for d in op.dtypes]


# ---------------------------------------------------------------- expected results


def comp_dtype(op, operands):
    """NumPy's computation dtype for ``op`` on these operands, or None where lamina must
    raise TypeError. Python scalars are weak (NumPy 2, NEP 50), as in lamina."""
    comp = np.result_type(*[o.dtype if isinstance(o, np.ndarray) else o for o in operands])
    if (
        comp.kind in "fc"
        and any(isinstance(o, (float, complex)) for o in operands)
        and not any(isinstance(o, np.ndarray) and o.dtype.kind in "fc" for o in operands)
    ):
        comp = default_dtype(comp.kind)  # a Python float or complex meeting integers
    if comp.kind not in ACCEPTS[op.rule]:
        if op.rule in PROMOTES_TO_FLOAT and comp.kind in "biu":
            return default_dtype("f")  # (NumPy: float64, or float16 for int8)
        return None
    return comp


def default_dtype(kind):
    """lamina's default float ("f") or complex ("c") dtype, as a NumPy dtype (Note
    [Default dtype]: where NumPy makes float64 of integers, lamina makes the default)."""
    real = np.dtype(lm.get_default_dtype().name)
    return real if kind == "f" else np.result_type(real, np.complex64)


def result_dtype(op, comp):
    if op.result == "bool":
        return np.dtype(bool)
    return np.empty(0, comp).real.dtype if op.result == "real" else comp


def expected(op, operands):
    """What lamina must return: NumPy's ufunc on operands cast to the computation dtype,
    in the result dtype. Returns (array, dtype) or (None, None) for a TypeError."""
    comp = comp_dtype(op, operands)
    if comp is None:
        return None, None
    res = result_dtype(op, comp)
    with np.errstate(all="ignore"):
        out = op.ref(*[np.asarray(o, comp) for o in operands])
    return np.asarray(out).astype(res, copy=False), res


def assert_matches(actual, want, dtype, signed_zero=True, where=""):
    """``actual`` (a lamina tensor) equals ``want`` (NumPy) in dtype, shape and values;
    floats within RTOL with NaN at the same positions (and, by default, zeros of the
    same sign)."""
    dtype = np.dtype(dtype)
    assert isinstance(actual, lm.Tensor), f"{where}: expected a tensor, got {type(actual)}"
    assert actual.dtype == lm_dtype(dtype.name), f"{where}: dtype {actual.dtype} != {dtype}"
    got = actual.numpy()
    assert got.dtype == dtype, f"{where}: storage dtype {got.dtype} != {dtype}"
    assert actual.shape == want.shape, f"{where}: shape {actual.shape} != {want.shape}"
    assert got.shape == want.shape
    if dtype.kind == "f":
        np.testing.assert_allclose(
            got, want, rtol=RTOL[dtype.name], atol=0, equal_nan=True, err_msg=where
        )
        if signed_zero:
            zeros = want == 0
            np.testing.assert_array_equal(
                np.signbit(got[zeros]), np.signbit(want[zeros]), err_msg=f"{where}: sign of zero"
            )
    elif dtype.kind == "c":
        _assert_complex_matches(got, want, dtype, signed_zero, where)
    else:
        np.testing.assert_array_equal(got, want, err_msg=where, strict=True)


def _assert_complex_matches(got, want, dtype, signed_zero, where):
    """Each part: NaN where NaN, the same infinities, zeros of the same sign; finite
    values within RTOL of the modulus (a part far smaller than the other is as exact
    as the larger one's rounding allows)."""
    for part in (np.real, np.imag):
        g, w = part(got), part(want)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{where}: NaN parts")
        inf = np.isinf(w)
        np.testing.assert_array_equal(g[inf], w[inf], err_msg=f"{where}: infinite parts")
        if signed_zero:
            zeros = (w == 0) & (g == 0)
            np.testing.assert_array_equal(
                np.signbit(g[zeros]), np.signbit(w[zeros]), err_msg=f"{where}: sign of zero"
            )
    finite = np.isfinite(want)
    tiny = np.finfo(dtype).tiny
    error = np.abs(got[finite] - want[finite])
    bound = RTOL[dtype.name] * np.abs(want[finite]) + tiny
    assert np.all(error <= bound), f"{where}: off by {np.max(error - bound)} beyond rtol"


# ---------------------------------------------------------------- layouts


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def draw(pool, shape, rng):
    """An array of ``shape`` filled with values drawn from ``pool`` (every value of the
    pool appears when there is room for it)."""
    n = int(np.prod(shape, dtype=np.int64))
    idx = np.concatenate(
        [rng.permutation(len(pool)), rng.integers(0, len(pool), max(0, n - len(pool)))]
    )[:n]
    return pool[idx].reshape(shape)


# Each view: (function on a lamina tensor, the same on a NumPy array); base shapes are
# chosen so the view has the shape the layout names.
VIEWS = {
    "contiguous": (lambda t: t, lambda a: a),
    "transposed": (lambda t: t.T, lambda a: a.T),
    "step": (lambda t: t[1::3], lambda a: a[1::3]),
    "reversed": (lambda t: t[::-1], lambda a: a[::-1]),
    "permuted-flipped": (
        lambda t: lm.permute_dims(t, (2, 0, 1))[:, ::-1],
        lambda a: a.transpose(2, 0, 1)[:, ::-1],
    ),
    "stepped-2d": (lambda t: t[::2, ::-3], lambda a: a[::2, ::-3]),
}


def make(pool, base_shape, view, rng):
    """(lamina tensor, NumPy array) for ``view`` of a fresh tensor of ``base_shape``."""
    base = draw(pool, base_shape, rng)
    t = lm.asarray(base.copy())
    lv, nv = VIEWS[view]
    t, a = lv(t), nv(base)
    assert t.shape == a.shape
    if view != "contiguous" and a.size > 1:
        assert not t.is_contiguous(), f"layout {view} should not be contiguous"
    return t, a


# Unary layouts: name -> (base shape, view)
UNARY_LAYOUTS = {
    "1d": (None, "contiguous"),  # None: the whole pool, every special value once
    "0d": ((), "contiguous"),
    "empty": ((0, 3), "contiguous"),
    "transposed": ((5, 4), "transposed"),
    "step": ((23,), "step"),
    "reversed": ((17,), "reversed"),
    "permuted-flipped": ((2, 3, 4), "permuted-flipped"),
}


def unary_sample(op, dtype, layout):
    pool = op.pool(dtype)
    shape, view = UNARY_LAYOUTS[layout]
    rng = _rng(op.name, dtype, layout)
    if shape is None:
        a = pool.copy()
        return lm.asarray(a), a
    return make(pool, shape, view, rng)


# Binary layouts: name -> ((base shape, view) for x1, (base shape, view) for x2);
# "pairs" is the contiguous same-shape fast path over every pair of special values.
BINARY_LAYOUTS = {
    "pairs": None,
    "0d": (((), "contiguous"), ((), "contiguous")),
    "0d-1d": (((), "contiguous"), ((5,), "contiguous")),
    "empty": (((0,), "contiguous"), ((0,), "contiguous")),
    "empty-bcast": (((0, 3), "contiguous"), ((3,), "reversed")),
    "bcast-col-row": (((3, 1), "contiguous"), ((4,), "contiguous")),
    "bcast-3d": (((2, 3, 4), "contiguous"), ((3, 1), "contiguous")),
    "transposed": (((5, 4), "transposed"), ((5, 4), "transposed")),
    "reversed-contig": (((17,), "reversed"), ((17,), "contiguous")),
    "stepped-bcast": (((6, 10), "stepped-2d"), ((4,), "reversed")),
    "permuted-bcast": (((2, 3, 4), "permuted-flipped"), ((2, 1), "contiguous")),
}


def binary_sample(op, dtype1, dtype2, layout):
    """((x1, x2) lamina tensors, (a1, a2) NumPy arrays) for one layout."""
    p1, p2 = op.pool(dtype1, 0), op.pool(dtype2, 1)
    if layout == "pairs":
        a1, a2 = np.repeat(p1, len(p2)), np.tile(p2, len(p1))
        return (lm.asarray(a1.copy()), lm.asarray(a2.copy())), (a1, a2)
    rng = _rng(op.name, dtype1, dtype2, layout)
    (s1, v1), (s2, v2) = BINARY_LAYOUTS[layout]
    t1, a1 = make(p1, s1, v1, rng)
    t2, a2 = make(p2, s2, v2, rng)
    return (t1, t2), (a1, a2)


def python_scalars(op, dtype, operand):
    """Python scalars of ``dtype``'s own kind for operand position ``operand`` (weak:
    they keep the tensor's dtype)."""
    if dtype == "bool":
        return [True, False]
    if dtype in COMPLEX:  # real scalars too: all keep the complex dtype
        return [1.5, -0.0, 3, True, 1j, complex(0.5, -2.0), complex(float("nan"), 1.0)]
    if dtype in FLOATS:
        vals = [1.5, -0.0, 2.0, float("nan"), float("inf")]
    else:
        info = np.iinfo(dtype)
        vals = [3, 0, -2, info.max, info.min, True]
    pool = op.pool(dtype, operand)
    if op.rhs is not None and operand == 1 and dtype not in FLOATS:
        vals = [v for v in vals if not isinstance(v, float) and v in pool.tolist()] or [
            int(pool[len(pool) // 2])
        ]
    info = None if dtype in FLOATS else np.iinfo(dtype)
    return [v for v in vals if info is None or info.min <= v <= info.max]
