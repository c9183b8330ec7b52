"""Datasets, as in PyTorch: map-style ones (``Dataset``: ``__getitem__`` and ``__len__``)
and iterable ones (``IterableDataset``: ``__iter__``), with the ready-made
``TensorDataset``, ``Subset``, ``ConcatDataset`` and ``ChainDataset``, and
``random_split``."""

from __future__ import annotations

import bisect
import itertools
import math
import numbers
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from lamina.dispatch import random as _random
from lamina.dispatch.tensor import Tensor

from .sampler import check_generator, stream

T_co = TypeVar("T_co", covariant=True)


class Dataset(Generic[T_co]):
    """A map-style dataset: subclasses define ``__getitem__(index)`` and, for the
    default samplers of ``DataLoader``, ``__len__``. ``a + b`` is their
    ``ConcatDataset``."""

    def __getitem__(self, index: Any) -> T_co:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __add__(self, other: Dataset[T_co]) -> ConcatDataset[T_co]:
        return ConcatDataset([self, other])


class IterableDataset(Dataset[T_co], Iterable[T_co]):
    """An iterable dataset: subclasses define ``__iter__``. With worker processes, each
    worker iterates over its own copy; ``get_worker_info()`` inside ``__iter__`` tells
    a copy which share of the data is its own. ``a + b`` is their ``ChainDataset``."""

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")

    def __add__(self, other: Dataset[T_co]) -> ChainDataset:  # type: ignore[override]
        return ChainDataset([self, other])


class TensorDataset(Dataset[tuple[Tensor, ...]]):
    """Item ``i`` is ``(t[i] for t in tensors)``: the tensors' first dimensions must be
    equal, the number of items."""

    def __init__(self, *tensors: Tensor) -> None:
        if not tensors:
            raise ValueError("TensorDataset: needs at least one tensor")
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise TypeError(
                    f"TensorDataset: tensors[{i}] must be a lamina tensor, got {type(t).__name__}"
                )
            if t.ndim == 0:
                raise ValueError(
                    f"TensorDataset: tensors[{i}] is 0-dimensional; each tensor needs a first "
                    "dimension that indexes the items"
                )
        sizes = [t.shape[0] for t in tensors]
        if any(s != sizes[0] for s in sizes):
            raise ValueError(
                f"TensorDataset: the tensors' first dimensions must be equal, got sizes {sizes}"
            )
        self.tensors = tensors

    def __getitem__(self, index: Any) -> tuple[Tensor, ...]:
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]


class Subset(Dataset[T_co]):
    """The items of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset: Dataset[T_co], indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx: Any) -> T_co:
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: list[int]) -> list[T_co]:
        # DataLoader reads a whole batch through __getitems__ when the dataset has one
        inner = getattr(self.dataset, "__getitems__", None)
        if callable(inner):
            return inner([self.indices[i] for i in indices])
        return [self.dataset[self.indices[i]] for i in indices]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset[T_co]):
    """The items of several map-style datasets, one after the other."""

    datasets: list[Dataset[T_co]]
    cumulative_sizes: list[int]

    @staticmethod
    def cumsum(sequence: Iterable[Dataset]) -> list[int]:
        return list(itertools.accumulate(len(d) for d in sequence))  # type: ignore[arg-type]

    def __init__(self, datasets: Iterable[Dataset[T_co]]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: datasets is empty, expected at least one dataset")
        for i, d in enumerate(self.datasets):
            if isinstance(d, IterableDataset):
                raise TypeError(
                    f"ConcatDataset: datasets[{i}] is an IterableDataset, which has no "
                    "indexed items; chain iterable datasets with ChainDataset"
                )
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: int) -> T_co:
        n = len(self)
        if idx < 0:
            if -idx > n:
                raise IndexError(f"ConcatDataset: index {idx} is out of range for {n} items")
            idx += n
        if idx >= n:
            raise IndexError(f"ConcatDataset: index {idx} is out of range for {n} items")
        which = bisect.bisect_right(self.cumulative_sizes, idx)
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][idx - start]


class ChainDataset(IterableDataset):
    """The items of several iterable datasets, one after the other."""

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        for i, d in enumerate(self.datasets):
            if not isinstance(d, IterableDataset):
                raise TypeError(
                    f"ChainDataset: datasets[{i}] must be an IterableDataset, "
                    f"got {type(d).__name__}; join map-style datasets with ConcatDataset"
                )

    def __iter__(self) -> Iterator:
        for d in self.datasets:
            yield from d

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)  # type: ignore[arg-type]


def _split_lengths(n: int, lengths: Sequence[float]) -> list[int]:
    """``lengths`` as item counts: ints as given, fractions summing to 1 as PyTorch turns
    them into counts (floor of each share, then one more item to each split in turn
    until the remainder is used up)."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) or not lengths:
        raise TypeError(
            f"random_split: lengths must be a non-empty list of ints or of fractions, "
            f"got {lengths!r}"
        )
    for i, x in enumerate(lengths):
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise TypeError(f"random_split: lengths[{i}] must be a number, got {x!r}")
    total = sum(lengths)
    if math.isclose(total, 1) and total <= 1:
        counts = []
        for i, frac in enumerate(lengths):
            if not 0 <= frac <= 1:
                raise ValueError(
                    f"random_split: the fraction lengths[{i}]={frac} is not between 0 and 1"
                )
            counts.append(math.floor(n * frac))
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        for i, c in enumerate(counts):
            if c == 0:
                warnings.warn(
                    f"random_split: split {i} is empty (lengths={list(lengths)} of {n} items)",
                    stacklevel=3,
                )
        return counts
    for i, x in enumerate(lengths):
        if not isinstance(x, numbers.Integral):
            raise ValueError(
                f"random_split: lengths must be ints, or fractions that sum to 1; "
                f"got lengths[{i}]={x!r} in lengths summing to {total}"
            )
        if x < 0:
            raise ValueError(f"random_split: lengths[{i}] must be non-negative, got {x}")
    if total != n:
        raise ValueError(f"random_split: lengths sum to {total}, but the dataset has {n} items")
    return [int(x) for x in lengths]


def random_split(
    dataset: Dataset[T_co],
    lengths: Sequence[float],
    generator: _random.Generator | None = None,
) -> list[Subset[T_co]]:
    """Split ``dataset`` at random into non-overlapping ``Subset``s of the given
    ``lengths``: item counts summing to ``len(dataset)``, or fractions summing to 1
    (``[0.8, 0.2]``; the items a floor leaves over go one to each split in turn, as
    PyTorch's). The permutation is drawn from ``generator``, else the default stream."""
    check_generator(generator, "random_split")
    counts = _split_lengths(len(dataset), lengths)  # type: ignore[arg-type]
    order = stream(generator).permutation(sum(counts)).tolist()
    return [
        Subset(dataset, order[end - count : end])
        for end, count in zip(itertools.accumulate(counts), counts)
    ]
