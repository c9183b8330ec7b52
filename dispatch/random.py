"""The global random number generator behind ``lm.rand`` and ``lm.randn``."""

import numpy as np

from .arguments import checked

_generator = np.random.default_rng()


@checked
def seed(value: int) -> None:
    """Reseed the generator: the same seed gives the same ``rand``/``randn`` stream."""
    global _generator
    _generator = np.random.default_rng(value)


def generator() -> np.random.Generator:
    return _generator
