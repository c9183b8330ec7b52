"""Seed 1's benchmark: ``output = output + x`` on 100 float32 values, 1 thread.

This is the per-operator framework overhead the seed study measured ("add in a loop"):
the tensors are so small that nearly all the time is binding, dispatcher, layers and
operator setup. One graph line per layer configuration, so a regression in one layer
shows as that layer's line moving.
"""
import contextlib

import numpy as np

import lamina as lm

from .common import Benchmark, threads

LOOP = 1000  # additions per call: the reported time per call in ms is the time per op in us

# Layer configurations: name -> a context manager factory that switches lamina's layers
# for the duration of the benchmark. Adding a configuration is one line here. Only the
# full stack exists today; the layers issue adds each layer off, dispatcher off and the
# raw kernel as entries of this dict (they are not faked before the switches exist).
CONFIGS = {
    "full stack": contextlib.nullcontext,
}


class SeedLoop(Benchmark):
    """Time of 1000 iterations of ``out = out + x`` (x: 100 float32) per configuration."""

    params = [list(CONFIGS)]
    param_names = ["config"]

    def setup(self, config):
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(threads(1))
        self._stack.enter_context(CONFIGS[config]())
        self.x = lm.asarray(np.random.default_rng(0).standard_normal(100).astype(np.float32))
        self.out = lm.zeros_like(self.x)
        self.out + self.x  # compile, or load from Numba's cache, outside the timing

    def teardown(self, config):
        self._stack.close()

    def time_add_loop(self, config):
        out, x = self.out, self.x
        for _ in range(LOOP):
            out = out + x


class SeedLoopReference(Benchmark):
    """The same loop in NumPy (and PyTorch when installed): the baseline for ratios."""

    params = [["numpy", "torch"]]
    param_names = ["library"]

    def setup(self, library):
        data = np.random.default_rng(0).standard_normal(100).astype(np.float32)
        if library == "numpy":
            self.x, self.out = data, np.zeros_like(data)
        else:
            try:
                import torch
            except ImportError:
                raise NotImplementedError("torch is not installed") from None
            self._previous_threads = torch.get_num_threads()
            torch.set_num_threads(1)
            self.x = torch.from_numpy(data)
            self.out = torch.zeros_like(self.x)

    def teardown(self, library):  # asv calls it even when setup skipped
        if hasattr(self, "_previous_threads"):
            import torch
            torch.set_num_threads(self._previous_threads)

    def time_add_loop(self, library):
        out, x = self.out, self.x
        for _ in range(LOOP):
            out = out + x
