"""PyTorch's spelling: Tensor methods and public names for scripts written for torch.

Note [Two spellings]: lamina's functions follow the Array API (``axis=``, ``keepdims=``,
a tensor result); a script written for PyTorch uses ``dim=``, ``keepdim=`` and methods.
Both work, and the spelling says which semantics a call gets:

* every Tensor method here is PyTorch's: ``x.sum(dim=1)``, ``x.max(1)`` is a
  ``(values, indices)`` pair, ``x.std()`` divides by n - 1, ``x.view(2, -1)``;
* a public function takes ``dim=`` / ``keepdim=`` wherever it takes ``axis=`` /
  ``keepdims=`` (extra keyword-only arguments, which the Array API allows). Where the
  two libraries return different things for the same call (``max``, ``min``, ``sort``
  with a ``dim``; ``std`` and ``var``), ``dim=`` gets PyTorch's result, ``axis=`` the
  Array API's;
* ``x.size`` is the element count (Array API) and, called, PyTorch's ``size()``
  (``Note [Callable size]``).

Nothing is computed here: each method binds one dispatched operator or public
function, so it is differentiable exactly where that operator is.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple

from . import arguments as A
from . import composites as C
from . import dtypes as D
from . import keys, ops, random
from .bindings import TORCH_ALIASES, with_aliases
from .devices import Device
from .schema import OPERATORS
from .tensor import Tensor, upper

# ---------------------------------------------------------------- results and sizes


class Size(tuple):
    """A shape, as PyTorch's ``torch.Size``: a tuple with ``numel()``."""

    def numel(self) -> int:
        return math.prod(self)


class _SizeInt(int):
    """Note [Callable size]: ``x.size`` is the Array API's element count, an int; called
    it is PyTorch's ``size()``: ``x.size()`` the shape, ``x.size(d)`` one dimension."""

    _shape: tuple[int, ...]

    def __call__(self, dim: int | None = None) -> Size | int:
        if dim is None:
            return Size(self._shape)
        return self._shape[_dim(dim, len(self._shape), "size")]


def _size(t: Tensor) -> _SizeInt:
    n = _SizeInt(math.prod(t._shape))
    n._shape = t._shape
    return n


class values_indices(NamedTuple):
    """PyTorch's ``(values, indices)`` result of ``max``, ``min``, ``sort``, ``topk``."""

    values: Tensor
    indices: Tensor


# ---------------------------------------------------------------- argument spelling


def _dim(dim: Any, ndim: int, fn: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{fn}: dim must be an int, got {type(dim).__name__}")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"{fn}: dim {dim} is out of range for a {ndim}-D tensor")
    return dim % max(ndim, 1)


def _axis(fn: str, dim: Any, axis: Any, keepdim: Any = None, keepdims: Any = False) -> tuple:
    """``axis`` and ``keepdims`` from either spelling; both spellings at once is an error."""
    if dim is not None:
        if axis is not None:
            raise TypeError(f"{fn}: got both dim= and axis=; pass one")
        axis = tuple(dim) if isinstance(dim, list) else dim
    if keepdim is not None:
        if keepdims:
            raise TypeError(f"{fn}: got both keepdim= and keepdims=; pass one")
        keepdims = keepdim
    return axis, keepdims


def _shape(args: tuple, fn: str) -> tuple:
    """PyTorch's shape arguments: ``f(2, 3)``, ``f((2, 3))`` or ``f([2, 3])``."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    for s in args:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"{fn}: sizes must be ints, got {type(s).__name__}")
    return tuple(args)


def with_dim(fn: Callable) -> Callable:
    """A public function that is not an operator (``roll``, ``take``, ...), also taking
    PyTorch's ``dim=`` / ``keepdim=`` as the operators' bindings do."""
    signature = inspect.signature(fn)
    aliases = {
        a: n
        for a, n in TORCH_ALIASES.items()
        if n in signature.parameters and signature.parameters[n].default is not inspect._empty
    }

    @functools.wraps(fn)
    def call(*args: Any, dim: Any = None, keepdim: Any = None, **kwargs: Any) -> Any:
        for alias, value in (("dim", dim), ("keepdim", keepdim)):
            if value is not None:
                if alias not in aliases:
                    raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {alias!r}")
                name = aliases[alias]
                if kwargs.get(name) is not None:
                    raise TypeError(f"{fn.__name__}: got both {alias}= and {name}=; pass one")
                kwargs[name] = tuple(value) if isinstance(value, list) else value
        return fn(*args, **kwargs)

    call.__signature__ = with_aliases(signature, aliases)
    return call


# ---------------------------------------------------------------- PyTorch-only semantics


class _Default(float):
    """A default that reads as the Array API's (``correction=0.0``) but can be told from
    one a caller passed, so that ``dim=`` can give PyTorch's default instead."""


_NO_CORRECTION = _Default(0.0)


def _reduce_with_index(name: str, arg: str) -> Callable:
    """``max`` / ``min``: the Array API's reduction; with a ``dim`` (``dim=`` or PyTorch's
    positional ``max(x, 1)``) PyTorch's (values, indices); with a tensor
    (``max(x, y)``) PyTorch's elementwise ``maximum`` / ``minimum``."""
    elementwise = "maximum" if name == "max" else "minimum"

    def reduce(x, /, *torch_args, axis=None, keepdims=False, dim=None, keepdim=None):
        if torch_args:
            if isinstance(torch_args[0], Tensor):
                return getattr(ops, elementwise)(x, torch_args[0])
            dim, keepdim = (*torch_args, keepdim)[:2]
        if dim is None:
            return getattr(ops, name)(x, axis=axis, keepdims=bool(keepdim or keepdims))
        axis, keepdims = _axis(name, dim, axis, keepdim, keepdims)
        return values_indices(
            getattr(ops, name)(x, axis=axis, keepdims=keepdims),
            getattr(ops, arg)(x, axis=axis, keepdims=keepdims),
        )

    reduce.__name__ = reduce.__qualname__ = name
    reduce.__doc__ = _reduce_with_index.__doc__
    return reduce


def _spread(name: str) -> Callable:
    """``std`` / ``var``: the Array API's (``correction`` defaults to 0); with ``dim=`` or
    ``unbiased=`` PyTorch's (``correction`` defaults to 1)."""

    def spread(
        x, /, *, axis=None, correction=_NO_CORRECTION, keepdims=False, dim=None, keepdim=None,
        unbiased=None,
    ):  # fmt: skip
        torch_style = dim is not None or unbiased is not None or keepdim is not None
        if correction is _NO_CORRECTION:
            correction = (1.0 if unbiased in (None, True) else 0.0) if torch_style else 0.0
        elif unbiased is not None:
            raise TypeError(f"{name}: got both unbiased= and correction=; pass one")
        axis, keepdims = _axis(name, dim, axis, keepdim, keepdims)
        return getattr(ops, name)(x, axis=axis, correction=correction, keepdims=keepdims)

    spread.__name__ = spread.__qualname__ = name
    spread.__doc__ = _spread.__doc__
    return spread


def _sort(x, /, *, axis=-1, descending=False, stable=True, dim=None):
    """The Array API's ``sort`` (the sorted values); with ``dim=`` PyTorch's (values,
    indices)."""
    if dim is None:
        return ops.sort(x, axis=axis, descending=descending, stable=stable)
    indices = ops.argsort(x, axis=dim, descending=descending, stable=True)
    return values_indices(ops.take_along_axis(x, indices, axis=dim), indices)


def _squeeze(x, dim=None):
    """PyTorch's ``x.squeeze(dim)``: with no dim every size-1 dimension goes; dimensions
    of other sizes stay (the Array API's ``squeeze`` raises for them)."""
    dims = range(x.ndim) if dim is None else _dims_tuple(dim, x.ndim, "squeeze")
    return ops.squeeze(x, axis=tuple(d for d in dims if x.shape[d] == 1))


def _dims_tuple(dim: Any, ndim: int, fn: str) -> tuple[int, ...]:
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    return tuple(_dim(d, ndim, fn) for d in dims)


# ---------------------------------------------------------------- PyTorch's functions


def cat(tensors, dim=0, *, axis=None):
    """``torch.cat``: the tensors joined along ``dim`` (the Array API's ``concat``)."""
    return ops.concat(list(tensors), axis=dim if axis is None else axis)


def tensor(data, *, dtype=None, device=None, requires_grad=False):
    """``torch.tensor``: a new tensor with a copy of ``data`` (Python floats take the
    default dtype, NumPy arrays keep theirs)."""
    if isinstance(data, Tensor):
        data = data.detach()
    return C.asarray(data, dtype=dtype, device=device, copy=True, requires_grad=requires_grad)


def from_numpy(array):
    """``torch.from_numpy``: a tensor that shares the NumPy array's memory and dtype."""
    import numpy as np

    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a NumPy array, got {type(array).__name__}")
    return C.asarray(array, copy=False)


def as_tensor(data, dtype=None, device=None):
    """``torch.as_tensor``: ``data`` as a tensor, sharing memory where it can."""
    return C.asarray(data, dtype=dtype, device=device)


def randint(low, high=None, size=None, *, generator=None, dtype=None, device=None):
    """``torch.randint``: integers uniform in [low, high) (``randint(high, size)`` too)."""
    if size is None:
        if high is None or not isinstance(high, (tuple, list)):
            raise TypeError("randint: expected randint(low, high, size) or randint(high, size)")
        low, high, size = 0, low, high
    elif high is None:
        low, high = 0, low
    size = _shape((size,) if isinstance(size, int) else (tuple(size),), "randint")
    if high <= low:
        raise ValueError(f"randint: high ({high}) must be greater than low ({low})")
    dtype = D.int64 if dtype is None else D.as_dtype(dtype)
    values = random.generator(generator).integers(low, high, size)
    return C.asarray(values, dtype=dtype, device=device)


def randperm(n, *, generator=None, dtype=None, device=None):
    """``torch.randperm``: a random permutation of 0 .. n - 1."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"randperm: n must be a non-negative int, got {n!r}")
    dtype = D.int64 if dtype is None else D.as_dtype(dtype)
    return C.asarray(random.generator(generator).permutation(n), dtype=dtype, device=device)


def rand_like(x, *, dtype=None, device=None, generator=None):
    return C.rand(x.shape, dtype=dtype or x.dtype, device=device or x.device, generator=generator)


def randn_like(x, *, dtype=None, device=None, generator=None):
    return C.randn(x.shape, dtype=dtype or x.dtype, device=device or x.device, generator=generator)


def _creation(fn: Callable) -> Callable:
    """``zeros`` / ``ones`` / ``empty``: the Array API's ``f(shape)`` and PyTorch's
    ``f(2, 3)``."""

    @functools.wraps(fn)
    def create(*size, shape=None, dtype=None, device=None, requires_grad=False):
        if shape is None:
            one = len(size) == 1 and not isinstance(size[0], int)
            shape = size[0] if one else _shape(size, name)
        elif size:
            raise TypeError(f"{name}: got sizes and shape=; pass one")
        return fn(shape, dtype=dtype, device=device, requires_grad=requires_grad)

    name = fn.__name__
    return create


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """``torch.isclose``: ``|input - other| <= atol + rtol * |other|`` elementwise
    (equal infinities are close; NaNs only with ``equal_nan``)."""
    close = ops.logical_or(
        ops.less_equal(ops.abs(input - other), atol + rtol * ops.abs(other)),
        ops.equal(input, other),
    )
    if equal_nan:
        close = ops.logical_or(close, ops.logical_and(ops.isnan(input), ops.isnan(other)))
    return close


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """``torch.allclose``: whether every element is ``isclose``, as a Python bool."""
    return builtins.bool(ops.all(isclose(input, other, rtol, atol, equal_nan)))


def is_tensor(obj):
    return isinstance(obj, Tensor)


def numel(x):
    return x.numel()


class device(Device):
    """``torch.device``: ``lm.device("cpu")``; an index (``"cpu:0"``) is accepted for the
    CPU, which has one."""

    __slots__ = ()

    def __init__(self, type: str, index: int | None = None) -> None:
        name, _, idx = str(type).partition(":")
        if (idx or index) and name == "cpu" and int(idx or index) != 0:
            raise ValueError(f"device: the CPU has one index, 0; got {type!r}")
        super().__init__(name)

    @property
    def type(self) -> str:
        return self.name


class inference_mode:
    """``torch.inference_mode``: no gradients are recorded inside (lamina's ``no_grad``),
    as a context manager or a decorator."""

    def __init__(self, mode: bool = True) -> None:
        self._mode = builtins.bool(mode)
        self._grad = upper.autograd.set_grad_enabled(not self._mode)

    def __enter__(self) -> None:
        self._grad.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._grad.__exit__(*exc)

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with inference_mode(self._mode):
                return fn(*args, **kwargs)

        return run


class cuda:
    """``torch.cuda``: lamina runs on the CPU and on devices that plugins add; a GPU
    plugin that names its device "cuda" makes ``is_available()`` true."""

    @staticmethod
    def is_available() -> bool:
        return "cuda" in keys.device_names(-1)

    @staticmethod
    def device_count() -> int:
        return int(cuda.is_available())

    @staticmethod
    def manual_seed(seed: int) -> None:
        """Seeds nothing: no CUDA stream exists here (PyTorch ignores it without a GPU
        too)."""

    manual_seed_all = manual_seed


# ---------------------------------------------------------------- Tensor methods


def _m_view(self, *shape):
    if len(shape) == 1 and isinstance(shape[0], D.DType):
        raise TypeError("view(dtype): reinterpreting memory as another dtype is not supported")
    return ops.reshape(self, _shape(shape, "view"), copy=False)


def _m_reshape(self, *shape):
    return ops.reshape(self, _shape(shape, "reshape"))


def _m_flatten(self, start_dim=0, end_dim=-1):
    nd = builtins.max(self.ndim, 1)
    start, end = _dim(start_dim, nd, "flatten"), _dim(end_dim, nd, "flatten")
    if start > end:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = self.shape
    return ops.reshape(
        self, shape[:start] + (math.prod(shape[start : end + 1]),) + shape[end + 1 :]
    )


def _m_unflatten(self, dim, sizes):
    d = _dim(dim, self.ndim, "unflatten")
    return ops.reshape(self, self.shape[:d] + tuple(sizes) + self.shape[d + 1 :])


def _m_permute(self, *dims):
    return ops.permute_dims(self, _shape(dims, "permute"))


def _m_transpose(self, dim0, dim1):
    order = list(range(self.ndim))
    a, b = _dim(dim0, self.ndim, "transpose"), _dim(dim1, self.ndim, "transpose")
    order[a], order[b] = order[b], order[a]
    return ops.permute_dims(self, tuple(order))


def _m_t(self):
    if self.ndim > 2:
        raise ValueError(f"t() expects a tensor with at most 2 dimensions, got {self.ndim}")
    return self if self.ndim < 2 else ops.matrix_transpose(self)


def _m_expand(self, *sizes):
    sizes = _shape(sizes, "expand")
    lead = len(sizes) - self.ndim
    shape = tuple(self.shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(sizes))
    return ops.broadcast_to(self, shape)


def _m_chunk(self, chunks, dim=0):
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks <= 0:
        raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
    d = _dim(dim, self.ndim, "chunk")
    return ops.split(self, builtins.max(-(-self.shape[d] // chunks), 1), axis=d)


def _m_narrow(self, dim, start, length):
    d = _dim(dim, self.ndim, "narrow")
    if start < 0:
        start += self.shape[d]
    if not 0 <= start <= start + length <= self.shape[d]:
        raise IndexError(f"narrow: [{start}, {start + length}) is outside dimension {d}")
    return self[(slice(None),) * d + (slice(start, start + length),)]


def _m_stride(self, dim=None):
    if not self._ks & keys.CPU or self._ks & keys.SPARSE:
        raise RuntimeError(f"stride(): a tensor on {self.device} has no strides to show")
    strides = tuple(s // self._data.itemsize for s in self._data.strides)
    return strides if dim is None else strides[_dim(dim, self.ndim, "stride")]


def _m_contiguous(self):
    if self._flat is not None:
        return self
    return ops.reshape(ops.reshape(self, (-1,)), self.shape)  # the flattening copies, in order


def _m_to(self, *args, dtype=None, device=None, copy=False, non_blocking=False):
    """PyTorch's ``to``: ``to(device)``, ``to(dtype)``, ``to(device, dtype)``,
    ``to(other_tensor)`` or keywords; ``self`` when nothing changes, unless ``copy``."""
    for a in args:
        if isinstance(a, Tensor):
            dtype, device = a.dtype, a.device
        elif isinstance(a, (str, Device, int, float)):  # a number: a device index
            device = a
        else:
            dtype = D.as_dtype(a)
    if device is not None:
        device = A.device(device, "to", "device")
    out = self if device is None or device == self.device else self.to_device(device)
    if dtype is not None:
        out = C.astype(out, dtype, copy=copy and out is self)
    elif copy and out is self:
        out = ops.asarray(self, copy=True)
    return out


_m_to.__name__ = _m_to.__qualname__ = "to"


def _cast(dtype: D.DType) -> Callable:
    return lambda self: C.astype(self, dtype, copy=False)


def _m_new(fill: Any) -> Callable:
    def new(self, *size, dtype=None, device=None, requires_grad=False):
        return C.full(
            _shape(size, "new_full"),
            fill,
            dtype=self.dtype if dtype is None else dtype,
            device=self.device if device is None else device,
            requires_grad=requires_grad,
        )

    return new


def _m_new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False):
    return C.full(
        _shape((size,), "new_full"),
        fill_value,
        dtype=self.dtype if dtype is None else dtype,
        device=self.device if device is None else device,
        requires_grad=requires_grad,
    )


def _m_new_tensor(self, data, *, dtype=None, device=None, requires_grad=False):
    dtype = self.dtype if dtype is None else dtype
    return tensor(data, dtype=dtype, device=device or self.device, requires_grad=requires_grad)


def _reduction(name: str) -> Callable:
    def reduce(self, dim=None, keepdim=False, *, axis=None, keepdims=None, **kwargs):
        # PyTorch takes NumPy's spellings too: x.amax(axis=1, keepdims=True)
        if axis is not None and dim is not None:
            raise TypeError(f"{name}: got both dim= and axis=")
        dim, keepdim = (dim if axis is None else axis), (keepdim if keepdims is None else keepdims)
        fn = getattr(ops, name)
        return fn(
            self, axis=tuple(dim) if isinstance(dim, list) else dim, keepdims=keepdim, **kwargs
        )

    return reduce


def _m_std(name: str) -> Callable:
    def spread(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        if isinstance(dim, bool):  # x.std(False): PyTorch's unbiased, dim omitted
            dim, unbiased = None, dim
        if correction is None:
            correction = 0.0 if unbiased is False else 1.0
        axis = tuple(dim) if isinstance(dim, list) else dim
        return getattr(ops, name)(self, axis=axis, correction=correction, keepdims=keepdim)

    return spread


def _m_extremum(name: str) -> Callable:
    function = _reduce_with_index(name, "arg" + name)

    def extremum(self, dim=None, keepdim=False):  # dim may be a tensor: x.max(y)
        return function(self) if dim is None else function(self, dim, keepdim)

    return extremum


def _m_sort(self, dim=-1, descending=False, stable=False):
    return _sort(self, descending=descending, dim=dim)


def _m_argsort(self, dim=-1, descending=False, stable=False):
    return ops.argsort(self, axis=dim, descending=descending, stable=True)


def _m_topk(self, k, dim=-1, largest=True, sorted=True):
    d = _dim(dim, self.ndim, "topk")
    if not 0 <= k <= (self.shape[d] if self.ndim else 1):
        raise ValueError(f"topk: k ({k}) is out of range for dimension {d} of shape {self.shape}")
    order = ops.argsort(self, axis=d, descending=largest, stable=True)
    indices = order[(slice(None),) * d + (slice(0, k),)]
    return values_indices(ops.take_along_axis(self, indices, axis=d), indices)


def _m_cum(name: str) -> Callable:
    def cum(self, dim, *, dtype=None):
        return getattr(ops, name)(self, axis=_dim(dim, self.ndim, name), dtype=dtype)

    return cum


def _m_norm(self, p="fro", dim=None, keepdim=False):
    ord_ = 2 if p in ("fro", None) else p
    return upper.namespace.linalg.vector_norm(self, axis=dim, keepdims=keepdim, ord=ord_)


def _m_logsumexp(self, dim, keepdim=False):
    m = ops.max(self.detach(), axis=dim, keepdims=True)
    m = ops.where(ops.isfinite(m), m, 0.0)
    out = ops.log(ops.sum(ops.exp(self - m), axis=dim, keepdims=True)) + m
    return out if keepdim else ops.squeeze(out, axis=_dims_tuple(dim, self.ndim, "logsumexp"))


def _binary_alpha(name: str) -> Callable:
    def binary(self, other, *, alpha=1):
        return getattr(ops, name)(self, other if alpha == 1 else other * alpha)

    return binary


def _m_div(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return ops.divide(self, other)
    if rounding_mode == "floor":
        return ops.floor_divide(self, other)
    if rounding_mode == "trunc":
        q = ops.trunc(ops.divide(self, other))
        return q if self.dtype.kind == "f" else C.astype(q, self.dtype)
    raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")


def _m_clamp(self, min=None, max=None):
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    return ops.clip(self, min, max)


def _m_where(self, condition, other):
    return ops.where(condition, self, other)


def _m_masked_fill(self, mask, value):
    return ops.where(
        mask, C.asarray(value, dtype=self.dtype) if not isinstance(value, Tensor) else value, self
    )


def _scatter_key(self, dim: int, index: Tensor) -> tuple:
    """The advanced-indexing key that PyTorch's gather/scatter along ``dim`` mean: the
    index along ``dim``, positions along every other dimension."""
    d = _dim(dim, self.ndim, "scatter")
    if index.ndim != self.ndim:
        raise ValueError(
            f"scatter/gather: index has {index.ndim} dimensions, the tensor {self.ndim}"
        )
    key = []
    for a, n in enumerate(index.shape):
        if a == d:
            key.append(index)
        else:
            shape = tuple(n if b == a else 1 for b in range(index.ndim))
            key.append(ops.reshape(C.arange(n), shape))
    return tuple(key)


def _m_gather(self, dim, index):
    # not take_along_axis: PyTorch's index may be smaller than the tensor in every dim
    return self[_scatter_key(self, dim, index)]


def _m_scatter(self, dim, index, src=None, *, value=None, reduce=None):
    if reduce is not None:
        raise NotImplementedError("scatter: reduce= is not supported; use scatter_add")
    src = value if src is None else src
    out = ops.asarray(self, copy=True)
    out[_scatter_key(self, dim, index)] = _sources(src, index)
    return out


def _m_scatter_add(self, dim, index, src):
    return OPERATORS["index_add"](self, _scatter_key(self, dim, index), _sources(src, index))


def _sources(src: Any, index: Tensor) -> Any:
    if isinstance(src, Tensor) and src.shape != index.shape:
        src = src[tuple(slice(0, n) for n in index.shape)]
    return src


def _m_index_select(self, dim, index):
    return ops.take(self, index, axis=_dim(dim, self.ndim, "index_select"))


def _m_nonzero(self, *, as_tuple=False):
    found = ops.nonzero(self)
    return found if as_tuple else ops.stack(list(found), axis=1)


def _m_masked_select(self, mask):
    return self[ops.broadcast_to(mask, self.shape)]


def _inplace(method: Callable) -> Callable:
    """PyTorch's ``x.f_(...)``: ``x``'s values replaced by ``x.f(...)``'s, in place."""

    def inplace(self, *args, **kwargs):
        # in a graph, the operator reads a copy: it may save its input for backward,
        # which the write below would otherwise change under it
        source = ops.asarray(self, copy=True) if self.requires_grad else self
        self[...] = method(source, *args, **kwargs)
        return self

    return inplace


def _m_copy_(self, src, non_blocking=False):
    self[...] = (
        src if not isinstance(src, Tensor) or src.device == self.device else src.to(self.device)
    )
    return self


def _m_fill_(self, value):
    self[...] = value
    return self


def _m_uniform_(self, a=0.0, b=1.0, *, generator=None):
    if not a <= b:
        raise ValueError(f"uniform_: a ({a}) must not exceed b ({b})")
    self[...] = C.rand(self.shape, dtype=self.dtype, generator=generator) * (b - a) + a
    return self


def _m_normal_(self, mean=0.0, std=1.0, *, generator=None):
    if not std >= 0:
        raise ValueError(f"normal_: std must be non-negative, got {std}")
    self[...] = C.randn(self.shape, dtype=self.dtype, generator=generator) * std + mean
    return self


def _m_data(self):
    return self.detach()


def _m_set_data(self, value):
    if not isinstance(value, Tensor) or value.shape != self.shape:
        raise ValueError(
            "x.data = value: value must be a tensor of x's shape "
            f"{self.shape}, got {getattr(value, 'shape', type(value).__name__)}"
        )
    with upper.autograd.no_grad():
        self.detach()[...] = value


def _nn(name: str) -> Callable:
    """A method calling ``lamina.nn.functional.name`` (Note [Upper layers])."""

    def method(self, *args, **kwargs):
        return getattr(upper.namespace.nn.functional, name)(self, *args, **kwargs)

    method.__doc__ = f"``x.{name}(...)`` is ``lamina.nn.functional.{name}(x, ...)``."
    return method


def _fn(name: str) -> Callable:
    """A method calling the public function ``name`` with ``self`` first."""

    def method(self, *args, **kwargs):
        return getattr(ops, name)(self, *args, **kwargs)

    method.__doc__ = f"``x.method(...)`` is ``lamina.{name}(x, ...)``."
    return method


_ELEMENTWISE = (
    "abs exp expm1 log log1p log2 log10 sqrt sin cos tan sinh cosh asin acos atan "
    "asinh acosh atanh tanh floor ceil trunc sign square reciprocal logical_not isnan isinf "
    "isfinite signbit conj real imag maximum minimum matmul remainder floor_divide atan2 "
    "logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor logaddexp "
    "hypot copysign"
).split()
_ALIASES = {  # PyTorch's name -> the Array API function it is
    "neg": "negative", "negative": "negative", "mul": "multiply", "multiply": "multiply",
    "true_divide": "divide", "pow": "pow", "eq": "equal", "ne": "not_equal", "lt": "less",
    "le": "less_equal", "gt": "greater", "ge": "greater_equal", "greater": "greater",
    "less": "less", "mm": "matmul", "bmm": "matmul", "arctan2": "atan2",
    "absolute": "abs", "not_equal": "not_equal", "greater_equal": "greater_equal",
    "less_equal": "less_equal", "sgn": "sign", "fix": "trunc", "tensordot": "tensordot",
}  # fmt: skip
_NN = ("relu", "sigmoid", "softmax", "log_softmax", "gelu", "leaky_relu", "dropout")
_REDUCTIONS = ("sum", "mean", "prod", "all", "any", "argmax", "argmin", "count_nonzero")


def _methods() -> dict[str, Any]:
    methods: dict[str, Any] = {name: _fn(name) for name in _ELEMENTWISE}
    methods.update({name: _fn(target) for name, target in _ALIASES.items()})
    methods.update({name: _nn(name) for name in _NN})
    methods.update({name: _reduction(name) for name in _REDUCTIONS})
    methods.update(
        size=property(_size, doc=_SizeInt.__doc__),
        numel=lambda self: math.prod(self._shape),
        nelement=lambda self: math.prod(self._shape),
        dim=lambda self: len(self._shape),
        ndimension=lambda self: len(self._shape),
        element_size=lambda self: self._dtype.np.itemsize,
        is_contiguous=lambda self, memory_format=None: self._flat is not None,
        is_floating_point=lambda self: self._dtype.kind == "f",
        is_complex=lambda self: self._dtype.kind == "c",
        stride=_m_stride,
        view=_m_view,
        view_as=lambda self, other: _m_view(self, other.shape),
        reshape=_m_reshape,
        reshape_as=lambda self, other: ops.reshape(self, other.shape),
        flatten=_m_flatten,
        unflatten=_m_unflatten,
        squeeze=_squeeze,
        unsqueeze=lambda self, dim: ops.expand_dims(self, axis=dim),
        permute=_m_permute,
        transpose=_m_transpose,
        swapaxes=_m_transpose,
        swapdims=_m_transpose,
        t=_m_t,
        contiguous=_m_contiguous,
        expand=_m_expand,
        expand_as=lambda self, other: ops.broadcast_to(self, other.shape),
        repeat=lambda self, *sizes: C.tile(self, _shape(sizes, "repeat")),
        flip=lambda self, *dims: ops.flip(self, axis=_shape(dims, "flip")),
        chunk=_m_chunk,
        split=lambda self, split_size, dim=0: ops.split(self, split_size, axis=dim),
        unbind=lambda self, dim=0: C.unstack(self, axis=dim),
        narrow=_m_narrow,
        clone=lambda self, *, memory_format=None: ops.asarray(self, copy=True),
        to=_m_to,
        type_as=lambda self, other: C.astype(self, other.dtype, copy=False),
        cpu=lambda self: self.to_device("cpu"),
        cuda=lambda self, device=None: self.to_device(device or "cuda"),
        float=_cast(D.float32),
        double=_cast(D.float64),
        long=_cast(D.int64),
        int=_cast(D.int32),
        short=_cast(D.int16),
        char=_cast(D.int8),
        byte=_cast(D.uint8),
        bool=_cast(D.bool_),
        new_zeros=_m_new(0),
        new_ones=_m_new(1),
        new_empty=_m_new(0),
        new_full=_m_new_full,
        new_tensor=_m_new_tensor,
        std=_m_std("std"),
        var=_m_std("var"),
        max=_m_extremum("max"),
        min=_m_extremum("min"),
        amax=_reduction("max"),
        amin=_reduction("min"),
        sort=_m_sort,
        argsort=_m_argsort,
        topk=_m_topk,
        cumsum=_m_cum("cumulative_sum"),
        cumprod=_m_cum("cumulative_prod"),
        norm=_m_norm,
        logsumexp=_m_logsumexp,
        add=_binary_alpha("add"),
        sub=_binary_alpha("subtract"),
        subtract=_binary_alpha("subtract"),
        div=_m_div,
        divide=_m_div,
        round=lambda self, decimals=0: ops.round(self) if decimals == 0 else _round(self, decimals),
        rsqrt=lambda self: ops.reciprocal(ops.sqrt(self)),
        clamp=_m_clamp,
        clip=_m_clamp,
        clamp_min=lambda self, min: ops.clip(self, min, None),
        clamp_max=lambda self, max: ops.clip(self, None, max),
        where=_m_where,
        masked_fill=_m_masked_fill,
        lerp=lambda self, end, weight: self + (end - self) * weight,
        dot=lambda self, other: ops.vecdot(self, other),
        mv=lambda self, vec: ops.matmul(self, vec),
        outer=lambda self, other: ops.multiply(
            ops.reshape(self, (-1, 1)), ops.reshape(other, (1, -1))
        ),
        gather=_m_gather,
        scatter=_m_scatter,
        scatter_add=_m_scatter_add,
        index_select=_m_index_select,
        masked_select=_m_masked_select,
        nonzero=_m_nonzero,
        copy_=_m_copy_,
        fill_=_m_fill_,
        zero_=lambda self: _m_fill_(self, 0),
        uniform_=_m_uniform_,
        normal_=_m_normal_,
        data=property(_m_data, _m_set_data, doc="The tensor without autograd history"),
    )
    for name in (
        "add sub mul div pow clamp clamp_min clamp_max neg abs exp log sqrt sigmoid relu tanh "
        "masked_fill scatter scatter_add floor ceil round trunc reciprocal square sign "
        "lerp remainder"
    ).split():
        methods[name + "_"] = _inplace(methods[name])
        methods[
            name + "_"
        ].__doc__ = f"In place: ``x.{name}_(...)`` writes ``x.{name}(...)`` into x."
    return methods


def _round(x: Tensor, decimals: int) -> Tensor:
    scale = 10.0**decimals
    return ops.round(x * scale) / scale


# ---------------------------------------------------------------- installing

_DTYPE_NAMES = {  # PyTorch's other names of dtypes
    "float": D.float32, "double": D.float64, "long": D.int64, "int": D.int32,
    "short": D.int16, "cfloat": D.complex64, "cdouble": D.complex128,
}  # fmt: skip


def _functions() -> dict[str, Any]:
    """The public names PyTorch has and the Array API lacks, or spells differently."""
    torch_dims = {
        name: with_dim(getattr(ops, name))
        for name in "roll take take_along_axis count_nonzero unstack diff repeat".split()
    }
    methods = _METHODS
    as_function = lambda name: lambda x, *args, **kwargs: methods[name](x, *args, **kwargs)
    return {
        **torch_dims,
        **_DTYPE_NAMES,
        "max": _standing_in(_reduce_with_index("max", "argmax"), "max"),
        "min": _standing_in(_reduce_with_index("min", "argmin"), "min"),
        "std": _standing_in(_spread("std"), "std"),
        "var": _standing_in(_spread("var"), "var"),
        "sort": _standing_in(_sort, "sort"),
        "Size": Size,
        "dtype": D.DType,
        "Generator": random.Generator,
        "default_generator": random.default_generator,
        "manual_seed": random.manual_seed,
        "seed": lambda: random.default_generator.seed(),
        "initial_seed": lambda: random.default_generator.initial_seed(),
        "set_default_dtype": D.set_default_dtype,
        "get_default_dtype": D.get_default_dtype,
        "cat": cat,
        "concatenate": cat,
        "tensor": tensor,
        "from_numpy": from_numpy,
        "as_tensor": as_tensor,
        "randint": randint,
        "randperm": randperm,
        "rand_like": rand_like,
        "randn_like": randn_like,
        "zeros": _creation(C.zeros),
        "ones": _creation(C.ones),
        "empty": _creation(C.empty),
        "is_tensor": is_tensor,
        "isclose": isclose,
        "allclose": allclose,
        "numel": numel,
        "device": device,
        "inference_mode": inference_mode,
        "cuda": cuda,
        **{
            name: as_function(name)
            for name in (
                "clamp transpose unsqueeze flatten permute t chunk unbind narrow gather "
                "scatter scatter_add index_select masked_fill topk cumsum cumprod norm "
                "logsumexp relu sigmoid softmax log_softmax div mul sub neg eq ne lt le gt "
                "ge mm bmm amax amin clone rsqrt dot outer masked_select lerp"
            ).split()
        },
    }


def _standing_in(fn: Callable, name: str) -> Callable:
    """``fn`` as the public ``name``: the operator's documentation, then what PyTorch's
    spelling changes."""
    fn.__module__ = "lamina"
    fn.__doc__ = f"{getattr(ops, name).__doc__}\n\nPyTorch's spelling: {fn.__doc__.strip()}"
    return fn


_METHODS: dict[str, Any] = {}


def install(namespace: dict) -> None:
    """Give Tensor PyTorch's methods and ``namespace`` (the lamina module's globals)
    PyTorch's names (Note [Two spellings])."""
    _METHODS.update(_methods())
    for name, method in _METHODS.items():
        if callable(method) and not method.__name__.startswith("_m_"):  # one per entry:
            # the table's lambdas and factories' closures, named for tracebacks and docs
            method.__name__ = name
            method.__qualname__ = f"Tensor.{name}"
            if method.__doc__ and "x.method(" in method.__doc__:
                method.__doc__ = method.__doc__.replace("x.method(", f"x.{name}(")
        setattr(Tensor, name, method)
    namespace.update(_functions())
