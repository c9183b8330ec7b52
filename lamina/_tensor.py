"""The Tensor: a dense, strided array with a dispatch key set.

A CPU tensor's storage is a NumPy array (``_data``); views are NumPy views, so they
share storage and carry their own strides. The fields the hot path reads are computed
once, when the tensor is made (Note [Tensor fields]).
"""
import weakref

import numpy as np

from lamina.dispatch import keys
from lamina.dispatch.table import OPERATORS

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
    name = "cpu" if ks & keys.CPU else keys.device_names(ks)[0]
    return _devices.get(name) or _devices.setdefault(name, Device(name))


class Tensor:
    """An n-dimensional array of one dtype on one device (Array API ``array``).

    Note [Tensor fields]: ``_ks`` (dispatch key set), ``_dtype``, ``_shape`` and
    ``_flat`` (a 1-D alias of the storage when it is C-contiguous, else None) are set
    once at creation; tensors never change shape, dtype or strides after that (a view
    is a new tensor), so the fast path may trust them without re-checking ``_data``.
    """

    __slots__ = ("_data", "_flat", "_ks", "_dtype", "_shape", "_grad_fn", "__weakref__",
                 "__dict__")
    # Note [Autograd fields]: ``_grad_fn`` is set exactly when the AUTOGRAD bit is
    # (requires_grad_() sets it to None, recording to the node), so autograd code may
    # read it on any tensor it enters with, and making other tensors costs nothing for
    # it. Rarer fields live in the instance __dict__, created only when one is set; the
    # class attributes below are the defaults every other tensor reads.
    grad = None
    _output_nr = 0  # which output of grad_fn this tensor is
    _accumulator = None  # a leaf's AccumulateGrad node (lamina.autograd.graph)
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
        """This tensor on ``device`` (itself if it is there already). Moves between
        devices go through the CPU with the devices' converters and never share
        storage with the source (docs/backends.md)."""
        if device == self.device:
            return self
        from lamina.backends import move
        return move(self, device)

    def to(self, device, /):
        """``t.to("name")``: the same as ``to_device`` (PyTorch spelling)."""
        return self.to_device(device)

    def _host(self):
        """The values as a NumPy array: the storage for CPU tensors, a copy otherwise."""
        return self.numpy() if self._ks & keys.CPU else self.to_device("cpu").numpy()

    def item(self):
        if self.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self._host().reshape(-1)[0].item()

    def tolist(self):
        return self._host().tolist()

    def _scalar(self, kind):
        if self.ndim != 0:
            raise TypeError(f"only 0-d tensors convert to Python {kind.__name__}, "
                            f"got shape {self.shape}")
        return kind(self._host()[()])

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
        bump_version(self)

    # ---------------------------------------------------------- sparse COO layout
    # Note [Sparse tensors] (backends/sparse/storage.py): _ks is CPU | SPARSE, _data a COO.
    @property
    def is_sparse(self):
        return bool(self._ks & keys.SPARSE)

    def to_dense(self):
        return OPERATORS["to_dense"](self)

    def to_sparse(self):
        """A sparse COO copy holding the nonzero entries (1-D and 2-D, int and float)."""
        return OPERATORS["to_sparse"](self)

    def coalesce(self):
        """Entries sorted row-major, duplicates summed (itself if already coalesced)."""
        return OPERATORS["coalesce"](self)

    def _coo(self, what):
        if not self._ks & keys.SPARSE:
            raise TypeError(f"{what} needs a sparse tensor; this one is dense (see "
                            "to_sparse())")
        return self._data

    def is_coalesced(self):
        return self._coo("is_coalesced()").coalesced

    def indices(self):
        """The (ndim, nnz) int64 indices as stored (duplicates too), read-only."""
        view = self._coo("indices()").indices.view()
        view.flags.writeable = False
        return from_array(view)

    def values(self):
        """The (nnz,) values as stored (a view: writing them changes this tensor)."""
        return from_array(self._coo("values()").values)

    @property
    def nnz(self):
        """The number of stored entries (duplicates of an uncoalesced tensor count)."""
        return self._coo("nnz").values.size

    # ---------------------------------------------------------- autograd
    @property
    def requires_grad(self):
        return bool(self._ks & keys.AUTOGRAD)

    @requires_grad.setter
    def requires_grad(self, flag):
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad=True):
        """Make a leaf tensor record operations for autograd (in place; returns self)."""
        if not requires_grad:
            if self.grad_fn is not None:
                raise RuntimeError("requires_grad_(False) is only allowed on leaf tensors; "
                                   "use detach() for a non-leaf tensor")
            self._ks &= ~keys.AUTOGRAD
            return self
        if self._dtype.kind != "f":
            raise TypeError(f"only floating-point tensors can require gradients, got "
                            f"{self._dtype}")
        if not self._ks & keys.AUTOGRAD:
            self._grad_fn = None  # Note [Autograd fields]
            self._ks |= keys.AUTOGRAD
        return self

    @property
    def grad_fn(self):
        """The node that made this tensor (None for leaves and tensors without grad)."""
        return getattr(self, "_grad_fn", None) if self._ks & keys.AUTOGRAD else None

    @property
    def is_leaf(self):
        return self.grad_fn is None

    def detach(self):
        """A tensor sharing this one's storage, outside the autograd graph."""
        t = _new(Tensor)
        t._data, t._flat, t._dtype, t._shape = self._data, self._flat, self._dtype, self._shape
        t._ks = self._ks & ~keys.AUTOGRAD
        return t

    def backward(self, gradient=None, retain_graph=False, create_graph=False):
        from lamina.autograd import engine
        engine.backward([self], None if gradient is None else [gradient],
                        retain_graph=retain_graph, create_graph=create_graph)

    def register_hook(self, hook):
        """Call ``hook(grad)`` when this tensor's gradient is computed; a tensor it
        returns replaces the gradient. Returns a handle with ``remove()``."""
        from lamina.autograd import graph
        return graph.register_hook(self, hook)

    @property
    def _version(self):
        return version_of(self)

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


def from_storage(storage, ks, dtype, shape):
    """A tensor of a non-CPU device: ``storage`` is whatever object its plugin defines
    (see docs/backends.md); dtype and shape are given, since nothing can be inspected.
    ``_flat`` is None: the CPU fast path never sees it."""
    t = _new(Tensor)
    t._data, t._flat, t._ks, t._dtype, t._shape = storage, None, ks, dtype, tuple(shape)
    return t


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


PY_SCALARS = (float, int, bool)  # exact types: subclasses take the general paths


def _scalar_keys(name, *args):
    ks = 0
    for a in args:
        if type(a) in PY_SCALARS:
            continue
        k = getattr(a, "_ks", None)
        if k is not None:
            ks |= k
        elif not isinstance(a, (float, int, np.generic)):  # subclasses: IntEnum, ...
            raise TypeError(f"{name}: expected a tensor or a Python scalar, got "
                            f"{type(a).__name__}")
    if not ks:
        raise TypeError(f"{name}: expected at least one tensor, got "
                        f"{', '.join(type(a).__name__ for a in args)}")
    return ks


def _scalar_call(op, x1, x2):
    """A binary call with a Python scalar operand, through the table of the kernels'
    ``with_scalar`` variants (Note [Kernel variants]): a backend kernel's scalar path,
    which would otherwise first try its tensor fast path and raise there (~450 ns, half
    a small operation)."""
    ks = _scalar_keys(op.name, x1, x2) & op.mask
    return op.scalar_table[ks.bit_length()](ks, x1, x2)


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
            return _scalar_call(op, x1, x2)
        return table[ks.bit_length()](ks, x1, x2)
    call.__name__ = call.__qualname__ = op.name
    return call


def _reflected(fn):
    def reflected(self, other):
        return fn(other, self)
    return reflected


def _comparison(fn):
    def compare(self, other):
        if isinstance(other, (list, tuple, np.ndarray)):  # not a silent identity False
            raise TypeError(f"{fn.__name__}: expected a tensor or a Python scalar, got "
                            f"{type(other).__name__} (convert it with lamina.asarray)")
        if not isinstance(other, (Tensor, bool, int, float, np.generic)):
            return NotImplemented  # Python then falls back to identity (t == None)
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
        bump_version(self)
        return self
    return inplace


# Note [Version counters]: an in-place operation bumps the version of the storage it
# wrote (the root NumPy array, shared by all views). Autograd records the version of
# each tensor it saves and compares at backward time, so a saved tensor modified in
# place is an error, not a silently wrong gradient. Versions only ever grow, and a
# storage never written has version 0, so nothing is tracked until the first write.
_versions = {}  # id(root array) -> version


def _root(data):
    while isinstance(data.base, np.ndarray):
        data = data.base
    return data


def bump_version(t):
    data = t._data
    if isinstance(data, np.ndarray):
        root = _root(data)
        key = id(root)
        if key not in _versions:  # forget the storage when it is freed
            weakref.finalize(root, _versions.pop, key, None)
        _versions[key] = _versions.get(key, 0) + 1


def version_of(t):
    if not _versions or not isinstance(t._data, np.ndarray):
        return 0
    return _versions.get(id(_root(t._data)), 0)


def _direct(op, arity):
    """A binding straight to the CPU kernel, for the "dispatcher" layer switched off."""
    kernel = op.table[keys.CPU.bit_length()]

    def refuse(args):
        raise RuntimeError(f"{op.name}: the dispatcher layer is off, so only dense CPU "
                           f"tensors that do not require grad are accepted (got key sets "
                           f"{[keys.keyset_names(getattr(a, '_ks', 0)) for a in args]}); "
                           "use lamina.layers.enable('dispatcher')")

    if arity == 1:
        def call(x, /):
            if x._ks != keys.CPU:
                refuse((x,))
            return kernel(keys.CPU, x)
    else:
        def call(x1, x2, /):
            try:
                ks = x1._ks | x2._ks
            except AttributeError:
                ks = _scalar_keys(op.name, x1, x2)
            if ks != keys.CPU:
                refuse((x1, x2))
            return kernel(keys.CPU, x1, x2)
    call.__name__ = call.__qualname__ = op.name
    return call


def install_direct_bindings(namespace):
    """Bind the elementwise functions and operators straight to the CPU kernels."""
    for op in OPERATORS.values():
        if op.kind in ("unary", "binary"):
            namespace[op.name] = _direct(op, 1 if op.kind == "unary" else 2)
    _install_dunders(namespace)


def install_bindings(namespace):
    """Create the public elementwise functions and Tensor's operators from the list."""
    for op in OPERATORS.values():
        if op.kind == "unary":
            namespace[op.name] = unary_binding(op)
        elif op.kind == "binary":
            namespace[op.name] = binary_binding(op)
    _install_dunders(namespace)


def _install_dunders(namespace):
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

