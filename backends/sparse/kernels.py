"""Numba kernels of the sparse layer: the structural work on COO storage (linear keys,
coalesce, merges, scatter-add, sparse-dense matrix products). Sorting is NumPy's.

Math that keeps a sparsity pattern as it is (``negative``, ``abs``, ``x * 2``) is not
here: the layer runs it on the values array with the backend's dense kernels
(Note [Sparse values math] in ``__init__.py``).

Note [Sparse kernel cache]: unlike numba_cpu's templates these are plain module-level
functions, so Numba's disk cache (``cache=True``) keys each by its name in this file and
the signature. Each is compiled once per values dtype for an explicit signature
(``lamina.backends.jit``, Note [Kernel signatures]) and called through its compiled
entry point. Callers therefore pass exactly the signature's types: C-contiguous arrays
of the named dtypes.

Indices are validated when a sparse tensor is made (``storage.py``) and never change
afterwards, so these kernels index without bounds checks.
"""

import numpy as np

from lamina.backends import jit

# ---------------------------------------------------------------- kernels


def linear_keys(indices, strides, out):
    """out[e] = the row-major position of entry e: sum over d of indices[d, e] * strides[d].
    A stride of 0 drops a dimension (the reduced dims of ``sum``)."""
    nd, n = indices.shape
    for e in range(n):
        k = 0
        for d in range(nd):
            k += indices[d, e] * strides[d]
        out[e] = k


def is_sorted(keys):
    for e in range(1, keys.size):  # noqa: SIM110 (a Numba kernel: a loop, not a generator)
        if keys[e] < keys[e - 1]:
            return False
    return True


def coalesce(keys, order, indices, values, out_indices, out_values):
    """Visit entries in ``order`` (sorted by key; the caller sorts stably, so duplicates
    are summed in the order they were given, the order ``to_dense`` adds them in) and
    sum duplicates; returns how many unique entries it wrote."""
    n = keys.size
    if n == 0:
        return 0
    nd = indices.shape[0]
    m = 0
    first = order[0]
    last = keys[first]
    out_values[0] = values[first]
    for d in range(nd):
        out_indices[d, 0] = indices[d, first]
    for t in range(1, n):
        e = order[t]
        k = keys[e]
        if k == last:
            out_values[m] += values[e]
        else:
            m += 1
            last = k
            out_values[m] = values[e]
            for d in range(nd):
                out_indices[d, m] = indices[d, e]
    return m + 1


def merge_add(ka, ia, va, kb, ib, vb, out_indices, out_values):
    """The union of two coalesced operands (sorted, unique keys), adding the values
    where both have an entry; the result is coalesced. Returns the entry count."""
    na, nb, nd = ka.size, kb.size, ia.shape[0]
    i = j = m = 0
    while i < na or j < nb:
        if j == nb or (i < na and ka[i] < kb[j]):
            out_values[m] = va[i]
            for d in range(nd):
                out_indices[d, m] = ia[d, i]
            i += 1
        elif i == na or kb[j] < ka[i]:
            out_values[m] = vb[j]
            for d in range(nd):
                out_indices[d, m] = ib[d, j]
            j += 1
        else:
            out_values[m] = va[i] + vb[j]
            for d in range(nd):
                out_indices[d, m] = ia[d, i]
            i += 1
            j += 1
        m += 1
    return m


def intersect_multiply(ka, ia, va, kb, vb, out_indices, out_values):
    """The entries two coalesced operands share, values multiplied; coalesced."""
    na, nb, nd = ka.size, kb.size, ia.shape[0]
    i = j = m = 0
    while i < na and j < nb:
        if ka[i] < kb[j]:
            i += 1
        elif kb[j] < ka[i]:
            j += 1
        else:
            out_values[m] = va[i] * vb[j]
            for d in range(nd):
                out_indices[d, m] = ia[d, i]
            i += 1
            j += 1
            m += 1
    return m


def scatter_add(out, keys, values):
    """out[keys[e]] += values[e]: to_dense, sparse + dense, sum over axes."""
    for e in range(keys.size):
        out[keys[e]] += values[e]


def spmm_coo(rows, cols, values, dense, out):
    """out += S @ dense for S in COO form, entries in any order (serial)."""
    n = dense.shape[1]
    for e in range(rows.size):
        r, c, v = rows[e], cols[e], values[e]
        for j in range(n):
            out[r, j] += v * dense[c, j]


def spmm_rows(starts, cols, values, dense, out):
    """out = S @ dense for S with entries sorted by row (coalesced); ``starts[r]`` is
    the first entry of row r. Rows are independent, so this one runs in parallel."""
    n = dense.shape[1]
    for r in jit.prange(starts.size - 1):
        for e in range(starts[r], starts[r + 1]):
            c, v = cols[e], values[e]
            for j in range(n):
                out[r, j] += v * dense[c, j]


def dense_spmm(dense, rows, cols, values, out):
    """out = dense @ S, row by row: for a few dense rows (more go through spmm_coo with
    the operands transposed, one pass over the entries)."""
    for r in range(dense.shape[0]):
        for e in range(rows.size):
            out[r, cols[e]] += dense[r, rows[e]] * values[e]


# ---------------------------------------------------------------- compilation
# Entry points per values dtype (lamina.backends.jit): each signature is built once,
# when its entry is first needed.


def _by_values(fn, signature_of, parallel=False):
    """A Family of ``fn`` per values dtype; ``signature_of(types, values, dense, index,
    index_2d)`` makes its signature from those Numba types."""

    def signature(d):
        return signature_of(jit.types, jit.array(d), jit.array(d, 2), jit.index(), jit.index(2))

    return jit.kernel_family(fn, signature, parallel)


def _index_kernel(fn, signature_of):
    """The entry point of a kernel on indices only: ``signature_of(types, index,
    index_2d)`` makes its one signature."""
    return jit.cached(
        fn, lambda: jit.compile_kernel(fn, signature_of(jit.types, jit.index(), jit.index(2)))
    )


_COALESCE = _by_values(coalesce, lambda t, v, m, i, i2: t.intp(i, i, i2, v, i2, v))
_MERGE_ADD = _by_values(merge_add, lambda t, v, m, i, i2: t.intp(i, i2, v, i, i2, v, i2, v))
_INTERSECT = _by_values(intersect_multiply, lambda t, v, m, i, i2: t.intp(i, i2, v, i, v, i2, v))
_SCATTER_ADD = _by_values(scatter_add, lambda t, v, m, i, i2: t.void(v, i, v))
_SPMM_COO = _by_values(spmm_coo, lambda t, v, m, i, i2: t.void(i, i, v, m, m))
_SPMM_ROWS = _by_values(spmm_rows, lambda t, v, m, i, i2: t.void(i, i, v, m, m))
_SPMM_ROWS_PARALLEL = _by_values(
    spmm_rows, lambda t, v, m, i, i2: t.void(i, i, v, m, m), parallel=True
)
_DENSE_SPMM = _by_values(dense_spmm, lambda t, v, m, i, i2: t.void(m, i, i, v, m))


def run_linear_keys(indices, strides):
    out = np.empty(indices.shape[1], np.int64)
    _index_kernel(linear_keys, lambda t, i, i2: t.void(i2, i, i))(indices, strides, out)
    return out


def run_coalesce(keys, indices, values):
    """(indices, values) coalesced, as new arrays."""
    # NumPy's stable argsort (timsort) beats Numba's mergesort by about 1.5x here
    ordered = _index_kernel(is_sorted, lambda t, i, i2: t.boolean(i))(keys)
    order = np.arange(keys.size) if ordered else np.argsort(keys, kind="stable")
    out_i = np.empty_like(indices)
    out_v = np.empty_like(values)
    n = _COALESCE.of(values)(
        keys, order.astype(np.int64, copy=False), indices, values, out_i, out_v
    )
    return np.ascontiguousarray(out_i[:, :n]), out_v[:n].copy()


def run_merge_add(ka, ia, va, kb, ib, vb):
    nd = ia.shape[0]
    out_i = np.empty((nd, ka.size + kb.size), np.int64)
    out_v = np.empty(ka.size + kb.size, va.dtype)
    n = _MERGE_ADD.of(va)(ka, ia, va, kb, ib, vb, out_i, out_v)
    return np.ascontiguousarray(out_i[:, :n]), out_v[:n].copy()


def run_intersect_multiply(ka, ia, va, kb, vb):
    nd, size = ia.shape[0], min(ka.size, kb.size)
    out_i = np.empty((nd, size), np.int64)
    out_v = np.empty(size, va.dtype)
    n = _INTERSECT.of(va)(ka, ia, va, kb, vb, out_i, out_v)
    return np.ascontiguousarray(out_i[:, :n]), out_v[:n].copy()


def run_scatter_add(out_flat, keys, values):
    _SCATTER_ADD.of(values)(out_flat, keys, values)


def run_spmm(rows, cols, values, dense, out, starts=None, parallel=False):
    """out (zeros, C-contiguous) += S @ dense; ``starts``: row starts of sorted rows."""
    if starts is None:
        _SPMM_COO.of(values)(rows, cols, values, dense, out)
    else:
        (_SPMM_ROWS_PARALLEL if parallel else _SPMM_ROWS).of(values)(
            starts, cols, values, dense, out
        )


def run_dense_spmm(dense, rows, cols, values, out):
    _DENSE_SPMM.of(values)(dense, rows, cols, values, out)
