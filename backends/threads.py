"""The thread count of the CPU kernels (``lm.set_num_threads``), process-wide.

Note [Parallel threshold]: below PARALLEL_ELEMENTS elements a kernel runs serially:
waking threads costs more than it saves. With one thread the threshold is infinite,
so the choice is a single comparison either way. Kernel modules keep the threshold in
a module global (read on every call) and are told of changes through ``on_change``.

Note [BLAS threads]: float GEMMs (matmul, conv2d, linear) run in the BLAS NumPy links
(OpenBLAS in NumPy's wheels), which has a thread pool of its own. ``set_num_threads``
sets that pool's size too, through threadpoolctl, so that no kernel runs more threads
than the count; the BLAS library is process-wide, so NumPy's own matmul follows it as
well. Until the first ``set_num_threads`` call BLAS keeps its default.
"""

from __future__ import annotations

from collections.abc import Callable

import numba

PARALLEL_ELEMENTS = 1 << 17
_threshold = float("inf")  # elements from which kernels run in parallel
_listeners: list[Callable[[float], None]] = []
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


def set_num_threads(n: int) -> None:
    """Use ``n`` threads for big kernels (from 2**17 elements; 1 means serial) and for
    BLAS (Note [BLAS threads])."""
    global _threshold
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__}")
    if not 1 <= n <= numba.config.NUMBA_NUM_THREADS:
        raise ValueError(
            f"num_threads must be between 1 and "
            f"{numba.config.NUMBA_NUM_THREADS} (the cores Numba can use), got {n}"
        )
    numba.set_num_threads(n)
    _blas_libraries().limit(limits=n)
    _threshold = float("inf") if n == 1 else PARALLEL_ELEMENTS
    for listener in _listeners:
        listener(_threshold)


def get_num_threads() -> int:
    """The thread count big kernels use."""
    return numba.get_num_threads() if _threshold != float("inf") else 1


def blas_num_threads() -> list[int]:
    """The thread count of each loaded BLAS library (Note [BLAS threads])."""
    return [lib["num_threads"] for lib in _blas_libraries().info()]
