"""A third-party CPU override: ``vendor_cpu``, as a vendor's math library would be.

Its ``exp``, ``tanh`` and ``matmul`` serve float64 only and decline everything else
(``declines=True``: another dtype goes to numba_cpu's kernel, below it); a wrapper counts
every CPU ``add``. Written from docs/backends.md; tests/test_plugin_devices.py installs
it together with ``lamina_remote`` and ``lamina_pinned``.
"""

import collections

import numpy as np

import lamina as lm
from lamina.backends import from_array, hookimpl

CALLS = collections.Counter()  # what this plugin served


def _unary(name, ufunc):
    def kernel(ks, x):
        if x.dtype is not lm.float64:
            return NotImplemented  # numba_cpu's kernel serves it
        CALLS[name] += 1
        out = np.empty(x.shape)  # out=: a 0-d input gives a 0-d array, not a scalar
        ufunc(x.numpy(), out=out)
        return from_array(out)

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def matmul(ks, x1, x2):
    if x1.dtype is not lm.float64 or x2.dtype is not lm.float64 or x1.ndim != 2 or x2.ndim != 2:
        return NotImplemented
    CALLS["matmul"] += 1
    return from_array(np.matmul(x1.numpy(), x2.numpy()))


def count_add(next_kernel):
    def counted(ks, x1, x2):
        CALLS["add (wrapped)"] += 1
        return next_kernel(ks, x1, x2)

    return counted


class VendorCPU:
    @hookimpl
    def lamina_register_kernels(self, registry):
        registry.register("exp", "cpu", _unary("exp", np.exp), priority=5, declines=True)
        registry.register("tanh", "cpu", _unary("tanh", np.tanh), priority=5, declines=True)
        registry.register("matmul", "cpu", matmul, priority=5, declines=True)
        registry.register_wrapper("add", "cpu", count_add)


plugin = VendorCPU()
