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
=============  ==========================================================================

Switching rebuilds the dispatch tables (or the bindings) once; a disabled layer costs
nothing per call. The state itself is ``lamina.dispatch.layers``, which the tables read;
this module is the only place that changes it.
"""

import contextlib
from collections.abc import Iterator

from lamina.dispatch import bindings, entries
from lamina.dispatch import layers as _state

LAYERS = _state.LAYERS
state = _state.state


def _switch(name: str, enabled: bool) -> None:
    if not _state.set_enabled(name, enabled):
        return
    if name == "dispatcher":
        bindings.reinstall(direct=not enabled)
    else:
        entries.rebuild()


def disable(*names: str) -> None:
    """Switch layers off (see the table above)."""
    _state.check_names(names)
    for name in names:
        _switch(name, False)


def enable(*names: str) -> None:
    """Switch layers back on."""
    _state.check_names(names)
    for name in names:
        _switch(name, True)


@contextlib.contextmanager
def off(*names: str) -> Iterator[None]:
    """``with lm.layers.off("autograd", "checks"): ...`` -- restored even on error."""
    _state.check_names(names)
    newly = [n for n in names if not _state.is_off(n)]
    disable(*newly)
    try:
        yield
    finally:
        enable(*newly)
