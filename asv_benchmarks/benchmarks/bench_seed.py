"""Seed 1's benchmark: ``output = output + x`` on 100 float32 values, 1 thread.

This is the per-operator framework overhead the seed study measured ("add in a loop"):
the tensors are so small that nearly all the time is binding, dispatcher, layers and
operator setup. One graph line per layer configuration, so a regression in one layer
shows as the lines moving from the full stack down to where that layer is switched off.
"""

import contextlib

import numpy as np

import lamina as lm

from .common import Benchmark, threads

LOOP = 1000  # additions per call: the reported time per call in ms is the time per op in us

# Layer configurations: name -> the layers switched off (``lm.layers.off``), cumulative
# from the full stack down, as in ``python -m lamina.overhead``; None is the raw Numba
# kernel on preallocated arrays. Adding a configuration is one line here. On commits
# that predate lm.layers only the full stack runs (the others are skipped).
CONFIGS = {
    "full stack": (),
    "autograd off": ("autograd",),
    "sparse off": ("autograd", "sparse"),
    "checks off": ("autograd", "sparse", "checks"),
    "dispatcher off": ("autograd", "sparse", "checks", "dispatcher"),
    "raw kernel": None,
}


class SeedLoop(Benchmark):
    """Time of 1000 iterations of ``out = out + x`` (x: 100 float32) per configuration."""

    params = [list(CONFIGS)]
    param_names = ["config"]

    def setup(self, config):
        off = CONFIGS[config]
        if off and not hasattr(lm, "layers"):
            raise NotImplementedError("this commit has no layer switches")
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(threads(1))
        data = np.random.default_rng(0).standard_normal(100).astype(np.float32)
        if off is None:  # the kernel the CPU table holds for add, called directly
            kernel = lm.dispatch.get("add").table[lm.dispatch.CPU.bit_length()]
            if not hasattr(kernel, "elementwise"):
                raise NotImplementedError("this commit's add kernel exposes no raw entry")
            entry, self.x = kernel.elementwise.flat[lm.float32.index], data
            self.out = np.zeros_like(data)
            self.body = self._raw_loop
        else:
            if off:
                self._stack.enter_context(lm.layers.off(*off))
            self.x = lm.asarray(data)
            self.out = lm.zeros_like(self.x)
            self.body = self._loop
            entry = None
        self.entry = entry
        self.body()  # compile, or load from Numba's cache, outside the timing

    def teardown(self, config):  # asv calls it even when setup skipped
        if hasattr(self, "_stack"):
            self._stack.close()

    def _loop(self):
        out, x = self.out, self.x
        for _ in range(LOOP):
            out = out + x

    def _raw_loop(self):
        entry, out, x = self.entry, self.out, self.x
        for _ in range(LOOP):
            entry(out, x, out)

    def time_add_loop(self, config):
        self.body()


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
