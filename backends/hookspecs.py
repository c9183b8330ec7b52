"""pluggy hook specifications of lamina backends (project name ``lamina``).

A backend is a pluggy plugin: an object or module with ``@hookimpl``-marked functions.
Hooks run once, when the plugin is registered; they fill the dispatch tables and never
run per call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from ._registry import Registry

hookspec = pluggy.HookspecMarker("lamina")
hookimpl = pluggy.HookimplMarker("lamina")


@hookspec
def lamina_register_kernels(registry: Registry) -> None:
    """Register kernels with ``registry.register(op, device, fn, priority=0)``.

    ``fn(ks, *args)`` receives the call's key set first (layers redispatch with it;
    backends may ignore it) and returns the result tensor(s). The registry (a
    ``lamina.backends.Registry``) also has ``implements`` (decorator form),
    ``register_wrapper``, ``add_device`` and ``register_fallback``: see
    docs/backends.md."""
