"""Scaled dot-product attention in one kernel.

Note [Fused attention]: per (batch, head) block the kernel computes the scores
query @ key^T with the BLAS (Note [GEMM in kernels]), then per row scales them, adds
the mask, and takes the softmax in place while the (L, S) block is in cache, then
multiplies by value with the BLAS again. The composite of dispatched operators (the
decomposition) writes and reads the (..., L, S) scores three times more (the scaled
scores, the masked ones, the softmax) and was 1.5x PyTorch's fused kernel at batch 16,
4 heads, 128 positions of 64 (one thread); this was within 1.1x, and 1.3x timed in
one process beside PyTorch later: its time is its BLAS products', and OpenBLAS's 128 x
64 x 128 products run at 0.75x of the rate of PyTorch's MKL. The weights are kept
(written to the result) only when backward needs them; otherwise each chunk of blocks
reuses one (L, S) scratch block. A causal row stops at its diagonal: the exponentials
and the row's scaling skip the masked part, and the products run by blocks of
CAUSAL_ROWS rows against the keys up to the block's last row (3/8 of the
multiply-adds skipped at 128 positions). A row whose every key is masked gives zero
weights, as PyTorch's scaled_dot_product_attention (its safe softmax).

The backward is one kernel too, from the saved weights P: per block dV = P^T dO, dP =
dO V^T into a scratch block, dScores = P (dP - rowsum(dP P)) scale in place, dQ =
dScores K, dK = dScores^T Q. The composite (four batched products, softmax's backward,
two scalings) wrote and read the (L, S) blocks three times more and took 2.0x as long
at batch 8, 4 heads, 128 positions of 64 (one thread; PyTorch's backward of its fused
attention 1.3x). Masked and causal positions need nothing of their own: their weights
are zero, so are their scores' gradients.
"""

import math
import os

import numpy as np

from lamina.backends import jit, threads
from lamina.dispatch import meta
from lamina.dispatch.decompositions import DECOMPOSITIONS
from lamina.dispatch.tensor import from_array

from .. import blas
from .. import kernels as K

_parallel_min = float("inf")  # Note [Parallel threshold] (lamina.backends.threads)


def _set_threshold(threshold):
    global _parallel_min
    _parallel_min = threshold


threads.on_change(_set_threshold)

# Note [Kernel cache]: the kernel calls kernels.py's vector exp, so it closes over that
# file's stamp (Numba keys its cache by this file alone), as activation.py's do
_stat = os.stat(K.__file__)
_MATH_STAMP = (_stat.st_mtime_ns, _stat.st_size)


CAUSAL_ROWS = 32  # causal products by blocks of rows, each against the keys it sees


def attention_blocks(exp, cast, loop, stamp=_MATH_STAMP):
    """out[b] = softmax(q[b] @ k[b]^T * scale + mask[mask_block[b]]) @ v[b] over the
    blocks b of (P, H, L, E) q, (P, H, S, E) k, (P, H, S, Ev) v (block b at [b // H, b %
    H], Note [Strided blocks]), the weights into scores[b] (``keep``) or into scores[t],
    the scratch of chunk t of the blocks."""

    def kernel(q, k, v, mask, mask_block, causal, scale, chunks, keep, scores, out):
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        heads, length, source = q.shape[1], q.shape[2], k.shape[2]
        blocks = q.shape[0] * heads
        rows = CAUSAL_ROWS if causal else length
        size = (blocks + chunks - 1) // chunks
        factor = cast(scale)
        for t in loop(chunks):
            for b in range(t * size, min(blocks, (t + 1) * size)):
                p = scores[b] if keep else scores[t]
                batch, head = b // heads, b % heads
                qb, kb, vb = q[batch, head], k[batch, head], v[batch, head]
                for r0 in range(0, length, rows):  # a causal block stops at its diagonal
                    r1 = min(length, r0 + rows)
                    end = min(source, r1) if causal else source
                    blas.gemm(qb[r0:r1], kb[:end], p[r0:r1, :end], False, True, 0.0)
                block = mask[mask_block[b]]
                for i in range(length):
                    row, bias = p[i], block[i]
                    n = min(source, i + 1) if causal else source
                    m = cast(-np.inf)
                    for j in range(n):
                        s = row[j] * factor + bias[j]
                        row[j] = s
                        m = K.fold_max(m, s)
                    if m == -np.inf:  # every key masked: zeros (PyTorch's safe softmax)
                        n = 0
                    total = cast(0.0)
                    for j in range(n):
                        e = exp(row[j] - m)
                        row[j] = e
                        total += e
                    f = cast(1.0) / total if n else cast(0.0)
                    for j in range(n):
                        row[j] *= f
                    for j in range(n, source):
                        row[j] = 0
                for r0 in range(0, length, rows):
                    r1 = min(length, r0 + rows)
                    end = min(source, r1) if causal else source
                    blas.gemm(p[r0:r1, :end], vb[:end], out[b][r0:r1], False, False, 0.0)

    return kernel


def attention_backward_blocks(cast, loop):
    """grad_q[b], grad_k[b], grad_v[b] of the blocks b of (P, H, L, Ev) grad, (P, H, L,
    E) q, (P, H, S, E) k, (P, H, S, Ev) v (Note [Strided blocks]) and (B, L, S) weights
    p, through scratch[t], the (L, S) block of chunk t of the blocks."""

    def kernel(g, q, k, v, p, scale, chunks, scratch, grad_q, grad_k, grad_v):
        blocks, length, source = p.shape
        heads = q.shape[1]
        size = (blocks + chunks - 1) // chunks
        factor = cast(scale)
        for t in loop(chunks):
            d = scratch[t]
            for b in range(t * size, min(blocks, (t + 1) * size)):
                batch, head = b // heads, b % heads
                weights, gb = p[b], g[batch, head]
                blas.gemm(weights, gb, grad_v[b], True, False, 0.0)
                blas.gemm(gb, v[batch, head], d, False, True, 0.0)
                for i in range(length):
                    row, w = d[i], weights[i]
                    total = cast(0.0)
                    for j in range(source):
                        total += row[j] * w[j]
                    for j in range(source):
                        row[j] = w[j] * (row[j] - total) * factor
                blas.gemm(d, k[batch, head], grad_q[b], False, False, 0.0)
                blas.gemm(d, q[batch, head], grad_k[b], True, False, 0.0)

    return kernel


def _additive_mask(attn_mask, lead, length, source, dtype):
    """(mask (M, L, S) to add, block (B,): the mask of each (batch, head) block): a
    boolean mask as 0 where True and -inf elsewhere, broadcast along its own axes only
    (M the product of its leading ones)."""
    blocks = math.prod(lead)
    if attn_mask is None:
        return np.zeros((1, length, source), dtype), np.zeros(blocks, np.int64)
    m = attn_mask._data
    if m.dtype == np.bool_:
        m = np.where(m, dtype.type(0), dtype.type(-np.inf))
    m = m.reshape((1,) * (len(lead) + 2 - m.ndim) + m.shape)
    own = m.shape[:-2]
    full = np.ascontiguousarray(np.broadcast_to(m, (*own, length, source)))
    index = np.broadcast_to(np.arange(math.prod(own)).reshape(own), lead)
    return full.reshape(-1, length, source), np.ascontiguousarray(index).reshape(-1)


def _blocks(a):
    """a (..., R, C) as (P, H, R, C) blocks, H its last leading axis (one if none): a
    view where the BLAS reads each block in place, else a C-contiguous copy.

    Note [Strided blocks]: the BLAS takes a matrix whose columns are adjacent and whose
    rows lie at least a row apart, at any distance: MultiheadAttention's heads, views
    (N, H, L, D) of one projection (N, L, 3, H, D), are such blocks. Their copies were
    0.3 ms of 2.0 in the forward at batch 8, 4 heads, 128 x 64 (one thread)."""
    heads = a.shape[-3] if a.ndim > 2 else 1
    a = a.reshape(-1, heads, *a.shape[-2:])  # a view, or a copy where none is possible
    row, column = a.strides[-2:]
    if column != a.itemsize or row < a.shape[-1] * a.itemsize or row % a.itemsize:
        a = np.ascontiguousarray(a)
    return a


def native_scaled_dot_product_attention(
    ks, query, key, value, attn_mask, is_causal, scale, need_weights
):
    q, k, v = (t._data for t in (query, key, value))
    if not (q.size and k.size and v.size) or not blas.available():
        decomposed = DECOMPOSITIONS["native_scaled_dot_product_attention"]
        return decomposed(ks, query, key, value, attn_mask, is_causal, scale, need_weights)
    *lead, length, _ = q.shape
    source, dtype = k.shape[-2], q.dtype
    blocks = math.prod(lead)
    q, k, v = (_blocks(a) for a in (q, k, v))
    mask, mask_block = _additive_mask(attn_mask, tuple(lead), length, source, dtype)
    work = blocks * length * source
    chunks = min(blocks, max(1, threads.get_num_threads())) if work >= _parallel_min else 1
    scores = np.empty((blocks if need_weights else chunks, length, source), dtype)
    out = np.empty((blocks, length, v.shape[-1]), dtype)
    _entry(dtype, work >= _parallel_min)(
        q, k, v, mask, mask_block, is_causal, scale, chunks, need_weights, scores, out
    )
    weights = scores.reshape(*lead, length, source) if need_weights else np.empty(0, dtype)
    return from_array(out.reshape(*lead, length, v.shape[-1])), from_array(weights)


def native_scaled_dot_product_attention_backward(ks, grad, query, key, value, weights, scale):
    # internal callers do not run the operator's check: the kernel reads by these shapes
    meta.attention_backward(grad, query, key, value, weights, scale)
    p = weights._data
    if not (p.size and query.shape[-1] and value.shape[-1]) or not blas.available():
        decomposed = DECOMPOSITIONS["native_scaled_dot_product_attention_backward"]
        return decomposed(ks, grad, query, key, value, weights, scale)
    *lead, length, source = p.shape
    blocks, dtype = math.prod(lead), p.dtype
    g, q, k, v = (_blocks(t._data) for t in (grad, query, key, value))
    p = np.ascontiguousarray(p).reshape(blocks, length, source)
    work = blocks * length * source
    chunks = min(blocks, max(1, threads.get_num_threads())) if work >= _parallel_min else 1
    scratch = np.empty((chunks, length, source), dtype)
    grads = [np.empty((blocks, *t.shape[-2:]), dtype) for t in (query, key, value)]
    _backward_entry(dtype, work >= _parallel_min)(g, q, k, v, p, scale, chunks, scratch, *grads)
    return tuple(from_array(x.reshape(t._shape)) for x, t in zip(grads, (query, key, value)))


def _backward_entry(dtype, parallel):
    loop = jit.prange if parallel else range

    def build():
        t, a3, blocks = jit.types, jit.array(dtype, 3), jit.array(dtype, 4, "A")
        signature = t.void(*[blocks] * 4, a3, t.float64, t.int64, a3, a3, a3, a3)
        kernel = attention_backward_blocks(np.float32 if dtype == np.float32 else float, loop)
        return jit.compile_kernel(kernel, signature, parallel=parallel, fastmath=jit.REASSOCIATE)

    return jit.cached((attention_backward_blocks, dtype, loop), build)


def _entry(dtype, parallel):
    loop = jit.prange if parallel else range

    def build():
        t, a3, blocks = jit.types, jit.array(dtype, 3), jit.array(dtype, 4, "A")
        signature = t.void(
            *[blocks] * 3, a3, jit.array(np.int64), t.boolean, t.float64, t.int64, t.boolean, a3, a3
        )
        exp, cast = (K.float32_exp, np.float32) if dtype == np.float32 else (K.float64_exp, float)
        kernel = attention_blocks(exp, cast, loop)
        return jit.compile_kernel(kernel, signature, parallel=parallel, fastmath=jit.REASSOCIATE)

    return jit.cached((attention_blocks, dtype, loop), build)


KERNELS = {
    "native_scaled_dot_product_attention": native_scaled_dot_product_attention,
    "native_scaled_dot_product_attention_backward": native_scaled_dot_product_attention_backward,
}


def register(registry):
    for name, fn in KERNELS.items():
        registry.register(name, "cpu", fn)
