"""A third-party lamina device whose memory is not the host's: ``remote``.

A tensor's storage is a ``Handle`` into this plugin's ``STORE`` (as an accelerator's
memory would be reached through a driver); the converters copy (``shares_memory=False``).
Native kernels for ``from_host``, ``full``, ``add``, ``multiply`` and ``sum`` (with
lamina's dtype rules from ``lamina.backends.setup``); everything else runs through
lamina's CPU fallback. Written from docs/backends.md; tests/test_plugin_devices.py
installs it together with ``lamina_pinned`` and ``lamina_vendor_cpu``.
"""

import itertools

import numpy as np

from lamina.backends import cpu_fallback, dtype_from_numpy, from_array, hookimpl, new_tensor
from lamina.backends import setup as S
from lamina.dispatch import get as get_operator

STORE: dict[int, np.ndarray] = {}  # handle id -> the array "on the device"
_ids = itertools.count()


class Handle:
    """A remote tensor's storage: a key into STORE, released with the tensor."""

    __slots__ = ("id",)

    def __init__(self, array):
        self.id = next(_ids)
        STORE[self.id] = array

    def __del__(self):
        STORE.pop(self.id, None)

    @property
    def array(self):
        return STORE[self.id]


def remote(array):
    """A remote tensor holding ``array`` (a NumPy array or a NumPy scalar)."""
    array = np.asarray(array, order="C")  # not ascontiguousarray: that makes 0-d 1-d
    return new_tensor(Handle(array), "remote", dtype_from_numpy(array.dtype), array.shape)


def to_cpu(t):
    return from_array(t._data.array.copy())


def from_cpu(t):
    return remote(t.numpy().copy())


def _array(x, dtype):
    """An operand as a NumPy array of ``dtype``: a remote tensor's, or a Python scalar."""
    if isinstance(getattr(x, "_data", None), Handle):
        return x._data.array.astype(dtype.np, copy=False)
    return S.operand(x, dtype)


def from_host(ks, data, dtype):
    return remote(data.copy())


def full(ks, shape, fill_value, dtype):
    return remote(np.full(shape, fill_value, dtype.np))


def _binary(name, ufunc):
    op = get_operator(name)

    def kernel(ks, x1, x2):  # either may be a Python scalar
        comp = S.promote(op, (x1, x2))
        S.broadcast_shapes(name, S.shape_of(x1), S.shape_of(x2))
        with np.errstate(all="ignore"):  # kernels must not warn on inf/nan results
            out = ufunc(_array(x1, comp), _array(x2, comp))
        return remote(np.asarray(out, S.result_dtype(op, comp).np))  # 0-d: a NumPy scalar

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


_SUM = get_operator("sum")


def sum_kernel(ks, x, axis, dtype, keepdims):  # axis: a sorted tuple (every axis for None)
    result = S.sum_dtype(_SUM, x, dtype)
    data = x._data.array.astype(result.np, copy=False)
    return remote(np.asarray(np.sum(data, axis=axis, keepdims=keepdims), result.np))


class RemoteBackend:
    @hookimpl
    def lamina_register_kernels(self, registry):
        registry.add_device("remote", to_cpu=to_cpu, from_cpu=from_cpu, shares_memory=False)
        registry.register("from_host", "remote", from_host)
        registry.register("full", "remote", full)
        registry.register("add", "remote", _binary("add", np.add))
        registry.register("multiply", "remote", _binary("multiply", np.multiply))
        registry.register("sum", "remote", sum_kernel)
        registry.register_fallback("remote", cpu_fallback)


plugin = RemoteBackend()
