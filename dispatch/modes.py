"""Modes: keys that a thread adds to (or removes from) the key set of every call.

Note [Modes]: PyTorch's local dispatch key set. While a mode is on in a thread, every
call the thread makes dispatches on

    ((the keys of its tensors) | included) & ~excluded

calls without tensor arguments too (creation operators, whose key set is their
device's; random operators, whose generator is an argument): so a key above AUTOGRAD
that a mode includes -- a tracer's -- sees each call of the program and can record
it, and a layer key a mode excludes is skipped by every call. A layer key without a
kernel for an operator falls through (Note [Table entry precedence]), so a mode's
key only needs kernels for what it handles.

Every entry point applies it (``reference.with_modes``): the generated bindings and
the elementwise ones, calls of operator objects, creation, and the C core's bindings,
which hand the call to their Python twin while any mode is on. A call pays one test of
a flag when no mode is on anywhere. Modes do not apply with the dispatcher layer off:
its direct bindings call the CPU kernels without any key set.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from . import core
from .reference import mode_keys as local

_on = 0  # modes on, in all threads (the bindings test core's flag: on while _on > 0)
_lock = threading.Lock()


def _set_active(delta: int) -> None:
    global _on
    with _lock:
        _on += delta
        core.set_modes_active(_on > 0)


@contextmanager
def include(key: int) -> Iterator[None]:
    """Add ``key`` to the key set of every call this thread makes inside the block."""
    with _mode(key, 0):
        yield


@contextmanager
def exclude(key: int) -> Iterator[None]:
    """Remove ``key`` from the key set of every call this thread makes inside the block."""
    with _mode(0, key):
        yield


@contextmanager
def _mode(include: int, exclude: int) -> Iterator[None]:
    saved = local.include, local.exclude
    local.include = (saved[0] | include) & ~exclude
    local.exclude = (saved[1] | exclude) & ~include
    _set_active(1)
    try:
        yield
    finally:
        local.include, local.exclude = saved
        _set_active(-1)


def current() -> tuple[int, int]:
    """This thread's (included, excluded) keys."""
    return local.include, local.exclude
