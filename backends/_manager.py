"""The plugin manager: registering, unregistering and listing backend plugins."""

from __future__ import annotations

import contextlib
import inspect
import os
import pathlib
import sys
import traceback
import warnings
from builtins import list as _list
from collections.abc import Iterator
from typing import Any

import pluggy

from lamina.dispatch import devices, entries, keys
from lamina.dispatch import registry as R
from lamina.dispatch.format import aligned
from lamina.dispatch.schema import get as get_operator

from . import hookspecs
from ._registry import DECOMPOSITIONS, MOVE_PRIORITY, Registry

plugin_manager = pluggy.PluginManager("lamina")
plugin_manager.add_hookspecs(hookspecs)
_sources = {}  # plugin name -> "built-in" | "entry point" | "runtime"


class PluginWarning(RuntimeWarning):
    """A warning about a backend plugin. The message starts with the plugin's name,
    and the warning points at the plugin's own code: the registration, hook or
    definition it is about (``warnings.warn_explicit``), not at lamina's."""


_LAMINA_DIRS = tuple(
    str(pathlib.Path(m.__file__).resolve().parent) + os.sep for m in (devices, hookspecs)
) + (str(pathlib.Path(pluggy.__file__).resolve().parent) + os.sep,)


def _outside_lamina(filename: str) -> bool:
    return not filename.startswith("<") and not str(pathlib.Path(filename).resolve()).startswith(
        _LAMINA_DIRS
    )


def _site_of(exc: BaseException) -> tuple[str, int] | None:
    """The innermost frame of ``exc``'s traceback in a plugin's code (not lamina's,
    pluggy's or importlib's): where the plugin raised, or called what raised."""
    site = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if _outside_lamina(frame.f_code.co_filename):
            site = (frame.f_code.co_filename, line)
    return site


def _site_of_plugin(plugin: Any) -> tuple[str, int] | None:
    """Where a plugin is defined: its hook function, else its class or module."""
    hook = getattr(plugin, "lamina_register_kernels", None)
    for obj in (hook, plugin if inspect.ismodule(plugin) else type(plugin)):
        try:
            file = inspect.getsourcefile(obj)
            line = 1 if inspect.ismodule(obj) else inspect.getsourcelines(obj)[1]
        except (TypeError, OSError):
            continue
        if file is not None:
            return (file, line)
    return None


def _site_of_entry_point(ep: Any) -> tuple[str, int] | None:
    """The line of a distribution's entry_points.txt that names ``ep``."""
    folder = getattr(getattr(ep, "dist", None), "_path", None)  # PathDistribution's
    if folder is None or not (pathlib.Path(folder) / "entry_points.txt").is_file():
        return None
    path = pathlib.Path(folder) / "entry_points.txt"
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.split("=")[0].strip() == ep.name:
            return (str(path), n)
    return (str(path), 1)


def warn(message: str, site: tuple[str, int] | None, stacklevel: int = 3) -> None:
    """A PluginWarning at ``site`` (file, line) of the plugin's code; without one, at
    the caller ``stacklevel`` frames up."""
    if site is None:
        warnings.warn(message, PluginWarning, stacklevel=stacklevel)
    else:
        warnings.warn_explicit(message, PluginWarning, site[0], site[1])


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
        warn(
            f"lamina backend plugin {name!r} failed while registering its "
            f"kernels and was skipped: {type(exc).__name__}: {exc}",
            _site_of(exc) or _site_of_plugin(plugin),
            stacklevel=4,
        )
        return False
    return True


def register(plugin: Any, name: str | None = None, source: str = "runtime") -> bool:
    """Register a backend plugin and rebuild the dispatch tables once.

    Returns False, with a PluginWarning, when the plugin's hook raised (everything it
    had registered is dropped). A plugin that registers nothing (a misspelled hook
    name, a hook without ``@hookimpl``) is kept, with a warning saying why."""
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    with R.lock:  # Note [Thread safety] in dispatch/registry.py: one at a time
        return _register(plugin, name, source)


def _register(plugin: Any, name: str, source: str) -> bool:
    if plugin_manager.has_plugin(name):
        raise ValueError(f"a backend plugin named {name!r} is already registered")
    plugin_manager.register(plugin, name=name)
    _sources[name] = source
    if source == "built-in":
        R.builtin.add(name)
    ok = _run_hook(name, plugin)
    entries.rebuild()
    if entries.broken:  # a kernel wrapper failed at table-build time
        ok = _drop_broken_wrappers(name) and ok
    if ok:
        _warn_registered_nothing(name, plugin)
        _warn_ties(name)
        _warn_inactive_wrappers(name)
    return ok


def _forget(name: str) -> None:
    """Drop everything plugin ``name`` recorded: kernels, fallbacks, devices."""
    R.unregister_plugin(name)
    R.builtin.discard(name)
    devices.remove_devices_of(name)


def _drop_broken_wrappers(name: str) -> bool:
    broken, ok = dict(entries.broken), True
    entries.broken.clear()
    for plugin, (exc, wrapper) in broken.items():
        ok = ok and plugin != name
        if plugin in _sources:
            _forget(plugin)
            plugin_manager.unregister(name=plugin)
            _sources.pop(plugin)
        warn(
            f"lamina backend plugin {plugin!r} failed while building its kernel "
            f"wrappers and was skipped: {type(exc).__name__}: {exc}",
            _site_of(exc) or wrapper.site,
            stacklevel=4,
        )
    entries.rebuild()
    return ok


_HOOK = "lamina_register_kernels"


def _warn_registered_nothing(name: str, plugin: Any) -> None:
    """A plugin whose hook recorded nothing: say why, if its hooks show it (what
    pluggy's ``check_pending`` reports, for this plugin only)."""
    if R.kernels_of(name) or devices.added_by(name):
        return
    hooks = [c.name for c in plugin_manager.get_hookcallers(plugin) or ()]
    unknown = [h for h in hooks if h != _HOOK]
    if unknown:
        why = f"its hook {unknown[0]!r} is not a lamina hook (the hook is {_HOOK!r})"
    elif _HOOK not in hooks and callable(getattr(plugin, _HOOK, None)):
        why = f"its {_HOOK} is not marked with @lamina.backends.hookimpl"
    elif _HOOK not in hooks:
        import difflib  # only for this message: ~1 ms of import lamina

        close = difflib.get_close_matches(_HOOK, dir(plugin), n=1, cutoff=0.75)
        why = f"it has no {_HOOK} hook" + (f" (did you mean {close[0]!r}?)" if close else "")
    else:
        why = "its hook ran but called no registry method"
    warn(
        f"lamina backend plugin {name!r} registered nothing: {why}; it serves no kernel",
        _site_of_plugin(plugin),
        stacklevel=4,
    )


def _slot_text(op: str | None, key: int) -> str:
    where = keys.key_name(key)
    return f"the fallback of {where}" if op is None else f"{op} on {where}"


def _serving(op: str, key: int) -> str:
    """Who serves (op, key) now, as the tables say (a wrapper chain link by link)."""
    chain = get_operator(op).entries[key].chain
    return " -> ".join(f"{k.plugin!r} ({k.name}, priority {k.priority})" for k in chain) or (
        "nothing"
    )


def _warn_ties(name: str) -> None:
    """Note [Kernel priority]: a tie is decided by plugin name, then registration order
    -- deterministic, but probably not what the plugin meant, so it is reported with
    what actually serves the slot now."""
    groups: dict[tuple, list] = {}
    for tie in R.ties(name):
        plugins = tuple(dict.fromkeys(e.plugin for e in tie.ranked))
        groups.setdefault((tie.kind, plugins, tie.priority), []).append(tie)
    for (kind, plugins, priority), ties in groups.items():
        first = ties[0]
        shown = ", ".join(_slot_text(t.op, t.key) for t in ties[:5])
        shown += f" and {len(ties) - 5} more" if len(ties) > 5 else ""
        who = (
            f"lamina backend plugin {name!r} registers {len(first.ranked)} {kind}s for"
            if len(plugins) == 1
            else f"lamina backend plugins {' and '.join(map(repr, plugins))} both register "
            f"{kind}s for"
        )
        order = "by plugin name, then registration order"
        if kind == "wrapper":
            result = (
                f"all of them wrap, {first.ranked[0].plugin!r}'s "
                f"({first.ranked[0].name}) outermost (wrappers at one priority are "
                f"ordered {order})"
            )
        elif kind == "fallback":
            result = f"{first.ranked[0].plugin!r}'s fallback ({first.ranked[0].name}) is used"
        else:
            serving = "; ".join(
                f"{_slot_text(t.op, t.key)}: {_serving(t.op, t.key)}" for t in ties[:5]
            )
            result = (
                f"{first.ranked[0].plugin!r}'s ({first.ranked[0].name}) ranks first (ties "
                f"go {order}); serving now: {serving}"
            )
        site = next(e.site for e in first.ranked if e.plugin == name)
        warn(
            f"{who} {shown} at priority {priority}: {result}. Give them different "
            "priorities to choose.",
            site,
            stacklevel=4,
        )


def _warn_inactive_wrappers(name: str) -> None:
    """Note [Kernel wrappers]: a wrapper of a slot with nothing to wrap is inactive."""
    for op, key, e in R.kernels_of(name):
        if op is None or not e.wraps or e in get_operator(op).entries[key].chain:
            continue
        warn(
            f"lamina backend plugin {name!r}: its wrapper {e.name} of {op} on "
            f"{keys.key_name(key)} has nothing to wrap (no kernel or fallback serves "
            f"that slot: {get_operator(op).entries[key].reason}); it is inactive until "
            "one is registered",
            e.site,
            stacklevel=4,
        )


def unregister(name: str) -> None:
    """Remove a plugin and its kernels; the kernels it overrode become active again."""
    with R.lock:
        _unregister(name)


def _unregister(name: str) -> None:
    plugin = plugin_manager.get_plugin(name)
    if plugin is None:
        raise ValueError(f"no backend plugin named {name!r}; registered: {', '.join(_sources)}")
    plugin_manager.unregister(plugin)
    _forget(name)
    _sources.pop(name)
    entries.rebuild()


_GROUP = "lamina.backends"


def _may_have_entry_points(group: str) -> bool:
    """False only if no installed distribution can have an entry point in ``group``.

    importlib.metadata imports the email package to parse metadata, ~10 ms of ``import
    lamina``; most installs have no lamina plugin, so this scan of sys.path's
    ``*.dist-info`` and ``*.egg-info`` folders for an ``entry_points.txt`` naming the
    group comes first. Whatever it cannot read (a zip file or an egg on sys.path, a
    finder of distributions other than the path's) counts as a maybe: then
    importlib.metadata decides, as it always did."""
    from importlib.machinery import PathFinder

    if any(
        getattr(f, "find_distributions", None) is not None and f is not PathFinder
        for f in sys.meta_path
    ):
        return True
    header = f"[{group}]"
    for entry in sys.path:
        folder = entry or "."
        if folder.endswith(".egg") or os.path.isfile(folder):
            return True
        try:
            names = os.listdir(folder)
        except OSError:  # a folder that does not exist
            continue
        for name in names:
            if name.endswith((".dist-info", ".egg-info")):
                try:
                    with open(os.path.join(folder, name, "entry_points.txt")) as f:
                        if any(line.strip() == header for line in f):
                            return True
                except OSError:
                    pass
    return False


def _load_entry_points():
    if not _may_have_entry_points(_GROUP):
        return
    from importlib.metadata import entry_points

    for ep in entry_points(group=_GROUP):
        try:
            plugin = ep.load()
        except Exception as exc:
            warn(
                f"lamina backend plugin {ep.name!r} ({ep.value}) failed to "
                f"import and was skipped: {type(exc).__name__}: {exc}",
                _site_of(exc) or _site_of_entry_point(ep),
            )
            continue
        try:  # a bad hook signature or a taken name must not break `import lamina`
            register(plugin, ep.name, "entry point")
        except Exception as exc:
            warn(
                f"lamina backend plugin {ep.name!r} ({ep.value}) could not be "
                f"registered and was skipped: {type(exc).__name__}: {exc}",
                _site_of(exc) or _site_of_plugin(plugin),
            )


class PluginList(_list):
    """The records of ``lm.backends.list()``; prints as an aligned table."""

    columns = ("name", "source", "devices", "new_devices", "priority", "kernels")

    def __str__(self):
        def cell(v):
            return ", ".join(map(str, v)) if isinstance(v, (tuple, _list)) else str(v)

        rows = [tuple(cell(r[c]) for c in self.columns) for r in self]
        title = "backend plugins (per slot: higher priority wins, ties by plugin name)"
        return aligned(title, self.columns, rows)

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
        # not counted: the to_device kernel add_device registers for each new device
        ks = [
            k
            for k in R.kernels_of(name)
            if not (k[2].fn is devices.move_kernel and k[2].priority == MOVE_PRIORITY)
        ]
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


_preferences: _list[tuple[object, str]] = []  # (block, plugin) of the open use() blocks


@contextlib.contextmanager
def use(plugin_name: str) -> Iterator[None]:
    """Prefer one plugin's kernels for the whole block (tables rebuilt, not checked per
    call). Process-wide, as the tables are (Note [Preferred plugin])."""
    if plugin_name not in _sources:
        raise ValueError(
            f"no backend plugin named {plugin_name!r}; registered: {', '.join(_sources)}"
        )
    block = object()
    with R.lock:
        _preferences.append((block, plugin_name))
        _prefer()
    try:
        yield
    finally:
        with R.lock:
            _preferences[:] = [p for p in _preferences if p[0] is not block]
            _prefer()


def _prefer() -> None:
    """Note [Preferred plugin]: the plugin of the ``use()`` block entered last among
    those still open is preferred, in every thread (the tables are process-wide).
    Leaving a block removes its own entry, never restores a saved state: blocks left in
    any order, in any thread, leave the preference of the blocks still open."""
    preferred, before = _preferences[-1][1] if _preferences else None, R.preferred_plugin
    if preferred != before:
        R.preferred_plugin = preferred
        entries.rebuild_preferring(before)


@contextlib.contextmanager
def check_kernels() -> Iterator[None]:
    """Check every result of every kernel (built-in ones too) for the whole block:
    a tensor on the right device, of the dtype and shape the operator's rules give
    (Note [Result rules] in ``lamina.dispatch.results``); a result that is not raises
    ``KernelResultError`` naming the plugin and kernel. For debugging: every call pays
    a check (``LAMINA_CHECK_KERNELS=1`` turns it on for a whole process). Process-wide,
    as the tables are; blocks nest, and leaving one never ends another's."""
    with R.lock:
        entries.check_all += 1
        entries.rebuild()
    try:
        yield
    finally:
        with R.lock:
            entries.check_all -= 1
            entries.rebuild()


def load_builtin(*layers: tuple[Any, str]) -> None:
    """Register the built-in backend plugins and then ``layers`` ((plugin, name) pairs:
    lamina's own layers, which register on top), rebuilding the tables once at the end
    (a rebuild per plugin cost ~40 ms of ``import lamina``). A built-in plugin whose
    hook fails is a bug of lamina's: it raises."""
    from . import meta, numba_cpu, numpy_ref, sparse

    builtins = [
        (numpy_ref, "numpy_ref"),
        (numba_cpu, "numba_cpu"),
        (sparse, "sparse"),
        (meta, "meta"),
        *layers,
    ]  # sparse: the sparse-check layer (SPARSE key)
    with R.lock:
        R.builtin.add(DECOMPOSITIONS)  # Note [Core operators]
        for plugin, name in builtins:
            plugin_manager.register(plugin, name=name)
            _sources[name] = "built-in"
            R.builtin.add(name)
            if not _run_hook(name, plugin):
                raise RuntimeError(f"lamina's built-in plugin {name!r} failed to register")
        entries.rebuild()


def load_entry_points() -> None:
    """Register the plugins installed under entry point group ``lamina.backends``."""
    _load_entry_points()
