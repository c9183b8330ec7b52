"""Sorting, searching and set functions of the CPU backend: NumPy's sorts (a radix
sort for small integers, timsort otherwise, both stable) and searches are the right
tool here, so these kernels add the Array API's semantics around them (descending
order that stays stable, NaN placement, named results, int64 indices)."""

import numpy as np

from lamina.backends import setup as S
from lamina.dispatch import result_types
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array


def _order(data, axis, descending):
    """The stable sorting permutation along axis. Descending: the stable ascending
    order of the reversed axis, reversed again, keeps equal elements in their order."""
    if not descending:
        return np.argsort(data, axis=axis, kind="stable")
    n = data.shape[axis]
    flipped = np.argsort(np.flip(data, axis), axis=axis, kind="stable")
    return n - 1 - np.flip(flipped, axis)


def sort(ks, x, axis, descending, stable):
    S.check_dtype(OPERATORS["sort"], x._dtype)  # complex numbers have no order
    if not descending:
        return from_array(np.sort(x._data, axis=axis, kind="stable"))
    order = _order(x._data, axis, True)
    return from_array(np.take_along_axis(x._data, order, axis))


def argsort(ks, x, axis, descending, stable):
    S.check_dtype(OPERATORS["argsort"], x._dtype)
    return from_array(_order(x._data, axis, descending).astype(np.int64, copy=False))


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
