"""Strided operands of the general path: the memory an operand spans, its offset and
element strides, with dims merged where every operand allows it (Note [Layout cache])."""

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided


def _buffer(a):
    """A flat view spanning the memory of a strided array, from its lowest address."""
    if a.ndim == 0:
        return a.reshape(1)
    item = a.itemsize
    low = a[tuple(slice(None, None, -1) if s < 0 else slice(None) for s in a.strides)]
    span = sum((n - 1) * s for n, s in zip(low.shape, low.strides)) // item + 1
    return as_strided(low, shape=(span,), strides=(item,))


def _operand_layout(a, shape):
    """(element offset into _buffer(a), element strides aligned to ``shape``): pure
    arithmetic on a's shape and strides."""
    item, lead = a.itemsize, len(shape) - a.ndim
    strides, offset = [0] * len(shape), 0
    for d, (n, s) in enumerate(zip(a.shape, a.strides)):
        if n != 1:  # a size-1 dim is broadcast or absent: its stride never matters
            strides[lead + d] = s // item
            offset += (n - 1) * (-s // item) if s < 0 else 0
    return offset, strides


def _merged_layout(shape, arrays):
    """Each operand's offset and contiguity, and one int64 array whose rows are every
    operand's strides and, last, the shape, with dims merged where possible: size-1
    dims are dropped and neighbours merged where every operand's strides allow it, so
    e.g. a contiguous tensor plus a broadcast row runs as a 2-D loop."""
    layouts = [_operand_layout(a, shape) for a in arrays]
    merged = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        st = [strides[d] for _, strides in layouts]
        if merged and all(p == s * n for p, s in zip(merged[-1][1], st)):
            merged[-1][0] *= n
            merged[-1][1] = st
        else:
            merged.append([n, st])
    if not merged:
        merged = [[1, [0] * len(arrays)]]
    meta = np.array([*zip(*(st for _, st in merged)), [n for n, _ in merged]], np.int64)
    return [(offset, a.flags.c_contiguous) for (offset, _), a in zip(layouts, arrays)], meta


# Note [Layout cache]: an operand's layout is a function of its shape, strides and
# itemsize only, and real programs repeat a few of them, so strided_args computes each
# combination once (about 6 us of Python) and afterwards only builds the buffers.
_layouts = {}


def strided_args(shape, arrays):
    """Kernel arguments for arrays broadcast to ``shape``: (buffer, offset, strides)
    per operand, then the shape (Note [Layout cache])."""
    key = (shape, *[(a.shape, a.strides, a.itemsize) for a in arrays])
    layout = _layouts.get(key)
    if layout is None:
        if len(_layouts) >= 4096:
            _layouts.clear()
        layout = _layouts[key] = _merged_layout(shape, arrays)
    operands, meta = layout
    args = []
    for a, (offset, contiguous), strides in zip(arrays, operands, meta):
        args += [a.reshape(-1) if contiguous else _buffer(a), offset, strides]
    return args + [meta[-1]]


def rows_view(data, axis):
    """A 2-D view (kept, reduced) of ``data`` with the ``axis`` dims last (may copy)."""
    shape = data.shape
    cols = math.prod([shape[d] for d in axis])  # math.prod: np.prod costs ~4 us
    rows = (
        math.prod(shape) // cols
        if cols
        else math.prod([n for d, n in enumerate(shape) if d not in axis])
    )
    if axis == tuple(range(data.ndim - len(axis), data.ndim)):  # trailing (sorted) axes
        return data.reshape(rows, cols)  # no transpose to build
    kept = [d for d in range(data.ndim) if d not in axis]
    return data.transpose(kept + list(axis)).reshape(rows, cols)
