"""The global random number generator behind ``lm.rand`` and ``lm.randn``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .arguments import checked

if TYPE_CHECKING:
    import numpy as np

# made on first use: importing numpy.random is ~10 ms of ``import lamina``
_generator: np.random.Generator | None = None


@checked
def seed(value: int) -> None:
    """Reseed the generator: the same seed gives the same ``rand``/``randn`` stream."""
    global _generator
    import numpy.random

    _generator = numpy.random.default_rng(value)


def generator() -> np.random.Generator:
    global _generator
    if _generator is None:
        import numpy.random

        _generator = numpy.random.default_rng()
    return _generator
