"""resample2d and its adjoint: the sampling behind interpolate (every mode) and
pad's reflect, replicate and circular modes.

Note [Resampling]: output pixel (i, j) reads input rows rows[i, a] and columns
cols[j, b] -- one tap per axis (a copy: nearest, padding) or several weighted ones
(bilinear's two, bicubic's four) -- so the work is one pass over the output, bound by
memory. The tables are
small (one entry per output row and column), computed by lamina.nn.functional.

    NHWC: each output pixel is a contiguous run of channels: the innermost loop copies
          (or weighs) whole pixels, and vectorizes for any table;
    NCHW: each output row first combines its input rows (contiguous,
          vectorized), then gathers its columns from that row; one tap per axis whose
          columns come in long runs (padding's) copies the runs.

The adjoint scatters the same way: per image in NHWC, per plane in NCHW, so a thread
never adds into another's memory. Big calls run their images (planes) on lamina's
threads (prange, Note [Parallel threshold] in lamina.backends.threads).
"""

import numpy as np

from lamina.backends import jit, threads
from lamina.dispatch.tensor import from_array

from .layout import NCHW, NHWC, image, in_layout, logical

_parallel_min = float("inf")  # Note [Parallel threshold] (lamina.backends.threads)
_CHUNKS = 64  # parts of the planes a parallel NCHW loop shares out, each with a work row


def _set_threshold(threshold):
    global _parallel_min
    _parallel_min = threshold


threads.on_change(_set_threshold)


def forward_nhwc(taps, loop):
    def kernel(x, out, rows, cols, rw, cw, work, runs):
        ho, wo = out.shape[1], out.shape[2]
        for n in loop(out.shape[0]):
            for i in range(ho):
                r0 = x[n, rows[i, 0]]
                if taps == 1:
                    for j in range(wo):
                        o, src = out[n, i, j], r0[cols[j, 0]]
                        for k in range(o.size):
                            o[k] = src[k]
                    continue
                if taps == 2:  # bilinear's in one pass (the loop below took 2.8x its time)
                    r1, h0, h1 = x[n, rows[i, 1]], rw[i, 0], rw[i, 1]
                    for j in range(wo):
                        o, w0, w1 = out[n, i, j], cw[j, 0], cw[j, 1]
                        s00, s01 = r0[cols[j, 0]], r0[cols[j, 1]]
                        s10, s11 = r1[cols[j, 0]], r1[cols[j, 1]]
                        for k in range(o.size):
                            top, bottom = w0 * s00[k] + w1 * s01[k], w0 * s10[k] + w1 * s11[k]
                            o[k] = h0 * top + h1 * bottom
                    continue
                across = np.empty(out.shape[3], out.dtype)  # one input row's taps
                for j in range(wo):  # each input row's taps weighed across, then the rows
                    o = out[n, i, j]
                    for a in range(taps):
                        r, h, w0 = x[n, rows[i, a]], rw[i, a], cw[j, 0]
                        first = r[cols[j, 0]]
                        for k in range(o.size):
                            across[k] = w0 * first[k]
                        for b in range(1, taps):
                            src, w = r[cols[j, b]], cw[j, b]
                            for k in range(o.size):
                                across[k] += w * src[k]
                        if a == 0:
                            for k in range(o.size):
                                o[k] = h * across[k]
                        else:
                            for k in range(o.size):
                                o[k] += h * across[k]

    return kernel


def backward_nhwc(taps, loop):
    """The adjoint of forward_nhwc into gx (zeros), one image per job."""

    def kernel(gx, grad, rows, cols, rw, cw, work, runs):
        ho, wo = grad.shape[1], grad.shape[2]
        for n in loop(grad.shape[0]):
            for i in range(ho):
                r0 = gx[n, rows[i, 0]]
                if taps == 1:
                    for j in range(wo):
                        g, dst = grad[n, i, j], r0[cols[j, 0]]
                        for k in range(g.size):
                            dst[k] += g[k]
                    continue
                for j in range(wo):
                    g = grad[n, i, j]
                    for a in range(taps):
                        r = gx[n, rows[i, a]]
                        for b in range(taps):
                            d, weight = r[cols[j, b]], rw[i, a] * cw[j, b]
                            for k in range(g.size):
                                d[k] += weight * g[k]

    return kernel


def forward_nchw(taps, loop):
    """Planes x (P, H, W) -> out (P, Ho, Wo); ``work`` holds one row per chunk."""

    def kernel(x, out, rows, cols, rw, cw, work, runs):
        planes, ho, wo = out.shape[0], out.shape[1], out.shape[2]
        chunks = work.shape[0]
        for chunk in loop(chunks):
            row = work[chunk]
            for p in range(chunk * planes // chunks, (chunk + 1) * planes // chunks):
                for i in range(ho):
                    orow = out[p, i]
                    if taps == 1 and runs.shape[0]:
                        src = x[p, rows[i, 0]]
                        for r in range(runs.shape[0]):
                            d0, s0, length = runs[r, 0], runs[r, 1], runs[r, 2]
                            dst, run = orow[d0 : d0 + length], src[s0 : s0 + length]
                            for k in range(length):
                                dst[k] = run[k]
                        continue
                    if taps == 1:
                        src = x[p, rows[i, 0]]
                        for j in range(wo):
                            orow[j] = src[cols[j, 0]]
                        continue
                    # the output row's input rows combined into one, then its columns
                    first, h = x[p, rows[i, 0]], rw[i, 0]
                    for k in range(row.size):
                        row[k] = h * first[k]
                    for a in range(1, taps):
                        r, h = x[p, rows[i, a]], rw[i, a]
                        for k in range(row.size):
                            row[k] += h * r[k]
                    for j in range(wo):
                        v = cw[j, 0] * row[cols[j, 0]]
                        for b in range(1, taps):
                            v += cw[j, b] * row[cols[j, b]]
                        orow[j] = v

    return kernel


def backward_nchw(taps, loop):
    """The adjoint of forward_nchw into gx (zeros)."""

    def kernel(gx, grad, rows, cols, rw, cw, work, runs):
        planes, ho, wo = grad.shape[0], grad.shape[1], grad.shape[2]
        chunks = work.shape[0]
        for chunk in loop(chunks):
            row = work[chunk]
            for p in range(chunk * planes // chunks, (chunk + 1) * planes // chunks):
                for i in range(ho):
                    g = grad[p, i]
                    if taps == 1:
                        dst = gx[p, rows[i, 0]]
                        for j in range(wo):
                            dst[cols[j, 0]] += g[j]
                        continue
                    for k in range(row.size):
                        row[k] = 0
                    for j in range(wo):
                        for b in range(taps):
                            row[cols[j, b]] += cw[j, b] * g[j]
                    for a in range(taps):
                        r, h = gx[p, rows[i, a]], rw[i, a]
                        for k in range(row.size):
                            r[k] += h * row[k]

    return kernel


def _run(template, taps, images, other, rows, cols, rw, cw, layout):
    """Run ``template`` over kernel-order ``images`` (read or written: x or gx) and
    ``other`` (out or grad)."""
    dtype, big = images.dtype, max(images.size, other.size) >= _parallel_min
    loop = jit.prange if big else range
    if layout == NHWC:
        work = np.empty((1, 1), dtype)
    else:  # planes: (N C, H, W)
        n, c = images.shape[:2]
        images, other = (a.reshape(n * c, *a.shape[2:]) for a in (images, other))
        work = np.empty(
            (max(min(images.shape[0], _CHUNKS if big else 1), 1), images.shape[2]), dtype
        )
    a, i2, t = jit.array(dtype, 3 if layout != NHWC else 4), jit.index(2), jit.types
    w2 = jit.array(dtype, 2)

    def build():
        sig = t.void(a, a, i2, i2, w2, w2, w2, i2)
        return jit.compile_kernel(template(taps, loop), sig, parallel=big, nogil=True)

    kernel = jit.cached((template, taps, dtype, loop), build)
    runs = _runs(cols) if taps == 1 and layout != NHWC and template is forward_nchw else _NO_RUNS
    kernel(images, other, rows, cols, rw, cw, work, runs)


_NO_RUNS = np.empty((0, 3), np.int64)


def _runs(cols):
    """(output column, input column, length) of each run of consecutive input columns
    in a one-tap table, where the runs are long enough to copy as runs (padding's
    tables: one long run and short ones at the edges), else none (nearest's)."""
    table = cols[:, 0]
    starts = np.flatnonzero(np.diff(table, prepend=table[0] - 2) != 1)
    if 4 * len(starts) > len(table):
        return _NO_RUNS
    lengths = np.diff(np.append(starts, len(table)))
    return np.ascontiguousarray(np.stack([starts, table[starts], lengths], axis=1))


_TEMPLATES = {
    (NHWC, False): forward_nhwc,
    (NHWC, True): backward_nhwc,
    (NCHW, False): forward_nchw,
    (NCHW, True): backward_nchw,
}


def _tables(rows, cols, row_weights, col_weights, h, w, dtype):
    """The index tables, checked against the input's size (the kernels do not
    bounds-check), and the weights (unused 1 x 1 arrays without)."""
    rows, cols = rows._data, cols._data
    for name, table, size in (("rows", rows, h), ("cols", cols, w)):
        if table.size and (table.min() < 0 or table.max() >= size):
            raise ValueError(f"resample2d: {name} must be in [0, {size}), got values outside")
    rows, cols = np.ascontiguousarray(rows), np.ascontiguousarray(cols)
    if row_weights is None:
        unused = np.zeros((1, 1), dtype)
        return rows, cols, unused, unused, 1
    weights = (np.ascontiguousarray(t._data) for t in (row_weights, col_weights))
    return rows, cols, *weights, rows.shape[1]


def resample2d(ks, input, rows, cols, row_weights, col_weights):
    x, layout, unbatched = image(input)
    h, w = input._shape[-2:]
    rows, cols, rw, cw, taps = _tables(rows, cols, row_weights, col_weights, h, w, x.dtype)
    n, c = x.shape[0], input._shape[-3]
    ho, wo = rows.shape[0], cols.shape[0]
    out = np.empty((n, ho, wo, c) if layout == NHWC else (n, c, ho, wo), x.dtype)
    if out.size and x.size:
        _run(_TEMPLATES[layout, False], taps, x, out, rows, cols, rw, cw, layout)
    return from_array(logical(out, layout, unbatched))


def resample2d_backward(ks, grad, rows, cols, row_weights, col_weights, input):
    _, layout, unbatched = image(input)
    g = in_layout(grad._data, layout, unbatched)
    n, c, h, w = input._shape if not unbatched else (1, *input._shape)
    rows, cols, rw, cw, taps = _tables(rows, cols, row_weights, col_weights, h, w, g.dtype)
    gx = np.zeros((n, h, w, c) if layout == NHWC else (n, c, h, w), g.dtype)
    if g.size:
        _run(_TEMPLATES[layout, True], taps, gx, g, rows, cols, rw, cw, layout)
    return from_array(logical(gx, layout, unbatched))


KERNELS = {"resample2d": resample2d, "resample2d_backward": resample2d_backward}


def register(registry):
    for name, fn in KERNELS.items():
        registry.register(name, "cpu", fn)
