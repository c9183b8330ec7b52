"""Adam and AdamW, as PyTorch's ``torch.optim.Adam`` and ``torch.optim.AdamW``."""

from __future__ import annotations

from typing import Any

from lamina.dispatch import ops
from lamina.dispatch.tensor import Tensor

from .optimizer import Optimizer, ParamsT, Update, lerp, step_count, step_tensor


class Adam(Optimizer):
    """Adam (Kingma and Ba), PyTorch's rule: ``g = grad`` (``-grad`` with
    ``maximize``) plus ``weight_decay * p`` (L2), or, with ``decoupled_weight_decay``,
    ``p *= 1 - lr * weight_decay`` instead (AdamW); ``m = b1 m + (1 - b1) g``, ``v = b2
    v + (1 - b2) g²`` (``amsgrad``: the running maximum of ``v`` in its place below);
    ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``.

    ``foreach``, ``fused`` and ``capturable`` are accepted for PyTorch code and change
    nothing: lamina has one implementation. Its state, per parameter: ``step``,
    ``exp_avg``, ``exp_avg_sq`` and (amsgrad) ``max_exp_avg_sq``.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=decoupled_weight_decay,
        )
        super().__init__(params, defaults)

    def _update(
        self, group: dict[str, Any], p: Tensor, grad: Tensor, state: dict[str, Any] | None
    ) -> Update:
        lr, (beta1, beta2), wd = group["lr"], group["betas"], group["weight_decay"]
        g = -grad if group["maximize"] else grad
        decay = None
        if wd != 0:
            if group["decoupled_weight_decay"]:
                decay = 1.0 - lr * wd
            else:
                g = g + wd * p
        step = step_count(state)
        if state:
            m, v = state["exp_avg"], state["exp_avg_sq"]
        else:
            m, v = ops.zeros_like(p), ops.zeros_like(p)
        m = lerp(m, g, 1.0 - beta1)
        v = v * beta2 + (1.0 - beta2) * g * g
        new = {"step": step_tensor(step), "exp_avg": m, "exp_avg_sq": v}
        step_size = lr / (1.0 - beta1**step)
        bias_correction2_sqrt = (1.0 - beta2**step) ** 0.5
        if group["amsgrad"]:
            v_max = state.get("max_exp_avg_sq") if state else None
            v = new["max_exp_avg_sq"] = v if v_max is None else ops.maximum(v_max, v)
        eps = group["eps"]
        return Update(
            lambda: step_size * m / (ops.sqrt(v) / bias_correction2_sqrt + eps), new, decay
        )


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter): ``p *= 1 - lr *
    weight_decay`` before the Adam step, which sees the plain gradient; as PyTorch's
    ``AdamW`` (weight_decay 1e-2 by default), which is ``Adam`` with
    ``decoupled_weight_decay=True``."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            foreach=foreach,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=True,
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As ``Optimizer.load_state_dict``; the groups stay decoupled (a state dict
        saved by Adam included)."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True
