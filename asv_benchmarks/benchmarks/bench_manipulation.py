"""``where`` (a ternary elementwise kernel) and ``concat``.

See Note [Setup runs between timed calls] in common.py.
"""

import lamina as lm

from .common import SIZES, Benchmark, floats, memo, number_for, operand, warm


class Where(Benchmark):
    """``where(x > 1, x, y)`` with a tensor y, or a Python scalar y (broadcast)."""

    params = [SIZES, ["tensor", "scalar"]]
    param_names = ["n", "other"]

    def setup(self, n, other):
        self.x = operand(n, "contiguous", 0)
        self.y = operand(n, "contiguous", 1) if other == "tensor" else 0.0
        self.cond = memo(("cond", n), lambda: self.x > 1.0)
        self.number = number_for(n)
        warm(("where", other), lambda: lm.where(self.cond, self.x, self.y))

    def time_where(self, n, other):
        lm.where(self.cond, self.x, self.y)


class Concat(Benchmark):
    """Concatenate ``pieces`` contiguous (16, c) tensors, n elements in all, along an axis."""

    params = [SIZES[:-1], [2, 16], [0, 1]]
    param_names = ["n", "pieces", "axis"]

    def setup(self, n, pieces, axis):
        def make():
            cols = max(1, n // (16 * pieces))
            return [
                lm.reshape(lm.asarray(floats(16 * cols, seed=i)), (16, cols)) for i in range(pieces)
            ]

        self.parts = memo(("concat", n, pieces), make)
        self.number = number_for(n)
        warm(("concat", axis), lambda: lm.concat(self.parts, axis=axis))

    def time_concat(self, n, pieces, axis):
        lm.concat(self.parts, axis=axis)
