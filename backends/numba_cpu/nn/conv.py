"""conv2d, its two backward operators, and linear: blocked im2col + BLAS GEMMs.

Note [Convolution]: a convolution is a GEMM over the "im2col" matrix, whose row (NHWC)
or column (NCHW) for an output pixel holds the kH x kW x C_in input values under the
kernel. Materializing it whole costs 9x the input's memory for a 3x3 kernel (115 MB
for 16x64x56x56), so the kernels build it one block of output pixels at a time, small
enough to stay in the L2 cache (``BLOCK_BYTES``), and hand each block to BLAS through
NumPy's matmul; padding is written as zeros while copying, never materialized. A 1x1
convolution with stride 1 and no padding needs no im2col: the input is the matrix.

    NHWC: out[pixels, C_out] = cols[pixels, kH kW C_in] @ W[kH kW C_in, C_out]
    NCHW: out[n][C_out, pixels] = W[C_out, C_in kH kW] @ cols[C_in kH kW, pixels]

Measured on 16x64x56x56 float32, 64 -> 64 channels, 3x3, padding 1, 2 threads (the
README's table has the full comparison): a direct Numba loop vectorized over output
channels 70 ms (its accumulators live in memory: 53 GFLOP/s), one whole im2col matrix
and one GEMM about 4x slower than the blocks, blocked im2col + GEMM ~21 ms in NHWC and
~25 ms in NCHW (GEMMs at ~190 GFLOP/s, the im2col copies about 10%). The backward
operators reuse the blocks: the weight gradient is the sum over blocks of
cols^T @ grad, the input gradient scatters W^T @ grad back through the adjoint of
im2col (col2im). The im2col blocks are not saved for backward: rebuilding one costs
about a tenth of its GEMM, keeping them all would cost 9x the input's memory.

Groups run as one GEMM per group on that group's channels (a column slice of the
matrices, which BLAS takes as it is).
"""

import numpy as np
from numba import types

from lamina.backends import jit
from lamina.dispatch.tensor import from_array

from .layout import NHWC, empty_image, image, in_layout, logical, zeros_image
from .windows import tap_ranges

BLOCK_BYTES = 1 << 20  # one im2col block: about half of a core's L2 cache


# ---------------------------------------------------------------- im2col kernels
# Output pixel p is (n, oh, ow) in row-major order; input row ih = oh * sh - pt + i * dh
# for kernel row i, column iw = ow * sw - pl + j * dw for kernel column j.


def _im2col_nhwc(x, c0, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, p0, p1, cols):
    """cols[p - p0, (i * kw + j) * cin + c] = x[n, ih, iw, c0 + c] (0 outside)."""
    h, w = x.shape[1], x.shape[2]
    for p in range(p0, p1):
        n, r = p // (ho * wo), p % (ho * wo)
        oh, ow = r // wo, r % wo
        row = cols[p - p0]
        for i in range(kh):
            ih = oh * sh - pt + i * dh
            for j in range(kw):
                iw = ow * sw - pl + j * dw
                base = (i * kw + j) * cin
                if 0 <= ih < h and 0 <= iw < w:
                    src = x[n, ih, iw]
                    for c in range(cin):
                        row[base + c] = src[c0 + c]
                else:
                    for c in range(cin):
                        row[base + c] = 0


def _col2im_nhwc(cols, gx, c0, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, p0, p1):
    """The adjoint of _im2col_nhwc: gx[n, ih, iw, c0 + c] += cols[...]."""
    h, w = gx.shape[1], gx.shape[2]
    for p in range(p0, p1):
        n, r = p // (ho * wo), p % (ho * wo)
        oh, ow = r // wo, r % wo
        row = cols[p - p0]
        for i in range(kh):
            ih = oh * sh - pt + i * dh
            if not 0 <= ih < h:
                continue
            for j in range(kw):
                iw = ow * sw - pl + j * dw
                if 0 <= iw < w:
                    dst = gx[n, ih, iw]
                    base = (i * kw + j) * cin
                    for c in range(cin):
                        dst[c0 + c] += row[base + c]


def _im2col_nchw(x, n, c0, cin, kh, kw, sh, sw, pt, pl, dh, dw, wo, oh0, oh1, lo_, hi_, cols):
    """cols[(c * kh + i) * kw + j, (oh - oh0) * wo + ow] = x[n, c0 + c, ih, iw] (0
    outside), for output rows [oh0, oh1) of image n: each destination row is a strided
    copy of one input row between two runs of zeros (the output columns [lo_[j], hi_[j])
    of kernel column j fall inside the input: windows.tap_ranges), without a test per
    element."""
    h = x.shape[2]
    for c in range(cin):
        plane = x[n, c0 + c]
        for i in range(kh):
            for j in range(kw):
                row = cols[(c * kh + i) * kw + j]
                off = j * dw - pl
                lo, hi = lo_[j], hi_[j]
                for oh in range(oh0, oh1):
                    ih = oh * sh - pt + i * dh
                    dst = (oh - oh0) * wo
                    if ih < 0 or ih >= h:
                        for ow in range(wo):
                            row[dst + ow] = 0
                        continue
                    src = plane[ih]
                    for ow in range(lo):
                        row[dst + ow] = 0
                    for ow in range(lo, hi):
                        row[dst + ow] = src[ow * sw + off]
                    for ow in range(hi, wo):
                        row[dst + ow] = 0


def _col2im_nchw(cols, gx, n, c0, cin, kh, kw, sh, sw, pt, pl, dh, dw, wo, oh0, oh1, lo_, hi_):
    """The adjoint of _im2col_nchw: gx[n, c0 + c, ih, iw] += cols[...]."""
    h = gx.shape[2]
    for c in range(cin):
        plane = gx[n, c0 + c]
        for i in range(kh):
            for j in range(kw):
                row = cols[(c * kh + i) * kw + j]
                off = j * dw - pl
                lo, hi = lo_[j], hi_[j]
                for oh in range(oh0, oh1):
                    ih = oh * sh - pt + i * dh
                    if 0 <= ih < h:
                        dst = plane[ih]
                        src = (oh - oh0) * wo
                        for ow in range(lo, hi):
                            dst[ow * sw + off] += row[src + ow]


_I = types.int64
_SIGNATURES = {
    # (x or gx: 4-D, group channels and geometry: 11 ints, then the rest)
    _im2col_nhwc: lambda a4, a2: types.void(a4, *[_I] * 14, a2),
    _col2im_nhwc: lambda a4, a2: types.void(a2, a4, *[_I] * 14),
    _im2col_nchw: lambda a4, a2: types.void(a4, *[_I] * 14, jit.INDEX, jit.INDEX, a2),
    _col2im_nchw: lambda a4, a2: types.void(a2, a4, *[_I] * 14, jit.INDEX, jit.INDEX),
}


def _kernel(pyfunc, dtype):
    def build():
        sig = _SIGNATURES[pyfunc](jit.array(dtype, 4), jit.array(dtype, 2))
        return jit.compile_kernel(pyfunc, sig)

    return jit.cached((pyfunc, dtype), build)


# ---------------------------------------------------------------- geometry


class Geometry:
    """The shapes of one convolution: input (n, c, h, w), weight (c_out, c_in per
    group, kh, kw), output (ho, wo), the canonical stride, padding and dilation."""

    def __init__(self, input_shape, weight_shape, stride, padding, dilation, groups):
        n, self.c, self.h, self.w = input_shape if len(input_shape) == 4 else (1, *input_shape)
        self.n = n
        self.c_out, self.cin, self.kh, self.kw = weight_shape
        self.sh, self.sw = stride
        self.pt, self.pb, self.pl, self.pr = padding
        self.dh, self.dw = dilation
        self.groups = groups
        self.cout = self.c_out // groups  # output channels per group
        self.ho = (self.h + self.pt + self.pb - self.dh * (self.kh - 1) - 1) // self.sh + 1
        self.wo = (self.w + self.pl + self.pr - self.dw * (self.kw - 1) - 1) // self.sw + 1
        self.k = self.cin * self.kh * self.kw  # the GEMM's inner dimension, per group
        self.pointwise = (self.kh, self.kw, self.sh, self.sw) == (1, 1, 1, 1) and not any(padding)

    def columns(self):
        """(lo, hi) per kernel column: the output columns it reads inside the input."""
        return tap_ranges(self.w, self.wo, self.kw, self.sw, self.pl, self.dw)

    def args(self):
        """The geometry arguments of the im2col kernels after (c0, cin)."""
        return (self.kh, self.kw, self.sh, self.sw, self.pt, self.pl, self.dh, self.dw)

    def block_pixels(self, itemsize):
        """Output pixels per im2col block (Note [Convolution])."""
        return max(1, BLOCK_BYTES // (self.k * itemsize))

    def nchw_rows(self, itemsize):
        """Output rows per NCHW im2col block (whole rows of one image)."""
        return max(1, self.block_pixels(itemsize) // self.wo)


def _buffer(rows, cols, dtype, cache):
    """A C-contiguous (rows, cols) array carved from one reusable allocation."""
    size = rows * cols
    if cache[0] is None or cache[0].size < size:
        cache[0] = np.empty(size, dtype)
    return cache[0][:size].reshape(rows, cols)


def _nhwc_weight(w, g, geo):
    """Group g's weight as the NHWC GEMM's (kh kw c_in, c_out) matrix."""
    wg = w[g * geo.cout : (g + 1) * geo.cout]
    return np.ascontiguousarray(wg.transpose(2, 3, 1, 0)).reshape(geo.k, geo.cout)


def _nchw_weight(w, g, geo):
    """Group g's weight as the NCHW GEMM's (c_out, c_in kh kw) matrix."""
    return np.ascontiguousarray(w[g * geo.cout : (g + 1) * geo.cout]).reshape(geo.cout, geo.k)


def _blocks(total, step):
    for p0 in range(0, total, step):
        yield p0, min(total, p0 + step)


# ---------------------------------------------------------------- forward


def _forward_nhwc(x, w, geo):
    out = empty_image(geo.n, geo.c_out, geo.ho, geo.wo, x.dtype, NHWC)
    o2 = out.reshape(-1, geo.c_out)
    weights = [_nhwc_weight(w, g, geo) for g in range(geo.groups)]
    if geo.pointwise:
        a = x.reshape(-1, geo.c)
        for g, wg in enumerate(weights):
            np.matmul(a[:, g * geo.cin : (g + 1) * geo.cin], wg, out=o2[:, _cols(g, geo.cout)])
        return out
    im2col, cache = _kernel(_im2col_nhwc, x.dtype), [None]
    step = geo.block_pixels(x.itemsize)
    for p0, p1 in _blocks(geo.n * geo.ho * geo.wo, step):
        cols = _buffer(p1 - p0, geo.k, x.dtype, cache)
        for g, wg in enumerate(weights):
            im2col(x, g * geo.cin, geo.cin, *geo.args(), geo.ho, geo.wo, p0, p1, cols)
            np.matmul(cols, wg, out=o2[p0:p1, _cols(g, geo.cout)])
    return out


def _cols(g, per_group):
    return slice(g * per_group, (g + 1) * per_group)


def _forward_nchw(x, w, geo):
    out = empty_image(geo.n, geo.c_out, geo.ho, geo.wo, x.dtype, "NCHW")
    o3 = out.reshape(geo.n, geo.c_out, geo.ho * geo.wo)
    weights = [_nchw_weight(w, g, geo) for g in range(geo.groups)]
    if geo.pointwise:
        x3 = x.reshape(geo.n, geo.c, geo.h * geo.w)
        for g, wg in enumerate(weights):
            np.matmul(wg, x3[:, _cols(g, geo.cin)], out=o3[:, _cols(g, geo.cout)])
        return out
    im2col, cache = _kernel(_im2col_nchw, x.dtype), [None]
    rows, ranges = geo.nchw_rows(x.itemsize), geo.columns()
    for n in range(geo.n):
        for oh0, oh1 in _blocks(geo.ho, rows):
            cols = _buffer(geo.k, (oh1 - oh0) * geo.wo, x.dtype, cache)
            for g, wg in enumerate(weights):
                im2col(x, n, g * geo.cin, geo.cin, *geo.args(), geo.wo, oh0, oh1, *ranges, cols)
                np.matmul(wg, cols, out=o3[n, _cols(g, geo.cout), oh0 * geo.wo : oh1 * geo.wo])
    return out


def conv2d(ks, input, weight, bias, stride, padding, dilation, groups):
    x, layout, unbatched = image(input)
    geo = Geometry(
        (x.shape[0], *input._shape[-3:]), weight._shape, stride, padding, dilation, groups
    )
    w = weight._data
    out = (_forward_nhwc if layout == NHWC else _forward_nchw)(x, w, geo)
    if bias is not None:
        out += bias._data if layout == NHWC else bias._data[:, None, None]
    return from_array(logical(out, layout, unbatched))


# ---------------------------------------------------------------- backward: input


def _backward_input_nhwc(g2, w, geo, dtype):
    gx = zeros_image(geo.n, geo.c, geo.h, geo.w, dtype, NHWC)
    weights = [_nhwc_weight(w, g, geo) for g in range(geo.groups)]
    if geo.pointwise:
        gx2 = gx.reshape(-1, geo.c)
        for g, wg in enumerate(weights):
            np.matmul(g2[:, _cols(g, geo.cout)], wg.T, out=gx2[:, _cols(g, geo.cin)])
        return gx
    col2im, cache = _kernel(_col2im_nhwc, dtype), [None]
    step = geo.block_pixels(np.dtype(dtype).itemsize)
    for p0, p1 in _blocks(geo.n * geo.ho * geo.wo, step):
        cols = _buffer(p1 - p0, geo.k, dtype, cache)
        for g, wg in enumerate(weights):
            np.matmul(g2[p0:p1, _cols(g, geo.cout)], wg.T, out=cols)
            col2im(cols, gx, g * geo.cin, geo.cin, *geo.args(), geo.ho, geo.wo, p0, p1)
    return gx


def _backward_input_nchw(g3, w, geo, dtype):
    gx = zeros_image(geo.n, geo.c, geo.h, geo.w, dtype, "NCHW")
    weights = [_nchw_weight(w, g, geo) for g in range(geo.groups)]
    if geo.pointwise:
        gx3 = gx.reshape(geo.n, geo.c, geo.h * geo.w)
        for g, wg in enumerate(weights):
            np.matmul(wg.T, g3[:, _cols(g, geo.cout)], out=gx3[:, _cols(g, geo.cin)])
        return gx
    col2im, cache = _kernel(_col2im_nchw, dtype), [None]
    rows, ranges = geo.nchw_rows(np.dtype(dtype).itemsize), geo.columns()
    for n in range(geo.n):
        for oh0, oh1 in _blocks(geo.ho, rows):
            cols = _buffer(geo.k, (oh1 - oh0) * geo.wo, dtype, cache)
            for g, wg in enumerate(weights):
                np.matmul(wg.T, g3[n, _cols(g, geo.cout), oh0 * geo.wo : oh1 * geo.wo], out=cols)
                col2im(cols, gx, n, g * geo.cin, geo.cin, *geo.args(), geo.wo, oh0, oh1, *ranges)
    return gx


def conv2d_backward_input(ks, grad, weight, input, stride, padding, dilation, groups):
    """The gradient in the input's layout: grad is converted to it (once, where the
    layouts differ, as after a flatten)."""
    _, layout, unbatched = image(input)
    gk = in_layout(grad._data, layout, unbatched)
    geo = Geometry(input._shape, weight._shape, stride, padding, dilation, groups)
    w, dtype = weight._data, grad._data.dtype
    if layout == NHWC:
        gx = _backward_input_nhwc(gk.reshape(-1, geo.c_out), w, geo, dtype)
    else:
        gx = _backward_input_nchw(gk.reshape(geo.n, geo.c_out, -1), w, geo, dtype)
    return from_array(logical(gx, layout, unbatched))


# ---------------------------------------------------------------- backward: weight


def _backward_weight_nhwc(g2, x, geo):
    gw = np.empty((geo.c_out, geo.cin, geo.kh, geo.kw), x.dtype)
    if geo.pointwise:
        a = x.reshape(-1, geo.c)
        for g in range(geo.groups):
            part = a[:, _cols(g, geo.cin)].T @ g2[:, _cols(g, geo.cout)]  # (cin, cout)
            gw[_cols(g, geo.cout), :, 0, 0] = part.T
        return gw
    im2col, cache = _kernel(_im2col_nhwc, x.dtype), [None]
    step = geo.block_pixels(x.itemsize)
    sums = [np.zeros((geo.k, geo.cout), x.dtype) for _ in range(geo.groups)]
    part = np.empty((geo.k, geo.cout), x.dtype)
    for p0, p1 in _blocks(geo.n * geo.ho * geo.wo, step):
        cols = _buffer(p1 - p0, geo.k, x.dtype, cache)
        for g in range(geo.groups):
            im2col(x, g * geo.cin, geo.cin, *geo.args(), geo.ho, geo.wo, p0, p1, cols)
            np.matmul(cols.T, g2[p0:p1, _cols(g, geo.cout)], out=part)
            sums[g] += part
    for g, s in enumerate(sums):  # (kh, kw, cin, cout) -> (cout, cin, kh, kw)
        gw[_cols(g, geo.cout)] = s.reshape(geo.kh, geo.kw, geo.cin, geo.cout).transpose(3, 2, 0, 1)
    return gw


def _backward_weight_nchw(g3, x, geo):
    if geo.pointwise:
        x3 = x.reshape(geo.n, geo.c, -1)
        gw = np.empty((geo.c_out, geo.cin, 1, 1), x.dtype)
        for g in range(geo.groups):
            part = np.matmul(g3[:, _cols(g, geo.cout)], x3[:, _cols(g, geo.cin)].transpose(0, 2, 1))
            gw[_cols(g, geo.cout), :, 0, 0] = part.sum(axis=0)
        return gw
    im2col, cache = _kernel(_im2col_nchw, x.dtype), [None]
    rows, ranges = geo.nchw_rows(x.itemsize), geo.columns()
    sums = [np.zeros((geo.cout, geo.k), x.dtype) for _ in range(geo.groups)]
    part = np.empty((geo.cout, geo.k), x.dtype)
    for n in range(geo.n):
        for oh0, oh1 in _blocks(geo.ho, rows):
            cols = _buffer(geo.k, (oh1 - oh0) * geo.wo, x.dtype, cache)
            for g in range(geo.groups):
                im2col(x, n, g * geo.cin, geo.cin, *geo.args(), geo.wo, oh0, oh1, *ranges, cols)
                gb = g3[n, _cols(g, geo.cout), oh0 * geo.wo : oh1 * geo.wo]
                np.matmul(gb, cols.T, out=part)
                sums[g] += part
    return np.concatenate(sums).reshape(geo.c_out, geo.cin, geo.kh, geo.kw)


def conv2d_backward_weight(ks, grad, input, weight_shape, stride, padding, dilation, groups):
    """(grad_weight, grad_bias): the bias gradient is grad summed over every axis but
    the channels, computed here where the layout is known."""
    x, layout, unbatched = image(input)
    geo = Geometry(
        (x.shape[0], *input._shape[-3:]), weight_shape, stride, padding, dilation, groups
    )
    gk = in_layout(grad._data, layout, unbatched)
    if layout == NHWC:
        g2 = gk.reshape(-1, geo.c_out)
        gw, gb = _backward_weight_nhwc(g2, x, geo), g2.sum(axis=0)
    else:
        g3 = gk.reshape(geo.n, geo.c_out, -1)
        gw, gb = _backward_weight_nchw(g3, x, geo), g3.sum(axis=(0, 2))
    return from_array(gw), from_array(gb)


# ---------------------------------------------------------------- linear


def linear(ks, input, weight, bias):
    """input @ weight.T + bias over the flattened leading axes."""
    x = input._data
    w = weight._data
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x
    out = np.matmul(x2, w.T)
    if bias is not None:
        out += bias._data
    return from_array(np.ascontiguousarray(out.reshape(x.shape[:-1] + (w.shape[0],))))


KERNELS = {
    "conv2d": conv2d,
    "conv2d_backward_input": conv2d_backward_input,
    "conv2d_backward_weight": conv2d_backward_weight,
    "linear": linear,
}


def register(registry):
    for name, fn in KERNELS.items():
        registry.register(name, "cpu", fn)
