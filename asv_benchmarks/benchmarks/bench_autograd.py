"""Autograd: a small MLP's forward + backward, the recording overhead of seed 1's loop
with ``x`` requiring grad (the autograd issue's figure), and memory of a backward pass.
Skipped on commits that predate the autograd layer."""

import numpy as np

import lamina as lm

from .common import Benchmark, memo, peak_alloc_bytes, warm


def _require_autograd():
    if not hasattr(lm, "no_grad"):
        raise NotImplementedError("this commit has no autograd layer")


def _mlp(batch, width):
    """Parameters and data of a 2-layer tanh MLP (float32, fixed seed)."""

    def make():
        rng = np.random.default_rng(0)
        data = {
            "x": rng.standard_normal((batch, 32)).astype(np.float32),
            "y": rng.standard_normal((batch, 1)).astype(np.float32),
            "w1": (rng.standard_normal((32, width)) / 6).astype(np.float32),
            "w2": (rng.standard_normal((width, 1)) / 6).astype(np.float32),
        }
        return data

    return memo(("mlp", batch, width), make)


class MLP(Benchmark):
    """One training step's forward and backward: tanh(x @ w1 + b1) @ w2, squared error."""

    params = [[16, 256], [64, 256]]
    param_names = ["batch", "width"]

    def setup(self, batch, width):
        _require_autograd()
        d = _mlp(batch, width)
        self.x, self.y = lm.asarray(d["x"]), lm.asarray(d["y"])
        self.w1 = lm.asarray(d["w1"], requires_grad=True)
        self.b1 = lm.zeros(width, dtype=lm.float32, requires_grad=True)
        self.w2 = lm.asarray(d["w2"], requires_grad=True)
        warm(("mlp", batch, width), self.step)

    def step(self):
        h = lm.tanh(self.x @ self.w1 + self.b1)
        loss = lm.mean((h @ self.w2 - self.y) ** 2)
        loss.backward()
        for p in (self.w1, self.b1, self.w2):
            p.grad = None

    def time_forward_backward(self, batch, width):
        self.step()

    def peakmem_forward_backward(self, batch, width):
        self.step()

    def track_backward_alloc_bytes(self, batch, width):
        """Bytes NumPy allocated at peak during one step (tracemalloc): activations,
        saved tensors and gradients; a leak or an extra copy shows up here."""
        return peak_alloc_bytes(self.step)

    track_backward_alloc_bytes.unit = "bytes"


class RecordingOverhead(Benchmark):
    """Seed 1's loop, ``out = out + x`` with x (100 float32) requiring grad: the cost of
    recording a node per op; 1000 ops per call, so ms per call is us per op."""

    def setup(self):
        _require_autograd()
        data = np.random.default_rng(0).standard_normal(100).astype(np.float32)
        self.x = lm.asarray(data, requires_grad=True)
        warm("recording", self.time_add_loop_1000)

    def time_add_loop_1000(self):
        out, x = lm.zeros_like(self.x), self.x
        for _ in range(1000):
            out = out + x
