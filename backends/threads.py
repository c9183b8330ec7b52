"""The thread count of the CPU kernels (``lm.set_num_threads``), process-wide.

Note [Parallel threshold]: below PARALLEL_ELEMENTS elements a kernel runs serially:
waking threads costs more than it saves. With one thread the threshold is infinite,
so the choice is a single comparison either way. Kernel modules keep the threshold in
a module global (read on every call) and are told of changes through ``on_change``.

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
it). Beside Numba's pool and lamina's own threads, those spinning threads take a core
from whatever runs next: measured on 2 cores, a VGG-like net's training step took 215
ms on one thread, 196 ms on two with a 2-thread BLAS and 148 ms with a 1-thread BLAS
(its inference 61.5 -> 44.4 ms only with the latter). So ``set_num_threads`` sets BLAS
to ONE thread, through threadpoolctl, and lamina's GEMM kernels use the count by
splitting their work (``split``, Note [Split work]): one pool, lamina's, owns the
cores. The BLAS library is process-wide, so NumPy's own matmul runs on one thread too
after ``set_num_threads`` (threadpoolctl can give it more). Until the first
``set_num_threads`` call BLAS keeps its default (lamina then runs one thread itself).

Note [Wait policy]: Numba's default threading layer on Linux is OpenMP (libgomp), whose
idle threads spin before they sleep: by default ~300,000 turns (milliseconds). Right
after a BLAS call, whose threads also spun before they slept, the two pools then
fought for the cores: measured on 2 cores, a channels-last batch norm right after a
convolution took 17.9 ms with spinning OpenMP threads and 2.1 ms with passive ones,
relu 7.9 ms against 0.74 ms. But a thread that sleeps at once (``OMP_WAIT_POLICY=
PASSIVE``) must be woken for every parallel kernel, and in this VM that costs ~45 us:
relu on 2**17 floats (PARALLEL_ELEMENTS) took 12 us serially, 52 us on two passive
threads and 8-10 us on two that spin a little, so the threshold only holds for a pool
that is awake; relu on 16x64x56x56 called back to back took 0.30 against 0.25 ms. So
Numba's pool spins about as long as a wake-up costs, then sleeps (``GOMP_SPINCOUNT`` =
``SPIN_COUNT``: ~50 us of CPU here; libgomp's own estimate is 100 turns a us), the
classic spin-then-block rule, which never wastes more than twice the best choice:
kernels that follow each other find the pool awake, and an idle pool gives its core
back within ~0.05 ms. BLAS has one thread now (Note [BLAS threads]): nothing else spins.
Training steps are unchanged by it (2 cores, lamina alone, batch 32, images/s, medians
of 5 rounds, two runs each: AlexNet 412 / 403 passive, 413 / 427 spinning; VGG 231 /
262 against 227 / 258; Inception 552 / 539 against 550 / 547): their time is in GEMMs.
The user's ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``, when set, wins. Only
Numba's own libgomp reads them (it is loaded when the pool starts; the variables are
restored at once, so a libgomp loaded later, PyTorch's, keeps its default).
The layer is Numba's default choice (TBB when the ``tbb`` package is installed, else
OpenMP, else workqueue), kept by measurement: 1 -> 2 threads on 2 cores, training steps
of the convnet bench's VGG at batch 8 / 32, AlexNet and Inception at 32 (one process
per setting, medians of 5 rounds x 2 runs): OpenMP passive 1.32 / 1.36 / 1.57 / 1.50x,
OpenMP active 0.86 / 0.98 / 1.00 / 1.03x, workqueue 1.31 / 1.38 / 1.57 / 1.29x, TBB
1.40 / 1.43 / 1.68 / 1.51x. TBB is a few percent ahead but not a dependency; OpenMP's
long-spinning threads lost everything the second thread gained.

Note [Split work]: ``split`` runs a kernel's independent parts (the images of a
convolution's batch, the rows of a matmul) on lamina's threads: the calling thread
takes the first part, a pool of ``count - 1`` Python threads the others, each part a
serial computation with single-threaded GEMMs (Note [BLAS threads]), so that the data
a thread writes is the data it reads (seed 2's "threads that cooperate": a
multi-threaded BLAS splits every small GEMM, and its threads then read blocks the
calling thread has just written from another core's cache). The parts run in the
calling thread's context (``contextvars``), so they use its allocator (the "allocator"
layer is a context variable) and grad mode. The kernels they call must release the GIL
(Numba ``nogil``; NumPy's matmul does). A ``split`` started from a part runs serially,
so parts never wait on each other; Python threads wait passively, as Numba's do.

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
import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

PARALLEL_ELEMENTS = 1 << 17
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


SPIN_COUNT = 3000  # turns an idle thread of Numba's pool spins (Note [Wait policy])


def _start_numba_pool(numba: Any) -> None:
    """Numba's thread pool, started once with a short spin (Note [Wait policy])."""
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
    global _count, _threshold, _workers
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__}")
    numba = _numba()
    if not 1 <= n <= numba.config.NUMBA_NUM_THREADS:
        raise ValueError(
            f"num_threads must be between 1 and "
            f"{numba.config.NUMBA_NUM_THREADS} (the cores Numba can use), got {n}"
        )
    with _lock:
        _start_numba_pool(numba)
        numba.set_num_threads(n)
        _blas_libraries().limit(limits=1)  # Note [BLAS threads]
        _count, _threshold = n, float("inf") if n == 1 else PARALLEL_ELEMENTS
        for listener in _listeners:
            listener(_threshold)
        if _workers is not None and _workers._max_workers != n - 1:
            _workers.shutdown(wait=False)  # its threads end once their parts are done
            _workers = None


_workers: ThreadPoolExecutor | None = None  # count - 1 threads for split's parts
_in_part = threading.local()


def _forget_workers() -> None:
    """A forked child has none of the parent's threads: it makes its own pool."""
    global _workers
    _workers = None


os.register_at_fork(after_in_child=_forget_workers)


def _run_part(fn: Callable, start: int, stop: int) -> Any:
    _in_part.active = True
    try:
        return fn(start, stop)
    finally:
        _in_part.active = False


def split(fn: Callable[[int, int], Any], total: int) -> list:
    """``[fn(start, stop), ...]`` over contiguous parts of ``range(total)``, one per
    thread, run in parallel (Note [Split work])."""
    parts = min(_count, total)
    if parts < 2 or getattr(_in_part, "active", False):
        return [fn(0, total)]
    global _workers
    with _lock:
        if _workers is None:
            _workers = ThreadPoolExecutor(_count - 1, thread_name_prefix="lamina")
        workers = _workers
    bounds = [total * i // parts for i in range(parts + 1)]
    futures = []
    try:
        for i in range(1, parts):
            run = contextvars.copy_context().run
            futures.append(workers.submit(run, _run_part, fn, bounds[i], bounds[i + 1]))
        results = [_run_part(fn, bounds[0], bounds[1])]
    finally:
        wait(futures)  # no part outlives the call, even when one failed
    return results + [f.result() for f in futures]


def get_num_threads() -> int:
    """The thread count big kernels use (in every thread)."""
    return _count


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
