"""Float matrix products on lamina's threads (Note [BLAS threads] in
lamina.backends.threads): BLAS runs on one thread once ``set_num_threads`` was called,
so a product big enough is split -- the rows of a 2-D result, the first batch axis of
a batched one -- into one single-threaded BLAS call per thread (``threads.split``).

Measured on 2 cores: see docs/performance.md, "Tuning" (``x @ w.T``).
"""

import math

import numpy as np

from lamina.backends import threads

SPLIT_FLOPS = 1 << 23  # below this a product is one BLAS call: waking a thread costs more


def _part(a, ndim, i0, i1):
    """An operand's share of the result's first axis [i0, i1): its own first axis when
    that is the result's (not broadcast), else all of it."""
    return a[i0:i1] if a.ndim == ndim and a.shape[0] != 1 else a


def matmul(a, b):
    """``np.matmul(a, b)`` for float arrays of at least 2 dimensions, in parts on
    lamina's threads when it is big enough; quiet on NaN and infinities, as every lamina
    kernel (np.errstate holds per thread: each part sets it)."""
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    shape = batch + (a.shape[-2], b.shape[-1])
    flops = 2 * math.prod(shape) * a.shape[-1]
    if threads.get_num_threads() == 1 or flops < SPLIT_FLOPS or shape[0] < 2:
        with np.errstate(invalid="ignore", over="ignore"):
            return np.matmul(a, b)
    out = np.empty(shape, np.result_type(a, b))
    ndim = len(shape)

    def part(i0, i1):  # a 2-D result's rows take all of b; a batch, b's batch
        b_part = b if ndim == 2 else _part(b, ndim, i0, i1)
        with np.errstate(invalid="ignore", over="ignore"):
            np.matmul(_part(a, ndim, i0, i1), b_part, out=out[i0:i1])

    threads.split(part, shape[0])
    return out
