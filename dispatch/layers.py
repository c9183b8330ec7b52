"""The layer state: which layers of a call are switched off.

Read by the table computation (``entries.compute_entry``) and the bindings; changed
only through ``lamina.layers`` (``enable``, ``disable``, ``off``), which rebuilds what
depends on it. The layers are documented there.

Note [Layer holds]: the state is process-wide, as the tables are. ``disable`` and
``enable`` set a layer's switch; an ``off()`` block *holds* the layer off instead, and
a layer is off while it is disabled or held by any block. So blocks in two threads, or
nested ones, never switch a layer back on under each other: the last block to leave
is the one that ends the hold.
"""

from collections import Counter

LAYERS = ("dispatcher", "autograd", "sparse", "checks", "allocator")
OFF_BY_DEFAULT = ("allocator",)  # README "Memory": small arrays +4 ns, memory kept
DEFAULTS = {name: name not in OFF_BY_DEFAULT for name in LAYERS}  # {layer: enabled}
_disabled: set[str] = set(OFF_BY_DEFAULT)
_held: Counter = Counter()  # layer -> off() blocks holding it off now


def is_off(name: str) -> bool:
    return name in _disabled or _held[name] > 0


def state() -> dict[str, bool]:
    """{layer name: enabled}."""
    return {name: not is_off(name) for name in LAYERS}


def check_names(names: tuple[str, ...]) -> None:
    for name in names:
        if name not in LAYERS:
            raise ValueError(f"unknown layer {name!r}; layers: {', '.join(LAYERS)}")


def set_enabled(name: str, enabled: bool) -> bool:
    """Set a layer's switch; True if that changed whether it is off (lamina.layers
    rebuilds then)."""
    check_names((name,))
    before = is_off(name)
    (_disabled.discard if enabled else _disabled.add)(name)
    return is_off(name) != before


def hold(name: str, held: bool) -> bool:
    """One more (``held``) or one fewer off() block holding ``name`` off; True if that
    changed whether it is off."""
    before = is_off(name)
    _held[name] += 1 if held else -1
    return is_off(name) != before
