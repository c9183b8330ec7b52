"""Worker processes of a ``DataLoader``: what each one runs, and how its batches and
errors travel back to the main process."""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from lamina.dispatch import ops
from lamina.dispatch import random as _random
from lamina.dispatch.tensor import Tensor

from .fetch import make_fetcher

# How often (seconds) a waiting worker checks that its parent still runs, and a waiting
# main process that its workers do.
STATUS_INTERVAL = 1.0


class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker process: ``id`` (0 to
    ``num_workers - 1``), ``num_workers``, ``seed`` (the worker's seed of the default
    stream) and ``dataset`` (this worker's copy of the dataset)."""

    id: int
    num_workers: int
    seed: int
    dataset: Any

    def __init__(self, **fields: Any) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"WorkerInfo is read-only: cannot set {name!r}")

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, seed={self.seed})"


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """In a ``DataLoader`` worker process, its ``WorkerInfo``; None in the main process.
    An ``IterableDataset``'s ``__iter__`` reads it to take its own share of the data."""
    return _worker_info


class _KeyErrorMessage(str):
    """A message that KeyError shows as written (it shows repr() of its argument)."""

    def __repr__(self) -> str:
        return str(self)


class ExceptionWrapper:
    """An exception raised in a worker, sent as its type and traceback text."""

    def __init__(self, where: str) -> None:
        exc_type, exc, tb = sys.exc_info()
        self.exc_type = exc_type
        self.where = where
        self.text = "".join(traceback.format_exception(exc_type, exc, tb))

    def reraise(self) -> None:
        msg = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.text}"
        if self.exc_type is KeyError:
            msg = _KeyErrorMessage(msg)
        try:
            exception = self.exc_type(msg)
        except Exception:
            # an exception type that cannot be built from a message alone
            raise RuntimeError(msg) from None
        raise exception


class WorkerEnded:
    """A worker's iterable dataset has no more items."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id


class Resume:
    """A new pass over the data begins (persistent workers): restart the dataset's
    iteration."""


class _Array:
    """A tensor's data on its way from a worker: a NumPy array travels by plain pickle,
    whatever a tensor's own pickling does; the main process makes it a tensor again."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple:
        return (_Array, (self.array,))


def pack(obj: Any) -> Any:
    """``obj`` with its tensors, in lists, tuples, namedtuples and dicts, as ``_Array``."""
    if isinstance(obj, Tensor):
        try:
            return _Array(obj.detach().numpy())
        except Exception:
            return obj  # a tensor without a dense array (sparse): its own pickling
    kind = type(obj)
    if kind is list:
        return [pack(x) for x in obj]
    if kind is tuple:
        return tuple(pack(x) for x in obj)
    if kind is dict:
        return {k: pack(v) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return kind(*(pack(x) for x in obj))
    return obj


def unpack(obj: Any) -> Any:
    """The inverse of ``pack``."""
    kind = type(obj)
    if kind is _Array:
        return ops.asarray(obj.array)
    if kind is list:
        return [unpack(x) for x in obj]
    if kind is tuple:
        return tuple(unpack(x) for x in obj)
    if kind is dict:
        return {k: unpack(v) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return kind(*(unpack(x) for x in obj))
    return obj


def _seed_worker(seed: int, base_seed: int, worker_id: int) -> None:
    """Seed the worker's random streams: lamina's default one and Python's with
    ``seed``; NumPy's global one too, since every forked worker would otherwise repeat
    the parent's ``np.random`` numbers."""
    import random  # only workers need it

    _random.manual_seed(seed)
    random.seed(seed)
    np.random.seed(np.random.SeedSequence([worker_id, base_seed]).generate_state(4))


def _parent_alive(parent: int) -> bool:
    return os.getppid() == parent


def worker_loop(
    dataset: Any,
    iterable: bool,
    index_queue: Any,
    result_queue: Any,
    done_event: Any,
    auto_collation: bool,
    collate_fn: Callable,
    drop_last: bool,
    base_seed: int,
    init_fn: Callable[[int], None] | None,
    worker_id: int,
    num_workers: int,
    parent: int,
) -> None:
    """Take (epoch, task number, index) from ``index_queue`` until None comes, put
    (epoch, task number, pickled batch, error or WorkerEnded) on ``result_queue``."""
    global _worker_info
    import queue

    where = f"in DataLoader worker process {worker_id}"
    interrupted = False
    try:
        seed = base_seed + worker_id
        _seed_worker(seed, base_seed, worker_id)
        _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
        init_error = None
        fetcher = None
        try:
            if init_fn is not None:
                init_fn(worker_id)
            fetcher = make_fetcher(dataset, iterable, auto_collation, collate_fn, drop_last)
        except Exception:
            init_error = ExceptionWrapper(where)
        ended = False  # the iterable dataset has run out (until a Resume)
        while _parent_alive(parent):
            try:
                task = index_queue.get(timeout=STATUS_INTERVAL)
            except queue.Empty:
                if done_event.is_set():
                    break  # the loader is gone without a word (Note [Worker pools])
                continue
            if task is None:
                break
            if isinstance(task, Resume):
                ended = False
                if init_error is None:
                    try:
                        fetcher = make_fetcher(
                            dataset, iterable, auto_collation, collate_fn, drop_last
                        )
                    except Exception:
                        init_error = ExceptionWrapper(where)
                continue
            if done_event.is_set() or ended:
                continue  # the tasks left over once the loader is closing, or ended
            task_epoch, number, index = task
            if init_error is not None:
                result: Any = init_error
            else:
                try:
                    result = pack(fetcher.fetch(index))
                except StopIteration:
                    if iterable:
                        ended = True
                        result = WorkerEnded(worker_id)
                    else:
                        result = ExceptionWrapper(where)
                except Exception:
                    result = ExceptionWrapper(where)
            try:
                # pickled here, not in the queue's feeder thread, where a failure
                # would only be printed and the main process would wait for ever
                payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:
                payload = pickle.dumps(ExceptionWrapper(where + " (sending its batch)"))
            result_queue.put((task_epoch, number, payload))
            del result, payload
    except KeyboardInterrupt:
        interrupted = True  # the main process has its own interrupt and reads no more
    if interrupted or done_event.is_set() or not _parent_alive(parent):
        # nobody reads the results any more: exit without waiting for the queue to drain
        # (otherwise the batches put last must reach the main process before the exit)
        result_queue.cancel_join_thread()
        result_queue.close()
