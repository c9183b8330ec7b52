"""Scans of the CPU backend: cumulative_sum and cumulative_prod, a Numba running fold
over the rows of a 2-D view (the scanned axis last), accumulated in the dtype sum
and prod would use."""

import numpy as np

from lamina.backends import jit
from lamina.backends import setup as S
from lamina.dispatch import core
from lamina.dispatch import dtypes as D
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array

from . import kernels as K
from .layout import rows_view


def _run(step, rows, out, init):
    layout = "C" if rows.flags.c_contiguous else "A"
    entry = jit.cached(
        (K.scan_rows, step, rows.dtype, out.dtype, layout),
        lambda: K.instantiate(
            K.scan_rows,
            (step, range),
            jit.types.void(
                jit.array(rows.dtype, 2, layout), jit.array(out.dtype, 2), jit.types.int64
            ),
        ),
    )
    entry(rows, out, init)


def _scan(name, step, identity):
    op = OPERATORS[name]

    def kernel(ks, x, axis, dtype, include_initial):
        res = S.sum_dtype(op, x, dtype)
        data = x._data if x._dtype is res or x._dtype.kind == "b" else x._data.astype(res.np)
        rows = rows_view(data, (axis,))
        n = rows.shape[1] + int(include_initial)
        out = np.empty((rows.shape[0], n), res.np)
        if out.size:
            _run(step, rows, out, identity)
        shape = x._shape[:axis] + x._shape[axis + 1 :] + (n,)
        if axis == x.ndim - 1:  # the scanned axis is last already
            return from_array(out.reshape(shape))
        return from_array(np.ascontiguousarray(np.moveaxis(out.reshape(shape), -1, axis)))

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


class ScanSpec:
    """What the C core's fast path along the last axis needs of a float scan (Note [C
    rows] in dispatch/csrc/fastpath.c): the dtypes with a loop, the size limit (none:
    scans run serially) and the loops' addresses -- scan_rows compiled as a C function."""

    def __init__(self, step, identity):
        self.step, self.identity, self.limit = step, identity, float("inf")
        self.dtypes = [d if d.name in ("float32", "float64") else None for d in D.ALL]

    def address(self, form, index):
        d, identity = D.ALL[index], self.identity

        def build(cache):
            scan = jit.jitable(K.scan_rows(self.step, range), inline="always")

            def kernel(x, out):
                scan(x, out, identity)

            return K.c_loop(K.rows_cloop, jit.jitable(kernel, inline="always"), d, d, [d], cache)

        return jit.c_loop((K.rows_cloop, K.scan_rows, self.step, d), build)


def register(registry):
    for name, step, identity in (
        ("cumulative_sum", K.add, 0),
        ("cumulative_prod", K.multiply, 1),
    ):
        kernel = core.RowsKernel(_scan(name, step, identity), ScanSpec(step, identity))
        kernel.__name__ = kernel.__qualname__ = name  # how dumps show it
        kernel.__module__ = __name__
        registry.register(name, "cpu", kernel)
