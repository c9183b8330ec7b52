"""lamina.autograd -- the autograd layer (reverse-mode differentiation).

Its kernels (``layer.py``) sit at the AUTOGRAD dispatch key. A tensor's key set has
that bit only while it requires grad, so a call whose inputs do not require grad never
enters the layer: no-op autograd costs nothing. Inside, a kernel redispatches below its
own key through the same table, then records a graph node (``graph.py``) unless grad
mode is off (``grad_mode.py``); ``engine.py`` runs the graph backwards with the
formulas of ``derivatives.py``.
"""

import sys

from lamina.dispatch import tensor as _tensor

from . import engine, graph, layer
from .derivatives import DERIVATIVES
from .engine import backward, grad
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .gradcheck import gradcheck
from .graph import register_hook, register_post_accumulate_grad_hook

plugin = layer  # registered by lamina/__init__.py, like a backend plugin

__all__ = [
    "DERIVATIVES",
    "backward",
    "enable_grad",
    "engine",
    "grad",
    "gradcheck",
    "graph",
    "is_grad_enabled",
    "no_grad",
    "plugin",
    "register_hook",
    "register_post_accumulate_grad_hook",
    "set_grad_enabled",
]

# Tensor.backward and Tensor.register_hook call through this (Note [Upper layers])
_tensor.upper.autograd = sys.modules[__name__]
