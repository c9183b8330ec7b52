"""Depthwise convolution (groups == input channels, MobileNet's 3x3 layers): direct
loops for the forward pass and both gradients, in either layout.

Note [Depthwise convolution]: each output channel ``co`` reads one input channel
``co // m`` (m = C_out / C_in, the channel multiplier), so a depthwise convolution does
kH kW multiply-adds per output value -- too little work for im2col + GEMM, which ran
one skinny GEMM per group (measured on 16x144x56x56, 3x3, one thread, channels-last:
512 ms against PyTorch's 7). The kernels here visit the kernel taps directly, with no
bound test per element: the output rows and columns whose tap falls inside the input
are tables (windows.tap_ranges). Their innermost loop is contiguous:

    NHWC: over the channels of one pixel. The forward pass runs output pixel by output
          pixel (``forward_pixels``), a 3 x 3 kernel's pixels with all taps inside
          the input summing their nine taps in one loop (``nine_taps``); small images
          are copied zero-padded first, so that every pixel is such a one. The input
          gradient of a stride-1 convolution is that forward pass of grad with the
          flipped kernel, of a strided one a gather input pixel by input pixel
          (``input_grad_pixels``); the weight gradient runs pixel by pixel as the
          forward pass (``weight_grad_pixels``).
    NCHW: over the output columns of one output row and one tap (``nchw_taps``):
          out[n, co, oh, a:b] += w[co, i, j] * x[n, c, ih, a sw + off : b sw + off : sw],
          the stride a compile-time constant (unit stride vectorizes); the weight
          gradient accumulates into a row per tap, summed at the end of each plane, so
          the innermost loop is no reduction. A 3 x 3 kernel's rows with every tap
          inside the input sum all nine taps in one loop instead, the weights scalars
          (at stride 1 the whole plane's inner rows as one run), and the weight
          gradient's nine sums likewise: MobileNet's rows of 16 or 32 pixels left nine
          short loops per row mostly to their scalar tails (measured one thread,
          forward 8 x 144 x 16 x 16 1.08 -> 0.70 ms, 8 x 32 x 32 x 32 0.66 -> 0.32 ms).

Each kernel runs serially on a range of images; threads take the batch in parts (Note
[Split convolutions] in conv.py), the weight gradient summing the parts'. The NHWC
kernels take no channel multiplier, which would break their loop over channels into
strided ones: with one, the input's channels are repeated m times first (and the
input gradient's repeated channels summed after), a pass over the input that cost
less than the strided loops (measured 16x32x112x112, multiplier 2, one thread:
forward ~5x PyTorch's time before).

Note [Channels-last depthwise loops measured]: the NHWC forward pass takes ~1.8x
PyTorch's time on 16 x 144 x 56 x 56 (one thread). Its nine-tap loop is bound by its
loads, an input and a weight vector per multiply-add: on the 2-core AVX-512 machine
these were measured on (shared, so timed as medians of interleaved rounds), such a
loop over 16 floats from L1 takes ~22 cycles, ~12 with the weights broadcast from
registers. Here ~75 ns per output pixel with the images in the L2 cache and ~100
ns from memory (PyTorch: ~55 and ~53). These formulations, one thread, stride 1,
were measured and not taken (ns per output pixel, in cache / from memory, against
the loop above in the same run):

    whole output rows, tap by tap (each tap a pass over the row's W x C values):
        ~2x slower; one pass per kernel row: 86 vs 77 / 151 vs 113;
    channel blocks of 16 carried across a row's pixels, meant to keep their
        weights in registers: as slices 3x slower; with a block's 16 lanes written
        out one by one for LLVM's SLP vectorizer, scalar code, 4x slower;
    2 or 4 pixels per loop over the channels, sharing input and weight loads:
        52-65 vs 71-77 in cache, but 136-280 vs 97-111 from memory (seemingly
        the hardware prefetcher falling behind: an llvm.prefetch of the next input
        and output rows brought 4 pixels back to 98 against 99);
    runs of pixels in one loop, the weights repeated per pixel (the loop's setup
        paid per run; a whole row as one run changed the time by under 15%): 32
        channels 19 -> 16, 144 channels 79 -> 60 in cache, 91 -> 83 from memory (92
        vs 100 with llvm.prefetch), stride 2 slower;
    padded input rows copied into a ring of channel-blocked rows (constant
        offsets, no border cases): 2-5x slower, the copy alone 2 ms of the 16 x
        144 x 56 x 56 forward pass.
"""

import copy

import numpy as np

from lamina.backends import jit
from lamina.backends.jit import jitable

from .layout import NHWC
from .windows import tap_ranges


def applies(geo):
    """Whether conv2d of geometry ``geo`` is depthwise (one input channel per group)."""
    return geo.groups == geo.c and geo.cin == 1 and geo.groups > 1


# ---------------------------------------------------------------- what a tap does


@jitable(**jit.CALLEE, inline="always")
def multiply_add(dst, src, w):
    """dst += src * w: the NHWC kernels' tap."""
    for k in range(dst.size):
        dst[k] += src[k] * w[k]


def input_grad_pixels(x, w, y, from_h, from_w):
    """The NHWC input gradient x (N, H, W, C) of grad y, input pixel by input pixel: the
    sum over the taps (i, j) of y[n, from_h[ih, i], from_w[iw, j]] * w[i, j], where the
    tables name the output row (column) that reads input row ih (column iw) through
    tap i (j), -1 for none (a gather: each pixel written once, where a scatter over
    (output pixel, tap) pairs added into it again and again)."""
    kh, kw = w.shape[0], w.shape[1]
    for n in range(x.shape[0]):
        for ih in range(x.shape[1]):
            for iw in range(x.shape[2]):
                xs = x[n, ih, iw]
                for k in range(xs.size):
                    xs[k] = 0
                for i in range(kh):
                    oh = from_h[ih, i]
                    if oh >= 0:
                        for j in range(kw):
                            ow = from_w[iw, j]
                            if ow >= 0:
                                multiply_add(xs, y[n, oh, ow], w[i, j])


def _readers(size, out, kernel, stride, pad, dilation):
    """(size, kernel): the output position that reads input position p through tap t,
    -1 for none."""
    t = np.arange(kernel) * dilation - pad  # tap t of output o reads o stride + t
    start = np.arange(size)[:, None] - t[None]
    o = start // stride
    inside = (start % stride == 0) & (o >= 0) & (o < out)
    return np.ascontiguousarray(np.where(inside, o, -1))


@jitable(**jit.CALLEE, inline="always")
def forward_nchw(xs, ys, w, acc, i, j):
    wv = w[i, j]
    for k in range(ys.size):
        ys[k] += wv * xs[k]


@jitable(**jit.CALLEE, inline="always")
def input_grad_nchw(xs, ys, w, acc, i, j):
    wv = w[i, j]
    for k in range(ys.size):
        xs[k] += wv * ys[k]


@jitable(**jit.CALLEE, inline="always")
def weight_grad_nchw(xs, ys, w, acc, i, j):
    row = acc[i, j]
    for k in range(ys.size):
        row[k] += xs[k] * ys[k]


@jitable(**jit.CALLEE, inline="always")
def pad_image(x, pt, pl, padded):
    """padded = image x (H, W, C) with pt rows and pl columns of zeros before it and
    zeros after it up to padded's size."""
    h, w = x.shape[0], x.shape[1]
    for r in range(padded.shape[0]):
        for q in range(padded.shape[1]):
            dst, ih, iw = padded[r, q], r - pt, q - pl
            if 0 <= ih < h and 0 <= iw < w:
                src = x[ih, iw]
                for k in range(dst.size):
                    dst[k] = src[k]
            else:
                for k in range(dst.size):
                    dst[k] = 0


def forward_pixels(x, w, y, bias, sh, sw, pt, pl, dh, dw, lo_h, hi_h, lo_w, hi_w, padded):
    """The NHWC forward pass output pixel by output pixel: each pixel's channels sum
    their taps while in the L1 cache, and a 3 x 3 kernel with every tap inside the
    input and no channel multiplier (MobileNet's) sums its nine taps in one loop over
    the channels, in registers (Note [Depthwise convolution]). Given a ``padded``
    image (not 0 x 0: small images, whose border pixels would be most of them), each
    image is first copied into it zero-padded, and every pixel has its nine taps."""
    kh, kw = w.shape[0], w.shape[1]
    h0, h1 = lo_h.max(), hi_h.min()  # the output rows whose taps all fall inside
    w0, w1 = lo_w.max(), hi_w.min()
    nine = kh == 3 and kw == 3
    if padded.shape[0]:
        h0, h1, w0, w1 = 0, y.shape[1], 0, y.shape[2]
    for n in range(y.shape[0]):
        image, top, left = x[n], pt, pl
        if padded.shape[0]:
            pad_image(image, pt, pl, padded)
            image, top, left = padded, 0, 0
        for oh in range(y.shape[1]):
            ih = oh * sh - top
            blocked = nine and h0 <= oh < h1
            for ow in range(y.shape[2]):
                if blocked and w0 <= ow < w1:
                    continue
                ys, iw = y[n, oh, ow], ow * sw - left
                for k in range(ys.size):
                    ys[k] = bias[k]
                for i in range(kh):
                    if lo_h[i] <= oh < hi_h[i]:
                        for j in range(kw):
                            if lo_w[j] <= ow < hi_w[j]:
                                multiply_add(ys, image[ih + i * dh, iw + j * dw], w[i, j])
            if blocked:
                nine_taps(image[ih], image[ih + dh], image[ih + 2 * dh], w, bias, y[n, oh],
                          w0, w1, sw, left, dw)  # fmt: skip


@jitable(**jit.CALLEE, inline="always")
def nine_taps(x0, x1, x2, w, bias, yrow, w0, w1, sw, left, dw):
    """Output pixels [w0, w1) of one row of a 3 x 3 depthwise convolution, all taps
    inside input rows x0, x1, x2: each pixel's channels in one loop over runs sliced
    from 0 (Note [Slices from 0] in conv.py: 2-D indexing in the loop ran 1.5-3x
    slower)."""
    w00, w01, w02, w10, w11, w12 = w[0, 0], w[0, 1], w[0, 2], w[1, 0], w[1, 1], w[1, 2]
    w20, w21, w22 = w[2, 0], w[2, 1], w[2, 2]
    for ow in range(w0, w1):
        a = ow * sw - left
        b, d = a + dw, a + 2 * dw
        ys = yrow[ow]
        x0a, x0b, x0d, x1a, x1b, x1d = x0[a], x0[b], x0[d], x1[a], x1[b], x1[d]
        x2a, x2b, x2d = x2[a], x2[b], x2[d]
        for k in range(ys.size):
            ys[k] = (
                bias[k]
                + x0a[k] * w00[k]
                + x0b[k] * w01[k]
                + x0d[k] * w02[k]
                + x1a[k] * w10[k]
                + x1b[k] * w11[k]
                + x1d[k] * w12[k]
                + x2a[k] * w20[k]
                + x2b[k] * w21[k]
                + x2d[k] * w22[k]
            )


def weight_grad_pixels(x, w, y, sh, sw, pt, pl, dh, dw, lo_h, hi_h, lo_w, hi_w):
    """The NHWC weight gradient w (kH, kW, C) += x * grad, output pixel by output pixel
    as forward_pixels (without padding: a padding zero times an infinite grad would be
    NaN): a 3 x 3 kernel's pixels with all taps inside the input accumulate into the
    nine weight rows in one loop over the channels (``nine_weight_taps``); measured on
    16x144x56x56, one thread, 13.8 -> 7 ms where the loop over (pixel, tap) pairs
    reloaded grad once per tap."""
    kh, kw = w.shape[0], w.shape[1]
    h0, h1 = lo_h.max(), hi_h.min()
    w0, w1 = lo_w.max(), hi_w.min()
    nine = kh == 3 and kw == 3
    for n in range(y.shape[0]):
        for oh in range(y.shape[1]):
            ih = oh * sh - pt
            blocked = nine and h0 <= oh < h1
            for ow in range(y.shape[2]):
                if blocked and w0 <= ow < w1:
                    continue
                gs, iw = y[n, oh, ow], ow * sw - pl
                for i in range(kh):
                    if lo_h[i] <= oh < hi_h[i]:
                        for j in range(kw):
                            if lo_w[j] <= ow < hi_w[j]:
                                multiply_add(w[i, j], x[n, ih + i * dh, iw + j * dw], gs)
            if blocked:
                nine_weight_taps(x[n, ih], x[n, ih + dh], x[n, ih + 2 * dh], w, y[n, oh],
                                 w0, w1, sw, pl, dw)  # fmt: skip


@jitable(**jit.CALLEE, inline="always")
def nine_weight_taps(x0, x1, x2, w, grow, w0, w1, sw, left, dw):
    """nine_taps' adjoint in the weight: w[i, j] += x_i[column j] * grad for output
    pixels [w0, w1) of one row."""
    w00, w01, w02, w10, w11, w12 = w[0, 0], w[0, 1], w[0, 2], w[1, 0], w[1, 1], w[1, 2]
    w20, w21, w22 = w[2, 0], w[2, 1], w[2, 2]
    for ow in range(w0, w1):
        a = ow * sw - left
        b, d = a + dw, a + 2 * dw
        gs = grow[ow]
        x0a, x0b, x0d, x1a, x1b, x1d = x0[a], x0[b], x0[d], x1[a], x1[b], x1[d]
        x2a, x2b, x2d = x2[a], x2[b], x2[d]
        for k in range(gs.size):
            v = gs[k]
            w00[k] += x0a[k] * v
            w01[k] += x0b[k] * v
            w02[k] += x0d[k] * v
            w10[k] += x1a[k] * v
            w11[k] += x1b[k] * v
            w12[k] += x1d[k] * v
            w20[k] += x2a[k] * v
            w21[k] += x2b[k] * v
            w22[k] += x2d[k] * v


def nchw_taps(tap, with_bias, with_sums, sw):
    """The loop over the taps of images x (N, C, H, W), weight w (C_out, 1, kH, kW)
    and y (N, C_out, Ho, Wo), plane by plane: ``tap`` updates one of them from the
    two others for one output row segment and one kernel tap (the input row read
    ``sw`` apart, a constant); with_bias (the forward pass), each output row starts
    from its channel's bias, and a 3 x 3 kernel's rows with every tap inside the input
    sum their nine taps in one loop (``nine_taps_row``); with_sums, ``acc`` (kH, kW,
    Wo) holds a weight gradient's per-tap sums over one plane, added to w[co] at its
    end, a 3 x 3 kernel's inner rows summing all nine taps in one loop (``nine_sums``:
    measured one thread, 8 x 32 x 32 x 32, 0.63 -> 0.34 ms, 8 x 96 x 32 x 32 stride 2,
    1.16 -> 0.62 ms)."""

    @jitable(**jit.CALLEE, inline="always")
    def segment(xrow, a, b):  # input columns a, a + sw, ... < b
        return xrow[a:b] if sw == 1 else xrow[a:b:sw]  # unit stride vectorizes

    @jitable(**jit.CALLEE, inline="always")
    def nine_taps(x0a, x0b, x0d, x1a, x1b, x1d, x2a, x2b, x2d, wk, bias, ys):
        """ys = bias + the nine taps' products of the input runs (the weights scalars)."""
        w00, w01, w02, w10, w11, w12 = wk[0, 0], wk[0, 1], wk[0, 2], wk[1, 0], wk[1, 1], wk[1, 2]
        w20, w21, w22 = wk[2, 0], wk[2, 1], wk[2, 2]
        for k in range(ys.size):
            ys[k] = (
                bias
                + x0a[k] * w00
                + x0b[k] * w01
                + x0d[k] * w02
                + x1a[k] * w10
                + x1b[k] * w11
                + x1d[k] * w12
                + x2a[k] * w20
                + x2b[k] * w21
                + x2d[k] * w22
            )

    @jitable(**jit.CALLEE, inline="always")
    def nine_taps_row(x0, x1, x2, wk, bias, yrow, w0, w1, pl, dw):
        """Columns [w0, w1) (every tap inside) of output row yrow of a 3 x 3 kernel whose
        input rows x0, x1, x2 lie inside the input, in one loop."""
        a, b = w0 * sw - pl, (w1 - 1) * sw - pl + 1
        c, d = a + dw, a + 2 * dw
        nine_taps(segment(x0, a, b), segment(x0, c, b + dw), segment(x0, d, b + 2 * dw),
                  segment(x1, a, b), segment(x1, c, b + dw), segment(x1, d, b + 2 * dw),
                  segment(x2, a, b), segment(x2, c, b + dw), segment(x2, d, b + 2 * dw),
                  wk, bias, yrow[w0:w1])  # fmt: skip

    @jitable(**jit.CALLEE, inline="always")
    def nine_taps_plane(xplane, wk, bias, yplane, h0, h1, w0, w1, pt, pl, dh, dw):
        """Stride 1, output as wide as the input: the output pixels from (h0, w0) to
        (h1 - 1, w1 - 1) in row-major order are one run of the flat plane, each tap's
        input one run too, so a 3 x 3 kernel's inner rows are one loop (rows of 16 or 32
        pixels, one loop each, left most of the vector loop's work to its scalar tail).
        The columns outside [w0, w1) of those rows get wrapped-around sums: the caller
        overwrites them."""
        width = xplane.shape[1]
        xf, yf = xplane.reshape(xplane.size), yplane.reshape(yplane.size)
        q0, q1 = h0 * width + w0, (h1 - 1) * width + w1
        r0 = q0 - pt * width - pl  # where tap (0, 0) of pixel q0 reads
        r1, r2 = r0 + dh * width, r0 + 2 * dh * width
        n = q1 - q0
        nine_taps(xf[r0 : r0 + n], xf[r0 + dw : r0 + dw + n], xf[r0 + 2 * dw : r0 + 2 * dw + n],
                  xf[r1 : r1 + n], xf[r1 + dw : r1 + dw + n], xf[r1 + 2 * dw : r1 + 2 * dw + n],
                  xf[r2 : r2 + n], xf[r2 + dw : r2 + dw + n], xf[r2 + 2 * dw : r2 + 2 * dw + n],
                  wk, bias, yf[q0:q1])  # fmt: skip

    @jitable(**jit.CALLEE, inline="always")
    def border_sums(xplane, ih, wk, gplane, oh, w0, w1, pl, dh, dw, lo_w, hi_w):
        """border_columns' counterpart in the weight gradient: wk += input times grad."""
        for q in range(gplane.shape[1] - (w1 - w0)):
            ow = q if q < w0 else q + w1 - w0
            v = gplane[oh, ow]
            for j in range(3):
                if lo_w[j] <= ow < hi_w[j]:
                    iw = ow * sw - pl + j * dw
                    for i in range(3):
                        wk[i, j] += xplane[ih + i * dh, iw] * v

    @jitable(**jit.CALLEE, inline="always")
    def row_sums(xplane, ih, gplane, oh, wk, acc, w0, w1, pl, dh, dw, lo_w, hi_w):
        """A weight gradient's sums over one output row whose taps lie inside: the
        columns [w0, w1) into acc[:, :, 0], the others into wk."""
        x0, x1, x2 = xplane[ih], xplane[ih + dh], xplane[ih + 2 * dh]
        sums = nine_sums(x0, x1, x2, gplane[oh], w0, w1, pl, dw)
        for t in range(9):
            acc[t // 3, t % 3, 0] += sums[t]
        border_sums(xplane, ih, wk, gplane, oh, w0, w1, pl, dh, dw, lo_w, hi_w)

    @jitable(**jit.CALLEE, inline="always")
    def border_columns(xplane, ih, wk, bias, yplane, oh, w0, w1, pl, dh, dw, lo_w, hi_w):
        """The columns outside [w0, w1) of such a row, tap by tap, indexing the planes
        (views of the rows cost more than these few pixels: Numba counts each view's
        references; measured NCHW 8 x 144 x 16 x 16, one thread, 0.87 -> 0.74 ms)."""
        for q in range(yplane.shape[1] - (w1 - w0)):
            ow = q if q < w0 else q + w1 - w0
            total = bias
            for j in range(3):
                if lo_w[j] <= ow < hi_w[j]:
                    iw = ow * sw - pl + j * dw
                    for i in range(3):
                        total += xplane[ih + i * dh, iw] * wk[i, j]
            yplane[oh, ow] = total

    @jitable(**jit.CALLEE, inline="always")
    def nine_sums(x0, x1, x2, grow, w0, w1, pl, dw):
        """The nine taps' sums of input times grad over columns [w0, w1) of one output row
        (every tap inside), in one loop: the weight gradient's counterpart of
        nine_taps_row (compiled reassociating, so that the sums vectorize)."""
        a, b = w0 * sw - pl, (w1 - 1) * sw - pl + 1
        c, d = a + dw, a + 2 * dw
        x0a, x0b, x0d = segment(x0, a, b), segment(x0, c, b + dw), segment(x0, d, b + 2 * dw)
        x1a, x1b, x1d = segment(x1, a, b), segment(x1, c, b + dw), segment(x1, d, b + 2 * dw)
        x2a, x2b, x2d = segment(x2, a, b), segment(x2, c, b + dw), segment(x2, d, b + 2 * dw)
        gs = grow[w0:w1]
        s00 = s01 = s02 = s10 = s11 = s12 = s20 = s21 = s22 = gs.dtype.type(0)
        for k in range(gs.size):
            v = gs[k]
            s00 += x0a[k] * v
            s01 += x0b[k] * v
            s02 += x0d[k] * v
            s10 += x1a[k] * v
            s11 += x1b[k] * v
            s12 += x1d[k] * v
            s20 += x2a[k] * v
            s21 += x2b[k] * v
            s22 += x2d[k] * v
        return s00, s01, s02, s10, s11, s12, s20, s21, s22

    def kernel(x, w, y, bias, acc, m, sh, pt, pl, dh, dw, lo_h, hi_h, lo_w, hi_w):
        kh, kw = w.shape[2], w.shape[3]
        h0, h1 = lo_h.max(), hi_h.min()  # the output rows whose taps all fall inside
        w0, w1 = lo_w.max(), hi_w.min()
        # a 3 x 3 kernel's rows with every tap inside run in one loop (the input
        # gradient's scatter, which only strided convolutions run, tap by tap)
        whole_rows = (with_bias or with_sums) and kh == 3 and kw == 3 and w0 < w1
        flat = with_bias and whole_rows and sh == sw == 1 and y.shape[3] == x.shape[3]
        flat = flat and h0 < h1  # nine_taps_plane's rows
        for n in range(y.shape[0]):
            for co in range(y.shape[1]):
                xplane, yplane, wk, start = x[n, co // m], y[n, co], w[co, 0], bias[co]
                if flat:
                    nine_taps_plane(xplane, wk, start, yplane, h0, h1, w0, w1, pt, pl, dh, dw)
                for oh in range(y.shape[2]):
                    if whole_rows and h0 <= oh < h1:  # every tap inside
                        ih = oh * sh - pt
                        if with_sums:
                            row_sums(xplane, ih, yplane, oh, wk, acc, w0, w1, pl, dh, dw, lo_w,
                                     hi_w)  # fmt: skip
                        else:
                            if not flat:
                                x0, x1, x2 = xplane[ih], xplane[ih + dh], xplane[ih + 2 * dh]
                                nine_taps_row(x0, x1, x2, wk, start, yplane[oh], w0, w1, pl, dw)
                            border_columns(xplane, ih, wk, start, yplane, oh, w0, w1, pl, dh,
                                           dw, lo_w, hi_w)  # fmt: skip
                        continue
                    yrow = yplane[oh]
                    if with_bias:
                        for ow in range(yrow.size):
                            yrow[ow] = start
                    for i in range(kh):
                        if oh < lo_h[i] or oh >= hi_h[i]:
                            continue
                        xrow = xplane[oh * sh - pt + i * dh]
                        for j in range(kw):
                            lo, hi, off = lo_w[j], hi_w[j], j * dw - pl
                            if hi == lo:
                                continue
                            a, b = lo * sw + off, (hi - 1) * sw + off + 1
                            tap(segment(xrow, a, b), yrow[lo:hi], wk, acc, i, j)
                if with_sums:
                    for i in range(kh):
                        for j in range(kw):
                            row = acc[i, j]
                            wk[i, j] += row.sum()
                            row[:] = 0

    return kernel


# ---------------------------------------------------------------- compiled kernels

_NHWC = {"forward": forward_pixels, "input": input_grad_pixels, "weight": weight_grad_pixels}
_NCHW = {"forward": forward_nchw, "input": input_grad_nchw, "weight": weight_grad_nchw}


def _compiled(layout, mode, sw, dtype):
    """The kernel of ``mode`` ("forward", "input", "weight") in ``layout``; NCHW kernels
    are compiled per stride along the width. The key is looked up before any Numba type
    is built: building the signature took a third of a small convolution's call."""
    key = (layout, mode, dtype) if layout == NHWC else (layout, mode, sw, dtype)
    return jit.cached((_compiled, key), lambda: _build(layout, mode, sw, dtype))


def _build(layout, mode, sw, dtype):
    t, i64, idx = jit.types, jit.types.int64, jit.index()
    a1, a3, a4 = (jit.array(dtype, d) for d in (1, 3, 4))
    if layout == NHWC:
        tables = (*[i64] * 6, idx, idx, idx, idx)
        sig = {
            "forward": t.void(a4, a3, a4, a1, *tables, a3),
            "input": t.void(a4, a3, a4, jit.index(2), jit.index(2)),
            "weight": t.void(a4, a3, a4, *tables),
        }[mode]
        return jit.compile_kernel(_NHWC[mode], sig, nogil=True)
    sig = t.void(a4, a4, a4, a1, a3, *[i64] * 6, idx, idx, idx, idx)
    template = nchw_taps(_NCHW[mode], mode == "forward", mode == "weight", sw)
    fastmath = jit.REASSOCIATE if mode == "weight" else False  # nine_sums' sums vectorize
    return jit.compile_kernel(template, sig, nogil=True, fastmath=fastmath)


def _run(mode, layout, x, w, y, bias, geo, stride, pads, dilation):
    """Run ``mode``'s kernel on kernel-order images x and y (x the input side: its
    size is (geo.h, geo.w), y's (geo.ho, geo.wo)), w (kH, kW, C_out) in NHWC, (C_out,
    1, kH, kW) in NCHW; pads are the top and left padding."""
    (sh, sw), (pt, pl), (dh, dw) = stride, pads, dilation
    m = geo.c_out // geo.c
    rows = tap_ranges(geo.h, geo.ho, geo.kh, sh, pt, dh)
    cols = tap_ranges(geo.w, geo.wo, geo.kw, sw, pl, dw)
    kernel = _compiled(layout, mode, sw, x.dtype)
    if bias is None:  # the forward kernels start from it
        bias = np.zeros(y.shape[3] if layout == NHWC else y.shape[1], x.dtype)
    if layout == NHWC and mode == "forward":
        kernel(x, w, y, bias, sh, sw, pt, pl, dh, dw, *rows, *cols, _padded(geo, w, x.dtype))
    elif layout == NHWC and mode == "input":
        from_h = _readers(geo.h, geo.ho, geo.kh, sh, pt, dh)
        kernel(x, w, y, from_h, _readers(geo.w, geo.wo, geo.kw, sw, pl, dw))
    elif layout == NHWC:
        kernel(x, w, y, sh, sw, pt, pl, dh, dw, *rows, *cols)
    else:
        acc = np.zeros((geo.kh, geo.kw, geo.wo) if mode == "weight" else (1, 1, 1), x.dtype)
        kernel(x, w, y, bias, acc, m, sh, pt, pl, dh, dw, *rows, *cols)


# The small images whose forward pass runs zero-padded (forward_pixels), and only
# where the weight is finite: padding reads zeros where the direct loops read nothing,
# and an infinite or NaN weight times a zero would spread NaN over the border.
SMALL_IMAGE = 400


def _padded(geo, w, dtype):
    """forward_pixels' padded image (a 0 x 0 one where it runs unpadded)."""
    if geo.h * geo.w > SMALL_IMAGE or not np.isfinite(w).all():
        return np.empty((0, 0, 0), dtype)
    hp = (geo.ho - 1) * geo.sh + geo.dh * (geo.kh - 1) + 1
    wp = (geo.wo - 1) * geo.sw + geo.dw * (geo.kw - 1) + 1
    return np.empty((hp, wp, geo.c), dtype)


def _geometry(geo):
    return (geo.sh, geo.sw), (geo.pt, geo.pl), (geo.dh, geo.dw)


def _tap_major(w):
    """(C_out, 1, kH, kW) -> the NHWC kernels' (kH, kW, C_out)."""
    return np.ascontiguousarray(w[:, 0].transpose(1, 2, 0))


def _repeated(x, geo):
    """Channels-last images x with each channel repeated m times (the multiplier), and
    the geometry of the convolution on them, which has none (Note [Depthwise
    convolution])."""
    return np.repeat(x, geo.c_out // geo.c, axis=3), _no_multiplier(geo)


def _no_multiplier(geo):
    plain = copy.copy(geo)
    plain.c = plain.groups = geo.c_out
    return plain


def forward(x, w, bias, geo, layout, out):
    """out = the depthwise convolution of images x (a part of the batch) plus bias."""
    if layout == NHWC and geo.c_out != geo.c:
        x, geo = _repeated(x, geo)
    w = _tap_major(w) if layout == NHWC else np.ascontiguousarray(w)
    _run("forward", layout, x, w, out, bias, geo, *_geometry(geo))


def input_grad(g, w, geo, layout, gx):
    """Writes the input gradient of grad g into gx (any values: only the NCHW scatter
    zeroes it first; a pass over the images saved elsewhere). With stride 1 and no
    channel multiplier it is the forward pass of g with the flipped kernel (padded by
    the kernel's extent minus the padding), which gathers, not scatters (measured
    NCHW, one thread, against the scatter: 8 x 32 x 32 x 32 0.52 -> 0.39 ms, 8 x 144 x
    16 x 16 0.98 -> 0.89 ms)."""
    if layout == NHWC and geo.c_out != geo.c:  # the repeated channels' gradients summed
        repeated = np.empty((*gx.shape[:3], geo.c_out), gx.dtype)
        input_grad(g, w, _no_multiplier(geo), layout, repeated)
        np.sum(repeated.reshape(*gx.shape, -1), axis=-1, out=gx)
        return
    if (geo.sh, geo.sw) == (1, 1) and geo.c_out == geo.c:
        flipped = copy.copy(geo)
        flipped.h, flipped.w, flipped.ho, flipped.wo = geo.ho, geo.wo, geo.h, geo.w
        pads = (geo.dh * (geo.kh - 1) - geo.pt, geo.dw * (geo.kw - 1) - geo.pl)
        wf = w[:, :, ::-1, ::-1]
        wf = _tap_major(wf) if layout == NHWC else np.ascontiguousarray(wf)
        _run("forward", layout, g, wf, gx, None, flipped, (1, 1), pads, (geo.dh, geo.dw))
        return
    if layout != NHWC:  # input_grad_pixels writes every pixel, the NCHW loop adds
        gx[...] = 0
    w = _tap_major(w) if layout == NHWC else np.ascontiguousarray(w)
    _run("input", layout, gx, w, g, None, geo, *_geometry(geo))


def weight_grad(x, g, geo, layout):
    """The weight gradient (C_out, 1, kH, kW) of images x and grad g."""
    if layout == NHWC and geo.c_out != geo.c:
        x, geo = _repeated(x, geo)
    if layout == NHWC:
        gw = np.zeros((geo.kh, geo.kw, geo.c_out), x.dtype)
        _run("weight", layout, x, gw, g, None, geo, *_geometry(geo))
        return np.ascontiguousarray(gw.transpose(2, 0, 1))[:, None]
    gw = np.zeros((geo.c_out, 1, geo.kh, geo.kw), x.dtype)
    _run("weight", layout, x, gw, g, None, geo, *_geometry(geo))
    return gw
