"""RMSprop, as PyTorch's ``torch.optim.RMSprop``."""

from __future__ import annotations

from typing import Any

from lamina.dispatch import ops
from lamina.dispatch.tensor import Tensor

from .optimizer import Optimizer, ParamsT, Update, lerp, step_count, step_tensor


class RMSprop(Optimizer):
    """RMSprop (Hinton), PyTorch's rule: ``g = grad + weight_decay * p`` (``-grad``
    with ``maximize``); ``v = alpha v + (1 - alpha) g²``; ``avg = sqrt(v) + eps``, or
    with ``centered`` ``sqrt(v - ga²) + eps`` where ``ga = alpha ga + (1 - alpha) g``;
    with momentum ``buf = momentum buf + g / avg`` and ``p -= lr * buf``, else ``p -=
    lr * g / avg``.

    ``foreach`` and ``capturable`` are accepted for PyTorch code and change nothing.
    Its state, per parameter: ``step``, ``square_avg``, ``momentum_buffer`` (momentum
    > 0) and ``grad_avg`` (centered).
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr,
            momentum=momentum,
            alpha=alpha,
            eps=eps,
            centered=centered,
            weight_decay=weight_decay,
            capturable=capturable,
            foreach=foreach,
            maximize=maximize,
            differentiable=differentiable,
        )
        super().__init__(params, defaults)

    def _update(
        self, group: dict[str, Any], p: Tensor, grad: Tensor, state: dict[str, Any] | None
    ) -> Update:
        lr, alpha, momentum, eps = group["lr"], group["alpha"], group["momentum"], group["eps"]
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + group["weight_decay"] * p
        state = state or {}
        square_avg = state.get("square_avg")
        square_avg = ops.zeros_like(p) if square_avg is None else square_avg
        square_avg = square_avg * alpha + (1.0 - alpha) * g * g
        new = {"step": step_tensor(step_count(state)), "square_avg": square_avg}
        if group["centered"]:
            grad_avg = state.get("grad_avg")
            grad_avg = ops.zeros_like(p) if grad_avg is None else grad_avg
            grad_avg = new["grad_avg"] = lerp(grad_avg, g, 1.0 - alpha)
            average = lambda: ops.sqrt(square_avg - grad_avg * grad_avg) + eps
        else:
            average = lambda: ops.sqrt(square_avg) + eps
        if momentum > 0:
            buf = state.get("momentum_buffer")
            buf = ops.zeros_like(p) if buf is None else buf
            buf = new["momentum_buffer"] = buf * momentum + g / average()
            return Update(lambda: lr * buf, new)
        return Update(lambda: lr * g / average(), new)
