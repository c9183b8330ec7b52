"""A third-party lamina device in host memory with native kernels: ``pinned``.

A tensor's storage is a ``Pinned`` object around a NumPy array (host memory, so the
converters share it: ``shares_memory=True``). The elementwise operators below and the
view operators are native -- a view shares its base's memory on the device, so writing
through it changes the base -- and everything else runs through lamina's CPU fallback.
Written from docs/backends.md; tests/test_plugin_devices.py installs it together with
``lamina_remote`` and ``lamina_vendor_cpu``.
"""

import numpy as np

from lamina.backends import cpu_fallback, from_array, hookimpl, new_tensor
from lamina.backends import setup as S
from lamina.dispatch import get as get_operator


class Pinned:
    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


def pinned(array):
    cpu = from_array(np.asarray(array))  # a NumPy scalar (a 0-d result) becomes 0-d
    return new_tensor(Pinned(cpu.numpy()), "pinned", cpu.dtype, cpu.shape)


def to_cpu(t):
    return from_array(t._data.array)


def from_cpu(t):
    return pinned(t.numpy())


def _array(x, dtype=None):
    if isinstance(getattr(x, "_data", None), Pinned):
        a = x._data.array
        return a if dtype is None else a.astype(dtype.np, copy=False)
    return S.operand(x, dtype)  # a Python scalar


UNARY = ("negative", "abs", "exp", "log", "sin", "cos", "tanh", "sqrt", "square")
BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum")


def elementwise(name):
    """A native kernel for an elementwise operator, from its schema entry: NumPy's ufunc
    of the same name, on operands promoted by lamina's rules."""
    op = get_operator(name)
    ufunc = getattr(np, op.numpy)

    def kernel(ks, *args):
        comp = S.promote(op, args)
        S.broadcast_shapes(name, *(S.shape_of(a) for a in args))
        with np.errstate(all="ignore"):
            out = ufunc(*(_array(a, comp) for a in args))
        return pinned(np.asarray(out, S.result_dtype(op, comp).np))

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def reshape(ks, x, shape, copy):
    data = x._data.array
    return pinned(data.reshape(shape).copy() if copy else data.reshape(shape))


def permute_dims(ks, x, axes):
    return pinned(x._data.array.transpose(axes))


def matrix_transpose(ks, x):
    return pinned(np.swapaxes(x._data.array, -1, -2))


def expand_dims(ks, x, axis):
    return pinned(np.expand_dims(x._data.array, axis))


def squeeze(ks, x, axis):
    return pinned(np.squeeze(x._data.array, axis))


def from_host(ks, data, dtype):
    return pinned(data)


def copy(ks, x):
    return pinned(x._data.array.copy())


class PinnedBackend:
    @hookimpl
    def lamina_register_kernels(self, registry):
        registry.add_device("pinned", to_cpu=to_cpu, from_cpu=from_cpu)
        for name in UNARY + BINARY:
            registry.register(name, "pinned", elementwise(name))
        for fn in (reshape, permute_dims, matrix_transpose, expand_dims, squeeze, from_host, copy):
            registry.register(fn.__name__, "pinned", fn)
        registry.register_fallback("pinned", cpu_fallback)


plugin = PinnedBackend()
