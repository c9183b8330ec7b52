"""The Tensor: a dense, strided array with a dispatch key set.

A CPU tensor's storage is a NumPy array (``_data``); views are NumPy views, so they
share storage and carry their own strides. The fields the hot path reads are computed
once, when the tensor is made (Note [Tensor fields]).
"""
import numpy as np

from lamina.dispatch import keys
from lamina.dispatch.table import OPERATORS

from . import _dtypes
from ._dtypes import from_numpy


class Device:
    """Where a tensor's storage lives. Compares equal to its name: ``x.device == "cpu"``."""

    __slots__ = ("name",)

    def __init__(self, name):
        keys.device_key(name)  # ValueError for an unknown device
        self.name = name

    def __eq__(self, other):
        return self.name == (other.name if isinstance(other, Device) else other)

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return f"device(type={self.name!r})"

    __str__ = lambda self: self.name  # noqa: E731


_devices = {}


def device_of_key(ks):
    name = next(n for n in keys.devices() if keys.device_key(n) & ks)
    return _devices.get(name) or _devices.setdefault(name, Device(name))


class Tensor:
    """An n-dimensional array of one dtype on one device (Array API ``array``).

    Note [Tensor fields]: ``_ks`` (dispatch key set), ``_dtype``, ``_shape`` and
    ``_flat`` (a 1-D alias of the storage when it is C-contiguous, else None) are set
    once at creation; tensors never change shape, dtype or strides after that (a view
    is a new tensor), so the fast path may trust them without re-checking ``_data``.
    """

    __slots__ = ("_data", "_flat", "_ks", "_dtype", "_shape", "__weakref__")
    __array_priority__ = 1000
    __array_ufunc__ = None  # ndarray <op> Tensor defers to Tensor's reflected operator
    __hash__ = object.__hash__

    def __init__(self, *args, **kwargs):
        raise TypeError("create tensors with lamina.asarray, lamina.zeros, ... "
                        "(Tensor has no public constructor)")

    # ---------------------------------------------------------- attributes
    @property
    def dtype(self):
        return self._dtype

    @property
    def shape(self):
        return self._shape

    @property
    def ndim(self):
        return len(self._shape)

    @property
    def size(self):
        n = 1
        for s in self._shape:
            n *= s
        return n

    @property
    def device(self):
        return device_of_key(self._ks)

    @property
    def is_contiguous(self):
        return self._flat is not None

    @property
    def mT(self):
        if self.ndim < 2:
            raise ValueError(f".mT needs at least 2 dimensions, got shape {self._shape}")
        return OPERATORS["matrix_transpose"](self)

    @property
    def T(self):
        if self.ndim != 2:
            raise ValueError(f".T needs a 2-D tensor, got {self.ndim}-D (use .mT or "
                             "permute_dims for batches)")
        return OPERATORS["matrix_transpose"](self)

    def __array_namespace__(self, *, api_version=None):
        if api_version not in (None, "2023.12", "2022.12", "2021.12"):
            raise ValueError(f"unsupported Array API version {api_version!r}")
        import lamina
        return lamina

    # ---------------------------------------------------------- conversion
    def numpy(self):
        """The storage as a NumPy array (shared, not copied, for CPU tensors)."""
        if not self._ks & keys.CPU or self._ks & keys.SPARSE:
            raise TypeError(f"numpy() needs a dense CPU tensor; this one is on {self.device}"
                            f"{' and sparse' if self._ks & keys.SPARSE else ''}")
        return self._data

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        kwargs = {} if max_version is None else {"max_version": max_version}
        return self.numpy().__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self):
        return self.numpy().__dlpack_device__()

    def to_device(self, device, /, *, stream=None):
        if device == self.device:
            return self
        raise ValueError(f"cannot move a tensor from {self.device} to {device!r}: "
                         f"no transfer is registered")

    def item(self):
        if self.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.numpy().reshape(-1)[0].item()

    def tolist(self):
        return self.numpy().tolist()

    def _scalar(self, kind):
        if self.ndim != 0:
            raise TypeError(f"only 0-d tensors convert to Python {kind.__name__}, "
                            f"got shape {self.shape}")
        return kind(self.numpy()[()])

    def __bool__(self):
        return self._scalar(bool)

    def __int__(self):
        return self._scalar(int)

    def __float__(self):
        return self._scalar(float)

    def __index__(self):
        if self._dtype.kind not in "iu":
            raise TypeError(f"only integer tensors can be used as an index, got {self._dtype}")
        return self._scalar(int)

    def __complex__(self):
        return self._scalar(complex)

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __iter__(self):
        if not self._shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._shape[0]))

    def __repr__(self):
        from ._format import format_tensor
        return format_tensor(self)

    def __getitem__(self, key):
        return OPERATORS["getitem"](self, key)

    def __setitem__(self, key, value):
        OPERATORS["setitem"](self, key, value)

    def __getstate__(self):
        return {"data": self.numpy().copy()}

    def __setstate__(self, state):
        _init(self, state["data"], keys.CPU)


def _init(t, data, ks):
    t._data = data
    t._flat = data.reshape(-1) if data.flags.c_contiguous else None
    t._ks = ks
    t._dtype = from_numpy(data.dtype)
    t._shape = data.shape
    return t


_new = object.__new__


def from_array(data, ks=keys.CPU):
    """Wrap a NumPy array (not copied) as a tensor; the general constructor."""
    return _init(_new(Tensor), data, ks)


def from_flat(flat, shape, dtype, ks=keys.CPU):
    """Wrap a freshly allocated contiguous 1-D array as a tensor of ``shape``.

    The fast constructor for kernel outputs: nothing is inspected."""
    t = _new(Tensor)
    t._data = flat if len(shape) == 1 else flat.reshape(shape)
    t._flat = flat
    t._ks = ks
    t._dtype = dtype
    t._shape = shape
    return t


# ---------------------------------------------------------------- bindings
# Note [Bindings]: an operator's Python binding does the dispatcher's work inline (OR
# the key sets, AND the mask, index the table by bit_length) so that `a + b` costs one
# Python call before the kernel. Python scalars have no key set; the AttributeError
# branch handles them off the fast path.


def _scalar_keys(name, *args):
    ks = 0
    for a in args:
        k = getattr(a, "_ks", None)
        if k is not None:
            ks |= k
        elif not isinstance(a, (bool, int, float, np.generic)):
            raise TypeError(f"{name}: expected a tensor or a Python scalar, got "
                            f"{type(a).__name__}")
    if not ks:
        raise TypeError(f"{name}: expected at least one tensor, got "
                        f"{', '.join(type(a).__name__ for a in args)}")
    return ks


def unary_binding(op):
    table = op.table

    def call(x, /):
        try:
            ks = x._ks & op.mask
        except AttributeError:
            raise TypeError(f"{op.name}: expected a tensor, got {type(x).__name__}") from None
        return table[ks.bit_length()](ks, x)
    call.__name__ = call.__qualname__ = op.name
    return call


def binary_binding(op):
    table = op.table

    def call(x1, x2, /):
        try:
            ks = (x1._ks | x2._ks) & op.mask
        except AttributeError:
            ks = _scalar_keys(op.name, x1, x2) & op.mask
        return table[ks.bit_length()](ks, x1, x2)
    call.__name__ = call.__qualname__ = op.name
    return call


def _reflected(fn):
    def reflected(self, other):
        return fn(other, self)
    return reflected


def _comparison(fn):
    def compare(self, other):
        if not isinstance(other, (Tensor, bool, int, float, np.generic)):
            return NotImplemented  # Python then falls back to identity
        return fn(self, other)
    return compare


_DUNDERS = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "truediv",
            "floor_divide": "floordiv", "remainder": "mod", "pow": "pow",
            "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor",
            "bitwise_left_shift": "lshift", "bitwise_right_shift": "rshift"}
_COMPARISONS = {"equal": "eq", "not_equal": "ne", "less": "lt", "less_equal": "le",
                "greater": "gt", "greater_equal": "ge"}
_UNARY_DUNDERS = {"negative": "neg", "positive": "pos", "abs": "abs",
                  "bitwise_invert": "invert"}


def _inplace(op):
    binding = binary_binding(op)

    def inplace(self, other):
        binding(self, other)
        return self
    return inplace


def install_bindings(namespace):
    """Create the public elementwise functions and Tensor's operators from the list."""
    for op in OPERATORS.values():
        if op.kind == "unary":
            namespace[op.name] = unary_binding(op)
        elif op.kind == "binary":
            namespace[op.name] = binary_binding(op)
    for name, dunder in _DUNDERS.items():
        setattr(Tensor, f"__{dunder}__", namespace[name])
        setattr(Tensor, f"__r{dunder}__", _reflected(namespace[name]))
        setattr(Tensor, f"__i{dunder}__", _inplace(OPERATORS[name + "_"]))
    for name, dunder in _COMPARISONS.items():
        setattr(Tensor, f"__{dunder}__", _comparison(namespace[name]))
    for name, dunder in _UNARY_DUNDERS.items():
        setattr(Tensor, f"__{dunder}__", namespace[name])
    # a non-tensor operand (scalar, list, ndarray) gives NotImplemented: Python's TypeError
    Tensor.__matmul__ = lambda a, b: (OPERATORS["matmul"](a, b) if isinstance(b, Tensor)
                                      else NotImplemented)
    Tensor.__rmatmul__ = lambda a, b: (OPERATORS["matmul"](b, a) if isinstance(b, Tensor)
                                       else NotImplemented)


_dtypes  # re-exported through lamina
