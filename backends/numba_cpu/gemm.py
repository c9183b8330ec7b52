"""Float matrix products on lamina's threads (Note [BLAS threads] in
lamina.backends.threads): BLAS runs on one thread once ``set_num_threads`` was called,
so a product big enough is split -- the rows of a 2-D result (Note [Products in
parallel]), the matrices of a batched one (Note [Batches in parallel]; other
broadcasts and mixed dtypes by ``threads.split``) -- into single-threaded BLAS calls,
one part per thread.

Measured on 2 cores: see docs/performance.md, "Tuning" (``x @ w.T``).
"""

import math

import numpy as np

from lamina.backends import jit, threads

from . import blas

SPLIT_FLOPS = 1 << 23  # below this a product is one BLAS call: waking a thread costs more
# Note [Products in parallel]: a 2-D product runs on lamina's threads as one Numba
# kernel whose parallel loop gives each thread a range of the result's rows, each
# calling the BLAS itself (Note [GEMM in kernels] in blas.py): no Python and no GIL in
# the parts, so it costs what a parallel loop costs (~2 us while the pool spins), where
# ``threads.split``'s parts call back into Python (~40 us empty, ~100 us with a
# product in each part: the GIL changes hands). Measured on 2 cores, float32, (m x k x
# n) one thread / threads.split / rows in parallel, us: 512 x 64 x 384 (MobileNet's
# 1 x 1 convolution on 4 x 4 images at batch 32) 185 / 259 / 97, 128 x 160 x 960 258 /
# 256 / 148, 4096 x 256 x 256 3477 / 1921 / 1662, 256 x 128 x 128 59 / 110 / 34,
# 128 x 64 x 64 6 / 74 / 6 (so from ROWS_FLOPS).
ROWS_FLOPS = 1 << 21


def product(a, b, out, beta=0.0, bias=None):
    """out = a @ b + beta out (beta 0 or 1) for 2-D arrays, or with ``bias`` (a vector
    of out's columns) bias + a @ b: in parallel over out's rows where it is big enough
    (Note [Products in parallel]), else one call of the BLAS; NumPy's product where the
    BLAS cannot be called from kernels or not on these arrays (other dtypes, out's rows
    or columns apart, out overlapping an operand).

    Note [Bias first]: a bias is written into out's rows and the product added to them
    (the BLAS's beta 1; PyTorch's addmm does the same), in parts as the product's
    (``_fill_rows``): the BLAS reads out where it writes it, while a bias added after
    the product is one more pass over out. One thread, 1024 rows, 256
    -> 768 features: 2.34 -> 2.16 ms; 256 -> 1024: 3.20 -> 2.93 ms; 1024 -> 256: 3.20
    -> 3.09 ms."""
    m, n = out.shape
    if a.shape != (m, b.shape[0]) or b.shape[1] != n:  # the kernel reads by out's shape
        raise ValueError(f"product: {a.shape} @ {b.shape} does not fit out {out.shape}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"product: bias {bias.shape} does not fit out {out.shape}")
    if a.shape[1] == 1 and bias is None and not beta:  # Note [Outer products]
        with np.errstate(invalid="ignore", over="ignore"):
            return np.multiply(a, b, out=out)
    parts = threads.parallel_parts(m) if 2 * m * n * a.shape[1] >= ROWS_FLOPS else 1
    if bias is not None:
        _fill_rows(out, bias, parts)
        beta = 1.0
    if (parts > 1 or beta) and _native(a, b, out):
        (a, trans_a), (b, trans_b) = _operand(a), _operand(b)
        _rows_kernel(out.dtype, parts > 1)(a, b, out, trans_a, trans_b, beta, parts)
        return out
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf data: no warnings
        if beta:
            out += np.dot(a, b)
        elif out.flags.c_contiguous:
            np.dot(a, b, out=out)  # Note [dot, not matmul] in nn/conv.py
        else:
            np.matmul(a, b, out=out)
    return out


# Note [Outer products]: a product over one column and one row (a linear layer's weight
# gradient at batch 1) is each output one multiplication, which the BLAS does slowly:
# OpenBLAS took 574 us for a 256 x 1 x 2048 float32 product, NumPy's broadcast
# multiply 135 us, with the same roundings (one product per output, no sum).


def _fill_rows(out, bias, parts):
    """Every row of out = bias (Note [Bias first]): in ``parts`` in parallel, each the
    rows its part of the product then adds to, where out is a C array; else by NumPy.
    (Inside the product's kernel, which types out with any strides, the rows were
    stored element by element: 4096 x 1024 float32 took 0.6 ms more than NumPy's.)"""
    if parts > 1 and out.flags.c_contiguous and out.dtype in (np.float32, np.float64):
        _over_parts(_fill, out.dtype)(out, np.array(bias, out.dtype), parts)
    else:
        out[...] = bias


def _fill(out, bias, parts):
    m, n = out.shape
    for i in jit.prange(parts):
        r0, r1 = jit.part(m, parts, i)
        for r in range(r0, r1):
            for c in range(n):
                out[r, c] = bias[c]


def _over_parts(loop, dtype):
    """``loop(matrix, vector, parts)`` (``_fill``, ``_add_parts``) compiled for
    ``dtype``: a parallel loop over parts of its work."""

    def build():
        signature = jit.types.void(jit.array(dtype, 2), jit.array(dtype, 1), jit.types.int64)
        return jit.compile_kernel(loop, signature, parallel=True, nogil=True)

    return jit.cached((loop, dtype), build)


def _native(a, b, out):
    """Whether the kernel may write out = a @ b (+ out) (2-D, or 3-D batches): a dtype
    the BLAS has for all three, out's columns adjacent and its rows at least a row apart
    (the BLAS's leading dimension), and no operand in out's memory (parts write rows the
    other parts read)."""
    row, column = out.strides[-2:]
    return (
        blas.available()
        and out.dtype in (np.float32, np.float64)
        and a.dtype == b.dtype == out.dtype
        and column == out.itemsize
        and row >= out.shape[-1] * out.itemsize
        and not np.may_share_memory(out, a)
        and not np.may_share_memory(out, b)
    )


def _operand(a):
    """(a, False) where the BLAS reads a (or each of a batch's matrices) in place as it
    is, (its transpose, True) where it reads that in place, else (a copy with a C
    array's strides, False: NumPy gives a one-row view such as x[None] row stride 0 and
    calls it C-contiguous)."""
    for array, transposed in ((a, False), (a.swapaxes(-1, -2), True)):
        row, column = array.strides[-2:]
        size = array.itemsize
        if column == size and row >= array.shape[-1] * size and row % size == 0:
            return array, transposed
    return np.array(a, order="C"), False


def _rows(a, b, out, trans_a, trans_b, beta, parts):
    m = out.shape[0]
    for i in jit.prange(parts):
        r0, r1 = jit.part(m, parts, i)
        rows = a[:, r0:r1] if trans_a else a[r0:r1]
        blas.gemm(rows, b, out[r0:r1], trans_a, trans_b, beta)


def _rows_kernel(dtype, parallel):
    """_rows, its loop the split (Note [Products in parallel]); serial for one part,
    which may run inside a split's part, where a parallel kernel would nest."""

    def build():
        matrix, t = jit.array(dtype, 2, "A"), jit.types
        real = t.float32 if dtype == np.float32 else t.float64
        signature = t.void(matrix, matrix, matrix, t.boolean, t.boolean, real, t.int64)
        return jit.compile_kernel(_rows, signature, parallel=parallel, nogil=True)

    return jit.cached((_rows, dtype, parallel), build)


# Note [Batches in parallel]: a batch of products (``batched``: a batched matmul, a 1x1
# convolution's image by image) runs as one kernel whose parallel loop gives each
# thread a range of the batch, each calling the BLAS per matrix -- Note [Products in
# parallel]'s loop over a batch: no Python and no GIL in the parts, where
# ``threads.split`` cost ~100 us a call and its parts slowed each other at the GIL.
# Measured on 2 cores, float32, one thread / two by threads.split / two by the kernel,
# us: MobileNet v2's 1x1 convolution from 96 to 24 channels on 16 x 16 images at batch
# 8, 88 / 199 / 52 (at batch 32 374 / 393 / 159-186); attention's 32 (128 x 64) @ (64
# x 128) products, 552 / 458 / 273.


def batched(a, b, out, beta=0.0, sums=False):
    """out[i] = a[i] @ b[i] + beta out[i] (beta 0 or 1) for 3-D arrays, an operand with
    one matrix (first axis 1) shared by all: in parallel over the batch where it is big
    enough (Note [Batches in parallel]), else NumPy's matmul. With ``sums``, ``out``
    has a matrix per part (``summed``), and part p adds its products into out[p]."""
    total, (m, n) = _total(a, b), out.shape[1:]
    batches = {a.shape[0], b.shape[0]} <= {1, total} and (sums or out.shape[0] == total)
    if not batches or a.shape[1:] != (m, b.shape[1]) or b.shape[2] != n:  # the kernel reads
        raise ValueError(f"batched: {a.shape} @ {b.shape} does not fit out {out.shape}")
    if total == 1 and not sums:  # one matrix (a 1x1 convolution of one image): NumPy's
        product(a[0], b[0], out[0], beta)  # 3-D matmul cost 1.5 us more than dot
        return out
    parts = _batch_parts(a, b)
    if parts > 1 and _native(a, b, out):
        (a, trans_a), (b, trans_b) = _operand(a), _operand(b)
        _batch_kernel(out.dtype)(a, b, out, trans_a, trans_b, beta, total, sums, parts)
        return out
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf data: no warnings
        if sums:  # all in the first part's
            out[0] += np.matmul(a, b).sum(axis=0)
        elif beta:
            out += np.matmul(a, b)
        else:
            np.matmul(a, b, out=out)
    return out


def summed(a, b, dtype):
    """The sum over the batch of a[i] @ b[i] (``batched``, each part summing its own)."""
    sums = np.zeros((_batch_parts(a, b), a.shape[1], b.shape[2]), dtype)
    return parts_total(batched(a, b, sums, beta=1.0, sums=True))


def parts_total(sums):
    """sums.sum(axis=0) of the parts' own sums of a parallel loop (a weight gradient's):
    the one part's as it is, else added part by part in NumPy's order (its values; a
    -0.0 stays one, where NumPy's sum starts from +0.0) in parallel over the elements
    where they are many. It was NumPy's sum, a copy for one part and a serial pass for
    more: 512 x 512 x 3 x 3 float32, ~1 ms a call."""
    if sums.shape[0] == 1:
        return sums[0]
    parts = threads.parts_for(sums.size, sums[0].size)
    if parts == 1 or sums.dtype not in (np.float32, np.float64) or not sums.flags.c_contiguous:
        return sums.sum(axis=0)
    out = np.empty(sums.shape[1:], sums.dtype)
    _over_parts(_add_parts, sums.dtype)(sums.reshape(sums.shape[0], -1), out.reshape(-1), parts)
    return out


def _add_parts(sums, out, parts):
    for q in jit.prange(parts):
        start, stop = jit.part(out.size, parts, q)
        for i in range(start, stop):
            out[i] = sums[0, i]
        for p in range(1, sums.shape[0]):
            for i in range(start, stop):
                out[i] += sums[p, i]


def _total(a, b):
    """The batch of a @ b: an operand's matrices, the other's one shared by all."""
    return b.shape[0] if a.shape[0] == 1 else a.shape[0]


def _batch_parts(a, b):
    """Into how many parts ``batched`` cuts a @ b: one per thread from ROWS_FLOPS."""
    total = _total(a, b)
    flops = 2 * total * a.shape[1] * a.shape[2] * b.shape[2]
    return threads.parallel_parts(total) if flops >= ROWS_FLOPS else 1


def _batch(a, b, out, trans_a, trans_b, beta, total, sums, parts):
    for p in jit.prange(parts):
        start, stop = jit.part(total, parts, p)
        for i in range(start, stop):
            target = out[p] if sums else out[i]
            blas.gemm(a[i % a.shape[0]], b[i % b.shape[0]], target, trans_a, trans_b, beta)


def _batch_kernel(dtype):
    """_batch, its loop the parallel one (Note [Batches in parallel])."""

    def build():
        array, t = jit.array(dtype, 3, "A"), jit.types
        real = t.float32 if dtype == np.float32 else t.float64
        signature = t.void(
            array, array, array, t.boolean, t.boolean, real, t.int64, t.boolean, t.int64
        )
        return jit.compile_kernel(_batch, signature, parallel=True, nogil=True)

    return jit.cached((_batch, dtype), build)


def _batch_operand(a, batch):
    """Operand a of a product over ``batch`` as a 3-D batch for ``batched``: all of
    ``batch``'s matrices, or one shared by all; None for other broadcasts."""
    if a.shape[:-2] == batch:  # (the batch counted: -1 is ambiguous for empty matrices)
        return a.reshape(math.prod(batch), *a.shape[-2:])
    if math.prod(a.shape[:-2]) == 1:
        return a.reshape(1, *a.shape[-2:])
    return None


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
    ndim = len(shape)
    same = a.dtype == b.dtype and (out is None or out.dtype == a.dtype)
    if ndim == 2 and same:
        return product(a, b, np.empty(shape, a.dtype) if out is None else out)
    a3, b3 = _batch_operand(a, batch), _batch_operand(b, batch)
    if same and a3 is not None and b3 is not None and (out is None or out.flags.c_contiguous):
        out = np.empty(shape, a.dtype) if out is None else out
        batched(a3, b3, out.reshape(math.prod(batch), *shape[-2:]))
        return out
    if threads.get_num_threads() == 1 or flops < SPLIT_FLOPS or shape[0] < 2:
        with np.errstate(invalid="ignore", over="ignore"):
            return np.matmul(a, b, out=out)
    if out is None:
        out = np.empty(shape, np.result_type(a, b))

    def part(i0, i1):  # a 2-D result's rows take all of b; a batch, b's batch
        b_part = b if ndim == 2 else _part(b, ndim, i0, i1)
        with np.errstate(invalid="ignore", over="ignore"):
            np.matmul(_part(a, ndim, i0, i1), b_part, out=out[i0:i1])

    threads.split(part, shape[0])
    return out
