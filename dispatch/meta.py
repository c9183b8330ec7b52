"""Argument rules of operators beyond their argument kinds, shared by every backend.

An operator's ``check`` (named in its ``operators.py`` entry) receives the arguments
after their kinds were checked (``arguments.py``) and returns the arguments its kernels
get: shapes resolved (reshape's -1), axes related to each other (tensordot), sizes
checked (squeeze). Kernels of every device can therefore trust them. Also the dtype and
shape arithmetic every backend shares (``lamina.backends.setup`` re-exports it): the
schema's dtype rules with weak Python scalars, broadcasting and reduced shapes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import arguments as A
from . import dtypes as D
from .schema import OPERATORS, Operator

Shape = tuple[int, ...]

# ---------------------------------------------------------------- dtype rules
# Python scalars are *weak* (Array API, NEP 50; Note [Weak scalars] in dtypes.py): they
# take the tensor's dtype when their kind fits (``int8_tensor + 1`` is int8;
# ``float32_tensor + 1j`` complex64; ``int_tensor + 1.5`` is the default float).


def scalar_value(x: Any) -> bool | int | float | complex | None:
    """A Python scalar for ``x`` (NumPy scalars become Python ones), or None."""
    if isinstance(x, D.PY_SCALAR_TYPES):
        return x
    if isinstance(x, np.generic) and x.ndim == 0:
        return x.item()
    return None


weak_kind = D.weak_kind  # the dtype kind of a Python scalar: "b", "i", "f" or "c"


def promote(op: Operator, args: Any) -> D.DType:
    """The computation dtype of an elementwise call -- the tensors' dtypes promoted
    (``dtypes.PROMOTE``), then the weak Python scalars' kinds (``dtypes.promote_weak``)
    -- checked against the operator's ``dtypes`` rule (``check_dtype``). TypeError
    without a tensor."""
    dtype = None
    for a in args:
        d = getattr(a, "_dtype", None)
        if d is not None:
            dtype = d if dtype is None else D.PROMOTE[dtype.index][d.index]
    if dtype is None:  # where(cond, 1, 2.5): no tensor; the scalars' default dtype
        values = [scalar_value(a) for a in args]
        if not values or any(v is None for v in values):
            raise TypeError(
                f"{op.name}: expected at least one tensor operand to take the "
                f"dtype from, got {', '.join(type(a).__name__ for a in args)}"
            )
        dtype = D.bool_  # Array API 2024.12: only scalars give their kind's default
    for a in args:
        v = scalar_value(a)
        if v is not None:
            dtype = D.promote_weak(dtype, v)
    return check_dtype(op, dtype)


# the dtype kinds of each rule of schema.DTYPE_RULES, and how errors name them
_ACCEPTS = {
    "any": "biufc",
    "real": "biuf",
    "numeric": "iufc",
    "real_numeric": "iuf",
    "float": "fc",
    "real_float": "f",
    "complex": "c",
    "int": "iu",
    "intbool": "biu",
    "floating": "f",  # the nn primitives: real floats only, integers refused
}
_DESCRIBE = {
    "real": "real-valued (not complex)",
    "numeric": "numeric",
    "real_numeric": "real-valued numeric",
    "float": "floating-point",
    "real_float": "real-valued floating-point",
    "complex": "complex floating-point",
    "floating": "real floating-point",
    "int": "integer",
    "intbool": "integer or boolean",
}
_TO_FLOAT = ("float", "real_float")  # rules that compute ints and bool in the default float


def check_dtype(op: Operator, dtype: D.DType) -> D.DType:
    """The computation dtype for inputs of ``dtype`` under the operator's ``dtypes``
    rule (schema.DTYPE_RULES): ``dtype`` itself, the default float for integers and
    bool under the float rules, else a TypeError naming the operator."""
    rule = op.dtypes
    if dtype.kind in _ACCEPTS[rule]:
        return dtype
    if rule in _TO_FLOAT and dtype.kind in "biu":
        return D.default_float  # as NumPy: exp(int tensor) is float64
    raise TypeError(f"{op.name} needs {_DESCRIBE[rule]} inputs, got {dtype}")


def result_dtype(op: Operator, dtype: D.DType) -> D.DType:
    """The result dtype for computation dtype ``dtype`` under the operator's ``result``
    rule (schema.RESULT_RULES)."""
    rule = op.result
    if rule == "bool":
        return D.bool_
    if rule == "index":
        return D.int64
    if rule == "sum":
        return _SUM_RESULTS.get(dtype.kind, dtype)
    if rule == "real":
        return D.real_of(dtype)
    if rule == "complex":
        return D.complex_of(dtype)
    return dtype


_SUM_RESULTS = {"b": D.int64, "i": D.int64, "u": D.uint64}


def sum_dtype(op: Operator, x: Any, dtype: D.DType | None) -> D.DType:
    """The accumulation/result dtype of sum and prod (Array API defaults); a complex
    tensor cannot be summed in a real dtype (the imaginary parts would be dropped)."""
    if dtype is not None:
        dtype = check_dtype(op, D.as_dtype(dtype))
        if x._dtype.kind == "c" and dtype.kind != "c":
            raise TypeError(
                f"{op.name}: a {x._dtype} tensor cannot be accumulated in {dtype} "
                "(the imaginary parts would be dropped); take real(x) first"
            )
        return dtype
    return result_dtype(op, check_dtype(op, x._dtype))


def check_cast(name: str, data: np.ndarray, dtype: D.DType) -> None:
    """Floats cast to an integer dtype must fit it: NaN, infinities and values outside
    its range have no integer, and NumPy's cast gives garbage for them (INT64_MIN for
    NaN, with a warning). ValueError naming the first such value; a fit value
    truncates toward zero, as in NumPy and C."""
    if data.dtype.kind != "f" or dtype.kind not in "iu" or not data.size:
        return
    info = np.iinfo(dtype.np)
    below = data.dtype.type(info.min - 1)  # exclusive; where not exact, min is inclusive
    with np.errstate(invalid="ignore"):
        low = data > below if below != info.min else data >= info.min
        bad = ~(low & (data < data.dtype.type(info.max + 1)))  # max + 1: a power of 2
    if bad.any():
        raise ValueError(
            f"{name}: {data[bad].flat[0]} has no value in {dtype.name} (NaN, infinite or "
            f"outside [{info.min}, {info.max}])"
        )


# ---------------------------------------------------------------- shape rules


def broadcast_shapes(name: str, *shapes: Shape) -> Shape:
    """The broadcast shape, or a ValueError that shows every shape."""
    first = shapes[0]
    if all(s == first or not s for s in shapes):  # equal shapes and scalars: common
        return first if first else max(shapes, key=len)
    if len(shapes) == 2:  # one shape the tail of the other: a bias, a row (common too)
        long, short = sorted(shapes, key=len, reverse=True)
        if long[len(long) - len(short) :] == short:
            return long
    ndim = max(len(s) for s in shapes)
    result = []
    for i in range(-ndim, 0):
        sizes = {s[i] for s in shapes if len(s) >= -i} - {1}
        if len(sizes) > 1:
            raise ValueError(
                f"{name}: shapes {' and '.join(map(str, shapes))} cannot be "
                f"broadcast together (dimension {ndim + i} differs)"
            )
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def reduced_shape(shape: Shape, axis: tuple[int, ...], keepdims: bool) -> Shape:
    if keepdims:
        return tuple(1 if i in axis else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axis)


# ---------------------------------------------------------------- operator checks


def reshape(x: Any, shape: Shape, copy: bool | None) -> tuple:
    if shape.count(-1) > 1 or any(s < -1 for s in shape):
        raise ValueError(f"reshape: invalid shape {shape} (at most one -1, no other negatives)")
    known = math.prod([s for s in shape if s != -1])
    size = math.prod(x._shape)
    if -1 in shape:
        if known == 0 or size % known:
            raise ValueError(
                f"reshape: cannot reshape a tensor of shape {x._shape} (size {size}) to {shape}"
            )
        shape = tuple(size // known if s == -1 else s for s in shape)
    elif known != size:
        raise ValueError(
            f"reshape: cannot reshape a tensor of shape {x._shape} "
            f"(size {size}) to {shape} (size {known})"
        )
    return x, shape, copy


def permute_dims(x: Any, axes: Any) -> tuple:

    if not isinstance(axes, (tuple, list)):
        raise TypeError(f"permute_dims: axes must be a tuple of ints, got {axes!r}")
    ndim = len(x._shape)
    axes = tuple(A.axis(a, "permute_dims", "axis", ndim) for a in axes)
    if sorted(axes) != list(range(ndim)):
        raise ValueError(f"permute_dims: axes {axes} are not a permutation of 0..{ndim - 1}")
    return x, axes


def at_least_2d(name: str) -> Any:
    def check(x: Any, *rest: Any) -> tuple:
        if len(x._shape) < 2:
            raise ValueError(f"{name}: needs at least 2 dimensions, got shape {x._shape}")
        return (x, *rest)

    return check


def squeeze(x: Any, axis: tuple[int, ...]) -> tuple:
    for a in axis:
        if x._shape[a] != 1:
            raise ValueError(f"squeeze: axis {a} has size {x._shape[a]}, not 1 (shape {x._shape})")
    return x, axis


def broadcast_to(x: Any, shape: Shape) -> tuple:
    ok = len(shape) >= len(x._shape) and all(
        s == t or s == 1 for s, t in zip(x._shape[::-1], shape[::-1])
    )
    if not ok:
        raise ValueError(f"broadcast_to: cannot broadcast shape {x._shape} to {shape}")
    return x, shape


def split(x: Any, sections: Any, axis: int) -> tuple:

    if isinstance(sections, (list, tuple)):
        sections = [A.integer(v, "split", "split_size_or_sections") for v in sections]
        if any(v < 0 for v in sections):
            raise ValueError(f"split: section sizes must be non-negative, got {sections}")
        if sum(sections) != x._shape[axis]:
            raise ValueError(
                f"split: sections {sections} sum to {sum(sections)}, but "
                f"axis {axis} has size {x._shape[axis]}"
            )
    else:
        if isinstance(sections, bool) or not isinstance(sections, int):
            raise TypeError(
                f"split: split_size_or_sections must be an int or a sequence "
                f"of ints, got {sections!r}"
            )
        if sections <= 0:
            raise ValueError(f"split: split_size must be positive, got {sections}")
    return x, sections, axis


def _check_join_axis(name: str, arrays: list, axis: Any, extra: int) -> int:

    return A.axis(axis, name, "axis", len(arrays[0]._shape) + extra)


def concat(arrays: list, axis: Any) -> tuple:
    if axis is None:  # flatten every tensor first
        reshape_op = OPERATORS["reshape"]
        arrays = [reshape_op(a, (math.prod(a._shape),), None) for a in arrays]
        axis = 0
    if not arrays[0]._shape:
        raise ValueError("concat: zero-dimensional tensors cannot be concatenated")
    axis = _check_join_axis("concat", arrays, axis, 0)
    first = arrays[0]._shape
    for t in arrays:
        if len(t._shape) != len(first) or any(
            s != f for d, (s, f) in enumerate(zip(t._shape, first)) if d != axis
        ):
            raise ValueError(
                f"concat: all tensors must have the same shape except on "
                f"axis {axis}; got {', '.join(str(a._shape) for a in arrays)}"
            )
    return arrays, axis


def stack(arrays: list, axis: Any) -> tuple:
    if any(t._shape != arrays[0]._shape for t in arrays):
        raise ValueError(
            f"stack: all tensors must have the same shape; got "
            f"{', '.join(str(a._shape) for a in arrays)}"
        )
    return arrays, _check_join_axis("stack", arrays, axis, 1)


def matmul(x1: Any, x2: Any) -> tuple:
    """Operands of at least one dimension whose contracted dimensions agree and whose
    batch dimensions broadcast (a 1-D operand is a row, or a column, vector)."""
    a, b = x1._shape, x2._shape
    if not a or not b:
        raise ValueError(f"matmul: operands must be at least 1-D, got shapes {a} and {b}")
    k1, k2 = a[-1], b[-2] if len(b) > 1 else b[0]
    if k1 != k2:
        raise ValueError(
            f"matmul: shapes {a} and {b} do not match (contracted dimensions {k1} != {k2})"
        )
    try:
        if len(a) > 2 or len(b) > 2:  # matrices and vectors have no batch to check
            broadcast_shapes("matmul", a[:-2], b[:-2])
    except ValueError:
        raise ValueError(
            f"matmul: the batch dimensions of shapes {a} and {b} cannot be broadcast together"
        ) from None
    return x1, x2


def tensordot(x1: Any, x2: Any, axes: Any) -> tuple:

    n1, n2 = len(x1._shape), len(x2._shape)
    if isinstance(axes, (list, tuple)):
        if len(axes) != 2:
            raise ValueError(
                f"tensordot: axes must be an int or a pair of axis sequences, got {axes!r}"
            )
        a, b = (tuple(ax) if isinstance(ax, (list, tuple)) else (ax,) for ax in axes)
        a = tuple(A.axis(i, "tensordot", "axis", n1) for i in a)
        b = tuple(A.axis(i, "tensordot", "axis", n2) for i in b)
    else:
        n = A.integer(axes, "tensordot", "axes")
        if n < 0 or n > min(n1, n2):
            raise ValueError(
                f"tensordot: axes={n} is out of range for shapes {x1._shape} and {x2._shape}"
            )
        a, b = tuple(range(n1 - n, n1)), tuple(range(n))
    if len(a) != len(b) or any(x1._shape[i] != x2._shape[j] for i, j in zip(a, b)):
        raise ValueError(
            f"tensordot: contracted axes {a} of {x1._shape} and {b} of {x2._shape} do not match"
        )
    return x1, x2, (a, b)


def vecdot(x1: Any, x2: Any, axis: Any) -> tuple:
    """The contracted axis, as a negative index into the broadcast shape."""

    shape = broadcast_shapes("vecdot", x1._shape, x2._shape)
    a = A.axis(axis, "vecdot", "axis", len(shape)) - len(shape)
    n1 = x1._shape[a] if a >= -len(x1._shape) else 1
    n2 = x2._shape[a] if a >= -len(x2._shape) else 1
    if n1 != n2:
        raise ValueError(
            f"vecdot: the contracted axis has size {n1} in {x1._shape} but {n2} in {x2._shape}"
        )
    return x1, x2, a


def cumulative(name: str) -> Any:
    """The check of a scan (cumulative_sum, cumulative_prod): axis may be omitted only
    for a 1-D tensor (Array API); a 0-d tensor has nothing to scan."""

    def check(x: Any, axis: Any, dtype: Any, include_initial: bool) -> tuple:
        ndim = len(x._shape)
        if ndim == 0:
            raise ValueError(f"{name}: needs at least 1 dimension, got a 0-d tensor")
        if axis is None:
            if ndim > 1:
                raise ValueError(f"{name}: axis is required for a {ndim}-D tensor")
            axis = 0
        return x, A.axis(axis, name, "axis", ndim), dtype, include_initial

    return check


def at_least_1d(name: str) -> Any:
    def check(x: Any) -> tuple:
        if not x._shape:
            raise ValueError(f"{name}: needs at least 1 dimension, got a 0-d tensor")
        return (x,)

    return check


def searchsorted(x1: Any, x2: Any, side: Any, sorter: Any) -> tuple:
    if len(x1._shape) != 1:
        raise ValueError(f"searchsorted: x1 must be 1-D, got shape {x1._shape}")
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    if sorter is not None and (sorter._shape != x1._shape or sorter._dtype.kind not in "iu"):
        raise ValueError(
            f"searchsorted: sorter must be an integer tensor of x1's shape {x1._shape}, "
            f"got {sorter._dtype} of shape {sorter._shape}"
        )
    return x1, x2, side, sorter


# ---------------------------------------------------------------- linear algebra


def square(name: str) -> Any:
    """Stacks of square matrices: at least 2-D, the last two axes of one size."""

    def check(x: Any, *rest: Any) -> tuple:
        if len(x._shape) < 2 or x._shape[-1] != x._shape[-2]:
            raise ValueError(f"{name}: needs a (stack of) square matrices, got shape {x._shape}")
        return (x, *rest)

    return check


def solve(x1: Any, x2: Any) -> tuple:
    """x1 square; x2 a vector of x1's size (shape (M,), the Array API's one vector
    case) or a stack of (M, K) matrices whose batch broadcasts with x1's."""
    (x1,) = square("solve")(x1)
    m = x1._shape[-1]
    if len(x2._shape) == 1:
        ok = x2._shape[0] == m
    else:
        ok = len(x2._shape) >= 2 and x2._shape[-2] == m
        if ok:
            broadcast_shapes("solve", x1._shape[:-2], x2._shape[:-2])
    if not ok:
        raise ValueError(
            f"solve: x2 of shape {x2._shape} does not match x1 of shape {x1._shape} "
            f"(x2 must be (M,) or (..., M, K) with M = {m})"
        )
    return x1, x2


def qr(x: Any, mode: Any) -> tuple:
    (x,) = at_least_2d("qr")(x)
    if mode not in ("reduced", "complete"):
        raise ValueError(f"qr: mode must be 'reduced' or 'complete', got {mode!r}")
    return x, mode


def vector_norm(x: Any, axis: tuple[int, ...], keepdims: bool, ord: Any) -> tuple:
    if isinstance(ord, bool) or not isinstance(ord, (int, float)):
        raise TypeError(f"vector_norm: ord must be a number (or inf), got {ord!r}")
    return x, axis, keepdims, float(ord)


# ---------------------------------------------------------------- Fourier transforms
# Note [FFT arguments]: the checks of lamina.fft's operators give kernels resolved
# arguments, so every backend computes the same transform: one-dimensional ones get n
# (a positive int: the input's length along axis, or 2 * (M - 1) for the transforms of
# Hermitian input, irfft and hfft) and a non-negative axis; n-dimensional ones get s
# and axes as tuples of one length (every axis when both are None; s[i] == -1 and s
# None are the input's sizes, the last one 2 * (M - 1) for irfftn). norm is checked.

_NORMS = ("backward", "ortho", "forward")
_HERMITIAN_INPUT = ("irfft", "hfft", "irfftn")  # n counts the output: 2 * (M - 1) by default


def _fft_norm(name: str, norm: Any) -> str:
    if norm not in _NORMS:
        raise ValueError(f"fft.{name}: norm must be one of {', '.join(_NORMS)}, got {norm!r}")
    return norm


def _fft_size(name: str, what: str, n: Any, m: int, hermitian: bool) -> int:
    if n is None or n == -1:
        n = 2 * (m - 1) if hermitian else m
        if n < 1:
            raise ValueError(
                f"fft.{name}: the input's length {m} along the transformed axis gives "
                f"{what} = {n}; pass a positive {what}"
            )
        return n
    n = A.integer(n, name, what)
    if n < 1:
        raise ValueError(f"fft.{name}: {what} must be a positive integer, got {n}")
    return n


def fft1(name: str) -> Any:
    """The check of a one-dimensional transform (fft, ifft, rfft, irfft, hfft, ihfft)."""
    hermitian = name in _HERMITIAN_INPUT

    def check(x: Any, n: Any, axis: int, norm: Any) -> tuple:
        axis = A.axis(axis, name, "axis", len(x._shape))
        n = _fft_size(name, "n", n, x._shape[axis], hermitian)
        return x, n, axis, _fft_norm(name, norm)

    return check


def fftn(name: str) -> Any:
    """The check of an n-dimensional transform (fftn, ifftn, rfftn, irfftn)."""
    hermitian = name in _HERMITIAN_INPUT

    def check(x: Any, s: Any, axes: Any, norm: Any) -> tuple:
        ndim = len(x._shape)
        if axes is None:
            if s is not None:
                raise ValueError(f"fft.{name}: s needs axes (the standard requires both)")
            axes = tuple(range(ndim))
        if not isinstance(axes, (tuple, list)):
            raise TypeError(f"fft.{name}: axes must be a sequence of ints, got {axes!r}")
        axes = tuple(A.axis(a, name, "axes", ndim) for a in axes)
        if len(set(axes)) != len(axes):
            raise ValueError(f"fft.{name}: repeated axis in axes={axes}")
        if name in ("rfftn", "irfftn") and not axes:
            raise ValueError(f"fft.{name}: needs at least one axis to transform")
        if s is None:
            s = (None,) * len(axes)
        if not isinstance(s, (tuple, list)) or len(s) != len(axes):
            raise ValueError(f"fft.{name}: s must be a sequence of one size per axis, got {s!r}")
        last = len(axes) - 1
        sizes = tuple(
            _fft_size(name, "s", n, x._shape[a], hermitian and i == last)
            for i, (n, a) in enumerate(zip(s, axes))
        )
        return x, sizes, axes, _fft_norm(name, norm)

    return check


# ---------------------------------------------------------------- neural-network primitives
# Checks of the nn operators (dispatch/operators.py): every bad input -- a wrong rank,
# channels that do not match, groups that do not divide them, a kernel larger than the
# padded input, a zero stride, integer data -- raises here, before any kernel runs, with
# the argument and the shapes; the kernels get canonical arguments.


def _floating(fn: str, name: str, t: Any) -> None:
    if t._dtype.kind != "f":
        raise TypeError(f"{fn}: {name} must be a real floating-point tensor, got {t._dtype.name}")


def _like_input(fn: str, name: str, t: Any, x: Any, shape: Shape | None = None) -> None:
    """An optional parameter tensor (weight, bias, statistics) of x's dtype and shape."""
    if t is None:
        return
    if t._dtype is not x._dtype:
        raise TypeError(
            f"{fn}: {name} has dtype {t._dtype.name}, but input has dtype {x._dtype.name}"
        )
    if shape is not None and t._shape != shape:
        raise ValueError(f"{fn}: {name} must have shape {shape}, got {t._shape}")


def _image(fn: str, x: Any) -> Shape:
    """(N, C, H, W) of a 4-D input or a 3-D unbatched one (N = 1), as in PyTorch."""
    _floating(fn, "input", x)
    if len(x._shape) == 3:
        return (1, *x._shape)
    if len(x._shape) != 4:
        raise ValueError(
            f"{fn}: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape {x._shape}"
        )
    return x._shape


# Note [Numeric settings]: every integer setting of an nn operator (a stride, a padding,
# a kernel size, groups, ...) reaches the kernels as a 64-bit integer, and the sizes
# computed from it must fit too: a larger one is an OverflowError naming the argument
# here, not one from Numba or NumPy without it. Real settings (eps, momentum, slopes)
# must be finite numbers.
INT64_MAX = 2**63 - 1


def fits_int64(fn: str, name: str, value: Any) -> None:
    """OverflowError naming ``name`` unless every int of ``value`` fits a C int64."""
    for v in value if isinstance(value, (tuple, list)) else (value,):
        if not -INT64_MAX - 1 <= v <= INT64_MAX:
            raise OverflowError(
                f"{fn}: {name}={value!r} does not fit a 64-bit integer (the largest "
                f"accepted value is {INT64_MAX})"
            )


def finite(fn: str, name: str, value: Any) -> float:
    """A finite real ``value``, or a ValueError naming ``name``."""
    value = A.real(value, fn, name)
    if not math.isfinite(value):
        raise ValueError(f"{fn}: {name} must be a finite number, got {value}")
    return value


def _positive(fn: str, name: str, pair: tuple[int, int]) -> tuple[int, int]:
    if min(pair) <= 0:
        raise ValueError(f"{fn}: {name} must be positive, got {pair}")
    fits_int64(fn, name, pair)
    return pair


def _non_negative(fn: str, name: str, pair: tuple[int, int]) -> tuple[int, int]:
    if min(pair) < 0:
        raise ValueError(f"{fn}: {name} must be non-negative, got {pair}")
    fits_int64(fn, name, pair)
    return pair


def _spans_fit(fn: str, sizes: Shape, pads: Shape, kernel: Shape, dilation: Shape) -> None:
    """The padded input and the dilated kernel must fit an int64 too (Note [Numeric
    settings]); pads are the sums of both sides."""
    for n, p, k, d in zip(sizes, pads, kernel, dilation):
        if n + p > INT64_MAX:
            raise OverflowError(
                f"{fn}: padding {p} makes the padded input larger than the largest "
                f"64-bit integer {INT64_MAX}"
            )
        if d * (k - 1) + 1 > INT64_MAX:
            raise OverflowError(
                f"{fn}: dilation {d} with kernel size {k} spans more than the largest "
                f"64-bit integer {INT64_MAX}"
            )


def conv_output_size(size: int, pad: int, kernel: int, stride: int, dilation: int) -> int:
    """One spatial size of a convolution's output (pad is the sum of both sides)."""
    return (size + pad - dilation * (kernel - 1) - 1) // stride + 1


def conv_padding(padding: Any, kernel: Shape, stride: Shape, dilation: Shape) -> tuple:
    """conv2d's padding as (top, bottom, left, right): an int, a pair, 'valid' or 'same'
    (the extra row or column of an even kernel goes at the bottom or right, as in
    PyTorch)."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ValueError(
                f"conv2d: padding must be an int, a pair, 'valid' or 'same', got {padding!r}"
            )
        if stride != (1, 1):
            raise ValueError(f"conv2d: padding='same' needs stride 1, got stride={stride}")
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return (total[0] // 2, total[0] - total[0] // 2, total[1] // 2, total[1] - total[1] // 2)
    ph, pw = _non_negative("conv2d", "padding", A.pair(padding, "conv2d", "padding"))
    return (ph, ph, pw, pw)


def conv2d(
    input: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: int
) -> tuple:
    _, c, h, w = _image("conv2d", input)
    _like_input("conv2d", "weight", weight, input)
    if len(weight._shape) != 4:
        raise ValueError(
            f"conv2d: weight must be 4-D (C_out, C_in / groups, kH, kW), got shape {weight._shape}"
        )
    c_out, c_in, kh, kw = weight._shape
    if groups < 1:
        raise ValueError(f"conv2d: groups must be positive, got {groups}")
    fits_int64("conv2d", "groups", groups)
    if c_out < 1:
        raise ValueError(
            f"conv2d: weight must have at least one output channel, got shape {weight._shape}"
        )
    if min(kh, kw) < 1:
        raise ValueError(
            f"conv2d: the kernel size must be positive, got {kh} x {kw} (weight shape "
            f"{weight._shape})"
        )
    if c % groups or c_out % groups:
        raise ValueError(
            f"conv2d: groups={groups} must divide the input channels ({c}) and the output "
            f"channels ({c_out}) (input {input._shape}, weight {weight._shape})"
        )
    if c_in * groups != c:
        raise ValueError(
            f"conv2d: input has {c} channels, but weight {weight._shape} with groups={groups} "
            f"expects {c_in * groups} (input shape {input._shape})"
        )
    _like_input("conv2d", "bias", bias, input, (c_out,))
    stride = _positive("conv2d", "stride", stride)
    dilation = _positive("conv2d", "dilation", dilation)
    padding = conv_padding(padding, (kh, kw), stride, dilation)
    pads = (padding[0] + padding[1], padding[2] + padding[3])
    _spans_fit("conv2d", (h, w), pads, (kh, kw), dilation)
    sizes = (
        conv_output_size(h, padding[0] + padding[1], kh, stride[0], dilation[0]),
        conv_output_size(w, padding[2] + padding[3], kw, stride[1], dilation[1]),
    )
    if min(sizes) < 1:
        raise ValueError(
            f"conv2d: the kernel ({kh} x {kw}, dilation {dilation}) is larger than the padded "
            f"input ({h + padding[0] + padding[1]} x {w + padding[2] + padding[3]}; input "
            f"shape {input._shape}, padding {padding})"
        )
    return input, weight, bias, stride, padding, dilation, groups


def resample2d(input: Any, rows: Any, cols: Any, row_weights: Any, col_weights: Any) -> tuple:
    """Index tables (size, taps) of int64 and their weights (input's dtype), either
    both given (rows and cols with as many taps) or neither (one tap each); the
    indices' range is the kernels' check."""
    fn = "resample2d"
    _image(fn, input)
    if (row_weights is None) != (col_weights is None):
        raise ValueError(f"{fn}: row_weights and col_weights must be given together")
    for name, table, weights in (("rows", rows, row_weights), ("cols", cols, col_weights)):
        if table._dtype.name != "int64" or len(table._shape) != 2 or table._shape[1] < 1:
            raise ValueError(
                f"{fn}: {name} must be an int64 table (size, taps), got "
                f"{table._dtype.name} of shape {table._shape}"
            )
        _like_input(fn, f"{name[:-1]}_weights", weights, input, table._shape)
    taps = (rows._shape[1], cols._shape[1])
    if row_weights is None and taps != (1, 1):
        raise ValueError(f"{fn}: unweighted rows and cols must have one tap each, got {taps}")
    if taps[0] != taps[1]:
        raise ValueError(f"{fn}: weighted rows and cols must have as many taps, got {taps}")
    return input, rows, cols, row_weights, col_weights


def linear(input: Any, weight: Any, bias: Any) -> tuple:
    _floating("linear", "input", input)
    _like_input("linear", "weight", weight, input)
    if len(weight._shape) != 2:
        raise ValueError(
            f"linear: weight must be 2-D (out_features, in_features), got shape {weight._shape}"
        )
    if not input._shape or input._shape[-1] != weight._shape[1]:
        raise ValueError(
            f"linear: input's last dimension must be in_features={weight._shape[1]} "
            f"(weight {weight._shape}), got input shape {input._shape}"
        )
    _like_input("linear", "bias", bias, input, (weight._shape[0],))
    return input, weight, bias


def pool_output_size(size: int, pad: int, kernel: int, stride: int, dilation: int, ceil: bool):
    """One spatial size of a pooling's output (PyTorch's rule: with ceil_mode the last
    window must still start inside the input or its left padding)."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil else 0)) // stride + 1
    if ceil and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _pool(fn: str, input: Any, kernel: Any, stride: Any, padding: Any, dilation: Any, ceil: bool):
    """Canonical kernel, stride, padding and dilation of a pooling, its output size."""
    _, _, h, w = _image(fn, input)
    kernel = _positive(fn, "kernel_size", kernel)
    stride = kernel if stride is None else _positive(fn, "stride", stride)
    dilation = _positive(fn, "dilation", dilation)
    padding = _non_negative(fn, "padding", padding)
    if any(p > k // 2 for p, k in zip(padding, kernel)):
        raise ValueError(f"{fn}: padding {padding} must be at most half of kernel_size {kernel}")
    _spans_fit(fn, (h, w), tuple(2 * p for p in padding), kernel, dilation)
    sizes = tuple(
        pool_output_size(n, p, k, s, d, ceil)
        for n, p, k, s, d in zip((h, w), padding, kernel, stride, dilation)
    )
    if min(sizes) < 1:
        raise ValueError(
            f"{fn}: the output would be {sizes[0]} x {sizes[1]}: the kernel {kernel} "
            f"(dilation {dilation}) is larger than the padded input (shape {input._shape}, "
            f"padding {padding})"
        )
    return kernel, stride, padding, dilation


def _index_pool(fn: str) -> Any:
    def check(input, kernel_size, stride, padding, dilation, ceil_mode):
        kernel, stride, padding, dilation = _pool(
            fn, input, kernel_size, stride, padding, dilation, ceil_mode
        )
        return input, kernel, stride, padding, dilation, ceil_mode

    return check


max_pool2d = _index_pool("max_pool2d")
min_pool2d = _index_pool("min_pool2d")


def avg_pool2d(
    input: Any,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Any,
) -> tuple:
    kernel, stride, padding, _ = _pool(
        "avg_pool2d", input, kernel_size, stride, padding, (1, 1), ceil_mode
    )
    if divisor_override is not None:
        divisor_override = A.integer(divisor_override, "avg_pool2d", "divisor_override")
        if divisor_override == 0:
            raise ValueError("avg_pool2d: divisor_override must not be zero")
        fits_int64("avg_pool2d", "divisor_override", divisor_override)
    return input, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override


def adaptive_output_size(fn: str, input: Any, output_size: Any) -> tuple[int, int]:
    """An adaptive pooling's output size (an int or a pair, None keeping the input's
    size), checked: positive, and an input with positive height and width (PyTorch: no
    windows to pool over otherwise)."""
    _, _, h, w = _image(fn, input)
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * 2
    if len(sizes) != 2:
        raise ValueError(f"{fn}: output_size must be an int or a pair, got {output_size!r}")
    sizes = tuple(
        n if s is None else A.integer(s, fn, "output_size") for s, n in zip(sizes, (h, w))
    )
    _positive(fn, "output_size", sizes)
    if min(h, w) < 1:
        raise ValueError(
            f"{fn}: the input's height and width must be positive, got shape {input._shape}"
        )
    return sizes


def adaptive_avg_pool2d(input: Any, output_size: Any) -> tuple:
    return input, adaptive_output_size("adaptive_avg_pool2d", input, output_size)


def local_response_norm(input: Any, size: int, alpha: float, beta: float, k: float) -> tuple:
    _floating("local_response_norm", "input", input)
    if len(input._shape) < 3:
        raise ValueError(
            "local_response_norm: expected an input of 3 or more dimensions (N, C, ...), "
            f"got shape {input._shape}"
        )
    if size < 1:
        raise ValueError(f"local_response_norm: size must be positive, got {size}")
    fits_int64("local_response_norm", "size", size)
    for name, value in (("alpha", alpha), ("beta", beta), ("k", k)):
        finite("local_response_norm", name, value)
    return input, size, alpha, beta, k


def batch_norm(
    input: Any,
    weight: Any,
    bias: Any,
    running_mean: Any,
    running_var: Any,
    training: bool,
    momentum: float,
    eps: float,
    relu: bool = False,
) -> tuple:
    _floating("batch_norm", "input", input)
    if len(input._shape) < 2:
        raise ValueError(
            f"batch_norm: expected an input of 2 or more dimensions (N, C, ...), "
            f"got shape {input._shape}"
        )
    c = input._shape[1]
    for name, t in (
        ("weight", weight),
        ("bias", bias),
        ("running_mean", running_mean),
        ("running_var", running_var),
    ):
        _like_input("batch_norm", name, t, input, (c,))
    if not training and (running_mean is None or running_var is None):
        raise ValueError("batch_norm: running_mean and running_var are needed when not training")
    # PyTorch's rule: one value per channel has no variance; an empty batch (or no
    # channels) gives an empty result and leaves the running statistics as they are
    if training and input._shape[0] * math.prod(input._shape[2:]) == 1:
        raise ValueError(
            f"batch_norm: expected more than 1 value per channel when training (a batch "
            f"norm needs more than one value per channel), got input shape {input._shape}"
        )
    eps = finite("batch_norm", "eps", eps)
    if eps < 0 or (training and eps == 0):
        raise ValueError(
            f"batch_norm: eps must be positive{'' if training else ' or zero'}"
            f"{' when training' if training else ''}, got {eps}"
        )
    momentum = finite("batch_norm", "momentum", momentum)
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"batch_norm: momentum must be in [0, 1], got {momentum}")
    return input, weight, bias, running_mean, running_var, training, momentum, eps, relu


def _norm_eps(fn: str, eps: float) -> float:
    eps = finite(fn, "eps", eps)
    if eps < 0:
        raise ValueError(f"{fn}: eps must not be negative, got {eps}")
    return eps


def layer_norm(input: Any, normalized_shape: Shape, weight: Any, bias: Any, eps: float) -> tuple:
    _floating("layer_norm", "input", input)
    shape, k = tuple(normalized_shape), len(normalized_shape)
    if not k or input._shape[len(input._shape) - k :] != shape or k > len(input._shape):
        raise ValueError(
            f"layer_norm: normalized_shape {shape} must be the last axes of the input's "
            f"shape {input._shape} (at least one axis)"
        )
    for name, t in (("weight", weight), ("bias", bias)):
        _like_input("layer_norm", name, t, input, shape)
    return input, shape, weight, bias, _norm_eps("layer_norm", eps)


def lstm_cell(gates: Any, c: Any) -> tuple:
    _floating("lstm_cell", "c", c)
    if gates._dtype != c._dtype:
        raise TypeError(f"lstm_cell: gates ({gates._dtype}) and c ({c._dtype}) differ in dtype")
    if not c._shape or gates._shape != (4, *c._shape):
        raise ValueError(
            f"lstm_cell: gates must have shape (4, *c.shape) = {(4, *c._shape)} for c of "
            f"at least one dimension, got {gates._shape}"
        )
    return gates, c


def _projections(fn: str, projections: Any, gates: int) -> tuple[int, int, int]:
    """(G * H, N, H) of a sequence's input projections (G * H, L, N), checked."""
    _floating(fn, "projections", projections)
    shape = projections._shape
    if len(shape) != 3 or shape[0] % gates:
        raise ValueError(f"{fn}: projections must have shape ({gates}H, L, N), got {shape}")
    return shape[0], shape[2], shape[0] // gates


def _sequence_output(fn: str, output: Any) -> tuple[int, int, int]:
    """(H, L, N) of a sequence's output, checked."""
    _floating(fn, "output", output)
    if len(output._shape) != 3:
        raise ValueError(f"{fn}: output must have shape (H, L, N), got {output._shape}")
    return output._shape


def lstm_sequence(projections: Any, h0: Any, c0: Any, weight_hh: Any) -> tuple:
    fn = "lstm_sequence"
    rows, n, size = _projections(fn, projections, 4)
    _recurrent_arguments(
        fn,
        projections,
        {"h0": (h0, (size, n)), "c0": (c0, (size, n)), "weight_hh": (weight_hh, (rows, size))},
    )
    return projections, h0, c0, weight_hh


def lstm_sequence_backward(*args: Any) -> tuple:
    fn = "lstm_sequence_backward"
    grad_output, grad_h_n, grad_c_n, h0, c0, weight_hh, output, cs, activations = args
    size, length, n = _sequence_output(fn, output)
    state = (size, n)
    shapes = {
        "grad_output": (grad_output, output._shape),
        "grad_h_n": (grad_h_n, state),
        "grad_c_n": (grad_c_n, state),
        "h0": (h0, state),
        "c0": (c0, state),
        "weight_hh": (weight_hh, (4 * size, size)),
        "cs": (cs, (length, size, n)),
        "activations": (activations, (length, 4, size, n)),
    }
    _recurrent_arguments(fn, output, shapes)
    return args


def gru_sequence(projections: Any, h0: Any, weight_hh: Any, bias_hh: Any) -> tuple:
    fn = "gru_sequence"
    rows, n, size = _projections(fn, projections, 3)
    shapes = {
        "h0": (h0, (size, n)),
        "weight_hh": (weight_hh, (rows, size)),
        "bias_hh": (bias_hh, (rows,)),
    }
    _recurrent_arguments(fn, projections, shapes)
    return projections, h0, weight_hh, bias_hh


def gru_sequence_backward(*args: Any) -> tuple:
    fn = "gru_sequence_backward"
    grad_output, grad_h_n, h0, weight_hh, output, activations = args
    size, length, n = _sequence_output(fn, output)
    shapes = {
        "grad_output": (grad_output, output._shape),
        "grad_h_n": (grad_h_n, (size, n)),
        "h0": (h0, (size, n)),
        "weight_hh": (weight_hh, (3 * size, size)),
        "activations": (activations, (length, 4, size, n)),
    }
    _recurrent_arguments(fn, output, shapes)
    return args


def _recurrent_arguments(fn: str, like: Any, shapes: dict) -> None:
    """Each given tensor of ``shapes`` (name: (tensor, its expected shape)) has like's
    dtype and its shape: the kernels index them unchecked."""
    for name, (t, shape) in shapes.items():
        if t is None:
            continue
        if t._dtype != like._dtype:
            raise TypeError(f"{fn}: {name} must be {like._dtype.name}, got {t._dtype.name}")
        if t._shape != shape:
            raise ValueError(f"{fn}: expected {name} of shape {shape}, got {t._shape}")


def group_norm(input: Any, weight: Any, bias: Any, num_groups: int, eps: float) -> tuple:
    _floating("group_norm", "input", input)
    if len(input._shape) < 2:
        raise ValueError(
            f"group_norm: expected an input of 2 or more dimensions (N, C, ...), "
            f"got shape {input._shape}"
        )
    c = input._shape[1]
    if num_groups < 1 or c % num_groups:
        raise ValueError(
            f"group_norm: num_groups={num_groups} must be positive and divide the "
            f"{c} channels of the input"
        )
    for name, t in (("weight", weight), ("bias", bias)):
        _like_input("group_norm", name, t, input, (c,))
    return input, weight, bias, num_groups, _norm_eps("group_norm", eps)


def attention_mask(attn_mask: Any, scores: Shape, is_causal: bool, query: Any) -> None:
    """scaled_dot_product_attention's mask: boolean or of the query's dtype, broadcasting
    to the attention weights' shape ``scores`` (..., L, S), and none with is_causal."""
    fn = "scaled_dot_product_attention"
    if attn_mask is None:
        return
    if is_causal:
        raise ValueError(f"{fn}: attn_mask must be None when is_causal is True")
    try:
        fits = broadcast_shapes(fn, attn_mask._shape, scores) == scores
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{fn}: attn_mask of shape {attn_mask._shape} does not broadcast to the "
            f"attention weights' shape {scores} (..., L, S)"
        )
    if attn_mask._dtype is not D.bool_ and attn_mask._dtype is not query._dtype:
        raise TypeError(
            f"{fn}: attn_mask must be boolean or of the query's dtype "
            f"{query._dtype.name}, got {attn_mask._dtype.name}"
        )


def attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    is_causal: bool,
    scale: float,
    need_weights: bool,
) -> tuple:
    fn = "scaled_dot_product_attention"
    _floating(fn, "query", query)
    for name, t in (("key", key), ("value", value)):
        _like_input(fn, name, t, query)
    q, k, v = query._shape, key._shape, value._shape
    if len(q) < 2 or not (q[:-2] == k[:-2] == v[:-2]) or q[-1] != k[-1] or k[-2] != v[-2]:
        raise ValueError(
            f"{fn}: expected query (..., L, E), key (..., S, E) and value (..., S, Ev) "
            f"of the same leading shape, got {q}, {k} and {v}"
        )
    attention_mask(attn_mask, (*q[:-1], k[-2]), is_causal, query)
    return query, key, value, attn_mask, is_causal, finite(fn, "scale", scale), need_weights


def attention_backward(
    grad: Any, query: Any, key: Any, value: Any, weights: Any, scale: float
) -> tuple:
    """The shapes attention's forward gives: query (..., L, E), key (..., S, E), value
    (..., S, Ev), weights (..., L, S) and grad (..., L, Ev), all of one dtype."""
    fn = "native_scaled_dot_product_attention_backward"
    _floating(fn, "query", query)
    q, k, v = query._shape, key._shape, value._shape
    if len(q) < 2 or not (q[:-2] == k[:-2] == v[:-2]) or q[-1] != k[-1] or k[-2] != v[-2]:
        raise ValueError(
            f"{fn}: expected query (..., L, E), key (..., S, E) and value (..., S, Ev) "
            f"of the same leading shape, got {q}, {k} and {v}"
        )
    for name, t, shape in (
        ("key", key, None),
        ("value", value, None),
        ("weights", weights, (*q[:-1], k[-2])),
        ("grad", grad, (*q[:-1], v[-1])),
    ):
        _like_input(fn, name, t, query, shape)
    return grad, query, key, value, weights, finite(fn, "scale", scale)


def embedding(weight: Any, indices: Any, padding_idx: Any) -> tuple:
    """Integer indices as int64; padding_idx in [0, num_embeddings) (a negative one
    counts from the end, as in PyTorch). Whether the indices are in range depends on
    their values: the kernels check that."""
    _floating("embedding", "weight", weight)
    if len(weight._shape) != 2:
        raise ValueError(
            f"embedding: weight must be (num_embeddings, embedding_dim), got shape {weight._shape}"
        )
    if indices._dtype.kind not in "iu":
        raise TypeError(f"embedding: input must hold integer indices, got {indices._dtype.name}")
    if indices._dtype is not D.int64:
        indices = OPERATORS["astype"](indices, D.int64, True)
    rows = weight._shape[0]
    if padding_idx is not None:
        if not -rows <= padding_idx < rows:
            raise ValueError(
                f"embedding: padding_idx must be within num_embeddings ({rows}), got {padding_idx}"
            )
        padding_idx %= rows
    return weight, indices, padding_idx


def activation(name: str) -> Any:
    if name == "leaky_relu":  # its slope is a setting (Note [Numeric settings])
        return leaky_relu

    def check(input: Any, *rest: Any) -> tuple:
        _floating(name, "input", input)
        return (input, *rest)

    return check


def leaky_relu(input: Any, negative_slope: float) -> tuple:
    _floating("leaky_relu", "input", input)
    return input, finite("leaky_relu", "negative_slope", negative_slope)


def gelu(input: Any, approximate: str) -> tuple:
    _floating("gelu", "input", input)
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return input, approximate


def softmax(name: str) -> Any:
    def check(input: Any, dim: int) -> tuple:
        _floating(name, "input", input)
        return input, dim

    return check


def check_reduction(fn: str, reduction: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{fn}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def nll_loss(input: Any, target: Any, weight: Any, ignore_index: int, reduction: str) -> tuple:
    _floating("nll_loss", "input", input)
    if target._dtype.kind not in "iu":
        raise TypeError(
            f"nll_loss: target must hold integer class indices, got {target._dtype.name} "
            "(int64, PyTorch's Long, or uint8, its Byte)"
        )
    if target._dtype is not D.int64:  # uint8 (PyTorch's Byte) and the other integers
        target = OPERATORS["astype"](target, D.int64, True)  # as int64 class indices
    fits_int64("nll_loss", "ignore_index", ignore_index)
    shape = input._shape
    if not shape:
        raise ValueError("nll_loss: input must be (C,) or (N, C, ...), got a 0-d tensor")
    expected = () if len(shape) == 1 else shape[:1] + shape[2:]
    if target._shape != expected:
        raise ValueError(
            f"nll_loss: target must have shape {expected} for input shape {shape}, "
            f"got {target._shape}"
        )
    c = shape[0] if len(shape) == 1 else shape[1]
    _like_input("nll_loss", "weight", weight, input, (c,))
    check_reduction("nll_loss", reduction)
    return input, target, weight, ignore_index, reduction


def add_scaled(x1: Any, x2: Any, alpha: float) -> tuple:
    _floating("add_scaled_", "x1", x1)
    _like_input("add_scaled_", "x2", x2, x1, x1._shape)
    return x1, x2, finite("add_scaled_", "alpha", alpha)


def cross_entropy_loss(input: Any, target: Any, ignore_index: int) -> tuple:
    if len(input._shape) != 2:
        raise ValueError(
            f"cross_entropy_loss: input must be (N, C) logits, got shape {input._shape}"
        )
    input, target, _, ignore_index, _ = nll_loss(input, target, None, ignore_index, "mean")
    return input, target, ignore_index


def cross_entropy_loss_backward(grad: Any, input: Any, target: Any, ignore_index: int) -> tuple:
    """cross_entropy_loss's arguments and the loss's gradient, 0-d of input's dtype."""
    input, target, ignore_index = cross_entropy_loss(input, target, ignore_index)
    _like_input("cross_entropy_loss_backward", "grad", grad, input, ())
    return grad, input, target, ignore_index


def mse_loss(input: Any, target: Any, reduction: str) -> tuple:
    _floating("mse_loss", "input", input)
    _like_input("mse_loss", "target", target, input)
    if target._shape != input._shape:
        raise ValueError(
            f"mse_loss: target shape {target._shape} differs from input shape {input._shape}"
        )
    check_reduction("mse_loss", reduction)
    return input, target, reduction


def hardtanh(input: Any, min_val: float, max_val: float) -> tuple:
    _floating("hardtanh", "input", input)
    if not min_val <= max_val:  # NaN fails too
        raise ValueError(
            f"hardtanh: min_val must not exceed max_val, got min_val={min_val}, max_val={max_val}"
        )
    return input, float(min_val), float(max_val)


def _pointwise_loss(fn: str, input: Any, target: Any, reduction: str) -> None:
    """A floating input, a target of its dtype and shape, a known reduction."""
    _floating(fn, "input", input)
    _like_input(fn, "target", target, input)
    if target._shape != input._shape:
        raise ValueError(
            f"{fn}: target shape {target._shape} differs from input shape {input._shape}"
        )
    check_reduction(fn, reduction)


def binary_cross_entropy_with_logits(
    input: Any, target: Any, weight: Any, reduction: str, pos_weight: Any
) -> tuple:
    fn = "binary_cross_entropy_with_logits"
    _pointwise_loss(fn, input, target, reduction)
    for name, w in (("weight", weight), ("pos_weight", pos_weight)):
        _like_input(fn, name, w, input)
        if w is not None and broadcast_shapes(fn, w._shape, input._shape) != input._shape:
            raise ValueError(
                f"{fn}: {name} of shape {w._shape} does not broadcast to the input's shape "
                f"{input._shape}"
            )
    return input, target, weight, reduction, pos_weight


def smooth_l1_loss(input: Any, target: Any, reduction: str, beta: float) -> tuple:
    _pointwise_loss("smooth_l1_loss", input, target, reduction)
    beta = finite("smooth_l1_loss", "beta", beta)
    if beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    return input, target, reduction, beta


def to_layout(input: Any, layout: str) -> tuple:
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"to_layout: layout must be 'NCHW' or 'NHWC', got {layout!r}")
    if len(input._shape) != 4:
        raise ValueError(f"to_layout: needs a 4-D (N, C, H, W) tensor, got shape {input._shape}")
    return input, layout
