"""lamina.backends — the plugin manager and the built-in backend plugins.

Built-in backends (``numba_cpu``, ``numpy_ref``) are registered exactly like third-party
ones: through the ``lamina_register_kernels`` hook, which records kernels and rebuilds
the dispatch tables once. Entry points in group ``lamina.backends`` are loaded too.
Third-party plugins may add devices, fallbacks and kernel wrappers: the public plugin
API is described in docs/backends.md.
"""
import contextlib
import warnings
from builtins import list as _list

import numpy as np
import pluggy

from lamina._tensor import Tensor, from_array, from_storage
from lamina.dispatch import keys, table

from . import hookspecs
from .hookspecs import hookimpl

__all__ = ["hookimpl", "register", "unregister", "use", "list", "plugin_manager",
           "Registry", "cpu_fallback", "new_tensor", "move"]

plugin_manager = pluggy.PluginManager("lamina")
plugin_manager.add_hookspecs(hookspecs)
_sources = {}  # plugin name -> "built-in" | "entry point" | "runtime"
_devices = {}  # device name -> DeviceSpec, for devices that plugins added
_device_by_key = {}  # device key bit -> DeviceSpec


class DeviceSpec:
    """A device a plugin added: its key, its owner and its converters to/from the CPU."""

    __slots__ = ("name", "plugin", "key", "to_cpu", "from_cpu", "shares_memory")

    def __init__(self, name, plugin, key, to_cpu, from_cpu, shares_memory):
        self.name, self.plugin, self.key = name, plugin, key
        self.to_cpu, self.from_cpu, self.shares_memory = to_cpu, from_cpu, shares_memory

    def __repr__(self):
        return f"DeviceSpec({self.name!r}, plugin={self.plugin!r}, key={self.key:#x})"


def _check_kernel(what, fn, priority):
    if not callable(fn):
        raise TypeError(f"{what} must be callable, got {type(fn).__name__}")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"priority must be an int, got {priority!r}")


class Registry:
    """What a plugin's ``lamina_register_kernels`` hook receives (docs/backends.md).

    Everything it records belongs to ``plugin`` (its name) and is dropped together when
    the plugin is unregistered or its hook fails; the tables are rebuilt once after the
    hook returns, never per registration."""

    def __init__(self, plugin):
        self.plugin = plugin

    def register(self, op, device, fn, priority=0):
        """Serve operator ``op`` on ``device`` (or layer) with ``fn(ks, *args)``."""
        _check_kernel(f"the kernel for {op!r}", fn, priority)
        table.register_kernel(op, _key(device), fn, self.plugin, priority)

    def implements(self, op, device="cpu", priority=0):
        """Decorator form of ``register``."""
        def decorate(fn):
            self.register(op, device, fn, priority)
            return fn
        return decorate

    def register_wrapper(self, op, device, wrapper, priority=0):
        """``wrapper(next_kernel) -> kernel``, called at table-build time with the kernel
        that would serve (op, device) without it (Note [Kernel wrappers])."""
        _check_kernel(f"the kernel wrapper for {op!r}", wrapper, priority)
        table.register_kernel(op, _key(device), wrapper, self.plugin, priority, wraps=True)

    def add_device(self, name, *, to_cpu, from_cpu, shares_memory=True):
        """Add device ``name`` with its own dispatch key; returns the key (an int).

        ``to_cpu(t)`` returns a CPU tensor with ``t``'s values, ``from_cpu(t)`` a tensor
        of this device with the CPU tensor ``t``'s values; both may share memory with
        their argument when ``shares_memory`` (moves then copy once on the CPU side)."""
        if not isinstance(name, str) or not name or not name.replace("_", "a").isalnum():
            raise ValueError(f"a device name must be a non-empty string of letters, "
                             f"digits and underscores, got {name!r}")
        if name == "cpu" or name in keys.LAYER_KEYS:
            raise ValueError(f"{name!r} is a built-in device or layer name")
        if name in keys.devices():
            owner = _devices[name].plugin if name in _devices else "lamina"
            raise ValueError(f"device {name!r} is already provided by plugin {owner!r}")
        for what, fn in (("to_cpu", to_cpu), ("from_cpu", from_cpu)):
            _check_kernel(f"{what} of device {name!r}", fn, 0)
        key = keys.register_device(name)
        _devices[name] = _device_by_key[key] = DeviceSpec(name, self.plugin, key, to_cpu,
                                                          from_cpu, bool(shares_memory))
        return key

    def register_fallback(self, device, fn, priority=0):
        """``fn(op, ks, *args)`` serves every operator without a kernel on ``device``
        (Note [Backend fallback]); ``cpu_fallback`` is the usual choice."""
        _check_kernel(f"the fallback of device {device!r}", fn, priority)
        key = _key(device)
        if not key & keys.BACKEND_MASK:
            raise ValueError(f"fallbacks are for devices, not the {device!r} layer")
        table.register_fallback(key, fn, self.plugin, priority)


def _key(device):
    device = str(device)
    return keys.device_key(device) if device in keys.devices() else _layer_key(device)


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
        _forget(name)
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
    if table.broken:  # a kernel wrapper failed at table-build time
        ok = _drop_broken_wrappers(name) and ok
    if ok:
        _warn_ties(name)
    return ok


def _forget(name):
    """Drop everything plugin ``name`` recorded: kernels, fallbacks, devices."""
    table.unregister_plugin(name)
    for dev in [d for d in _devices.values() if d.plugin == name]:
        del _devices[dev.name], _device_by_key[dev.key]
        keys.unregister_device(dev.name)


def _drop_broken_wrappers(name):
    broken, ok = dict(table.broken), True
    table.broken.clear()
    for plugin, exc in broken.items():
        ok = ok and plugin != name
        if plugin in _sources:
            _forget(plugin)
            plugin_manager.unregister(name=plugin)
            _sources.pop(plugin)
        warnings.warn(f"lamina backend plugin {plugin!r} failed while building its kernel "
                      f"wrappers and was skipped: {type(exc).__name__}: {exc}",
                      RuntimeWarning, stacklevel=3)
    table.rebuild()
    return ok


def _warn_ties(name):
    by_other = {}
    for op, key, other, priority in table.ties(name):
        by_other.setdefault((other, priority), []).append(
            f"{op or '[fallback]'} on {keys.key_name(key)}")
    for (other, priority), what in by_other.items():
        shown = ", ".join(what[:5]) + (f" and {len(what) - 5} more" if len(what) > 5 else "")
        warnings.warn(f"lamina backend plugins {name!r} and {other!r} both register "
                      f"{shown} at priority {priority}; {min(name, other)!r} is used (ties "
                      f"go to the alphabetically first plugin name; raise one priority to "
                      f"choose)", RuntimeWarning, stacklevel=3)


def unregister(name):
    """Remove a plugin and its kernels; the kernels it overrode become active again."""
    plugin = plugin_manager.get_plugin(name)
    if plugin is None:
        raise ValueError(f"no backend plugin named {name!r}; registered: "
                         f"{', '.join(_sources)}")
    plugin_manager.unregister(plugin)
    _forget(name)
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


def list():  # noqa: A001  (lm.backends.list(), as the issue names it)
    """One record per plugin: name, source (built-in / entry point / runtime), devices
    it serves, devices it added, the priorities it registers at, and its number of
    kernels (fallbacks and wrappers included). Prints as a table."""
    rows = PluginList()
    for name in _sources:
        ks = table.kernels_of(name)
        added = sorted(d.name for d in _devices.values() if d.plugin == name)
        rows.append({"name": name, "source": _sources[name],
                     "devices": sorted({_key_label(k) for _, k, _ in ks} | set(added)),
                     "new_devices": added,
                     "priority": sorted({e.priority for _, _, e in ks}),
                     "kernels": len(ks)})
    return rows


def new_tensor(storage, device="cpu", dtype=None, shape=None):
    """A tensor on ``device`` holding ``storage``: a NumPy array (not copied) for the
    CPU, whatever object the device's plugin defines otherwise (then ``dtype``, a
    lamina dtype, and ``shape`` are required: nothing inspects the storage)."""
    if str(device) == "cpu":
        if not isinstance(storage, np.ndarray):
            raise TypeError(f"CPU storage must be a NumPy array, got {type(storage).__name__}")
        return from_array(storage)
    if dtype is None or shape is None:
        raise TypeError(f"new_tensor on device {device!r} needs dtype= and shape=")
    return from_storage(storage, keys.device_key(str(device)), dtype, shape)


def _device_spec(name, t):
    spec = _devices.get(name)
    if spec is None and name != "cpu":
        raise ValueError(f"cannot move a tensor from {t.device} to {name!r}: unknown device "
                         f"{name!r}; known devices: {', '.join(keys.devices())}")
    return spec


def move(t, device):
    """``t`` on ``device``, through the CPU: the source device's ``to_cpu``, then the
    target's ``from_cpu``; one CPU-side copy when both may share memory, so the result
    never shares storage with ``t``. What ``Tensor.to_device`` / ``Tensor.to`` call."""
    name, src = str(device), t.device.name
    dst_spec = _device_spec(name, t)
    if name == src:
        return t
    src_spec = _device_spec(src, t)
    cpu = t if src_spec is None else _converted(src_spec, "to_cpu", t, keys.CPU)
    if (src_spec is None or src_spec.shares_memory) and (
            dst_spec is None or dst_spec.shares_memory):
        cpu = table.OPERATORS["copy"](cpu)
    return cpu if dst_spec is None else _converted(dst_spec, "from_cpu", cpu, dst_spec.key)


def _converted(spec, which, t, key):
    out = getattr(spec, which)(t)
    if not isinstance(out, Tensor) or not out._ks & key or out._shape != t._shape:
        raise TypeError(f"{which} of device {spec.name!r} (plugin {spec.plugin!r}) returned "
                        f"{out!r:.80}, not a tensor of shape {t._shape} on "
                        f"{'cpu' if key == keys.CPU else spec.name}")
    return out


def cpu_fallback(op, ks, *args):
    """The usual device fallback (Note [Backend fallback]), as PyTorch's CPU fallback:
    convert the device's tensors to CPU with its ``to_cpu``, run the CPU kernel,
    convert the results back with ``from_cpu``. An in-place operator's result is
    written back into its first argument (its storage is replaced by the converted
    result's). Views come back as views only if the converters share memory."""
    spec = _device_by_key.get(1 << ((ks & keys.BACKEND_MASK).bit_length() - 1))
    if spec is None:
        raise NotImplementedError(f"cpu_fallback: {op.name} was called with keys "
                                  f"{keys.keyset_names(ks)}, none of a plugin's device")
    key, to_cpu, from_cpu = spec.key, spec.to_cpu, spec.from_cpu

    def down(a):
        if isinstance(a, Tensor):
            return to_cpu(a) if a._ks & key else a
        if type(a) in (tuple, _list):
            return type(a)(down(b) for b in a)
        return a

    def up(a):
        if isinstance(a, Tensor):
            return from_cpu(a) if a._ks & keys.CPU else a
        if type(a) in (tuple, _list):
            return type(a)(up(b) for b in a)
        return a

    out = op.table[keys.CPU.bit_length()](keys.CPU, *[down(a) for a in args])
    if op.kind == "inplace":
        target = args[0]
        target._data = from_cpu(out)._data
        return target
    return up(out)


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
    from lamina import autograd
    from . import numba_cpu, numpy_ref, sparse
    register(numpy_ref, "numpy_ref", "built-in")
    register(numba_cpu, "numba_cpu", "built-in")
    register(sparse, "sparse", "built-in")  # the sparse-check layer (SPARSE key)
    register(autograd, "autograd", "built-in")  # the layer registers like a backend
    _load_entry_points()
