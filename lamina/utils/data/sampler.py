"""Samplers: what order a ``DataLoader`` reads a dataset's items in. Each is an iterable
of indices (``BatchSampler``: of lists of indices), as in PyTorch.

Random samplers draw from a ``lamina.random.Generator`` when given one, else from the
default stream (``lm.manual_seed``), so a seed makes their order the same in every run.
The orders are lamina's own: the same seed does not give PyTorch's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any, Generic, TypeVar

import numpy as np

from lamina.dispatch import ops
from lamina.dispatch import random as _random
from lamina.dispatch.tensor import Tensor

T_co = TypeVar("T_co", covariant=True)


def check_generator(gen: Any, fn: str) -> None:
    if gen is not None and not isinstance(gen, _random.Generator):
        raise TypeError(
            f"{fn}: generator must be a lamina.random.Generator or None, got {type(gen).__name__}"
        )


def stream(gen: _random.Generator | None) -> np.random.Generator:
    """The NumPy generator behind ``gen``, or the default stream's."""
    return _random.generator(gen)


def draw_seed(gen: _random.Generator | None) -> int:
    """One seed in [0, 2**63) from ``gen`` or the default stream (PyTorch draws one
    int64 the same way for a fresh sampler stream and for the workers' base seed)."""
    return int(stream(gen).integers(1 << 63, dtype=np.uint64))


def is_positive_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0


class Sampler(Generic[T_co]):
    """The base of samplers: subclasses define ``__iter__`` (the indices) and, when the
    number of indices is known, ``__len__``."""

    def __init__(self, data_source: Sized | None = None) -> None:
        pass  # PyTorch's samplers accept and ignore it too

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class SequentialSampler(Sampler[int]):
    """The indices 0, 1, ..., len(data_source) - 1, in order."""

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler[int]):
    """The indices of ``data_source`` in a random order: a permutation, repeated and cut
    to ``num_samples`` (default ``len(data_source)``); with ``replacement=True``,
    ``num_samples`` independent uniform draws. Without ``generator``, each pass over the
    sampler starts a stream of its own from a seed drawn from the default stream."""

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: _random.Generator | None = None,
    ) -> None:
        if not isinstance(replacement, bool):
            raise TypeError(f"RandomSampler: replacement must be a bool, got {replacement!r}")
        if num_samples is not None and not is_positive_int(num_samples):
            raise ValueError(
                f"RandomSampler: num_samples must be a positive int or None, got {num_samples!r}"
            )
        check_generator(generator, "RandomSampler")
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = None if num_samples is None else int(num_samples)
        self.generator = generator
        if num_samples is None and len(data_source) == 0:
            raise ValueError("RandomSampler: data_source is empty, there is nothing to sample")

    @property
    def num_samples(self) -> int:
        # the dataset may grow or shrink after the sampler is made, as in PyTorch
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        if n == 0:
            raise ValueError("RandomSampler: data_source is empty, there is nothing to sample")
        if self.generator is None:
            rng = _random.Generator().manual_seed(draw_seed(None)).numpy
        else:
            rng = stream(self.generator)
        count = self.num_samples
        if self.replacement:
            yield from rng.integers(n, size=count).tolist()
            return
        for _ in range(count // n):
            yield from rng.permutation(n).tolist()
        if count % n:
            yield from rng.permutation(n)[: count % n].tolist()

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler[int]):
    """The given ``indices`` in a random order, each once."""

    def __init__(self, indices: Sequence[int], generator: _random.Generator | None = None) -> None:
        check_generator(generator, "SubsetRandomSampler")
        self.indices = indices
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        for i in stream(self.generator).permutation(len(self.indices)).tolist():
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler[int]):
    """``num_samples`` indices in ``[0, len(weights))``, index ``i`` drawn with
    probability ``weights[i] / sum(weights)`` (the weights need not sum to 1); without
    replacement, each index at most once."""

    def __init__(
        self,
        weights: Sequence[float] | Tensor | np.ndarray,
        num_samples: int,
        replacement: bool = True,
        generator: _random.Generator | None = None,
    ) -> None:
        if not is_positive_int(num_samples):
            raise ValueError(
                f"WeightedRandomSampler: num_samples must be a positive int, got {num_samples!r}"
            )
        if not isinstance(replacement, bool):
            raise TypeError(
                f"WeightedRandomSampler: replacement must be a bool, got {replacement!r}"
            )
        check_generator(generator, "WeightedRandomSampler")
        w = weights.numpy() if isinstance(weights, Tensor) else weights
        try:
            w = np.asarray(w, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(
                f"WeightedRandomSampler: weights must be a sequence of numbers, got {weights!r}"
            ) from None
        if w.ndim != 1:
            raise ValueError(
                f"WeightedRandomSampler: weights must be one-dimensional, got shape {w.shape}"
            )
        if not np.isfinite(w).all() or (w < 0).any():
            raise ValueError("WeightedRandomSampler: weights must be finite and non-negative")
        nonzero = int(np.count_nonzero(w))
        if nonzero == 0:
            raise ValueError("WeightedRandomSampler: weights must not all be zero")
        if not replacement and num_samples > nonzero:
            raise ValueError(
                f"WeightedRandomSampler: cannot draw num_samples={num_samples} indices without "
                f"replacement from {nonzero} non-zero weights"
            )
        self.weights = ops.asarray(w)  # a float64 tensor, as PyTorch's
        self._p = w / w.sum()
        self.num_samples = int(num_samples)
        self.replacement = replacement
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        rng = stream(self.generator)
        drawn = rng.choice(len(self._p), self.num_samples, replace=self.replacement, p=self._p)
        yield from drawn.tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler[list[int]]):
    """Groups the indices of ``sampler`` into lists of ``batch_size``; the last, shorter
    list is kept unless ``drop_last``."""

    def __init__(self, sampler: Sampler[int] | Iterable[int], batch_size: int, drop_last: bool):
        if not is_positive_int(batch_size):
            raise ValueError(f"BatchSampler: batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(drop_last, bool):
            raise TypeError(f"BatchSampler: drop_last must be a bool, got {drop_last!r}")
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]
        if self.drop_last:
            return n // self.batch_size
        return (n + self.batch_size - 1) // self.batch_size


class InfiniteConstantSampler(Sampler[None]):
    """None forever: the indices of an iterable dataset, which ignores them."""

    def __iter__(self) -> Iterator[None]:
        while True:
            yield None
