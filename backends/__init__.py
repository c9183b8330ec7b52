"""lamina.backends -- the plugin manager and the built-in backend plugins.

Built-in backends (``numba_cpu``, ``numpy_ref``, the ``sparse`` layer) are registered
exactly like third-party ones: through the ``lamina_register_kernels`` hook, which
records kernels and rebuilds the dispatch tables once. Entry points in group
``lamina.backends`` are loaded too. Third-party plugins may add devices, fallbacks and
kernel wrappers: the public plugin API is described in docs/backends.md.
"""

from lamina.dispatch.results import KernelResultError

from . import setup
from ._manager import (
    PluginWarning,
    check_kernels,
    list,
    load_builtin,
    load_entry_points,
    plugin_manager,
    register,
    unregister,
    use,
)
from ._registry import Registry
from .fallback import (
    FallbackWarning,
    cpu_fallback,
    dtype_from_numpy,
    from_array,
    from_flat,
    new_tensor,
    set_cpu_fallback,
)
from .hookspecs import hookimpl

__all__ = [
    "FallbackWarning",
    "KernelResultError",
    "PluginWarning",
    "Registry",
    "check_kernels",
    "cpu_fallback",
    "dtype_from_numpy",
    "from_array",
    "from_flat",
    "hookimpl",
    "list",
    "load_builtin",
    "load_entry_points",
    "new_tensor",
    "plugin_manager",
    "register",
    "set_cpu_fallback",
    "setup",
    "unregister",
    "use",
]
