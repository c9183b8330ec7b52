"""Stochastic gradient descent, as PyTorch's ``torch.optim.SGD``."""

from __future__ import annotations

from typing import Any

from lamina.dispatch import ops
from lamina.dispatch.tensor import Tensor

from .optimizer import Optimizer, ParamsT, Update


class SGD(Optimizer):
    """Stochastic gradient descent, optionally with momentum; PyTorch's rule:
    ``g = grad + weight_decay * p`` (``-grad`` with ``maximize``); with momentum,
    ``buf = momentum * buf + (1 - dampening) * g`` (``buf = g`` at the first step) and
    ``g = g + momentum * buf`` with ``nesterov``, else ``g = buf``; ``p -= lr * g``.

    ``foreach`` and ``fused`` are accepted for PyTorch code and change nothing: lamina
    has one implementation. Its state, per parameter: ``momentum_buffer`` (with
    momentum).
    """

    supports_complex = True  # every operation of the rule is linear

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
            foreach=foreach,
            differentiable=differentiable,
            fused=fused,
        )
        super().__init__(params, defaults)

    def _update(
        self, group: dict[str, Any], p: Tensor, grad: Tensor, state: dict[str, Any] | None
    ) -> Update:
        lr, momentum = group["lr"], group["momentum"]
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + group["weight_decay"] * p
        if momentum == 0:
            return Update(lambda: g, {}, scale=lr)
        buf = state.get("momentum_buffer") if state else None
        if buf is None:
            # a copy: the gradient may be zeroed in place later (zero_grad(set_to_none=False))
            buf = ops.asarray(g, copy=True) if g is grad else g
        elif group["dampening"] == 0:
            buf = buf * momentum + g
        else:
            buf = buf * momentum + (1.0 - group["dampening"]) * g
        if group["nesterov"]:
            return Update(lambda: g + momentum * buf, {"momentum_buffer": buf}, scale=lr)
        return Update(lambda: buf, {"momentum_buffer": buf}, scale=lr)
