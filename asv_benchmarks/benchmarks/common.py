"""Shared helpers of the lamina asv suite (this module holds no benchmarks).

Note [Setup runs between timed calls]: asv_runner >= 0.3 re-runs a benchmark's
``setup`` before every timed call when the class has one (asv#966): ``number`` then
means "calls per sample, each timed on its own", and an unset ``number`` becomes 1.
So ``setup`` here must be cheap to repeat: inputs are made once per process and
memoized (``memo``), kernels are compiled or loaded from Numba's cache once per process
(``warm``), and small sizes set ``self.number`` (``number_for``) so that one sample
covers enough work to time. Benchmark bodies must not modify their (shared) inputs.
"""

import tracemalloc

import numpy as np

import lamina as lm

SIZES = [10**2, 10**4, 10**6, 10**7]  # elements; ascending, so the CI test takes the smallest


class Benchmark:
    """Defaults every benchmark class inherits (asv reads attributes through the class)."""

    timeout = 120  # seconds per benchmark (per parameter combination); kernels may compile
    repeat = (3, 10, 4.0)  # per round: at least 3 samples, at most 10, stop after 4 s
    warmup_time = 0.05


_memo = {}


def memo(key, make):
    """``make()`` once per process and key; later calls return the same object."""
    try:
        return _memo[key]
    except KeyError:
        value = _memo[key] = make()
        return value


_warm = set()


def warm(key, fn):
    """Call ``fn()`` once per process and key (JIT compilation or a Numba cache load)."""
    if key not in _warm:
        fn()
        _warm.add(key)


def number_for(n, elements=10**5, most=1000):
    """Calls per sample so that one sample covers about ``elements`` elements."""
    return max(1, min(most, elements // max(n, 1)))


def floats(n, dtype="float32", seed=0):
    """A NumPy array of n values in [0.5, 1.5): safe for sqrt, log and division."""

    def make():
        rng = np.random.default_rng(seed)
        return (rng.random(n, dtype=np.float32) + np.float32(0.5)).astype(dtype, copy=False)

    return memo(("floats", n, dtype, seed), make)


def square_shape(n):
    """A 2-D shape of n elements (n a power of ten), as square as powers of ten allow."""
    exp = round(np.log10(n))
    cols = 10 ** ((exp + 1) // 2)
    return (n // cols, cols)


def operand(n, layout, seed=0, dtype="float32"):
    """One input tensor of n logical elements in the given layout.

    contiguous: shape (n,), C-contiguous -> the backends' fast path
    strided:    shape (n,), every second element of a 2n buffer -> the general path
    broadcast:  shape square_shape(n) broadcast from one row (stride 0) -> general path
    """

    def make():
        if layout == "contiguous":
            return lm.asarray(floats(n, dtype, seed))
        if layout == "strided":
            return lm.asarray(floats(2 * n, dtype, seed))[::2]
        if layout == "broadcast":
            shape = square_shape(n)
            return lm.broadcast_to(lm.asarray(floats(shape[1], dtype, seed)), shape)
        raise ValueError(f"unknown layout {layout!r}")

    return memo(("operand", n, layout, seed, dtype), make)


def binary_operands(n, layout, dtype="float32"):
    """Two inputs whose result has n elements.

    contiguous, strided: as ``operand``; broadcast: a (rows, cols) tensor and a (cols,)
    row, the common bias-add pattern; scalar: a contiguous tensor and a Python float.
    """

    def make():
        if layout in ("contiguous", "strided"):
            return operand(n, layout, 0, dtype), operand(n, layout, 1, dtype)
        if layout == "broadcast":
            shape = square_shape(n)
            return (
                lm.reshape(operand(n, "contiguous", 0, dtype), shape),
                lm.asarray(floats(shape[1], dtype, 1)),
            )
        if layout == "scalar":
            return operand(n, "contiguous", 0, dtype), 0.75
        raise ValueError(f"unknown layout {layout!r}")

    return memo(("binary", n, layout, dtype), make)


class threads:
    """Context manager: run with ``n`` lamina threads, then restore the previous count.

    Only calls ``lm.set_num_threads`` when the count changes, so a single-threaded run
    never starts Numba's thread pool."""

    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.previous = lm.get_num_threads()
        if self.n != self.previous:
            lm.set_num_threads(self.n)
        return self

    def __exit__(self, *exc):
        if lm.get_num_threads() != self.previous:
            lm.set_num_threads(self.previous)


def max_threads():
    import numba

    return numba.config.NUMBA_NUM_THREADS


def _initialize_numba():
    """Note [Forkserver warm-up]: asv.conf.json uses the ``forkserver`` launch method:
    the suite is imported once and every benchmark runs in a process forked from it.
    Loading the first kernel from Numba's cache initializes LLVM (about 0.1 s); doing it
    here, at import, saves that in every forked process. It starts no threads (lamina
    runs single-threaded until ``set_num_threads``), so forking afterwards is safe.
    Start-up costs themselves are measured in fresh processes (bench_startup.py)."""
    try:
        x = lm.asarray(np.ones(4, np.float32))
        x + x
    except Exception:  # a broken commit fails in its benchmarks, not at discovery
        pass


_initialize_numba()


def peak_alloc_bytes(call):
    """Peak bytes NumPy allocated during ``call()`` (tracemalloc): exact, unlike
    peakmem, which measures the whole process."""
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
