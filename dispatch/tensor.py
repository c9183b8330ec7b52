"""The Tensor: a dense, strided array with a dispatch key set.

A CPU tensor's storage is a NumPy array (``_data``); views are NumPy views, so they
share storage and carry their own strides. The fields the hot path reads are computed
once, when the tensor is made (Note [Tensor fields]).
"""

from __future__ import annotations

import copy
import sys
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from . import core, keys
from .arguments import checked
from .devices import Device, device_of_key, move
from .dtypes import BY_NAME, DType, from_numpy
from .format import format_tensor
from .schema import OPERATORS

DLPACK_CPU = (1, 0)  # DLPack's (device type, device id) of the CPU: kDLCPU, 0

PY_SCALARS = core.PY_SCALARS  # exact types: subclasses take the general paths


class UpperLayers:
    """Note [Upper layers]: ``dispatch`` never imports the layers above it, but a few
    Tensor methods belong to them (``backward`` and ``register_hook`` to autograd,
    ``__array_namespace__`` to the public namespace). Those layers fill these slots
    when they are imported; the methods call through them."""

    autograd: Any = None  # lamina.autograd: backward(), register_hook() and the like
    namespace: Any = None  # the lamina module
    # lamina.jit, while a trace runs: called with a CPU tensor whose values are read (item(),
    # float(), bool(), tolist()), so that the trace makes the read a graph break (Note
    # [Tracing])
    reads: Any = None


upper = UpperLayers()

# Note [Grad flag changes]: a count bumped whenever a tensor's requires_grad flips
# (requires_grad_, or the property's setter). A compiled module (lamina.jit) reads its
# parameters' flags again only when it moved, as its tree when the module generation
# did (Note [Module generation] in lamina.nn.modules): unfreezing a layer after its
# first compiled call must give it gradients.
requires_grad_changes = 0


def _flag_changed() -> None:
    global requires_grad_changes
    requires_grad_changes += 1


# Note [Typed dunders]: Tensor's operator methods (__add__, ...) are installed from the
# schema at import (dispatch/bindings.py). For type checkers only, Tensor also derives
# from the generated stub _dunders.pyi, which declares them.
if TYPE_CHECKING:
    from ._dunders import Dunders

    class _Base(core.TensorBase, Dunders): ...
else:
    _Base = core.TensorBase


class Tensor(_Base):
    """An n-dimensional array of one dtype on one device (Array API ``array``).

    Note [Tensor fields]: ``_ks`` (dispatch key set), ``_dtype``, ``_shape`` and
    ``_flat`` (a 1-D alias of the storage when it is C-contiguous, else None) are set
    once at creation; tensors never change shape, dtype or strides after that (a view
    is a new tensor), so the fast path may trust them without re-checking ``_data``.
    """

    __slots__ = ()  # the fields are core.TensorBase's (C, or the Python reference)
    _data: Any
    _flat: np.ndarray | None
    _ks: int
    _dtype: DType
    _shape: tuple[int, ...]
    # Note [Autograd fields]: ``_grad_fn`` is set exactly when the AUTOGRAD bit is
    # (requires_grad_() sets it to None, recording to the node), so autograd code may
    # read it on any tensor it enters with, and making other tensors costs nothing for
    # it. Rarer fields live in the instance __dict__, created only when one is set; the
    # class attributes below are the defaults every other tensor reads.
    __array_priority__ = 1000
    __array_ufunc__ = None  # ndarray <op> Tensor defers to Tensor's reflected operator
    __hash__ = object.__hash__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "create tensors with lamina.asarray, lamina.zeros, ... "
            "(Tensor has no public constructor)"
        )

    # ---------------------------------------------------------- attributes
    # PyTorch's methods and ``size`` (an element count that, called, gives the shape)
    # are installed from dispatch/pytorch.py (Note [Two spellings]).
    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def device(self) -> Device:
        return device_of_key(self._ks)

    @property
    def mT(self) -> Tensor:
        if self.ndim < 2:
            raise ValueError(f".mT needs at least 2 dimensions, got shape {self._shape}")
        return OPERATORS["matrix_transpose"](self)

    @property
    def T(self) -> Tensor:
        if self.ndim != 2:
            raise ValueError(
                f".T needs a 2-D tensor, got {self.ndim}-D (use .mT or permute_dims for batches)"
            )
        return OPERATORS["matrix_transpose"](self)

    def __array_namespace__(self, *, api_version: str | None = None) -> Any:
        if api_version not in (None, "2024.12", "2023.12", "2022.12", "2021.12"):
            raise ValueError(f"unsupported Array API version {api_version!r}")
        return upper.namespace  # Note [Upper layers]

    # ---------------------------------------------------------- conversion
    def numpy(self) -> np.ndarray:
        """The storage as a NumPy array (shared, not copied, for CPU tensors)."""
        if not self._ks & keys.CPU or self._ks & keys.SPARSE:
            raise TypeError(
                f"numpy() needs a dense CPU tensor; this one is on {self.device}"
                f"{' and sparse' if self._ks & keys.SPARSE else ''}"
            )
        expose(self._data)  # Note [Sealed storages]
        return self._data

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        a = self.numpy()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        """The storage of a dense CPU tensor as a DLPack capsule (2023.12 protocol). A
        tensor on another device exports as a copy on the CPU when the consumer asks
        for the CPU (``dl_device=(1, 0)``, as ``numpy.from_dlpack(x, device="cpu")``
        does) and allows a copy; anything else that cannot be exported is the
        protocol's ``BufferError``."""
        kwargs = {} if max_version is None else {"max_version": max_version}
        if self._ks & keys.SPARSE:
            raise BufferError("__dlpack__: a sparse tensor has no DLPack form; use to_dense()")
        if not self._ks & keys.CPU:
            if dl_device is None or tuple(dl_device) != DLPACK_CPU:
                raise BufferError(
                    f"__dlpack__: a tensor on {self.device} exports only as a copy on the "
                    f"CPU: ask for dl_device={DLPACK_CPU}"
                )
            if copy is False:
                raise BufferError(
                    f"__dlpack__: exporting a tensor on {self.device} to the CPU needs a "
                    "copy, but copy=False"
                )
            return self._host().__dlpack__(stream=stream, **kwargs)  # a fresh copy
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        if not copy:
            expose(self._data)  # Note [Sealed storages]
        return self._data.__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(1, 0) (kDLCPU) for a dense CPU tensor; DLPack has no name for lamina's other
        devices (or for sparse storage), which is the protocol's ``BufferError``."""
        if self._ks & keys.SPARSE or not self._ks & keys.CPU:
            raise BufferError(
                f"__dlpack_device__: a {'sparse ' if self._ks & keys.SPARSE else ''}tensor on "
                f"{self.device} has no DLPack device; __dlpack__(dl_device={DLPACK_CPU}) "
                "exports a copy on the CPU"
            )
        return DLPACK_CPU

    @checked
    def to_device(self, device: str | Device, /, *, stream: Any = None) -> Tensor:
        """This tensor on ``device`` (itself if it is there already). Moves between
        devices go through the CPU with the devices' converters and never share
        storage with the source (docs/backends.md)."""
        if device == self.device:
            return self
        return OPERATORS["to_device"](self, device)  # differentiable

    def _host(self) -> np.ndarray:
        """The values as a NumPy array: the storage for CPU tensors, a copy otherwise."""
        # moved without a call of to_device: a read of values, not an operation a mode
        # (a trace: Note [Tracing] in lamina.jit) would record
        if not self._ks & keys.CPU:
            return move(self, "cpu").numpy()
        if upper.reads is not None:
            upper.reads(self)
        if self._ks & keys.SPARSE:
            return self.numpy()  # its error
        return self._data  # read here, not handed out (Note [Sealed storages])

    def item(self) -> bool | int | float:
        if self.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self._host().reshape(-1)[0].item()

    def tolist(self) -> Any:
        return self._host().tolist()

    def _scalar(self, kind: type) -> Any:
        if self.ndim != 0:
            raise TypeError(
                f"only 0-d tensors convert to Python {kind.__name__}, got shape {self.shape}"
            )
        if self._dtype.kind == "c" and kind in (int, float):  # as float(1j): no silent part
            raise TypeError(
                f"a {self._dtype} tensor does not convert to {kind.__name__}; take real(x) "
                "or imag(x) first"
            )
        return kind(self._host()[()])

    def __bool__(self) -> bool:
        return self._scalar(bool)

    def __int__(self) -> int:
        return self._scalar(int)

    def __float__(self) -> float:
        return self._scalar(float)

    def __index__(self) -> int:
        if self._dtype.kind not in "iu":
            raise TypeError(f"only integer tensors can be used as an index, got {self._dtype}")
        return self._scalar(int)

    def __complex__(self) -> complex:
        return self._scalar(complex)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __iter__(self) -> Any:
        if not self._shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._shape[0]))

    def __repr__(self) -> str:
        return format_tensor(self)

    def __getitem__(self, key: Any) -> Tensor:
        return OPERATORS["getitem"](self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        OPERATORS["setitem"](self, key, value)
        bump_version(self)

    # ---------------------------------------------------------- sparse COO layout
    # Note [Sparse tensors] (backends/sparse/storage.py): _ks is CPU | SPARSE, _data a COO.
    @property
    def is_sparse(self) -> bool:
        return bool(self._ks & keys.SPARSE)

    def to_dense(self) -> Tensor:
        """A dense tensor with this tensor's values (itself if it is dense)."""
        return OPERATORS["to_dense"](self)

    def to_sparse(self) -> Tensor:
        """A sparse COO copy holding the nonzero entries (1-D and 2-D, int and float)."""
        return OPERATORS["to_sparse"](self)

    def coalesce(self) -> Tensor:
        """Entries sorted row-major, duplicates summed (itself if already coalesced)."""
        return OPERATORS["coalesce"](self)

    def _coo(self, what: str) -> Any:
        if not self._ks & keys.SPARSE:
            raise TypeError(f"{what} needs a sparse tensor; this one is dense (see to_sparse())")
        return self._data

    def is_coalesced(self) -> bool:
        return self._coo("is_coalesced()").coalesced

    def indices(self) -> Tensor:
        """The (ndim, nnz) int64 indices as stored (duplicates too), read-only."""
        view = self._coo("indices()").indices.view()
        view.flags.writeable = False
        return from_array(view)

    def values(self) -> Tensor:
        """The (nnz,) values as stored (a view: writing them changes this tensor)."""
        return from_array(self._coo("values()").values)

    @property
    def nnz(self) -> int:
        """The number of stored entries (duplicates of an uncoalesced tensor count)."""
        return self._coo("nnz").values.size

    # ---------------------------------------------------------- autograd
    @property
    def requires_grad(self) -> bool:
        return bool(self._ks & keys.AUTOGRAD)

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self.requires_grad_(flag)

    @checked
    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Make a leaf tensor record operations for autograd (in place; returns self)."""
        if not requires_grad:
            if self.grad_fn is not None:
                raise RuntimeError(
                    "requires_grad_(False) is only allowed on leaf tensors; "
                    "use detach() for a non-leaf tensor"
                )
            if self._ks & keys.AUTOGRAD:
                _flag_changed()
                self._ks &= ~keys.AUTOGRAD
            return self
        if self._dtype.kind not in "fc":
            raise TypeError(
                f"only floating-point (real or complex) tensors can require gradients, got "
                f"{self._dtype}"
            )
        if not self._ks & keys.AUTOGRAD:
            _flag_changed()
            self._grad_fn = None  # Note [Autograd fields]
            self._ks |= keys.AUTOGRAD
        return self

    @property
    def grad(self) -> Tensor | None:
        """The gradient accumulated by ``backward`` (None until then)."""
        return self.__dict__.get("grad")

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        # as PyTorch: a gradient of another shape, dtype or device is refused here,
        # not turned into a wrong .grad by the next backward's accumulation
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"grad must be a tensor or None, got {type(value).__name__}")
            for what, got, want in (
                ("shape", value._shape, self._shape),
                ("dtype", value._dtype, self._dtype),
                ("device", value.device, self.device),
            ):
                if got != want:
                    raise RuntimeError(
                        f"cannot assign a gradient of {what} {got} to a tensor of {what} {want}"
                    )
        self.__dict__["grad"] = value

    @property
    def grad_fn(self) -> Any:
        """The node that made this tensor (None for leaves and tensors without grad)."""
        return getattr(self, "_grad_fn", None) if self._ks & keys.AUTOGRAD else None

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    def detach(self) -> Tensor:
        """A tensor sharing this one's storage, outside the autograd graph."""
        t = _new(Tensor)
        t._data, t._flat, t._dtype, t._shape = self._data, self._flat, self._dtype, self._shape
        t._ks = self._ks & ~keys.AUTOGRAD
        return t

    @checked
    def backward(
        self, gradient: Any = None, retain_graph: bool = False, create_graph: bool = False
    ) -> None:
        """Accumulate the gradient of this tensor into the ``.grad`` of the leaves it
        was computed from (lamina.autograd.backward)."""
        upper.autograd.backward(
            [self],
            None if gradient is None else [gradient],
            retain_graph=retain_graph,
            create_graph=create_graph,
        )

    def register_hook(self, hook: Any) -> Any:
        """Call ``hook(grad)`` when this tensor's gradient is computed; a tensor it
        returns replaces the gradient. Returns a handle with ``remove()``."""
        return upper.autograd.register_hook(self, hook)

    def register_post_accumulate_grad_hook(self, hook: Any) -> Any:
        """Call ``hook(self)`` each time backward has added a gradient into this leaf's
        ``.grad``. Returns a handle with ``remove()``."""
        return upper.autograd.register_post_accumulate_grad_hook(self, hook)

    @property
    def _version(self) -> int:
        return version_of(self)

    # ---------------------------------------------------------- copies and pickles
    # Note [Copies]: pickle and copy.deepcopy keep what a tensor is: its values, dtype,
    # shape, device, layout (sparse) and that it requires grad. As in PyTorch, a pickled
    # tensor that requires grad comes back as a leaf without .grad, and deepcopy of a
    # non-leaf that requires grad raises (the copy would be a leaf of no graph). pickle
    # goes through the CPU for a device tensor (rebuilt on its device at load, which
    # must be registered then); deepcopy copies on the device, and copies .grad (not an
    # nn.Parameter's, as PyTorch's Parameter.__deepcopy__) and the attributes a user
    # set. Both keep an nn.Parameter's mark (``_is_parameter``), so a copied Parameter is
    # still one, as in PyTorch.
    def __reduce_ex__(self, protocol: Any) -> tuple:
        if self.__dict__.get("_is_parameter"):  # an nn.Parameter stays one (its mark)
            return (_rebuild, _parts(self), {"_is_parameter": True})
        return (_rebuild, _parts(self))

    def __deepcopy__(self, memo: dict) -> Tensor:
        if self._ks & keys.AUTOGRAD and self.grad_fn is not None:
            raise RuntimeError(
                "copy.deepcopy: only leaf tensors that require grad can be deep-copied (this "
                f"one is the output of {self.grad_fn.name}); deep-copy x.detach() instead"
            )
        if self._ks & keys.SPARSE:
            new = from_storage(
                copy.deepcopy(self._data, memo), self._ks & ~keys.AUTOGRAD, self._dtype, self._shape
            )
        elif self._ks & keys.CPU:
            new = from_array(self._data.copy())
        else:
            new = OPERATORS["copy"](self.detach())  # on the device, by its kernel
        memo[id(self)] = new
        if self._ks & keys.AUTOGRAD:
            new.requires_grad_()
        # (Note [Copies]; TransformerEncoder deep-copies its layer: no copy starts with
        # the layer's gradient)
        left = "grad" if self.__dict__.get("_is_parameter") else None
        for name, value in self.__dict__.items():
            if name != left and (name in ("grad", "_is_parameter") or not name.startswith("_")):
                setattr(new, name, copy.deepcopy(value, memo))
        return new


def _parts(t: Tensor) -> tuple:
    """What ``_rebuild`` needs to make ``t`` again (Note [Copies])."""
    requires_grad = bool(t._ks & keys.AUTOGRAD)
    if t._ks & keys.SPARSE:
        return ("sparse", t._data, t._dtype.name, t._shape, requires_grad)
    if t._ks & keys.CPU:
        return ("cpu", t._data, t._dtype.name, t._shape, requires_grad)
    return (t.device.name, t._host(), t._dtype.name, t._shape, requires_grad)


def _rebuild(
    device: str, data: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool
) -> Tensor:
    """A tensor from ``_parts``: what unpickling calls."""
    if device == "sparse":
        t = from_storage(data, keys.CPU | keys.SPARSE, BY_NAME[dtype], shape)
    else:
        t = from_array(data)
        if device != "cpu":
            if device not in keys.devices():
                raise ValueError(
                    f"cannot unpickle a tensor of device {device!r}: no registered plugin "
                    f"provides it now; known devices: {', '.join(keys.devices())}"
                )
            t = OPERATORS["to_device"](t, device)
    return t.requires_grad_() if requires_grad else t


# ---------------------------------------------------------------- constructors


def _init(t: Tensor, data: np.ndarray, ks: int) -> Tensor:
    t._data = data
    t._flat = data.reshape(-1) if data.flags.c_contiguous else None
    t._ks = ks
    t._dtype = from_numpy(data.dtype)
    t._shape = data.shape
    return t


_new = object.__new__


def from_array(data: np.ndarray, ks: int = keys.CPU) -> Tensor:
    """Wrap a NumPy array (not copied) of a lamina dtype (TypeError otherwise) as a
    tensor; the general constructor (``lamina.backends.from_array``, ~0.5 us)."""
    return _init(_new(Tensor), data, ks)


def from_storage(storage: Any, ks: int, dtype: DType, shape: tuple[int, ...]) -> Tensor:
    """A tensor of a non-CPU device: ``storage`` is whatever object its plugin defines
    (see docs/backends.md); dtype and shape are given, since nothing can be inspected.
    ``_flat`` is None: the CPU fast path never sees it."""
    t = _new(Tensor)
    t._data, t._flat, t._ks, t._dtype, t._shape = storage, None, ks, dtype, tuple(shape)
    return t


def from_flat(flat: np.ndarray, shape: tuple[int, ...], dtype: DType, ks: int = keys.CPU) -> Tensor:
    """Wrap a freshly allocated contiguous 1-D array as a tensor of ``shape``.

    The fast constructor for kernel outputs (``lamina.backends.from_flat``, ~0.2 us):
    nothing is inspected, so ``flat`` must be C-contiguous, 1-D, of ``dtype.np``, with
    ``prod(shape)`` elements, and ``shape`` a tuple of ints (a plugin kernel's first
    result is checked for it, Note [Result checks])."""
    t = _new(Tensor)
    t._data = flat if len(shape) == 1 else flat.reshape(shape)
    t._flat = flat
    t._ks = ks
    t._dtype = dtype
    t._shape = shape
    return t


# ---------------------------------------------------------------- version counters
# Note [Version counters]: an in-place operation bumps the version of the storage it
# wrote (the root NumPy array, shared by all views). Autograd records the version of
# each tensor it saves and compares at backward time, so a saved tensor modified in
# place is an error, not a silently wrong gradient. Versions only ever grow, and a
# storage never written has version 0, so nothing is tracked until the first write.
versions: dict[int, int] = {}  # id(root array) -> version


def _root(data: np.ndarray) -> np.ndarray:
    while isinstance(data.base, np.ndarray):
        data = data.base
    return data


def sole_storage(t: Tensor) -> bool:
    """Whether ``t``'s storage is a NumPy array that nothing but ``t`` refers to -- no
    other tensor, view or caller's array can see a write to it -- and that ``t`` uses
    whole. So the backward engine may keep a gradient as a leaf's ``.grad`` without
    copying it (Note [Taking gradients over] in autograd/engine.py). The caller checks
    that nothing else holds ``t`` itself.

    It counts references, as PyTorch's AccumulateGrad counts uses: NumPy collapses
    chains of views, so every view of the storage holds the owning array (``root``)
    as its ``base``, and every other tensor sharing ``t``'s arrays holds them. The
    counts are CPython's; where this interpreter counts otherwise (checked once, at
    import, on tensors whose holders are known) it says False: a copy, never a guess."""
    return _COUNTS_AS_EXPECTED and _counted_sole(t)


def _counted_sole(t: Tensor) -> bool:
    data, flat = t._data, t._flat
    if type(data) is not np.ndarray:
        return False  # another device's storage, or an array subclass
    root = data if data.base is None else data.base
    if type(root) is not np.ndarray or root.base is not None or root.nbytes != data.nbytes:
        return False  # memory NumPy does not own (a buffer, DLPack), or a part of it
    if not (data.flags.writeable and root.flags.writeable):
        return False  # a read-only view (broadcast_to's, sum's gradient) must stay one
    # The references to root from t's fields and from here: t._data, t._flat and the
    # locals data and flat, each when it is root itself, or its base; the local root;
    # getrefcount's argument. To data and flat, when not root: t's field, the local,
    # getrefcount's argument.
    own = 2 * (data is root) + 2 * (flat is root) + 2
    own += (data.base is root) + (flat is not None and flat.base is root)
    return (
        sys.getrefcount(root) == own
        and (data is root or sys.getrefcount(data) == 3)
        and (flat is None or flat is root or sys.getrefcount(flat) == 3)
    )


def bump_version(t: Tensor) -> None:
    data = t._data
    if isinstance(data, np.ndarray):
        root = _root(data)
        key = id(root)
        if key not in versions:  # forget the storage when it is freed
            weakref.finalize(root, versions.pop, key, None)
        versions[key] = versions.get(key, 0) + 1


def version_of(t: Tensor) -> int:
    if not versions or not isinstance(t._data, np.ndarray):
        return 0
    return versions.get(id(_root(t._data)), 0)


# Note [Sealed storages]: a kernel may keep what it computed from a module parameter
# (a convolution's transformed filters: Note [Filter cache] in the CPU backend) for as
# long as the parameter's storage is unchanged. Comparing the values is safe but reads
# the weight and a copy of it on every call (ResNet-18's, 45 MB: ~4 ms a step); its
# version (Note [Version counters]) says the same for free, where every write goes
# through lamina. So a parameter's storage is *sealed* when ``Parameter`` makes it, and
# ``stamp_of`` gives (storage, version) for the arrays of a sealed storage. A storage
# that code outside lamina may write is *exposed*, and never sealed again: handed out by
# ``numpy()`` (``__array__`` too) or ``__dlpack__``, or made by ``asarray`` or
# ``from_dlpack`` on memory the caller still holds. Such a weight, and every array
# lamina never sealed, is compared by value, as before. A kernel may seal an array of
# its own that nothing writes (``seal_array``: the filter cache's results, which a
# cached result made from them is then kept against).
sealed: dict[int, None] = {}  # id(root array) of sealed storages
# id(root array) -> a weak reference to it, of exposed ones: ``numpy()`` runs in users'
# loops, where a finalizer per storage took it from 0.15 to 2.2 us on a fresh result;
# the references of freed storages are dropped whenever the table doubles
exposed: dict[int, weakref.ref] = {}
_EXPOSED_FLOOR = 1024
_exposed_limit = _EXPOSED_FLOOR


def _is_exposed(root: np.ndarray) -> bool:
    ref = exposed.get(id(root))
    return ref is not None and ref() is root


def seal(t: Tensor) -> None:
    """Seal ``t``'s storage unless it was exposed (Note [Sealed storages])."""
    if isinstance(t._data, np.ndarray):
        seal_array(t._data)


def seal_array(data: np.ndarray) -> None:
    """Seal the storage of the array ``data`` unless it was exposed: one that only
    lamina's operations write, or none (a kernel's cached result)."""
    root = _root(data)
    key = id(root)
    if key not in sealed and not _is_exposed(root):
        weakref.finalize(root, sealed.pop, key, None)  # forgotten when freed
        sealed[key] = None


def expose(data: Any) -> None:
    """Mark the storage of the array ``data`` exposed (Note [Sealed storages])."""
    global _exposed_limit
    if isinstance(data, np.ndarray):
        root = _root(data)
        key = id(root)
        if sealed:
            sealed.pop(key, None)
        exposed[key] = weakref.ref(root)
        if len(exposed) > _exposed_limit:
            for dead in [k for k, ref in exposed.items() if ref() is None]:
                del exposed[dead]
            _exposed_limit = max(_EXPOSED_FLOOR, 2 * len(exposed))


def stamp_of(data: np.ndarray) -> tuple[np.ndarray, int] | None:
    """(the storage, its version) of an array of a sealed storage, else None (Note
    [Sealed storages]): two equal stamps mean equal values."""
    if not sealed:
        return None
    root = _root(data)
    return (root, versions.get(id(root), 0)) if id(root) in sealed else None


core.set_tensor_type(Tensor)


def _counts_as_expected() -> bool:
    """Whether _counted_sole is right on tensors of every shape of storage, alone and
    beside another holder (a detached tensor, a view, the storage itself)."""
    f64 = from_numpy(np.dtype(np.float64))
    fresh = [
        from_flat(np.zeros(6), (6,), f64),
        from_flat(np.zeros(6), (2, 3), f64),
        from_array(np.zeros((2, 3))),
        from_array(np.zeros((3, 2)).T),
    ]
    for t in fresh:
        if not _counted_sole(t):
            return False
        for holder in (t.detach, lambda t=t: t._data[:1], lambda t=t: _root(t._data)):
            held = holder()
            if _counted_sole(t):
                return False
            del held
    return True


_COUNTS_AS_EXPECTED = _counts_as_expected()
