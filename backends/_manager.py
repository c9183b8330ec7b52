"""The plugin manager: registering, unregistering and listing backend plugins."""

from __future__ import annotations

import contextlib
import warnings
from builtins import list as _list
from collections.abc import Iterator
from typing import Any

import pluggy

from lamina.dispatch import devices, entries, keys
from lamina.dispatch import registry as R

from . import hookspecs
from ._registry import Registry

plugin_manager = pluggy.PluginManager("lamina")
plugin_manager.add_hookspecs(hookspecs)
_sources = {}  # plugin name -> "built-in" | "entry point" | "runtime"


def _run_hook(name: str, plugin: Any) -> bool:
    caller = plugin_manager.subset_hook_caller(
        "lamina_register_kernels", [p for p in plugin_manager.get_plugins() if p is not plugin]
    )
    try:
        caller(registry=Registry(name))
    except Exception as exc:  # a broken plugin must not take lamina down
        _forget(name)
        plugin_manager.unregister(plugin)
        _sources.pop(name, None)
        warnings.warn(
            f"lamina backend plugin {name!r} failed while registering its "
            f"kernels and was skipped: {type(exc).__name__}: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


def register(plugin: Any, name: str | None = None, source: str = "runtime") -> bool:
    """Register a backend plugin and rebuild the dispatch tables once."""
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    if plugin_manager.has_plugin(name):
        raise ValueError(f"a backend plugin named {name!r} is already registered")
    plugin_manager.register(plugin, name=name)
    _sources[name] = source
    ok = _run_hook(name, plugin)
    entries.rebuild()
    if entries.broken:  # a kernel wrapper failed at table-build time
        ok = _drop_broken_wrappers(name) and ok
    if ok:
        _warn_ties(name)
    return ok


def _forget(name: str) -> None:
    """Drop everything plugin ``name`` recorded: kernels, fallbacks, devices."""
    R.unregister_plugin(name)
    devices.remove_devices_of(name)


def _drop_broken_wrappers(name):
    broken, ok = dict(entries.broken), True
    entries.broken.clear()
    for plugin, exc in broken.items():
        ok = ok and plugin != name
        if plugin in _sources:
            _forget(plugin)
            plugin_manager.unregister(name=plugin)
            _sources.pop(plugin)
        warnings.warn(
            f"lamina backend plugin {plugin!r} failed while building its kernel "
            f"wrappers and was skipped: {type(exc).__name__}: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )
    entries.rebuild()
    return ok


def _warn_ties(name):
    by_other = {}
    for op, key, other, priority in R.ties(name):
        by_other.setdefault((other, priority), []).append(
            f"{op or '[fallback]'} on {keys.key_name(key)}"
        )
    for (other, priority), what in by_other.items():
        shown = ", ".join(what[:5]) + (f" and {len(what) - 5} more" if len(what) > 5 else "")
        warnings.warn(
            f"lamina backend plugins {name!r} and {other!r} both register "
            f"{shown} at priority {priority}; {min(name, other)!r} is used (ties "
            f"go to the alphabetically first plugin name; raise one priority to "
            f"choose)",
            RuntimeWarning,
            stacklevel=3,
        )


def unregister(name: str) -> None:
    """Remove a plugin and its kernels; the kernels it overrode become active again."""
    plugin = plugin_manager.get_plugin(name)
    if plugin is None:
        raise ValueError(f"no backend plugin named {name!r}; registered: {', '.join(_sources)}")
    plugin_manager.unregister(plugin)
    _forget(name)
    _sources.pop(name)
    entries.rebuild()


def _load_entry_points():
    from importlib.metadata import entry_points

    for ep in entry_points(group="lamina.backends"):
        try:
            plugin = ep.load()
        except Exception as exc:
            warnings.warn(
                f"lamina backend plugin {ep.name!r} ({ep.value}) failed to "
                f"import and was skipped: {type(exc).__name__}: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        try:  # a bad hook signature or a taken name must not break `import lamina`
            register(plugin, ep.name, "entry point")
        except Exception as exc:
            warnings.warn(
                f"lamina backend plugin {ep.name!r} ({ep.value}) could not be "
                f"registered and was skipped: {type(exc).__name__}: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )


class PluginList(_list):
    """The records of ``lm.backends.list()``; prints as an aligned table."""

    columns = ("name", "source", "devices", "new_devices", "priority", "kernels")

    def __str__(self):
        def cell(v):
            return ", ".join(map(str, v)) if isinstance(v, (tuple, _list)) else str(v)

        rows = [self.columns] + [tuple(cell(r[c]) for c in self.columns) for r in self]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.columns))]
        lines = ["backend plugins (per slot: higher priority wins, ties by plugin name)"]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(2, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    __repr__ = __str__


def _key_label(key):
    names = keys.device_names(key) if key & keys.BACKEND_MASK else []
    return names[0] if names else keys.key_name(key).lower()


def list() -> PluginList:
    """One record per plugin: name, source (built-in / entry point / runtime), devices
    it serves, devices it added, the priorities it registers at, and its number of
    kernels (fallbacks and wrappers included). Prints as a table."""
    rows = PluginList()
    for name in _sources:
        ks = R.kernels_of(name)
        added = devices.added_by(name)
        rows.append(
            {
                "name": name,
                "source": _sources[name],
                "devices": sorted({_key_label(k) for _, k, _ in ks} | set(added)),
                "new_devices": added,
                "priority": sorted({e.priority for _, _, e in ks}),
                "kernels": len(ks),
            }
        )
    return rows


@contextlib.contextmanager
def use(plugin_name: str) -> Iterator[None]:
    """Prefer one plugin's kernels for the whole block (tables rebuilt, not checked per call)."""
    if plugin_name not in _sources:
        raise ValueError(
            f"no backend plugin named {plugin_name!r}; registered: {', '.join(_sources)}"
        )
    previous = _set_preferred(plugin_name)
    try:
        yield
    finally:
        _set_preferred(previous)


def _set_preferred(plugin: str | None) -> str | None:
    previous, R.preferred_plugin = R.preferred_plugin, plugin
    entries.rebuild()
    return previous


def load_builtin() -> None:
    """Register the built-in backend plugins (lamina's own layers register on top)."""
    from . import numba_cpu, numpy_ref, sparse

    register(numpy_ref, "numpy_ref", "built-in")
    register(numba_cpu, "numba_cpu", "built-in")
    register(sparse, "sparse", "built-in")  # the sparse-check layer (SPARSE key)


def load_entry_points() -> None:
    """Register the plugins installed under entry point group ``lamina.backends``."""
    _load_entry_points()
