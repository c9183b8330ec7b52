"""conv2d, its two backward operators, and linear (and both with relu fused: Note [Fused
epilogues]): blocked im2col + BLAS GEMMs, and Winograd's minimal filtering for 3x3, 4x4
and 5x5 stride-1 convolutions (Note [Winograd], winograd.py).

Note [Convolution]: a convolution is a GEMM over the "im2col" matrix, whose row (NHWC)
or column (NCHW) for an output pixel holds the kH x kW x C_in input values under the
kernel. Materializing it whole costs 9x the input's memory for a 3x3 kernel (115 MB
for 16x64x56x56), so the kernels build it one block of output pixels at a time
(``BLOCK_BYTES``) and hand each block to BLAS through NumPy's matmul; padding is
written as zeros while copying. A 1x1 convolution with stride 1 and no padding needs no
im2col: the input is the matrix.

    NHWC: out[pixels, C_out] = cols[pixels, kH kW C_in] @ W[kH kW C_in, C_out]
    NCHW: out[n][C_out, pixels] = W[C_out, C_in kH kW] @ cols[C_in kH kW, pixels]

Measured on 16x64x56x56 float32, 64 -> 64 channels, 3x3, padding 1 (the README has the
comparison with PyTorch): a direct Numba loop vectorized over the output channels took
70 ms on 2 threads (53 GFLOP/s: its accumulators live in memory, not registers);
blocked im2col + GEMM takes 42-46 ms on one thread in either layout whatever the block
size (OpenBLAS's GEMMs at ~95 GFLOP/s, the copies ~3 ms), and on two threads
NCHW 34 / NHWC 31 ms with 1 MB blocks, 30 / 28 with 2 MB and 25 / 24 with 8 MB: BLAS
splits a bigger GEMM between its threads better. Copying the blocks on Numba's
threads as well (prange) gained nothing (27 against 25 ms): each block's launch has to
wake the pool (Note [Wait policy] in lamina.backends.threads). Since the block loops
run their parts on the threads themselves (Note [Channels-last block loops]), 4 MB
blocks are as fast as 8 MB (0.90-1.03x of the time, forward and both gradients, on
AlexNet's, ResNet's and the 56 x 56 convolutions above, 1 and 2 threads, Zen 4) and
halve the buffers, which were a training step's peak memory: AlexNet's at batch 32
went from 18.7 to 14.8 MiB (one thread) and 26.7 to 20.2 (two).

The backward operators reuse the blocks: the weight gradient is the sum over blocks of
cols^T @ grad; the input gradient of a stride-1 convolution is the forward convolution
of grad with the flipped kernel, and of a strided one W^T @ grad scattered back by the
adjoint of im2col (col2im). The im2col blocks are not saved for backward: rebuilding
one costs a few percent of its GEMM, keeping them all 9x the input's memory.

Groups run as one GEMM per group on that group's channels (a column slice of the
matrices, which BLAS takes as it is); depthwise convolutions (one input channel per
group) run direct loops instead (Note [Depthwise convolution], depthwise.py).

Note [Fused epilogues]: conv2d_relu and linear_relu are relu(conv2d(...)) and
relu(linear(...)) with the relu applied where the bias is added (oneDNN's post-ops):
the pass that adds the bias writes max(y, 0) instead of y, so relu's own pass over the
output (a read and a write, and an allocation) is gone. Every path takes a ``floor``:
an output y below it is raised to it (``floor if y < floor else y``), -inf for the
plain operators (no output is below it, NaN included) and 0 for the fused ones, which
is relu's own rule (NaN and -0.0 pass unchanged). The im2col paths and linear add the
bias in one Numba pass (``_epilogue``) after their GEMMs, Winograd in its output
transform (winograd.py's ``store_*``), depthwise convolutions (which start their sums
from the bias) in the same pass without a bias. A missing bias is one of negative
zeros: adding -0.0 changes no value, so a result of -0.0 stays -0.0, as relu leaves it.
The values are those of the two calls, bit for bit (the same additions, then relu's
comparison): the rewrites conv2d_relu and linear_relu (Note [Rewrites]) are exact.
"""

import copy
import math

import numpy as np

from lamina.backends import jit, precision, threads
from lamina.dispatch import meta
from lamina.dispatch.tensor import from_array

from .. import blas, gemm
from . import depthwise, direct, winograd
from .filter_cache import prepared
from .layout import NCHW, NHWC, converted, empty_image, image, in_layout, logical, zeros_image
from .windows import tap_ranges

BLOCK_BYTES = 4 << 20  # the im2col blocks of a call's parts together (Note [Block budget])
SHARES = 4  # parts beyond this many each get BLOCK_BYTES / SHARES (Note [Block budget])


# ---------------------------------------------------------------- im2col kernels
# Output pixel p is (n, oh, ow) in row-major order; input row ih = oh * sh - pt + i * dh
# for kernel row i, column iw = ow * sw - pl + j * dw for kernel column j.


# Note [Slices from 0]: the inner loops run over views sliced to start at 0 (a
# channel run, the columns of a row inside the input), never over an offset index
# like src[c0 + c]: Numba then needs no negative-index wraparound per element and
# LLVM vectorizes the copy (measured: the NHWC im2col block 126 us -> 31 us).


# Note [Kernel rows as runs]: where a group has all of the input's channels and the
# kernel is not dilated, the taps of one kernel row are consecutive pixels of one input
# row, and in NHWC their channels one contiguous run: the im2col row's part for that
# kernel row is one copy (zeros where the taps fall outside), not kW copies of C_in
# elements. It matters where C_in is small: a 3-channel stem copied 3 floats per tap
# (measured im2col of 32 images 3 x 64 x 64, one thread: 7 x 7 stride 2 5.15 -> 2.16
# ms, 3 x 3 stride 2 1.29 -> 1.03).


@jit.jitable(**jit.CALLEE, inline="always")
def _pixel(p, ho, wo):
    """Output pixel p's (n, oh, ow)."""
    n, r = p // (ho * wo), p % (ho * wo)
    return n, r // wo, r % wo


@jit.jitable(**jit.CALLEE, inline="always")
def _next_pixel(n, oh, ow, ho, wo):
    """The output pixel after (n, oh, ow), without _pixel's divisions (a fifth of a
    3-channel stem's im2col)."""
    if ow + 1 < wo:
        return n, oh, ow + 1
    if oh + 1 < ho:
        return n, oh + 1, 0
    return n + 1, 0, 0


@jit.jitable(**jit.CALLEE, inline="always")
def _fill(a, value):
    for t in range(a.size):
        a[t] = value


@jit.jitable(**jit.CALLEE)  # and a kernel of its own (_SIGNATURES)
def _im2col_nhwc(x, c0, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, p0, p1, cols):
    """cols[p - p0, (i * kw + j) * cin + c] = x[n, ih, iw, c0 + c] (0 outside)."""
    h, w = x.shape[1], x.shape[2]
    runs = dw == 1 and cin == x.shape[3]  # Note [Kernel rows as runs]
    rows = x.reshape(x.shape[0], h, w * x.shape[3])
    span = kw * cin
    n, oh, ow = _pixel(p0, ho, wo)
    for p in range(p0, p1):
        if p > p0:
            n, oh, ow = _next_pixel(n, oh, ow, ho, wo)
        row = cols[p - p0]
        iw0 = ow * sw - pl
        lo = min(max(0, -iw0), kw)
        hi = max(lo, min(kw, w - iw0))  # kernel columns [lo, hi) fall inside the input
        for i in range(kh):
            ih = oh * sh - pt + i * dh
            if runs:
                dst = row[i * span : (i + 1) * span]
                if 0 <= ih < h:
                    _fill(dst[: lo * cin], 0)
                    src = rows[n, ih, (iw0 + lo) * cin : (iw0 + hi) * cin]
                    part = dst[lo * cin : hi * cin]
                    for t in range(src.size):
                        part[t] = src[t]
                    _fill(dst[hi * cin :], 0)
                else:
                    _fill(dst, 0)
                continue
            for j in range(kw):
                iw = ow * sw - pl + j * dw
                dst = row[(i * kw + j) * cin : (i * kw + j + 1) * cin]
                if 0 <= ih < h and 0 <= iw < w:
                    src = x[n, ih, iw, c0 : c0 + cin]
                    for c in range(cin):
                        dst[c] = src[c]
                else:
                    for c in range(cin):
                        dst[c] = 0


@jit.jitable(**jit.CALLEE)
def _col2im_nhwc(cols, gx, c0, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, p0, p1):
    """The adjoint of _im2col_nhwc: gx[n, ih, iw, c0 + c] += cols[...]."""
    h, w = gx.shape[1], gx.shape[2]
    runs = dw == 1 and cin == gx.shape[3]  # Note [Kernel rows as runs]
    rows = gx.reshape(gx.shape[0], h, w * gx.shape[3])
    span = kw * cin
    n, oh, ow = _pixel(p0, ho, wo)
    for p in range(p0, p1):
        if p > p0:
            n, oh, ow = _next_pixel(n, oh, ow, ho, wo)
        row = cols[p - p0]
        iw0 = ow * sw - pl
        lo = min(max(0, -iw0), kw)
        hi = max(lo, min(kw, w - iw0))  # kernel columns [lo, hi) fall inside the input
        for i in range(kh):
            ih = oh * sh - pt + i * dh
            if not 0 <= ih < h:
                continue
            if runs:
                dst = rows[n, ih, (iw0 + lo) * cin : (iw0 + hi) * cin]
                src = row[i * span + lo * cin : i * span + hi * cin]
                for t in range(dst.size):
                    dst[t] += src[t]
                continue
            for j in range(kw):
                iw = ow * sw - pl + j * dw
                if 0 <= iw < w:
                    dst = gx[n, ih, iw, c0 : c0 + cin]
                    src = row[(i * kw + j) * cin : (i * kw + j + 1) * cin]
                    for c in range(cin):
                        dst[c] += src[c]


@jit.jitable(**jit.CALLEE)  # and a kernel of its own (_SIGNATURES)
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
                lo, hi = lo_[j], hi_[j]
                first = lo * sw + j * dw - pl  # the input column of output column lo
                for oh in range(oh0, oh1):
                    ih = oh * sh - pt + i * dh
                    base = (oh - oh0) * wo
                    if ih < 0 or ih >= h:
                        lo_in, hi_in = wo, wo
                    else:
                        lo_in, hi_in = lo, hi
                    for ow in range(lo_in):
                        row[base + ow] = 0
                    for k in range(hi_in - lo_in):
                        row[base + lo_in + k] = plane[ih, first + k * sw]
                    for ow in range(max(hi_in, lo_in), wo):
                        row[base + ow] = 0


@jit.jitable(**jit.CALLEE)
def _col2im_nchw(cols, gx, n, c0, cin, kh, kw, sh, sw, pt, pl, dh, dw, wo, oh0, oh1, lo_, hi_):
    """The adjoint of _im2col_nchw: gx[n, c0 + c, ih, iw] += cols[...]."""
    h = gx.shape[2]
    for c in range(cin):
        plane = gx[n, c0 + c]
        for i in range(kh):
            for j in range(kw):
                row = cols[(c * kh + i) * kw + j]
                lo, hi = lo_[j], hi_[j]
                first = lo * sw + j * dw - pl  # the input column of output column lo
                for oh in range(oh0, oh1):
                    ih = oh * sh - pt + i * dh
                    if 0 <= ih < h:
                        base = (oh - oh0) * wo + lo
                        for k in range(hi - lo):
                            plane[ih, first + k * sw] += row[base + k]


def _phase_planes(x, pt, pl, sh, sw, hq, wq, planes):
    """planes[n * C + c] = x[n, c] zero-padded, as its sh x sw phase planes of hq x wq
    pixels, flattened: phase (a, b) holds the padded plane's pixels [a::sh, b::sw] (Note
    [Flat planes]; stride 1 takes _pad_planes)."""
    c_, h, w = x.shape[1], x.shape[2], x.shape[3]
    for p in jit.prange(planes.shape[0]):
        src_plane, plane = x[p // c_, p % c_], planes[p]
        for phase in range(sh * sw):
            a, b = phase // sw, phase % sw
            # the phase's columns [lo, hi) fall inside the input, at input column x sw + b - pl
            lo = min(wq, max(0, -((b - pl) // sw)))
            hi = max(lo, min(wq, -((b - pl - w) // sw)))
            for y in range(hq):
                seg = plane[(phase * hq + y) * wq : (phase * hq + y + 1) * wq]
                ih = y * sh + a - pt
                if ih < 0 or ih >= h:
                    for k in range(wq):
                        seg[k] = 0
                    continue
                src = src_plane[ih]
                for k in range(lo):
                    seg[k] = 0
                for k in range(lo, hi):
                    seg[k] = src[k * sw + b - pl]
                for k in range(hi, wq):
                    seg[k] = 0


def _pad_planes(x, pt, pl, hp, wp, planes):
    """_phase_planes of stride 1, whose copies Numba vectorizes as it does not the
    general loop's: padding 32 x 16 x 64 x 64 float32 took 0.32 ms against 0.76-1.6."""
    c_, h, w = x.shape[1], x.shape[2], x.shape[3]
    for p in jit.prange(planes.shape[0]):
        src_plane, plane = x[p // c_, p % c_], planes[p]
        for r in range(hp):
            seg = plane[r * wp : (r + 1) * wp]
            ih = r - pt
            if ih < 0 or ih >= h:
                for k in range(wp):
                    seg[k] = 0
                continue
            for k in range(pl):
                seg[k] = 0
            dst, src = seg[pl : pl + w], src_plane[ih]
            for k in range(w):
                dst[k] = src[k]
            for k in range(pl + w, wp):
                seg[k] = 0


@jit.jitable(**jit.CALLEE)  # called by the flat block loops (Note [Closure cells])
def _im2col_flat(flat, base, taps, wq, oh0, span, cols):
    """cols[c * len(taps) + t, :span] = flat[base[c] + taps[t] + oh0 wq ...]: one
    contiguous copy per row of the block (Note [Flat planes])."""
    for r in range(base.size * taps.size):
        start = base[r // taps.size] + taps[r % taps.size] + oh0 * wq
        src, dst = flat[start : start + span], cols[r]
        for q in range(span):
            dst[q] = src[q]


def _im2col_blocks(padded, c0, cin, kh, kw, sh, sw, dh, dw, ho, wo, cols):
    """cols[(c kh + i) kw + j, (m ho + oh) wo + ow] = padded[m, c0 + c, oh sh + i dh, ow
    sw + j dw]: the im2col matrix of a block of whole zero-padded NCHW images (Note
    [Small planes]), image plane by image plane, each read from the L1 cache kh kw
    times; the channels in parallel where compiled so. Note [Runs of kernel columns]."""
    pixels = ho * wo
    for c in jit.prange(cin):
        for m in range(padded.shape[0]):
            plane = padded[m, c0 + c]
            for i in range(kh):
                for oh in range(ho):
                    src = plane[oh * sh + i * dh]
                    p = m * pixels + oh * wo
                    for j in range(kw):
                        dst = cols[(c * kh + i) * kw + j, p : p + wo]
                        if sw == 1:
                            run = src[j * dw : j * dw + wo]
                            for ow in range(wo):
                                dst[ow] = run[ow]
                        else:
                            for ow in range(wo):
                                dst[ow] = src[ow * sw + j * dw]


def _col2im_blocks(cols, padded, c0, cin, kh, kw, sh, sw, dh, dw, ho, wo):
    """The adjoint of _im2col_blocks: padded[m, c0 + c, ...] += cols[...]."""
    pixels = ho * wo
    for c in jit.prange(cin):
        for m in range(padded.shape[0]):
            plane = padded[m, c0 + c]
            for i in range(kh):
                for oh in range(ho):
                    dst = plane[oh * sh + i * dh]
                    p = m * pixels + oh * wo
                    for j in range(kw):
                        src = cols[(c * kh + i) * kw + j, p : p + wo]
                        if sw == 1:
                            run = dst[j * dw : j * dw + wo]
                            for ow in range(wo):
                                run[ow] += src[ow]
                        else:
                            for ow in range(wo):
                                dst[ow * sw + j * dw] += src[ow]


# Note [Runs of kernel columns]: the image-block kernels walk an input row's kernel
# columns innermost, each one output row of the im2col matrix: at stride 1 the row's
# part is a run of the input row sliced to start at 0 (Note [Slices from 0]), which LLVM
# vectorizes, where a gather at a stride known only at run time was copied element by
# element. Measured float32, one thread, im2col / col2im of one block, us, before ->
# after: Inception's 3 x 3 from 48 channels on 8 x 8 at batch 1 24.8 -> 11.2 / 29.0 ->
# 19.8, 3 x 3 from 32 channels on 16 x 16 46.4 -> 16.2 / 53.3 -> 29.3; ResNet's 256
# channels on 4 x 4 at batch 32 1839 -> 1359 / 2105 -> 2004; a 3 x 3 stride 2 from 64
# channels at batch 8, 279 -> 222 / 349 -> 340 (the input row read once per output row).


def _reversed_axes(a, out):
    """out[k, j, i] = a[i, j, k] (3-D arrays), in blocks of 16 of a's first axis (rows
    of out's last written whole), the middle axis in parallel where compiled so: the
    NHWC weight matrices' transposition and its inverse. NumPy's copy of the transposed
    weight read a cache line per element: 512 x 512 x 3 x 3 float32, 9.3 ms against 2.1
    (one thread) and 1.3 (two)."""
    for j in jit.prange(a.shape[1]):
        for i0 in range(0, a.shape[0], 16):
            for k in range(a.shape[2]):
                row = out[k, j]
                for i in range(i0, min(a.shape[0], i0 + 16)):
                    row[i] = a[i, j, k]


def _epilogue_rows(out, bias, floor):
    """out[p, c] = out[p, c] + bias[c], raised to floor where below it, for rows of
    channels (pixels or samples, C) (Note [Fused epilogues])."""
    for p in range(out.shape[0]):
        row = out[p]
        for c in range(row.size):
            y = row[c] + bias[c]
            row[c] = floor if y < floor else y


def _epilogue_planes(out, bias, floor):
    """The same of channels-first images (N, C, pixels)."""
    for n in range(out.shape[0]):
        for c in range(out.shape[1]):
            row, b = out[n, c], bias[c]
            for p in range(row.size):
                y = row[p] + b
                row[p] = floor if y < floor else y


_SIGNATURES = {
    # (x or gx: 4-D, group channels and geometry: 11 ints, then the rest)
    _im2col_nhwc: lambda t, a4, a2, i, x: t.void(a4, *[i] * 14, a2),
    _col2im_nhwc: lambda t, a4, a2, i, x: t.void(a2, a4, *[i] * 14),
    _im2col_nchw: lambda t, a4, a2, i, x: t.void(a4, *[i] * 14, x, x, a2),
    _col2im_nchw: lambda t, a4, a2, i, x: t.void(a2, a4, *[i] * 14, x, x),
    _phase_planes: lambda t, a4, a2, i, x: t.void(a4, *[i] * 6, a2),
    _pad_planes: lambda t, a4, a2, i, x: t.void(a4, *[i] * 4, a2),
    _im2col_blocks: lambda t, a4, a2, i, x: t.void(a4, *[i] * 10, a2),
    _col2im_blocks: lambda t, a4, a2, i, x: t.void(a2, a4, *[i] * 10),
    _im2col_flat: lambda t, a4, a2, i, x: t.void(a2.copy(ndim=1), x, x, *[i] * 3, a2),
    _epilogue_rows: lambda t, a4, a2, i, x: t.void(a2, a2.copy(ndim=1), a2.dtype),
    _epilogue_planes: lambda t, a4, a2, i, x: t.void(a4.copy(ndim=3), a2.copy(ndim=1), a2.dtype),
    _reversed_axes: lambda t, a4, a2, i, x: t.void(a4.copy(ndim=3), a4.copy(ndim=3)),
}


def _signature(pyfunc, dtype):
    t = jit.types
    return _SIGNATURES[pyfunc](t, jit.array(dtype, 4), jit.array(dtype, 2), t.int64, jit.index())


def _kernel(pyfunc, dtype, parallel=False):
    """``pyfunc`` compiled for ``dtype``, without the GIL (Note [Split convolutions]); a
    serial one also under ``_symbol``'s name, which the block loops call (Note [Kernels
    called by name] in backends/jit.py)."""

    def build():
        symbol = None if parallel else _symbol(pyfunc, dtype)
        signature = _signature(pyfunc, dtype)
        return jit.compile_kernel(pyfunc, signature, parallel, nogil=True, symbol=symbol)

    return jit.cached((pyfunc, np.dtype(dtype), parallel), build)


def _symbol(pyfunc, dtype):
    return jit.kernel_name("conv", pyfunc.__name__, np.dtype(dtype))


def _blocks_kernel(pyfunc, cols, cin):
    """_im2col_blocks or _col2im_blocks for ``cols``, its loop over the ``cin`` channels
    in parallel from PARALLEL_ELEMENTS elements of cols (Note [Small planes]): these
    convolutions' products run in parallel (Note [Products in parallel]), and the copies
    serially took a third of the time on two threads."""
    return _kernel(pyfunc, cols.dtype, threads.parts_for(cols.size, cin) > 1)


# the floors of Note [Fused epilogues]: the plain operators' raises nothing, relu's
NO_FLOOR, RELU = -np.inf, 0.0


def _epilogue(out, bias, layout, floor):
    """out += bias (None: none), raised to ``floor``, in one pass over out (Note [Fused
    epilogues]): C-contiguous images in ``layout``, NCHW channels-first, else channels
    last (NHWC images, and linear's rows of features)."""
    if bias is None and floor == NO_FLOOR:
        return
    channels = out.shape[1] if layout == NCHW else out.shape[-1]
    bias = np.full(channels, -0.0, out.dtype) if bias is None else bias
    floor = out.dtype.type(floor)
    if layout == NCHW:
        planes = out.reshape(out.shape[0], channels, out.shape[2] * out.shape[3])
        _kernel(_epilogue_planes, out.dtype)(planes, bias, floor)
    else:
        rows = out.reshape(math.prod(out.shape[:-1]), channels)
        _kernel(_epilogue_rows, out.dtype)(rows, bias, floor)


# ---------------------------------------------------------------- geometry


# Note [Decisions of one call]: a Geometry is made on every call of a convolution
# operator, and the choices that several steps of the call ask for again -- Winograd's
# algorithm: the memory order, the image-block test and the filters each, ~2.5 us a time
# -- are kept in its ``decisions``, made once a call. Not across calls: the number of
# threads, the float32 precision and the thresholds they read may change between them
# (but for a compiled program's node, which keys by the first two: Note [Convolutions
# of a plan]).


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
        # the output size of conv2d's description (dispatch/results.py), one formula
        self.ho = meta.conv_output_size(self.h, self.pt + self.pb, self.kh, self.sh, self.dh)
        self.wo = meta.conv_output_size(self.w, self.pl + self.pr, self.kw, self.sw, self.dw)
        self.k = self.cin * self.kh * self.kw  # the GEMM's inner dimension, per group
        self.pointwise = (self.kh, self.kw, self.sh, self.sw) == (1, 1, 1, 1) and not any(padding)
        self.decisions = {}  # Note [Decisions of one call]

    def __copy__(self):
        """A copy to change (one group's, a flipped one's): its decisions its own."""
        other = object.__new__(Geometry)
        other.__dict__.update(self.__dict__, decisions={})
        return other

    @property
    def flops(self):
        return 2 * self.n * self.ho * self.wo * self.c_out * self.k

    @property
    def flat(self):
        """NCHW blocks come from flat planes (Note [Flat planes]): stride 1, or a kernel
        whose taps read each pixel PHASE_READS times or more."""
        if (self.sh, self.sw) == (1, 1):
            return True
        taps = self.kh * self.kw  # per input pixel: taps / (sh sw), Note [Flat planes]
        return (self.dh, self.dw) == (1, 1) and taps >= PHASE_READS * self.sh * self.sw

    @property
    def transposable(self):
        """Stride 1 and padding within the kernel's extent: the input gradient is a
        forward convolution of grad with the flipped kernel (no col2im)."""
        return (
            (self.sh, self.sw) == (1, 1)
            and max(self.pt, self.pb) <= self.dh * (self.kh - 1)
            and max(self.pl, self.pr) <= self.dw * (self.kw - 1)
        )

    def columns(self):
        """(lo, hi) per kernel column: the output columns it reads inside the input."""
        return tap_ranges(self.w, self.wo, self.kw, self.sw, self.pl, self.dw)

    def args(self):
        """The geometry arguments of the im2col kernels after (c0, cin)."""
        return (self.kh, self.kw, self.sh, self.sw, self.pt, self.pl, self.dh, self.dw)

    def block_pixels(self, itemsize, parts):
        """Output pixels per im2col block of each of ``parts`` parts (Note [Block budget])."""
        return max(1, _part_bytes(parts) // (self.k * itemsize))

    def nchw_rows(self, itemsize, parts):
        """Output rows per NCHW im2col block (whole rows of one image)."""
        return max(1, self.block_pixels(itemsize, parts) // self.wo)


def _reverse_axes(a, out=None):
    """a (3-D, C-contiguous) with its axes reversed, as a C-contiguous array (out)."""
    out = np.empty(a.shape[::-1], a.dtype) if out is None else out
    _kernel(_reversed_axes, a.dtype, threads.parts_for(a.size, a.shape[1]) > 1)(a, out)
    return out


def _nhwc_weight(w, g, geo):
    """Group g's weight as the NHWC GEMM's (kh kw c_in, c_out) matrix."""
    wg = np.ascontiguousarray(w[g * geo.cout : (g + 1) * geo.cout])
    return _reverse_axes(wg.reshape(geo.cout, geo.cin, geo.kh * geo.kw)).reshape(geo.k, geo.cout)


def _pointwise_weight(w, g, geo):
    """Group g's weight of a 1x1 convolution as a (c_out, c_in) view, never copied: the
    channels-last GEMMs take it transposed (a copy of the transposed weight per call
    cost more than the GEMM at MobileNet's late 2 x 2 images: 960 -> 320 channels at
    batch 8, 0.58 -> 0.27 ms)."""
    return w[_cols(g, geo.cout)].reshape(geo.cout, geo.cin)


def _nchw_weight(w, g, geo):
    """Group g's weight as the NCHW GEMM's (c_out, c_in kh kw) matrix."""
    return np.ascontiguousarray(w[g * geo.cout : (g + 1) * geo.cout]).reshape(geo.cout, geo.k)


# Note [Split convolutions]: with several threads, a convolution's batch runs in parts,
# one per thread from PARALLEL_ELEMENTS multiply-adds (``threads.parts_for``), each part
# running its GEMMs on the one-thread BLAS (Note [BLAS threads]), so that a thread reads
# the blocks it wrote, from its own cache. Every kernel runs its parts itself, in a
# parallel loop without Python: Winograd's block loops (Note [Winograd parts] in
# winograd.py), depthwise kernels (Note [Depthwise parts] in depthwise.py), the im2col
# block loops (Notes [Channels-last block loops], [Flat block loops]; parts of rows or
# pixels, Note [Parts of images], the weight gradient summing the parts'), and the
# products over a whole batch, their rows or images in parallel (Notes [Products in
# parallel] and [Batches in parallel] in gemm.py; split by images, each part read the
# whole weight for a few images' pixels: measured on 2 cores, training steps at batch 8,
# ResNet-18 on 64 x 64 images 99.8 -> 86.1 ms, on 32 x 32 203 -> 193 ms). A loop costs
# ~2 us where ``threads.split``'s parts, which convolutions used before, call back into
# Python and wait on each other at the GIL (Note [Split work]): Winograd's loop for 128
# channels on 8 x 8 images at batch 8 took 0.80 ms on two threads as split parts, 0.39
# as a parallel loop (one thread 0.89). A batch of one image has parts too (of its tile
# rows, output rows or pixels), but for the channels-last depthwise kernels. Measured on
# 2 cores, VGG's convolutions at batch 32 split by images: forward 1.7-2.5x faster on
# two threads than on one, forward + backward 1.3-1.9x, where a 2-thread BLAS splitting
# each block's GEMM gave 0.5-1.15x.


def _blocks(total, step):
    for p0 in range(0, total, step):
        yield p0, min(total, p0 + step)


# ---------------------------------------------------------------- forward


def _forward_nhwc(x, w, geo, out):
    o2 = out.reshape(-1, geo.c_out)
    if geo.pointwise:
        a = x.reshape(-1, geo.c)
        if geo.groups == 1 and a.shape[0] <= min(32, geo.c_out):  # _linear's transposed product
            transposed = np.empty((geo.c_out, a.shape[0]), x.dtype)
            gemm.product(_pointwise_weight(w, 0, geo), a.T, transposed)
            o2[...] = transposed.T
            return
        for g in range(geo.groups):
            wg = _pointwise_weight(w, g, geo).T
            gemm.product(a[:, g * geo.cin : (g + 1) * geo.cin], wg, o2[:, _cols(g, geo.cout)])
        return
    parts, size, unit = _nhwc_parts(geo, x.dtype)
    loop = _block_loop(nhwc_forward_step, x.dtype, len(parts) > 1)
    loop(x, _nhwc_weights(w, geo), *_nhwc_geometry(geo), size, unit, parts, o2)


# Note [Channels-last block loops]: the channels-last im2col convolution runs its blocks
# of output pixels -- im2col, then a GEMM per group -- in a parallel loop over parts of
# the output pixels (one part per thread from PARALLEL_ELEMENTS multiply-adds), each
# part with an im2col buffer of its own and, in the weight gradient, sums of its own:
# one kernel calling the BLAS (Note [GEMM in kernels]); where kernels cannot call it,
# the same loops run from Python over the im2col kernels, the parts one after the other.
# The input gradient's parts hold whole images, so its scatter never adds into another
# part's pixels (Note [Parts of images]). Measured on 2 cores, forward and both
# gradients of ResNet-18's channels-last convolutions (small images, which Winograd does
# not take in training), float32, the pool allocator on, one thread / two, ms: 128
# channels 3 x 3 on 8 x 8 at batch 8 4.58 / 3.95 as ``threads.split``'s parts -> 4.55 /
# 2.97; 64 -> 128 channels stride 2 on 16 x 16, 1.89 / 2.31 -> 1.93 / 1.39; 256 channels
# on 4 x 4 at batch 32, 19.8 / 13.5 -> 15.2 / 10.1 (with the weight matrices'
# transposition by ``_reversed_axes``).


def nhwc_blocks(step):
    """The channels-last block loop (Note [Channels-last block loops]): ``step(a, b,
    out, p, g, cols, b0, b1, *geometry)`` for each group g of each block [b0, b1) of
    part p's output pixels (the parts cut at multiples of ``unit`` pixels: Note [Parts
    of images]), cols the block's rows of part p's buffer."""

    def run(a, b, images, groups, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, size, unit,
            parts, out):  # fmt: skip
        k = cin * kh * kw
        for p in jit.prange(parts.shape[0]):
            buffer = parts[p]
            first, last = jit.part(images * ho * wo // unit, parts.shape[0], p)
            start, stop = first * unit, last * unit
            for b0 in range(start, stop, size):
                b1 = min(stop, b0 + size)
                cols = buffer[: (b1 - b0) * k].reshape(b1 - b0, k)
                for g in range(groups):
                    step(a, b, out, p, g, cols, b0, b1, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo)

    return run


def nhwc_forward_step(im2col):
    """out2 (pixels, groups * cout) rows [b0, b1) = the block's im2col rows of x @
    weights[g] (k, cout)."""

    def step(x, weights, out2, p, g, cols, b0, b1, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo):
        cout = weights.shape[2]
        im2col(x, g * cin, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, b0, b1, cols)
        blas.gemm(cols, weights[g], out2[b0:b1, g * cout : (g + 1) * cout], False, False, 0.0)

    return step


def nhwc_input_grad_step(col2im):
    """gx (zeros) += the block's grad2 rows @ weights[g]^T, scattered back."""

    def step(grad2, weights, gx, p, g, cols, b0, b1, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo):
        cout = weights.shape[2]
        blas.gemm(grad2[b0:b1, g * cout : (g + 1) * cout], weights[g], cols, False, True, 0.0)
        col2im(cols, gx, g * cin, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, b0, b1)

    return step


def nhwc_weight_grad_step(im2col):
    """sums[p, g] (k, cout) += the block's im2col rows of x, transposed, @ grad2's."""

    def step(x, grad2, sums, p, g, cols, b0, b1, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo):
        cout = sums.shape[3]
        im2col(x, g * cin, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, b0, b1, cols)
        blas.gemm(cols, grad2[b0:b1, g * cout : (g + 1) * cout], sums[p, g], True, False, 1.0)

    return step


# each step's loop, im2col kernel, the arrays before its integers, the integers and
# what follows them (Notes [Channels-last block loops], [Flat block loops])
def _loop_table():
    index = jit.index()
    return {
        nhwc_forward_step: (nhwc_blocks, _im2col_nhwc, (4, 3), 15, (2, 2)),
        nhwc_input_grad_step: (nhwc_blocks, _col2im_nhwc, (2, 3), 15, (2, 4)),
        nhwc_weight_grad_step: (nhwc_blocks, _im2col_nhwc, (4, 2), 15, (2, 4)),
        nchw_forward_step: (nchw_blocks, _im2col_nchw, (4, 3), 15, (index, index, 2, 3)),
        nchw_input_grad_step: (nchw_blocks, _col2im_nchw, (3, 3), 15, (index, index, 2, 4)),
        nchw_weight_grad_step: (nchw_blocks, _im2col_nchw, (4, 3), 15, (index, index, 2, 4)),
        flat_forward_step: (flat_blocks, _im2col_flat, (1, 3), 7, (index, 2, 2, 4)),
        flat_weight_grad_step: (flat_blocks, _im2col_flat, (1, 4), 7, (index, 2, 2, 4)),
    }


def _block_loop(template, dtype, parallel):
    """The block loop of step ``template`` for ``dtype``, its parts in parallel or not
    (Note [Channels-last block loops]): one kernel calling the BLAS, or where kernels
    cannot, the loop in Python over the im2col kernel."""
    native = blas.available()

    def build():
        loop, im2col, before, count, after = _loop_table()[template]
        if not native:
            return loop(template(_kernel(im2col, dtype)))
        _kernel(im2col, dtype)  # Note [Kernels called by name] in backends/jit.py
        by_name = jit.by_name(_symbol(im2col, dtype))
        step = jit.jitable(template(by_name), **jit.CALLEE, inline="always")
        t = jit.types
        arrays = [jit.array(dtype, d) if isinstance(d, int) else d for d in (*before, *after)]
        signature = t.void(*arrays[:2], *[t.int64] * count, *arrays[2:])
        return jit.compile_kernel(loop(step), signature, parallel, nogil=True)

    return jit.cached((template, np.dtype(dtype), native, native and parallel), build)


def _nhwc_parts(geo, dtype, scatter=False):
    """(an im2col buffer per part, pixels per block, pixels per unit of the parts) of
    the channels-last block loops (Note [Parts of images])."""
    parts, unit = _parts_of(geo, geo.ho * geo.wo, scatter)
    size = geo.block_pixels(np.dtype(dtype).itemsize, parts)
    most = min(size, -(-geo.n * geo.ho * geo.wo // (parts * unit)) * unit)  # a part's biggest block
    return np.empty((parts, most * geo.k), dtype), size, unit


def _part_bytes(parts):
    """The bytes of each part's im2col block (Note [Block budget])."""
    return BLOCK_BYTES // min(parts, SHARES)


# Note [Block budget]: the parts of a block loop share BLOCK_BYTES, each part's im2col
# block a 1/parts share, but never less than 1/SHARES (1 MB: from 1 MB up, one
# thread's GEMMs ran as fast as with bigger blocks, Note [Convolution]; only two
# threads were measured). With a whole BLOCK_BYTES each, two threads' blocks were a
# training step's peak memory: AlexNet's conv2 weight gradient at batch 32 took 4 MiB
# more on two threads than on one, in eager and compiled steps alike, so the compiled
# step's smaller saved state counted for less. The weight gradient also gives its
# blocks back to the pool before it adds up its parts' sums, and writes the sums'
# transposition into the result (those temporaries came on top of the blocks).
# AlexNet's training step at batch 32, pool peak above the resting memory, MiB, eager /
# compiled: two threads 22.4 / 18.6 -> 16.6 / 12.7, one thread 17.2 / 13.3 -> 16.3 /
# 12.4; the steps of the three convnets on two threads took 0.97x the time (alternated
# in one process).


# Note [Parts of images]: the im2col block loops cut their work into parts at any
# output row (NCHW) or pixel (NHWC) of the batch, so that fewer images than threads
# (one, in inference) still run on every thread; but where a step scatters into the
# input gradient (col2im), whose pixels neighbouring output rows share, at whole
# images, so that no two parts add into the same pixel.


def _parts_of(geo, per_image, scatter):
    """(parts, unit) of a block loop over ``per_image`` units (output rows or pixels)
    of each image: parts of any whole number of units, or of whole images where the
    step scatters (Note [Parts of images])."""
    unit = per_image if scatter else 1
    return threads.parts_for(geo.flops // 2, geo.n * per_image // unit), unit


def _nhwc_geometry(geo):
    """The block loop's integers before the block size."""
    return (geo.n, geo.groups, geo.cin, *geo.args(), geo.ho, geo.wo)


def _nhwc_weights(w, geo):
    """The groups' (kh kw c_in, c_out) matrices (_nhwc_weight), stacked: from the filter
    cache (Note [Filter cache]), so that inference transposes a weight once, and a
    training step once for its forward pass and input gradient."""

    def stacked(w):
        return np.stack([_nhwc_weight(w, g, geo) for g in range(geo.groups)])

    return prepared(w, ("channels-last", geo.groups), stacked, reused=True)


def _cols(g, per_group):
    return slice(g * per_group, (g + 1) * per_group)


# Note [Groups by Winograd]: a grouped convolution whose groups Winograd would take as
# convolutions of their own (3x3 stride 1, enough channels per group) runs group by
# group: its channel slices copied out, each group's convolution run with groups=1,
# the results copied back. The copies cost a pass over the images; one GEMM per group
# per im2col block cost more. Measured one thread, 16x64x56x56 3x3, forward: 2 groups
# 32 -> 19 ms (PyTorch 17), 4 groups 24 -> 18 ms (PyTorch 11).


def _by_groups(geo, dtype):
    """Whether a grouped convolution runs group by group (Note [Groups by Winograd])."""
    return (
        geo.groups > 1
        and not depthwise.applies(geo)
        and winograd.algorithm(_one_group(geo), dtype) is not None
    )


def _one_group(geo):
    """The geometry of one group's convolution (groups=1)."""
    one = copy.copy(geo)
    one.c, one.c_out, one.groups = geo.cin, geo.cout, 1
    return one


def _channel_view(a, g, per_group, layout):
    """Channels [g per_group, (g + 1) per_group) of kernel-order images a (a view)."""
    return a[..., _cols(g, per_group)] if layout == NHWC else a[:, _cols(g, per_group)]


def _channels(a, g, per_group, layout):
    """Those channels as C-contiguous images in ``layout`` (a copy)."""
    return np.ascontiguousarray(_channel_view(a, g, per_group, layout))


def _forward_nchw(x, w, geo, out):
    o3 = out.reshape(geo.n, geo.c_out, geo.ho * geo.wo)
    weights = np.ascontiguousarray(w).reshape(geo.groups, geo.cout, geo.k)  # _nchw_weight's
    if geo.pointwise:
        x3 = x.reshape(geo.n, geo.c, geo.h * geo.w)
        for g, wg in enumerate(weights):
            gemm.batched(wg[None], x3[:, _cols(g, geo.cin)], o3[:, _cols(g, geo.cout)])
        return
    if geo.flat:
        _flat_loop(flat_forward_step, x, weights, geo, lambda parts: out)
        return
    parts, rows, unit = _nchw_parts(geo, x.dtype)
    loop = _block_loop(nchw_forward_step, x.dtype, len(parts) > 1)
    loop(x, weights, *_nchw_geometry(geo), rows, unit, *geo.columns(), parts, o3)


def nchw_blocks(step):
    """The channels-first im2col block loop (Note [Channels-last block loops] holds for
    it too): ``step(a, b, out, p, g, n, oh0, oh1, cols, *geometry)`` for each group g of
    each block [oh0, oh1) of output rows of image n in part p (the parts cut at
    multiples of ``unit`` rows of the batch: Note [Parts of images]), cols the block's
    (k, rows x wo) view of part p's buffer. Run from Python, each part of a split MobileNet
    first layer at batch 32 (3 -> 32 channels, stride 2, 64 x 64 images) made 32 calls,
    each giving up the GIL and taking it back, and ran 2x slower beside the other part:
    two threads took 4.0 ms, one 1.6; as one kernel, 0.8."""

    def run(a, b, images, groups, cin, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, rows, unit, lo_,
            hi_, parts, out):  # fmt: skip
        k = cin * kh * kw
        for p in jit.prange(parts.shape[0]):
            buffer = parts[p]
            first, last = jit.part(images * ho // unit, parts.shape[0], p)
            r, stop = first * unit, last * unit
            while r < stop:
                n, oh0, oh1 = row_block(r, stop, ho, rows)
                r += oh1 - oh0
                cols = buffer[: k * (oh1 - oh0) * wo].reshape(k, (oh1 - oh0) * wo)
                for g in range(groups):
                    step(a, b, out, p, g, n, oh0, oh1, cols, cin, kh, kw, sh, sw, pt, pl, dh, dw,
                         wo, lo_, hi_)  # fmt: skip

    return run


def nchw_forward_step(im2col):
    """o3 (N, groups * cout, ho wo) block = weights[g] (cout, k) @ the block's im2col
    matrix of image n."""

    def step(x, weights, o3, p, g, n, oh0, oh1, cols, cin, kh, kw, sh, sw, pt, pl, dh, dw, wo,
             lo_, hi_):  # fmt: skip
        cout = weights.shape[1]
        im2col(x, n, g * cin, cin, kh, kw, sh, sw, pt, pl, dh, dw, wo, oh0, oh1, lo_, hi_, cols)
        out = o3[n, g * cout : (g + 1) * cout, oh0 * wo : oh1 * wo]
        blas.gemm(weights[g], cols, out, False, False, 0.0)

    return step


def nchw_input_grad_step(col2im):
    """gx (zeros) += weights[g]^T @ the block of grad g3 (N, groups * cout, ho wo),
    scattered back."""

    def step(g3, weights, gx, p, g, n, oh0, oh1, cols, cin, kh, kw, sh, sw, pt, pl, dh, dw, wo,
             lo_, hi_):  # fmt: skip
        cout = weights.shape[1]
        grad = g3[n, g * cout : (g + 1) * cout, oh0 * wo : oh1 * wo]
        blas.gemm(weights[g], grad, cols, True, False, 0.0)
        col2im(cols, gx, n, g * cin, cin, kh, kw, sh, sw, pt, pl, dh, dw, wo, oh0, oh1, lo_, hi_)

    return step


def nchw_weight_grad_step(im2col):
    """sums[p, g] (cout, k) += the block of grad g3 @ its im2col matrix, transposed."""

    def step(x, g3, sums, p, g, n, oh0, oh1, cols, cin, kh, kw, sh, sw, pt, pl, dh, dw, wo,
             lo_, hi_):  # fmt: skip
        cout = sums.shape[2]
        im2col(x, n, g * cin, cin, kh, kw, sh, sw, pt, pl, dh, dw, wo, oh0, oh1, lo_, hi_, cols)
        grad = g3[n, g * cout : (g + 1) * cout, oh0 * wo : oh1 * wo]
        blas.gemm(grad, cols, sums[p, g], False, True, 1.0)

    return step


def _nchw_parts(geo, dtype, scatter=False):
    """(an im2col buffer per part, output rows per block, rows per unit of the parts) of
    the channels-first block loop (Note [Parts of images])."""
    parts, unit = _parts_of(geo, geo.ho, scatter)
    rows = geo.nchw_rows(np.dtype(dtype).itemsize, parts)
    return np.empty((parts, geo.k * min(rows, geo.ho) * geo.wo), dtype), rows, unit


@jit.jitable
def row_block(r, stop, ho, rows):
    """The block of output rows from row r of the batch (image r // ho) in a part ending
    at row ``stop``: (image, its first row, its end row), at most ``rows`` rows of one
    image."""
    n, oh0 = r // ho, r % ho
    return n, oh0, min(ho, oh0 + rows, oh0 + stop - r)


def _nchw_geometry(geo):
    """The channels-first block loop's integers before the rows per block."""
    return (geo.n, geo.groups, geo.cin, *geo.args(), geo.ho, geo.wo)


# Note [Flat planes]: with stride 1, the NCHW im2col row of kernel tap (c, i, j) for
# output rows [oh0, oh1) is one contiguous run of the zero-padded input plane c,
# read at (oh0 + i dh) * Wp + j dw, if the output is computed Wp columns wide (the
# padded width) and its Wp - Wo extra columns are dropped: one copy per row of the
# block instead of one per (row, output row). Measured on 16x64x56x56, one thread:
# im2col 19 ms -> ~3 ms for the whole convolution, for 3.5% more GEMM work. The planes
# end with slack, so the last plane's runs stay inside the buffer; the extra columns
# read the next plane's first values, which only the dropped columns see.
# With stride (sh, sw) the padded plane is first split into its sh x sw phase planes of
# Hq x Wq = ceil(Hp / sh) x ceil(Wp / sw) pixels, phase (a, b) holding the pixels [a::sh,
# b::sw]: tap (i, j) reads phase (i dh % sh, j dw % sw) from row i dh // sh and column
# j dw // sw on, again a contiguous run with the output computed Wq wide. The phases are
# one more copy of the input, which pays where the taps read each pixel PHASE_READS
# times or more on average (kh kw / (sh sw), dilation 1); elsewhere (3 x 3 stride 2, a
# 1 x 1 stride-2 shortcut) the strided rows are gathered as before (_im2col_nchw).
# Measured float32, the old gather / phases, forward only, one thread: Inception's 7 x 7
# stride 2 (3 -> 32 channels, 64 x 64 images) 0.32 / 0.19 ms at batch 1 and 8.4 / 5.1
# ms at batch 32, ResNet's 7 x 7 stride 2 (3 -> 64) at batch 8 3.1 / 2.2 ms, AlexNet's
# 11 x 11 stride 4 at batch 1 0.22 / 0.17 ms (equal at batch 32); a 3 x 3 stride 2 took
# 0.92-1.0x as long.
PHASE_READS = 4


def _flat_planes(x, geo):
    """(flat buffer of x's padded planes split into phases, Note [Flat planes]; the
    offset of each kernel tap's run in its channel's planes; the elements of a
    channel's planes; their width)."""
    (sh, sw), (dh, dw) = (geo.sh, geo.sw), (geo.dh, geo.dw)
    hq, wq = -(-(geo.h + geo.pt + geo.pb) // sh), -(-(geo.w + geo.pl + geo.pr) // sw)
    size = geo.n * geo.c * sh * sw * hq * wq
    flat = np.empty(size + (geo.kw - 1) * dw // sw, x.dtype)
    flat[size:] = 0
    planes = flat[:size].reshape(geo.n * geo.c, sh * sw * hq * wq)
    parallel = threads.parts_for(size, len(planes)) > 1
    if (sh, sw) == (1, 1):
        _kernel(_pad_planes, x.dtype, parallel)(x, geo.pt, geo.pl, hq, wq, planes)
    else:
        _kernel(_phase_planes, x.dtype, parallel)(x, geo.pt, geo.pl, sh, sw, hq, wq, planes)
    i, j = np.divmod(np.arange(geo.kh * geo.kw), geo.kw)
    phases = (i * dh % sh) * sw + j * dw % sw
    taps = (phases * hq + i * dh // sh) * wq + j * dw // sw
    return flat, taps, planes.shape[1], wq


# Note [Flat block loops]: the block loop of Note [Flat planes], ``flat_blocks``, is one
# kernel per step (the forward pass's, the weight gradient's), without the GIL, where
# kernels can call the BLAS (Note [GEMM in kernels]), else the same code runs from
# Python over the im2col kernel's entry point (``_block_loop``, as the other block
# loops); a parallel loop over parts of the images (Note [Split convolutions]), with
# buffers (and weight-gradient sums) per part. Run from Python, a split's two parts took
# turns at the GIL a few times per block and each turn woke a sleeping thread. Measured
# on VGG's first convolution (3 -> 16 channels, 64 x 64, batch 64, float32), one thread
# / two, the loops in Python and as kernels alternating in one process: forward 6.97 /
# 5.49 ms (1.27x) -> 6.84 / 4.19 ms (1.63x), weight gradient 11.96 / 8.38 ms (1.43x) ->
# 12.61 / 6.80 ms (1.85x).


@jit.jitable
def flat_block(n, oh0, oh1, channels, plane, wq, k, cols_buf):
    """Block [oh0, oh1) of image n's output rows: (its span (rows times the planes'
    width), the offsets of the image's channels' planes in the flat buffer, ``plane``
    elements apart, the (k, span) view of cols_buf)."""
    span = (oh1 - oh0) * wq
    base = (n * channels + np.arange(channels)) * plane
    return span, base, cols_buf[: k * span].reshape(k, span)


def flat_blocks(step):
    """The flat block loop (Note [Flat block loops]): ``step(flat, b, out, p, n, oh0,
    oh1, span, base, cols, wide_buf, taps, wq, groups, cin)`` for each block [oh0, oh1)
    of output rows of image n in part p (the parts cut at any row of the batch: Note
    [Parts of images]; ``flat_block``'s span, base and cols; wide_buf part p's wide
    buffer)."""

    def run(flat, b, plane, wq, rows, images, groups, cin, ho, taps, cols_bufs, wide_bufs,
            out):  # fmt: skip
        k = cin * taps.size
        for p in jit.prange(cols_bufs.shape[0]):
            r, stop = jit.part(images * ho, cols_bufs.shape[0], p)
            while r < stop:
                n, oh0, oh1 = row_block(r, stop, ho, rows)
                r += oh1 - oh0
                span, base, cols = flat_block(n, oh0, oh1, cin * groups, plane, wq, k,
                                              cols_bufs[p])  # fmt: skip
                step(flat, b, out, p, n, oh0, oh1, span, base, cols, wide_bufs[p], taps, wq,
                     groups, cin)  # fmt: skip

    return run


def flat_forward_step(im2col):
    """out (N, groups * cout, ho, wo) rows [oh0, oh1) of image n = weights[g] (cout, k)
    @ the block's im2col, group by group, the planes' extra columns dropped."""

    def step(flat, weights, out, p, n, oh0, oh1, span, base, cols, wide_buf, taps, wq, groups,
             cin):  # fmt: skip
        cout, wo = weights.shape[1], out.shape[3]
        wide = wide_buf[: cout * span].reshape(cout, span)
        for g in range(groups):
            im2col(flat, base[g * cin : (g + 1) * cin], taps, wq, oh0, span, cols)
            blas.gemm(weights[g], cols, wide, False, False, 0)
            block = wide.reshape(cout, oh1 - oh0, wq)
            jit.assign(out[n, g * cout : (g + 1) * cout, oh0:oh1], block[:, :, :wo])

    return step


def flat_weight_grad_step(im2col):
    """sums[p, g] (cout, k) += image n's grad block, widened to the planes' width with
    zeros in the extra columns, times the block's im2col transposed."""

    def step(flat, grad, sums, p, n, oh0, oh1, span, base, cols, wide_buf, taps, wq, groups,
             cin):  # fmt: skip
        cout, k, wo = sums.shape[2], sums.shape[3], grad.shape[3]
        wide = wide_buf[: groups * cout * span].reshape(groups * cout, oh1 - oh0, wq)
        jit.assign(wide[:, :, :wo], grad[n, :, oh0:oh1])  # Note [Assignment in kernels]
        jit.assign(wide[:, :, wo:], 0)
        block = wide.reshape(groups * cout, span)
        for g in range(groups):
            im2col(flat, base[g * cin : (g + 1) * cin], taps, wq, oh0, span, cols)
            # the extra columns read the next row's values: zero times an infinity or a
            # NaN there would be NaN
            jit.assign(cols.reshape(k, oh1 - oh0, wq)[:, :, wo:], 0)
            blas.gemm(block[g * cout : (g + 1) * cout], cols, sums[p, g], False, True, 1)

    return step


def _flat_buffers(geo, wq, dtype):
    """(the im2col and the wide buffer of each part, output rows per block) of the flat
    block loops."""
    parts, _ = _parts_of(geo, geo.ho, scatter=False)
    rows = max(1, _part_bytes(parts) // (geo.k * wq * np.dtype(dtype).itemsize))
    span = min(rows, geo.ho) * wq
    return (np.empty((parts, c * span), dtype) for c in (geo.k, geo.c_out)), rows


def _flat_loop(step, x, b, geo, out_for):
    """The flat block loop of ``step`` over images x with b (the weights or the
    gradient), into ``out_for(parts)`` (Note [Flat planes]), which it returns."""
    flat, taps, plane, wq = _flat_planes(x, geo)
    (cols, wide), rows = _flat_buffers(geo, wq, x.dtype)
    out = out_for(len(cols))
    loop = _block_loop(step, x.dtype, len(cols) > 1)
    loop(flat, b, plane, wq, rows, geo.n, geo.groups, geo.cin, geo.ho, taps, cols, wide, out)
    return out


# Note [Small planes]: NCHW im2col blocks hold one image's output rows, so a
# convolution with small output planes would run one skinny GEMM per image; the
# channels-last GEMM (Note [Convolution]) runs over many images but needs the weight
# reordered to (kh kw C_in, C_out), a pass over the weight on every call that at
# ResNet's late stages (3 x 3, 512 channels, 4 x 4 images) cost ten times the
# convolution. So a convolution whose output planes have at most SMALL_PLANE pixels,
# that no Winograd route takes and whose weight is the bigger operand (no more output
# pixels in the batch than output channels), runs over blocks of whole images
# channels-first: the block's im2col matrix is (C_in kh kw, images x pixels), and
#
#     out[C_out, images x pixels] = W[C_out, C_in kh kw] @ cols
#
# is one GEMM with the weight as it is stored, never copied; the input gradient is W^T @
# grad scattered back, the weight gradient grad @ cols^T, already in the weight's order.
# The block's images are zero-padded once and the matrix copied out of them image plane
# by image plane (_im2col_blocks; its scatter _col2im_blocks), each plane read from the
# L1 cache by all its taps: the NCHW im2col kernel copies one output row at a time,
# which for rows of 4 to 8 pixels took 3x as long (256 channels, 8 x 8 -> 4 x 4 by
# stride 2, batch 32: 5.6 against 1.7 ms), and one strided NumPy copy per tap 1.1x, its
# addition 3x (measured one thread, 16 images of 512 channels 4 x 4: copy 1.55 ->
# 1.33-1.48 ms, scatter 4.2 -> 1.33 ms). The block's result is transposed into the
# images and the images' gradient out of them (small at that size); channels-last images
# are transposed to NCHW and back. Measured one thread, forward + both gradients, before
# / after (PyTorch's in the same run): ResNet's 512 -> 512 3 x 3 on 2 x 2 images at
# batch 1 43.3 / 3.1 ms (2.4), at batch 32 53.5 / 19.5 ms (24.5); its 3 x 3 stride 2
# from 256 to 512 channels 19.4 / 2.2 ms (1.5) and 40.5 / 29.8 ms (34.3). With more
# pixels than channels the convolution runs channels-last, its operands and result
# transposed: AlexNet's 5 x 5 on 7 x 7 (48 -> 128 channels) at batch 32, forward and
# both gradients, 34 -> 19 ms against NCHW blocks of one image. But channels-first
# images of at most SMALL_PLANE output pixels in all (one image, in inference) run over
# image blocks whatever their channels: there the channels-last path's transposes and
# weight reordering cost more than its GEMM saved. Measured float32, one thread, the
# forward pass / with both gradients, us: Inception's 3 x 3 from 32 to 48 channels on
# 8 x 8 at batch 1 55-67 / 289-351 -> 47 / 235, its 5 x 5 from 12 to 24 38-41 / 235-326
# -> 31-32 / 191-196. Channels-last images, which need no transposes there, stay.
SMALL_PLANE = 100
# A 1x1 convolution's NCHW products run image by image, (C_out, C_in) @ (C_in, pixels),
# nearly matrix-vector products on MobileNet's late 4 x 4 and 2 x 2 images; channels-last
# it is one GEMM over the batch (the weight as stored), which with its transposes in and
# out took the forward pass and both gradients at batch 8, one thread, from 0.98 to 0.49
# ms (160 -> 960 channels, 2 x 2; PyTorch 0.76) and 6.3 to 1.2 ms (320 -> 1280; 2.2);
# on 8 x 8 images the transposes cost more than they saved.
SMALL_POINTWISE_PLANE = 16


def _batched(geo, dtype, layout=NCHW):
    """Whether this convolution of images in ``layout`` runs over blocks of whole
    images (Note [Small planes]); where its order is NCHW, either layout's answer."""
    most = max(geo.c_out, SMALL_PLANE) if layout == NCHW else geo.c_out
    return (
        geo.ho * geo.wo <= SMALL_PLANE
        and 0 < geo.n * geo.ho * geo.wo <= most  # empty batches: the general path
        and not geo.pointwise
        and not depthwise.applies(geo)
        and winograd.algorithm(geo, dtype) is None
        and not _by_groups(geo, dtype)
        and _space_to_depth(geo, dtype, NCHW) is None
    )


def _image_blocks(geo, itemsize):
    """(first image, last image + 1) of each block of Note [Small planes]."""
    return _blocks(geo.n, max(1, BLOCK_BYTES // (geo.k * geo.ho * geo.wo * itemsize)))


def _padded(geo, images, dtype):
    """Zeros in the shape of ``images`` NCHW images padded, and the view of their
    interior."""
    hp, wp = geo.h + geo.pt + geo.pb, geo.w + geo.pl + geo.pr
    padded = np.zeros((images, geo.c, hp, wp), dtype)
    return padded, padded[:, :, geo.pt : geo.pt + geo.h, geo.pl : geo.pl + geo.w]


def _tap_args(geo, g):
    """The arguments of _im2col_blocks and _col2im_blocks after the arrays, for group g."""
    return (g * geo.cin, geo.cin, geo.kh, geo.kw, geo.sh, geo.sw, geo.dh, geo.dw, geo.ho, geo.wo)


def _channels_first(a):
    """NCHW images as one (C, images x pixels) matrix (a copy)."""
    return np.ascontiguousarray(a.transpose(1, 0, 2, 3)).reshape(a.shape[1], -1)


def _forward_batched(x, w, geo, out):
    for i0, i1 in _image_blocks(geo, x.itemsize):
        padded, interior = _padded(geo, i1 - i0, x.dtype)
        interior[...] = x[i0:i1]
        cols = np.empty((geo.k, (i1 - i0) * geo.ho * geo.wo), x.dtype)
        product = np.empty((geo.cout, cols.shape[1]), x.dtype)
        for g in range(geo.groups):
            _blocks_kernel(_im2col_blocks, cols, geo.cin)(padded, *_tap_args(geo, g), cols)
            gemm.product(_nchw_weight(w, g, geo), cols, product)
            block = product.reshape(geo.cout, i1 - i0, geo.ho, geo.wo)
            out[i0:i1, _cols(g, geo.cout)] = block.transpose(1, 0, 2, 3)


def _input_grad_batched(gk, w, geo, gx):
    for i0, i1 in _image_blocks(geo, gk.itemsize):
        padded, interior = _padded(geo, i1 - i0, gk.dtype)
        grad = _channels_first(gk[i0:i1])
        cols = np.empty((geo.k, grad.shape[1]), gk.dtype)
        for g in range(geo.groups):
            gemm.product(_nchw_weight(w, g, geo).T, grad[_cols(g, geo.cout)], cols)
            _blocks_kernel(_col2im_blocks, cols, geo.cin)(cols, padded, *_tap_args(geo, g))
        gx[i0:i1] = interior


def _weight_grad_batched(gk, x, geo):
    sums = np.empty((geo.groups, geo.cout, geo.k), x.dtype)
    part = np.empty((geo.cout, geo.k), x.dtype)
    for i0, i1 in _image_blocks(geo, x.itemsize):
        padded, interior = _padded(geo, i1 - i0, x.dtype)
        interior[...] = x[i0:i1]
        grad = _channels_first(gk[i0:i1])
        cols = np.empty((geo.k, grad.shape[1]), x.dtype)
        for g in range(geo.groups):
            _blocks_kernel(_im2col_blocks, cols, geo.cin)(padded, *_tap_args(geo, g), cols)
            gemm.product(grad[_cols(g, geo.cout)], cols.T, sums[g] if i0 == 0 else part)
            if i0:
                sums[g] += part
    return sums.reshape(geo.c_out, geo.cin, geo.kh, geo.kw)


# Note [Taps inside tiny planes]: on images of a few pixels, most of a padded kernel's
# taps fall on the padding: a 3 x 3 convolution on 2 x 2 images meets 4 of its 9 taps
# inside the image at each output pixel, so the image-block GEMM (Note [Small planes])
# multiplies zeros in 5 of every 9 products. Where the output planes have at most
# TINY_PLANE pixels and at most half the taps fall inside (stride 1, no dilation, one
# group), each output pixel runs one GEMM per kernel row that meets the image, over
# just the kernel columns that do:
#
#     out[oh, ow] (C_out, N) += W[:, i, j0:j1, :] (C_out, (j1 - j0) C_in)
#                               @ x[ih, iw0:iw1] ((j1 - j0) C_in, N)
#
# with the images pixel-major (H, W, C_in, N), so that a kernel row's pixels are one
# contiguous matrix, and the weight tap-major (C_out, kH kW C_in) from the filter cache,
# so that its columns for a run of taps are one strided matrix. The input gradient adds
# W[:, i, j0:j1, :]^T @ grad[oh, ow] into those pixels, the weight gradient grad[oh, ow]
# @ x[ih, iw0:iw1]^T into those taps. The padding's zeros are never multiplied, where
# the other paths multiply them: so a weight (forward, input gradient) or a gradient
# (weight gradient) with an infinity or NaN takes the image-block path, whose NaN
# where such a value meets the padding is the direct sum's (numpy_ref's). ResNet-18's
# 512 -> 512 3 x 3 convolutions on 2 x 2 images at batch 32, float32, before -> after:
# forward 7.7-9.2 -> 4.4-5.0 ms on one thread (PyTorch, NCHW: 5.1), 4.3-5.1 -> 2.7-3.1
# on two; with both gradients 25-28.6 -> 15.6-16 and 13.3-13.9 -> 10.6-11.5.
TINY_PLANE = 4


def _by_taps(geo):
    """Whether this convolution runs over the taps inside its tiny planes (Note [Taps
    inside tiny planes])."""
    if geo.ho * geo.wo > TINY_PLANE or not geo.n or not geo.k:
        return False
    if (geo.sh, geo.sw, geo.dh, geo.dw, geo.groups) != (1, 1, 1, 1, 1):
        return False
    inside = sum((i1 - i0) * (j1 - j0) for _, _, (i0, i1), (j0, j1) in _tap_windows(geo))
    return 2 * inside <= geo.ho * geo.wo * geo.kh * geo.kw


def _tap_windows(geo):
    """(oh, ow, kernel rows [i0, i1), kernel columns [j0, j1)) of each output pixel:
    the taps that fall inside the image (stride 1, no dilation)."""
    for oh in range(geo.ho):
        rows = (max(0, geo.pt - oh), min(geo.kh, geo.h + geo.pt - oh))
        for ow in range(geo.wo):
            yield oh, ow, rows, (max(0, geo.pl - ow), min(geo.kw, geo.w + geo.pl - ow))


def _pixel_major(a, layout):
    """Images (kernel order ``layout``) as a C array (H, W, C, N)."""
    return np.ascontiguousarray(a.transpose((2, 3, 1, 0) if layout == NCHW else (1, 2, 3, 0)))


def _from_pixel_major(t, layout, out):
    """out (images in ``layout``) = t (H, W, C, N)."""
    out[...] = t.transpose((3, 2, 0, 1) if layout == NCHW else (3, 0, 1, 2))


def _tap_major(w):
    """(C_out, C_in, kH, kW) -> (C_out, kH kW C_in); None where w is not finite (Note
    [Taps inside tiny planes])."""
    if not np.isfinite(w).all():
        return None
    return converted(w, NHWC).reshape(w.shape[0], -1)  # output channels as images


def _tap_weight(w, geo):
    """The tap-major weight (filter cache) where this convolution runs over the taps
    inside its tiny planes, else None."""
    if not _by_taps(geo):
        return None
    return prepared(w, "tap-major", _tap_major, reused=True)  # input gradient: again


def _tap_runs(geo):
    """Per output pixel (oh, ow), each kernel row i meeting the image: (oh, ow, input
    row, input columns [a, b), the tap-major weight's columns [c0, c1))."""
    for oh, ow, (i0, i1), (j0, j1) in _tap_windows(geo):
        for i in range(i0, i1):
            a = ow - geo.pl + j0
            cols = ((i * geo.kw + j0) * geo.c, (i * geo.kw + j1) * geo.c)
            yield oh, ow, oh - geo.pt + i, (a, a + j1 - j0), cols


def _forward_taps(x, wt, geo, layout, out):
    xt = _pixel_major(x, layout)
    ot = np.zeros((geo.ho, geo.wo, geo.c_out, geo.n), x.dtype)
    for oh, ow, ih, (a, b), (c0, c1) in _tap_runs(geo):
        gemm.product(wt[:, c0:c1], xt[ih, a:b].reshape(-1, geo.n), ot[oh, ow], 1.0)
    _from_pixel_major(ot, layout, out)


def _input_grad_taps(gk, wt, geo, layout, gx):
    gt = _pixel_major(gk, layout)
    xt = np.zeros((geo.h, geo.w, geo.c, geo.n), gk.dtype)
    for oh, ow, ih, (a, b), (c0, c1) in _tap_runs(geo):
        gemm.product(wt[:, c0:c1].T, gt[oh, ow], xt[ih, a:b].reshape(-1, geo.n), 1.0)
    _from_pixel_major(xt, layout, gx)


def _weight_grad_taps(x, gk, geo, layout):
    xt, gt = _pixel_major(x, layout), _pixel_major(gk, layout)
    wt = np.zeros((geo.c_out, geo.kh * geo.kw * geo.c), x.dtype)
    for oh, ow, ih, (a, b), (c0, c1) in _tap_runs(geo):
        gemm.product(gt[oh, ow], xt[ih, a:b].reshape(-1, geo.n).T, wt[:, c0:c1], 1.0)
    return converted(wt.reshape(geo.c_out, geo.kh, geo.kw, geo.c), NCHW)


def _order(geo, layout, dtype, mode="forward"):
    """The memory order the kernel of ``mode`` ("forward", "input" or "weight": the
    gradients) of this convolution runs in (Note [Small planes]; a depthwise one's NCHW
    rows of small planes would be too short to vectorize, Note [Depthwise order]; a 1x1
    one's products on small planes too small, SMALL_POINTWISE_PLANE)."""
    if _batched(geo, dtype, layout):
        return NCHW
    if depthwise.applies(geo):
        return NHWC if layout == NCHW and depthwise.channels_last(geo, mode) else layout
    if layout == NCHW and geo.pointwise:
        return NHWC if geo.ho * geo.wo <= SMALL_POINTWISE_PLANE else NCHW
    if layout == NCHW and geo.ho * geo.wo <= SMALL_PLANE and winograd.algorithm(geo, dtype) is None:
        return NHWC
    return layout


def _reorder(a, src, dst):
    """Kernel-order images ``a`` in order ``src`` as a C-contiguous array in ``dst``
    (Note [Transposes] in layout.py)."""
    return a if src == dst else converted(a, dst)


def _copied(view, out):
    """out[...] = view, in parts along the first axis on lamina's threads from
    PARALLEL_ELEMENTS elements (NumPy's copy gives up the GIL): the flipped weight of a
    transposed convolution, whose reversed axes are no transposition of two axes (those
    are layout.converted's tiles, Note [Transposes])."""

    def part(i0, i1):
        np.copyto(out[i0:i1], view[i0:i1])

    if threads.parts_for(out.size, len(out)) > 1:
        threads.split(part, len(out))
    else:
        part(0, len(out))
    return out


# Note [Strided convolutions]: a convolution with stride s (and kernel k, dilation 1,
# groups 1) is a stride-1 convolution of the "space-to-depth" input -- each s x s
# block of the padded input's pixels made channels, C s^2 of them -- with a kernel of
# ceil(k / s) taps per axis (the weight zero-padded to a multiple of s and regrouped the
# same way): the same products summed in another order. Where the stride-1 one is
# Winograd's (Note [Winograd family]), it runs that way: AlexNet's 11x11 stride 4 on 3
# channels becomes a 3x3 on 48, Inception's 7x7 stride 2 a 4x4 on 12. Measured one
# thread, batch 32 of 64 x 64 images, forward / weight gradient: AlexNet's 6.3 / 7.5 ms
# by im2col -> 4.6 / 4.3 ms, Inception's 9.8 / 10.7 -> 5.9 / 6.0 ms.
class _SpaceToDepth:
    """The stride-1 convolution equal to a strided one (Note [Strided convolutions]),
    and the maps of its operands and gradients."""

    def __init__(self, geo):
        self.outer = geo
        s_h, s_w = geo.sh, geo.sw
        kh, kw = -(-geo.kh // s_h), -(-geo.kw // s_w)
        self.hs, self.ws = geo.ho + kh - 1, geo.wo + kw - 1  # the stride-1 input
        c = geo.c * s_h * s_w
        shape, weight = (geo.n, c, self.hs, self.ws), (geo.c_out, c, kh, kw)
        self.geo = Geometry(shape, weight, (1, 1), (0, 0, 0, 0), (1, 1), 1)

    def _window(self):
        """(rows, columns) of the padded input the blocks cover, as slices of it and
        of the input: (padded rows, input rows), (padded columns, input columns)."""
        o = self.outer
        spans = []
        for size, pad, covered in ((o.h, o.pt, self.hs * o.sh), (o.w, o.pl, self.ws * o.sw)):
            lo, hi = max(0, -pad), min(size, covered - pad)
            spans.append((slice(lo + pad, hi + pad), slice(lo, hi)))
        return spans

    def input(self, x, layout):
        """x (images in ``layout``) as the stride-1 convolution's input."""
        o = self.outer
        (pr, xr), (pc, xc) = self._window()
        if layout == NHWC:
            padded = np.zeros((o.n, self.hs * o.sh, self.ws * o.sw, o.c), x.dtype)
            padded[:, pr, pc] = x[:, xr, xc]
            blocks = padded.reshape(o.n, self.hs, o.sh, self.ws, o.sw, o.c)
            return np.ascontiguousarray(blocks.transpose(0, 1, 3, 5, 2, 4)).reshape(
                o.n, self.hs, self.ws, -1
            )
        padded = np.zeros((o.n, o.c, self.hs * o.sh, self.ws * o.sw), x.dtype)
        padded[:, :, pr, pc] = x[:, :, xr, xc]
        blocks = padded.reshape(o.n, o.c, self.hs, o.sh, self.ws, o.sw)
        return np.ascontiguousarray(blocks.transpose(0, 1, 3, 5, 2, 4)).reshape(
            o.n, -1, self.hs, self.ws
        )

    def input_grad(self, gxs, layout):
        """The adjoint of ``input``: the stride-1 input's gradient as x's."""
        o = self.outer
        (pr, xr), (pc, xc) = self._window()
        if layout == NHWC:
            blocks = gxs.reshape(o.n, self.hs, self.ws, o.c, o.sh, o.sw).transpose(0, 1, 4, 2, 5, 3)
            padded = blocks.reshape(o.n, self.hs * o.sh, self.ws * o.sw, o.c)
            gx = np.zeros((o.n, o.h, o.w, o.c), gxs.dtype)
            gx[:, xr, xc] = padded[:, pr, pc]
            return gx
        blocks = gxs.reshape(o.n, o.c, o.sh, o.sw, self.hs, self.ws).transpose(0, 1, 4, 2, 5, 3)
        padded = blocks.reshape(o.n, o.c, self.hs * o.sh, self.ws * o.sw)
        gx = np.zeros((o.n, o.c, o.h, o.w), gxs.dtype)
        gx[:, :, xr, xc] = padded[:, :, pr, pc]
        return gx

    def weight(self, w):
        o, g = self.outer, self.geo
        padded = np.zeros((o.c_out, o.c, g.kh * o.sh, g.kw * o.sw), w.dtype)
        padded[:, :, : o.kh, : o.kw] = w
        blocks = padded.reshape(o.c_out, o.c, g.kh, o.sh, g.kw, o.sw)
        return np.ascontiguousarray(blocks.transpose(0, 1, 3, 5, 2, 4)).reshape(
            g.c_out, g.cin, g.kh, g.kw
        )

    def weight_grad(self, gws):
        """The adjoint of ``weight``."""
        o, g = self.outer, self.geo
        blocks = gws.reshape(o.c_out, o.c, o.sh, o.sw, g.kh, g.kw).transpose(0, 1, 4, 2, 5, 3)
        padded = blocks.reshape(o.c_out, o.c, g.kh * o.sh, g.kw * o.sw)
        return np.ascontiguousarray(padded[:, :, : o.kh, : o.kw])


def _space_to_depth(geo, dtype, layout, mode="forward"):
    """The _SpaceToDepth of a strided convolution of images in ``layout`` that
    Winograd then takes in its ``mode`` pass, or None (also where that pass runs
    direct: Note [Direct convolution of few channels])."""
    if (geo.sh, geo.sw) == (1, 1) or (geo.dh, geo.dw, geo.groups) != (1, 1, 1):
        return None
    if direct.applies(geo, layout, mode):
        return None
    s2d = _SpaceToDepth(geo)
    return s2d if winograd.algorithm(s2d.geo, dtype) is not None else None


def conv2d(ks, input, weight, bias, stride, padding, dilation, groups):
    return _conv2d(input, weight, bias, (stride, padding, dilation, groups), NO_FLOOR)


def conv2d_relu(ks, input, weight, bias, stride, padding, dilation, groups):
    """relu(conv2d(...)) in conv2d's passes (Note [Fused epilogues])."""
    return _conv2d(input, weight, bias, (stride, padding, dilation, groups), RELU)


# Note [Convolutions of a plan]: a compiled program calls one convolution node with the
# same shapes, layout and arguments call after call (its guards: Note [Kernels of
# plans] in lamina.jit's executor), so the node's kernel (``for_plan``) keeps the
# Geometry, with its decisions (Note [Decisions of one call]), and the memory order
# between calls, made again only where the key changes: the shapes (a symbolic size),
# the thread count or the float32 precision, which the decisions read. At most
# PLANS_KEPT keys are kept. Measured float32, one thread, a 1 x 1 convolution on an
# 8 x 8 image (64 -> 48 channels) at batch 1: ~5 us of its ~20 us.
PLANS_KEPT = 8


def _for_plan(floor):
    plans = {}

    def planned(ks, input, weight, bias, stride, padding, dilation, groups):
        return _conv2d(input, weight, bias, (stride, padding, dilation, groups), floor, plans)

    return planned


conv2d.for_plan = lambda: _for_plan(NO_FLOOR)
conv2d_relu.for_plan = lambda: _for_plan(RELU)


def _planned(shape, layout, dtype, weight_shape, geometry, plans):
    """(geometry, memory order) of a convolution of images of logical ``shape`` in
    ``layout``: kept in ``plans`` where given (Note [Convolutions of a plan])."""
    if plans is None:
        geo = Geometry(shape, weight_shape, *geometry)
        return geo, _order(geo, layout, dtype)
    key = (shape, layout, dtype, weight_shape, geometry, threads.get_num_threads(),
           precision.fast_float32())  # fmt: skip
    found = plans.get(key)
    if found is None:
        if len(plans) >= PLANS_KEPT:
            plans.clear()
        found = plans[key] = _planned(shape, layout, dtype, weight_shape, geometry, None)
    return found


def _conv2d(input, weight, bias, geometry, floor, plans=None):
    x, layout, unbatched = image(input)
    shape = (x.shape[0], *input._shape[-3:])
    geo, order = _planned(shape, layout, x.dtype, weight._shape, geometry, plans)
    out = empty_image(geo.n, geo.c_out, geo.ho, geo.wo, x.dtype, order)
    b = _bias(bias)
    if not geo.k:  # no input channels: every output is the bias (PyTorch's result)
        out[...] = 0 if b is None else (b if order == NHWC else b[:, None, None])
        _epilogue(out, None, order, floor)
    else:
        _forward(_reorder(x, layout, order), weight._data, b, geo, order, out, floor)
    return from_array(logical(_reorder(out, order, layout), layout, unbatched))


def _forward(x, w, bias, geo, layout, out, floor=NO_FLOOR):
    """out = the convolution of images x (in ``layout``) with w, plus bias, raised to
    ``floor`` (Note [Fused epilogues]): by Winograd (Note [Winograd]) where it suits,
    else by blocked im2col (Note [Convolution]); depthwise by direct loops (Note
    [Depthwise convolution])."""
    if depthwise.applies(geo):  # in parallel inside (Note [Depthwise parts])
        depthwise.forward(x, w, bias, geo, layout, out)
        return _epilogue(out, None, layout, floor)  # the sums started from the bias
    if direct.applies(geo, layout):  # Note [Direct convolution of few channels]
        direct.forward(x, w, bias, geo, layout, out)
        return _epilogue(out, None, layout, floor)
    if _by_groups(geo, x.dtype):
        one = _one_group(geo)
        for g in range(geo.groups):
            part = empty_image(geo.n, geo.cout, geo.ho, geo.wo, x.dtype, layout)
            b = None if bias is None else bias[_cols(g, geo.cout)]
            xg, wg = _channels(x, g, geo.cin, layout), w[_cols(g, geo.cout)]
            _forward(xg, wg, b, one, layout, part, floor)
            _channel_view(out, g, geo.cout, layout)[...] = part
        return
    s2d = _space_to_depth(geo, x.dtype, layout)
    if s2d is not None:
        weight = prepared(w, ("space to depth", geo.sh, geo.sw), s2d.weight)
        return _forward(s2d.input(x, layout), weight, bias, s2d.geo, layout, out, floor)
    wt = _tap_weight(w, geo)
    if wt is not None:
        _forward_taps(x, wt, geo, layout, out)
        return _epilogue(out, bias, layout, floor)
    if layout == NCHW and _batched(geo, x.dtype):
        im2col = _forward_batched
    else:
        im2col = _forward_nhwc if layout == NHWC else _forward_nchw

    alg, u = winograd.forward_filters(w, geo, x.dtype)
    if alg is None or not winograd.forward(x, u, alg, geo, layout, bias, floor, out):
        im2col(x, w, geo, out)
        _epilogue(out, bias, layout, floor)


# ---------------------------------------------------------------- backward: input


def _backward_input_nhwc(g2, w, geo, dtype, gx):
    """Accumulates into gx (zeros)."""
    if geo.pointwise:
        gx2 = gx.reshape(-1, geo.c)
        for g in range(geo.groups):
            wg = _pointwise_weight(w, g, geo)
            gemm.product(g2[:, _cols(g, geo.cout)], wg, gx2[:, _cols(g, geo.cin)])
        return
    parts, size, unit = _nhwc_parts(geo, dtype, scatter=True)
    loop = _block_loop(nhwc_input_grad_step, dtype, len(parts) > 1)
    loop(g2, _nhwc_weights(w, geo), *_nhwc_geometry(geo), size, unit, parts, gx)


def _backward_input_nchw(g3, w, geo, dtype, gx):
    """Accumulates into gx (zeros)."""
    weights = [_nchw_weight(w, g, geo) for g in range(geo.groups)]
    if geo.pointwise:
        gx3 = gx.reshape(geo.n, geo.c, geo.h * geo.w)
        for g, wg in enumerate(weights):
            gemm.batched(wg.T[None], g3[:, _cols(g, geo.cout)], gx3[:, _cols(g, geo.cin)])
        return
    parts, rows, unit = _nchw_parts(geo, dtype, scatter=True)
    loop = _block_loop(nchw_input_grad_step, dtype, len(parts) > 1)
    loop(np.ascontiguousarray(g3), np.stack(weights), *_nchw_geometry(geo), rows, unit,
         *geo.columns(), parts, gx)  # fmt: skip


def _flipped(w, geo):
    """The kernel of the transposed convolution: per group, input and output channels
    swapped and both spatial axes reversed ((C_in, C_out / groups, kh, kw)), copied by
    ``_copied``: 512 x 512 x 3 x 3 float32 3.7 -> 1.8 ms on one thread, 1.6 on two
    (NumPy's concatenate of the reversed views, then, was the slower copy)."""
    out = np.empty((geo.c, geo.cout, geo.kh, geo.kw), w.dtype)
    for g in range(geo.groups):
        flipped = w[_cols(g, geo.cout)].transpose(1, 0, 2, 3)[:, :, ::-1, ::-1]
        _copied(flipped, out[_cols(g, geo.cin)])
    return out


def _transposed(geo, wf):
    """The geometry of the input gradient of a stride-1 convolution as the forward
    convolution of grad with the flipped kernel ``wf`` (``_flipped``), padded by the
    kernel's extent minus the padding: the forward pass's algorithms, no col2im scatter."""
    padding = (
        geo.dh * (geo.kh - 1) - geo.pt,
        geo.dh * (geo.kh - 1) - geo.pb,
        geo.dw * (geo.kw - 1) - geo.pl,
        geo.dw * (geo.kw - 1) - geo.pr,
    )
    shape = (geo.n, geo.c_out, geo.ho, geo.wo)
    return Geometry(shape, wf.shape, (1, 1), padding, (geo.dh, geo.dw), geo.groups)


def conv2d_backward_input(ks, grad, weight, input, stride, padding, dilation, groups):
    """The gradient in the input's layout: grad is converted to it (once, where the
    layouts differ, as after a flatten)."""
    _, layout, unbatched = image(input)
    geo = Geometry(input._shape, weight._shape, stride, padding, dilation, groups)
    w, dtype = weight._data, grad._data.dtype
    order = _order(geo, layout, dtype, "input")
    gk = _reorder(in_layout(grad._data, layout, unbatched), layout, order)
    s2d = _space_to_depth(geo, dtype, order)
    if not geo.k:  # no input channels: an empty gradient
        gx = empty_image(geo.n, geo.c, geo.h, geo.w, dtype, order)
    elif s2d is None:
        gx = _input_grad(gk, w, geo, order, dtype)
    else:
        gx = s2d.input_grad(_input_grad(gk, s2d.weight(w), s2d.geo, order, dtype), order)
    return from_array(logical(_reorder(gx, order, layout), layout, unbatched))


def _input_grad(gk, w, geo, order, dtype):
    """The input gradient (images in ``order``) from grad gk (in ``order``)."""
    if depthwise.applies(geo):
        gx = empty_image(geo.n, geo.c, geo.h, geo.w, dtype, order)
        depthwise.input_grad(gk, w, geo, order, gx)
        return gx
    if _by_groups(geo, dtype):
        gx, one = empty_image(geo.n, geo.c, geo.h, geo.w, dtype, order), _one_group(geo)
        for g in range(geo.groups):
            gg = _channels(gk, g, geo.cout, order)
            part = _input_grad(gg, w[_cols(g, geo.cout)], one, order, dtype)
            _channel_view(gx, g, geo.cin, order)[...] = part
        return gx
    wt = _tap_weight(w, geo)
    if wt is not None:
        gx = empty_image(geo.n, geo.c, geo.h, geo.w, dtype, order)
        _input_grad_taps(gk, wt, geo, order, gx)
        return gx
    if order == NCHW and _batched(geo, dtype):
        gx = empty_image(geo.n, geo.c, geo.h, geo.w, dtype, order)
        _input_grad_batched(gk, w, geo, gx)
        return gx
    # the transposed convolution multiplies its zero padding by the weight: a NaN or
    # infinite weight would spread NaN over the border, which the scatter (PyTorch's
    # col2im) never reads; checking the weight costs a pass over it, not the images
    if geo.transposable and not geo.pointwise and np.isfinite(w).all():
        gx = empty_image(geo.n, geo.c, geo.h, geo.w, dtype, order)
        wf = prepared(w, ("flipped", geo.groups), lambda w: _flipped(w, geo))
        _forward(gk, wf, None, _transposed(geo, wf), order, gx)
        return gx
    gx = zeros_image(geo.n, geo.c, geo.h, geo.w, dtype, order)
    if order == NHWC:
        _backward_input_nhwc(gk.reshape(-1, geo.c_out), w, geo, dtype, gx)
    else:
        _backward_input_nchw(gk.reshape(geo.n, geo.c_out, geo.ho * geo.wo), w, geo, dtype, gx)
    return gx


# ---------------------------------------------------------------- backward: weight

# Note [dot, not matmul]: a weight gradient's GEMMs are (C_out x pixels) @ (pixels x K)
# with a small result and a long inner dimension. NumPy's matmul of such shapes did
# not run in parallel from two threads (measured: (16 x 4224) @ (4224 x 27), two
# threads each doing the same work took 2.05x one thread's time; np.dot 1.2x, and 2x
# faster per call), so a split weight gradient (Note [Split convolutions]) ran its
# parts one after the other: VGG's first layer at batch 64, 11.3 ms on one thread and
# 11.6 on two. np.dot is the same BLAS call. The forward's (16 x 27) @ (27 x 4224) was
# held up too (two threads 1.30x one's time; np.dot 1.03x), so every 2-D product of
# a part goes through gemm.product: np.dot where it can write the output.


def _backward_weight_nhwc(g2, x, geo):
    if geo.pointwise:
        gw = np.empty((geo.c_out, geo.cin, 1, 1), x.dtype)
        a = x.reshape(-1, geo.c)
        for g in range(geo.groups):
            gw_g = gw[_cols(g, geo.cout), :, 0, 0]  # (cout, cin), C-contiguous
            gemm.product(g2[:, _cols(g, geo.cout)].T, a[:, _cols(g, geo.cin)], gw_g)
        return gw
    cols, size, unit = _nhwc_parts(geo, x.dtype)
    sums = np.zeros((len(cols), geo.groups, geo.k, geo.cout), x.dtype)
    loop = _block_loop(nhwc_weight_grad_step, x.dtype, len(cols) > 1)
    loop(x, g2, *_nhwc_geometry(geo), size, unit, cols, sums)
    del cols  # back in the pool before the sums are added up (Note [Block budget])
    gw = np.empty((geo.c_out, geo.cin, geo.kh, geo.kw), x.dtype)
    for g, s in enumerate(gemm.parts_total(sums)):  # (kh kw, cin, cout) -> (cout, cin, kh kw)
        out = gw[_cols(g, geo.cout)].reshape(geo.cout, geo.cin, geo.kh * geo.kw)
        _reverse_axes(s.reshape(-1, geo.cin, geo.cout), out)
    return gw


def _backward_weight_nchw(g3, x, geo):
    if geo.pointwise:
        x3 = x.reshape(geo.n, geo.c, geo.h * geo.w)
        gw = np.empty((geo.c_out, geo.cin, 1, 1), x.dtype)
        for g in range(geo.groups):
            gx = x3[:, _cols(g, geo.cin)].transpose(0, 2, 1)
            gw[_cols(g, geo.cout), :, 0, 0] = gemm.summed(g3[:, _cols(g, geo.cout)], gx, x.dtype)
        return gw
    if geo.flat:
        grad = np.ascontiguousarray(g3).reshape(geo.n, geo.c_out, geo.ho, geo.wo)
        zeros = lambda parts: np.zeros((parts, geo.groups, geo.cout, geo.k), x.dtype)
        sums = _flat_loop(flat_weight_grad_step, x, grad, geo, zeros)
        return gemm.parts_total(sums).reshape(geo.c_out, geo.cin, geo.kh, geo.kw)
    parts, rows, unit = _nchw_parts(geo, x.dtype)
    sums = np.zeros((len(parts), geo.groups, geo.cout, geo.k), x.dtype)
    loop = _block_loop(nchw_weight_grad_step, x.dtype, len(parts) > 1)
    loop(x, np.ascontiguousarray(g3), *_nchw_geometry(geo), rows, unit, *geo.columns(), parts,
         sums)  # fmt: skip
    return gemm.parts_total(sums).reshape(geo.c_out, geo.cin, geo.kh, geo.kw)


def conv2d_backward_weight(
    ks, grad, input, weight_shape, stride, padding, dilation, groups, bias_grad
):
    """(grad_weight, grad_bias): the bias gradient is grad summed over every axis but
    the channels, computed here where the layout is known, and only when asked for
    (a pass over grad: 0.5 ms of MobileNet v2's 16 -> 96 1 x 1 convolution at batch 32,
    3 ms of its training step on one thread, whose convolutions have no bias)."""
    x, layout, unbatched = image(input)
    geo = Geometry(
        (x.shape[0], *input._shape[-3:]), weight_shape, stride, padding, dilation, groups
    )
    order = _order(geo, layout, x.dtype, "weight")
    x = _reorder(x, layout, order)
    gk = _reorder(in_layout(grad._data, layout, unbatched), layout, order)
    gb = _bias_grad(gk, order) if bias_grad else np.empty(0, x.dtype)
    if not geo.k:  # no input channels: an empty weight gradient, the bias's still counts
        return from_array(np.zeros(weight_shape, x.dtype)), from_array(gb)
    s2d = _space_to_depth(geo, x.dtype, order, "weight")
    if s2d is not None:
        x, geo = s2d.input(x, order), s2d.geo
    gw = _weight_grad(x, gk, winograd.algorithm(geo, x.dtype), geo, order)
    if s2d is not None:
        gw = s2d.weight_grad(gw)
    return from_array(gw), from_array(gb)


def _weight_grad(x, gk, alg, geo, order):
    if depthwise.applies(geo):
        return depthwise.weight_grad(x, gk, geo, order)
    if direct.applies(geo, order, "weight"):
        return direct.weight_grad(x, gk, geo, order)
    if _by_groups(geo, x.dtype):
        one = _one_group(geo)
        alg = winograd.algorithm(one, x.dtype)
        parts = [
            _weight_grad(_channels(x, g, geo.cin, order), _channels(gk, g, geo.cout, order),
                         alg, one, order)
            for g in range(geo.groups)
        ]  # fmt: skip
        return np.concatenate(parts)
    if _by_taps(geo) and np.isfinite(gk).all():
        return _weight_grad_taps(x, gk, geo, order)
    if alg is not None:
        gw = winograd.weight_grad(x, gk, alg, geo, order)
        if gw is not None:
            return gw
    if order == NHWC:
        return _backward_weight_nhwc(gk.reshape(-1, geo.c_out), x, geo)
    if _batched(geo, x.dtype):
        return _weight_grad_batched(gk, x, geo)
    g3 = gk.reshape(gk.shape[0], geo.c_out, gk.shape[2] * gk.shape[3])
    return _backward_weight_nchw(g3, x, geo)


def _bias_grad(gk, order):
    """grad summed over every axis but the channels, in each part of a split weight
    gradient (serially after the split it took 0.66 ms of VGG's first layer at batch
    64, NCHW). By einsum: 2.7x faster than NumPy's sum over axes (0, 2) in NCHW, 4.6x
    than its sum over rows in NHWC, as accurate."""
    if order == NHWC:
        return np.einsum("pc->c", gk.reshape(-1, gk.shape[-1]))
    return np.einsum("ncp->c", gk.reshape(gk.shape[0], gk.shape[1], gk.shape[2] * gk.shape[3]))


# ---------------------------------------------------------------- linear


def linear(ks, input, weight, bias):
    return _linear(input, weight, bias, NO_FLOOR)


def linear_relu(ks, input, weight, bias):
    """relu(linear(...)) in linear's passes (Note [Fused epilogues])."""
    return _linear(input, weight, bias, RELU)


def _bias(bias):
    """A bias tensor's values as the kernels read them: a C array (a strided view's
    values were read as if adjacent), or None."""
    return None if bias is None else np.ascontiguousarray(bias._data)


def _linear(input, weight, bias, floor):
    """input @ weight.T + bias over the flattened leading axes, raised to ``floor``.

    Seed 2's transposed product: with fewer rows than output features (a small batch),
    (weight @ input.T).T puts the long dimension first, where OpenBLAS is faster:
    measured one thread, batch 64, 4096 -> 1000 float32: 7.9 ms -> 6.4 ms, 9216 -> 4096:
    73 -> 61 ms (on two threads the gap was wider); with 1024 rows and 256 features it
    is slower (1.5 -> 2.5 ms), so larger batches keep input @ weight.T. Its result is
    copied into rows, which short products do not pay back: with the copy, one thread,
    (rows, in -> out) 128, 256 -> 512: 205 -> 252 us, 128, 128 -> 512: 112 -> 162 us,
    64, 256 -> 512: 128 -> 133 us; but 32, 256 -> 512: 94 -> 71 us, 64, 1024 -> 1000:
    1086 -> 919 us, 128, 1024 -> 1024: 1781 -> 1701 us. So it needs 32 rows or fewer, or
    1024 input features or more."""
    x, w, bias = input._data, weight._data, _bias(bias)
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x
    rows, features = x2.shape
    if rows < w.shape[0] and (rows <= 32 or features >= 1024):
        out = np.ascontiguousarray(gemm.matmul(w, x2.T).T)
    elif bias is not None and features:  # (float32 or float64: linear's dtypes)
        out = gemm.product(x2, w.T, np.empty((rows, w.shape[0]), x.dtype), bias=bias)
        bias = None  # added first (Note [Bias first] in gemm.py)
    else:
        out = gemm.matmul(x2, w.T)
    _epilogue(out, bias, NHWC, floor)  # rows of features
    return from_array(out.reshape(x.shape[:-1] + (w.shape[0],)))


KERNELS = {
    "conv2d": conv2d,
    "conv2d_relu": conv2d_relu,
    "conv2d_backward_input": conv2d_backward_input,
    "conv2d_backward_weight": conv2d_backward_weight,
    "linear": linear,
    "linear_relu": linear_relu,
}


def register(registry):
    for name, fn in KERNELS.items():
        registry.register(name, "cpu", fn)
