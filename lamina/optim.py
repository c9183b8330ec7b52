"""Optimizers. ``SGD`` with momentum and weight decay (PyTorch's update rule)."""

from lamina.autograd import no_grad
from lamina.dispatch.arguments import checked


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
