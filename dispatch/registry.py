"""Kernel registrations: which plugin registered what, for which operator and key.

Nothing here is on the call path: ``entries.rebuild`` turns the registrations into the
operators' tables. Plugins register through ``lamina.backends.Registry``, which calls
these functions with the plugin's name.

Note [Kernel variants]: a kernel may come with variants, declared when it is
registered: ``with_scalar`` serves calls with a Python scalar operand (the bindings
route them to ``op.scalar_table``), ``unchecked`` serves calls while the "checks"
layer is off (Note [Unchecked fast path]). A variant belongs to its kernel's record:
a wrapper, device check or fallback in front of a kernel serves every call itself.

Note [Kernel priority]: among the kernels of one slot the preferred plugin
(lm.backends.use) wins; then the higher priority; then the plugin name
(alphabetical), then registration order, so ties never depend on the order plugins
were loaded in. Kernels are ranked against kernels and wrappers against wrappers
(Note [Kernel wrappers] in ``entries.py``): a wrapper's priority orders it among the
slot's wrappers, never against the kernel it wraps. ``ties`` finds the registrations a
plugin's ranking decided by name or order alone; lamina.backends warns about them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from . import keys
from .schema import get


@dataclass
class Kernel:
    """One registration: a kernel (or wrapper factory, or device fallback) of a plugin."""

    fn: Callable
    plugin: str
    priority: int
    order: int  # registration order, only for stable tie-breaking
    wraps: bool = False  # fn is a factory fn(next_kernel) -> kernel (Note [Kernel wrappers])
    with_scalar: Callable | None = None  # Note [Kernel variants]
    unchecked: Callable | None = None
    label: str | None = None  # how dumps show it, when not its function's name
    site: tuple[str, int] | None = None  # (file, line) of the registering call, for warnings
    declines: bool = False  # may return NotImplemented (Note [Declining kernels])

    @property
    def name(self) -> str:
        if self.label is not None:
            return self.label
        fn = self.fn
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


kernels: dict[tuple[str, int], list[Kernel]] = {}  # (op name, key bit) -> registrations
fallbacks: dict[int, list[Kernel]] = {}  # device key bit -> [Kernel] (Note [Backend fallback])
_order = 0
preferred_plugin: str | None = None  # lm.backends.use
builtin: set[str] = set()  # lamina's own plugins (lamina.backends registers them)
# Note [Thread safety]: registrations, layer switches and table rebuilds take this one
# lock, so two threads never rebuild at once; calls take no lock: a rebuild computes an
# operator's whole table first and stores it with one slice assignment (atomic under
# the GIL), so a call in another thread sees the old entries or the new, never a mix
# (Note [Rebuild order] in entries.py).
# The user-facing contract: docs/guide/threads.md.
lock = threading.RLock()


def _next_order() -> int:
    global _order
    _order += 1
    return _order


def register_kernel(
    op_name: str,
    key: int,
    fn: Callable,
    plugin: str,
    priority: int = 0,
    *,
    wraps: bool = False,
    with_scalar: Callable | None = None,
    unchecked: Callable | None = None,
    site: tuple[str, int] | None = None,
    declines: bool = False,
) -> Kernel:
    """Record a kernel for (operator, key); ``entries.rebuild()`` makes it active."""
    get(op_name)  # unknown operator names are an error, not a silent new entry
    k = Kernel(
        fn,
        plugin,
        priority,
        _next_order(),
        wraps,
        with_scalar,
        unchecked,
        site=site,
        declines=declines,
    )
    kernels.setdefault((op_name, key), []).append(k)
    return k


def register_fallback(
    key: int, fn: Callable, plugin: str, priority: int = 0, site: tuple[str, int] | None = None
) -> Kernel:
    """Record a device's fallback (Note [Backend fallback]); ``rebuild()`` activates it."""
    if key not in keys.all_keys() or not key & keys.BACKEND_MASK:
        raise ValueError(f"a fallback needs a registered device key, got {key:#x}")
    k = Kernel(fn, plugin, priority, _next_order(), site=site)
    fallbacks.setdefault(key, []).append(k)
    return k


def unregister_plugin(plugin: str) -> None:
    """Drop every kernel and fallback that ``plugin`` registered."""
    for registry in (kernels, fallbacks):
        for k, entries in list(registry.items()):
            entries[:] = [e for e in entries if e.plugin != plugin]
            if not entries:
                del registry[k]


def kernels_of(plugin: str) -> list[tuple[str | None, int, Kernel]]:
    """(op name, key, Kernel) of every kernel of ``plugin``; op name None for fallbacks."""
    return [(op, key, e) for (op, key), es in kernels.items() for e in es if e.plugin == plugin] + [
        (None, key, e) for key, es in fallbacks.items() for e in es if e.plugin == plugin
    ]


@dataclass(frozen=True)
class Tie:
    """Registrations of one slot, of one kind, at one priority, that include one of the
    plugin's: their order was decided by plugin name and registration order alone."""

    op: str | None  # None for device fallbacks
    key: int
    kind: str  # "kernel", "wrapper" or "fallback"
    priority: int
    ranked: tuple[Kernel, ...]  # best first (Note [Kernel priority], no preferred plugin)


def ties(plugin: str) -> list[Tie]:
    """Every tie (``Tie``) that ``plugin``'s registrations take part in, with another
    plugin's or with its own (a slot registered twice at one priority)."""
    found, seen = [], set()
    for op, key, e in kernels_of(plugin):
        kind = "fallback" if op is None else "wrapper" if e.wraps else "kernel"
        if (op, key, kind, e.priority) in seen:
            continue
        seen.add((op, key, kind, e.priority))
        entries = kernels[op, key] if op is not None else fallbacks[key]
        same = [o for o in entries if o.wraps == e.wraps and o.priority == e.priority]
        if len(same) > 1:
            ranked = tuple(sorted(same, key=lambda o: (o.plugin, o.order)))
            found.append(Tie(op, key, kind, e.priority, ranked))
    return found


def rank(e: Kernel) -> tuple:
    """The sort key of Note [Kernel priority]: the lowest ranks first."""
    return (e.plugin != preferred_plugin, -e.priority, e.plugin, e.order)
