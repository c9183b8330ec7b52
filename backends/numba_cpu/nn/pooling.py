"""Pooling: max and min (with argmax indices), average, adaptive average, and their
backward operators (scatter and gather through the indices, the adjoint of average
pooling).

Note [Pooling kernels]: the windows of one axis are tables (windows.py), so no kernel
tests a bound per element. In NHWC the innermost loop runs over the contiguous channels
of one input pixel (it vectorizes for any window shape); in NCHW it runs over the
output columns of one output row for one kernel tap, ``ow * stride + offset`` (it
vectorizes for pooling with a uniform stride). The kernels with no NCHW form (adaptive
windows, the backward ones) run on NCHW data as NHWC kernels on the (N C, H, W, 1)
view: planes become images of one channel.

Max and min pooling keep PyTorch's tie and NaN rules: taps are visited row by row,
the first extreme wins, a NaN always replaces (so the last NaN's index is kept); an
index is the flat position ``ih * W + iw`` in the input plane, whatever the layout.
"""

import functools
import math

import numpy as np

from lamina.backends import jit, threads
from lamina.backends.jit import jitable
from lamina.dispatch.meta import pool_output_size
from lamina.dispatch.tensor import from_array

from .. import vectors as v
from .layout import NCHW, NHWC, image, in_layout, logical
from .windows import adaptive_windows, avg_scale, windows

_parallel_min = float("inf")  # Note [Parallel threshold] (lamina.backends.threads)
_CHUNKS = 64  # blocks of output rows a parallel loop shares out, each with a work row


def _set_threshold(threshold):
    global _parallel_min
    _parallel_min = threshold


threads.on_change(_set_threshold)


@jitable
def greater(v, best):
    return v > best


@jitable
def less(v, best):
    return v < best


# the folds and finishes of separable_nchw


@jitable
def add(total, v):
    return total + v


@jitable
def fold_max(best, v):
    return v if greater(v, best) | (v != v) else best


@jitable
def fold_min(best, v):
    return v if less(v, best) | (v != v) else best


@jitable
def scaled(total, scale):
    return total * scale


@jitable
def unscaled(total, scale):
    return total


# ---------------------------------------------------------------- templates


# Note [Extremes in registers]: NHWC max and min pooling keeps each whole vector of
# channels' running extreme in a register through the window's taps (``vectors.fold_max``:
# PyTorch's rule, ``better | NaN``), stored once per output pixel; with indices, the
# number of the tap that gave it in another register (``vectors.taken_max``, the tap
# numbers as floats: exact), turned into input positions once per output pixel. The
# loop this replaces kept both in the output rows, loaded, selected and stored back at
# every tap, and LLVM made those selects masked stores, which AMD's CPUs run slowly.
# Measured one thread, float32, 32 images, on a Zen 3 VM (AVX2), before -> after
# (PyTorch channels-last), ms: 3 x 3 stride 2 on 32 channels of 32 x 32 2.43 -> 0.97
# (0.91), with indices 3.74 -> 0.76 (0.67); 3 x 3 stride 1 on 112 of 8 x 8 1.02 ->
# 0.65 (0.45), with indices 1.99 -> 0.55 (0.31); 2 x 2 stride 2 on 16 of 64 x 64 with
# indices 3.80 -> 1.46 (1.95). NCHW pooling with indices on small planes runs this
# kernel too (Note [NCHW indices]). The channels after the last whole vector run one
# by one.


def pool_nhwc(better, with_indices, loop):
    """x (N, H, W, C) -> out (and idx) (N, Ho, Wo, C), max or min pooling, one output
    row per job (Note [Extremes in registers]), from ``start``'s value, with the
    window's tap numbers and positions from ``_by_taps``."""
    _, fold, taken = _FOLDS[better]

    def kernel(x, out, idx, first_h, count_h, dh, first_w, count_w, dw, start, taps, offsets):
        h, w, c, ho, wo = x.shape[1], x.shape[2], x.shape[3], out.shape[1], out.shape[2]
        lanes, kw = v.lanes(x), taps.shape[1]
        vectors = c - c % lanes
        for job in loop(x.shape[0] * ho):
            n, oh = job // ho, job % ho
            fh = first_h[oh]
            found = np.empty(vectors if with_indices else 0, x.dtype)  # the taps that won
            for ow in range(wo):
                fw, cw, at = first_w[ow], count_w[ow], (job * wo + ow) * c
                for k in range(0, vectors, lanes):
                    best, where = v.splat(start, 0), v.splat(taps, 0)
                    for a in range(count_h[oh]):
                        row = (n * h + fh + a * dh) * w + fw
                        for b in range(cw):
                            value = v.load(x, (row + b * dw) * c + k)
                            if with_indices:
                                where = taken(best, value, where, v.splat(taps, a * kw + b))
                            best = fold(best, value)
                    v.store(out, at + k, best)
                    if with_indices:
                        v.store(found, k, where)
                for k in range(found.size):  # the winning taps' input positions
                    idx[n, oh, ow, k] = fh * w + fw + offsets[int(found[k])]
                for k in range(vectors, c):
                    extreme, position = start[0], fh * w + fw
                    for a in range(count_h[oh]):
                        ih = fh + a * dh
                        for b in range(cw):
                            iw = fw + b * dw
                            value = x[n, ih, iw, k]
                            take = better(value, extreme) | (value != value)
                            extreme = value if take else extreme
                            position = ih * w + iw if take else position
                    out[n, oh, ow, k] = extreme
                    if with_indices:
                        idx[n, oh, ow, k] = position

    return kernel


def separable_nchw(fold, finish, kw, sw, dw, loop):
    """Pooling of x (planes, H, W) into out (planes, Ho, Wo) whose window value is a
    fold of its taps (a sum, a max): first the window's rows folded into one row
    (contiguous loops that vectorize), then the ``kw`` taps of that row, ``sw`` and
    ``dw`` apart (compile-time constants: the tap loop unrolls), folded per output and
    ``finish``ed with its ``scale`` entry (average pooling's 1 / divisor). Folding each
    tap straight into the output row took kh * kw strided passes over it: on
    16 x 64 x 56 x 56, 3x3 stride 2, one thread, average pooling 4.4 -> 2.8 ms and max
    pooling 6.4 -> 3.2 ms. ``rows`` is a (chunks, (Wo - 1) * sw + (kw - 1) * dw + 1)
    work area filled with ``init`` (the fold's identity), one row per chunk of output
    rows; its columns start at input column -pw, and the ones outside the input keep
    ``init``. max pooling's fold is pool_nhwc's (a NaN wins): the values are the same."""

    def kernel(x, out, first_h, count_h, dh, pw, init, scale, rows):
        planes, w = x.shape[0], x.shape[2]
        ho, wo = out.shape[1], out.shape[2]
        chunks, span = rows.shape
        inside = min(w, span - pw)  # the input columns some window covers
        jobs = planes * ho
        for chunk in loop(chunks):
            row = rows[chunk]
            for job in range(chunk * jobs // chunks, (chunk + 1) * jobs // chunks):
                p, oh = job // ho, job % ho
                fh, count = first_h[oh], count_h[oh]
                if count == 0:
                    for j in range(inside):
                        row[pw + j] = init
                else:
                    first = x[p, fh]
                    for j in range(inside):
                        row[pw + j] = first[j]
                for a in range(1, count):
                    src = x[p, fh + a * dh]
                    for j in range(inside):
                        row[pw + j] = fold(row[pw + j], src[j])
                orow, srow = out[p, oh], scale[oh]
                for ow in range(wo):
                    total = row[ow * sw]
                    for b in range(1, kw):
                        total = fold(total, row[ow * sw + b * dw])
                    orow[ow] = finish(total, srow[ow])

    return kernel


def pool_nchw(better, kw, sw, dw, loop):
    """Max or min pooling with indices of x (planes, H, W) into out and idx (planes,
    Ho, Wo), output row by output row: each window row is copied into a work row
    (``rows``: as in separable_nchw, its columns start at input column -pw and the
    ones outside the input keep ``init``), its ``kw`` taps folded per output (the tap
    loop unrolls) into ``vals`` and their input columns into ``cols``, and those folded
    into the output row (contiguous loops). Taps are folded in pool_nhwc's order --
    along the window's rows first, then down them -- with its rules (the first
    extreme wins, a NaN replaces), so the indices are the same; a padding column holds
    ``init`` and is never taken, so a window of ``init`` values keeps its first input
    position."""

    def kernel(x, out, idx, first_h, count_h, dh, first_w, pw, init, rows, vals, cols):
        planes, w = x.shape[0], x.shape[2]
        ho, wo = out.shape[1], out.shape[2]
        chunks, span = rows.shape
        inside = min(w, span - pw)
        jobs = planes * ho
        for chunk in loop(chunks):
            row, val, col = rows[chunk], vals[chunk], cols[chunk]
            for job in range(chunk * jobs // chunks, (chunk + 1) * jobs // chunks):
                p, oh = job // ho, job % ho
                fh, orow, irow = first_h[oh], out[p, oh], idx[p, oh]
                for ow in range(wo):  # an empty window (count_h 0) keeps these
                    orow[ow] = init
                    irow[ow] = fh * w + first_w[ow]
                for a in range(count_h[oh]):
                    ih = fh + a * dh
                    src = x[p, ih]
                    for j in range(inside):
                        row[pw + j] = src[j]
                    for ow in range(wo):
                        best, at = init, first_w[ow]
                        for b in range(kw):
                            v = row[ow * sw + b * dw]
                            take = better(v, best) | (v != v)
                            best = v if take else best
                            at = ow * sw - pw + b * dw if take else at
                        val[ow], col[ow] = best, at
                    base = ih * w
                    for ow in range(wo):
                        v, cur = val[ow], orow[ow]
                        take = better(v, cur) | (v != v)
                        orow[ow] = v if take else cur
                        irow[ow] = base + col[ow] if take else irow[ow]

    return kernel


def _work_rows(jobs, wo, kw, sw, dw, init, dtype):
    """The NCHW kernels' work rows, one per chunk of ``jobs`` output rows, filled with
    ``init``: (chunks, span of the input columns one output row's windows cover)."""
    span = max((wo - 1) * sw + (kw - 1) * dw + 1, 1)
    return np.full((max(min(jobs, _CHUNKS), 1), span), init, dtype)


def _separable(x, out, fold, finish, kernel_size, stride, padding, dilation, init, scale):
    """Run separable_nchw over NCHW x into out (the planes of both)."""
    (n, c, h, w), (ho, wo) = x.shape, out.shape[2:]
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, padding, dilation
    fh, ch = windows(h, ho, kh, sh, ph, dh)
    rows = _work_rows(n * c * ho, wo, kw, sw, dw, init, x.dtype)
    planes = (x.reshape(n * c, h, w), out.reshape(n * c, ho, wo))
    args = (*planes, fh, ch, dh, pw, init, scale, rows)
    _run(separable_nchw, (fold, finish, kw, sw, dw), x.dtype, x.size, *args)


def avg_nhwc(loop):
    """Average pooling over any windows, x (N, H, W, C) -> out (N, Ho, Wo, C)."""

    def kernel(x, out, first_h, count_h, first_w, count_w, scale):
        c, ho, wo = x.shape[3], out.shape[1], out.shape[2]
        for job in loop(x.shape[0] * ho):
            n, oh = job // ho, job % ho
            for ow in range(wo):
                o = out[n, oh, ow]
                for k in range(c):
                    o[k] = 0
                for a in range(count_h[oh]):
                    for b in range(count_w[ow]):
                        src = x[n, first_h[oh] + a, first_w[ow] + b]
                        for k in range(c):
                            o[k] += src[k]
                s = scale[oh, ow]
                for k in range(c):
                    o[k] *= s

    return kernel


def avg_backward_nhwc(loop):
    """The adjoint of avg_nhwc: gx[window] += g * scale; one image per job (windows of
    an image overlap, images never do)."""

    def kernel(g, gx, first_h, count_h, first_w, count_w, scale):
        c, ho, wo = g.shape[3], g.shape[1], g.shape[2]
        for n in loop(g.shape[0]):
            for oh in range(ho):
                for ow in range(wo):
                    src, s = g[n, oh, ow], scale[oh, ow]
                    for a in range(count_h[oh]):
                        for b in range(count_w[ow]):
                            dst = gx[n, first_h[oh] + a, first_w[ow] + b]
                            for k in range(c):
                                dst[k] += src[k] * s

    return kernel


def scatter(loop):
    """gx[n, idx[n, j, k], k] += g[n, j, k] over (N, positions, C) views, each image of
    gx zeroed first by the thread that scatters into it; returns the count of indices
    outside [0, positions of gx), which it skips. Checking them here, not in NumPy
    before, and zeroing here, not in np.zeros, saves three serial passes over 16 MB
    (VGG's first pooling at batch 64): 2.6 ms of a two-thread training step."""

    def kernel(g, idx, gx):
        positions, outside = gx.shape[1], 0
        for n in loop(g.shape[0]):
            gx[n] = 0
            for j in range(g.shape[1]):
                for k in range(g.shape[2]):
                    i = idx[n, j, k]
                    if 0 <= i < positions:
                        gx[n, i, k] += g[n, j, k]
                    else:
                        outside += 1
        return outside

    return kernel


def gather(loop):
    """out[n, j, k] = x[n, idx[n, j, k], k] over (N, positions, C) views."""

    def kernel(x, idx, out):
        for n in loop(out.shape[0]):
            for j in range(out.shape[1]):
                for k in range(out.shape[2]):
                    out[n, j, k] = x[n, idx[n, j, k], k]

    return kernel


def _signature(template, dtype):
    """``template``'s kernel signature: every kernel returns nothing but ``scatter``,
    which returns the count of indices it skipped."""
    _I, _X, void = jit.types.int64, jit.index(), jit.types.void
    a = {d: jit.array(dtype, d) for d in (1, 2, 3, 4)}
    i = {d: jit.array(np.int64, d) for d in (2, 3, 4)}
    scalar = jit.array(dtype, 1).dtype
    scale = jit.array(dtype, 2)
    return {
        pool_nhwc: void(a[4], a[4], i[4], _X, _X, _I, _X, _X, _I, a[1], a[2], _X),
        separable_nchw: void(a[3], a[3], _X, _X, _I, _I, scalar, scale, scale),
        pool_nchw: void(a[3], a[3], i[3], _X, _X, _I, _X, _I, scalar, scale, scale, i[2]),
        avg_nhwc: void(a[4], a[4], _X, _X, _X, _X, scale),
        avg_backward_nhwc: void(a[4], a[4], _X, _X, _X, _X, scale),
        scatter: _I(a[3], i[3], a[3]),
        gather: void(a[3], i[3], a[3]),
    }[template]


def _run(template, fns, dtype, size, *args):
    """Run ``template(*fns, loop)``, compiled once per (functions and constants, dtype,
    loop); returns what it returns (``scatter``'s count, else None)."""
    loop = range if size < _parallel_min else jit.prange

    def build():
        sig = _signature(template, dtype)
        parallel = loop is jit.prange
        return jit.compile_kernel(template(*fns, loop), sig, parallel=parallel, nogil=True)

    return jit.cached((template, fns, dtype, loop), build)(*args)


def _as_nhwc(a, layout):
    """A kernel-order array as NHWC: itself, or NCHW planes as images of one channel."""
    if layout == NHWC:
        return a
    n, c, h, w = a.shape
    return a.reshape(n * c, h, w, 1)


# ---------------------------------------------------------------- max and min

# Note [NCHW indices]: NCHW max and min pooling with indices runs the NHWC kernel on
# transposed copies (an index is a position in the plane, the same in both layouts):
# the NCHW kernel, two passes over each row's taps (values, then the first tap equal
# to the extreme), was 6-9x slower than the NHWC one, whose channel loop vectorizes
# with the index select in it. Measured one thread, forward with indices: 32 x 32 x
# 32 x 32, 3x3 stride 2, 7.2 -> 3.8 ms (PyTorch 8.2); 16 x 64 x 56 x 56 20.7 -> 6.9 ms.
# With several threads the batch's images are split over them (threads.split), each
# part transposing its own images: NumPy's copies run on one thread.
# On big planes pool_nchw runs instead, with no copies: a transposition reads each
# channel's plane in turn, so once a plane is a page (4 KB) or more every read of it is
# on another page, and the copies took most of the time. Measured one thread, float32,
# 32 images of 32 channels, transposed -> pool_nchw, ms: 32 x 32 planes 3.42 -> 2.20
# (3x3 stride 2 padding 1), 8.04 -> 4.25 (3x3 stride 1), 3.04 -> 1.25 (2x2 stride 2);
# 64 x 64: 14.9 -> 8.1, 33.2 -> 13.5, 13.9 -> 3.8; 48 x 48 and 56 x 56 alike but
# for 3x3 stride 2 on 56 x 56, 7.37 -> 8.55. On smaller planes the transposed copies
# stay in the cache and pool_nchw's short rows cost more (28 x 28: 1.14 -> 5.48, 4.55
# -> 5.32, 0.86 -> 2.99). On two threads, VGG's first pool (16 x 64 x 64 planes, 2x2)
# 3.6 -> 1.2 ms.
DIRECT_BYTES = 4096


def _direct_nchw(plane_bytes):
    """Whether NCHW pooling with indices runs pool_nchw (Note [NCHW indices])."""
    return plane_bytes >= DIRECT_BYTES


# better -> its folds: a scalar one, a vector one and the vector one's taken index
_FOLDS = {
    greater: (fold_max, v.fold_max, v.taken_max),
    less: (fold_min, v.fold_min, v.taken_min),
}


@functools.lru_cache(maxsize=64)
def _by_taps(init, kh, kw, row, column, dtype):
    """pool_nhwc's last arguments for a kh x kw window (read only; kept, since
    making them took 3 us of a small call): the extreme's start, each tap's number
    a kw + b as a float of the images' dtype (exact: a window has few taps), and its
    input position from the window's first, a row + b column."""
    a, b = np.divmod(np.arange(kh * kw, dtype=np.int64), kw)
    numbers = np.arange(kh * kw, dtype=dtype).reshape(kh, kw)
    return np.full(1, init, dtype), numbers, a * row + b * column


def _pool(better, init, with_indices):
    """The kernel of max (better = greater) or min pooling, with or without indices."""

    def kernel(ks, input, kernel_size, stride, padding, dilation, ceil_mode):
        x, layout, unbatched = image(input)
        n, c, h, w = input._shape if not unbatched else (1, *input._shape)
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, padding, dilation
        ho = pool_output_size(h, ph, kh, sh, dh, ceil_mode)
        wo = pool_output_size(w, pw, kw, sw, dw, ceil_mode)
        fh, ch = windows(h, ho, kh, sh, ph, dh)
        fw, cw = windows(w, wo, kw, sw, pw, dw)
        shape = (n, ho, wo, c) if layout == NHWC else (n, c, ho, wo)
        out = np.empty(shape, x.dtype)
        idx = np.empty(shape if with_indices else (1,) * 4, np.int64)
        nhwc = (better, with_indices)  # pool_nhwc's template arguments
        if layout == NCHW and not with_indices:
            fold = _FOLDS[better][0]
            unused = np.empty((ho, wo), x.dtype)  # unscaled ignores the scale table
            window = (kernel_size, stride, padding, dilation)
            _separable(x, out, fold, unscaled, *window, init, unused)
        elif layout == NHWC:
            by_taps = _by_taps(init, kh, kw, dh * w, dw, x.dtype)
            _run(pool_nhwc, nhwc, x.dtype, x.size, x, out, idx, fh, ch, dh, fw, cw, dw, *by_taps)
        elif _direct_nchw(h * w * x.itemsize):  # Note [NCHW indices]
            rows = _work_rows(n * c * ho, wo, kw, sw, dw, init, x.dtype)
            vals, cols = (np.empty((len(rows), wo), t) for t in (x.dtype, np.int64))
            planes = (a.reshape(n * c, *a.shape[2:]) for a in (x, out, idx))
            args = (*planes, fh, ch, dh, fw, pw, init, rows, vals, cols)
            _run(pool_nchw, (better, kw, sw, dw), x.dtype, x.size, *args)
        else:
            by_taps = _by_taps(init, kh, kw, dh * w, dw, x.dtype)

            def part(i0, i1):
                xt = np.ascontiguousarray(x[i0:i1].transpose(0, 2, 3, 1))
                out_t, idx_t = (np.empty((i1 - i0, ho, wo, c), a.dtype) for a in (out, idx))
                args = (xt, out_t, idx_t, fh, ch, dh, fw, cw, dw, *by_taps)
                _run(pool_nhwc, nhwc, x.dtype, 0, *args)  # serial: a part of a split
                out[i0:i1], idx[i0:i1] = out_t.transpose(0, 3, 1, 2), idx_t.transpose(0, 3, 1, 2)

            if x.size < _parallel_min:
                part(0, n)
            else:
                threads.split(part, n)
        out = from_array(logical(out, layout, unbatched))
        if not with_indices:
            return out
        return out, from_array(logical(idx, layout, unbatched))

    return kernel


max_pool2d = _pool(greater, -math.inf, False)
min_pool2d = _pool(less, math.inf, False)
max_pool2d_with_indices = _pool(greater, -math.inf, True)
min_pool2d_with_indices = _pool(less, math.inf, True)


def _positions(a, layout):
    """A kernel-order 4-D array as the (N, positions, C) view of the index kernels."""
    a = _as_nhwc(a, layout)
    return a.reshape(a.shape[0], a.shape[1] * a.shape[2], a.shape[3])


def pool2d_scatter(ks, grad, indices, input_shape):
    idx, layout, unbatched = image(indices)
    g = in_layout(grad._data, layout, unbatched)
    n, c, h, w = input_shape if not unbatched else (1, *input_shape)
    gx = np.empty((n, h, w, c) if layout == NHWC else (n, c, h, w), g.dtype)  # zeroed by scatter
    views = (_positions(a, layout) for a in (g, idx, gx))
    if _run(scatter, (), g.dtype, g.size, *views):
        raise ValueError(
            f"pool2d_scatter: indices must be in [0, {h * w}) for input shape {input_shape}"
        )
    return from_array(logical(gx, layout, unbatched))


def pool2d_gather(ks, x, indices):
    idx, layout, unbatched = image(indices)
    data = in_layout(x._data, layout, unbatched)
    h, w = x._shape[-2:]
    if idx.size and (idx.min() < 0 or idx.max() >= h * w):
        raise ValueError(f"pool2d_gather: indices out of range for input shape {x._shape}")
    out = np.empty(idx.shape, data.dtype)
    _run(
        gather,
        (),
        data.dtype,
        out.size,
        _positions(data, layout),
        _positions(idx, layout),
        _positions(out, layout),
    )
    return from_array(logical(out, layout, unbatched))


# ---------------------------------------------------------------- average


def avg_pool2d(ks, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor):
    x, layout, unbatched = image(input)
    n, c, h, w = input._shape if not unbatched else (1, *input._shape)
    (kh, kw), (sh, sw), (ph, pw) = kernel_size, stride, padding
    ho = pool_output_size(h, ph, kh, sh, 1, ceil_mode)
    wo = pool_output_size(w, pw, kw, sw, 1, ceil_mode)
    scale = avg_scale(h, w, ho, wo, kernel_size, stride, padding, count_include_pad, divisor)
    scale = scale.astype(x.dtype)
    if layout == NHWC:
        out = np.empty((n, ho, wo, c), x.dtype)
        fh, ch = windows(h, ho, kh, sh, ph, 1)
        fw, cw = windows(w, wo, kw, sw, pw, 1)
        _run(avg_nhwc, (), x.dtype, x.size, x, out, fh, ch, fw, cw, scale)
    else:
        out = np.empty((n, c, ho, wo), x.dtype)
        window = (kernel_size, stride, padding, (1, 1))
        _separable(x, out, add, scaled, *window, 0.0, scale)
    return from_array(logical(out, layout, unbatched))


def _adaptive_tables(h, w, ho, wo, dtype):
    fh, ch = adaptive_windows(h, ho)
    fw, cw = adaptive_windows(w, wo)
    return fh, ch, fw, cw, (1.0 / np.outer(ch, cw)).astype(dtype)


# Note [Global average pooling]: adaptive pooling to 1 x 1 (the head of Inception and
# ResNet) is each plane's mean: einsum's sum over the plane's pixels, and for the
# backward a broadcast. The window kernels run NCHW planes as images of one channel
# (Note [Pooling kernels]), one pixel at a time: measured on 64 x 128 x 8 x 8 float32,
# one thread, NCHW, forward 2.0 ms -> 0.05 ms (PyTorch 0.055 ms), backward 2.3 -> 0.07.


def _plane_sums(x, layout, n, c, h, w):
    """(n, c): the sum of each image's plane of each channel."""
    if layout == NHWC:
        return np.einsum("npc->nc", x.reshape(n, h * w, c))
    return np.einsum("ncp->nc", x.reshape(n, c, h * w))


def adaptive_avg_pool2d(ks, input, output_size):
    x, layout, unbatched = image(input)
    n, c, h, w = input._shape if not unbatched else (1, *input._shape)
    ho, wo = output_size
    if (ho, wo) == (1, 1):  # Note [Global average pooling]
        means = _plane_sums(x, layout, n, c, h, w) * x.dtype.type(1 / (h * w))
        shape = (n, 1, 1, c) if layout == NHWC else (n, c, 1, 1)
        return from_array(logical(means.reshape(shape), layout, unbatched))
    out = np.empty((n, ho, wo, c) if layout == NHWC else (n, c, ho, wo), x.dtype)
    tables = _adaptive_tables(h, w, ho, wo, x.dtype)
    _run(avg_nhwc, (), x.dtype, x.size, _as_nhwc(x, layout), _as_nhwc(out, layout), *tables)
    return from_array(logical(out, layout, unbatched))


def _avg_backward(grad, input, tables):
    """The adjoint of average pooling, in the input's layout (grad converted to it)."""
    _, layout, unbatched = image(input)
    g = in_layout(grad._data, layout, unbatched)
    n, c, h, w = input._shape if not unbatched else (1, *input._shape)
    gx = np.zeros((n, h, w, c) if layout == NHWC else (n, c, h, w), g.dtype)
    _run(
        avg_backward_nhwc, (), g.dtype, gx.size, _as_nhwc(g, layout), _as_nhwc(gx, layout), *tables
    )
    return from_array(logical(gx, layout, unbatched))


def avg_pool2d_backward(ks, grad, input, kernel_size, stride, padding, ceil_mode, cip, div):
    h, w = input._shape[-2:]
    ho, wo = grad._shape[-2:]
    (kh, kw), (sh, sw), (ph, pw) = kernel_size, stride, padding
    scale = avg_scale(h, w, ho, wo, kernel_size, stride, padding, cip, div)
    tables = (*windows(h, ho, kh, sh, ph, 1), *windows(w, wo, kw, sw, pw, 1))
    return _avg_backward(grad, input, (*tables, scale.astype(grad._data.dtype)))


def adaptive_avg_pool2d_backward(ks, grad, input):
    h, w = input._shape[-2:]
    ho, wo = grad._shape[-2:]
    if (ho, wo) == (1, 1):  # Note [Global average pooling]: every pixel gets g / (h w)
        _, layout, unbatched = image(input)
        g = in_layout(grad._data, layout, unbatched)  # (n, c, 1, 1) or NHWC's (n, 1, 1, c)
        n, c = g.shape[0], g.shape[3 if layout == NHWC else 1]
        gx = np.empty((n, h, w, c) if layout == NHWC else (n, c, h, w), g.dtype)
        np.multiply(g, g.dtype.type(1 / (h * w)), out=gx)
        return from_array(logical(gx, layout, unbatched))
    return _avg_backward(grad, input, _adaptive_tables(h, w, ho, wo, grad._data.dtype))


KERNELS = {
    "max_pool2d": max_pool2d,
    "min_pool2d": min_pool2d,
    "max_pool2d_with_indices": max_pool2d_with_indices,
    "min_pool2d_with_indices": min_pool2d_with_indices,
    "pool2d_scatter": pool2d_scatter,
    "pool2d_gather": pool2d_gather,
    "avg_pool2d": avg_pool2d,
    "avg_pool2d_backward": avg_pool2d_backward,
    "adaptive_avg_pool2d": adaptive_avg_pool2d,
    "adaptive_avg_pool2d_backward": adaptive_avg_pool2d_backward,
}


def register(registry):
    for name, fn in KERNELS.items():
        fn.__name__ = fn.__qualname__ = name
        registry.register(name, "cpu", fn)
