"""The pool allocator behind the "allocator" layer (Note [Pool allocator] in csrc/pool.c).

The pool is a NumPy memory handler in the C core, so every array NumPy allocates goes
through it: requests of at least ``threshold`` bytes are served from size classes of
blocks that earlier arrays freed, at most ``limit`` bytes of them cached. The pure-Python
core has no pool (NumPy's handlers are C structs): there the layer stays off and
switching it on raises. Configured at import from ``LAMINA_POOL_BYTES`` (the limit) and
``LAMINA_POOL_THRESHOLD``; changed only through ``lamina.memory`` and ``lamina.layers``.

NumPy keeps its handler in a context variable, so ``install`` sets it for the calling
thread (and the contexts copied from it later); ``lamina.memory`` documents what that
means for threads.
"""

from __future__ import annotations

import os

from . import core

AVAILABLE = core.IMPLEMENTATION == "c"
DEFAULT_THRESHOLD = 1 << 17  # Note [Pool allocator]: glibc's initial mmap threshold
DEFAULT_LIMIT = 1 << 30
MAX_BYTES = (1 << 63) - 1  # the largest threshold or limit: the C core's counters are 64-bit
_STAT_NAMES = (
    "allocations",
    "hits",
    "returned",
    "bytes_cached",
    "blocks_cached",
    "bytes_in_use",
    "peak_bytes_in_use",
    "threshold",
    "limit",
)


def _env_bytes(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be a number of bytes, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    if value > MAX_BYTES:
        raise ValueError(
            f"{name}={text} is too large; the largest accepted value is {MAX_BYTES} "
            "(2**63 - 1) bytes"
        )
    return value


def configure(threshold: int, limit: int) -> None:
    for name, value in (("threshold", threshold), ("limit", limit)):
        if not 0 <= value <= MAX_BYTES:  # the C core would wrap it around silently
            raise OverflowError(f"pool {name} {value} is outside [0, {MAX_BYTES}]")
    if AVAILABLE:
        core._core.pool_configure(threshold, limit)


def require() -> None:
    """RuntimeError unless the pool can be switched on."""
    if not AVAILABLE:
        raise RuntimeError(
            "the allocator layer needs the C core (it is a NumPy memory handler); this "
            "process runs the pure-Python core (LAMINA_PURE_PYTHON=1 or no extension)"
        )


def install(on: bool) -> None:
    """NumPy allocates through the pool (``on``) or with its default allocator."""
    if on:
        require()
    if AVAILABLE:
        core._core.pool_install(on)


def stats() -> dict[str, int]:
    if not AVAILABLE:
        return dict.fromkeys(_STAT_NAMES, 0)
    return core._core.pool_stats()


def empty_cache() -> None:
    if AVAILABLE:
        core._core.pool_empty()


def reset_stats() -> None:
    if AVAILABLE:
        core._core.pool_reset()


configure(
    _env_bytes("LAMINA_POOL_THRESHOLD", DEFAULT_THRESHOLD) or 1,
    _env_bytes("LAMINA_POOL_BYTES", DEFAULT_LIMIT),
)
