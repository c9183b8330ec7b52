"""Decompositions: every operator that can be written with other dispatched operators,
written so (the role of PyTorch's decomposition table); the rest is the core set.

Note [Core operators]: a device must implement the operators of ``CORE`` -- those
without a decomposition here, derived, never listed -- and gets every other operator
from its decomposition, which calls dispatched operators only and so runs on the
device itself (no round trip through host memory). ``core_operators()`` lists them;
docs/backends.md says what that means for a plugin author.

A decomposition has its operator's kernel calling convention (``fn(ks, *args)``, the
arguments canonical as kernels receive them, schema.CONVENTIONS) and computes the
kernel's result. Arguments arrive checked (dtype rules, shapes, the ``check``
function of dispatch/meta.py), so a decomposition validates nothing the description
already did. Decompositions call each other; the graph is acyclic and bottoms out in
``CORE`` (tests/test_decompositions.py runs every decomposition with only the core
kernels in place). Where one is meaningfully less accurate than a dedicated kernel, its
docstring says by how much. Results have the kernel's values, dtype and shape; their
memory layout (channels-last, strides) and whether a view shares storage may differ.

Complex arguments with infinite or NaN parts: the complex branches of the
transcendental functions follow the textbook formulas (a product with 1j assembles a
complex value, turning 0 * inf into NaN), so there they may give NaN where the kernel
gives an infinity or a signed zero, and on a branch cut the other side's value; finite
arguments off the cuts agree to rounding.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import dtypes as D
from . import meta, ops
from .result_types import UniqueAllResult, UniqueCountsResult, UniqueInverseResult
from .schema import OPERATORS
from .tensor import Tensor

DECOMPOSITIONS: dict[str, Callable] = {}


def decomposition(*names: str) -> Callable:
    """Register ``fn`` as the decomposition of the operators ``names``."""

    def register(fn: Callable) -> Callable:
        for name in names:
            if name not in OPERATORS:
                raise ValueError(f"decomposition of an unknown operator {name!r}")
            if name in DECOMPOSITIONS:
                raise ValueError(f"operator {name!r} has two decompositions")
            DECOMPOSITIONS[name] = fn
        return fn

    return register


def core_operators() -> list[str]:
    """The operators a device must implement (Note [Core operators]), in schema order."""
    return [name for name in OPERATORS if name not in DECOMPOSITIONS]


def _call(name: str, *args: Any) -> Any:
    """Dispatch an operator with canonical (kernel) arguments."""
    return OPERATORS[name](*args)


def _at(ks: int, name: str, *args: Any) -> Any:
    """Redispatch an operator on the key set ``ks`` (creation operators: no tensor
    argument carries the device)."""
    op = OPERATORS[name]
    ks &= op.mask
    return op.table[ks.bit_length()](ks, *args)


def _device(*args: Any) -> Any:
    return next(a.device for a in args if isinstance(a, Tensor))


def _floating(x: Tensor) -> Tensor:
    """x in a floating dtype: integers and bool in the default float (DTYPE_RULES)."""
    return x if x.dtype.kind in "fc" else ops.astype(x, D.default_float)


def _operands(name: str, *args: Any) -> tuple:
    """The operands of an elementwise call as tensors of its computation dtype (a
    Python scalar as a 0-d tensor: a weak scalar takes that dtype anyway)."""
    comp = meta.promote(OPERATORS[name], args)
    device = _device(*args)
    return tuple(
        ops.astype(a, comp, copy=False)
        if isinstance(a, Tensor)
        else ops.full((), a, dtype=comp, device=device)
        for a in args
    )


def _axis_key(axis: int, index: Any) -> tuple:
    """An indexing key applying ``index`` along ``axis`` only."""
    return (slice(None),) * axis + (index,)


def _copy(x: Tensor) -> Tensor:
    return _call("copy", x)


LN2 = math.log(2.0)
LN10 = math.log(10.0)


# ---------------------------------------------------------------- elementwise arithmetic


@decomposition("positive", "copy")
def copy(ks, x):
    return _call("astype", x, x.dtype, True)


@decomposition("square")
def square(ks, x):
    return ops.multiply(x, x)


@decomposition("subtract")
def subtract(ks, x1, x2):
    a, b = _operands("subtract", x1, x2)
    return ops.add(a, ops.negative(b))


@decomposition("reciprocal")
def reciprocal(ks, x):
    return ops.divide(1, x)


@decomposition("remainder")
def remainder(ks, x1, x2):
    """x1 - floor_divide(x1, x2) * x2, 0 where an integer x2 is 0. Floats: within one
    rounding of x1 (not of the result): a quotient above ~1e6 loses digits."""
    a, b = _operands("remainder", x1, x2)
    r = a - ops.floor_divide(a, b) * b
    if a.dtype.kind in "iu":
        return ops.where(b == 0, 0, r)
    # a finite x1 over an infinite x2: x1, or x2 where their signs differ (NumPy's)
    differ = ops.logical_and(a != 0, ops.not_equal(a < 0, b < 0))
    by_infinity = ops.logical_and(ops.isinf(b), ops.isfinite(a))
    return ops.where(by_infinity, ops.where(differ, b, a), r)


@decomposition("maximum")
def maximum(ks, x1, x2):
    a, b = _operands("maximum", x1, x2)  # NaN wins, from either side
    return ops.where(ops.logical_or(a < b, ops.isnan(b)), b, a)


@decomposition("minimum")
def minimum(ks, x1, x2):
    a, b = _operands("minimum", x1, x2)
    return ops.where(ops.logical_or(b < a, ops.isnan(b)), b, a)


@decomposition("clip")
def clip(ks, x, min, max):
    if min is not None:
        x = ops.maximum(x, min)
    if max is not None:
        x = ops.minimum(x, max)
    return x if min is not None or max is not None else _copy(x)


@decomposition("copysign")
def copysign(ks, x1, x2):
    a, b = _operands("copysign", x1, x2)
    magnitude = ops.abs(a)
    return ops.where(ops.signbit(b), ops.negative(magnitude), magnitude)


@decomposition("hypot")
def hypot(ks, x1, x2):
    """Scaled by the larger magnitude, so no intermediate overflows; within ~2 ulp."""
    a, b = (_magnitude(v) for v in _operands("hypot", x1, x2))
    big, small = ops.maximum(a, b), ops.minimum(a, b)
    ratio = small / ops.where(big == 0, 1, big)
    r = big * ops.sqrt(1 + ratio * ratio)
    return ops.where(ops.logical_or(ops.isinf(a), ops.isinf(b)), math.inf, r)


@decomposition("logaddexp")
def logaddexp(ks, x1, x2):
    a, b = _operands("logaddexp", x1, x2)
    r = ops.maximum(a, b) + ops.log1p(ops.exp(-ops.abs(a - b)))
    return ops.where(a == b, a + LN2, r)  # also equal infinities (a - b would be NaN)


# ---------------------------------------------------------------- elementwise unary math


def _magnitude(x: Tensor) -> Tensor:
    """|x| of a real tensor."""
    return _copy(x) if x.dtype.kind == "u" else ops.where(x < 0, ops.negative(x), x)


@decomposition("abs")
def abs_(ks, x):
    if x.dtype.kind == "c":
        return ops.hypot(ops.real(x), ops.imag(x))
    return _magnitude(x)


@decomposition("sign")
def sign(ks, x):
    if x.dtype.kind == "c":  # z / |z|, 0 at 0
        zero = x == 0
        return ops.where(zero, x, x / ops.where(zero, 1, ops.abs(x)))
    if x.dtype.kind == "u":
        return ops.where(x > 0, 1, x)
    return ops.where(x < 0, -1, ops.where(x > 0, 1, x))  # keeps 0, -0.0 and NaN


@decomposition("ceil")
def ceil(ks, x):
    if x.dtype.kind in "iu":
        return _copy(x)
    return ops.negative(ops.floor(ops.negative(x)))


@decomposition("trunc")
def trunc(ks, x):
    if x.dtype.kind in "iu":
        return _copy(x)
    return ops.where(x < 0, ops.ceil(x), ops.floor(x))


@decomposition("round")
def round_(ks, x):
    """Half to even, exactly: x - floor(x) is exact in binary floating point."""
    kind = x.dtype.kind
    if kind in "iu":
        return _copy(x)
    if kind == "c":
        return ops.add(_round_real(ops.real(x)), ops.multiply(_round_real(ops.imag(x)), 1j))
    return _round_real(x)


def _round_real(x: Tensor) -> Tensor:
    f = ops.floor(x)
    fraction = x - f
    half = f * 0.5
    even = ops.floor(half) == half
    tie = ops.where(even, f, f + 1)
    return ops.where(fraction > 0.5, f + 1, ops.where(fraction < 0.5, f, tie))


@decomposition("expm1")
def expm1(ks, x):
    """Kahan's (u - 1) x / log(u) with u = exp(x): within a few ulp near 0 too."""
    x = _floating(x)
    u = ops.exp(x)
    um1 = u - 1
    r = ops.where(ops.isinf(u), u, um1 * x / ops.log(ops.where(u == 1, 2, u)))
    return ops.where(u == 1, x, ops.where(um1 == -1, -1, r))


@decomposition("log1p")
def log1p(ks, x):
    """Goldberg's log(u) x / (u - 1) with u = 1 + x: within a few ulp near 0 too."""
    x = _floating(x)
    u = x + 1
    exact = ops.logical_or(u == 1, ops.isinf(u))
    r = ops.log(u) * x / ops.where(exact, 1, u - 1)
    return ops.where(u == 1, x, ops.where(ops.isinf(u), ops.log(u), r))


@decomposition("log2")
def log2(ks, x):
    """log(x) / log(2): within ~2 ulp, so not always exact at powers of two."""
    return ops.divide(ops.log(x), LN2)


@decomposition("log10")
def log10(ks, x):
    """log(x) / log(10): within ~2 ulp, so not always exact at powers of ten."""
    return ops.divide(ops.log(x), LN10)


@decomposition("tan")
def tan(ks, x):
    """sin / cos: within ~2 ulp (relative) away from the poles."""
    return ops.sin(x) / ops.cos(x)


@decomposition("atan")
def atan(ks, x):
    x = _floating(x)
    if x.dtype.kind == "c":  # the principal branch's logarithms (see asin)
        return 0.5j * (ops.log(1 - 1j * x) - ops.log(1 + 1j * x))
    return ops.atan2(x, 1)


@decomposition("asin")
def asin(ks, x):
    """Real: atan2(x, sqrt((1 - x)(1 + x))), a few ulp. Complex: -i log(iz + sqrt(1 -
    z^2)), the textbook formula: accurate to ~1e-7 relative in single and ~1e-15 in
    double precision away from the branch points, less near them and beyond |z| ~ 1e150."""
    x = _floating(x)
    if x.dtype.kind == "c":
        return -1j * ops.log(1j * x + ops.sqrt(1 - x * x))
    return ops.atan2(x, ops.sqrt((1 - x) * (1 + x)))


@decomposition("acos")
def acos(ks, x):
    """Complex: pi/2 - asin(z) (see asin)."""
    x = _floating(x)
    if x.dtype.kind == "c":
        return math.pi / 2 - ops.asin(x)
    return ops.atan2(ops.sqrt((1 - x) * (1 + x)), x)


@decomposition("sinh")
def sinh(ks, x):
    """Real: (expm1(x) - expm1(-x)) / 2, a few ulp, but infinite where exp(|x|)
    overflows (above ~88.7 in float32, ~709.8 in float64) while sinh is finite."""
    x = _floating(x)
    if x.dtype.kind == "c":
        return (ops.exp(x) - ops.exp(-x)) * 0.5
    return (ops.expm1(x) - ops.expm1(-x)) * 0.5


@decomposition("cosh")
def cosh(ks, x):
    """(exp(x) + exp(-x)) / 2; the same overflow margin as sinh."""
    x = _floating(x)
    return (ops.exp(x) + ops.exp(-x)) * 0.5


@decomposition("tanh")
def tanh(ks, x):
    """-t / (t + 2) with t = expm1(-2|x|) (on the half-plane Re z >= 0 for complex z,
    by tanh(-z) = -tanh(z)): no overflow, a few ulp."""
    x = _floating(x)
    negative = (ops.real(x) if x.dtype.kind == "c" else x) < 0
    t = ops.expm1(-2 * ops.where(negative, -x, x))
    r = -t / (t + 2)
    return ops.where(negative, -r, r)


@decomposition("asinh")
def asinh(ks, x):
    """Real: log1p(|x| + x^2 / (1 + sqrt(1 + x^2))), a few ulp; complex: log(z +
    sqrt(z^2 + 1)) (see asin)."""
    x = _floating(x)
    if x.dtype.kind == "c":
        return ops.log(x + ops.sqrt(x * x + 1))
    a = ops.abs(x)
    big = a > 2.0**28  # a^2 would overflow; log(2a) is exact to rounding there
    small = ops.where(big, 0, a)
    r = ops.where(
        big, ops.log(a) + LN2, ops.log1p(a + small * small / (1 + ops.sqrt(1 + small * small)))
    )
    return ops.where(x < 0, -r, r)


@decomposition("acosh")
def acosh(ks, x):
    """Real: log1p(t + sqrt(2t + t^2)) with t = x - 1, a few ulp; complex: log(z +
    sqrt(z + 1) sqrt(z - 1)) (see asin)."""
    x = _floating(x)
    if x.dtype.kind == "c":
        return ops.log(x + ops.sqrt(x + 1) * ops.sqrt(x - 1))
    big = x > 2.0**28
    t = ops.where(big, 0, x) - 1
    return ops.where(big, ops.log(x) + LN2, ops.log1p(t + ops.sqrt(2 * t + t * t)))


@decomposition("atanh")
def atanh(ks, x):
    """Real: log1p(2x / (1 - x)) / 2, a few ulp; complex: (log(1 + z) - log(1 - z)) / 2
    (see asin)."""
    x = _floating(x)
    if x.dtype.kind == "c":
        return (ops.log(1 + x) - ops.log(1 - x)) * 0.5
    return ops.log1p(2 * x / (1 - x)) * 0.5


@decomposition("signbit")
def signbit(ks, x):
    """The sign of a zero by 1 / x; a NaN's sign bit is not visible (False)."""
    x = _floating(x)
    negative_zero = ops.logical_and(x == 0, ops.divide(1, x) < 0)
    return ops.logical_or(x < 0, negative_zero)


# ---------------------------------------------------------------- tests of values


@decomposition("logical_not")
def logical_not(ks, x):
    return ops.equal(x, False if x.dtype.kind == "b" else 0)


@decomposition("not_equal")
def not_equal(ks, x1, x2):
    return ops.logical_not(ops.equal(x1, x2))


@decomposition("greater")
def greater(ks, x1, x2):
    return ops.less(x2, x1)


@decomposition("greater_equal")
def greater_equal(ks, x1, x2):
    return ops.less_equal(x2, x1)


@decomposition("less_equal")
def less_equal(ks, x1, x2):
    return ops.logical_or(ops.less(x1, x2), ops.equal(x1, x2))


@decomposition("isnan")
def isnan(ks, x):
    return ops.not_equal(x, x)


@decomposition("isfinite")
def isfinite(ks, x):
    if x.dtype.kind in "biu":
        return ops.equal(x, x)
    return ops.equal(x - x, 0)  # inf - inf and NaN give NaN


def _is_infinite(x: Tensor) -> Tensor:
    """isinf of a real tensor: neither finite nor NaN."""
    return ops.logical_not(ops.logical_or(ops.isfinite(x), ops.isnan(x)))


@decomposition("isinf")
def isinf(ks, x):
    if x.dtype.kind == "c":  # either part infinite (also with a NaN in the other)
        return ops.logical_or(_is_infinite(ops.real(x)), _is_infinite(ops.imag(x)))
    return _is_infinite(x)


def _truth(v: Any, device: Any) -> Tensor:
    """A bool tensor: v != 0 (a Python scalar as a 0-d one)."""
    if not isinstance(v, Tensor):
        return ops.full((), bool(v), dtype=D.bool_, device=device)
    return v if v.dtype.kind == "b" else ops.not_equal(v, 0)


@decomposition("logical_and")
def logical_and(ks, x1, x2):
    a, b = (_truth(v, _device(x1, x2)) for v in (x1, x2))
    return ops.where(a, b, a)


@decomposition("logical_or")
def logical_or(ks, x1, x2):
    a, b = (_truth(v, _device(x1, x2)) for v in (x1, x2))
    return ops.where(a, a, b)


@decomposition("logical_xor")
def logical_xor(ks, x1, x2):
    a, b = (_truth(v, _device(x1, x2)) for v in (x1, x2))
    return ops.not_equal(a, b)


# ---------------------------------------------------------------- bitwise


@decomposition("bitwise_invert")
def bitwise_invert(ks, x):
    if x.dtype.kind == "b":
        return ops.logical_not(x)
    return ops.negative(x + 1)  # ~x == -x - 1 in two's complement, wrapping


@decomposition("bitwise_or")
def bitwise_or(ks, x1, x2):
    a, b = _operands("bitwise_or", x1, x2)
    if a.dtype.kind == "b":
        return ops.logical_or(a, b)
    return a + b - ops.bitwise_and(a, b)  # a + b == (a | b) + (a & b), wrapping


@decomposition("bitwise_xor")
def bitwise_xor(ks, x1, x2):
    a, b = _operands("bitwise_xor", x1, x2)
    if a.dtype.kind == "b":
        return ops.not_equal(a, b)
    return a + b - ops.bitwise_and(a, b) * 2


def _bits(dtype: D.DType) -> int:
    return dtype.np.itemsize * 8


@decomposition("bitwise_left_shift")
def bitwise_left_shift(ks, x1, x2):
    """x1 * 2**x2, wrapping; 0 for a shift by the width or more, or a negative one."""
    a, s = _operands("bitwise_left_shift", x1, x2)
    beyond = ops.logical_or(s < 0, s >= _bits(a.dtype))
    two = ops.full((), 2, dtype=a.dtype, device=a.device)
    return ops.where(beyond, 0, a * ops.pow(two, ops.where(beyond, 0, s)))


@decomposition("bitwise_right_shift")
def bitwise_right_shift(ks, x1, x2):
    """floor(x1 / 2**x2); a shift by the width or more, or a negative one, gives 0
    (-1 for a negative x1)."""
    a, s = _operands("bitwise_right_shift", x1, x2)
    top = _bits(a.dtype) - (1 if a.dtype.kind == "i" else 0)  # 2**top overflows
    beyond = ops.logical_or(s < 0, s >= top)
    two = ops.full((), 2, dtype=a.dtype, device=a.device)
    shifted = ops.floor_divide(a, ops.pow(two, ops.where(beyond, 0, s)))
    filled = ops.where(a < 0, -1, 0) if a.dtype.kind == "i" else 0
    return ops.astype(ops.where(beyond, filled, shifted), a.dtype)


# ---------------------------------------------------------------- in-place variants


def _inplace(name: str) -> Callable:
    base = name.removesuffix("_")

    def fn(ks, x1, x2):
        _call("setitem", x1, Ellipsis, _call(base, x1, x2))  # setitem casts to x1's dtype
        return x1

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"x1 = {base}(x1, x2), written into x1."
    return fn


for _name in [n for n, op in OPERATORS.items() if op.inplace_of is not None]:
    decomposition(_name)(_inplace(_name))


@decomposition("add_scaled_")
def add_scaled_(ks, x1, x2, alpha):
    """x1 += alpha * x2 in two passes."""
    _call("setitem", x1, Ellipsis, x1 + alpha * x2)
    return x1


# ---------------------------------------------------------------- reductions


def _count(x: Tensor, axis: tuple) -> int:
    return math.prod(x.shape[a] for a in axis)


@decomposition("mean")
def mean(ks, x, axis, keepdims):
    x = _floating(x)
    return ops.sum(x, axis=axis, keepdims=keepdims) / _count(x, axis)


@decomposition("var")
def var(ks, x, axis, correction, keepdims):
    """Two passes (the mean, then the squared deviations)."""
    x = _floating(x)
    d = x - ops.mean(x, axis=axis, keepdims=True)
    squares = ops.real(d * ops.conj(d)) if d.dtype.kind == "c" else d * d
    return ops.sum(squares, axis=axis, keepdims=keepdims) / max(_count(x, axis) - correction, 0)


@decomposition("std")
def std(ks, x, axis, correction, keepdims):
    return ops.sqrt(ops.var(x, axis=axis, correction=correction, keepdims=keepdims))


def _reversed_order(x: Tensor) -> Tensor:
    """An order-reversing map of x's values: -x (floats), ~x (integers), not x (bool)."""
    kind = x.dtype.kind
    return (
        ops.negative(x)
        if kind == "f"
        else ops.logical_not(x)
        if kind == "b"
        else ops.bitwise_invert(x)
    )


@decomposition("min")
def min_(ks, x, axis, keepdims):
    return _reversed_order(ops.max(_reversed_order(x), axis=axis, keepdims=keepdims))


@decomposition("argmin")
def argmin(ks, x, axis, keepdims):
    return _call("argmax", _reversed_order(x), axis, keepdims)


@decomposition("any")
def any_(ks, x, axis, keepdims):
    return ops.sum(_truth(x, x.device), axis=axis, keepdims=keepdims) > 0


@decomposition("all")
def all_(ks, x, axis, keepdims):
    return ops.sum(ops.logical_not(x), axis=axis, keepdims=keepdims) == 0


@decomposition("vector_norm")
def vector_norm(ks, x, axis, keepdims, ord):
    """sum(|x|**ord)**(1/ord), unscaled: overflows where |x|**ord does (the 2-norm of
    values above ~1e19 in float32)."""
    a = ops.abs(_floating(x))
    if ord == math.inf:
        return ops.max(a, axis=axis, keepdims=keepdims)
    if ord == -math.inf:
        return ops.min(a, axis=axis, keepdims=keepdims)
    if ord == 0:
        return ops.astype(ops.sum(a != 0, axis=axis, keepdims=keepdims), a.dtype)
    if ord == 1:
        return ops.sum(a, axis=axis, keepdims=keepdims)
    if ord == 2:
        return ops.sqrt(ops.sum(a * a, axis=axis, keepdims=keepdims))
    return ops.sum(a**ord, axis=axis, keepdims=keepdims) ** (1.0 / ord)


# ---------------------------------------------------------------- scans


def _scan(
    x: Tensor, axis: int, dtype: D.DType, include_initial: bool, step: Callable, identity: int
):
    """A running fold along axis in log2(n) dispatched steps (Hillis and Steele): each
    step folds in the partial result shifted by a doubling distance. The order of the
    operations differs from a sequential loop: floating results may differ by rounding."""
    y = ops.astype(x, dtype, copy=False)
    n = x.shape[axis]

    def pad(k):
        shape = tuple(k if d == axis else s for d, s in enumerate(y.shape))
        return ops.full(shape, identity, dtype=dtype, device=x.device)

    shift = 1
    while shift < n:
        head = _call("getitem", y, _axis_key(axis, slice(0, n - shift)))
        y = step(y, _call("concat", [pad(shift), head], axis))
        shift *= 2
    return _call("concat", [pad(1), y], axis) if include_initial else y


@decomposition("cumulative_sum")
def cumulative_sum(ks, x, axis, dtype, include_initial):
    dtype = meta.sum_dtype(OPERATORS["cumulative_sum"], x, dtype)
    return _scan(x, axis, dtype, include_initial, ops.add, 0)


@decomposition("cumulative_prod")
def cumulative_prod(ks, x, axis, dtype, include_initial):
    dtype = meta.sum_dtype(OPERATORS["cumulative_prod"], x, dtype)
    return _scan(x, axis, dtype, include_initial, ops.multiply, 1)


# ---------------------------------------------------------------- views


@decomposition("matrix_transpose")
def matrix_transpose(ks, x):
    axes = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return _call("permute_dims", x, axes)


@decomposition("expand_dims")
def expand_dims(ks, x, axis):
    shape = list(x.shape)
    for a in sorted(axis) if isinstance(axis, tuple) else (axis,):
        shape.insert(a, 1)
    return _call("reshape", x, tuple(shape), None)


@decomposition("squeeze")
def squeeze(ks, x, axis):
    shape = tuple(s for d, s in enumerate(x.shape) if d not in axis)
    return _call("reshape", x, shape, None)


@decomposition("flip")
def flip(ks, x, axis):
    key = tuple(slice(None, None, -1) if d in axis else slice(None) for d in range(x.ndim))
    return _call("getitem", x, key)


@decomposition("split")
def split(ks, x, sections, axis):
    n = x.shape[axis]
    if isinstance(sections, int):
        bounds = list(range(0, n, sections)) + [n] if n else [0, 0]
    else:
        bounds = [0, *np.cumsum(sections).tolist()]
    return tuple(
        _call("getitem", x, _axis_key(axis, slice(lo, hi))) for lo, hi in itertools.pairwise(bounds)
    )


@decomposition("diagonal")
def diagonal(ks, x, offset):
    """A strided slice of the flattened matrices (a view when they are contiguous)."""
    *batch, n, m = x.shape
    length = max(0, min(n, m - offset) if offset >= 0 else min(n + offset, m))
    start = offset if offset >= 0 else -offset * m
    flat = _call("reshape", x, (*batch, n * m), None)
    stop = start + (length - 1) * (m + 1) + 1 if length else start
    return _call("getitem", flat, (Ellipsis, slice(start, stop, m + 1)))


@decomposition("to_layout")
def to_layout(ks, input, layout):
    """Always a copy, also when input is in layout already (the kernel's view)."""
    if layout == "NCHW":
        return _call("reshape", input, input.shape, True)
    nhwc = _call("permute_dims", input, (0, 2, 3, 1))
    return _call("permute_dims", _call("reshape", nhwc, nhwc.shape, True), (0, 3, 1, 2))


@decomposition("stack")
def stack(ks, arrays, axis):
    return _call("concat", [ops.expand_dims(a, axis=axis) for a in arrays], axis)


# ---------------------------------------------------------------- linear algebra


@decomposition("tensordot")
def tensordot(ks, x1, x2, axes):
    a_axes, b_axes = tuple(axes[0]), tuple(axes[1])
    free_a = [d for d in range(x1.ndim) if d not in a_axes]
    free_b = [d for d in range(x2.ndim) if d not in b_axes]
    inner = math.prod(x1.shape[d] for d in a_axes)
    a = _call("permute_dims", x1, (*free_a, *a_axes))
    b = _call("permute_dims", x2, (*b_axes, *free_b))
    a = _call("reshape", a, (math.prod(x1.shape[d] for d in free_a), inner), None)
    b = _call("reshape", b, (inner, math.prod(x2.shape[d] for d in free_b)), None)
    shape = tuple(x1.shape[d] for d in free_a) + tuple(x2.shape[d] for d in free_b)
    return _call("reshape", ops.matmul(a, b), shape, None)


@decomposition("vecdot")
def vecdot(ks, x1, x2, axis):
    product = ops.conj(x1) * x2
    return ops.sum(product, axis=axis % product.ndim, dtype=product.dtype)


@decomposition("det")
def det(ks, x):
    """sign * exp(logabsdet): relative error ~ |logabsdet| ulp."""
    sign, logabsdet = _call("slogdet", x)
    return sign * ops.exp(logabsdet)


@decomposition("inv")
def inv(ks, x):
    x = _floating(x)
    n = x.shape[-1]
    return _call("solve", x, ops.eye(n, dtype=x.dtype, device=x.device))


@decomposition("eigvalsh")
def eigvalsh(ks, x):
    return _call("eigh", x)[0]


@decomposition("svdvals")
def svdvals(ks, x):
    return _call("svd", x, False)[1]


# ---------------------------------------------------------------- conversions


@decomposition("to_dense")
def to_dense(ks, x):
    return x  # a dense tensor is its own dense form; the sparse layer serves sparse ones


@decomposition("coalesce")
def coalesce(ks, x):
    raise TypeError(
        "coalesce: expected a sparse tensor, got a dense one (make one with "
        "to_sparse() or lamina.sparse_coo_tensor)"
    )


@decomposition("sparse_mask")
def sparse_mask(ks, x, mask):
    raise TypeError("sparse_mask: the mask must be a sparse tensor, got a dense one")


# ---------------------------------------------------------------- creation


@decomposition("empty")
def empty(ks, shape, dtype):
    return _at(ks, "full", shape, 0, dtype)


@decomposition("eye")
def eye(ks, n_rows, n_cols, k, dtype):
    n_cols = n_rows if n_cols is None else n_cols
    rows = _at(ks, "arange", 0, n_rows, 1, D.int64)
    cols = _at(ks, "arange", 0, n_cols, 1, D.int64)
    diagonal = ops.equal(ops.expand_dims(cols, axis=0) - ops.expand_dims(rows, axis=1), k)
    return ops.astype(diagonal, dtype)


@decomposition("linspace")
def linspace(ks, start, stop, num, dtype, endpoint):
    """NumPy's algorithm: start + i * step, the last point stop exactly."""
    work = dtype if dtype.kind in "fc" else D.float64
    steps = num - 1 if endpoint else num
    y = ops.astype(_at(ks, "arange", 0, num, 1, D.int64), work)
    step = (stop - start) / steps if steps > 0 else 0.0
    y = y * step + start if step != 0 else y / max(steps, 1) * (stop - start) + start
    if endpoint and num > 1:
        _call("setitem", y, (num - 1,), stop)
    return ops.astype(ops.floor(y) if dtype.kind in "iu" else y, dtype)


# ---------------------------------------------------------------- sorting, searching, sets


def _along(x: Tensor, axis: int, index: Tensor) -> Tensor:
    """x's values at ``index`` along axis (NumPy's take_along_axis), by a key of
    broadcasting positions."""
    key = []
    for d in range(x.ndim):
        if d == axis:
            key.append(index)
            continue
        shape = tuple(x.shape[d] if e == d else 1 for e in range(x.ndim))
        key.append(ops.reshape(ops.arange(x.shape[d], device=x.device), shape))
    return _call("getitem", x, tuple(key))


@decomposition("sort")
def sort(ks, x, axis, descending, stable):
    return _along(x, axis, _call("argsort", x, axis, descending, stable))


@decomposition("searchsorted")
def searchsorted(ks, x1, x2, side, sorter):
    """Counts of x1's elements below each x2 (NaN sorts last): O(len(x1) * x2.size)
    work and memory, where the kernel's binary search takes O(log len(x1)) per value."""
    a, v = _operands("searchsorted", x1, x2)
    if sorter is not None:
        a = _call("getitem", a, (sorter,))
    a, v = ops.reshape(a, (1,) * v.ndim + a.shape), ops.expand_dims(v, axis=-1)
    if side == "left":
        before = ops.logical_or(a < v, ops.logical_and(ops.isnan(v), ops.logical_not(ops.isnan(a))))
    else:
        before = ops.logical_or(a <= v, ops.isnan(v))
    return ops.sum(before, axis=-1, dtype=D.int64)


def _unravel(flat_index: Tensor, shape: tuple) -> tuple:
    coordinates = []
    for size in reversed(shape):
        coordinates.append(ops.remainder(flat_index, size))
        flat_index = ops.floor_divide(flat_index, size)
    return tuple(reversed(coordinates))


@decomposition("nonzero")
def nonzero(ks, x):
    """A stable argsort brings the nonzero positions first (reads one count to the host)."""
    flat = ops.reshape(_truth(x, x.device), (-1,))
    count = int(ops.sum(flat).item())
    order = _call("argsort", ops.logical_not(flat), 0, False, True)
    return _unravel(_call("getitem", order, (slice(0, count),)), x.shape)


@decomposition("unique_all")
def unique_all(ks, x):
    """The kernel's algorithm: a stable sort, group starts where neighbours differ (so
    every NaN is its own group), and the group numbers scattered back."""
    flat = ops.reshape(x, (-1,))
    n = flat.shape[0]
    order = _call("argsort", flat, 0, False, True)
    ordered = _call("getitem", flat, (order,))
    first = ops.full((min(n, 1),), True, dtype=D.bool_, device=x.device)
    starts = _call("concat", [first, ordered[1:] != ordered[:-1]], 0)
    group = ops.cumulative_sum(starts, dtype=D.int64) - 1
    inverse = ops.full((n,), 0, dtype=D.int64, device=x.device)
    _call("setitem", inverse, (order,), group)
    positions = _call("getitem", ops.arange(n, device=x.device), (starts,))
    ends = _call(
        "concat", [positions[1:], ops.full((min(n, 1),), n, dtype=D.int64, device=x.device)], 0
    )
    return UniqueAllResult(
        _call("getitem", ordered, (starts,)),
        _call("getitem", order, (starts,)),
        ops.reshape(inverse, x.shape),
        ends - positions,
    )


@decomposition("unique_counts")
def unique_counts(ks, x):
    r = _call("unique_all", x)
    return UniqueCountsResult(r.values, r.counts)


@decomposition("unique_inverse")
def unique_inverse(ks, x):
    r = _call("unique_all", x)
    return UniqueInverseResult(r.values, r.inverse_indices)


@decomposition("unique_values")
def unique_values(ks, x):
    return _call("unique_all", x).values


# ---------------------------------------------------------------- fft

# The inverse transform is the forward one conjugated, with the opposite normalization.
_SWAP = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


@decomposition("ifft")
def ifft(ks, x, n, axis, norm):
    return ops.conj(_call("fft", ops.conj(x), n, axis, _SWAP[norm]))


@decomposition("fftn")
def fftn(ks, x, s, axes, norm):
    for size, axis in zip(s, axes):
        x = _call("fft", x, size, axis, norm)
    return x


@decomposition("ifftn")
def ifftn(ks, x, s, axes, norm):
    for size, axis in zip(s, axes):
        x = _call("ifft", x, size, axis, norm)
    return x


@decomposition("rfft")
def rfft(ks, x, n, axis, norm):
    spectrum = _call("fft", x, n, axis, norm)
    return _call("getitem", spectrum, _axis_key(axis, slice(0, n // 2 + 1)))


@decomposition("irfft")
def irfft(ks, x, n, axis, norm):
    """The Hermitian spectrum completed, then the complex inverse's real part."""
    half = n // 2 + 1
    m = x.shape[axis]
    x = _call("getitem", x, _axis_key(axis, slice(0, half)))
    if m < half:  # zero-padded, as the kernel pads
        shape = tuple(half - m if d == axis else s for d, s in enumerate(x.shape))
        x = _call("concat", [x, ops.full(shape, 0, dtype=x.dtype, device=x.device)], axis)
    tail = _call("getitem", x, _axis_key(axis, slice(1, 1 + n - half)))
    full = _call("concat", [x, ops.conj(ops.flip(tail, axis=axis))], axis)
    return ops.real(_call("ifft", full, n, axis, norm))


@decomposition("rfftn")
def rfftn(ks, x, s, axes, norm):
    x = _call("rfft", x, s[-1], axes[-1], norm)
    return _call("fftn", x, s[:-1], axes[:-1], norm) if len(axes) > 1 else x


@decomposition("irfftn")
def irfftn(ks, x, s, axes, norm):
    if len(axes) > 1:
        x = _call("ifftn", x, s[:-1], axes[:-1], norm)
    return _call("irfft", x, s[-1], axes[-1], norm)


@decomposition("hfft")
def hfft(ks, x, n, axis, norm):
    return _call("irfft", ops.conj(x), n, axis, _SWAP[norm])


@decomposition("ihfft")
def ihfft(ks, x, n, axis, norm):
    return ops.conj(_call("rfft", x, n, axis, _SWAP[norm]))


# ---------------------------------------------------------------- neural networks


@decomposition("linear")
def linear(ks, input, weight, bias):
    out = ops.matmul(input, ops.matrix_transpose(weight))
    return out if bias is None else out + bias


@decomposition("linear_relu")
def linear_relu(ks, input, weight, bias):
    return _call("relu", _call("linear", input, weight, bias))


@decomposition("conv2d_relu")
def conv2d_relu(ks, input, weight, bias, stride, padding, dilation, groups):
    return _call("relu", _call("conv2d", input, weight, bias, stride, padding, dilation, groups))


@decomposition("relu")
def relu(ks, input):
    return ops.where(input < 0, 0, input)  # NaN and -0.0 pass, as the kernel's


@decomposition("relu_backward")
def relu_backward(ks, grad, result):
    return ops.where(result <= 0, 0, grad)  # a NaN result lets grad through


@decomposition("leaky_relu")
def leaky_relu(ks, input, negative_slope):
    return ops.where(input > 0, input, input * negative_slope)


@decomposition("leaky_relu_backward")
def leaky_relu_backward(ks, grad, input, negative_slope):
    return ops.where(input > 0, grad, grad * negative_slope)


_TANH_BETA = math.sqrt(2.0 / math.pi)
_TANH_KAPPA = 0.044715


@decomposition("gelu_backward")
def gelu_backward(ks, grad, input, approximate):
    """Exact form: the normal CDF as gelu(x) / x (there is no erf operator), within a
    few ulp of the kernel's."""
    x = input
    if approximate == "tanh":
        t = ops.tanh(_TANH_BETA * (x + _TANH_KAPPA * x * x * x))
        du = _TANH_BETA * (1.0 + 3.0 * _TANH_KAPPA * x * x)
        return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)
    zero = x == 0
    cdf = ops.where(zero, 0.5, _call("gelu", x, "none") / ops.where(zero, 1, x))
    pdf = ops.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return grad * (cdf + x * pdf)


@decomposition("sigmoid")
def sigmoid(ks, input):
    return ops.divide(1, ops.exp(ops.negative(input)) + 1)


@decomposition("silu")
def silu(ks, input):
    return input / (ops.exp(ops.negative(input)) + 1)


@decomposition("silu_backward")
def silu_backward(ks, grad, input):
    s = ops.divide(1, ops.exp(ops.negative(input)) + 1)
    return grad * (s * (1 + input * (1 - s)))


@decomposition("tanh_backward")
def tanh_backward(ks, grad, result):
    return grad * (1 - result * result)


@decomposition("sigmoid_backward")
def sigmoid_backward(ks, grad, result):
    return grad * result * (1 - result)


@decomposition("hardtanh")
def hardtanh(ks, input, min_val, max_val):
    # NaN fails both tests and passes, as in the kernel
    return ops.where(input < min_val, min_val, ops.where(input > max_val, max_val, input))


@decomposition("hardtanh_backward")
def hardtanh_backward(ks, grad, input, min_val, max_val):
    return ops.where((input > min_val) & (input < max_val), grad, 0)


@decomposition("hardswish")
def hardswish(ks, input):
    t = input + 3
    return input * ops.where(t < 0, 0, ops.where(t > 6, 6, t)) / 6


@decomposition("hardswish_backward")
def hardswish_backward(ks, grad, input):
    ramp = ops.where(input < 3, grad * (input / 3 + 0.5), grad)  # NaN input: grad
    return ops.where(input <= -3, 0, ramp)


def _shifted(input: Tensor, dim: int) -> Tensor:
    """input minus its maximum along dim (an empty input as it is)."""
    if input.size == 0:
        return input
    return input - ops.max(input, axis=dim, keepdims=True)


@decomposition("softmax")
def softmax(ks, input, dim):
    e = ops.exp(_shifted(input, dim))
    return e / ops.sum(e, axis=dim, keepdims=True)


@decomposition("log_softmax")
def log_softmax(ks, input, dim):
    s = _shifted(input, dim)
    return s - ops.log(ops.sum(ops.exp(s), axis=dim, keepdims=True))


@decomposition("softmax_backward")
def softmax_backward(ks, grad, result, dim):
    return result * (grad - ops.sum(grad * result, axis=dim, keepdims=True))


@decomposition("log_softmax_backward")
def log_softmax_backward(ks, grad, result, dim):
    return grad - ops.exp(result) * ops.sum(grad, axis=dim, keepdims=True)


@decomposition("mse_loss")
def mse_loss(ks, input, target, reduction):
    """The sum accumulates in the input's dtype (the kernel's in float64)."""
    d = input - target
    squares = d * d
    if reduction == "none":
        return squares
    return ops.sum(squares) if reduction == "sum" else ops.mean(squares)


def _reduced_loss(losses: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return losses
    return ops.sum(losses) if reduction == "sum" else ops.mean(losses)


@decomposition("smooth_l1_loss")
def smooth_l1_loss(ks, input, target, reduction, beta):
    d = ops.abs(input - target)
    quadratic = (0.5 / beta) * d * d if beta else d  # beta 0: |d| everywhere
    return _reduced_loss(ops.where(d < beta, quadratic, d - 0.5 * beta), reduction)


@decomposition("smooth_l1_loss_backward")
def smooth_l1_loss_backward(ks, grad, input, target, reduction, beta):
    d = input - target
    slope = ops.minimum(ops.maximum(d / beta, -1.0), 1.0) if beta else ops.sign(d)
    if reduction == "mean":
        grad = grad / input.size if input.size else grad
    return slope * grad


@decomposition("binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(ks, input, target, weight, reduction, pos_weight):
    """log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)), with no overflow."""
    log_sigmoid = ops.minimum(input, 0.0) - ops.log1p(ops.exp(-ops.abs(input)))
    if pos_weight is not None:
        log_sigmoid = log_sigmoid * ((pos_weight - 1.0) * target + 1.0)
    losses = (1.0 - target) * input - log_sigmoid
    return _reduced_loss(losses if weight is None else losses * weight, reduction)


@decomposition("cross_entropy_loss")
def cross_entropy_loss(ks, input, target, ignore_index):
    """cross_entropy's definition: nll_loss of log_softmax over the classes."""
    logp = _call("log_softmax", input, 1)
    return _call("nll_loss", logp, target, None, ignore_index, "mean")


@decomposition("cross_entropy_loss_backward")
def cross_entropy_loss_backward(ks, grad, input, target, ignore_index):
    """log_softmax's and nll_loss's gradients in turn, from the log-probabilities."""
    logp = _call("log_softmax", input, 1)
    g = _call("nll_loss_backward", grad, logp, target, None, ignore_index, "mean")
    return _call("log_softmax_backward", g, logp, 1)


@decomposition("nll_loss")
def nll_loss(ks, input, target, weight, ignore_index, reduction):
    """The picked log-probabilities by an index key; the sums accumulate in the
    input's dtype (the kernel's in float64)."""
    x = input if input.ndim > 1 else ops.expand_dims(input, axis=0)
    classes = x.shape[1]
    rows = ops.reshape(ops.moveaxis(x, 1, -1), (-1, classes))  # (samples, classes)
    t = ops.reshape(ops.astype(target, D.int64), (-1,))
    counted = t != ignore_index
    bad = ops.logical_and(counted, ops.logical_or(t < 0, t >= classes))
    if ops.any(bad).item():
        raise ValueError(
            f"nll_loss: target values must be class indices in [0, {classes}) (or "
            f"ignore_index={ignore_index}), got {int(_call('getitem', t, (bad,))[0].item())}"
        )
    t = ops.where(counted, t, 0)
    picked = _call("getitem", rows, (ops.arange(rows.shape[0], device=x.device), t))
    w = ops.astype(counted, x.dtype)
    if weight is not None:
        w = w * _call("getitem", weight, (t,))
    losses = -picked * w
    if reduction == "none":
        return ops.reshape(losses, target.shape)
    total = ops.sum(losses)
    return total if reduction == "sum" else total / ops.sum(w)


@decomposition("nll_loss_backward")
def nll_loss_backward(ks, grad, input, target, weight, ignore_index, reduction):
    """-grad w[t] / (sum of w[t] for 'mean') at each target's class, 0 elsewhere: 0 at
    an ignored target and off the target's class even where the coefficient is NaN (a
    'mean' over zero total weight: 0 / 0 where counted, as PyTorch's)."""
    counted = target != ignore_index
    w = ops.astype(counted, grad.dtype)
    if weight is not None:
        w = w * _call("getitem", weight, (ops.where(counted, target, 0),))
    coef = -w * grad
    if reduction == "mean":
        coef = ops.where(counted, coef / ops.sum(w), 0.0)
    # an ignored target (coefficient 0) may be a class index, whose column then gets 0
    classes = ops.arange(input.shape[0 if input.ndim == 1 else 1], device=grad.device)
    if input.ndim == 1:
        return ops.where(classes == target, coef, 0.0)
    along = tuple(-1 if d == 1 else 1 for d in range(input.ndim))
    onehot = ops.reshape(classes, along) == ops.expand_dims(target, axis=1)
    return ops.where(onehot, ops.expand_dims(coef, axis=1), 0.0)


# Pooling of windows along one spatial axis at a time, as a matrix product: row i of
# the (outputs, size) matrix holds the weights of output i's window.


def _window_matrix(
    device: Any, dtype: D.DType, size: int, first: Tensor, last: Tensor, divisor: Tensor
) -> Tensor:
    """(len(first), size): 1 / divisor[i] on positions [first[i], last[i]), else 0."""
    positions = ops.expand_dims(ops.arange(size, device=device), axis=0)
    first, last = ops.expand_dims(first, axis=1), ops.expand_dims(last, axis=1)
    inside = ops.logical_and(positions >= first, positions < last)
    return ops.astype(inside, dtype) / ops.astype(ops.expand_dims(divisor, axis=1), dtype)


def _avg_matrices(
    input: Tensor, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor
):
    """The (out, in) matrices of average pooling along H and W (the kernel's windows and
    divisors: a divisor_override divides once, in the first)."""
    matrices = []
    for axis, (size, k, s, p) in enumerate(zip(input.shape[-2:], kernel_size, stride, padding)):
        out = meta.pool_output_size(size, p, k, s, 1, ceil_mode)
        start = ops.arange(out, device=input.device) * s - p
        end = ops.minimum(start + k, size + p)  # the window, clipped to the padded input
        first, last = ops.maximum(start, 0), ops.minimum(end, size)
        if divisor is not None:
            count = ops.full(
                (out,), divisor if axis == 0 else 1, dtype=D.int64, device=input.device
            )
        else:
            count = end - start if count_include_pad else last - first
        matrices.append(_window_matrix(input.device, input.dtype, size, first, last, count))
    return matrices


def _pool_rows_columns(x: Tensor, rows: Tensor, columns: Tensor) -> Tensor:
    """rows @ x @ columns.T over the last two axes."""
    return ops.matmul(ops.matmul(rows, x), ops.matrix_transpose(columns))


@decomposition("avg_pool2d")
def avg_pool2d(ks, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor):
    rows, columns = _avg_matrices(
        input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor
    )
    return _pool_rows_columns(input, rows, columns)


@decomposition("avg_pool2d_backward")
def avg_pool2d_backward(ks, grad, input, kernel_size, stride, padding, ceil_mode, cip, divisor):
    rows, columns = _avg_matrices(input, kernel_size, stride, padding, ceil_mode, cip, divisor)
    return _pool_rows_columns(grad, ops.matrix_transpose(rows), ops.matrix_transpose(columns))


def _adaptive_matrices(input: Tensor, output_size: tuple) -> list:
    """Windows [floor(i n / m), ceil((i + 1) n / m)) of each axis."""
    matrices = []
    for size, out in zip(input.shape[-2:], output_size):
        i = ops.arange(out, device=input.device)
        first = ops.floor_divide(i * size, out)
        last = ops.floor_divide((i + 1) * size + out - 1, out)
        matrices.append(_window_matrix(input.device, input.dtype, size, first, last, last - first))
    return matrices


@decomposition("adaptive_avg_pool2d")
def adaptive_avg_pool2d(ks, input, output_size):
    return _pool_rows_columns(input, *_adaptive_matrices(input, output_size))


@decomposition("adaptive_avg_pool2d_backward")
def adaptive_avg_pool2d_backward(ks, grad, input):
    rows, columns = _adaptive_matrices(input, grad.shape[-2:])
    return _pool_rows_columns(grad, ops.matrix_transpose(rows), ops.matrix_transpose(columns))


@decomposition("max_pool2d")
def max_pool2d(ks, input, kernel_size, stride, padding, dilation, ceil_mode):
    return _call(
        "max_pool2d_with_indices", input, kernel_size, stride, padding, dilation, ceil_mode
    )[0]


@decomposition("min_pool2d")
def min_pool2d(ks, input, kernel_size, stride, padding, dilation, ceil_mode):
    window = (kernel_size, stride, padding, dilation, ceil_mode)
    return ops.negative(_call("max_pool2d", ops.negative(input), *window))


@decomposition("min_pool2d_with_indices")
def min_pool2d_with_indices(ks, input, kernel_size, stride, padding, dilation, ceil_mode):
    """The maxima of -input: the same first index among ties."""
    window = (kernel_size, stride, padding, dilation, ceil_mode)
    values, indices = _call("max_pool2d_with_indices", ops.negative(input), *window)
    return ops.negative(values), indices


def _planes(x: Tensor) -> Tensor:
    """x (N, C, H, W) or (C, H, W) as (planes, H * W)."""
    return ops.reshape(x, (-1, x.shape[-2] * x.shape[-1]))


@decomposition("pool2d_gather")
def pool2d_gather(ks, x, indices):
    index = _planes(indices)
    if index.size and (
        ops.min(index).item() < 0 or ops.max(index).item() >= x.shape[-2] * x.shape[-1]
    ):
        raise ValueError(f"pool2d_gather: indices out of range for input shape {x.shape}")
    rows = ops.expand_dims(ops.arange(index.shape[0], device=x.device), axis=1)
    return ops.reshape(_call("getitem", _planes(x), (rows, index)), indices.shape)


@decomposition("pool2d_scatter")
def pool2d_scatter(ks, grad, indices, input_shape):
    h, w = input_shape[-2:]
    index = _planes(indices)
    if index.size and (ops.min(index).item() < 0 or ops.max(index).item() >= h * w):
        raise ValueError(
            f"pool2d_scatter: indices must be in [0, {h * w}) for input shape {input_shape}"
        )
    zeros = ops.full((index.shape[0], h * w), 0, dtype=grad.dtype, device=grad.device)
    rows = ops.expand_dims(ops.arange(index.shape[0], device=grad.device), axis=1)
    return ops.reshape(_call("index_add", zeros, (rows, index), _planes(grad)), input_shape)


def _channel_window(x: Tensor, size: int, transposed: bool) -> Tensor:
    """Sums over each channel's window [c - size // 2, c + (size - 1) // 2] (its
    transpose with ``transposed``), as a product with a band matrix over channels."""
    c = x.shape[1]
    channel = ops.arange(c, device=x.device)
    offset = ops.expand_dims(channel, axis=0) - ops.expand_dims(channel, axis=1)  # other - own
    before, after = size // 2, (size - 1) // 2
    if transposed:
        before, after = after, before
    band = ops.astype(ops.logical_and(offset >= -before, offset <= after), x.dtype)
    moved = ops.moveaxis(x, 1, -1)
    return ops.moveaxis(ops.matmul(moved, ops.matrix_transpose(band)), -1, 1)


@decomposition("native_local_response_norm")
def native_local_response_norm(ks, input, size, alpha, beta, k):
    scale = k + alpha / size * _channel_window(input * input, size, False)
    return input * scale ** (-beta), scale


@decomposition("local_response_norm_backward")
def local_response_norm_backward(ks, grad, input, result, scale, size, alpha, beta, k):
    coefficient = 2.0 * alpha * beta / size
    spread = _channel_window(grad * result / scale, size, True)
    return grad * scale ** (-beta) - coefficient * input * spread


def _per_channel(v: Tensor, x: Tensor) -> Tensor:
    """A (C,) tensor shaped to broadcast against x (N, C, ...)."""
    return ops.reshape(v, (1, x.shape[1]) + (1,) * (x.ndim - 2))


def _channel_axes(x: Tensor) -> tuple:
    return (0, *range(2, x.ndim))


@decomposition("native_batch_norm")
def native_batch_norm(
    ks, input, weight, bias, running_mean, running_var, training, momentum, eps, relu
):
    """The statistics in the input's dtype, two passes (the kernel's in float64); the
    running statistics updated in place, as by the kernel."""
    x, c = input, input.shape[1]
    axes = _channel_axes(x)
    count = x.size // c if c else 0
    if training and not count:  # an empty batch: the statistics untouched
        zeros = ops.full((c,), 0, dtype=x.dtype, device=x.device)
        return ops.full(x.shape, 0, dtype=x.dtype, device=x.device), zeros, zeros + 1
    if training:
        mean = ops.mean(x, axis=axes)
        var = ops.mean(ops.square(x - _per_channel(mean, x)), axis=axes)
        for stat, batch in ((running_mean, mean), (running_var, var * (count / max(count - 1, 1)))):
            if stat is not None:
                _call("setitem", stat, Ellipsis, stat * (1.0 - momentum) + batch * momentum)
    else:
        mean, var = running_mean, running_var
    invstd = ops.divide(1, ops.sqrt(var + eps))
    out = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
    if weight is not None:
        out = out * _per_channel(weight, x)
    if bias is not None:
        out = out + _per_channel(bias, x)
    out = _call("relu", out) if relu else out
    return out, ops.astype(mean, x.dtype), ops.astype(invstd, x.dtype)


@decomposition("native_batch_norm_backward")
def native_batch_norm_backward(ks, grad, input, weight, mean, invstd, training, result):
    """The kernel's formula: gx = g a + (x - mean) b + c, with g gated by the fused
    relu's result where one is given."""
    x, c = input, input.shape[1]
    g = grad if result is None else _call("relu_backward", grad, result)
    if not (x.size // c if c else 0):
        zeros = ops.full((c,), 0, dtype=x.dtype, device=x.device)
        return ops.full(x.shape, 0, dtype=x.dtype, device=x.device), zeros, zeros
    axes = _channel_axes(x)
    centered = x - _per_channel(mean, x)
    gb = ops.sum(g, axis=axes)
    sgx = ops.sum(g * centered, axis=axes)
    a = invstd if weight is None else weight * invstd
    gx = g * _per_channel(a, x)
    if training:
        count = x.size // c
        b = -a * invstd * invstd * sgx / count
        gx = gx + centered * _per_channel(b, x) - _per_channel(a * gb / count, x)
    return gx, sgx * invstd, gb


def _moments(x: Tensor, axes: tuple, eps: float) -> tuple[Tensor, Tensor]:
    """The mean and 1 / sqrt(biased variance + eps) over ``axes`` (kept as 1s), two
    passes in x's dtype (the kernels: one of float64 sums); empty slices have mean 0
    and NaN, as PyTorch's layer and group norm give."""
    kept = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    if not math.prod(x.shape[d] for d in axes):
        nan = ops.full(kept, math.nan, dtype=x.dtype, device=x.device)
        return ops.full(kept, 0, dtype=x.dtype, device=x.device), nan
    mean = ops.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    variance = ops.mean(centered * centered, axis=axes, keepdims=True)
    return mean, ops.divide(1, ops.sqrt(variance + eps))


def _normalized_gradient(g: Tensor, xhat: Tensor, rstd: Tensor, axes: tuple) -> Tensor:
    """The gradient of xhat = (x - mean(x)) * rstd(x) with respect to x, given g with
    respect to xhat: rstd * (g - mean(g) - xhat * mean(g * xhat)) over ``axes``."""
    if not g.size:
        return g
    mean_g = ops.mean(g, axis=axes, keepdims=True)
    return rstd * (g - mean_g - xhat * ops.mean(g * xhat, axis=axes, keepdims=True))


def _trailing(x: Tensor, count: int) -> tuple:
    return tuple(range(x.ndim - count, x.ndim))


@decomposition("native_lstm_cell")
def native_lstm_cell(ks, gates, c):
    i, f, g, o = ops.unstack(gates)
    activations = (_call("sigmoid", i), _call("sigmoid", f), ops.tanh(g), _call("sigmoid", o))
    i, f, g, o = activations
    c_next = f * c + i * g
    return o * ops.tanh(c_next), c_next, ops.stack(activations)


@decomposition("native_lstm_cell_backward")
def native_lstm_cell_backward(ks, grad_h, grad_c, c, c_next, activations):
    i, f, g, o = ops.unstack(activations)
    t = ops.tanh(c_next)
    zero = ops.zeros_like(c)
    grad_h = zero if grad_h is None else grad_h
    grad_c_next = grad_h * o * (1 - t * t) + (zero if grad_c is None else grad_c)
    grads = (
        grad_c_next * g * i * (1 - i),
        grad_c_next * c * f * (1 - f),
        grad_c_next * i * (1 - g * g),
        grad_h * t * o * (1 - o),
    )
    return ops.stack(grads), grad_c_next * f


@decomposition("native_lstm_sequence")
def native_lstm_sequence(ks, projections, h0, c0, weight_hh):
    """Step after step, each the cell's decomposition (its activations are then
    differentiable too: the create_graph form of the sequence's gradient reads them)."""
    h, c, steps = h0, c0, []
    for xw_t in ops.unstack(projections, axis=1):
        gates = ops.reshape(xw_t + ops.matmul(weight_hh, h), (4, *c.shape))
        h, c, activations = native_lstm_cell(ks, gates, c)
        steps.append((h, c, activations))
    if not steps:
        size, n = h0.shape
        shapes = ((size, 0, n), (0, size, n), (0, 4, size, n))
        output, cs, activations = (ops.zeros(s, dtype=h0.dtype, device=h0.device) for s in shapes)
        return output, h0, c0, cs, activations
    hs, cs, activations = zip(*steps)
    return ops.stack(hs, axis=1), h, c, ops.stack(cs), ops.stack(activations)


@decomposition("native_lstm_sequence_backward")
def native_lstm_sequence_backward(
    ks, grad_output, grad_h_n, grad_c_n, h0, c0, weight_hh, output, cs, activations
):
    size, length, n = output.shape
    zero = ops.zeros_like(h0)
    grad_h = zero if grad_h_n is None else grad_h_n
    grad_c = zero if grad_c_n is None else grad_c_n
    hs, c_all, acts = ops.unstack(output, axis=1), ops.unstack(cs), ops.unstack(activations)
    grad_steps = ops.unstack(grad_output, axis=1) if grad_output is not None else None
    grads = []
    for t in reversed(range(length)):
        if grad_steps is not None:
            grad_h = grad_h + grad_steps[t]
        c_prev = c_all[t - 1] if t else c0
        grad_gates, grad_c = native_lstm_cell_backward(
            ks, grad_h, grad_c, c_prev, c_all[t], acts[t]
        )
        grad_gates = ops.reshape(grad_gates, (4 * size, n))
        grads.append(grad_gates)
        grad_h = ops.matmul(ops.matrix_transpose(weight_hh), grad_gates)
    if not grads:
        shape = (4 * size, 0, n)
        return (
            ops.zeros(shape, dtype=h0.dtype, device=h0.device),
            grad_h,
            grad_c,
            ops.zeros_like(weight_hh),
        )
    grad_xw = ops.stack(grads[::-1], axis=1)
    h_prev = ops.stack([h0, *hs[:-1]], axis=1)
    columns = length * n
    grad_w = ops.matmul(
        ops.reshape(grad_xw, (4 * size, columns)),
        ops.matrix_transpose(ops.reshape(h_prev, (size, columns))),
    )
    return grad_xw, grad_h, grad_c, grad_w


@decomposition("native_gru_sequence")
def native_gru_sequence(ks, projections, h0, weight_hh, bias_hh):
    """Step after step, as GRUCell's gates (the activations are then differentiable
    too: the create_graph form of the sequence's gradient reads them)."""
    h, steps = h0, []
    for xw_t in ops.unstack(projections, axis=1):
        hw = ops.matmul(weight_hh, h)
        if bias_hh is not None:
            hw = hw + ops.expand_dims(bias_hh, axis=-1)
        x_r, x_z, x_n = ops.unstack(ops.reshape(xw_t, (3, *h0.shape)))
        h_r, h_z, h_n = ops.unstack(ops.reshape(hw, (3, *h0.shape)))
        r, z = _call("sigmoid", x_r + h_r), _call("sigmoid", x_z + h_z)
        n = ops.tanh(x_n + r * h_n)
        h = n + z * (h - n)
        steps.append((h, ops.stack([r, z, n, h_n])))
    if not steps:
        size, n = h0.shape
        shapes = ((size, 0, n), (0, 4, size, n))
        output, activations = (ops.zeros(s, dtype=h0.dtype, device=h0.device) for s in shapes)
        return output, h0, activations
    hs, activations = zip(*steps)
    return ops.stack(hs, axis=1), h, ops.stack(activations)


@decomposition("native_gru_sequence_backward")
def native_gru_sequence_backward(ks, grad_output, grad_h_n, h0, weight_hh, output, activations):
    size, length, n = output.shape
    grad_h = ops.zeros_like(h0) if grad_h_n is None else grad_h_n
    hs, acts = ops.unstack(output, axis=1), ops.unstack(activations)
    grad_steps = ops.unstack(grad_output, axis=1) if grad_output is not None else None
    grads_x, grads_hw = [], []
    for t in reversed(range(length)):
        if grad_steps is not None:
            grad_h = grad_h + grad_steps[t]
        r, z, n_t, h_n = ops.unstack(acts[t])
        h_prev = hs[t - 1] if t else h0
        grad_n = grad_h * (1 - z) * (1 - n_t * n_t)
        grad_z = grad_h * (h_prev - n_t) * z * (1 - z)
        grad_r = grad_n * h_n * r * (1 - r)
        grad_hw = ops.concat([grad_r, grad_z, grad_n * r])
        grads_x.append(ops.concat([grad_r, grad_z, grad_n]))
        grads_hw.append(grad_hw)
        grad_h = ops.matmul(ops.matrix_transpose(weight_hh), grad_hw) + grad_h * z
    if not grads_x:
        grad_xw = ops.zeros((3 * size, 0, n), dtype=h0.dtype, device=h0.device)
        grad_b = ops.zeros((3 * size,), dtype=h0.dtype, device=h0.device)
        return grad_xw, grad_h, ops.zeros_like(weight_hh), grad_b
    grad_xw, grad_hw = ops.stack(grads_x[::-1], axis=1), ops.stack(grads_hw[::-1], axis=1)
    h_prev = ops.stack([h0, *hs[:-1]], axis=1)
    columns = length * n
    grad_hw = ops.reshape(grad_hw, (3 * size, columns))
    grad_w = ops.matmul(grad_hw, ops.matrix_transpose(ops.reshape(h_prev, (size, columns))))
    return grad_xw, grad_h, grad_w, ops.sum(grad_hw, axis=1)


@decomposition("native_layer_norm")
def native_layer_norm(ks, input, normalized_shape, weight, bias, eps):
    mean, rstd = _moments(input, _trailing(input, len(normalized_shape)), eps)
    out = (input - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


@decomposition("native_layer_norm_backward")
def native_layer_norm_backward(ks, grad, input, normalized_shape, mean, rstd, weight):
    axes = _trailing(input, len(normalized_shape))
    leading = tuple(range(input.ndim - len(axes)))
    xhat = (input - mean) * rstd
    scaled = grad if weight is None else grad * weight
    gx = _normalized_gradient(scaled, xhat, rstd, axes)
    return gx, ops.sum(grad * xhat, axis=leading), ops.sum(grad, axis=leading)


def _grouped(x: Tensor, num_groups: int) -> Tensor:
    """x (N, C, ...) as (N, num_groups, the rest)."""
    n, c = x.shape[:2]
    return ops.reshape(x, (n, num_groups, c // num_groups * math.prod(x.shape[2:])))


@decomposition("native_group_norm")
def native_group_norm(ks, input, weight, bias, num_groups, eps):
    groups = _grouped(input, num_groups)
    mean, rstd = _moments(groups, (2,), eps)
    out = ops.reshape((groups - mean) * rstd, input.shape)
    if weight is not None:
        out = out * _per_channel(weight, input)
    if bias is not None:
        out = out + _per_channel(bias, input)
    stats = input.shape[:1] + (num_groups,)
    return out, ops.reshape(mean, stats), ops.reshape(rstd, stats)


@decomposition("native_group_norm_backward")
def native_group_norm_backward(ks, grad, input, mean, rstd, weight, num_groups):
    stats = input.shape[:1] + (num_groups, 1)
    rstd = ops.reshape(rstd, stats)
    xhat = (_grouped(input, num_groups) - ops.reshape(mean, stats)) * rstd
    scaled = grad if weight is None else grad * _per_channel(weight, input)
    gx = _normalized_gradient(_grouped(scaled, num_groups), xhat, rstd, (2,))
    axes = _channel_axes(input)
    xhat = ops.reshape(xhat, input.shape)
    return ops.reshape(gx, input.shape), ops.sum(grad * xhat, axis=axes), ops.sum(grad, axis=axes)


def _embedding_rows(indices: Tensor, rows: int) -> Tensor:
    """The indices flat; an IndexError (as the kernels') for one outside [0, rows)."""
    flat = ops.reshape(indices, (-1,))
    if flat.size and (ops.min(flat).item() < 0 or ops.max(flat).item() >= rows):
        outside = flat[ops.logical_or(flat < 0, flat >= rows)]
        raise IndexError(
            f"embedding: index {outside[0].item()} is out of range for {rows} embeddings"
        )
    return flat


@decomposition("embedding")
def embedding(ks, weight, indices, padding_idx):
    rows = _call("getitem", weight, _embedding_rows(indices, weight.shape[0]))
    return ops.reshape(rows, (*indices.shape, weight.shape[1]))


@decomposition("embedding_dense_backward")
def embedding_dense_backward(ks, grad, indices, num_weights, padding_idx):
    flat = _embedding_rows(indices, num_weights)
    dim = grad.shape[-1]
    zeros = ops.full((num_weights, dim), 0, dtype=grad.dtype, device=grad.device)
    out = _call("index_add", zeros, (flat,), ops.reshape(grad, (flat.size, dim)))
    if padding_idx is None:
        return out
    kept = ops.arange(num_weights, device=grad.device) != padding_idx
    return ops.where(ops.expand_dims(kept, axis=1), out, 0.0)


def attention_weights(
    query: Tensor, key: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float
) -> Tensor:
    """softmax(query @ key^T * scale + mask) over the keys, in dispatched operators
    (any broadcasting of the leading axes that matmul allows): the weights of
    scaled_dot_product_attention, its masks checked."""
    fn = "scaled_dot_product_attention"
    lead = meta.broadcast_shapes(fn, query.shape[:-2], key.shape[:-2])
    meta.attention_mask(attn_mask, (*lead, query.shape[-2], key.shape[-2]), is_causal, query)
    # scaling the queries costs L x E multiplications, the scores L x S
    scores = ops.matmul(query * scale, ops.matrix_transpose(key))
    if is_causal:
        ones = ops.ones(scores.shape[-2:], dtype=D.bool_, device=query.device)
        attn_mask = ops.tril(ones)
    if attn_mask is not None and attn_mask.dtype == D.bool_:
        scores = ops.where(attn_mask, scores, -math.inf)
    elif attn_mask is not None:
        scores = scores + attn_mask
    weights = _call("softmax", scores, -1)
    if attn_mask is None or is_causal or not scores.shape[-1]:  # every row keeps a key
        return weights  # (or has none: no weights to zero)
    # a row whose every key is masked: zeros, not NaN (PyTorch's safe softmax)
    masked = ops.max(scores, axis=-1, keepdims=True) == -math.inf
    return ops.where(masked, 0.0, weights)


@decomposition("native_scaled_dot_product_attention")
def native_scaled_dot_product_attention(
    ks, query, key, value, attn_mask, is_causal, scale, need_weights
):
    weights = attention_weights(query, key, attn_mask, is_causal, scale)
    out = ops.matmul(weights, value)
    if not need_weights:
        weights = ops.full((0,), 0, dtype=query.dtype, device=query.device)
    return out, weights


@decomposition("native_scaled_dot_product_attention_backward")
def native_scaled_dot_product_attention_backward(ks, grad, query, key, value, weights, scale):
    """dV = P^T dO, dScores = softmax's backward of dO V^T times scale, dQ = dScores K,
    dK = dScores^T Q, from the weights P."""
    t = ops.matrix_transpose
    scores = _call("softmax_backward", ops.matmul(grad, t(value)), weights, -1) * scale
    return ops.matmul(scores, key), ops.matmul(t(scores), query), ops.matmul(t(weights), grad)


# ---------------------------------------------------------------- convolution gradients


@decomposition("conv2d_backward_weight")
def conv2d_backward_weight(
    ks, grad, input, weight_shape, stride, padding, dilation, groups, bias_grad
):
    """(grad_weight, grad_bias) as one convolution per group: the input's channels as
    the batch, grad's channels as the filters, stride and dilation swapped."""
    x = input if input.ndim == 4 else ops.expand_dims(input, axis=0)
    g = grad if grad.ndim == 4 else ops.expand_dims(grad, axis=0)
    c_out, c_in, kh, kw = weight_shape
    grad_bias = (
        ops.sum(g, axis=(0, 2, 3))
        if bias_grad
        else ops.full((0,), 0, dtype=g.dtype, device=g.device)
    )
    if not c_in or not x.shape[0]:
        return ops.full(weight_shape, 0, dtype=x.dtype, device=x.device), grad_bias
    per_in, per_out = x.shape[1] // groups, c_out // groups
    parts = []
    for i in range(groups):
        xs = ops.permute_dims(x[:, i * per_in : (i + 1) * per_in], (1, 0, 2, 3))
        gs = ops.permute_dims(g[:, i * per_out : (i + 1) * per_out], (1, 0, 2, 3))
        # (per_in, per_out, >= kh, >= kw): the windows beyond the kernel are dropped
        w = _call("conv2d", xs, gs, None, dilation, padding, stride, 1)
        parts.append(ops.permute_dims(w[:, :, :kh, :kw], (1, 0, 2, 3)))
    return _call("concat", parts, 0), grad_bias


def _resample_matrix(table: Tensor, weights: Tensor | None, size: int, like: Tensor) -> Tensor:
    """(len(table), size): each output position's weight on each input position."""
    positions = ops.arange(size, device=like.device)
    hits = ops.astype(ops.expand_dims(table, axis=-1) == positions, like.dtype)  # (o, taps, n)
    if weights is None:
        return hits[:, 0]
    return ops.sum(hits * ops.expand_dims(weights, axis=-1), axis=1)


@decomposition("resample2d")
def resample2d(ks, input, rows, cols, row_weights, col_weights):
    h, w = input.shape[-2:]
    mh = _resample_matrix(rows, row_weights, h, input)
    mw = _resample_matrix(cols, col_weights, w, input)
    return _pool_rows_columns(input, mh, mw)


@decomposition("resample2d_backward")
def resample2d_backward(ks, grad, rows, cols, row_weights, col_weights, input):
    h, w = input.shape[-2:]
    mh = _resample_matrix(rows, row_weights, h, grad)
    mw = _resample_matrix(cols, col_weights, w, grad)
    return _pool_rows_columns(grad, ops.matrix_transpose(mh), ops.matrix_transpose(mw))


@decomposition("conv2d_backward_input")
def conv2d_backward_input(ks, grad, weight, input, stride, padding, dilation, groups):
    """A convolution of grad, spread out by the stride, with the flipped, transposed
    weight; cropped to the input's size."""
    g = grad if grad.ndim == 4 else ops.expand_dims(grad, axis=0)
    n, c_out, oh, ow = g.shape
    h, w = input.shape[-2:]
    c_in = input.shape[-3]
    (sh, sw), (top, _, left, _), (dh, dw) = stride, padding, dilation
    kh, kw = weight.shape[-2:]
    spread = ops.full(
        (n, c_out, (oh - 1) * sh + 1, (ow - 1) * sw + 1), 0, dtype=g.dtype, device=g.device
    )
    _call("setitem", spread, (Ellipsis, slice(None, None, sh), slice(None, None, sw)), g)
    # full correlation: pad by the kernel's span, and enough at the end to reach the input
    span_h, span_w = dh * (kh - 1), dw * (kw - 1)
    bottom = max(0, top + h - spread.shape[2])
    right = max(0, left + w - spread.shape[3])
    per_out = c_out // groups
    flipped = ops.flip(weight, axis=(2, 3))  # (c_out, c_in / groups, kh, kw)
    grouped = ops.reshape(flipped, (groups, per_out, c_in // groups, kh, kw))
    transposed = ops.reshape(ops.permute_dims(grouped, (0, 2, 1, 3, 4)), (c_in, per_out, kh, kw))
    pads = (span_h, bottom, span_w, right)
    full = _call("conv2d", spread, transposed, None, (1, 1), pads, dilation, groups)
    out = full[:, :, top : top + h, left : left + w]
    return out if input.ndim == 4 else out[0]


# Derived once every decomposition above is registered (Note [Core operators])
CORE = frozenset(core_operators())
