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
nothing per call.
"""
import contextlib

from lamina.dispatch import keys, table

LAYERS = ("dispatcher", "autograd", "sparse", "checks")
_off = set()


def _check(names):
    for name in names:
        if name not in LAYERS:
            raise ValueError(f"unknown layer {name!r}; layers: {', '.join(LAYERS)}")


def state():
    """{layer name: enabled}."""
    return {name: name not in _off for name in LAYERS}


def _apply(name, enabled):
    if name in keys.LAYER_KEYS or name == "checks":
        table.set_layer(name, enabled)
    else:  # dispatcher
        from lamina import _tensor
        import lamina
        if enabled:
            _tensor.install_bindings(vars(lamina))
        else:
            _tensor.install_direct_bindings(vars(lamina))


def disable(*names):
    _check(names)
    for name in names:
        if name not in _off:
            _off.add(name)
            _apply(name, False)


def enable(*names):
    _check(names)
    for name in names:
        if name in _off:
            _off.discard(name)
            _apply(name, True)


@contextlib.contextmanager
def off(*names):
    """``with lm.layers.off("autograd", "checks"): ...`` — restored even on error."""
    _check(names)
    newly = [n for n in names if n not in _off]
    disable(*newly)
    try:
        yield
    finally:
        enable(*newly)
