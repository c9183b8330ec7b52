"""Kernels of the CPU backend that compute no values, or only copy them: views (new
strides over the same storage), indexing, conversion. NumPy's own view and indexing
machinery does the work; what lamina adds is the operator's semantics (dtype rules of
setitem, PyTorch's 0-d views, read-only broadcasts) and the tensors."""

import itertools

import numpy as np

from lamina.backends import setup as S
from lamina.dispatch import dtypes as D
from lamina.dispatch import keys, layouts
from lamina.dispatch.devices import move
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array

# A view keeps its base's device (and sparse) keys but not AUTOGRAD: only the autograd
# layer marks results as requiring grad (Note [Autograd fields]).
_NO_AUTOGRAD = ~keys.AUTOGRAD


def _view_of(x, data):
    return from_array(data, x._ks & _NO_AUTOGRAD)


def reshape(ks, x, shape, copy):
    if copy:
        return from_array(x._data.reshape(shape).copy())
    data = x._data.reshape(shape)
    if copy is False and not np.shares_memory(data, x._data) and data.size:
        raise ValueError(
            f"reshape: cannot reshape a tensor of shape {x._shape} with "
            f"strides {x._data.strides} to {shape} without copying (copy=False)"
        )
    return _view_of(x, data)


def permute_dims(ks, x, axes):
    return _view_of(x, x._data.transpose(axes))


def matrix_transpose(ks, x):
    return _view_of(x, np.swapaxes(x._data, -1, -2))


def expand_dims(ks, x, axis):
    return _view_of(x, np.expand_dims(x._data, axis))


def squeeze(ks, x, axis):
    return _view_of(x, np.squeeze(x._data, axis))


def flip(ks, x, axis):
    return _view_of(x, np.flip(x._data, axis))


def broadcast_to(ks, x, shape):
    return _view_of(x, np.broadcast_to(x._data, shape))


def split(ks, x, sections, axis):
    """Slices of x along ``axis`` at the description's cuts (``layouts.split_bounds``)."""
    n = x._shape[axis]
    bounds = [0, *layouts.split_bounds(n, sections), n]
    lead = (slice(None),) * axis
    return tuple(_view_of(x, x._data[(*lead, slice(a, b))]) for a, b in itertools.pairwise(bounds))


def unwrap_index(key):
    """An indexing key with tensors replaced by their NumPy arrays."""
    if isinstance(key, tuple):
        return tuple(unwrap_index(k) for k in key)
    data = getattr(key, "_data", None)
    return key if data is None else data


def getitem(ks, x, key):
    key = unwrap_index(key)
    out = x._data[key]
    if not isinstance(out, np.ndarray):  # an integer per dim gives a NumPy scalar (a
        # copy); with a trailing Ellipsis NumPy gives a 0-d view instead, as PyTorch does
        out = x._data[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
    return _view_of(x, out)


def setitem(ks, x, key, value):
    v = S.scalar_value(value)
    if v is None:
        if not hasattr(value, "_dtype"):
            raise TypeError(
                f"setitem: the value must be a tensor or a Python scalar, got "
                f"{type(value).__name__}"
            )
        src = value._dtype
    else:
        src = (
            D.PROMOTE[x._dtype.index][S.promote(OPERATORS["add"], (x, v)).index]
            if x._dtype.kind != "b"
            else S.promote(OPERATORS["equal"], (x, v))
        )
    if not D.can_cast(src, x._dtype) and not (v is not None and src.kind == x._dtype.kind):
        how = (
            "without changing their kind"
            if src.kind != x._dtype.kind
            else "without a narrowing cast, which may change them"
        )
        raise TypeError(
            f"setitem: cannot store {src} values into a {x._dtype} tensor {how} "
            "(cast them explicitly with astype)"
        )
    if not x._data.flags.writeable:
        raise ValueError("setitem: the tensor is a read-only view (e.g. from broadcast_to)")
    try:
        x._data[unwrap_index(key)] = S.operand(value, x._dtype)
    except ValueError as exc:  # shape mismatch: name the operator and both shapes
        raise ValueError(
            f"setitem: cannot store a value of shape {S.shape_of(value)} into "
            f"a selection of a tensor of shape {x._shape}: {exc}"
        ) from None
    return x


def index_add(ks, x, key, values):
    """A copy of x with values added at x[key] (np.add.at: repeated indices add up)."""
    comp = S.promote(OPERATORS["index_add"], (x, values))
    out = x._data.astype(comp.np, order=S.copy_order(x._data), copy=True)
    np.add.at(out, unwrap_index(key), S.operand(values, comp))
    return from_array(out)


def astype(ks, x, dtype, copy):
    if not copy and dtype is x._dtype:
        return x
    S.check_cast("astype", x._data, dtype)
    return from_array(x._data.astype(dtype.np, order=S.copy_order(x._data)))


def copy(ks, x):
    return from_array(x._data.copy(order=S.copy_order(x._data)))  # keeping the layout


def to_device(ks, x, device):
    return move(x, device)  # the target device's converter (docs/backends.md, Moves)


def register(registry):
    for fn in (
        reshape,
        permute_dims,
        matrix_transpose,
        expand_dims,
        squeeze,
        flip,
        broadcast_to,
        split,
        getitem,
        setitem,
        index_add,
        astype,
        copy,
        to_device,
    ):
        registry.register(fn.__name__, "cpu", fn)
