"""lamina.backends — the plugin manager and the built-in backend plugins.

Built-in backends (``numba_cpu``, ``numpy_ref``) are registered exactly like third-party
ones: through the ``lamina_register_kernels`` hook, which records kernels and rebuilds
the dispatch tables once. Entry points in group ``lamina.backends`` are loaded too.
"""
import contextlib
import warnings

import pluggy

from lamina.dispatch import keys, table

from . import hookspecs
from .hookspecs import hookimpl

__all__ = ["hookimpl", "register", "unregister", "use", "list", "plugin_manager"]

plugin_manager = pluggy.PluginManager("lamina")
plugin_manager.add_hookspecs(hookspecs)
_sources = {}  # plugin name -> "built-in" | "entry point" | "runtime"


class Registry:
    """What a plugin's ``lamina_register_kernels`` hook receives."""

    def __init__(self, plugin):
        self.plugin = plugin

    def register(self, op, device, fn, priority=0):
        table.register_kernel(op, keys.device_key(device) if device in keys.devices()
                              else _layer_key(device), fn, self.plugin, priority)

    def implements(self, op, device="cpu", priority=0):
        """Decorator form of ``register``."""
        def decorate(fn):
            self.register(op, device, fn, priority)
            return fn
        return decorate


def _layer_key(name):
    try:
        return keys.LAYER_KEYS[name]
    except KeyError:
        raise ValueError(f"unknown device or layer {name!r}; devices: "
                         f"{', '.join(keys.devices())}; layers: "
                         f"{', '.join(keys.LAYER_KEYS)}") from None


def _run_hook(name, plugin):
    caller = plugin_manager.subset_hook_caller(
        "lamina_register_kernels",
        [p for p in plugin_manager.get_plugins() if p is not plugin])
    try:
        caller(registry=Registry(name))
    except Exception as exc:  # a broken plugin must not take lamina down
        table.unregister_plugin(name)
        plugin_manager.unregister(plugin)
        _sources.pop(name, None)
        warnings.warn(f"lamina backend plugin {name!r} failed while registering its "
                      f"kernels and was skipped: {type(exc).__name__}: {exc}",
                      RuntimeWarning, stacklevel=3)
        return False
    return True


def register(plugin, name=None, source="runtime"):
    """Register a backend plugin and rebuild the dispatch tables once."""
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    if plugin_manager.has_plugin(name):
        raise ValueError(f"a backend plugin named {name!r} is already registered")
    plugin_manager.register(plugin, name=name)
    _sources[name] = source
    ok = _run_hook(name, plugin)
    table.rebuild()
    return ok


def unregister(name):
    """Remove a plugin and its kernels; the kernels it overrode become active again."""
    plugin = plugin_manager.get_plugin(name)
    if plugin is None:
        raise ValueError(f"no backend plugin named {name!r}; registered: "
                         f"{', '.join(_sources)}")
    plugin_manager.unregister(plugin)
    table.unregister_plugin(name)
    _sources.pop(name)
    table.rebuild()


def _load_entry_points():
    from importlib.metadata import entry_points
    for ep in entry_points(group="lamina.backends"):
        try:
            plugin = ep.load()
        except Exception as exc:
            warnings.warn(f"lamina backend plugin {ep.name!r} ({ep.value}) failed to "
                          f"import and was skipped: {type(exc).__name__}: {exc}",
                          RuntimeWarning, stacklevel=2)
            continue
        try:  # a bad hook signature or a taken name must not break `import lamina`
            register(plugin, ep.name, "entry point")
        except Exception as exc:
            warnings.warn(f"lamina backend plugin {ep.name!r} ({ep.value}) could not be "
                          f"registered and was skipped: {type(exc).__name__}: {exc}",
                          RuntimeWarning, stacklevel=2)




def list():  # noqa: A001  (lm.backends.list(), as the issue names it)
    """One row per plugin: name, source, devices, kernels."""
    from builtins import list as _list
    rows = []
    for name in _sources:
        ks = table.kernels_of(name)
        devices = sorted({keys.key_name(k).lower() for _, k, _ in ks})
        rows.append({"name": name, "source": _sources[name], "devices": devices,
                     "kernels": len(ks)})
    return _list(rows)


@contextlib.contextmanager
def use(plugin_name):
    """Prefer one plugin's kernels for the whole block (tables rebuilt, not checked per call)."""
    if plugin_name not in _sources:
        raise ValueError(f"no backend plugin named {plugin_name!r}; registered: "
                         f"{', '.join(_sources)}")
    previous = table.set_preferred_plugin(plugin_name)
    try:
        yield
    finally:
        table.set_preferred_plugin(previous)


def load_builtin_and_installed():
    from . import numba_cpu, numpy_ref
    register(numpy_ref, "numpy_ref", "built-in")
    register(numba_cpu, "numba_cpu", "built-in")
    _load_entry_points()
