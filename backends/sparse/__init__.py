"""sparse — the sparse-check layer: COO sparse tensors and their kernels.

Every kernel here is registered at the SPARSE dispatch key. A sparse tensor's key set
is ``CPU | SPARSE`` (Note [Sparse tensors] in ``storage.py``) and SPARSE ranks above the
backend keys (Note [Key priority]), so any call with a sparse input lands here, and a
call with only dense inputs never does: its key set lacks the bit, so the layer costs
it nothing. An operator without a kernel here raises NotImplementedError naming it
(Note [Fallthrough]): a sparse input is never densified silently.

Note [Sparse values math]: an operator that keeps the sparsity pattern (f(0) == 0:
``negative``, ``abs``, ``x * 2``, sparse * dense) runs on the values array with the dense
operator one level below this layer (redispatch: SPARSE masked off the call's key set,
then that operator's table indexed), so dtype rules, errors and kernels are the
backend's own. The structural work (coalesce, merges, scatter-add, spmm) is done by the
Numba kernels in ``kernels.py``.

Results: sparse ± sparse, sparse * scalar, sparse * dense and sparse * sparse, the
pattern-keeping unary operators and transposes are sparse; sparse ± dense (or a
scalar), ``sum`` and matrix products with a dense operand are dense. Sparse operands of
an elementwise operator do not broadcast: a dense partner may broadcast to the sparse
shape, not the other way round.
"""

import numpy as np

from lamina.backends import setup as S
from lamina.backends.hookspecs import hookimpl
from lamina.backends.threads import PARALLEL_ELEMENTS, get_num_threads
from lamina.dispatch.keys import SPARSE
from lamina.dispatch.meta import reduced_shape
from lamina.dispatch.schema import OPERATORS, tagged
from lamina.dispatch.tensor import from_array

from . import kernels as K
from .storage import COO, from_dense, make, sparse_coo_tensor

__all__ = ["COO", "from_dense", "make", "sparse_coo_tensor"]

# Unary operators with f(0) == 0 (for every dtype they accept): the pattern is kept.
PATTERN_UNARY = [op.name for op in tagged("keeps_zero")]

# ---------------------------------------------------------------- helpers


def _is_sparse(x):
    return getattr(x, "_ks", 0) & SPARSE


def _below(ks, name, *args):
    """``name`` one level below this layer (Note [Sparse values math])."""
    op = OPERATORS[name]
    below = ks & ~SPARSE & op.mask
    return op.table[below.bit_length()](below, *args)


def _as(values, dtype):
    return values if values.dtype == dtype.np else values.astype(dtype.np)


def _row_major(shape, keep=None):
    """Row-major strides (in elements) of ``shape``'s kept dims; 0 for the others."""
    strides, step = [0] * len(shape), 1
    for d in reversed(range(len(shape))):
        if keep is None or d in keep:
            strides[d] = step
            step *= shape[d]
    return np.array(strides, np.int64)


def _keys(c):
    """The row-major position of every entry (the sort key of coalesce), computed once
    per storage: indices never change after a sparse tensor is made."""
    keys = c.keys
    if keys is None:
        keys = c.keys = K.run_linear_keys(c.indices, _row_major(c.shape))
    return keys


def _same_shape(name, a, b):
    if a.shape != b.shape:
        raise ValueError(
            f"{name}: sparse operands must have the same shape (sparse "
            f"tensors do not broadcast), got {a.shape} and {b.shape}"
        )


def _dense_partner_shape(name, c, dense):
    shape = S.broadcast_shapes(name, c.shape, S.shape_of(dense))
    if shape != c.shape:
        raise ValueError(
            f"{name}: a sparse operand of shape {c.shape} does not broadcast "
            f"to {shape} (the dense operand's shape {S.shape_of(dense)}); "
            "only the dense operand may broadcast"
        )


def _threads_for(work):
    return work >= PARALLEL_ELEMENTS and get_num_threads() > 1


# ---------------------------------------------------------------- conversion


def to_dense(ks, x):
    c = x._data
    out = np.zeros(c.shape, c.values.dtype)
    if c.values.size:
        K.run_scatter_add(out.reshape(-1), _keys(c), c.values)
    return from_array(out)


def to_sparse(ks, x):
    return x  # already sparse


def sparse_mask(ks, x, mask):
    """x's values at mask's entries as stored (duplicates too), on mask's pattern (x
    dense, of mask's shape)."""
    c = mask._data
    if S.shape_of(x) != c.shape:
        raise ValueError(f"sparse_mask: x has shape {S.shape_of(x)}, the mask {c.shape}")
    values = x._data[tuple(c.indices)] if c.values.size else x._data.reshape(-1)[:0]
    return make(c.indices, np.ascontiguousarray(values), c.shape, c.coalesced)


# Dense inputs of the conversions (the CPU key): this plugin owns the COO layout, so it
# converts to it too.


def dense_to_dense(ks, x):
    return x  # already dense


def dense_to_sparse(ks, x):
    return from_dense(x._data, x._shape)


def dense_coalesce(ks, x):
    raise TypeError(
        "coalesce: expected a sparse tensor, got a dense one (make one with "
        "to_sparse() or lamina.sparse_coo_tensor)"
    )


def dense_sparse_mask(ks, x, mask):
    raise TypeError("sparse_mask: the mask must be a sparse tensor, got a dense one")


def coalesce(ks, x):
    c = x._data
    if c.coalesced:
        return x
    indices, values = K.run_coalesce(_keys(c), c.indices, c.values)
    return make(indices, values, c.shape, True)


# ---------------------------------------------------------------- elementwise


def _pattern_unary(name):
    linear = name in ("negative", "positive")  # f(a + b) == f(a) + f(b)

    def kernel(ks, x):
        # the others see each index once: f(a) + f(b) is not f(a + b) for duplicates
        c = x._data if linear else coalesce(ks, x)._data
        values = _below(ks, name, from_array(c.values))._data
        return make(c.indices, np.ascontiguousarray(values), c.shape, c.coalesced)

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def _add_like(name):
    op = OPERATORS[name]

    def kernel(ks, a, b):
        comp = S.promote(op, (a, b))
        if _is_sparse(a) and _is_sparse(b):
            return _sparse_plus_sparse(ks, name, a._data, b._data, comp)
        return _sparse_plus_dense(name, a, b, comp)

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def _sparse_plus_sparse(ks, name, ca, cb, comp):
    _same_shape(name, ca, cb)
    va, vb = _as(ca.values, comp), _as(cb.values, comp)
    if name == "subtract":
        vb = _below(ks, "negative", from_array(vb))._data
    if ca.coalesced and cb.coalesced:  # a merge of two sorted lists stays coalesced
        indices, values = K.run_merge_add(_keys(ca), ca.indices, va, _keys(cb), cb.indices, vb)
        return make(indices, values, ca.shape, True)
    return make(
        np.concatenate([ca.indices, cb.indices], axis=1),
        np.concatenate([va, vb]),
        ca.shape,
        va.size + vb.size <= 1,
    )


def _sparse_plus_dense(name, a, b, comp):
    sparse_first = bool(_is_sparse(a))
    s, d = (a, b) if sparse_first else (b, a)
    c = s._data
    _dense_partner_shape(name, c, d)
    dense = S.operand(d, comp)
    if dense.shape == c.shape:
        out = np.array(dense, order="C")  # one copy (np.empty and a fill cost two calls)
    else:
        out = np.empty(c.shape, comp.np)
        out[...] = dense
    values = _as(c.values, comp)
    if name == "subtract":
        if sparse_first:
            np.negative(out, out=out)  # s - d == -d + s
        else:
            values = np.negative(values)
    if values.size:
        K.run_scatter_add(out.reshape(-1), _keys(c), values)
    return from_array(out)


def _add_inplace(name):
    op = OPERATORS[name]

    def kernel(ks, x1, x2):
        if _is_sparse(x1):
            raise NotImplementedError(
                f"{name}: sparse tensors are not updated in place; write "
                f"x = x {'+' if name == 'add_' else '-'} y instead"
            )
        c = x2._data
        comp = S.promote(op, (x1, x2))
        S.inplace_check(op, x1, S.result_dtype(op, comp), c.shape)
        values = _as(c.values, comp)
        if name == "subtract_":
            values = np.negative(values)
        if values.size:
            keys = _keys(c)
            if x1._flat is not None:
                K.run_scatter_add(x1._flat, keys, values)
            else:  # a strided view: add into a contiguous copy, then write it back
                tmp = np.ascontiguousarray(x1._data)
                K.run_scatter_add(tmp.reshape(-1), keys, values)
                x1._data[...] = tmp
        return x1

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def multiply(ks, a, b):
    comp = S.promote(OPERATORS["multiply"], (a, b))
    if _is_sparse(a) and _is_sparse(b):
        ca, cb = coalesce(ks, a)._data, coalesce(ks, b)._data
        _same_shape("multiply", ca, cb)
        indices, values = K.run_intersect_multiply(
            _keys(ca), ca.indices, _as(ca.values, comp), _keys(cb), _as(cb.values, comp)
        )
        return make(indices, values, ca.shape, True)
    s, d = (a, b) if _is_sparse(a) else (b, a)
    c = s._data
    if S.scalar_value(d) is not None:
        values = _below(ks, "multiply", from_array(c.values), d)._data
    else:  # only the entries the sparse operand has: the result keeps its pattern
        _dense_partner_shape("multiply", c, d)
        picked = np.broadcast_to(S.operand(d, comp), c.shape)[tuple(c.indices)]
        values = _below(
            ks,
            "multiply",
            from_array(_as(c.values, comp)),
            from_array(np.ascontiguousarray(picked)),
        )._data
    # kernels take C-contiguous values (Note [Sparse kernel cache]); a new array here
    return make(c.indices, np.ascontiguousarray(values), c.shape, c.coalesced)


# ---------------------------------------------------------------- reductions


def sum_(ks, x, axis, dtype, keepdims):
    res = S.sum_dtype(OPERATORS["sum"], x, dtype)
    kind, narrow = x._dtype.kind, x._dtype.itemsize < 8
    # the tensor is its dense form: duplicates must add up (in the values' dtype) before
    # a cast or a sum in a wider integer; float64, int64 and uint64 give the same either way
    c = coalesce(ks, x)._data if res.kind != kind or (kind in "iu" and narrow) else x._data
    # as numba_cpu: cast to the requested dtype first, accumulate in 64 bits
    values = c.values if res.kind == kind else c.values.astype(res.np)
    acc = {"f": np.float64, "i": np.int64, "u": np.uint64, "b": np.bool_}[res.kind]
    values = values.astype(acc, copy=False)
    kept = [d for d in range(len(c.shape)) if d not in axis]
    out = np.zeros(int(np.prod([c.shape[d] for d in kept])), acc)
    if values.size and out.size:
        keys = K.run_linear_keys(c.indices, _row_major(c.shape, kept))
        K.run_scatter_add(out, keys, values)
    out = out.reshape(reduced_shape(c.shape, axis, keepdims))
    return from_array(out.astype(res.np, copy=False))


# ---------------------------------------------------------------- shape


def matrix_transpose(ks, x):
    c = x._data
    return make(np.ascontiguousarray(c.indices[::-1]), c.values, c.shape[::-1], c.values.size <= 1)


def permute_dims(ks, x, axes):
    c = x._data
    if list(axes) == sorted(axes):
        return x
    return make(
        np.ascontiguousarray(c.indices[list(axes)]),
        c.values,
        tuple(c.shape[a] for a in axes),
        c.values.size <= 1,
    )


# ---------------------------------------------------------------- matrix products


def matmul(ks, x1, x2):
    """sparse @ dense (spmm) and dense @ sparse, 1-D operands as in ``matmul``."""
    if _is_sparse(x1) and _is_sparse(x2):
        raise NotImplementedError(
            "matmul: sparse @ sparse has no sparse kernel; convert one operand with .to_dense()"
        )
    comp = S.promote(OPERATORS["matmul"], (x1, x2))
    sparse_left = bool(_is_sparse(x1))
    s, d = (x1, x2) if sparse_left else (x2, x1)
    c = s._data
    if len(d._shape) not in (1, 2):
        raise ValueError(
            f"matmul: a sparse operand needs a 1-D or 2-D dense operand, got "
            f"shapes {x1._shape} and {x2._shape}"
        )
    dense = np.ascontiguousarray(S.operand(d, comp))
    values = np.ascontiguousarray(_as(c.values, comp))
    zeros = np.zeros(values.size, np.int64)
    # (rows, cols) of the sparse operand as a matrix; 1-D operands become a row (left)
    # or a column (right), as matmul promotes them
    if len(c.shape) == 2:
        rows, cols, (m, k) = c.indices[0], c.indices[1], c.shape
    elif sparse_left:
        rows, cols, (m, k) = zeros, c.indices[0], (1, c.shape[0])
    else:
        rows, cols, (m, k) = c.indices[0], zeros, (c.shape[0], 1)
    if dense.ndim == 1:
        dense = dense.reshape((-1, 1) if sparse_left else (1, -1))
    a_shape, b_shape = ((m, k), dense.shape) if sparse_left else (dense.shape, (m, k))
    if a_shape[1] != b_shape[0]:
        raise ValueError(
            f"matmul: shapes {x1._shape} and {x2._shape} do not match "
            f"(contracted dimensions {a_shape[1]} != {b_shape[0]})"
        )
    out = np.zeros((a_shape[0], b_shape[1]), comp.np)
    if sparse_left:
        parallel = _threads_for(values.size * out.shape[1])
        if c.coalesced and len(c.shape) == 2:  # rows sorted: row by row, in parallel
            starts = np.searchsorted(rows, np.arange(m + 1, dtype=np.int64))
            K.run_spmm(rows, cols, values, dense, out, starts.astype(np.int64), parallel)
        else:
            K.run_spmm(rows, cols, values, dense, out)
    elif out.shape[0] <= 4:  # a few dense rows: each reads every entry once
        K.run_dense_spmm(dense, rows, cols, values, out)
    else:  # out.T = S.T @ dense.T: one pass over the entries (4x faster at 64 rows)
        out_t = np.zeros(out.shape[::-1], comp.np)
        K.run_spmm(cols, rows, values, np.ascontiguousarray(dense.T), out_t)
        out = np.ascontiguousarray(out_t.T)
    shape = (() if len(x1._shape) == 1 else out.shape[:1]) + (
        () if len(x2._shape) == 1 else out.shape[1:]
    )
    return from_array(out.reshape(shape))


# ---------------------------------------------------------------- registration


def _kernels():
    found = {name: _pattern_unary(name) for name in PATTERN_UNARY}
    found.update(
        {
            "add": _add_like("add"),
            "subtract": _add_like("subtract"),
            "add_": _add_inplace("add_"),
            "subtract_": _add_inplace("subtract_"),
            "sum": sum_,
        }
    )
    for fn in (
        multiply,
        matmul,
        matrix_transpose,
        permute_dims,
        to_dense,
        to_sparse,
        coalesce,
        sparse_mask,
    ):
        found[fn.__name__] = fn
    return found


@hookimpl
def lamina_register_kernels(registry):
    for name, fn in _kernels().items():
        registry.register(name, "sparse", fn)
    for name, fn in (
        ("to_dense", dense_to_dense),
        ("to_sparse", dense_to_sparse),
        ("coalesce", dense_coalesce),
        ("sparse_mask", dense_sparse_mask),
    ):
        registry.register(name, "cpu", fn)
