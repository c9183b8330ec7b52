"""Joins of the CPU backend: concat and stack, copying each piece with the
elementwise copy kernel (strided where it must be)."""

import numpy as np

from lamina.backends import setup as S
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array

from . import kernels as K
from .elementwise import Elementwise, in_parallel
from .nn.layout import NHWC, layout_of

empty = np.empty


def concat(ks, arrays, axis):
    op = OPERATORS["concat"]
    comp = S.promote(op, arrays)
    shape = list(arrays[0]._shape)  # shapes checked by the description (meta.concat)
    shape[axis] = sum(t._shape[axis] for t in arrays)
    if len(shape) == 4 and all(layout_of(t._data) == NHWC for t in arrays):
        n, c, h, w = shape  # channels-last images: the result too (Note [Result layouts])
        out = empty((n, h, w, c), comp.np).transpose(0, 3, 1, 2)
    else:
        out = empty(tuple(shape), comp.np)
    pieces = [S.operand(t, comp) for t in arrays]
    if not in_parallel(comp, out.size):  # Note [Serial joins]
        np.concatenate(pieces, axis, out=out, casting="unsafe")
        return from_array(out)
    start = 0
    for piece in pieces:
        n = piece.shape[axis]
        index = (slice(None),) * axis + (slice(start, start + n),)
        _COPY.run(comp, out[index], [piece])
        start += n
    return from_array(out)


# Note [Serial joins]: a join too small for lamina's threads is NumPy's concatenate, one
# C call (the pieces already cast to the result's dtype); a bigger one copies each
# piece with the elementwise copy kernel, in parallel. Measured float32, one thread, an
# Inception block's four branches (32, 48, 16 and 16 channels of 8 x 8): 20.7 -> 1.9 us.


_COPY = Elementwise(OPERATORS["positive"], 1, lambda dtype: K.identity)


def stack(ks, arrays, axis):
    expanded = [from_array(np.expand_dims(t._data, axis)) for t in arrays]
    return concat(ks, expanded, axis)


def register(registry):
    for fn in (concat, stack):
        registry.register(fn.__name__, "cpu", fn)
