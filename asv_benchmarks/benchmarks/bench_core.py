"""Core benchmarks: seed 1's loop and elementwise operators on the fast and general path."""
import numpy as np

import lamina as lm


class SeedLoop:
    """``output = output + x`` (seed 1), 100 float32, 1 thread; time per 1000 ops."""

    def setup(self):
        lm.set_num_threads(1)
        self.x = lm.asarray(np.ones(100, np.float32))
        self.x + self.x  # compile / load the kernel outside the timing

    def time_add_loop_1000(self):
        out, x = lm.zeros_like(self.x), self.x
        for _ in range(1000):
            out = out + x


class Elementwise:
    params = ([10**2, 10**4, 10**6], ["add", "multiply", "exp"], ["contiguous", "strided"])
    param_names = ["n", "op", "layout"]

    def setup(self, n, op, layout):
        data = np.random.default_rng(0).standard_normal(2 * n).astype(np.float32)
        x = lm.asarray(data)
        self.x = x[: n] if layout == "contiguous" else x[::2]
        self.fn = getattr(lm, op)
        self.call()

    def call(self):
        return self.fn(self.x) if self.fn is lm.exp else self.fn(self.x, self.x)

    def time_op(self, n, op, layout):
        self.call()
