"""COO storage of sparse tensors, and building them from user input (validated) or from
kernel results (trusted). Pure Python and NumPy: no kernels here.

Note [Sparse tensors]: a sparse tensor is an ordinary ``Tensor`` whose key set is
``CPU | SPARSE`` and whose ``_data`` is a ``COO``: ``indices`` (int64, shape
(ndim, nnz), C-contiguous), ``values`` (1-D, C-contiguous, the tensor's dtype),
``shape`` and ``coalesced`` (entries sorted in row-major order with no duplicates).
``_shape`` and ``_dtype`` are set as for dense tensors, so ``.shape``, ``.dtype`` and
``.ndim`` just work; ``_flat`` is None, so no dense fast path ever takes one. Entries
with the same index are summed (an uncoalesced tensor may hold duplicates). Indices are
checked once, here, and never change afterwards (``indices()`` is read-only), so the
Numba kernels index without bounds checks. 1-D and 2-D; int and float values.
"""

import numpy as np

from lamina.dispatch import arguments as A
from lamina.dispatch import dtypes as D
from lamina.dispatch import keys
from lamina.dispatch.tensor import Tensor

SPARSE_KS = keys.CPU | keys.SPARSE
_new = object.__new__


class COO:
    """Storage of one sparse COO tensor (Note [Sparse tensors])."""

    __slots__ = ("indices", "values", "shape", "coalesced", "keys")

    def __init__(self, indices, values, shape, coalesced):
        self.indices, self.values = indices, values
        self.shape, self.coalesced = shape, coalesced
        self.keys = None  # the entries' row-major positions, computed once (indices never change)

    # Note [Sparse storage guard]: dense code reads ``x._data.dtype``, ``.reshape``,
    # ``np.asarray(x._data)``. A sparse tensor only reaches it by bypassing the
    # dispatcher (with the sparse layer off its slot raises first, see Note [Sparse
    # layer off] in dispatch/entries.py); then it gets this error instead of a wrong
    # result. Attributes that exist never come here, so this costs nothing otherwise.
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise TypeError(_DENSE_ONLY.format(what=f"its storage's .{name}"))

    def __array__(self, dtype=None, copy=None):
        raise TypeError(_DENSE_ONLY.format(what="np.asarray of its storage"))

    def __repr__(self):
        return f"COO(nnz={self.values.size}, shape={self.shape}, coalesced={self.coalesced})"


_DENSE_ONLY = (
    "a sparse tensor reached code for dense tensors ({what}); sparse inputs "
    "are handled by the sparse layer only (convert with .to_dense() first)"
)


def make(indices, values, shape, coalesced):
    """A sparse tensor from trusted parts (kernel results): nothing is checked."""
    t = _new(Tensor)
    t._data = COO(indices, values, shape, coalesced)
    t._flat = None
    t._ks = SPARSE_KS
    t._dtype = D.from_numpy(values.dtype)
    t._shape = shape
    return t


# ---------------------------------------------------------------- user input


def _array(name, obj):
    """A NumPy array from a tensor (dense only), an ndarray or nested sequences."""
    if isinstance(obj, Tensor):
        if obj._ks & keys.SPARSE:
            raise TypeError(f"sparse_coo_tensor: {name} must be a dense tensor, got a sparse one")
        return obj._data, True
    if isinstance(obj, np.ndarray):
        return obj, True
    try:
        return np.asarray(obj), False
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"sparse_coo_tensor: cannot convert {name} ({type(obj).__name__}) to an array: {exc}"
        ) from None


def _check_indices(obj):
    idx, typed = _array("indices", obj)
    if not typed and idx.size == 0:
        idx = idx.astype(np.int64)  # [[], []]: NumPy says float64, the user meant "none"
    if idx.dtype.kind not in "iu":
        raise ValueError(
            f"sparse_coo_tensor: indices must be integers (int64), got dtype {idx.dtype}"
        )
    if idx.ndim != 2:
        raise ValueError(
            f"sparse_coo_tensor: indices must be 2-D, shape (ndim, nnz), got shape {idx.shape}"
        )
    if idx.dtype == np.uint64 and idx.size and idx.max() > np.iinfo(np.int64).max:
        raise IndexError(f"sparse_coo_tensor: index {idx.max()} is out of range")
    return np.array(idx, np.int64, order="C")  # always a copy: the tensor owns it


def _check_values(obj, nnz, dtype):
    vals, _ = _array("values", obj)
    if dtype is not None:
        vals = vals.astype(D.as_dtype(dtype).np)
    elif vals.size == 0 and vals.dtype.kind not in "iuf":
        vals = vals.astype(D.default_float.np)
    elif isinstance(obj, (list, tuple)) and vals.dtype.kind == "f":
        vals = vals.astype(D.default_float.np)  # Python floats: Note [Default dtype]
    if vals.ndim != 1:
        raise ValueError(
            f"sparse_coo_tensor: values must be 1-D, shape (nnz,), got shape {vals.shape}"
        )
    if vals.shape[0] != nnz:
        raise ValueError(
            f"sparse_coo_tensor: indices and values do not match: indices "
            f"hold {nnz} entries (columns) but values holds {vals.shape[0]}"
        )
    if vals.dtype.kind not in "iuf" or vals.dtype == np.float16:
        raise TypeError(
            f"sparse_coo_tensor: values must be of an int or float dtype, got {vals.dtype}"
        )
    return np.array(vals, vals.dtype.newbyteorder("="), order="C")  # a copy, native order


def _check_shape(shape, idx):
    nd = idx.shape[0]
    if shape is None:
        if idx.shape[1] == 0:
            raise ValueError("sparse_coo_tensor: give a shape when there are no entries")
        shape = tuple(int(m) + 1 for m in idx.max(axis=1))
    shape = A.shape(shape, "sparse_coo_tensor", "shape")  # ints, never bools
    if len(shape) not in (1, 2):
        raise ValueError(
            f"sparse_coo_tensor: only 1-D and 2-D sparse tensors are supported, got shape {shape}"
        )
    if any(s < 0 for s in shape):
        raise ValueError(f"sparse_coo_tensor: negative size in shape {shape}")
    if len(shape) != nd:
        raise ValueError(
            f"sparse_coo_tensor: indices have {nd} rows (one per dimension) "
            f"but shape {shape} has {len(shape)} dimensions"
        )
    if int(np.prod(shape, dtype=object)) >= 2**63:
        raise ValueError(f"sparse_coo_tensor: shape {shape} has too many elements")
    return shape


def _check_negative(idx):
    if idx.size and idx.min() < 0:
        d, e = (int(i[0]) for i in np.nonzero(idx < 0))
        raise IndexError(
            f"sparse_coo_tensor: negative index {idx[d, e]} in dimension {d} (entry {e})"
        )


def _check_range(idx, shape):
    if not idx.size:
        return
    for d, size in enumerate(shape):
        row = idx[d]
        high = row.max()
        if high >= size:
            e = int(np.argmax(row))
            raise IndexError(
                f"sparse_coo_tensor: index {high} is out of range for "
                f"dimension {d} of size {size} (entry {e}, shape {shape})"
            )


def sparse_coo_tensor(indices, values, shape=None, *, dtype=None):
    """A sparse COO tensor: entry ``e`` is ``values[e]`` at ``indices[:, e]``.

    ``indices``: integers of shape (ndim, nnz); ``values``: shape (nnz,), int or float;
    ``shape``: 1-D or 2-D (default: one past the largest index in each dimension).
    Entries with the same index are summed; ``coalesce()`` merges them. The arguments
    are copied, and checked here so that no kernel ever sees a bad index.
    """
    idx = _check_indices(indices)
    _check_negative(idx)
    vals = _check_values(values, idx.shape[1], dtype)
    shape = _check_shape(shape, idx)
    _check_range(idx, shape)
    return make(idx, vals, shape, idx.shape[1] <= 1)


def from_dense(data, shape):
    """The nonzero entries of a dense 1-D or 2-D array, coalesced (NumPy's nonzero)."""
    if len(shape) not in (1, 2):
        raise ValueError(
            f"to_sparse: only 1-D and 2-D tensors can be made sparse, got shape {shape}"
        )
    if data.dtype.kind not in "iuf":
        raise TypeError(
            f"to_sparse: sparse tensors hold int or float values, got {D.from_numpy(data.dtype)}"
        )
    where = np.nonzero(data)  # row-major order: sorted, unique
    idx = np.array(where, np.int64).reshape(len(shape), -1)
    return make(np.ascontiguousarray(idx), np.ascontiguousarray(data[where]), shape, True)
