"""Seed 2's primitives (lamina.nn.functional) on float32 images of 64 channels, 56 x 56,
in both memory layouts, on two threads (the issue's setting; ``python -m lamina.bench
nn`` prints the same primitives beside PyTorch). ``n`` is the batch: 16 is the issue's
size, 1 what the CI test runs.
"""

import numpy as np

import lamina as lm

from .common import Benchmark, max_threads, memo, threads, warm

F = lm.nn.functional
C, H, W = 64, 56, 56
LAYOUTS = ["NCHW", "NHWC"]


def image(n, layout, seed=0, requires_grad=False):
    def make():
        rng = np.random.default_rng(seed)
        x = lm.asarray(rng.standard_normal((n, C, H, W), dtype=np.float32))
        return F.to_layout(x, layout)

    x = memo(("nn image", n, layout, seed), make)
    return x.detach().requires_grad_() if requires_grad else x


def weight(requires_grad=False):
    def make():
        rng = np.random.default_rng(1)
        return lm.asarray(rng.standard_normal((C, C, 3, 3), dtype=np.float32) * 0.05)

    w = memo(("nn weight",), make)
    return w.detach().requires_grad_() if requires_grad else w


class _TwoThreads(Benchmark):
    def setup(self, *params):
        self._threads = threads(min(2, max_threads()))
        self._threads.__enter__()

    def teardown(self, *params):
        self._threads.__exit__(None, None, None)


class Conv2d(_TwoThreads):
    """64 -> 64 channels, 3 x 3, padding 1: forward, and forward + backward (input and
    weight gradients)."""

    params = [[1, 16], LAYOUTS]
    param_names = ["n", "layout"]

    def setup(self, n, layout):
        super().setup()
        self.x, self.w = image(n, layout), weight()
        self.xg, self.wg = image(n, layout, requires_grad=True), weight(requires_grad=True)
        self.g = image(n, layout, seed=2)
        warm(("conv2d", n, layout), lambda: self.time_forward_backward(n, layout))

    def time_forward(self, n, layout):
        F.conv2d(self.x, self.w, padding=1)

    def time_forward_backward(self, n, layout):
        self.xg.grad = self.wg.grad = None
        F.conv2d(self.xg, self.wg, padding=1).backward(self.g)


class Pool(_TwoThreads):
    """3 x 3 windows, stride 2."""

    params = [[1, 16], LAYOUTS, ["max_pool2d", "min_pool2d", "avg_pool2d"]]
    param_names = ["n", "layout", "pool"]

    def setup(self, n, layout, pool):
        super().setup()
        self.x, self.fn = image(n, layout), getattr(F, pool)
        warm(("pool", n, layout, pool), lambda: self.fn(self.x, 3, 2))

    def time_pool(self, n, layout, pool):
        self.fn(self.x, 3, 2)


class Normalization(_TwoThreads):
    """Batch norm in training (batch statistics, running ones updated) and local
    response norm over 5 channels."""

    params = [[1, 16], LAYOUTS, ["batch_norm", "local_response_norm"]]
    param_names = ["n", "layout", "op"]

    def setup(self, n, layout, op):
        super().setup()
        x = image(n, layout)
        stats = lm.zeros(C, dtype=lm.float32), lm.ones(C, dtype=lm.float32)
        self.call = (
            (lambda: F.batch_norm(x, *stats, training=True))
            if op == "batch_norm"
            else (lambda: F.local_response_norm(x, 5))
        )
        warm(("normalization", n, layout, op), self.call)

    def time_op(self, n, layout, op):
        self.call()


class Relu(_TwoThreads):
    params = [[1, 16], LAYOUTS]
    param_names = ["n", "layout"]

    def setup(self, n, layout):
        super().setup()
        self.x = image(n, layout)
        warm(("relu", n, layout), lambda: F.relu(self.x))

    def time_relu(self, n, layout):
        F.relu(self.x)


class ToLayout(_TwoThreads):
    """The layout conversion (seed 2's multi-dimensional transposition)."""

    params = [[1, 16], LAYOUTS]
    param_names = ["n", "layout"]

    def setup(self, n, layout):
        super().setup()
        self.x = image(n, layout)
        self.target = "NCHW" if layout == "NHWC" else "NHWC"

    def time_to_layout(self, n, layout):
        F.to_layout(self.x, self.target)


class Linear(_TwoThreads):
    """A classifier layer: batch n x 4096 -> 1000 (inner product)."""

    params = [[1, 64]]
    param_names = ["n"]

    def setup(self, n):
        super().setup()
        rng = np.random.default_rng(0)
        self.x = lm.asarray(rng.standard_normal((n, 4096), dtype=np.float32))
        self.w = memo(
            ("linear weight",),
            lambda: lm.asarray(rng.standard_normal((1000, 4096), dtype=np.float32) * 0.01),
        )
        warm(("linear", n), lambda: F.linear(self.x, self.w))

    def time_linear(self, n):
        F.linear(self.x, self.w)
