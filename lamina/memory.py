"""The pool allocator: ``lm.memory.stats()``, ``empty_cache()``, ``configure()``.

The pool is the "allocator" layer of ``lm.layers`` (on or off like the others; Note
[Pool allocator] in ``dispatch/csrc/pool.c``). While it is on, NumPy allocates every array
through it: a request of at least ``threshold`` bytes (default 128 KiB, the size from
which glibc maps blocks) is rounded up to one of four size classes per octave and
served from a block an earlier array of that class freed, so the C library does not
unmap large blocks after each use, or give its heap back, and map them again, page
fault by page fault, for the next one. At most ``limit`` bytes (default 1 GiB,
``LAMINA_POOL_BYTES``) stay cached: a freed block beyond that goes back at once, and
``empty_cache()`` returns them all. The threshold can also be set from the environment
(``LAMINA_POOL_THRESHOLD``); raising it above 128 KiB brings the faults back (Note
[Pool allocator]).

Threads: NumPy keeps its allocator in a context variable. Switching the layer sets it
for the calling thread (threads and tasks started from it later copy its context only
where Python copies contexts, e.g. ``contextvars.copy_context().run``); a thread started
with ``threading.Thread`` uses NumPy's default allocator until it switches the layer on
itself. The pool and its counters are shared by all threads (one lock), and an array
made by the pool is always freed into it, even after the layer was switched off.

The pool needs the C core: under the pure-Python core (``LAMINA_PURE_PYTHON=1``) the
layer stays off, ``stats()`` reports zeros and switching the layer on raises.
"""

from __future__ import annotations

from lamina.dispatch import memory as _pool


def stats() -> dict[str, int]:
    """The pool's counters: ``allocations`` (requests of at least the threshold since the
    last ``reset_stats``), ``hits`` (served from a cached block), ``returned`` (blocks
    given back to the C library), ``bytes_cached`` and ``blocks_cached`` (waiting for
    reuse), ``bytes_in_use`` and ``peak_bytes_in_use`` (pool blocks held by live
    arrays), ``threshold`` and ``limit``."""
    return _pool.stats()


def empty_cache() -> None:
    """Return every cached block to the C library (live arrays are not touched)."""
    _pool.empty_cache()


def reset_stats() -> None:
    """Zero the counters; the peak starts again from the bytes in use now."""
    _pool.reset_stats()


def configure(*, threshold: int | None = None, limit: int | None = None) -> None:
    """Set the smallest request the pool serves and the most bytes it caches (both in
    bytes; the current value where not given). A limit below what is cached now empties
    the cache."""
    current = stats()
    values = {}
    for name, value in (("threshold", threshold), ("limit", limit)):
        if value is None:
            value = current[name] or (
                _pool.DEFAULT_THRESHOLD if name == "threshold" else _pool.DEFAULT_LIMIT
            )
        if isinstance(value, bool) or not isinstance(value, int):
            kind = type(value).__name__
            raise TypeError(f"configure: {name} must be an int (bytes), got {kind}")
        least = 1 if name == "threshold" else 0
        if value < least:
            raise ValueError(f"configure: {name} must be at least {least}, got {value}")
        if value > _pool.MAX_BYTES:  # the C core holds it in 64 bits (and reports it signed)
            raise OverflowError(
                f"configure: {name}={value} is too large; the largest accepted value is "
                f"{_pool.MAX_BYTES} (2**63 - 1) bytes"
            )
        values[name] = value
    _pool.configure(values["threshold"], values["limit"])
    if current["bytes_cached"] > values["limit"]:
        empty_cache()
