"""``lm.random``: the generator behind ``lm.rand``, ``lm.randn`` and random
initialization; ``seed`` makes them reproducible (lamina.dispatch.random)."""

from lamina.dispatch.random import generator, seed

__all__ = ["generator", "seed"]
