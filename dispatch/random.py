"""Random streams: ``Generator`` (PyTorch's ``torch.Generator``) and the default one
behind ``lm.rand``, ``lm.randn``, random initialization and dropout.

A ``Generator`` wraps a NumPy ``Generator`` (PCG64); random operators take that NumPy
generator as an argument, so a stream is always an explicit input of the operator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .arguments import checked

if TYPE_CHECKING:
    import numpy as np


class Generator:
    """A random stream of its own: ``Generator().manual_seed(0)`` gives the same
    numbers in every run, independently of the default stream (``lm.manual_seed``).
    Pass it as ``generator=`` to ``lm.rand``, ``lm.randn``, ``lm.randint``,
    ``lm.randperm`` and ``DataLoader``."""

    def __init__(self, device: Any = "cpu") -> None:
        if str(device) != "cpu":
            raise ValueError(f"Generator: only the CPU has random streams, got device={device!r}")
        self._seed: int | None = None  # drawn from the OS on first use
        self._rng: np.random.Generator | None = None  # made on first use (Note below)

    @checked
    def manual_seed(self, seed: int) -> Generator:
        """Restart the stream from ``seed``; returns the generator itself, as PyTorch's."""
        import numpy.random  # Note [Lazy numpy.random]

        if seed < 0:
            seed &= (1 << 64) - 1  # PyTorch wraps negative seeds to 64 bits as well
        self._seed = seed
        fresh = numpy.random.default_rng(seed)
        if self._rng is None:
            self._rng = fresh
        else:  # restarted in place: a compiled graph holds this NumPy generator (lm.jit)
            self._rng.bit_generator.state = fresh.bit_generator.state
        return self

    def seed(self) -> int:
        """Restart the stream from a fresh seed taken from the OS; returns that seed."""
        import numpy.random

        return self.manual_seed(int(numpy.random.SeedSequence().entropy) & ((1 << 63) - 1))._seed

    def initial_seed(self) -> int:
        """The seed the stream last started from."""
        if self._seed is None:
            self.seed()
        return self._seed

    def get_state(self) -> dict:
        """The stream's state (a plain dict; ``set_state`` restores it)."""
        return {"seed": self.initial_seed(), "bit_generator": self.numpy.bit_generator.state}

    def set_state(self, state: dict) -> None:
        if not isinstance(state, dict) or set(state) != {"seed", "bit_generator"}:
            raise ValueError("Generator.set_state: expected a state from Generator.get_state()")
        self.manual_seed(state["seed"])
        self.numpy.bit_generator.state = state["bit_generator"]

    @property
    def numpy(self) -> np.random.Generator:
        """The NumPy generator that random operators draw from."""
        if self._rng is None:
            self.seed()
        return self._rng

    @property
    def device(self) -> str:
        return "cpu"

    def __repr__(self) -> str:
        return f"<lamina.Generator seed={self._seed}>"


# Note [Lazy numpy.random]: importing numpy.random costs ~10 ms of ``import lamina``, so
# no stream exists until a program first draws from one.
default_generator = Generator()


@checked
def seed(value: int) -> None:
    """Reseed the default stream: the same seed gives the same ``rand``/``randn`` stream."""
    default_generator.manual_seed(value)


@checked
def manual_seed(seed: int) -> Generator:
    """PyTorch's ``torch.manual_seed``: reseed the default stream; returns its Generator."""
    return default_generator.manual_seed(seed)


def generator(gen: Generator | None = None) -> np.random.Generator:
    """The NumPy generator of ``gen``, or of the default stream."""
    if gen is None:
        return default_generator.numpy
    if not isinstance(gen, Generator):
        raise TypeError(f"generator must be a lamina.Generator, got {type(gen).__name__}")
    return gen.numpy
