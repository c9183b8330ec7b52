"""lamina-example-backend: a third-party lamina backend in its own distribution.

The plugin ``example`` (entry point group ``lamina.backends``) adds the device
``counting`` — NumPy storage behind an object of its own, and a count of every kernel
call it serves — and, opt-in, wraps the CPU ``matmul`` kernel to count CPU matmuls.
The walk-through is docs/backends.md in the lamina repository.

This module is imported while ``import lamina`` runs (entry points are loaded then):
at module level it only uses ``lamina.backends`` and ``lamina.dispatch``, which are
complete by that time.
"""

import collections
import os

import numpy as np

from lamina.backends import cpu_fallback, hookimpl, new_tensor
from lamina.backends import setup as S
from lamina.dispatch import get as get_operator

__all__ = ["CountingBackend", "CountingStorage", "plugin"]

_ADD = get_operator("add")


class CountingStorage:
    """The storage of a ``counting`` tensor: a NumPy array behind an object of the
    plugin's own, so nothing in lamina can mistake it for CPU storage."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def __repr__(self):
        return f"CountingStorage({self.array.dtype}, shape={self.array.shape})"


class CountingBackend:
    """A device that counts the kernel calls it serves.

    ``calls``: operator name -> calls served on this device (its own kernels and the
    fallback); ``fallback_calls``: the part of those served by the fallback;
    ``cpu_matmul_calls``: CPU matmuls seen by the opt-in CPU wrapper."""

    def __init__(self, device="counting", *, count_cpu_matmul=None):
        if count_cpu_matmul is None:
            count_cpu_matmul = os.environ.get("LAMINA_EXAMPLE_COUNT_CPU_MATMUL") == "1"
        self.device = device
        self.count_cpu_matmul = count_cpu_matmul
        self.calls = collections.Counter()
        self.fallback_calls = collections.Counter()
        self.cpu_matmul_calls = 0

    # ------------------------------------------------------------ the hook
    @hookimpl
    def lamina_register_kernels(self, registry):
        registry.add_device(
            self.device, to_cpu=self.to_cpu, from_cpu=self.from_cpu, shares_memory=True
        )
        registry.register("from_host", self.device, self.from_host)
        registry.register("copy", self.device, self.copy)
        registry.register("add", self.device, self.add)
        registry.register_fallback(self.device, self.fallback)
        if self.count_cpu_matmul:
            registry.register_wrapper("matmul", "cpu", self.count_matmul, priority=10)

    # ------------------------------------------------------------ storage
    def wrap(self, array):
        """A tensor of this device around a NumPy array (not copied)."""
        cpu = new_tensor(array)  # only to take dtype and shape from
        return new_tensor(CountingStorage(array), self.device, cpu.dtype, cpu.shape)

    def to_cpu(self, t):
        """Shares memory: a counting tensor's storage is host memory."""
        return new_tensor(t._data.array)

    def from_cpu(self, t):
        return self.wrap(t.numpy())

    # ------------------------------------------------------------ kernels
    # A kernel receives the call's key set first (ks) and lamina's canonical arguments;
    # lamina has already checked that every tensor argument is on this device.

    def from_host(self, ks, data, dtype):
        self.calls["from_host"] += 1
        return self.wrap(data)

    def copy(self, ks, x):
        self.calls["copy"] += 1
        return self.wrap(x._data.array.copy())

    def add(self, ks, x1, x2):
        """A native kernel, reusing lamina's operator setup for the dtype rules."""
        self.calls["add"] += 1
        dtype = S.promote(_ADD, (x1, x2))
        S.broadcast_shapes("add", S.shape_of(x1), S.shape_of(x2))
        with np.errstate(all="ignore"):
            out = np.add(self._operand(x1, dtype), self._operand(x2, dtype))
        return self.wrap(np.asarray(out, S.result_dtype(_ADD, dtype).np))

    def _operand(self, x, dtype):
        if isinstance(getattr(x, "_data", None), CountingStorage):
            return x._data.array.astype(dtype.np, copy=False)
        return S.operand(x, dtype)  # a Python scalar

    def fallback(self, op, ks, *args):
        """Every other operator: counted, then run on the CPU (lamina's cpu_fallback)."""
        self.calls[op.name] += 1
        self.fallback_calls[op.name] += 1
        return cpu_fallback(op, ks, *args)

    # ------------------------------------------------------------ the CPU override
    def count_matmul(self, next_kernel):
        """A kernel wrapper: called at table-build time with the kernel that would
        serve CPU matmul without this plugin; counts and delegates to it."""

        def counting_matmul(ks, x1, x2):
            self.cpu_matmul_calls += 1
            return next_kernel(ks, x1, x2)

        return counting_matmul


plugin = CountingBackend()
