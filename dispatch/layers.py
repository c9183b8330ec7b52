"""The layer state: which layers of a call are switched off.

One set, read by the table computation (``entries.compute_entry``) and the bindings;
changed only through ``lamina.layers`` (``enable``, ``disable``, ``off``), which
rebuilds what depends on it. The layers are documented there.
"""

LAYERS = ("dispatcher", "autograd", "sparse", "checks")
_off: set[str] = set()


def is_off(name: str) -> bool:
    return name in _off


def state() -> dict[str, bool]:
    """{layer name: enabled}."""
    return {name: name not in _off for name in LAYERS}


def check_names(names: tuple[str, ...]) -> None:
    for name in names:
        if name not in LAYERS:
            raise ValueError(f"unknown layer {name!r}; layers: {', '.join(LAYERS)}")


def set_enabled(name: str, enabled: bool) -> bool:
    """Record the switch; True if it changed anything (lamina.layers rebuilds then)."""
    check_names((name,))
    if enabled == (name not in _off):
        return False
    (_off.discard if enabled else _off.add)(name)
    return True
