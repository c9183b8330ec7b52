"""Adagrad, as PyTorch's ``torch.optim.Adagrad``."""

from __future__ import annotations

from typing import Any

from lamina.dispatch import ops
from lamina.dispatch.tensor import Tensor

from .optimizer import Optimizer, ParamsT, Update, step_count, step_tensor


class Adagrad(Optimizer):
    """Adagrad (Duchi et al.), PyTorch's rule: ``g = grad + weight_decay * p``
    (``-grad`` with ``maximize``); ``sum += g²``; ``p -= lr / (1 + (t - 1) lr_decay) *
    g / (sqrt(sum) + eps)`` at step t.

    ``foreach`` and ``fused`` are accepted for PyTorch code and change nothing. Its
    state, per parameter, made with the optimizer as in PyTorch: ``step`` and ``sum``
    (starting at ``initial_accumulator_value``).
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        defaults = dict(
            lr=lr,
            lr_decay=lr_decay,
            eps=eps,
            weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value,
            foreach=foreach,
            maximize=maximize,
            differentiable=differentiable,
            fused=fused,
        )
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As ``Optimizer.add_param_group``; the new parameters' state is made now."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            self.state[p] = self._initial_state(group, p)

    @staticmethod
    def _initial_state(group: dict[str, Any], p: Tensor) -> dict[str, Any]:
        return {
            "step": step_tensor(0.0),
            "sum": ops.full_like(p, group["initial_accumulator_value"]),
        }

    def _update(
        self, group: dict[str, Any], p: Tensor, grad: Tensor, state: dict[str, Any] | None
    ) -> Update:
        state = state or self._initial_state(group, p)  # a state dict that left it out
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + group["weight_decay"] * p
        step = step_count(state)
        clr = group["lr"] / (1.0 + (step - 1.0) * group["lr_decay"])
        total, eps = state["sum"] + g * g, group["eps"]
        new = {"step": step_tensor(step), "sum": total}
        return Update(lambda: clr * g / (ops.sqrt(total) + eps), new)
