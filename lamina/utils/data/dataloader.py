"""``DataLoader``: batches of a dataset, read in the main process or in worker
processes, with PyTorch's arguments and semantics."""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from lamina.dispatch import random as _random

from . import worker as _worker
from .collate import default_collate, default_convert
from .dataset import Dataset, IterableDataset
from .fetch import make_fetcher
from .sampler import (
    BatchSampler,
    InfiniteConstantSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    check_generator,
    draw_seed,
    is_positive_int,
)
from .worker import get_worker_info

__all__ = ["DataLoader", "default_collate", "default_convert", "get_worker_info"]

T_co = TypeVar("T_co", covariant=True)

# seconds a closing loader waits for a worker to finish the item it is reading before
# it stops the worker
_JOIN_TIMEOUT = 5.0


def _is_iterable(obj: Any) -> bool:
    return hasattr(obj, "__iter__")


def _check_flag(value: Any, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"DataLoader: {name} must be a bool, got {value!r}")


def _check_callable(value: Any, name: str) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"DataLoader: {name} must be callable or None, got {value!r}")


# Note [Lazy multiprocessing]: multiprocessing (with queue, random, ...) costs ~5 ms of
# ``import lamina``; it is imported when a loader first needs worker processes.


def _context(value: Any, num_workers: int) -> Any:
    """The multiprocessing context the workers start in (None: the default one)."""
    if value is None:
        return None
    import multiprocessing  # Note [Lazy multiprocessing]

    if num_workers == 0:
        raise ValueError(
            "DataLoader: multiprocessing_context needs worker processes (num_workers > 0), "
            "got num_workers=0"
        )
    if isinstance(value, str):
        methods = multiprocessing.get_all_start_methods()
        if value not in methods:
            raise ValueError(
                f"DataLoader: multiprocessing_context must be one of {methods} or a "
                f"multiprocessing context, got {value!r}"
            )
        return multiprocessing.get_context(value)
    if not isinstance(value, multiprocessing.context.BaseContext):
        raise TypeError(
            "DataLoader: multiprocessing_context must be a start method name or a "
            f"multiprocessing context, got {value!r}"
        )
    return value


def _default_context() -> Any:
    import multiprocessing  # Note [Lazy multiprocessing]

    # fork starts a worker in milliseconds and needs no picklable dataset or functions;
    # macOS's system libraries are not fork-safe, so there the platform's default holds
    if "fork" in multiprocessing.get_all_start_methods() and sys.platform != "darwin":
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


class DataLoader(Generic[T_co]):
    """Batches of ``dataset``, as PyTorch's ``DataLoader``.

    ``batch_size`` items are read per batch (None: items one by one, unbatched),
    in order or, with ``shuffle=True``, in a random order drawn from ``generator`` (else
    from the default stream, ``lm.manual_seed``) anew for each pass; ``sampler`` (an
    iterable of indices) or ``batch_sampler`` (of lists of indices) choose the order
    instead. ``collate_fn`` makes a batch of a list of items (``default_collate``: tensors
    stacked, numbers made tensors, containers collated field by field); ``drop_last``
    drops a last, short batch. An ``IterableDataset`` gives its items in its own order
    (no shuffle or samplers).

    ``num_workers > 0`` reads batches in that many worker processes, which return them
    in order. They start by 'fork' where the platform has it (macOS aside, whose default
    holds); ``multiprocessing_context`` chooses another start method, for which the
    dataset and the functions must be picklable. Worker ``i``'s default stream (and
    Python's ``random``) is seeded with ``base_seed + i``, ``base_seed`` drawn from
    ``generator`` or the default stream once per pass (once in all, with persistent
    workers), and ``worker_init_fn(i)`` runs first. An exception in a worker is raised again in the
    main process with the worker's id and traceback; ``timeout > 0`` bounds the wait for
    a batch. ``prefetch_factor`` batches per worker are requested ahead (2 by default);
    ``persistent_workers`` keeps the workers from one pass to the next.

    ``pin_memory`` and ``pin_memory_device`` are accepted and do nothing: pinned memory
    speeds copies to a GPU, and lamina's tensors stay in CPU memory. ``in_order`` is
    accepted too; batches always come in order.
    """

    dataset: Dataset[T_co]
    batch_size: int | None
    num_workers: int
    drop_last: bool
    timeout: float
    sampler: Sampler | Iterable
    prefetch_factor: int | None
    _initialized = False

    def __init__(
        self,
        dataset: Dataset[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler | Iterable | None = None,
        batch_sampler: Sampler[list] | Iterable[list] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: _random.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        iterable = isinstance(dataset, IterableDataset)
        if not iterable and not hasattr(dataset, "__getitem__"):
            raise TypeError(
                "DataLoader: dataset must be a map-style dataset (with __getitem__) or an "
                f"IterableDataset, got {type(dataset).__name__}"
            )
        if batch_size is not None and not is_positive_int(batch_size):
            raise ValueError(
                f"DataLoader: batch_size must be a positive int or None, got {batch_size!r}"
            )
        if shuffle is not None:
            _check_flag(shuffle, "shuffle")
        for value, name in (
            (drop_last, "drop_last"),
            (pin_memory, "pin_memory"),
            (persistent_workers, "persistent_workers"),
            (in_order, "in_order"),
        ):
            _check_flag(value, name)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(
                f"DataLoader: num_workers must be a non-negative int (0 reads in the main "
                f"process), got {num_workers!r}"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError(
                f"DataLoader: timeout must be a non-negative number of seconds, got {timeout!r}"
            )
        _check_callable(collate_fn, "collate_fn")
        _check_callable(worker_init_fn, "worker_init_fn")
        check_generator(generator, "DataLoader")
        if prefetch_factor is not None:
            if num_workers == 0:
                raise ValueError(
                    "DataLoader: prefetch_factor needs worker processes (num_workers > 0), "
                    f"got prefetch_factor={prefetch_factor!r} with num_workers=0"
                )
            if not is_positive_int(prefetch_factor):
                raise ValueError(
                    f"DataLoader: prefetch_factor must be a positive int, got {prefetch_factor!r}"
                )
        elif num_workers > 0:
            prefetch_factor = 2
        if persistent_workers and num_workers == 0:
            raise ValueError("DataLoader: persistent_workers needs num_workers > 0")
        for value, name in ((sampler, "sampler"), (batch_sampler, "batch_sampler")):
            if value is not None and not _is_iterable(value):
                raise TypeError(
                    f"DataLoader: {name} must be an iterable of indices, got {type(value).__name__}"
                )

        if iterable:
            # an iterable dataset chooses its own order: it has no indices to sample
            if shuffle:
                raise ValueError(
                    "DataLoader: shuffle=True cannot be used with an IterableDataset, which "
                    "gives its items in its own order; shuffle inside its __iter__ instead"
                )
            if sampler is not None:
                raise ValueError(
                    "DataLoader: sampler cannot be used with an IterableDataset, which has no "
                    f"indices to sample; got sampler={sampler!r}"
                )
            if batch_sampler is not None:
                raise ValueError(
                    "DataLoader: batch_sampler cannot be used with an IterableDataset, which "
                    f"has no indices to sample; got batch_sampler={batch_sampler!r}"
                )
        shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError(
                "DataLoader: sampler and shuffle=True exclude each other (the sampler chooses "
                "the order); shuffle in the sampler instead, e.g. RandomSampler"
            )
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "DataLoader: batch_sampler excludes batch_size, shuffle, sampler and "
                    "drop_last (the batch sampler chooses the batches); got "
                    f"batch_size={batch_size!r}, shuffle={shuffle}, "
                    f"sampler={sampler!r}, drop_last={drop_last}"
                )
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError(
                "DataLoader: drop_last=True needs batches, but batch_size=None reads items "
                "one by one"
            )

        if sampler is None:
            if iterable:
                sampler = InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)  # type: ignore[arg-type]
            else:
                sampler = SequentialSampler(dataset)  # type: ignore[arg-type]
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = _context(multiprocessing_context, num_workers)
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.in_order = in_order
        if collate_fn is None:
            collate_fn = default_collate if batch_sampler is not None else default_convert
        self.collate_fn = collate_fn
        self._iterable = iterable
        self._iterator: _MultiProcessIter | None = None
        self._initialized = True

    def __setattr__(self, name: str, value: Any) -> None:
        # the samplers are built from these: changing one alone would leave them stale
        if self._initialized and name in (
            "batch_size",
            "batch_sampler",
            "sampler",
            "drop_last",
            "dataset",
            "persistent_workers",
        ):
            raise ValueError(
                f"DataLoader: {name} cannot be set after the DataLoader is made; "
                "make a new DataLoader"
            )
        super().__setattr__(name, value)

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Iterable:
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers == 0:
            return _SingleProcessIter(self)
        if not self.persistent_workers:
            return _MultiProcessIter(self)
        if self._iterator is None or self._iterator._closed:
            self._iterator = _MultiProcessIter(self)
        else:
            self._iterator.reset(self)
        return self._iterator

    def __len__(self) -> int:
        """The number of batches (of items, with ``batch_size=None``) in one pass. For
        an iterable dataset it is computed from ``len(dataset)``; with worker processes,
        each worker's copy gives its own items, so it counts right only if the dataset
        splits its items between the copies (``get_worker_info``)."""
        return _length(
            self.dataset, self._iterable, self.batch_size, self.drop_last, self._index_sampler
        )


def _length(
    dataset: Any, iterable: bool, batch_size: int | None, drop_last: bool, index_sampler: Any
) -> int:
    if not iterable:
        return len(index_sampler)
    n = len(dataset)
    if batch_size is None:
        return n
    if drop_last:
        return n // batch_size
    return (n + batch_size - 1) // batch_size


class _BaseIter:
    # no reference to the loader: a persistent loader holds its iterator, and the
    # workers must not wait for the garbage collector's cycle pass to be stopped
    def __init__(self, loader: DataLoader) -> None:
        self._index_sampler = loader._index_sampler
        self._length_of = (
            loader.dataset,
            loader._iterable,
            loader.batch_size,
            loader.drop_last,
            self._index_sampler,
        )
        self._sampler_iter = iter(self._index_sampler)
        # drawn in every pass, with workers or without, so that the stream the shuffle
        # order comes from is at the same place either way
        self._base_seed = draw_seed(loader.generator)

    def __iter__(self) -> _BaseIter:
        return self

    def __len__(self) -> int:
        return _length(*self._length_of)


class _SingleProcessIter(_BaseIter):
    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._fetcher = make_fetcher(
            loader.dataset,
            loader._iterable,
            loader._auto_collation,
            loader.collate_fn,
            loader.drop_last,
        )

    def __next__(self) -> Any:
        index = next(self._sampler_iter)
        return self._fetcher.fetch(index)


def _exit_description(code: int | None) -> str:
    import signal

    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# Note [Worker pools]: the pools whose workers run are kept here until they are shut
# down. An iterator dropped in a reference cycle (one kept by a traceback, say) is
# freed by the garbage collector, which runs the queues' own finalizers (closing them)
# before the iterator's __del__; a pool reachable from here keeps its queues open, so
# __del__ can still tell the workers to exit.
_POOLS: set[_WorkerPool] = set()


class _WorkerPool:
    """A loader's worker processes and the queues to and from them."""

    def __init__(self, loader: DataLoader, base_seed: int) -> None:
        ctx = loader.multiprocessing_context or _default_context()
        self.result_queue = ctx.Queue()
        self.done_event = ctx.Event()
        self.index_queues: list[Any] = []
        self.processes: list[Any] = []
        self.closed = False
        _POOLS.add(self)
        try:
            self._start(ctx, loader, base_seed)
        except BaseException:
            self.shutdown(wait=False)
            raise

    def _start(self, ctx: Any, loader: DataLoader, base_seed: int) -> None:
        parent = os.getpid()
        for worker_id in range(loader.num_workers):
            index_queue = ctx.Queue()
            # a dead worker never reads its queue: exiting must not wait to flush it
            index_queue.cancel_join_thread()
            process = ctx.Process(
                target=_worker.worker_loop,
                args=(
                    loader.dataset,
                    loader._iterable,
                    index_queue,
                    self.result_queue,
                    self.done_event,
                    loader._auto_collation,
                    loader.collate_fn,
                    loader.drop_last,
                    base_seed,
                    loader.worker_init_fn,
                    worker_id,
                    loader.num_workers,
                    parent,
                ),
                daemon=True,
            )
            self.index_queues.append(index_queue)
            self.processes.append(process)
            process.start()

    def shutdown(self, wait: bool = True) -> None:
        """Stop the workers: each finishes the item it reads (``wait``, at most
        ``_JOIN_TIMEOUT`` seconds) or is stopped at once."""
        if self.closed:
            return
        self.closed = True
        self.done_event.set()
        for index_queue in self.index_queues:
            with contextlib.suppress(OSError, ValueError):  # already closed
                index_queue.put(None)
        for process in self.processes:
            if process.pid is None:
                continue  # never started
            process.join(timeout=_JOIN_TIMEOUT if wait else 0.1)
            if process.is_alive():
                process.terminate()
                process.join()
        for index_queue in self.index_queues:
            index_queue.close()
        self.result_queue.cancel_join_thread()
        self.result_queue.close()
        _POOLS.discard(self)


class _MultiProcessIter(_BaseIter):
    """Hands the sampler's indices to the workers in turn, ``prefetch_factor`` tasks per
    worker ahead, and gives their batches back in the sampler's order."""

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._num_workers = loader.num_workers
        self._timeout = loader.timeout
        # prefetch_factor is None if num_workers was set after the loader was made
        self._prefetch = (loader.prefetch_factor or 2) * loader.num_workers
        self._persistent = loader.persistent_workers
        self._pool: _WorkerPool | None = None  # for __del__ if starting the pool fails
        self._pool = _WorkerPool(loader, self._base_seed)
        self._epoch = 0
        self._start_pass()

    @property
    def _closed(self) -> bool:
        return self._pool is None or self._pool.closed

    def _start_pass(self) -> None:
        self._send_idx = 0  # the next task's number
        self._rcvd_idx = 0  # the number of the next batch to return
        self._tasks: dict[int, list[Any]] = {}  # number -> [worker id] (+ [result])
        self._active = [True] * self._num_workers  # False: its iterable dataset ended
        self._worker_cycle = itertools.cycle(range(self._num_workers))
        for _ in range(self._prefetch):
            self._put_index()

    def reset(self, loader: DataLoader) -> None:
        """A new pass with the same (persistent) workers."""
        self._sampler_iter = iter(self._index_sampler)
        self._epoch += 1  # results of the earlier pass still on their way are dropped
        for index_queue in self._pool.index_queues:
            index_queue.put(_worker.Resume())
        self._start_pass()

    def _put_index(self) -> None:
        for _ in range(self._num_workers):
            worker_id = next(self._worker_cycle)
            if self._active[worker_id]:
                break
        else:
            return  # every worker's iterable dataset has ended
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            return
        self._pool.index_queues[worker_id].put((self._epoch, self._send_idx, index))
        self._tasks[self._send_idx] = [worker_id]
        self._send_idx += 1

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        while True:
            # skip the tasks of workers whose iterable dataset ended: they never answer
            while self._rcvd_idx < self._send_idx:
                task = self._tasks[self._rcvd_idx]
                if len(task) == 2 or self._active[task[0]]:
                    break
                del self._tasks[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent:
                    self._pool.shutdown()
                raise StopIteration
            task = self._tasks[self._rcvd_idx]
            if len(task) == 2:
                del self._tasks[self._rcvd_idx]
                self._rcvd_idx += 1
                return self._process(task[1])
            epoch, number, result = self._get()
            if epoch != self._epoch:
                continue
            if isinstance(result, _worker.WorkerEnded):
                self._worker_ended(result.worker_id)
                self._put_index()
                continue
            if number == self._rcvd_idx:
                del self._tasks[number]
                self._rcvd_idx += 1
                return self._process(result)
            self._tasks[number].append(result)

    def _process(self, result: Any) -> Any:
        self._put_index()
        if isinstance(result, _worker.ExceptionWrapper):
            result.reraise()
        return _worker.unpack(result)

    def _worker_ended(self, worker_id: int) -> None:
        self._active[worker_id] = False
        if not self._persistent:
            # it has nothing more to give: let it go
            self._pool.index_queues[worker_id].put(None)

    def _get(self) -> tuple[int, int, Any]:
        """The next result from any worker, waiting at most ``timeout`` seconds (if set)
        and raising if a worker has died."""
        import queue  # Note [Lazy multiprocessing]

        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:
            wait = _worker.STATUS_INTERVAL
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            try:
                epoch, number, payload = self._pool.result_queue.get(timeout=wait)
            except queue.Empty:
                self._check_workers()
                if deadline is not None and time.monotonic() >= deadline:
                    self._pool.shutdown(wait=False)
                    raise RuntimeError(
                        f"DataLoader: no batch came from the worker processes within "
                        f"timeout={self._timeout} seconds"
                    ) from None
                continue
            return epoch, number, pickle.loads(payload)

    def _check_workers(self) -> None:
        for worker_id, process in enumerate(self._pool.processes):
            if self._active[worker_id] and not process.is_alive():
                how = _exit_description(process.exitcode)
                self._pool.shutdown(wait=False)
                raise RuntimeError(
                    f"DataLoader: worker process {worker_id} (pid {process.pid}) exited "
                    f"unexpectedly ({how}); if it ran out of memory, try fewer workers or a "
                    "smaller batch_size"
                )

    def __del__(self) -> None:
        # no contextlib here: at interpreter exit the modules it needs may be gone
        try:
            if self._pool is not None:
                self._pool.shutdown()
        except Exception:
            pass
