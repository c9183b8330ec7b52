"""A third-party lamina plugin that has nothing to do with lamina's own tests: it adds
a device ``unrelated`` (NumPy storage in an object of its own, every operator through
lamina's CPU fallback) and a CPU kernel for ``hypot`` below every built-in one.

``tests/test_plugins.py`` runs lamina's plugin-sensitive tests with it installed (the
``*.dist-info`` folder beside it declares the entry point), so those tests cannot
depend on which other plugins a user has."""

from lamina.backends import cpu_fallback, hookimpl, new_tensor


class Storage:
    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


def to_cpu(t):
    return new_tensor(t._data.array)


def from_cpu(t):
    return new_tensor(Storage(t.numpy()), "unrelated", t.dtype, t.shape)


def from_host(ks, data, dtype):
    return new_tensor(Storage(data), "unrelated", dtype, data.shape)


def hypot(ks, x1, x2):  # never serves: priority -100 ranks below every built-in kernel
    raise AssertionError("the unrelated plugin's hypot was called")


@hookimpl
def lamina_register_kernels(registry):
    registry.add_device("unrelated", to_cpu=to_cpu, from_cpu=from_cpu)
    registry.register("from_host", "unrelated", from_host)
    registry.register_fallback("unrelated", cpu_fallback)
    registry.register("hypot", "cpu", hypot, priority=-100)
