"""Public functions made of operators rather than being one (PyTorch's composite
functions): creation functions, which pick the device key to dispatch on, and
``asarray``, ``astype``, ``broadcast_arrays``, ``unstack``.

Their arguments are checked with the schema's argument kinds (``arguments.py``); the
operators they call get canonical arguments.
"""

from __future__ import annotations

import builtins
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import arguments as A
from . import dtypes as D
from . import keys, random
from .devices import Device
from .meta import broadcast_shapes, check_cast
from .schema import OPERATORS
from .tensor import Tensor

__all__ = [
    "arange",
    "asarray",
    "astype",
    "broadcast_arrays",
    "empty",
    "empty_like",
    "eye",
    "from_dlpack",
    "full",
    "full_like",
    "linspace",
    "ones",
    "ones_like",
    "rand",
    "randn",
    "unstack",
    "zeros",
    "zeros_like",
]

DTypeLike = Any
DeviceLike = str | Device | None
ShapeLike = int | tuple[int, ...] | list[int]


def _requires_grad_option(fn: Callable) -> Callable:
    """Add PyTorch's ``requires_grad=False`` keyword to a creation function."""

    @functools.wraps(fn)
    def create(*args: Any, requires_grad: bool = False, **kwargs: Any) -> Tensor:
        t = fn(*args, **kwargs)
        if A.boolean(requires_grad, fn.__name__, "requires_grad"):
            if args and t is args[0]:  # asarray(tensor) returned its input: do not flag it
                t = t.detach()
            t.requires_grad_()
        return t

    return create


def _create(name: str, *args: Any, device: DeviceLike = None) -> Tensor:
    op = OPERATORS[name]
    where = "cpu" if device is None else A.device(device, name, "device")
    ks = keys.device_key(where) & op.mask
    return op.table[ks.bit_length()](ks, *args)


def _float_dtype(fn: str, dtype: DTypeLike) -> D.DType:
    return D.default_float if dtype is None else A.dtype(dtype, fn, "dtype")


def _python_scalar(v: Any) -> Any:
    """A NumPy scalar or a 0-d tensor as the Python scalar of its kind (else ``v``), so
    that creation functions infer dtypes and check ranges as for Python scalars."""
    if isinstance(v, np.generic) or (isinstance(v, Tensor) and v.ndim == 0):
        return v.item()
    return v


# ---------------------------------------------------------------- from data


@_requires_grad_option
@A.checked
def asarray(
    obj: Any, /, *, dtype: DTypeLike = None, device: DeviceLike = None, copy: bool | None = None
) -> Tensor:
    """A tensor from a tensor, a NumPy array, a buffer or nested sequences of Python
    scalars. ``copy=None`` copies only when it must, ``True`` always, ``False``
    never (ValueError when it would have to)."""
    dtype = None if dtype is None else A.dtype(dtype, "asarray", "dtype")
    if isinstance(obj, Tensor):
        if device is not None and device != obj.device:
            if copy is False:
                raise ValueError(
                    f"asarray: moving a tensor from {obj.device} to {device} "
                    "needs a copy, but copy=False"
                )
            return asarray(obj.to_device(device), dtype=dtype)
        if dtype is None or dtype is obj.dtype:
            return OPERATORS["copy"](obj) if copy else obj
        if copy is False:
            raise ValueError(
                f"asarray: converting {obj.dtype} to {dtype} needs a copy, but copy=False"
            )
        return OPERATORS["astype"](obj, dtype, True)
    if copy is False and not isinstance(obj, np.ndarray) and not hasattr(obj, "__dlpack__"):
        raise ValueError("asarray: copy=False needs an object that exposes its buffer")
    if dtype is not None and isinstance(obj, np.ndarray):
        check_cast("asarray", obj, dtype)  # NumPy's cast would give garbage for NaN
    try:
        data = np.array(obj, dtype=None if dtype is None else dtype.np, copy=True if copy else None)
    except (ValueError, TypeError) as exc:
        raise type(exc)(
            f"asarray: cannot convert {type(obj).__name__} to a tensor: {exc}"
        ) from None
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


@A.checked
def from_dlpack(x: Any, /, *, device: DeviceLike = None, copy: bool | None = None) -> Tensor:
    """A tensor sharing the memory of an object with ``__dlpack__`` (copied only when
    ``copy=True`` or a move needs it)."""
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"from_dlpack: expected an object with __dlpack__, got {type(x).__name__}")
    try:
        data = np.from_dlpack(x)
    except (RuntimeError, BufferError) as exc:  # NumPy's "Unsupported dtype in DLTensor"
        raise TypeError(
            f"from_dlpack: cannot import {type(x).__name__} ({exc}); lamina supports "
            f"{', '.join(d.name for d in D.ALL)} on the CPU"
        ) from exc
    return asarray(data, device=device, copy=copy)


@A.checked
def astype(
    x: Tensor, dtype: DTypeLike, /, *, copy: bool = True, device: DeviceLike = None
) -> Tensor:
    """x's values in ``dtype`` (and on ``device``); ``copy=False`` returns x itself
    when nothing needs to change."""
    A.tensor(x, "astype", "x")
    dtype = A.dtype(dtype, "astype", "dtype")
    if device is not None and device != x.device:
        x, copy = x.to_device(device), False  # a move is a copy already
    return OPERATORS["astype"](x, dtype, A.boolean(copy, "astype", "copy"))


# ---------------------------------------------------------------- filled


@_requires_grad_option
@A.checked
def empty(shape: ShapeLike, *, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """A tensor of ``shape`` with uninitialized values (default dtype float64)."""
    return _create(
        "empty", A.shape(shape, "empty", "shape"), _float_dtype("empty", dtype), device=device
    )


@_requires_grad_option
@A.checked
def zeros(shape: ShapeLike, *, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """A tensor of ``shape`` filled with 0 (default dtype float64)."""
    return full(shape, 0, dtype=_float_dtype("zeros", dtype), device=device)


@_requires_grad_option
@A.checked
def ones(shape: ShapeLike, *, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """A tensor of ``shape`` filled with 1 (default dtype float64)."""
    return full(shape, 1, dtype=_float_dtype("ones", dtype), device=device)


@_requires_grad_option
@A.checked
def full(
    shape: ShapeLike,
    fill_value: bool | int | float,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
) -> Tensor:
    """A tensor of ``shape`` filled with ``fill_value`` (the dtype follows its kind:
    bool, int64 or float64, unless given)."""
    fill_value = _python_scalar(fill_value)
    if not isinstance(fill_value, (bool, int, float)):
        raise TypeError(
            f"full: fill_value must be a bool, int or float, got {type(fill_value).__name__}"
        )
    if dtype is None:
        dtype = (
            D.bool_
            if isinstance(fill_value, bool)
            else D.default_int
            if isinstance(fill_value, int)
            else D.default_float
        )
    dtype = A.dtype(dtype, "full", "dtype")
    if not isinstance(fill_value, bool) and dtype.kind in "iu":
        if isinstance(fill_value, float) and not math.isfinite(fill_value):
            raise ValueError(f"full: cannot convert float {fill_value} to {dtype.name}")
        info = np.iinfo(dtype.np)  # a float truncates toward zero, as in NumPy
        if not info.min <= int(fill_value) <= info.max:
            raise OverflowError(f"full: fill value {fill_value} is out of bounds for {dtype}")
    return _create("full", A.shape(shape, "full", "shape"), fill_value, dtype, device=device)


def _like(fn: str, x: Tensor, dtype: DTypeLike, device: DeviceLike) -> tuple:
    A.tensor(x, fn, "x")
    return (
        x.shape,
        x.dtype if dtype is None else A.dtype(dtype, fn, "dtype"),
        x.device if device is None else device,
    )


@_requires_grad_option
@A.checked
def empty_like(x: Tensor, /, *, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """An uninitialized tensor of x's shape (and dtype and device, unless given)."""
    shape, dtype, device = _like("empty_like", x, dtype, device)
    return empty(shape, dtype=dtype, device=device)


@_requires_grad_option
@A.checked
def zeros_like(x: Tensor, /, *, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """Zeros of x's shape (and dtype and device, unless given)."""
    shape, dtype, device = _like("zeros_like", x, dtype, device)
    return full(shape, 0, dtype=dtype, device=device)


@_requires_grad_option
@A.checked
def ones_like(x: Tensor, /, *, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """Ones of x's shape (and dtype and device, unless given)."""
    shape, dtype, device = _like("ones_like", x, dtype, device)
    return full(shape, 1, dtype=dtype, device=device)


@_requires_grad_option
@A.checked
def full_like(
    x: Tensor,
    /,
    fill_value: bool | int | float,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
) -> Tensor:
    """``fill_value`` in x's shape (and dtype and device, unless given)."""
    shape, dtype, device = _like("full_like", x, dtype, device)
    return full(shape, fill_value, dtype=dtype, device=device)


# ---------------------------------------------------------------- ranges


@_requires_grad_option
@A.checked
def arange(
    start: int | float,
    /,
    stop: int | float | None = None,
    step: int | float = 1,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
) -> Tensor:
    """Evenly spaced values in [start, stop) (``arange(n)`` is 0 .. n - 1)."""
    start, stop, step = (_python_scalar(v) for v in (start, stop, step))
    if stop is None:
        start, stop = 0, start
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"arange: {name} must be an int or a float, got {type(v).__name__}")
    if step == 0:
        raise ValueError("arange: step must not be zero")
    if dtype is None:
        dtype = (
            D.default_float
            if builtins.any(isinstance(v, float) for v in (start, stop, step))
            else D.default_int
        )
    return _create("arange", start, stop, step, A.dtype(dtype, "arange", "dtype"), device=device)


@_requires_grad_option
@A.checked
def linspace(
    start: int | float,
    stop: int | float,
    /,
    num: int,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    endpoint: bool = True,
) -> Tensor:
    """``num`` evenly spaced values from start to stop (included unless endpoint=False)."""
    num = A.integer(num, "linspace", "num")
    if num < 0:
        raise ValueError(f"linspace: num must be non-negative, got {num}")
    return _create(
        "linspace",
        start,
        stop,
        num,
        _float_dtype("linspace", dtype),
        A.boolean(endpoint, "linspace", "endpoint"),
        device=device,
    )


@_requires_grad_option
@A.checked
def eye(
    n_rows: int,
    n_cols: int | None = None,
    /,
    *,
    k: int = 0,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
) -> Tensor:
    """Ones on the k-th diagonal of an n_rows x n_cols matrix, zeros elsewhere."""
    n_rows = A.integer(n_rows, "eye", "n_rows")
    n_cols = n_rows if n_cols is None else A.integer(n_cols, "eye", "n_cols")
    if n_rows < 0 or n_cols < 0:
        raise ValueError(f"eye: sizes must be non-negative, got {n_rows} x {n_cols}")
    return _create(
        "eye", n_rows, n_cols, A.integer(k, "eye", "k"), _float_dtype("eye", dtype), device=device
    )


# ---------------------------------------------------------------- random


def _random(name: str, shape: tuple, dtype: DTypeLike, device: DeviceLike) -> Tensor:
    dtype = _float_dtype(name, dtype)
    if dtype.kind != "f":
        raise TypeError(f"{name}: needs a floating dtype, got {dtype}")
    shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    return _create(name, A.sizes(shape, name, "shape"), dtype, random.generator(), device=device)


@_requires_grad_option
def rand(*shape: int, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """Uniform samples in [0, 1): ``lm.rand(2, 3)`` or ``lm.rand((2, 3))``."""
    return _random("rand", shape, dtype, device)


@_requires_grad_option
def randn(*shape: int, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """Standard normal samples: ``lm.randn(2, 3)`` or ``lm.randn((2, 3))``."""
    return _random("randn", shape, dtype, device)


# ---------------------------------------------------------------- manipulation


def broadcast_arrays(*arrays: Tensor) -> list[Tensor]:
    """Views of the tensors broadcast to their common shape."""
    for i, a in enumerate(arrays):
        A.tensor(a, "broadcast_arrays", f"arrays[{i}]")
    if not arrays:
        return []
    shape = broadcast_shapes("broadcast_arrays", *(a.shape for a in arrays))
    return [OPERATORS["broadcast_to"](a, shape) for a in arrays]


@A.checked
def unstack(x: Tensor, /, *, axis: int = 0) -> tuple[Tensor, ...]:
    """The slices of x along axis, as a tuple of views."""
    A.tensor(x, "unstack", "x")
    axis = A.axis(axis, "unstack", "axis", x.ndim)
    if x.shape[axis] == 0:
        return ()
    squeeze = OPERATORS["squeeze"]
    return tuple(squeeze(p, (axis,)) for p in OPERATORS["split"](x, 1, axis))
