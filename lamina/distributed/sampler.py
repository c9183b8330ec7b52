"""DistributedSampler: each rank's share of a dataset's indices."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

import numpy as np

from lamina.utils.data.sampler import Sampler

from .collectives import get_rank, get_world_size


class DistributedSampler(Sampler[int]):
    """The indices of ``dataset`` that rank ``rank`` of ``num_replicas`` reads (default:
    this process's rank and the world size), as PyTorch's: every rank draws the same
    permutation (seeded by ``seed + epoch``, so call ``set_epoch(epoch)`` at the start
    of every epoch to reshuffle) and takes every ``num_replicas``-th index from its rank
    on. When the dataset does not split evenly, the ranks either get the first indices
    again to fill their last share (``drop_last=False``) or leave the last ones out
    (``drop_last=True``): every rank gets the same number of indices, so that every
    rank makes the same number of steps."""

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_replicas is None:
            num_replicas = get_world_size()
        if rank is None:
            rank = get_rank()
        for name, value in (("num_replicas", num_replicas), ("rank", rank), ("seed", seed)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"DistributedSampler: {name} must be an int, got {value!r}")
        if num_replicas < 1:
            raise ValueError(
                f"DistributedSampler: num_replicas must be at least 1, got {num_replicas}"
            )
        if not 0 <= rank < num_replicas:
            raise ValueError(
                f"DistributedSampler: rank must be from 0 to {num_replicas - 1}, got {rank}"
            )
        self.dataset = dataset
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    @property
    def num_samples(self) -> int:
        n = len(self.dataset)
        if self.drop_last:
            return n // self.num_replicas
        return math.ceil(n / self.num_replicas)

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose permutation ``__iter__`` gives (the same on every rank)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        if self.shuffle:
            indices = np.random.default_rng(self.seed + self.epoch).permutation(n)
        else:
            indices = np.arange(n)
        total = self.num_samples * self.num_replicas
        if total > n:  # padded with the first indices, as often as needed
            indices = np.resize(indices, total)
        return iter(indices[self.rank : total : self.num_replicas].tolist())

    def __len__(self) -> int:
        return self.num_samples
