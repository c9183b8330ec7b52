"""Float matrix products on lamina's threads (Note [BLAS threads] in
lamina.backends.threads): BLAS runs on one thread once ``set_num_threads`` was called,
so a product big enough is split -- the rows of a 2-D result, the first batch axis of
a batched one -- into one single-threaded BLAS call per thread (``threads.split``).

Measured on 2 cores: see docs/performance.md, "Tuning" (``x @ w.T``).
"""

import math

import numpy as np

from lamina.backends import jit, threads

from . import blas

SPLIT_FLOPS = 1 << 23  # below this a product is one BLAS call: waking a thread costs more


def _part(a, ndim, i0, i1):
    """An operand's share of the result's first axis [i0, i1): its own first axis when
    that is the result's (not broadcast), else all of it."""
    return a[i0:i1] if a.ndim == ndim and a.shape[0] != 1 else a


def matmul(a, b, out=None):
    """``np.matmul(a, b, out=out)`` for float arrays of at least 2 dimensions, in parts
    on lamina's threads when it is big enough; quiet on NaN and infinities, as every
    lamina kernel (np.errstate holds per thread: each part sets it)."""
    # two matrices skip np.broadcast_shapes: 1.6 us, a fifth of a 128 x 10 x 512 product
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) if a.ndim + b.ndim > 4 else ()
    shape = batch + (a.shape[-2], b.shape[-1])
    flops = 2 * math.prod(shape) * a.shape[-1]
    if threads.get_num_threads() == 1 or flops < SPLIT_FLOPS or shape[0] < 2:
        with np.errstate(invalid="ignore", over="ignore"):
            return np.matmul(a, b, out=out)
    if out is None:
        out = np.empty(shape, np.result_type(a, b))
    ndim = len(shape)

    def part(i0, i1):  # a 2-D result's rows take all of b; a batch, b's batch
        b_part = b if ndim == 2 else _part(b, ndim, i0, i1)
        with np.errstate(invalid="ignore", over="ignore"):
            np.matmul(_part(a, ndim, i0, i1), b_part, out=out[i0:i1])

    threads.split(part, shape[0])
    return out


def add_product(a, b, out):
    """out += a @ b.T for float32 or float64 matrices a (m, k), b (n, k) and a
    C-contiguous out (m, n): the BLAS's own accumulation (beta 1), in parts of out's
    rows on lamina's threads when it is big enough. Where the BLAS cannot be called
    from kernels, NumPy's product added.

    Linear's bias is written into out first and the product added so (PyTorch's addmm
    does the same): the BLAS reads out where it writes it, while a bias added after
    the product is one more pass over out. One thread, 1024 rows, 256 -> 768 features:
    2.34 -> 2.16 ms; 256 -> 1024: 3.20 -> 2.93 ms; 1024 -> 256: 3.20 -> 3.09 ms."""
    if not blas.available():
        out += matmul(a, b.T)
        return
    a, b = _readable(a), _readable(b)
    kernel = _add_product_kernel(out.dtype)
    m, n = out.shape
    if threads.get_num_threads() == 1 or 2 * m * n * a.shape[1] < SPLIT_FLOPS or m < 2:
        kernel(a, b, out)
    else:
        threads.split(lambda i0, i1: kernel(a[i0:i1], b, out[i0:i1]), m)


def _readable(a):
    """a itself where the BLAS reads it in place (adjacent columns, rows at least a row
    apart), else a C-contiguous copy."""
    row, column = a.strides
    if column != a.itemsize or row < a.shape[1] * a.itemsize or row % a.itemsize:
        return np.ascontiguousarray(a)
    return a


def _add_rows(a, b, out):
    blas.gemm(a, b, out, False, True, 1.0)


def _add_product_kernel(dtype):
    def build():  # nogil: the parts run on threads.split's threads
        matrix = jit.array(dtype, 2, "A")
        signature = jit.types.void(matrix, matrix, jit.array(dtype, 2))
        return jit.compile_kernel(_add_rows, signature, nogil=True)

    return jit.cached((_add_rows, dtype), build)
