"""Adadelta, as PyTorch's ``torch.optim.Adadelta``."""

from __future__ import annotations

from typing import Any

from lamina.dispatch import ops
from lamina.dispatch.tensor import Tensor

from .optimizer import Optimizer, ParamsT, Update, step_count, step_tensor


class Adadelta(Optimizer):
    """Adadelta (Zeiler), PyTorch's rule: ``g = grad + weight_decay * p`` (``-grad``
    with ``maximize``); ``v = rho v + (1 - rho) g²``; ``delta = sqrt(u + eps) /
    sqrt(v + eps) * g``; ``u = rho u + (1 - rho) delta²``; ``p -= lr * delta``.

    ``foreach`` and ``capturable`` are accepted for PyTorch code and change nothing.
    Its state, per parameter: ``step``, ``square_avg`` (v) and ``acc_delta`` (u).
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        foreach: bool | None = None,
        *,
        capturable: bool = False,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr,
            rho=rho,
            eps=eps,
            weight_decay=weight_decay,
            maximize=maximize,
            capturable=capturable,
            foreach=foreach,
            differentiable=differentiable,
        )
        super().__init__(params, defaults)

    def _update(
        self, group: dict[str, Any], p: Tensor, grad: Tensor, state: dict[str, Any] | None
    ) -> Update:
        rho, eps = group["rho"], group["eps"]
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + group["weight_decay"] * p
        if state:
            square_avg, acc_delta = state["square_avg"], state["acc_delta"]
        else:
            square_avg, acc_delta = ops.zeros_like(p), ops.zeros_like(p)
        square_avg = square_avg * rho + (1.0 - rho) * g * g
        delta = ops.sqrt(acc_delta + eps) / ops.sqrt(square_avg + eps) * g
        acc_delta = acc_delta * rho + (1.0 - rho) * delta * delta
        new = {
            "step": step_tensor(step_count(state)),
            "square_avg": square_avg,
            "acc_delta": acc_delta,
        }
        lr = group["lr"]
        return Update(lambda: lr * delta, new)
