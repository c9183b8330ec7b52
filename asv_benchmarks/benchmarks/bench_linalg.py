"""Matrix multiplication of square n x n matrices.

Floats go to BLAS through NumPy, integers to a Numba kernel (skipped at 1024: a naive
triple loop would dominate the suite's run time). ``transposed`` multiplies by ``x.T``,
a non-contiguous view, as in ``x @ x.T``.
"""

import numpy as np

import lamina as lm

from .common import Benchmark, memo, warm


class Matmul(Benchmark):
    params = [[64, 256, 1024], ["float32", "float64", "int64"], ["contiguous", "transposed"]]
    param_names = ["n", "dtype", "layout"]

    def setup(self, n, dtype, layout):
        if dtype == "int64" and n > 256:
            raise NotImplementedError("int64 matmul is only benchmarked up to 256")

        def make():
            rng = np.random.default_rng(0)
            a = lm.asarray(rng.integers(-8, 8, (n, n)).astype(dtype))
            b = lm.asarray(rng.integers(-8, 8, (n, n)).astype(dtype))
            return a, (b.T if layout == "transposed" else b)

        self.a, self.b = memo(("matmul", n, dtype, layout), make)
        warm(("matmul", dtype, layout), lambda: self.a @ self.b)

    def time_matmul(self, n, dtype, layout):
        self.a @ self.b
