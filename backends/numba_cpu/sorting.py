"""Sorting, searching and set functions of the CPU backend: NumPy's sorts (a radix
sort for small integers, timsort otherwise, both stable) and searches are the right
tool here, so these kernels add the Array API's semantics around them (descending
order that stays stable, NaN placement, named results, int64 indices)."""

import numpy as np

from lamina.backends import setup as S
from lamina.backends import threads
from lamina.dispatch import dtypes as D
from lamina.dispatch import result_types
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array, from_flat


def _order(data, axis, descending):
    """The stable sorting permutation along axis. Descending: the stable ascending
    order of the reversed axis, reversed again, keeps equal elements in their order."""
    if not descending:
        return np.argsort(data, axis=axis, kind="stable")
    n = data.shape[axis]
    flipped = np.argsort(np.flip(data, axis), axis=axis, kind="stable")
    return n - 1 - np.flip(flipped, axis)


# Note [Parallel sorts]: on lamina's threads (lamina.backends.threads.split) a
# contiguous tensor sorted along its last axis is sorted rows by rows, each thread a
# block of rows (NumPy's sorts release the GIL), as PyTorch does; one row (a 1-D
# tensor) stays on one thread: merging sorted halves would add a pass over the data.
_parallel_min = float("inf")  # Note [Parallel threshold] (lamina.backends.threads)


def _set_threshold(threshold):
    global _parallel_min
    _parallel_min = threshold


threads.on_change(_set_threshold)


def sort(ks, x, axis, descending, stable):
    S.check_dtype(OPERATORS["sort"], x._dtype)  # complex numbers have no order
    flat = x._flat
    if flat is None or descending:
        return _sort_general(x._data, axis, descending)
    # The common case: a contiguous tensor, sorted in place in a copy by the ndarray
    # method (np.sort's wrapper and from_array's inspection cost more than a 100-element
    # sort itself).
    out = flat.copy()
    shape = x._shape
    if flat.size < _parallel_min or axis != len(shape) - 1:
        out.reshape(shape).sort(axis, kind="stable")
    else:
        rows = out.reshape(-1, shape[-1])
        threads.split(lambda start, stop: rows[start:stop].sort(-1, kind="stable"), len(rows))
    return from_flat(out, shape, x._dtype)


def _sort_general(data, axis, descending):
    if not descending:
        out = data.copy(order=S.copy_order(data))
        out.sort(axis=axis, kind="stable")
        return from_array(out)
    return from_array(np.take_along_axis(data, _order(data, axis, True), axis))


def argsort(ks, x, axis, descending, stable):
    S.check_dtype(OPERATORS["argsort"], x._dtype)
    if descending:
        return from_array(_order(x._data, axis, True).astype(np.int64, copy=False))
    # The ndarray method, not np.argsort's wrapper; its result is a new C-contiguous
    # array of intp (int64 on the 64-bit platforms lamina runs on; astype checks it).
    data, shape = x._data, x._shape
    if x._flat is None or x._flat.size < _parallel_min or axis != len(shape) - 1:
        order = data.argsort(axis, kind="stable").astype(np.int64, copy=False)
        return from_flat(order.reshape(-1), shape, D.int64)
    rows, order = data.reshape(-1, shape[-1]), np.empty(x._flat.size, np.int64)
    order_rows = order.reshape(rows.shape)

    def argsort_rows(start, stop):
        order_rows[start:stop] = rows[start:stop].argsort(-1, kind="stable")

    threads.split(argsort_rows, len(rows))
    return from_flat(order, shape, D.int64)


def searchsorted(ks, x1, x2, side, sorter):
    comp = S.promote(OPERATORS["searchsorted"], (x1, x2))
    a, v = S.operand(x1, comp), S.operand(x2, comp)
    order = None if sorter is None else sorter._data
    return from_array(np.asarray(np.searchsorted(a, v, side=side, sorter=order), np.int64))


def nonzero(ks, x):
    return tuple(from_array(i.astype(np.int64, copy=False)) for i in np.nonzero(x._data))


def _unique(x):
    """(values, first indices, inverse, counts) with every NaN distinct (Array API)."""
    flat = x._data.reshape(-1)
    order = np.argsort(flat, kind="stable")
    ordered = flat[order]
    starts = np.ones(flat.size, bool)
    starts[1:] = ordered[1:] != ordered[:-1]  # NaN != NaN: each NaN starts a group
    group = np.cumsum(starts) - 1
    values = ordered[starts]
    first = order[starts]
    inverse = np.empty(flat.size, np.int64)
    inverse[order] = group
    counts = np.diff(np.append(np.flatnonzero(starts), flat.size))
    return (
        from_array(values),
        from_array(first.astype(np.int64)),
        from_array(inverse.reshape(x._shape)),
        from_array(counts.astype(np.int64)),
    )


def unique_all(ks, x):
    return result_types.UniqueAllResult(*_unique(x))


def unique_counts(ks, x):
    values, _, _, counts = _unique(x)
    return result_types.UniqueCountsResult(values, counts)


def unique_inverse(ks, x):
    values, _, inverse, _ = _unique(x)
    return result_types.UniqueInverseResult(values, inverse)


def unique_values(ks, x):
    return _unique(x)[0]


def register(registry):
    for fn in (
        sort,
        argsort,
        searchsorted,
        nonzero,
        unique_all,
        unique_counts,
        unique_inverse,
        unique_values,
    ):
        registry.register(fn.__name__, "cpu", fn)
