"""Scans of the CPU backend: cumulative_sum and cumulative_prod, a Numba running fold
over the rows of a 2-D view (the scanned axis last), accumulated in the dtype sum
and prod would use."""

import numpy as np

from lamina.backends import jit
from lamina.backends import setup as S
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
                jit.array(rows.dtype, 2, layout), jit.array(out.dtype, 2), jit.array(out.dtype)
            ),
        ),
    )
    entry(rows, out, init)


def _scan(name, step, identity):
    op = OPERATORS[name]
    inits = {}  # the identity as a 1-element array, by accumulator dtype

    def kernel(ks, x, axis, dtype, include_initial):
        res = S.sum_dtype(op, x, dtype)
        data = x._data if x._dtype is res or x._dtype.kind == "b" else x._data.astype(res.np)
        rows = rows_view(data, (axis,))
        n = rows.shape[1] + int(include_initial)
        out = np.empty((rows.shape[0], n), res.np)
        if out.size:
            init = inits.get(res)
            if init is None:
                init = inits[res] = np.full(1, identity, res.np)
            _run(step, rows, out, init)
        shape = x._shape[:axis] + x._shape[axis + 1 :] + (n,)
        if axis == x.ndim - 1:  # the scanned axis is last already
            return from_array(out.reshape(shape))
        return from_array(np.ascontiguousarray(np.moveaxis(out.reshape(shape), -1, axis)))

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def register(registry):
    registry.register("cumulative_sum", "cpu", _scan("cumulative_sum", K.add, 0))
    registry.register("cumulative_prod", "cpu", _scan("cumulative_prod", K.multiply, 1))
