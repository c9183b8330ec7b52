"""Reading one batch (or, without batching, one item) for an index from the sampler:
the same in the main process and in worker processes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class MapFetcher:
    """Items of a map-style dataset at the sampler's indices."""

    def __init__(self, dataset: Any, auto_collation: bool, collate_fn: Callable) -> None:
        self.dataset, self.auto_collation, self.collate_fn = dataset, auto_collation, collate_fn

    def fetch(self, index: Any) -> Any:
        if not self.auto_collation:
            return self.collate_fn(self.dataset[index])
        getitems = getattr(self.dataset, "__getitems__", None)
        if callable(getitems):
            data = getitems(index)
        else:
            data = [self.dataset[i] for i in index]
        return self.collate_fn(data)


class IterableFetcher:
    """The next items of an iterable dataset; StopIteration once it has ended (or when
    ``drop_last`` drops its last, short batch)."""

    def __init__(
        self, dataset: Any, auto_collation: bool, collate_fn: Callable, drop_last: bool
    ) -> None:
        self.iterator = iter(dataset)
        self.auto_collation, self.collate_fn, self.drop_last = auto_collation, collate_fn, drop_last
        self.ended = False

    def fetch(self, index: Any) -> Any:
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            try:
                item = next(self.iterator)
            except StopIteration:
                self.ended = True
                raise
            return self.collate_fn(item)
        data = []
        for _ in index:
            try:
                data.append(next(self.iterator))
            except StopIteration:
                self.ended = True
                break
        if not data or (self.drop_last and len(data) < len(index)):
            raise StopIteration
        return self.collate_fn(data)


def make_fetcher(
    dataset: Any, iterable: bool, auto_collation: bool, collate_fn: Callable, drop_last: bool
) -> MapFetcher | IterableFetcher:
    if iterable:
        return IterableFetcher(dataset, auto_collation, collate_fn, drop_last)
    return MapFetcher(dataset, auto_collation, collate_fn)
