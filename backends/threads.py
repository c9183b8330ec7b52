"""The thread count of the CPU kernels (``lm.set_num_threads``), process-wide.

Note [Parallel threshold]: below PARALLEL_ELEMENTS elements a kernel runs serially:
waking threads costs more than it saves. With one thread the threshold is infinite, so
the choice is a single comparison either way. Kernel modules keep the threshold in a
module global (read on every call) and are told of changes through ``on_change``.
Elements narrower than 4 bytes (bool, 8- and 16-bit) need more: their loops run 32-64
elements per vector instruction. Their elementwise kernels go parallel from
NARROW_ELEMENTWISE_FACTOR times the threshold, their folds (reductions) from
NARROW_FOLD_FACTOR times. Two threads' time over one's (an otherwise idle 2-core
machine, 2026-12-04) for bool and 8-bit logical and arithmetic kernels: 1.10-1.23 at the
threshold, 0.94-0.97 at 2x, 0.86-0.93 at 3x, 0.59-0.78 at 4x, 0.31-0.47 at 8x (16-bit
ones: 0.63-0.80 at 2x, 0.34-0.35 at 4x). Folds keep the higher factor: on 10**6 bools
``any`` takes 9 us on one thread, less than one wake-up of a sleeping thread (~120 us,
Note [Wait policy]). Any parallel kernel loses ~1 ms (a time slice) when another process
holds the second core, as PyTorch's parallel loops do. The comparison stays one per
call: the kernel reads the threshold of its computation dtype's width.

Note [Thread count]: Numba's thread count is per calling thread (a thread that never
set it uses every core), but lamina's is one setting for the process. So every
parallel entry point (``synced``, which ``jit.compile_kernel`` applies) sets the calling
thread's Numba count to lamina's before it runs, if it differs: a kernel started from a
worker thread uses ``lm.set_num_threads``'s count too, and threads never oversubscribe
the cores by a default the user did not choose. Parallel kernels run on 2**17 elements
and more, so the check (~0.3 us) is noise there; serial kernels never pay it.

Note [BLAS threads]: float GEMMs (matmul, conv2d, linear) run in the BLAS NumPy links
(OpenBLAS in NumPy's wheels), which has a thread pool of its own whose idle threads
spin for ~0.1 s after every call (OpenBLAS's THREAD_TIMEOUT, read once when NumPy loads
it). Beside Numba's pool, those spinning threads take a core
from whatever runs next: measured on 2 cores, a VGG-like net's training step took 215
ms on one thread, 196 ms on two with a 2-thread BLAS and 148 ms with a 1-thread BLAS
(its inference 61.5 -> 44.4 ms only with the latter). So ``set_num_threads`` sets BLAS
to ONE thread, through threadpoolctl, and lamina's GEMM kernels use the count by
splitting their work (``split``, Note [Split work], or a parallel loop over a
product's rows: Note [Products in parallel] in numba_cpu/gemm.py): one pool, Numba's,
owns the cores. The BLAS library is process-wide, so NumPy's own matmul runs on one thread too
after ``set_num_threads`` (threadpoolctl can give it more). Until the first
``set_num_threads`` call BLAS keeps its default (lamina then runs one thread itself).

Note [Wait policy]: Numba's default threading layer on Linux is OpenMP (libgomp), whose
idle threads spin ``GOMP_SPINCOUNT`` turns before they sleep (libgomp's default,
300,000, is ~8 ms here). Spinning wins when nothing else wants the core: a sleeping
thread must be woken for the next parallel kernel or split, ~120 us in this VM (its
idle CPUs halt at once: docs/performance.md, "Tuning"), and a training step runs hundreds of
kernels with a little Python between them. It loses when another pool's thread wants
the core: while BLAS had threads of its own and splits ran on a pool of Python threads,
a channels-last batch norm right after a convolution took 17.9 ms with spinning
OpenMP threads and 2.1 ms with passive ones, and ``OMP_WAIT_POLICY=ACTIVE`` made a
second thread worth 0.86-1.03x in training against 1.32-1.57x passive. Now BLAS has one
thread (Note [BLAS threads]) and splits run on Numba's pool (Note [Split work]): its
threads are the only ones, and they spin ~1 ms (``SPIN_COUNT`` turns), then sleep, so
an idle process gives its cores back within a millisecond. Measured on 2 cores, the
worker's CPU time after each kernel of an otherwise idle loop: 0.15 / 0.9 / 2.9 / 7.7
ms with 3,000 / 30,000 / 100,000 / 300,000 turns; training steps at batch 32 on two
threads (images/s, medians of 4-5 processes, the settings alternating): VGG 248 /
277 / 277 / 288, Inception 667 / 692 / - / 694. The user's ``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT``, when set, wins. Only Numba's own libgomp reads them (it is loaded
when the pool starts; the variables are restored at once, so a libgomp loaded later,
PyTorch's, keeps its default). The layer is Numba's default choice (TBB when the
``tbb`` package is installed, else OpenMP, else workqueue, which cannot run kernels
launched from two threads at once), kept by measurement before splits moved to it: 1
-> 2 threads on 2 cores, training steps of the convnet bench's VGG at batch 8 / 32,
AlexNet and Inception at 32: OpenMP passive 1.32 / 1.36 / 1.57 / 1.50x, workqueue 1.31
/ 1.38 / 1.57 / 1.29x, TBB 1.40 / 1.43 / 1.68 / 1.51x. TBB was a few percent ahead
but is not a dependency.

Note [Split work]: ``split`` runs a kernel's independent parts (the images of a
convolution's batch, the matrices of a batched matmul) on Numba's pool, the threads of the parallel
loops: ``_parts_kernel`` is a prange over the parts whose body calls ``_run_part`` back
in Python through a ctypes callback, which takes the GIL for the part's Python and
gives it up in the kernels the part calls (they must release it: Numba ``nogil``,
NumPy's matmul). The calling thread takes the first part. Each part is a serial
computation with single-threaded GEMMs (Note [BLAS threads]), so that the data a
thread writes is the data it reads (seed 2's "threads that cooperate": a
multi-threaded BLAS splits every small GEMM, and its threads then read blocks the
calling thread has just written from another core's cache). The parts run in copies
of the calling thread's context (``contextvars``), so they use its allocator (the
"allocator" layer is a context variable) and grad mode. A ``split`` started from a
part runs serially, so parts never wait on each other; a part's exception is raised
by ``split`` once every part has ended. One pool for both kinds of work is what lets
its threads spin (Note [Wait policy]): the parts used to run on a second pool, of
Python threads waiting on a condition, and each kernel then found one of the two pools
asleep or the other's thread spinning in its way. Measured on 2 cores: a split of 1 ms
of serial work costs 43 us more than half of it back to back (was 126) and 131 us
after 1 ms idle (was 491); two-thread training steps (medians of 4-8 processes, old
and new alternating) VGG at batch 32 / 64 +24% / +10%, Inception at 32 +24%, AlexNet
at 32 -4%, within this host's noise. Claiming parts piece by piece (work stealing) did
not gain: each piece repeats its part's setup.

Note [Fork]: GNU OpenMP cannot run a parallel region in a process forked from one that
ran a region: Numba terminates the child ("fork() called from a process already using
GNU OpenMP"). So a child forked after ``set_num_threads(n > 1)`` runs on one thread, as
PyTorch's forked children do, and refuses ``set_num_threads(n > 1)`` naming the reason;
children started by ``spawn`` or ``forkserver``, or forked before, are unaffected.

Note [LAMINA_NUM_THREADS]: the variable, read once when this module is imported, is a
``set_num_threads`` call made at import (so it also sets BLAS's pool and starts Numba's,
which imports Numba with lamina: Note [Lazy Numba] in jit.py).
A value that is not a whole number, or below 1, raises at import naming the variable (as
``LAMINA_POOL_BYTES`` does); one above the cores Numba can use is lowered to them with a
warning, since the same environment may start a script on a smaller machine, and more
threads than cores would only oversubscribe them.
"""

from __future__ import annotations

import contextvars
import ctypes
import itertools
import os
import threading
import warnings
from collections.abc import Callable
from typing import Any

PARALLEL_ELEMENTS = 1 << 17
# Note [Parallel threshold]: elements under 4 bytes need this many times as many
NARROW_ELEMENTWISE_FACTOR = 4
NARROW_FOLD_FACTOR = 16
_count = 1  # the process-wide thread count
_threshold = float("inf")  # elements from which kernels run in parallel
_listeners: list[Callable[[float], None]] = []
_lock = threading.Lock()
_blas = None  # threadpoolctl's controller of the loaded BLAS libraries, made on first use


def on_change(listener: Callable[[float], None]) -> None:
    """Call ``listener(threshold)`` now and whenever the thread count changes."""
    _listeners.append(listener)
    listener(_threshold)


def parallel_threshold() -> float:
    return _threshold


def _blas_libraries():
    global _blas
    if _blas is None:
        from threadpoolctl import ThreadpoolController

        _blas = ThreadpoolController().select(user_api="blas")
    return _blas


_pool_started = False


def _numba() -> Any:
    """Numba, imported on first use (Note [Lazy Numba] in jit.py), its CPU target context
    made before anything compiles (Note [Numba's first compile])."""
    import numba
    from numba.core.registry import cpu_target

    cpu_target.target_context  # noqa: B018 -- made on first read, then cached
    return numba


# Note [Numba's first compile]: Numba makes its CPU target context on first use, under
# the lock of a cached property, and the context's constructor takes Numba's compiler
# lock; compiling a cfunc takes the compiler lock first and then reads the property. So
# a first njit kernel in one thread and a first cfunc in another waited on each other for
# ever (tests/test_threads.py's four threads hung in ~1 run of 16 here, and in most runs
# with warm caches). Every path to Numba goes through ``_numba`` (jit.py's ``_load``
# too), which makes the context before anything can compile.


SPIN_COUNT = 30_000  # turns an idle thread of Numba's pool spins (Note [Wait policy])


def _start_numba_pool(numba: Any) -> None:
    """Numba's thread pool, started once with a ~1 ms spin (Note [Wait policy])."""
    global _pool_started
    if _pool_started:
        return
    chosen = "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ
    if not chosen:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    try:
        numba.get_num_threads()  # launches the pool
    finally:
        if not chosen:
            del os.environ["GOMP_SPINCOUNT"]
    _pool_started = True


def set_num_threads(n: int) -> None:
    """Use ``n`` threads for big kernels (from 2**17 elements; 1 means serial), in
    every thread of the process; BLAS gets one, lamina's GEMMs split their work
    instead (Note [BLAS threads])."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__}")
    numba = _numba()
    if not 1 <= n <= numba.config.NUMBA_NUM_THREADS:
        raise ValueError(
            f"num_threads must be between 1 and "
            f"{numba.config.NUMBA_NUM_THREADS} (the cores Numba can use), got {n}"
        )
    if n > 1 and _forked_from_parallel:
        raise RuntimeError(
            f"set_num_threads({n}): this process was forked from one that ran lamina "
            f"on several threads, and GNU OpenMP (Numba's thread pool) cannot run in "
            f"such a child, so lamina runs on one thread here; start worker processes "
            f"with multiprocessing's 'spawn' or 'forkserver' method to use threads in "
            f"them (Note [Fork])"
        )
    global _went_parallel
    with _lock:
        _start_numba_pool(numba)
        numba.set_num_threads(n)
        _blas_libraries().limit(limits=1)  # Note [BLAS threads]
        _went_parallel |= n > 1 and numba.threading_layer() == "omp"
        _set_count(n)


def _set_count(n: int) -> None:
    global _count, _threshold
    _count, _threshold = n, float("inf") if n == 1 else PARALLEL_ELEMENTS
    for listener in _listeners:
        listener(_threshold)


_went_parallel = False  # this process may have run an OpenMP parallel region
_forked_from_parallel = False  # ... and this one is a child forked from it (Note [Fork])


def _one_thread_after_fork() -> None:
    global _forked_from_parallel
    if _went_parallel:
        _forked_from_parallel = True
        _set_count(1)


os.register_at_fork(after_in_child=_one_thread_after_fork)


# Note [Split work]'s machinery: a prange over the parts whose body calls back into
# Python. The trampoline is a ctypes callback (it takes the GIL itself); it finds its
# split's arguments by the id the prange passes it. The kernel calls it by a symbol
# registered with LLVM, not by its address, which differs per process: so the kernel is
# loaded from Numba's cache (Note [Closure cells] in jit.py).
_splits: dict[int, tuple] = {}
_split_ids = itertools.count()
_in_part = threading.local()
_parts = None  # the prange kernel, compiled on the first split
_PART_SYMBOL = "lamina_run_part"
_kernel_trampoline = None  # _trampoline as the kernel calls it: a Numba ExternalFunction


def _run_part(split_id: int, i: int) -> None:
    fn, bounds, contexts, results, errors = _splits[split_id]
    _in_part.active = True
    try:
        results[i] = contexts[i].run(fn, bounds[i], bounds[i + 1])
    except BaseException as error:  # raised by split, in the caller
        errors[i] = error
    finally:
        _in_part.active = False


_trampoline = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64)(_run_part)


def _parts_kernel() -> Callable[[int, int], None]:
    global _parts, _kernel_trampoline
    if _parts is None:
        import llvmlite.binding as llvm

        numba = _numba()
        llvm.add_symbol(_PART_SYMBOL, ctypes.cast(_trampoline, ctypes.c_void_p).value)
        i64 = numba.types.int64
        # a global, not a closure cell: a cell is in the cache key, and this type's
        # pickle differs per process
        _kernel_trampoline = numba.types.ExternalFunction(_PART_SYMBOL, numba.types.void(i64, i64))

        def parts(split_id, count):
            for i in numba.prange(count):
                _kernel_trampoline(split_id, i)

        kernel = numba.njit("void(int64, int64)", parallel=True, nogil=True, cache=True)(parts)
        _parts = synced(kernel)
    return _parts


def split(fn: Callable[[int, int], Any], total: int) -> list:
    """``[fn(start, stop), ...]`` over contiguous parts of ``range(total)``, one per
    thread, run in parallel (Note [Split work])."""
    parts = min(_count, total)
    if parts < 2 or getattr(_in_part, "active", False):
        return [fn(0, total)]
    bounds = [total * i // parts for i in range(parts + 1)]
    contexts = [contextvars.copy_context() for _ in range(parts)]
    results: list = [None] * parts
    errors: list[BaseException | None] = [None] * parts
    split_id = next(_split_ids)
    _splits[split_id] = (fn, bounds, contexts, results, errors)
    try:
        _parts_kernel()(split_id, parts)
    finally:
        del _splits[split_id]
    for error in errors:
        if error is not None:
            raise error
    return results


def parallel_parts(total: int) -> int:
    """Into how many parts a parallel loop over ``total`` items is cut here: one per
    thread (one at least, for no items), or 1 within a split's part (parts never split
    again: Note [Split work])."""
    return 1 if getattr(_in_part, "active", False) else max(1, min(_count, total))


def parts_for(work: float, total: int) -> int:
    """``parallel_parts(total)`` for a loop doing ``work`` multiply-adds in all from the
    parallel threshold (Note [Parallel threshold]), else 1: a kernel that runs its own
    parallel loop over parts of its work (a convolution's images)."""
    return parallel_parts(total) if work >= _threshold else 1


def get_num_threads() -> int:
    """The thread count big kernels use (in every thread)."""
    return _count


_interop = 1  # calls of a compiled plan that may run at once (set_num_interop_threads)


def set_num_interop_threads(n: int) -> None:
    """Let a compiled function run up to ``n`` independent calls at once (Note
    [Inter-op parallelism] in lamina.jit's executor), each on one of lamina's threads:
    at most ``get_num_threads()`` run at once. 1, the default, runs every call after
    the one before it."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_interop_threads: n must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"set_num_interop_threads: n must be at least 1, got {n}")
    global _interop
    _interop = n


def get_num_interop_threads() -> int:
    return _interop


def concurrently(tasks: tuple[Callable[[], Any], ...], costs: tuple[int, ...]) -> list:
    """``[task() for task in tasks]``, the tasks spread over up to
    ``min(get_num_interop_threads(), get_num_threads())`` threads (a split: Note [Split
    work]) by their ``costs``, the costliest first onto the least loaded thread."""
    bins = min(_interop, _count, len(tasks))
    if bins < 2 or getattr(_in_part, "active", False):
        return [task() for task in tasks]
    loads, members = [0] * bins, [[] for _ in range(bins)]
    for i in sorted(range(len(tasks)), key=lambda i: -costs[i]):
        least = loads.index(min(loads))
        loads[least] += costs[i]
        members[least].append(i)
    results: list = [None] * len(tasks)

    def run(start: int, stop: int) -> None:
        for b in range(start, stop):
            for i in members[b]:
                results[i] = tasks[i]()

    split(run, bins)
    return results


def synced(entry: Callable) -> Callable:
    """A parallel entry point that first gives the calling thread lamina's thread
    count (Note [Thread count])."""
    numba = _numba()  # loaded already: the entry point was just compiled
    get, set_ = numba.get_num_threads, numba.set_num_threads

    def parallel(*args: Any) -> Any:
        if get() != _count:
            set_(_count)
        return entry(*args)

    return parallel


def blas_num_threads() -> list[int]:
    """The thread count of each loaded BLAS library (Note [BLAS threads])."""
    return [lib["num_threads"] for lib in _blas_libraries().info()]


def count_from_environment(environ: dict[str, str] = os.environ) -> int | None:
    """The thread count ``LAMINA_NUM_THREADS`` asks for, None if unset (Note
    [LAMINA_NUM_THREADS])."""
    text = environ.get("LAMINA_NUM_THREADS", "").strip()
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        raise ValueError(
            f"LAMINA_NUM_THREADS must be a whole number of threads, got {text!r}"
        ) from None
    if n < 1:
        raise ValueError(f"LAMINA_NUM_THREADS must be at least 1, got {text!r}")
    cores = _numba().config.NUMBA_NUM_THREADS
    if n > cores:
        warnings.warn(
            f"LAMINA_NUM_THREADS={n} is more than the {cores} cores Numba can use; "
            f"lamina uses {cores}",
            RuntimeWarning,
            stacklevel=2,
        )
        n = cores
    return n


_requested = count_from_environment()
if _requested is not None:
    set_num_threads(_requested)
