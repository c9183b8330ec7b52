"""Optimizers, with PyTorch's update rules: ``SGD`` with momentum and weight decay,
``Adam`` and ``AdamW``."""

import math

from lamina.autograd import no_grad
from lamina.dispatch.arguments import checked
from lamina.dispatch.ops import maximum, sqrt


class SGD:
    """Stochastic gradient descent: ``p -= lr * (g + weight_decay * p)``, with momentum
    ``buf = momentum * buf + g`` (``nesterov`` uses ``g + momentum * buf``)."""

    @checked
    def __init__(
        self,
        params,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        self.params = list(params)
        if lr <= 0:
            raise ValueError(f"SGD: lr must be positive, got {lr}")
        if momentum < 0 or weight_decay < 0:
            raise ValueError("SGD: momentum and weight_decay must be non-negative")
        if nesterov and momentum == 0:
            raise ValueError("SGD: nesterov needs momentum > 0")
        for p in self.params:
            if not p.requires_grad:
                raise ValueError(f"SGD: a parameter of shape {p.shape} does not require grad")
        self.lr, self.momentum, self.weight_decay, self.nesterov = (
            lr,
            momentum,
            weight_decay,
            nesterov,
        )
        self.buffers = [None] * len(self.params)

    @no_grad()
    def step(self):
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                continue
            if self.weight_decay:
                g = g + self.weight_decay * p
            if self.momentum:
                buf = self.buffers[i]
                buf = g if buf is None else self.momentum * buf + g
                self.buffers[i] = buf
                g = g + self.momentum * buf if self.nesterov else buf
            p -= self.lr * g

    def zero_grad(self):
        for p in self.params:
            p.grad = None


class Adam:
    """Adam (Kingma and Ba), PyTorch's update: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2)
    g**2, p -= lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps); weight_decay
    adds weight_decay * p to g (L2), amsgrad uses the running maximum of v."""

    decoupled = False  # AdamW: weight decay applied to the parameter, not the gradient

    @checked
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
    ):
        self.params = list(params)
        name = type(self).__name__
        if lr <= 0:
            raise ValueError(f"{name}: lr must be positive, got {lr}")
        if (
            not isinstance(betas, (tuple, list))
            or len(betas) != 2
            or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas)
        ):
            raise ValueError(f"{name}: betas must be two numbers in [0, 1), got {betas}")
        if eps < 0 or weight_decay < 0:
            raise ValueError(f"{name}: eps and weight_decay must be non-negative")
        for p in self.params:
            if not p.requires_grad:
                raise ValueError(f"{name}: a parameter of shape {p.shape} does not require grad")
        self.lr, self.betas, self.eps = lr, tuple(betas), eps
        self.weight_decay, self.amsgrad = weight_decay, amsgrad
        self.state = [{} for _ in self.params]  # per parameter: step, m, v (, v_max)

    @no_grad()
    def step(self):
        b1, b2 = self.betas
        for p, state in zip(self.params, self.state):
            g = p.grad
            if g is None:
                continue
            if self.weight_decay:
                if self.decoupled:
                    p *= 1.0 - self.lr * self.weight_decay
                else:
                    g = g + self.weight_decay * p
            t = state["step"] = state.get("step", 0) + 1
            m = state["m"] = g * (1.0 - b1) if t == 1 else state["m"] * b1 + g * (1.0 - b1)
            v = state["v"] = g * g * (1.0 - b2) if t == 1 else state["v"] * b2 + g * g * (1.0 - b2)
            if self.amsgrad:
                v = state["v_max"] = v if t == 1 else maximum(state["v_max"], v)
            denom = sqrt(v) * (1.0 / math.sqrt(1.0 - b2**t)) + self.eps
            p -= m / denom * (self.lr / (1.0 - b1**t))

    def zero_grad(self):
        for p in self.params:
            p.grad = None


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter): p *= 1 - lr *
    weight_decay before the Adam step, which then sees the plain gradient."""

    decoupled = True

    @checked
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
    ):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad)
