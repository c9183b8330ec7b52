"""``lm.random``: random streams. ``Generator`` is a stream of its own (PyTorch's
``torch.Generator``); the default stream behind ``lm.rand``, ``lm.randn``, random
initialization and dropout is reseeded by ``seed`` or ``lm.manual_seed``
(lamina.dispatch.random)."""

from lamina.dispatch.random import Generator, default_generator, generator, manual_seed, seed

__all__ = ["Generator", "default_generator", "generator", "manual_seed", "seed"]
