"""Public functions that are not plain elementwise bindings: argument normalization
(axes, shapes, dtypes) happens here, once, so every backend receives canonical
arguments — reductions get ``axis`` as a sorted tuple of non-negative ints.
"""
import builtins
import functools
import math
import operator

import numpy as np

from lamina.dispatch import keys
from lamina.dispatch.table import OPERATORS

from . import _dtypes as D
from ._tensor import Tensor


class AxisError(ValueError, IndexError):
    """An axis out of range for a tensor's number of dimensions."""


def _require_tensor(name, x):
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(x).__name__}")


def _axis_index(name, axis, ndim):
    try:
        a = operator.index(axis)
    except TypeError:
        raise TypeError(f"{name}: axis must be an int, got {type(axis).__name__}") from None
    if not -ndim <= a < ndim:
        raise AxisError(f"{name}: axis {a} is out of bounds for a tensor of dimension {ndim}")
    return a % ndim


def normalize_axes(name, axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = [_axis_index(name, a, ndim) for a in (axis if isinstance(axis, (tuple, list))
                                                 else (axis,))]
    if len(set(axes)) != len(axes):
        raise ValueError(f"{name}: repeated axis in {axis}")
    return tuple(sorted(axes))


# ---------------------------------------------------------------- reductions


def _reduction(name, extra=()):
    op = OPERATORS[name]

    def reduce(x, /, *, axis=None, keepdims=False, **kwargs):
        _require_tensor(name, x)
        unknown = set(kwargs) - set(extra)
        if unknown:
            raise TypeError(f"{name}() got an unexpected keyword argument {unknown.pop()!r}")
        axes = normalize_axes(name, axis, len(x._shape))
        if name in ("argmax", "argmin") and axis is not None and not isinstance(axis, int):
            raise TypeError(f"{name}: axis must be an int or None, got {axis!r}")
        if name == "sum" or name == "prod":
            return op(x, axes, kwargs.get("dtype"), bool(keepdims))
        if extra:
            return op(x, axes, bool(keepdims), float(kwargs.get("correction", 0.0)))
        return op(x, axes, bool(keepdims))
    reduce.__name__ = reduce.__qualname__ = name
    return reduce


sum = _reduction("sum", ("dtype",))
prod = _reduction("prod", ("dtype",))
mean = _reduction("mean")
var = _reduction("var", ("correction",))
std = _reduction("std", ("correction",))
max = _reduction("max")
min = _reduction("min")
all = _reduction("all")
any = _reduction("any")
argmax = _reduction("argmax")
argmin = _reduction("argmin")


# ---------------------------------------------------------------- elementwise extras


def where(condition, x1, x2, /):
    return OPERATORS["where"](condition, x1, x2)


def clip(x, /, min=None, max=None):
    _require_tensor("clip", x)
    return OPERATORS["clip"](x, min, max)


def astype(x, dtype, /, *, copy=True, device=None):
    _require_tensor("astype", x)
    if device is not None and device != x.device:
        x, copy = x.to_device(device), False  # a move is a copy already
    return OPERATORS["astype"](x, D.as_dtype(dtype), bool(copy))


# ---------------------------------------------------------------- manipulation


def _shape_tuple(name, shape):
    try:
        return tuple(operator.index(s) for s in (shape if isinstance(shape, (tuple, list))
                                                 else (shape,)))
    except TypeError:
        raise TypeError(f"{name}: shape must be a tuple of ints, got {shape!r}") from None


def reshape(x, /, shape, *, copy=None):
    _require_tensor("reshape", x)
    shape = _shape_tuple("reshape", shape)
    if shape.count(-1) > 1 or builtins.any(s < -1 for s in shape):
        raise ValueError(f"reshape: invalid shape {shape} (at most one -1, no other negatives)")
    known = math.prod([s for s in shape if s != -1])
    if -1 in shape:
        if known == 0 or x.size % known:
            raise ValueError(f"reshape: cannot reshape a tensor of shape {x.shape} "
                             f"(size {x.size}) to {shape}")
        shape = tuple(x.size // known if s == -1 else s for s in shape)
    elif known != x.size:
        raise ValueError(f"reshape: cannot reshape a tensor of shape {x.shape} "
                         f"(size {x.size}) to {shape} (size {known})")
    return OPERATORS["reshape"](x, shape, copy)


def permute_dims(x, /, axes):
    _require_tensor("permute_dims", x)
    if not isinstance(axes, (tuple, list)):
        raise TypeError(f"permute_dims: axes must be a tuple of ints, got {axes!r}")
    axes = tuple(_axis_index("permute_dims", a, x.ndim) for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"permute_dims: axes {axes} are not a permutation of "
                         f"0..{x.ndim - 1}")
    return OPERATORS["permute_dims"](x, axes)


def matrix_transpose(x, /):
    _require_tensor("matrix_transpose", x)
    if x.ndim < 2:
        raise ValueError(f"matrix_transpose: needs at least 2 dimensions, got shape {x.shape}")
    return OPERATORS["matrix_transpose"](x)


def expand_dims(x, /, *, axis=0):
    _require_tensor("expand_dims", x)
    return OPERATORS["expand_dims"](x, _axis_index("expand_dims", axis, x.ndim + 1))


def squeeze(x, /, axis):
    _require_tensor("squeeze", x)
    axes = normalize_axes("squeeze", axis, x.ndim)
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"squeeze: axis {a} has size {x.shape[a]}, not 1 "
                             f"(shape {x.shape})")
    return OPERATORS["squeeze"](x, axes)


def flip(x, /, *, axis=None):
    _require_tensor("flip", x)
    return OPERATORS["flip"](x, normalize_axes("flip", axis, x.ndim))


def broadcast_to(x, /, shape):
    _require_tensor("broadcast_to", x)
    shape = _shape_tuple("broadcast_to", shape)
    ok = len(shape) >= x.ndim and builtins.all(
        s == t or s == 1 for s, t in zip(x.shape[::-1], shape[::-1]))
    if not ok:
        raise ValueError(f"broadcast_to: cannot broadcast shape {x.shape} to {shape}")
    return OPERATORS["broadcast_to"](x, shape)




def broadcast_arrays(*arrays):
    from lamina.backends.setup import broadcast_shapes
    for a in arrays:
        _require_tensor("broadcast_arrays", a)
    if not arrays:
        return []
    shape = broadcast_shapes("broadcast_arrays", *(a.shape for a in arrays))
    return [broadcast_to(a, shape) for a in arrays]


def _tensor_list(name, arrays):
    arrays = list(arrays)
    if not arrays:
        raise ValueError(f"{name}: needs at least one tensor")
    for a in arrays:
        _require_tensor(name, a)
    return arrays


def concat(arrays, /, *, axis=0):
    arrays = _tensor_list("concat", arrays)
    if axis is None:
        arrays = [reshape(a, (-1,)) for a in arrays]
        axis = 0
    if arrays[0].ndim == 0:
        raise ValueError("concat: zero-dimensional tensors cannot be concatenated")
    return OPERATORS["concat"](arrays, _axis_index("concat", axis, arrays[0].ndim))


def stack(arrays, /, *, axis=0):
    arrays = _tensor_list("stack", arrays)
    return OPERATORS["stack"](arrays, _axis_index("stack", axis, arrays[0].ndim + 1))


def split(x, split_size_or_sections, /, axis=0):
    """Split into views along ``axis`` (PyTorch's ``torch.split``): an int gives chunks
    of that size (the last may be smaller); a list gives the size of each chunk."""
    _require_tensor("split", x)
    axis = _axis_index("split", axis, x.ndim)
    s = split_size_or_sections
    if isinstance(s, int):
        if s <= 0:
            raise ValueError(f"split: split_size must be positive, got {s}")
    else:
        try:
            s = [operator.index(v) for v in s]
        except TypeError:
            raise TypeError(f"split: split_size_or_sections must be an int or a sequence "
                            f"of ints, got {s!r}") from None
        if builtins.any(v < 0 for v in s):
            raise ValueError(f"split: section sizes must be non-negative, got {s}")
    return OPERATORS["split"](x, s, axis)




def unstack(x, /, *, axis=0):
    _require_tensor("unstack", x)
    axis = _axis_index("unstack", axis, x.ndim)
    if x.shape[axis] == 0:
        return ()
    return tuple(squeeze(p, axis) for p in split(x, 1, axis))


# ---------------------------------------------------------------- linear algebra


def matmul(x1, x2, /):
    _require_tensor("matmul", x1)
    _require_tensor("matmul", x2)
    return OPERATORS["matmul"](x1, x2)


def tensordot(x1, x2, /, *, axes=2):
    _require_tensor("tensordot", x1)
    _require_tensor("tensordot", x2)
    if isinstance(axes, int):
        if axes < 0 or axes > builtins.min(x1.ndim, x2.ndim):
            raise ValueError(f"tensordot: axes={axes} is out of range for shapes "
                             f"{x1.shape} and {x2.shape}")
        a, b = tuple(range(x1.ndim - axes, x1.ndim)), tuple(range(axes))
    else:
        a, b = ((ax,) if isinstance(ax, int) else tuple(ax) for ax in axes)
        a = tuple(_axis_index("tensordot", i, x1.ndim) for i in a)
        b = tuple(_axis_index("tensordot", i, x2.ndim) for i in b)
    if len(a) != len(b) or builtins.any(x1.shape[i] != x2.shape[j] for i, j in zip(a, b)):
        raise ValueError(f"tensordot: contracted axes {a} of {x1.shape} and {b} of "
                         f"{x2.shape} do not match")
    return OPERATORS["tensordot"](x1, x2, (a, b))




def vecdot(x1, x2, /, *, axis=-1):
    _require_tensor("vecdot", x1)
    _require_tensor("vecdot", x2)
    from lamina.backends.setup import broadcast_shapes
    shape = broadcast_shapes("vecdot", x1.shape, x2.shape)
    axis = _axis_index("vecdot", axis, len(shape))
    n1 = x1.shape[axis - len(shape)] if axis - len(shape) >= -x1.ndim else 1
    n2 = x2.shape[axis - len(shape)] if axis - len(shape) >= -x2.ndim else 1
    if n1 != n2:
        raise ValueError(f"vecdot: the contracted axis has size {n1} in {x1.shape} but "
                         f"{n2} in {x2.shape}")
    return OPERATORS["vecdot"](x1, x2, axis - len(shape))


# ---------------------------------------------------------------- creation


def _requires_grad_option(fn):
    """Add PyTorch's ``requires_grad=False`` keyword to a creation function."""
    @functools.wraps(fn)
    def create(*args, requires_grad=False, **kwargs):
        t = fn(*args, **kwargs)
        if requires_grad:
            if args and t is args[0]:  # asarray(tensor) returned its input: do not flag it
                t = t.detach()
            t.requires_grad_()
        return t
    return create


def _device_key(device):
    return keys.device_key("cpu" if device is None else str(device))


def _create(name, *args, device=None):
    op = OPERATORS[name]
    ks = _device_key(device) & op.mask
    return op.table[ks.bit_length()](ks, *args)


@_requires_grad_option
def asarray(obj, /, *, dtype=None, device=None, copy=None):
    dtype = None if dtype is None else D.as_dtype(dtype)
    if isinstance(obj, Tensor):
        if device is not None and device != obj.device:
            if copy is False:
                raise ValueError(f"asarray: moving a tensor from {obj.device} to {device} "
                                 "needs a copy, but copy=False")
            return asarray(obj.to_device(device), dtype=dtype)
        if dtype is None or dtype is obj.dtype:
            return OPERATORS["copy"](obj) if copy else obj
        if copy is False:
            raise ValueError(f"asarray: converting {obj.dtype} to {dtype} needs a copy, "
                             "but copy=False")
        return astype(obj, dtype)
    if copy is False and not isinstance(obj, np.ndarray) and not hasattr(obj, "__dlpack__"):
        raise ValueError("asarray: copy=False needs an object that exposes its buffer")
    try:
        data = np.array(obj, dtype=None if dtype is None else dtype.np,
                        copy=True if copy else None)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"asarray: cannot convert {type(obj).__name__} to a tensor: "
                        f"{exc}") from None
    if data.dtype == object and isinstance(obj, int):
        raise OverflowError(f"asarray: Python integer {obj} does not fit in 64 bits")
    if data.dtype == np.float16 and dtype is None:
        raise TypeError("asarray: float16 is not supported; pass dtype=lamina.float32")
    D.from_numpy(data.dtype)  # TypeError for unsupported dtypes (complex, strings, ...)
    if builtins.any(s % data.itemsize for s in data.strides) or not data.dtype.isnative:
        data = np.ascontiguousarray(data, data.dtype.newbyteorder("="))
    if copy is False and isinstance(obj, np.ndarray) and not np.shares_memory(data, obj):
        raise ValueError("asarray: copy=False, but the conversion needs a copy")
    return _create("from_host", data, D.from_numpy(data.dtype), device=device)


def _default_float(dtype):
    return D.default_float if dtype is None else D.as_dtype(dtype)


def _shape(shape):
    return _shape_tuple("shape", shape)


@_requires_grad_option
def empty(shape, *, dtype=None, device=None):
    return _create("empty", _shape(shape), _default_float(dtype), device=device)


@_requires_grad_option
def zeros(shape, *, dtype=None, device=None):
    return full(shape, 0, dtype=_default_float(dtype), device=device)


@_requires_grad_option
def ones(shape, *, dtype=None, device=None):
    return full(shape, 1, dtype=_default_float(dtype), device=device)


def _python_scalar(v):
    """A NumPy scalar or a 0-d tensor as the Python scalar of its kind (else ``v``), so
    that creation functions infer dtypes and check ranges as for Python scalars."""
    if isinstance(v, np.generic) or isinstance(v, Tensor) and v.ndim == 0:
        return v.item()
    return v


@_requires_grad_option
def full(shape, fill_value, *, dtype=None, device=None):
    fill_value = _python_scalar(fill_value)
    if dtype is None:
        dtype = D.bool_ if isinstance(fill_value, bool) else D.default_int if isinstance(
            fill_value, int) else D.default_float
    dtype = D.as_dtype(dtype)
    if not isinstance(fill_value, (bool, int, float, np.bool_, np.integer, np.floating)):
        raise TypeError(f"full: fill_value must be a bool, int or float, got "
                        f"{type(fill_value).__name__}")
    if isinstance(fill_value, int) and not isinstance(fill_value, bool) and dtype.kind in "iu":
        info = np.iinfo(dtype.np)
        if not info.min <= fill_value <= info.max:
            raise OverflowError(f"full: fill value {fill_value} is out of bounds for {dtype}")
    return _create("full", _shape(shape), fill_value, dtype, device=device)


def _like(x, dtype, device):
    _require_tensor("*_like", x)
    return (x.shape, x.dtype if dtype is None else D.as_dtype(dtype),
            x.device if device is None else device)


@_requires_grad_option
def empty_like(x, /, *, dtype=None, device=None):
    shape, dtype, device = _like(x, dtype, device)
    return empty(shape, dtype=dtype, device=device)


@_requires_grad_option
def zeros_like(x, /, *, dtype=None, device=None):
    shape, dtype, device = _like(x, dtype, device)
    return full(shape, 0, dtype=dtype, device=device)


@_requires_grad_option
def ones_like(x, /, *, dtype=None, device=None):
    shape, dtype, device = _like(x, dtype, device)
    return full(shape, 1, dtype=dtype, device=device)


@_requires_grad_option
def full_like(x, /, fill_value, *, dtype=None, device=None):
    shape, dtype, device = _like(x, dtype, device)
    return full(shape, fill_value, dtype=dtype, device=device)


@_requires_grad_option
def arange(start, /, stop=None, step=1, *, dtype=None, device=None):
    start, stop, step = (_python_scalar(v) for v in (start, stop, step))
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ValueError("arange: step must not be zero")
    if dtype is None:
        dtype = D.default_float if builtins.any(
            isinstance(v, float) for v in (start, stop, step)) else D.default_int
    return _create("arange", start, stop, step, D.as_dtype(dtype), device=device)


@_requires_grad_option
def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True):
    if operator.index(num) < 0:
        raise ValueError(f"linspace: num must be non-negative, got {num}")
    return _create("linspace", start, stop, num, _default_float(dtype), bool(endpoint),
                   device=device)


@_requires_grad_option
def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None):
    n_cols = n_rows if n_cols is None else n_cols
    if n_rows < 0 or n_cols < 0:
        raise ValueError(f"eye: sizes must be non-negative, got {n_rows} x {n_cols}")
    return _create("eye", n_rows, n_cols, k, _default_float(dtype), device=device)


def from_dlpack(x, /, *, device=None, copy=None):
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"from_dlpack: expected an object with __dlpack__, got "
                        f"{type(x).__name__}")
    return asarray(np.from_dlpack(x), device=device, copy=copy)


def _random(name, shape, dtype, device):
    from . import random
    dtype = _default_float(dtype)
    if dtype.kind != "f":
        raise TypeError(f"{name}: needs a floating dtype, got {dtype}")
    shape = _shape(shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list))
                   else shape)
    return _create(name, shape, dtype, random.generator(), device=device)


@_requires_grad_option
def rand(*shape, dtype=None, device=None):
    """Uniform samples in [0, 1): ``lm.rand(2, 3)`` or ``lm.rand((2, 3))``."""
    return _random("rand", shape, dtype, device)


@_requires_grad_option
def randn(*shape, dtype=None, device=None):
    """Standard normal samples: ``lm.randn(2, 3)`` or ``lm.randn((2, 3))``."""
    return _random("randn", shape, dtype, device)
