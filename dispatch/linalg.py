"""Every public function of ``lamina.linalg`` (the Array API's linear algebra
extension): the bindings of the schema's ``namespace="linalg"`` operators, the
composite functions below, and the four functions it shares with the top level
(matmul, matrix_transpose, tensordot, vecdot).

The composites are compositions of operators, so they run on every device and are
differentiable through the operators they call (matrix_norm through svdvals and the
reductions, pinv through svd, ...).
"""

from __future__ import annotations

import math
from typing import Any

from . import arguments as A
from . import bindings
from . import composites as C
from . import dtypes as D
from . import operators as _operators  # noqa: F401  (defines every operator)
from .arguments import LinAlgError
from .schema import OPERATORS
from .tensor import Tensor

__all__ = [
    "LinAlgError",
    "cross",
    "matmul",
    "matrix_norm",
    "matrix_power",
    "matrix_rank",
    "matrix_transpose",
    "outer",
    "pinv",
    "tensordot",
    "trace",
    "vecdot",
]

bindings.install(globals(), "linalg")
__all__ += [op.name for op in bindings.public_operators("linalg")]
__all__.sort()

_top: dict[str, Any] = {}
bindings.install(_top)  # the top-level bindings the composites call
matmul = _top["matmul"]
matrix_transpose = _top["matrix_transpose"]
tensordot = _top["tensordot"]
vecdot = _top["vecdot"]


def _op(name: str) -> Any:
    return OPERATORS[name]


def _float_matrices(fn: str, x: Any) -> Tensor:
    A.tensor(x, fn, "x")
    if x.ndim < 2:
        raise ValueError(f"linalg.{fn}: needs at least 2 dimensions, got shape {x.shape}")
    return x if x.dtype.kind in "fc" else _op("astype")(x, D.default_float, True)


def _mH(x: Tensor) -> Tensor:
    """The conjugate transpose of each matrix (the transpose of a real one)."""
    t = matrix_transpose(x)
    return _op("conj")(t) if x.dtype.kind == "c" else t


def outer(x1: Tensor, x2: Tensor, /) -> Tensor:
    """The outer product of two vectors: result[i, j] = x1[i] * x2[j]."""
    for name, v in (("x1", x1), ("x2", x2)):
        A.tensor(v, "outer", name)
        if v.ndim != 1:
            raise ValueError(f"linalg.outer: {name} must be 1-D, got shape {v.shape}")
    return _op("multiply")(_op("expand_dims")(x1, 1), _op("expand_dims")(x2, 0))


def cross(x1: Tensor, x2: Tensor, /, *, axis: int = -1) -> Tensor:
    """The cross product of 3-element vectors along axis (negative: it counts from
    the end of both shapes, which broadcast on the other axes)."""
    A.tensor(x1, "cross", "x1")
    A.tensor(x2, "cross", "x2")
    axis = A.integer(axis, "cross", "axis")
    if axis >= 0:
        raise ValueError(f"linalg.cross: axis must be negative, got {axis}")
    if axis < -min(x1.ndim, x2.ndim):
        raise A.AxisError(
            f"linalg.cross: axis {axis} is out of bounds for shapes {x1.shape} and {x2.shape}"
        )
    if x1.shape[axis] != 3 or x2.shape[axis] != 3:
        raise ValueError(
            f"linalg.cross: axis {axis} must have size 3 in both, got shapes {x1.shape} "
            f"and {x2.shape}"
        )

    def part(v: Tensor, i: int) -> Tensor:
        return v[(Ellipsis, i) + (slice(None),) * (-axis - 1)]

    a, b = [part(x1, i) for i in range(3)], [part(x2, i) for i in range(3)]
    mul, sub = _op("multiply"), _op("subtract")
    pieces = [
        sub(mul(a[1], b[2]), mul(a[2], b[1])),
        sub(mul(a[2], b[0]), mul(a[0], b[2])),
        sub(mul(a[0], b[1]), mul(a[1], b[0])),
    ]
    return _op("stack")(pieces, axis % (pieces[0].ndim + 1))


def trace(x: Tensor, /, *, offset: int = 0, dtype: Any = None) -> Tensor:
    """The sum of the offset-th diagonal of each matrix (dtype as sum's)."""
    diag = diagonal(x, offset=offset)  # noqa: F821  (bound by bindings.install)
    return _top["sum"](diag, axis=-1, dtype=dtype)


def matrix_power(x: Tensor, n: int, /) -> Tensor:
    """x @ x @ ... (n times) by repeated squaring; n = 0 gives the identity, n < 0
    the power of the inverse."""
    A.tensor(x, "matrix_power", "x")
    n = A.integer(n, "matrix_power", "n")
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"linalg.matrix_power: needs square matrices, got shape {x.shape}")
    if n == 0:
        eye = C.eye(x.shape[-1], dtype=x.dtype, device=x.device)
        return _op("copy")(_op("broadcast_to")(eye, x.shape))
    if n < 0:
        x, n = inv(x), -n  # noqa: F821
    result, base = None, x
    while n:
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if n:
            base = matmul(base, base)
    return result


def _tolerance(fn: str, x: Tensor, s: Tensor, rtol: Any) -> Any:
    """rtol * the largest singular value of each matrix, as a tensor broadcasting
    against s (rtol: a float, a tensor broadcasting against the batch, or None for
    max(M, N) * eps)."""
    if rtol is None:
        rtol = max(x.shape[-2:]) * D.finfo(s.dtype).eps
    elif isinstance(rtol, Tensor):
        rtol = _op("expand_dims")(rtol, -1)
    else:
        rtol = A.real(rtol, fn, "rtol")
    return _op("multiply")(_top["max"](s, axis=-1, keepdims=True), rtol)


def matrix_rank(x: Tensor, /, *, rtol: float | Tensor | None = None) -> Tensor:
    """The number of singular values of each matrix above rtol times the largest."""
    x = _float_matrices("matrix_rank", x)
    s = svdvals(x)  # noqa: F821
    if s.shape[-1] == 0:
        return C.zeros(s.shape[:-1], dtype=D.int64, device=x.device)
    return C.count_nonzero(_op("greater")(s, _tolerance("matrix_rank", x, s, rtol)), axis=-1)


def pinv(x: Tensor, /, *, rtol: float | Tensor | None = None) -> Tensor:
    """The Moore-Penrose pseudo-inverse: singular values at most rtol times the
    largest are taken as zero."""
    x = _float_matrices("pinv", x)
    u, s, vh = svd(x, full_matrices=False)  # noqa: F821
    if s.shape[-1] == 0:
        return _op("copy")(_mH(x))
    keep = _op("greater")(s, _tolerance("pinv", x, s, rtol))
    inverted = _op("where")(keep, _op("divide")(1.0, _op("where")(keep, s, 1.0)), 0.0)
    scaled = _op("multiply")(_mH(vh), _op("expand_dims")(inverted, -2))
    return matmul(scaled, _mH(u))


_MATRIX_ORDS = ("fro", "nuc", 1, -1, 2, -2, math.inf, -math.inf)


def matrix_norm(
    x: Tensor, /, *, keepdims: bool = False, ord: int | float | str | None = "fro"
) -> Tensor:
    """The ord-norm of each matrix: 'fro' (default), 'nuc' (sum of singular values),
    1 / -1 (largest / smallest column sum of |x|), inf / -inf (rows), 2 / -2
    (largest / smallest singular value)."""
    x = _float_matrices("matrix_norm", x)
    keepdims = A.boolean(keepdims, "matrix_norm", "keepdims")
    if ord is None:
        ord = "fro"
    if isinstance(ord, bool) or ord not in _MATRIX_ORDS:
        raise ValueError(f"linalg.matrix_norm: ord must be one of {_MATRIX_ORDS}, got {ord!r}")
    axes = (x.ndim - 2, x.ndim - 1)
    if ord == "fro":
        return vector_norm(x, axis=axes, keepdims=keepdims)  # noqa: F821
    if ord in ("nuc", 2, -2):
        s = svdvals(x)  # noqa: F821
        reduce = _top["sum"] if ord == "nuc" else _top["max"] if ord == 2 else _top["min"]
        out = reduce(s, axis=-1)
    else:
        summed_axis = -2 if ord in (1, -1) else -1  # column sums for 1, row sums for inf
        sums = _top["sum"](_op("abs")(x), axis=summed_axis)
        out = (_top["max"] if ord > 0 else _top["min"])(sums, axis=-1)
    if keepdims:
        out = _op("reshape")(out, out.shape + (1, 1), None)
    return out
