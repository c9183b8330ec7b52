"""Reductions over all elements and along each axis of a 2-D float32 tensor.

``axis=None`` on a contiguous tensor is one flat loop; ``axis=0`` reduces across rows
(the column kernel: rows of the input added into a row of accumulators), ``axis=1``
along rows. mean and var take the sum's loop; argmax the max's, then a search. See
Note [Setup runs between timed calls].
"""

import lamina as lm

from .common import SIZES, Benchmark, floats, memo, number_for, square_shape, warm


class Reduction(Benchmark):
    params = [SIZES, ["sum", "mean", "max", "argmax", "var", "any"], [None, 0, 1]]
    param_names = ["n", "op", "axis"]

    def setup(self, n, op, axis):
        self.fn = getattr(lm, op)
        self.x = memo(("2d", n), lambda: lm.reshape(lm.asarray(floats(n)), square_shape(n)))
        self.number = number_for(n)
        warm((op, axis), lambda: self.fn(self.x, axis=axis))

    def time_reduce(self, n, op, axis):
        self.fn(self.x, axis=axis)
