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
from . import keys, random, reference
from .devices import Device
from .meta import broadcast_shapes, check_cast
from .schema import OPERATORS
from .tensor import Tensor, expose

__all__ = [
    "__array_namespace_info__",
    "arange",
    "asarray",
    "astype",
    "broadcast_arrays",
    "count_nonzero",
    "diff",
    "empty",
    "empty_like",
    "eye",
    "from_dlpack",
    "full",
    "full_like",
    "linspace",
    "meshgrid",
    "moveaxis",
    "ones",
    "ones_like",
    "rand",
    "randn",
    "repeat",
    "roll",
    "take",
    "take_along_axis",
    "tile",
    "tril",
    "triu",
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


def construct(name: str, *args: Any, device: DeviceLike = None) -> Tensor:
    """The creation operator ``name`` on ``device``, its arguments as its schema takes
    them: no argument checks (callers inside lamina pass checked values)."""
    op = OPERATORS[name]
    where = "cpu" if device is None else A.device(device, name, "device")
    ks = keys.device_key(where)
    if reference.modes_active:  # Note [Modes]
        ks = reference.with_modes(ks)
    ks &= op.mask
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
        _check_complex_cast("asarray", obj.dtype, dtype)
        return OPERATORS["astype"](obj, dtype, True)
    if copy is False and not isinstance(obj, np.ndarray) and not hasattr(obj, "__dlpack__"):
        raise ValueError("asarray: copy=False needs an object that exposes its buffer")
    source = getattr(obj, "dtype", None)  # an ndarray or NumPy scalar (lists raise)
    if dtype is not None and isinstance(source, np.dtype):
        if source.kind == "c":  # NumPy would only warn
            _check_complex_cast("asarray", D.from_numpy(source), dtype)
        check_cast("asarray", np.asarray(obj), dtype)  # NumPy's cast gives garbage for NaN
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
    D.from_numpy(data.dtype)  # TypeError for unsupported dtypes (strings, objects, ...)
    python_floats = isinstance(obj, (list, tuple, float, complex)) and not isinstance(
        obj, np.generic
    )
    if dtype is None and python_floats and data.dtype.kind in "fc":
        # Python floats take the default dtype (Note [Default dtype]), NumPy's own keep theirs
        default = D.default_float if data.dtype.kind == "f" else D.default_complex
        data = data.astype(default.np, copy=False)
    if builtins.any(s % data.itemsize for s in data.strides) or not data.dtype.isnative:
        data = np.ascontiguousarray(data, data.dtype.newbyteorder("="))
    if (
        copy is False
        and isinstance(obj, np.ndarray)
        and data.size
        and not np.shares_memory(data, obj)
    ):
        raise ValueError("asarray: copy=False, but the conversion needs a copy")
    if data is obj or data.base is not None:  # the caller's memory (Note [Sealed storages])
        expose(data)
    return construct("from_host", data, D.from_numpy(data.dtype), device=device)


@A.checked
def from_dlpack(x: Any, /, *, device: DeviceLike = None, copy: bool | None = None) -> Tensor:
    """A tensor sharing the memory of an object with ``__dlpack__`` (DLPack 2023.12:
    ``copy=True`` always copies, ``False`` never does, ``None`` only when it must;
    ``device`` places the result, on the CPU by default). Zero-size arrays are
    shared too; a dtype lamina lacks (bfloat16, float16, ...) is a TypeError."""
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"from_dlpack: expected an object with __dlpack__, got {type(x).__name__}")
    if device is not None:
        device = A.device(device, "from_dlpack", "device")
    try:
        data = _from_dlpack_on_cpu(x, copy)
    except BufferError as exc:  # the producer cannot export (its device, copy=False, ...)
        raise BufferError(f"from_dlpack: cannot import {type(x).__name__}: {exc}") from None
    except (
        RuntimeError,
        TypeError,
        ValueError,
    ) as exc:  # RuntimeError: NumPy's "Unsupported dtype in DLTensor"
        supported = ", ".join(d.name for d in D.ALL)
        raise TypeError(
            f"from_dlpack: cannot import {type(x).__name__} ({exc}); lamina supports "
            f"{supported} on the CPU"
        ) from None
    try:
        D.from_numpy(data.dtype)
    except TypeError as exc:
        raise TypeError(f"from_dlpack: {exc}") from None
    if device is not None and device != "cpu":
        if copy is False:
            raise ValueError(f"from_dlpack: moving to {device} needs a copy, but copy=False")
        return asarray(data, device=device)
    expose(data)  # the producer's memory (Note [Sealed storages])
    return construct("from_host", data, D.from_numpy(data.dtype))


def _from_dlpack_on_cpu(x: Any, copy: bool | None) -> np.ndarray:
    """``x`` as a NumPy array through DLPack: shared where the producer's memory is on
    the CPU; else (its ``BufferError``), and unless ``copy=False``, a copy the producer
    makes on the CPU when asked for it (the 2023.12 protocol's ``dl_device``)."""
    try:
        return np.from_dlpack(x, copy=copy)  # the producer copies when copy=True
    except BufferError:
        if copy is False:
            raise
        return np.from_dlpack(x, device="cpu", copy=copy)


@A.checked
def astype(
    x: Tensor, dtype: DTypeLike, /, *, copy: bool = True, device: DeviceLike = None
) -> Tensor:
    """x's values in ``dtype`` (and on ``device``); ``copy=False`` returns x itself
    when nothing needs to change."""
    A.tensor(x, "astype", "x")
    dtype = A.dtype(dtype, "astype", "dtype")
    _check_complex_cast("astype", x.dtype, dtype)
    if device is not None and device != x.device:
        x, copy = x.to_device(device), False  # a move is a copy already
    return OPERATORS["astype"](x, dtype, A.boolean(copy, "astype", "copy"))


def _check_complex_cast(fn: str, source: D.DType, dtype: D.DType) -> None:
    """Array API: a complex tensor does not cast to a real dtype (which part would it
    keep?); to bool it does (0 + 0j is False)."""
    if source.kind == "c" and dtype.kind not in "cb":
        raise TypeError(
            f"{fn}: casting {source} to {dtype} would drop the imaginary parts; take "
            "real(x) or imag(x) first"
        )


# ---------------------------------------------------------------- filled


@_requires_grad_option
@A.checked
def empty(shape: ShapeLike, *, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """A tensor of ``shape`` with uninitialized values (default dtype: get_default_dtype())."""
    return construct(
        "empty", A.shape(shape, "empty", "shape"), _float_dtype("empty", dtype), device=device
    )


@_requires_grad_option
@A.checked
def zeros(shape: ShapeLike, *, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """A tensor of ``shape`` filled with 0 (default dtype: get_default_dtype())."""
    return full(shape, 0, dtype=_float_dtype("zeros", dtype), device=device)


@_requires_grad_option
@A.checked
def ones(shape: ShapeLike, *, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """A tensor of ``shape`` filled with 1 (default dtype: get_default_dtype())."""
    return full(shape, 1, dtype=_float_dtype("ones", dtype), device=device)


def _default_of_kind(kind: str) -> D.DType:
    return {"b": D.bool_, "i": D.default_int, "f": D.default_float, "c": D.default_complex}[kind]


@_requires_grad_option
@A.checked
def full(
    shape: ShapeLike,
    fill_value: bool | int | float | complex,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
) -> Tensor:
    """A tensor of ``shape`` filled with ``fill_value`` (the dtype follows its kind:
    bool, int64, the default float or complex dtype, unless given)."""
    fill_value = _python_scalar(fill_value)
    if not isinstance(fill_value, D.PY_SCALAR_TYPES):
        raise TypeError(
            "full: fill_value must be a bool, int, float or complex, got "
            f"{type(fill_value).__name__}"
        )
    kind = D.weak_kind(fill_value)
    dtype = _default_of_kind(kind) if dtype is None else A.dtype(dtype, "full", "dtype")
    if kind == "c" and dtype.kind != "c":
        raise TypeError(f"full: a complex fill_value needs a complex dtype, got {dtype}")
    if not isinstance(fill_value, bool) and dtype.kind in "iu":
        if isinstance(fill_value, float) and not math.isfinite(fill_value):
            raise ValueError(f"full: cannot convert float {fill_value} to {dtype.name}")
        info = np.iinfo(dtype.np)  # a float truncates toward zero, as in NumPy
        if not info.min <= int(fill_value) <= info.max:
            raise OverflowError(f"full: fill value {fill_value} is out of bounds for {dtype}")
    return construct("full", A.shape(shape, "full", "shape"), fill_value, dtype, device=device)


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
    fill_value: bool | int | float | complex,
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
    dtype = A.dtype(dtype, "arange", "dtype")
    if dtype.kind == "c":
        raise TypeError(f"arange: dtype must be real-valued, got {dtype} (use linspace)")
    return construct("arange", start, stop, step, dtype, device=device)


@_requires_grad_option
@A.checked
def linspace(
    start: int | float | complex,
    stop: int | float | complex,
    /,
    num: int,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    endpoint: bool = True,
) -> Tensor:
    """``num`` evenly spaced values from start to stop (included unless endpoint=False);
    complex bounds give the default complex dtype."""
    num = A.integer(num, "linspace", "num")
    if num < 0:
        raise ValueError(f"linspace: num must be non-negative, got {num}")
    start, stop = _python_scalar(start), _python_scalar(stop)
    for name, v in (("start", start), ("stop", stop)):
        if isinstance(v, bool) or not isinstance(v, (int, float, complex)):
            raise TypeError(f"linspace: {name} must be a real or complex number, got {v!r}")
    bounds_complex = isinstance(start, complex) or isinstance(stop, complex)
    if dtype is None:
        dtype = D.default_complex if bounds_complex else D.default_float
    dtype = A.dtype(dtype, "linspace", "dtype")
    if bounds_complex and dtype.kind != "c":
        raise TypeError(f"linspace: complex bounds need a complex dtype, got {dtype}")
    return construct(
        "linspace",
        start,
        stop,
        num,
        dtype,
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
    return construct(
        "eye", n_rows, n_cols, A.integer(k, "eye", "k"), _float_dtype("eye", dtype), device=device
    )


# ---------------------------------------------------------------- random


def _random(
    name: str, shape: tuple, dtype: DTypeLike, device: DeviceLike, generator: Any
) -> Tensor:
    dtype = _float_dtype(name, dtype)
    if dtype.kind != "f":
        raise TypeError(f"{name}: needs a floating dtype, got {dtype}")
    shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    stream = random.generator(generator)  # the stream is an explicit input of the operator
    return construct(name, A.sizes(shape, name, "shape"), dtype, stream, device=device)


@_requires_grad_option
def rand(
    *shape: int, generator: Any = None, dtype: DTypeLike = None, device: DeviceLike = None
) -> Tensor:
    """Uniform samples in [0, 1): ``lm.rand(2, 3)`` or ``lm.rand((2, 3))``; from
    ``generator`` (a ``lm.Generator``) or the default stream."""
    return _random("rand", shape, dtype, device, generator)


@_requires_grad_option
def randn(
    *shape: int, generator: Any = None, dtype: DTypeLike = None, device: DeviceLike = None
) -> Tensor:
    """Standard normal samples: ``lm.randn(2, 3)`` or ``lm.randn((2, 3))``; from
    ``generator`` (a ``lm.Generator``) or the default stream."""
    return _random("randn", shape, dtype, device, generator)


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


# ---------------------------------------------------------------- Array API 2024.12
# (issue 15) functions the standard defines that are compositions of operators: they
# run on every device and are differentiable through the operators they call.


def _op(name: str) -> Any:
    return OPERATORS[name]


def _axes_tuple(value: Any, fn: str, name: str, ndim: int) -> tuple[int, ...]:
    """An int or a tuple of ints as distinct non-negative axes, in the given order."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    found = tuple(A.axis(a, fn, name, ndim) for a in items)
    if len(set(found)) != len(found):
        raise ValueError(f"{fn}: repeated axis in {name}={value!r}")
    return found


def _index_tensor(values: np.ndarray, like: Tensor) -> Tensor:
    return asarray(np.asarray(values, np.int64), device=like.device)


def meshgrid(*arrays: Tensor, indexing: str = "xy") -> list[Tensor]:
    """Coordinate grids of 1-D tensors: result i varies along axis i (``"ij"``), or
    with the first two axes swapped (``"xy"``, the default, as in NumPy)."""
    for i, a in enumerate(arrays):
        A.tensor(a, "meshgrid", f"arrays[{i}]")
        if a.ndim != 1:
            raise ValueError(f"meshgrid: arrays[{i}] must be 1-D, got shape {a.shape}")
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    if len({a.dtype for a in arrays}) > 1:
        raise TypeError(
            "meshgrid: the arrays must have one dtype, got "
            + ", ".join(str(a.dtype) for a in arrays)
        )
    n = len(arrays)
    place = list(range(n))
    if indexing == "xy" and n >= 2:
        place[0], place[1] = 1, 0
    shape = [1] * n
    for a, at in zip(arrays, place):
        shape[at] = a.shape[0]
    grids = []
    for a, at in zip(arrays, place):
        one = [1] * n
        one[at] = a.shape[0]
        grids.append(_op("broadcast_to")(_op("reshape")(a, tuple(one), None), tuple(shape)))
    return grids


def _triangle(fn: str, x: Tensor, k: int, lower: bool) -> Tensor:
    A.tensor(x, fn, "x")
    k = A.integer(k, fn, "k")
    if x.ndim < 2:
        raise ValueError(f"{fn}: needs at least 2 dimensions, got shape {x.shape}")
    m, n = x.shape[-2:]
    rows = np.arange(m)[:, None]
    cols = np.arange(n)[None, :]
    keep = cols - rows <= k if lower else cols - rows >= k
    zero = False if x.dtype.kind == "b" else 0
    return _op("where")(asarray(keep, device=x.device), x, zero)


def tril(x: Tensor, /, *, k: int = 0) -> Tensor:
    """x with the elements above the k-th diagonal of its last two axes zeroed."""
    return _triangle("tril", x, k, True)


def triu(x: Tensor, /, *, k: int = 0) -> Tensor:
    """x with the elements below the k-th diagonal of its last two axes zeroed."""
    return _triangle("triu", x, k, False)


def take(x: Tensor, indices: Tensor, /, *, axis: int | None = None) -> Tensor:
    """The elements of x at ``indices`` (a 1-D integer tensor) along axis (optional for
    1-D x); negative indices count from the end."""
    A.tensor(x, "take", "x")
    A.tensor(indices, "take", "indices")
    if indices.dtype.kind not in "iu" or indices.ndim != 1:
        raise TypeError(
            f"take: indices must be a 1-D integer tensor, got {indices.dtype} of shape "
            f"{indices.shape}"
        )
    if axis is None:
        if x.ndim != 1:
            raise ValueError(f"take: axis is required for a {x.ndim}-D tensor")
        axis = 0
    axis = A.axis(axis, "take", "axis", x.ndim)
    _check_indices("take", indices, x.shape[axis], axis)
    return x[(slice(None),) * axis + (indices,)]


def _check_indices(fn: str, indices: Tensor, n: int, axis: int) -> None:
    """Every index in [-n, n): Numba kernels do not bounds-check, and a flat index
    built from a wrong one could land on another element."""
    if indices.size:
        lo, hi = (
            int(_op("min")(indices, tuple(range(indices.ndim)), False)),
            int(_op("max")(indices, tuple(range(indices.ndim)), False)),
        )
        if lo < -n or hi >= n:
            raise IndexError(
                f"{fn}: index {lo if lo < -n else hi} is out of bounds for axis {axis} of size {n}"
            )


def take_along_axis(x: Tensor, indices: Tensor, /, *, axis: int = -1) -> Tensor:
    """The elements of x at ``indices`` along axis: indices has x's number of
    dimensions and broadcasts with x on the others (argsort's result, for example)."""
    A.tensor(x, "take_along_axis", "x")
    A.tensor(indices, "take_along_axis", "indices")
    if indices.dtype.kind not in "iu":
        raise TypeError(f"take_along_axis: indices must be integers, got {indices.dtype}")
    if indices.ndim != x.ndim:
        raise ValueError(
            f"take_along_axis: indices must have x's {x.ndim} dimensions, got shape {indices.shape}"
        )
    axis = A.axis(axis, "take_along_axis", "axis", x.ndim)
    _check_indices("take_along_axis", indices, x.shape[axis], axis)
    others = [s for d, s in enumerate(x.shape) if d != axis]
    broadcast_shapes(
        "take_along_axis", tuple(others), tuple(s for d, s in enumerate(indices.shape) if d != axis)
    )
    key = []
    for d in range(x.ndim):
        if d == axis:
            key.append(indices)
        else:
            shape = [1] * x.ndim
            shape[d] = x.shape[d]
            key.append(_index_tensor(np.arange(x.shape[d]).reshape(shape), x))
    return x[tuple(key)]


def moveaxis(
    x: Tensor, source: int | tuple[int, ...], destination: int | tuple[int, ...], /
) -> Tensor:
    """A view of x with axes ``source`` moved to positions ``destination``."""
    A.tensor(x, "moveaxis", "x")
    src = _axes_tuple(source, "moveaxis", "source", x.ndim)
    dst = _axes_tuple(destination, "moveaxis", "destination", x.ndim)
    if len(src) != len(dst):
        raise ValueError(
            f"moveaxis: source {source!r} and destination {destination!r} differ in length"
        )
    order = [d for d in range(x.ndim) if d not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return _op("permute_dims")(x, tuple(order))


def repeat(x: Tensor, repeats: int | Tensor, /, *, axis: int | None = None) -> Tensor:
    """Each element of x repeated ``repeats`` times along axis (x flattened when axis
    is None); repeats is an int or a 1-D integer tensor of one count per element."""
    A.tensor(x, "repeat", "x")
    if axis is None:
        x, axis = _op("reshape")(x, (x.size,), None), 0
    axis = A.axis(axis, "repeat", "axis", x.ndim)
    n = x.shape[axis]
    if isinstance(repeats, Tensor):
        if repeats.dtype.kind not in "iu" or repeats.ndim != 1 or repeats.shape[0] not in (1, n):
            raise ValueError(
                f"repeat: repeats must be a 1-D integer tensor of size 1 or {n}, got "
                f"{repeats.dtype} of shape {repeats.shape}"
            )
        counts = repeats._host().astype(np.int64)
    else:
        counts = np.array([A.integer(repeats, "repeat", "repeats")])
    if (counts < 0).any():
        raise ValueError(f"repeat: repeats must be non-negative, got {counts.min()}")
    index = np.repeat(np.arange(n), np.broadcast_to(counts, (n,)))
    return x[(slice(None),) * axis + (_index_tensor(index, x),)]


def roll(
    x: Tensor,
    /,
    shift: int | tuple[int, ...],
    *,
    axis: int | tuple[int, ...] | None = None,
) -> Tensor:
    """x's elements shifted by ``shift`` along axis (of the flattened tensor when axis
    is None), wrapping around; tuples shift several axes."""
    A.tensor(x, "roll", "x")
    if axis is None:
        flat = _op("reshape")(x, (x.size,), None)
        return _op("reshape")(roll(flat, shift, axis=0), x.shape, None)
    axes = _axes_tuple(axis, "roll", "axis", x.ndim) if isinstance(axis, (tuple, list)) else None
    axes = axes if axes is not None else (A.axis(axis, "roll", "axis", x.ndim),)
    shifts = shift if isinstance(shift, (tuple, list)) else (shift,) * len(axes)
    if len(shifts) != len(axes):
        raise ValueError(f"roll: shift {shift!r} and axis {axis!r} differ in length")
    total = {}
    for s, a in zip(shifts, axes):
        total[a] = total.get(a, 0) + A.integer(s, "roll", "shift")
    for a, s in total.items():
        n = x.shape[a]
        s = s % n if n else 0
        if s:
            before = (slice(None),) * a
            x = _op("concat")(
                [x[before + (slice(n - s, None),)], x[before + (slice(0, n - s),)]], a
            )
    return x


def tile(x: Tensor, repetitions: tuple[int, ...], /) -> Tensor:
    """x repeated ``repetitions[i]`` times along each axis i (the shorter of x's shape
    and repetitions is padded with leading ones)."""
    A.tensor(x, "tile", "x")
    reps = A.shape(repetitions, "tile", "repetitions")
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: repetitions must be non-negative, got {reps}")
    ndim = max(x.ndim, len(reps))
    reps = (1,) * (ndim - len(reps)) + reps
    shape = (1,) * (ndim - x.ndim) + x.shape
    spread = tuple(v for s in shape for v in (1, s))
    wide = tuple(v for r, s in zip(reps, shape) for v in (r, s))
    grown = _op("broadcast_to")(_op("reshape")(x, spread, None), wide)
    return _op("reshape")(grown, tuple(r * s for r, s in zip(reps, shape)), None)


def count_nonzero(
    x: Tensor, /, *, axis: int | tuple[int, ...] | None = None, keepdims: bool = False
) -> Tensor:
    """The number of nonzero elements over the given axes (every axis by default)."""
    A.tensor(x, "count_nonzero", "x")
    axes = A.axes(axis, "count_nonzero", "axis", x.ndim)
    keepdims = A.boolean(keepdims, "count_nonzero", "keepdims")
    return _op("sum")(_op("astype")(x, D.bool_, False), axes, D.int64, keepdims)


def diff(
    x: Tensor,
    /,
    *,
    axis: int = -1,
    n: int = 1,
    prepend: Tensor | None = None,
    append: Tensor | None = None,
) -> Tensor:
    """The n-th forward difference along axis, ``x[i + 1] - x[i]`` applied n times
    (``!=`` for bool), after joining prepend and append to x along axis."""
    A.tensor(x, "diff", "x")
    if x.ndim == 0:
        raise ValueError("diff: needs at least 1 dimension, got a 0-d tensor")
    axis = A.axis(axis, "diff", "axis", x.ndim)
    n = A.integer(n, "diff", "n")
    if n < 0:
        raise ValueError(f"diff: n must be non-negative, got {n}")
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        x = _op("concat")([A.tensor(p, "diff", "prepend/append") for p in parts], axis)
    before = (slice(None),) * axis
    step = _op("not_equal") if x.dtype.kind == "b" else _op("subtract")
    for _ in range(n):
        if x.shape[axis] == 0:
            break
        x = step(x[before + (slice(1, None),)], x[before + (slice(None, -1),)])
    return x


# ---------------------------------------------------------------- inspection


class ArrayNamespaceInfo:
    """What ``__array_namespace_info__()`` returns (Array API inspection utilities)."""

    def capabilities(self) -> dict[str, Any]:
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self) -> Device:
        return Device("cpu")

    def devices(self) -> list[Device]:
        """Every registered device, those of third-party plugins included."""
        return [Device(name) for name in keys.devices()]

    def default_dtypes(self, *, device: DeviceLike = None) -> dict[str, D.DType]:
        if device is not None:
            A.device(device, "default_dtypes", "device")
        return {
            "real floating": D.default_float,
            "complex floating": D.default_complex,
            "integral": D.default_int,
            "indexing": D.int64,
        }

    def dtypes(
        self, *, device: DeviceLike = None, kind: str | tuple[str, ...] | None = None
    ) -> dict[str, D.DType]:
        if device is not None:
            A.device(device, "dtypes", "device")
        return {d.name: d for d in D.ALL if kind is None or D.isdtype(d, kind)}


def __array_namespace_info__() -> ArrayNamespaceInfo:
    """The Array API inspection namespace: capabilities, devices and dtypes."""
    return ArrayNamespaceInfo()
