"""Layer switches: every layer of a call can be turned off, so its cost can be
measured as "on minus off" (``python -m lamina.overhead``).

=============  ==========================================================================
layer          what turning it off removes, and what becomes unsafe or different
=============  ==========================================================================
dispatcher     The keyed dispatch: Tensor operators and the elementwise functions call
               the CPU backend kernel directly. Only dense CPU tensors that do not
               require grad are accepted; anything else raises RuntimeError naming the
               layer (nothing would record gradients or route sparse tensors).
autograd       The AUTOGRAD key (a fallthrough): nothing is recorded, results never
               require grad, even under enable_grad.
sparse         The SPARSE key: a call with a sparse tensor raises, saying the layer is
               off (never a dense kernel reading sparse storage).
checks         The operator-setup validation of the fast path (same shape, same dtype,
               contiguous): the flat kernel runs on both inputs as they are. UNSAFE:
               inputs of different shapes or layouts give wrong results (sizes and dtypes
               are still compared, so memory is never read out of bounds).
allocator      The pool allocator (``lamina.memory``): NumPy allocates with its default
               allocator, large blocks go back to the C library when their array dies.
               OFF BY DEFAULT (see docs/performance.md, "Tuning"); needs the C core; set per
               thread (NumPy's allocator is a context variable, ``lamina.memory``).
=============  ==========================================================================

Switching rebuilds the dispatch tables (or the bindings, or installs the allocator)
once; a disabled layer costs nothing per call. The state itself is
``lamina.dispatch.layers``, which the tables read; this module is the only place that
changes it.

The switches are process-wide, like the tables (Note [Layer holds]): ``disable`` and
``enable`` set a layer's switch, and an ``off()`` block holds a layer off until it
leaves, so blocks in several threads never switch a layer back on under each other.
"""

import contextlib
from collections.abc import Iterator

from lamina.dispatch import bindings, entries
from lamina.dispatch import layers as _state
from lamina.dispatch import memory as _pool
from lamina.dispatch import registry as _registry

LAYERS = _state.LAYERS
DEFAULTS = _state.DEFAULTS  # {layer: enabled} after import
state = _state.state


def _apply(name: str) -> None:
    if name == "dispatcher":
        bindings.reinstall(direct=_state.is_off(name))
    elif name == "allocator":
        _pool.install(not _state.is_off(name))
    else:
        entries.rebuild()


def disable(*names: str) -> None:
    """Switch layers off (see the table above)."""
    _state.check_names(names)
    with _registry.lock:
        for name in names:
            if _state.set_enabled(name, False):
                _apply(name)


def enable(*names: str) -> None:
    """Switch layers back on (a layer held by an ``off()`` block stays off until the
    block leaves)."""
    _state.check_names(names)
    if "allocator" in names:
        _pool.require()  # RuntimeError under the pure-Python core, before any change
    with _registry.lock:
        for name in names:
            if _state.set_enabled(name, True) or name == "allocator":
                _apply(name)  # the allocator: in the calling thread too (lamina.memory)


def _hold(names: tuple[str, ...], held: bool) -> None:
    with _registry.lock:
        for name in names:
            if _state.hold(name, held):
                _apply(name)


@contextlib.contextmanager
def off(*names: str) -> Iterator[None]:
    """``with lm.layers.off("autograd", "checks"): ...`` -- the layers are off in the
    block and switched back on when it leaves, even on error, unless something else
    still keeps them off (``disable``, another block)."""
    _state.check_names(names)
    names = tuple(dict.fromkeys(names))
    _hold(names, True)
    try:
        yield
    finally:
        _hold(names, False)
