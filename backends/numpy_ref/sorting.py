"""Oracle kernels of the scans, sorts, searches and set functions: NumPy's own
Array API functions where it has them, Python's sort (stable in both directions)
for the sorts."""

import math

import numpy as np

from lamina.backends import setup as S
from lamina.dispatch import result_types
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array


def _scan(npfn, name):
    def kernel(ks, x, axis, dtype, include_initial):
        res = S.sum_dtype(OPERATORS[name], x, dtype)
        data = x._data.astype(res.np)
        return from_array(npfn(data, axis=axis, dtype=res.np, include_initial=include_initial))

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def _python_order(row, descending):
    """Python's sorted() is stable with reverse=True too; NaNs (v != v) sort above
    everything."""
    return sorted(range(len(row)), key=lambda i: (row[i] != row[i], row[i]), reverse=descending)


def _orders(data, axis, descending):
    moved = np.moveaxis(data, axis, -1)
    n = moved.shape[-1]
    rows = moved.reshape(math.prod(moved.shape[:-1]), n).tolist()  # Python scalars: exact
    out = np.array([_python_order(r, descending) for r in rows], np.int64).reshape(-1)
    return np.moveaxis(out.reshape(moved.shape), -1, axis)


def sort(ks, x, axis, descending, stable):
    S.check_dtype(OPERATORS["sort"], x._dtype)  # complex numbers have no order
    return from_array(np.take_along_axis(x._data, _orders(x._data, axis, descending), axis))


def argsort(ks, x, axis, descending, stable):
    S.check_dtype(OPERATORS["argsort"], x._dtype)
    return from_array(_orders(x._data, axis, descending))


def searchsorted(ks, x1, x2, side, sorter):
    comp = S.promote(OPERATORS["searchsorted"], (x1, x2))
    a = S.operand(x1, comp)
    if sorter is not None:
        a = a[sorter._data]
    return from_array(np.asarray(np.searchsorted(a, S.operand(x2, comp), side=side), np.int64))


def nonzero(ks, x):
    return tuple(from_array(np.asarray(i, np.int64)) for i in np.nonzero(x._data))


def unique_all(ks, x):
    r = np.unique_all(x._data)
    return result_types.UniqueAllResult(
        from_array(r.values),
        from_array(r.indices.astype(np.int64)),
        from_array(r.inverse_indices.reshape(x._shape).astype(np.int64)),
        from_array(r.counts.astype(np.int64)),
    )


def unique_counts(ks, x):
    r = np.unique_counts(x._data)
    return result_types.UniqueCountsResult(
        from_array(r.values), from_array(r.counts.astype(np.int64))
    )


def unique_inverse(ks, x):
    r = np.unique_inverse(x._data)
    return result_types.UniqueInverseResult(
        from_array(r.values), from_array(r.inverse_indices.reshape(x._shape).astype(np.int64))
    )


def unique_values(ks, x):
    # sorted, as the other unique functions (NumPy 2.3's unique_values need not sort)
    return from_array(np.unique(x._data, equal_nan=False))


KERNELS = {
    "cumulative_sum": _scan(np.cumulative_sum, "cumulative_sum"),
    "cumulative_prod": _scan(np.cumulative_prod, "cumulative_prod"),
    **{
        fn.__name__: fn
        for fn in (
            sort,
            argsort,
            searchsorted,
            nonzero,
            unique_all,
            unique_counts,
            unique_inverse,
            unique_values,
        )
    },
}
