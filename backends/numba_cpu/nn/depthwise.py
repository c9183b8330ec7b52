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
          pixel in explicit vectors of channels (``forward_pixels``; Note
          [Channels-last depthwise forward]); at stride 1, images that fit in a
          core's L2 cache are copied zero-padded first, so that every pixel has all
          its taps. The input gradient of a
          stride-1 convolution is that forward pass of grad with the flipped kernel, of
          a strided one a gather input pixel by input pixel (``input_grad_pixels``);
          the weight gradient runs pixel by pixel as the forward pass
          (``weight_grad_pixels``).
    NCHW: the forward pass plane by plane, in explicit vectors of output columns
          (``forward_planes``; Note [Channels-first depthwise forward]); small
          planes run channels-last, transposed (Note [Depthwise order]). The
          gradients run over the output columns of one output row and one tap
          (``nchw_taps``): x[n, c, ih, a sw + off : b sw + off : sw] times w[co, i,
          j] against grad[n, co, oh, a:b], the stride a compile-time constant (unit
          stride vectorizes); the weight gradient accumulates into a row per tap,
          summed at the end of each plane, so the innermost loop is no reduction,
          and a 3 x 3 kernel's rows with every tap inside the input sum its nine taps
          in one loop. A stride-1 input gradient is the forward pass
          with the flipped kernel, as in NHWC.

Note [Depthwise parts]: each kernel is a parallel loop over parts of its work (images;
the NCHW forward pass's planes, so that a batch of one image has parts too), one part
per thread from PARALLEL_ELEMENTS multiply-adds (``in_parts``), each with scratch of
its own, and a weight gradient of its own that the parts' sum ends. So a depthwise
convolution calls no Python from its threads: split by images through
``threads.split``, whose parts call back into Python (Note [Split work]), the
channels-last forward pass of 32 x 144 x 16 x 16 took 0.69 ms on one thread and 0.63
on two.

The NHWC kernels take no channel multiplier, which would break their loop over
channels into strided ones: with one, the input's channels are repeated m times first (and the
input gradient's repeated channels summed after), a pass over the input that cost
less than the strided loops (measured 16x32x112x112, multiplier 2, one thread:
forward ~5x PyTorch's time before).

Note [Channels-last depthwise forward]: the NHWC forward pass sums its taps in
vectors of channels (Note [Explicit vectors] in vectors.py). A 3 x 3 kernel's pixels
with every tap inside the input (``nine_taps``) run in runs of RUN = 8 pixels of one
output row: for each vector of channels the nine weight vectors and the bias are
loaded once into registers, then each pixel of the run takes nine input loads, nine
multiply-adds and a store; each step also prefetches the next run's input in the rows
no earlier output row read, and its output. The other pixels (borders, other kernels,
the channels after the last whole vector) run ``pixel``: a vector of channels at a
time, the weights loaded per tap, the remaining channels one by one.

At stride 1, an image whose zero-padded copy takes at most PADDED_BYTES (512 KiB, in
a core's L2 cache) is copied so, and its rows run ``shared_taps``: SHARED = 4
neighbouring output pixels a step, the six input vectors of each kernel row under them
loaded once for all four (18 loads for 36 multiply-adds, not 36), no prefetches (the
copy was just written). Each output sums its taps in nine_taps' order, so the two
paths agree bit for bit. Batch 32, float32, channels-last, one thread, us, before ->
after (PyTorch in the same runs; Zen 4): MobileNet v2's 32 x 32 x 32 700 -> 410
(260), 144 x 16 x 16 640 -> 420 (310), 192 x 8 x 8 250 -> 185 (125), 576 x 4 x 4 230 ->
165 (108), 960 x 2 x 2 230 -> 135 (73); 16 x 144 x 56 x 56 (1.8 MB images, read in
place) unchanged. Stride 2 reads in place at every size: its padded copy cost more
than its border pixels (96 x 32 x 32: 620 us in place, 980 padded). The prefetches
are kept for images read in place, which come from memory: without them, 144 x 56 x 56
took 6.4 ms against 4.4-4.9.

Before, each pixel's nine taps ran as one loop over its channels, which LLVM
vectorized with a weight load per multiply-add (it cannot prove that the output does
not alias the weights): ~22 cycles per 16 floats from L1, ~12 with the weights in
registers. Measured on the 2-core AVX-512 machine (shared: medians of interleaved
rounds of the kernels, thread CPU time, two runs), float32, batch 16, one thread, ms,
against that loop (PyTorch channels-last in the same runs; its time on the first
shape varied from run to run, 5.8 and 12):

    channels x size, stride   before   now   PyTorch
    144 x 56 x 56, 1           4.9     3.7    5.8
    144 x 56 x 56, 2           1.34    1.40   2.0
     96 x 112 x 112, 2         6.0     4.5    5.3
     32 x 112 x 112, 1         5.6-6.1 3.4    3.7-3.9
    192 x 28 x 28, 1           1.46    1.2    1.7
    192 x 28 x 28, 2           0.43    0.49   0.65-0.76
    576 x 14 x 14, 1           1.35    1.16   0.91
    960 x 7 x 7, 1             0.65    0.48   0.40-0.43

(Those figures are of the design before shared_taps: the small images paid for their
zero-padded copy, which PyTorch does not make.)
float64 (vectors of 8), same shapes, two runs: 0.89-0.90x the time before at 144 x
56 x 56, 0.70x at 960 x 7 x 7, but 1.04-1.07x at 192 x 28 x 28 and 1.10-1.13x at
stride 2 (96 x 112 x 112, 192 x 28 x 28).
``python -m lamina.bench nn --primitives models --only depthwise --layout NHWC``
(each library in its own process, lamina's pool allocator on, the machine otherwise
idle, two runs): the forward pass one thread 4.0 -> 2.55 ms (PyTorch 2.2-2.3: 1.72-
1.82x -> 1.09-1.16x), two threads 2.25 -> 1.52-1.55 ms (PyTorch 1.14-1.20: 1.90-1.96x
-> 1.29-1.34x); with the backward pass, whose stride-1 input gradient is this
forward pass, 17.4-18.2 -> 15.0-15.4 ms and 9.2-9.3 -> 7.95 ms. What is left: at 56 x
56 the border pixels (7% of them) take ~15% of the time (3.5-3.7 ms with them
skipped, against 4.3-4.7; before, ~1 of 6 ms), and computing a border pixel's range
of taps once instead of testing each tap changed nothing: their input is read
without prefetches.

Variants measured and not taken (same conditions, 16 x 144 x 56 x 56 stride 1
unless named):

    a whole output row per vector of channels (weights loaded once per row): 5.9
        against 6.0 before, stride 2 1.64 against 1.49;
    runs of 8 without the prefetches: the inner pixels alone ~4.6-4.8 against ~4.7-
        5.0 before, but with the border pixels between rows 6.0-6.5 against 5.1-5.7
        (a run revisits each pixel's cache lines a vector at a time, out of the
        order the hardware prefetcher follows); the prefetches brought it to 3.6-4.4;
    runs of 1, 2, 4, 16 or 32 pixels: none better than 8 over the shapes above
        (without prefetches; at stride 2 runs of 2 were best then);
    4 pixels per step sharing their input loads (stride 1): 5.2 against 4.6 for
        runs of 8 (inner pixels).

Tried earlier, before explicit vectors (ns per output pixel, in cache / from memory,
against the per-pixel loop): whole output rows tap by tap, ~2x slower; channel blocks
as slices or with a block's lanes written out for LLVM's SLP vectorizer, 3-4x slower
(scalar code); 2 or 4 pixels per loop over the channels, faster in cache (52-65 vs
71-77) but 136-280 vs 97-111 from memory; padded input rows copied into a ring of
channel-blocked rows, 2-5x slower (the copy alone 2 ms of 16 x 144 x 56 x 56).
"""

import copy

import numpy as np

from lamina.backends import jit, threads
from lamina.backends.jit import jitable

from .. import gemm
from .. import vectors as v
from .layout import NCHW, NHWC
from .windows import tap_ranges


def applies(geo):
    """Whether conv2d of geometry ``geo`` is depthwise (one input channel per group)."""
    return geo.groups == geo.c and geo.cin == 1 and geo.groups > 1


# Note [Depthwise order]: an NCHW depthwise convolution runs each of its kernels
# channels-first or channels-last, its images transposed on the way in and out
# (conv.py's ``_order``; Note [Transposes] in layout.py), whichever measured faster:
# batch 32, float32, one thread, Zen 3 (AVX2), ms, channels-first / channels-last with
# the transposes. The forward pass (and the stride-1 input gradient, which is that
# forward pass) runs plane by plane where it loads the stride along the width and the
# input rows have at least PLANE_COLUMNS columns: MobileNet v2's 384 x 4 x 4 took 0.92
# / 0.35, 192 x 8 x 8 at stride 2 0.42 / 0.49. The weight gradient and the strided
# input gradient run their channels-first loops (``nchw_taps``: rows of few vectors
# end in scalar tails and per-tap sums) on input planes of more than GRAD_PLANE
# pixels, where the transposes of larger images cost more than they save: the weight
# gradient of 384 x 4 x 4 took 2.2 / 0.3, 192 x 8 x 8 2.3 / 0.8, 144 x 16 x 16 3.8 /
# 2.3 (stride 2: 1.6 / 0.9), but 96 x 32 x 32 at stride 2 3.3 / 6.0 and 32 x 32 x 32
# 1.7 / 3.9; the stride-2 input gradient of 144 x 16 x 16 2.8 / 1.0, 192 x 8 x 8 1.4 /
# 0.3.
PLANE_COLUMNS = 8
GRAD_PLANE = 256


def channels_last(geo, mode):
    """Whether the kernel of ``mode`` ("forward", "input" or "weight") of an NCHW
    depthwise convolution of geometry ``geo`` runs channels-last (Note [Depthwise
    order])."""
    if mode == "forward" or (mode == "input" and _by_forward(geo)):
        return not (_loads(geo.sw) and geo.w >= PLANE_COLUMNS)
    return geo.h * geo.w <= GRAD_PLANE


def _by_forward(geo):
    """Whether the input gradient is the forward pass of grad with the flipped kernel
    (``input_grad``)."""
    return (geo.sh, geo.sw) == (1, 1) and geo.c_out == geo.c


def _loads(sw):
    """Whether forward_planes loads stride ``sw`` along the width (load or load_even)."""
    return sw <= 2


# ---------------------------------------------------------------- what a tap does

# Note [Depthwise helpers inlined or called]: a helper that runs once per image, per
# channels-last output row or per channels-first plane (pad_image, nine_taps,
# shared_taps, nine_weight_taps, three_by_three, any_kernel) is a function the kernels
# call; one that runs per tap, per pixel or per row of a plane is inlined into them
# (inline="always"). Numba types an inlined helper again at each of its call sites in
# each kernel variant: with all of them inlined, the eight float32 variants took 48 s to
# compile, 35 s with the per-row ones called (Zen 3, one process; their run time the
# same within noise). A call passes each array as a dozen values and counts its
# references, some 50-100 ns: called per row of a plane, row_sums and border_sums made
# the channels-first gradients of 16 x 144 x 28 x 28 1.3x slower, so they stay inlined.


@jitable(**jit.CALLEE)
def taps_inside(lo, hi):
    """The outputs [lo.max(), hi.min()) along one axis whose taps all fall inside the
    input, from each tap's range [lo[t], hi[t]) (tap_ranges). A loop: Numba's max and
    min of an array compiled in ~2 s, once per process."""
    first, stop = lo[0], hi[0]
    for t in range(1, lo.size):
        first, stop = max(first, lo[t]), min(stop, hi[t])
    return first, stop


@jitable(**jit.CALLEE, inline="always")
def multiply_add(dst, src, w):
    """dst += src * w: the NHWC kernels' tap."""
    for k in range(dst.size):
        dst[k] += src[k] * w[k]


@jitable(**jit.CALLEE)
def input_grad_pixels(x, w, y, unused, n0, n1, from_h, from_w):
    """The NHWC input gradient x (N, H, W, C) of grad y, images [n0, n1), input pixel by
    input pixel: the
    sum over the taps (i, j) of y[n, from_h[ih, i], from_w[iw, j]] * w[i, j], where the
    tables name the output row (column) that reads input row ih (column iw) through
    tap i (j), -1 for none (a gather: each pixel written once, where a scatter over
    (output pixel, tap) pairs added into it again and again)."""
    kh, kw = w.shape[0], w.shape[1]
    for n in range(n0, n1):
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
def input_grad_nchw(xs, ys, w, acc, i, j):
    wv = w[i, j]
    for k in range(ys.size):
        xs[k] += wv * ys[k]


@jitable(**jit.CALLEE, inline="always")
def weight_grad_nchw(xs, ys, w, acc, i, j):
    row = acc[i, j]
    for k in range(ys.size):
        row[k] += xs[k] * ys[k]


@jitable(**jit.CALLEE)
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


@jitable(**jit.CALLEE)
def forward_pixels(x, w, y, padded, n0, n1, bias, sh, sw, pt, pl, dh, dw, lo_h, hi_h, lo_w, hi_w):
    """The NHWC forward pass of images [n0, n1) output pixel by output pixel, in explicit
    vectors of channels (Note [Channels-last depthwise forward]). Given a ``padded``
    image (not 0 x 0: small images, whose border pixels would be most of them), each
    image is first copied into it zero-padded, and every pixel has its nine taps."""
    kh, kw, c = w.shape
    (h0, h1), (w0, w1) = taps_inside(lo_h, hi_h), taps_inside(lo_w, hi_w)
    nine = kh == 3 and kw == 3
    if padded.shape[0]:
        h0, h1, w0, w1 = 0, y.shape[1], 0, y.shape[2]
    vectors = c - c % v.lanes(bias)  # the channels that nine_taps sums
    for n in range(n0, n1):
        image, top, left, ys = x[n], pt, pl, y[n]
        if padded.shape[0]:
            pad_image(image, pt, pl, padded)
            image, top, left = padded, 0, 0
        for oh in range(y.shape[1]):
            ih = oh * sh - top
            blocked = nine and h0 <= oh < h1
            for ow in range(y.shape[2]):
                inner = blocked and w0 <= ow < w1
                if not inner or vectors < c:
                    pixel(image, ih, ow * sw - left, w, bias, ys, oh, ow, vectors if inner else 0,
                          lo_h, hi_h, lo_w, hi_w, dh, dw)  # fmt: skip
            if blocked and padded.shape[0] and sw == 1 and dw == 1:
                shared_taps(image, ih, w, bias, ys, oh, w0, w1, dh)
            elif blocked:  # a padded image was just copied: its rows are in the cache
                nine_taps(image, ih, w, bias, ys, oh, w0, w1, sw, left, dh, dw, not padded.shape[0])


@jitable(**jit.CALLEE, inline="always")
def pixel(image, ih, iw, w, bias, ys, oh, ow, k, lo_h, hi_h, lo_w, hi_w, dh, dw):
    """Channels k, k + 1, ... of output pixel (oh, ow) of image ys: the bias plus its
    taps inside ``image``, whose tap (0, 0) is at (ih, iw), whole vectors first."""
    kh, kw, c = w.shape
    width, lanes = image.shape[1], v.lanes(bias)
    at = (oh * ys.shape[1] + ow) * c
    while k + lanes <= c:
        acc = v.load(bias, k)
        for i in range(kh):
            if lo_h[i] <= oh < hi_h[i]:
                row = (ih + i * dh) * width + iw
                for j in range(kw):
                    if lo_w[j] <= ow < hi_w[j]:
                        tap = v.load(w, (i * kw + j) * c + k)
                        acc = v.multiply_add(v.load(image, (row + j * dw) * c + k), tap, acc)
        v.store(ys, at + k, acc)
        k += lanes
    for q in range(k, c):  # the channels after the last whole vector
        total = bias[q]
        for i in range(kh):
            if lo_h[i] <= oh < hi_h[i]:
                for j in range(kw):
                    if lo_w[j] <= ow < hi_w[j]:
                        total += image[ih + i * dh, iw + j * dw, q] * w[i, j, q]
        ys[oh, ow, q] = total


@jitable(**jit.CALLEE, inline="always")
def _nine(w, c, k):
    """Vector k of each of a 3 x 3 kernel's nine taps, w (3, 3, c) as flat rows of c:
    the weights (or weight gradient sums) a vector of channels keeps in registers."""
    return (
        v.load(w, k), v.load(w, c + k), v.load(w, 2 * c + k),
        v.load(w, 3 * c + k), v.load(w, 4 * c + k), v.load(w, 5 * c + k),
        v.load(w, 6 * c + k), v.load(w, 7 * c + k), v.load(w, 8 * c + k),
    )  # fmt: skip


@jitable(**jit.CALLEE)
def nine_taps(image, ih, w, bias, ys, oh, w0, w1, sw, left, dh, dw, fetch):
    """The whole vectors of channels of output pixels [w0, w1) of row oh of a 3 x 3
    kernel, all taps inside input rows ih, ih + dh, ih + 2 dh: runs of RUN pixels, each
    a vector of channels at a time with that vector's nine weights and bias in
    registers, with ``fetch`` prefetching the next run's input rows that earlier output
    rows did not read (the last at stride 1, the last two at stride 2) and its output."""
    c, lanes = bias.size, v.lanes(bias)
    r0, at = ih * image.shape[1] * c, oh * ys.shape[1] * c  # flat indices of the rows
    r1, r2 = r0 + dh * image.shape[1] * c, r0 + 2 * dh * image.shape[1] * c
    ahead = RUN * sw * c  # the next run's input
    for p0 in range(w0, w1, RUN):
        p1 = min(p0 + RUN, w1)
        for k in range(0, c - lanes + 1, lanes):
            w00, w01, w02, w10, w11, w12, w20, w21, w22 = _nine(w, c, k)
            start = v.load(bias, k)
            for ow in range(p0, p1):
                a = (ow * sw - left) * c + k
                b, d = a + dw * c, a + 2 * dw * c
                acc = v.multiply_add(v.load(image, r0 + a), w00, start)
                acc = v.multiply_add(v.load(image, r0 + b), w01, acc)
                acc = v.multiply_add(v.load(image, r0 + d), w02, acc)
                acc = v.multiply_add(v.load(image, r1 + a), w10, acc)
                acc = v.multiply_add(v.load(image, r1 + b), w11, acc)
                acc = v.multiply_add(v.load(image, r1 + d), w12, acc)
                acc = v.multiply_add(v.load(image, r2 + a), w20, acc)
                acc = v.multiply_add(v.load(image, r2 + b), w21, acc)
                acc = v.multiply_add(v.load(image, r2 + d), w22, acc)
                v.store(ys, at + ow * c + k, acc)
                if fetch:
                    v.prefetch(image, r1 + d + ahead)
                    v.prefetch(image, r2 + d + ahead)
                    v.prefetch_write(ys, at + (ow + RUN) * c + k)


# the output pixels of one of nine_taps' runs (Note [Channels-last depthwise forward])
RUN = 8


@jitable(**jit.CALLEE)
def shared_taps(image, ih, w, bias, ys, oh, w0, w1, dh):
    """nine_taps of a padded image (in the cache: no prefetches) at stride 1, undilated
    along the rows: SHARED neighbouring output pixels a step, each input vector loaded
    once for all of them (6 per kernel row instead of 12), each pixel's taps summed in
    nine_taps' order."""
    c, lanes = bias.size, v.lanes(bias)
    r0, at = ih * image.shape[1] * c, oh * ys.shape[1] * c
    r1, r2 = r0 + dh * image.shape[1] * c, r0 + 2 * dh * image.shape[1] * c
    for k in range(0, c - lanes + 1, lanes):
        w00, w01, w02, w10, w11, w12, w20, w21, w22 = _nine(w, c, k)
        rows = ((r0, w00, w01, w02), (r1, w10, w11, w12), (r2, w20, w21, w22))
        start = v.load(bias, k)
        last = w1 - (w1 - w0) % SHARED
        for ow in range(w0, last, SHARED):
            a0, a1, a2, a3 = start, start, start, start
            for r, wa, wb, wc in rows:
                q = r + ow * c + k
                x0, x1, x2 = v.load(image, q), v.load(image, q + c), v.load(image, q + 2 * c)
                x3, x4 = v.load(image, q + 3 * c), v.load(image, q + 4 * c)
                x5 = v.load(image, q + 5 * c)
                a0 = v.multiply_add(x2, wc, v.multiply_add(x1, wb, v.multiply_add(x0, wa, a0)))
                a1 = v.multiply_add(x3, wc, v.multiply_add(x2, wb, v.multiply_add(x1, wa, a1)))
                a2 = v.multiply_add(x4, wc, v.multiply_add(x3, wb, v.multiply_add(x2, wa, a2)))
                a3 = v.multiply_add(x5, wc, v.multiply_add(x4, wb, v.multiply_add(x3, wa, a3)))
            out = at + ow * c + k
            v.store(ys, out, a0)
            v.store(ys, out + c, a1)
            v.store(ys, out + 2 * c, a2)
            v.store(ys, out + 3 * c, a3)
        for ow in range(last, w1):
            acc = start
            for r, wa, wb, wc in rows:
                q = r + ow * c + k
                acc = v.multiply_add(v.load(image, q), wa, acc)
                acc = v.multiply_add(v.load(image, q + c), wb, acc)
                acc = v.multiply_add(v.load(image, q + 2 * c), wc, acc)
            v.store(ys, at + ow * c + k, acc)


SHARED = 4  # shared_taps' output pixels a step


@jitable(**jit.CALLEE)
def weight_grad_pixels(x, w, y, unused, n0, n1, sh, sw, pt, pl, dh, dw, lo_h, hi_h, lo_w, hi_w):
    """The NHWC weight gradient w (kH, kW, C) += x * grad over images [n0, n1), output
    pixel by output pixel
    as forward_pixels (without padding: a padding zero times an infinite grad would be
    NaN): a 3 x 3 kernel's pixels with all taps inside the input accumulate into the
    nine weight rows in one loop over the channels (``nine_weight_taps``); measured on
    16x144x56x56, one thread, 13.8 -> 7 ms where the loop over (pixel, tap) pairs
    reloaded grad once per tap."""
    kh, kw = w.shape[0], w.shape[1]
    (h0, h1), (w0, w1) = taps_inside(lo_h, hi_h), taps_inside(lo_w, hi_w)
    nine = kh == 3 and kw == 3
    for n in range(n0, n1):
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
                nine_weight_taps(x[n], ih, w, y[n], oh, w0, w1, sw, pl, dh, dw)


@jitable(**jit.CALLEE)
def nine_weight_taps(image, ih, w, ys, oh, w0, w1, sw, left, dh, dw):
    """nine_taps' adjoint in the weight: w[i, j] += the input under tap (i, j) times the
    gradient, over output pixels [w0, w1) of row oh, whose taps are in input rows ih,
    ih + dh, ih + 2 dh. Each whole vector of channels keeps its nine sums in registers
    through the row, loaded and stored once, where a loop over each pixel's channels
    loaded and stored them (LLVM could not keep them in registers: they might alias
    the images). The whole weight gradient, float32, one thread, channels-last, ms:
    32 x 32 x 32 x 32 2.2-2.4 -> 0.47, 32 x 96 x 32 x 32 stride 2 1.0 -> 0.47, 16 x 144
    x 56 x 56 8.3-8.9 -> 5.7. The channels after the last whole vector run one by
    one."""
    c, lanes = w.shape[2], v.lanes(w)
    r0, at = ih * image.shape[1] * c, oh * ys.shape[1] * c  # flat indices of the rows
    r1, r2 = r0 + dh * image.shape[1] * c, r0 + 2 * dh * image.shape[1] * c
    vectors = c - c % lanes
    for k in range(0, vectors, lanes):
        s00, s01, s02, s10, s11, s12, s20, s21, s22 = _nine(w, c, k)
        for ow in range(w0, w1):
            a = (ow * sw - left) * c + k
            b, d = a + dw * c, a + 2 * dw * c
            g = v.load(ys, at + ow * c + k)
            s00 = v.multiply_add(v.load(image, r0 + a), g, s00)
            s01 = v.multiply_add(v.load(image, r0 + b), g, s01)
            s02 = v.multiply_add(v.load(image, r0 + d), g, s02)
            s10 = v.multiply_add(v.load(image, r1 + a), g, s10)
            s11 = v.multiply_add(v.load(image, r1 + b), g, s11)
            s12 = v.multiply_add(v.load(image, r1 + d), g, s12)
            s20 = v.multiply_add(v.load(image, r2 + a), g, s20)
            s21 = v.multiply_add(v.load(image, r2 + b), g, s21)
            s22 = v.multiply_add(v.load(image, r2 + d), g, s22)
        v.store(w, k, s00)
        v.store(w, c + k, s01)
        v.store(w, 2 * c + k, s02)
        v.store(w, 3 * c + k, s10)
        v.store(w, 4 * c + k, s11)
        v.store(w, 5 * c + k, s12)
        v.store(w, 6 * c + k, s20)
        v.store(w, 7 * c + k, s21)
        v.store(w, 8 * c + k, s22)
    for ow in range(w0, w1):
        iw = ow * sw - left
        for i in range(3):
            for j in range(3):
                src, dst = image[ih + i * dh, iw + j * dw], w[i, j]
                for k in range(vectors, c):
                    dst[k] += src[k] * ys[oh, ow, k]


def nchw_taps(tap, with_sums, sw):
    """The NCHW gradients' loop over the taps of images x (N, C, H, W), weight w (C_out,
    1, kH, kW) and y (N, C_out, Ho, Wo), plane by plane over images [n0, n1): ``tap``
    updates one of them from the two others for one output row segment and one kernel
    tap (the input row read ``sw`` apart, a constant); with_sums, ``acc`` (kH, kW, Wo)
    holds a weight gradient's per-tap sums over one plane, added to w[co] at its end, a
    3 x 3 kernel's inner rows summing all nine taps in one loop (``nine_sums``:
    measured one thread, 8 x 32 x 32 x 32, 0.63 -> 0.34 ms, 8 x 96 x 32 x 32 stride 2,
    1.16 -> 0.62 ms)."""

    @jitable(**jit.CALLEE, inline="always")
    def segment(xrow, a, b):  # input columns a, a + sw, ... < b
        return xrow[a:b] if sw == 1 else xrow[a:b:sw]  # unit stride vectorizes

    @jitable(**jit.CALLEE, inline="always")
    def border_sums(xplane, ih, wk, gplane, oh, w0, w1, pl, dh, dw, lo_w, hi_w):
        """The weight gradient's sums over the columns outside [w0, w1) of an output row
        whose taps lie inside, tap by tap into wk, indexing the planes (views of the rows
        cost more than these few pixels: Numba counts each view's references)."""
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
    def nine_sums(x0, x1, x2, grow, w0, w1, pl, dw):
        """The nine taps' sums of input times grad over columns [w0, w1) of one output row
        (every tap inside), in one loop (compiled reassociating, so that the sums
        vectorize). The rows are indexed, not sliced into nine views: Numba typed the
        inlined slicing again at each of the nine, 4 of a 10 s compile (float32, stride
        1); an unsigned index has no wraparound test, so the loop vectorizes as well."""
        a = w0 * sw - pl
        c, d = a + dw, a + 2 * dw
        s00 = s01 = s02 = s10 = s11 = s12 = s20 = s21 = s22 = grow.dtype.type(0)
        for k in range(w1 - w0):
            v, i = grow[np.uint64(w0 + k)], k * sw
            ia, ic, id_ = np.uint64(a + i), np.uint64(c + i), np.uint64(d + i)
            s00 += x0[ia] * v
            s01 += x0[ic] * v
            s02 += x0[id_] * v
            s10 += x1[ia] * v
            s11 += x1[ic] * v
            s12 += x1[id_] * v
            s20 += x2[ia] * v
            s21 += x2[ic] * v
            s22 += x2[id_] * v
        return s00, s01, s02, s10, s11, s12, s20, s21, s22

    def kernel(x, w, y, acc, n0, n1, sh, pt, pl, dh, dw, lo_h, hi_h, lo_w, hi_w):
        kh, kw, m = w.shape[2], w.shape[3], y.shape[1] // x.shape[1]
        (h0, h1), (w0, w1) = taps_inside(lo_h, hi_h), taps_inside(lo_w, hi_w)
        whole_rows = with_sums and kh == 3 and kw == 3 and w0 < w1
        for n in range(n0, n1):
            for co in range(y.shape[1]):
                xplane, yplane, wk = x[n, co // m], y[n, co], w[co, 0]
                for oh in range(y.shape[2]):
                    if whole_rows and h0 <= oh < h1:  # every tap inside
                        ih = oh * sh - pt
                        row_sums(xplane, ih, yplane, oh, wk, acc, w0, w1, pl, dh, dw, lo_w, hi_w)
                        continue
                    yrow = yplane[oh]
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

    return jitable(kernel, **jit.CALLEE, fastmath=jit.REASSOCIATE if with_sums else False)


# Note [Channels-first depthwise forward]: the NCHW forward pass copies each input plane
# into a zero-padded plane of its part's scratch (the border zeroed once per call), then
# computes each output row in explicit vectors of columns (Note [Explicit vectors]):
# one vector per tap, loaded from the padded plane -- at stride 2 the even lanes of two
# vectors (``load_even``) -- times the tap's weight in every lane; a row's last vector
# is stored masked (``store_first``). So no tap needs a bound test, and the plane it
# reads is in L1. A 3 x 3 kernel holds its nine weights in registers through the plane;
# reloaded per tap (as other kernels' are) it took 0.99 ms against 0.58 on 32 x 144 x
# 16 x 16 (LLVM cannot keep them: it cannot prove the output does not alias them).
# Measured on 2 cores (AVX-512), MobileNet v2's depthwise layers at batch 32 of 64 x 64
# images, float32, ms, before (row segments tap by tap, and channels-last with the
# transposes below 100 output pixels) / now / PyTorch (oneDNN), one thread and two:
#
#     channels x size, stride   one thread            two threads
#     32 x 32 x 32, 1           1.33 / 0.48 / 1.00    0.82 / 0.28 / 0.55
#     96 x 32 x 32, 2           2.53 / 0.89 / 1.80    1.41 / 0.50 / 0.96
#     144 x 16 x 16, 1          2.92 / 0.66 / 1.12    1.67 / 0.31 / 0.60
#     144 x 16 x 16, 2          1.88 / 0.50 / 0.71    1.88 / 0.27 / 0.40
#     192 x 8 x 8, 1            0.63 / 0.58 / 0.41    0.62 / 0.33 / 0.18
#
# Output rows shorter than half a vector (MobileNet's 4 x 4 and 2 x 2 images, 8 x 8 at
# stride 2) ran 1.4-3x slower this way than channels-last with the transposes.
def forward_planes(sw, kw):
    """The NCHW forward pass plane by plane (Note [Channels-first depthwise forward]), the
    stride along the width ``sw`` (1 or 2) and the kernel's width constants (the loop
    over a row's taps unrolls)."""

    @jitable(**jit.CALLEE, inline="always")
    def under(padded, at):  # a tap's input under output columns ow, ow + 1, ...
        return v.load(padded, at) if sw == 1 else v.load_even(padded, at)

    @jitable(**jit.CALLEE)
    def three_by_three(padded, wf, taps, y, out, bias, ho, wo, sh, dh, dw, pitch):
        """A 3 x 3 kernel's plane: its nine weights held in registers through it."""
        lanes = v.lanes(padded)
        w0, w1, w2 = v.splat(wf, taps), v.splat(wf, taps + 1), v.splat(wf, taps + 2)
        w3, w4, w5 = v.splat(wf, taps + 3), v.splat(wf, taps + 4), v.splat(wf, taps + 5)
        w6, w7, w8 = v.splat(wf, taps + 6), v.splat(wf, taps + 7), v.splat(wf, taps + 8)
        for oh in range(ho):
            for ow in range(0, wo, lanes):
                a = oh * sh * pitch + ow * sw
                b, d = a + dh * pitch, a + 2 * dh * pitch
                acc = v.multiply_add(under(padded, a), w0, bias)
                acc = v.multiply_add(under(padded, a + dw), w1, acc)
                acc = v.multiply_add(under(padded, a + 2 * dw), w2, acc)
                acc = v.multiply_add(under(padded, b), w3, acc)
                acc = v.multiply_add(under(padded, b + dw), w4, acc)
                acc = v.multiply_add(under(padded, b + 2 * dw), w5, acc)
                acc = v.multiply_add(under(padded, d), w6, acc)
                acc = v.multiply_add(under(padded, d + dw), w7, acc)
                acc = v.multiply_add(under(padded, d + 2 * dw), w8, acc)
                store_row_part(y, out + oh * wo + ow, acc, wo - ow)

    @jitable(**jit.CALLEE)
    def any_kernel(padded, weights, y, out, bias, kh, ho, wo, sh, dh, dw, pitch):
        """Any other kernel's plane, its weights as vectors in ``weights``."""
        lanes = v.lanes(padded)
        for oh in range(ho):
            for ow in range(0, wo, lanes):
                acc = bias
                for i in range(kh):
                    at = (oh * sh + i * dh) * pitch + ow * sw
                    for j in range(kw):
                        weight = v.load(weights, (i * kw + j) * lanes)
                        acc = v.multiply_add(under(padded, at + j * dw), weight, acc)
                store_row_part(y, out + oh * wo + ow, acc, wo - ow)

    def kernel(x, w, y, padded, t0, t1, bias, sh, pt, pl, dh, dw):
        c_in, h, width = x.shape[1], x.shape[2], x.shape[3]
        c_out, ho, wo = y.shape[1], y.shape[2], y.shape[3]
        kh, lanes = w.shape[2], v.lanes(padded)
        pitch = (wo - 1) * sw + (kw - 1) * dw + 1
        # the input rows and columns read (padding may be negative: a flipped kernel's)
        r0, r1 = max(0, -pt), min(h, (ho - 1) * sh + (kh - 1) * dh + 1 - pt)
        c0, c1 = max(0, -pl), min(width, pitch - pl)
        xf, yf, wf = x.reshape(x.size), y.reshape(y.size), w.reshape(w.size)
        taps = kh * kw
        weights = padded[padded.size - taps * lanes :]  # any_kernel's weight vectors
        padded[:] = 0  # the border: only the interior is written below
        for t in range(t0, t1):
            n, co = t // c_out, t % c_out
            plane = (n * c_in + co // (c_out // c_in)) * h * width
            for r in range(r0, r1):
                at = plane + r * width + c0
                copy_row(xf, at, padded, (r + pt) * pitch + pl + c0, c1 - c0)
            start = v.splat(bias, co)
            if kh == 3 and kw == 3:
                three_by_three(padded, wf, co * 9, yf, t * ho * wo, start, ho, wo, sh, dh, dw,
                               pitch)  # fmt: skip
                continue
            for k in range(taps):
                v.store(weights, k * lanes, v.splat(wf, co * taps + k))
            any_kernel(padded, weights, yf, t * ho * wo, start, kh, ho, wo, sh, dh, dw, pitch)

    return jitable(kernel, **jit.CALLEE)


@jitable(**jit.CALLEE, inline="always")
def store_row_part(y, at, acc, left):
    """Vector acc into y from ``at``, its first ``left`` lanes where fewer are left in
    the row."""
    if left >= v.lanes(y):
        v.store(y, at, acc)
    else:
        v.store_first(y, at, acc, left)


@jitable(**jit.CALLEE, inline="always")
def copy_row(src, i, dst, j, count):
    """dst[j : j + count] = src[i : i + count] (flat), in vectors."""
    lanes = v.lanes(src)
    vectors = count - count % lanes
    for q in range(0, vectors, lanes):
        v.store(dst, j + q, v.load(src, i + q))
    for q in range(vectors, count):
        dst[j + q] = src[i + q]


def in_parts(kernel):
    """``kernel(x, w, y, scratch, start, stop, *rest)`` over ``total`` units (images or
    planes; ``rest`` a tuple) in scratch.shape[0] parts, in parallel (Note [Depthwise
    parts]): part p takes scratch[p], and w[p] where w has a part per thread (a weight
    gradient, summed after), else w[0]."""

    def run(x, w, y, scratch, total, rest):
        parts = scratch.shape[0]
        for p in jit.prange(parts):
            start, stop = jit.part(total, parts, p)
            kernel(x, w[p % w.shape[0]], y, scratch[p], start, stop, *rest)

    return run


# ---------------------------------------------------------------- compiled kernels

_NHWC = {"forward": forward_pixels, "input": input_grad_pixels, "weight": weight_grad_pixels}
_NCHW_TAPS = {"input": input_grad_nchw, "weight": weight_grad_nchw}


def _kernel(layout, mode, constants, scratch):
    """The kernel of ``mode`` ("forward", "input", "weight") in ``layout`` over
    scratch.shape[0] parts (``in_parts``: serial for one), compiled for ``constants``
    (NCHW kernels': the stride along the width, and the forward pass's kernel width).
    The key is looked up before any Numba type is built: building the signature took a
    third of a small convolution's call."""
    key = (layout, mode, constants, scratch.dtype, scratch.shape[0] > 1)
    return jit.cached((_kernel, key), lambda: _build(*key))


def _build(layout, mode, constants, dtype, parallel):
    """``in_parts`` calling the kernel of ``_part_kernel`` by its name (Note [Depthwise
    parts by name])."""
    symbol, (*arrays, rest) = _part_kernel(layout, mode, constants, dtype)
    sig = jit.types.void(*arrays, jit.types.int64, jit.types.Tuple(rest))
    return jit.compile_kernel(in_parts(jit.by_name(symbol)), sig, parallel, nogil=True)


# Note [Depthwise parts by name]: a depthwise kernel's loop over its units (images or
# planes) is compiled once per layout, mode, constants and dtype, as a kernel of its
# own that ``in_parts`` calls by name once per part, serial or parallel (Note [Kernels
# called by name] in backends/jit.py): compiled into ``in_parts``, each serial variant
# and its parallel twin compiled it twice. The eight float32 kernels, serial and
# parallel, compiled in 77 s, 43 s by name, from empty caches in one process (Zen 3);
# their run time the same within noise.
def _part_kernel(layout, mode, constants, dtype):
    """(the name of the compiled loop of ``mode`` in ``layout`` over a part's units,
    the Numba types of in_parts's arrays and of the loop's last arguments)."""
    t, i64, idx = jit.types, jit.types.int64, jit.index()
    a1, a2, a4, a5 = (jit.array(dtype, d) for d in (1, 2, 4, 5))
    tables = (idx, idx, idx, idx)
    if layout == NHWC:
        sig = (a4, a4, a4, *{
            "forward": (a4, (a1, *[i64] * 6, *tables)),
            "input": (a2, (jit.index(2), jit.index(2))),
            "weight": (a2, (*[i64] * 6, *tables)),
        }[mode])  # fmt: skip
    elif mode == "forward":
        sig = (a4, a5, a4, a2, (a1, *[i64] * 5))
    else:
        sig = (a4, a5, a4, a4, (*[i64] * 5, *tables))
    x, w, y, scratch, rest = sig
    part = t.void(x, w.copy(ndim=w.ndim - 1), y, scratch.copy(ndim=scratch.ndim - 1), i64, i64,
                  *rest)  # fmt: skip
    symbol = jit.kernel_name("depthwise", layout, mode, *constants, np.dtype(dtype))

    def build():
        if layout == NHWC:
            kernel, fastmath = _NHWC[mode], False
        elif mode == "forward":
            kernel, fastmath = forward_planes(*constants), False
        else:
            kernel = nchw_taps(_NCHW_TAPS[mode], mode == "weight", *constants)
            fastmath = jit.REASSOCIATE if mode == "weight" else False  # nine_sums vectorize
        return jit.compile_kernel(kernel, part, fastmath=fastmath, nogil=True, symbol=symbol)

    jit.cached((_part_kernel, layout, mode, constants, np.dtype(dtype)), build)
    return symbol, sig


def _parts(geo, total):
    """Into how many parts a kernel of ``geo`` cuts its ``total`` units (images or
    planes): one per thread from PARALLEL_ELEMENTS multiply-adds (Note [Depthwise
    parts])."""
    return threads.parts_for(geo.n * geo.c_out * geo.ho * geo.wo * geo.kh * geo.kw, total)


# The images whose forward pass runs zero-padded (forward_pixels): at stride 1, those
# whose padded copy stays in a core's L2 cache (Note [Channels-last depthwise
# forward]), and only where the weight is finite: padding reads zeros where the direct
# loops read nothing, and an infinite or NaN weight times a zero would spread NaN over
# the border.
PADDED_BYTES = 512 << 10


def _padded_images(geo, w, parts, dtype):
    """forward_pixels' padded image per part (0 x 0 ones where it runs unpadded)."""
    hp = (geo.ho - 1) * geo.sh + geo.dh * (geo.kh - 1) + 1
    wp = (geo.wo - 1) * geo.sw + geo.dw * (geo.kw - 1) + 1
    small = hp * wp * geo.c * np.dtype(dtype).itemsize <= PADDED_BYTES
    if (geo.sh, geo.sw) != (1, 1) or not small or not np.isfinite(w).all():
        return np.empty((parts, 0, 0, 0), dtype)
    return np.empty((parts, hp, wp, geo.c), dtype)


def _padded_planes(geo, parts, dtype):
    """forward_planes' scratch per part: a padded plane, room for its last vector loads
    (two vectors), and its weights as vectors."""
    rows = (geo.ho - 1) * geo.sh + (geo.kh - 1) * geo.dh + 1
    pitch = (geo.wo - 1) * geo.sw + (geo.kw - 1) * geo.dw + 1
    return np.empty((parts, rows * pitch + (2 + geo.kh * geo.kw) * v.lanes_of(dtype)), dtype)


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
    """out = the depthwise convolution of kernel-order images x plus bias, in parts on
    lamina's threads (Note [Depthwise parts])."""
    _forward(x, w, bias, geo, _geometry(geo), layout, out)


def _forward(x, w, bias, geo, geometry, layout, out):
    (sh, sw), (pt, pl), (dh, dw) = geometry
    # the kernels start from the bias, read as a C-contiguous array (a view's strides
    # would be misread)
    bias = np.zeros(geo.c_out, x.dtype) if bias is None else np.ascontiguousarray(bias)
    if layout == NCHW and not (_loads(sw) and np.isfinite(w).all()):
        # forward_planes reads zero padding, which an infinite or NaN weight would turn
        # into NaN: channels-last, which reads none
        nhwc = np.empty((geo.n, geo.ho, geo.wo, geo.c_out), x.dtype)
        _forward(_channels_last(x), w, bias, geo, geometry, NHWC, nhwc)
        out[...] = nhwc.transpose(0, 3, 1, 2)
        return
    if layout == NCHW:
        planes = geo.n * geo.c_out
        padded = _padded_planes(geo, _parts(geo, planes), x.dtype)
        _kernel(NCHW, "forward", (sw, geo.kw), padded)(
            x, np.ascontiguousarray(w)[None], out, padded, planes, (bias, sh, pt, pl, dh, dw)
        )
        return
    if geo.c_out != geo.c:
        x, geo = _repeated(x, geo)
    padded = _padded_images(geo, w, _parts(geo, geo.n), x.dtype)
    _kernel(NHWC, "forward", (), padded)(
        x, _tap_major(w)[None], out, padded, geo.n, (bias, *_pixels_args(geo, geometry))
    )


def _tables(geo, geometry):
    """The tap ranges (windows.tap_ranges) of rows and columns."""
    (sh, sw), (pt, pl), (dh, dw) = geometry
    rows = tap_ranges(geo.h, geo.ho, geo.kh, sh, pt, dh)
    return (*rows, *tap_ranges(geo.w, geo.wo, geo.kw, sw, pl, dw))


def _pixels_args(geo, geometry=None):
    """forward_pixels' and weight_grad_pixels' arguments after the images' count (and
    bias)."""
    geometry = geometry or _geometry(geo)
    (sh, sw), (pt, pl), (dh, dw) = geometry
    return (sh, sw, pt, pl, dh, dw, *_tables(geo, geometry))


def _unused(parts, x):
    """The scratch of a kernel that needs none: it gives the part count."""
    return np.empty((parts, 0), x.dtype)


def _channels_last(x):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


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
        np.sum(repeated.reshape(*gx.shape, geo.c_out // geo.c), axis=-1, out=gx)
        return
    if _by_forward(geo):
        flipped = copy.copy(geo)
        flipped.h, flipped.w, flipped.ho, flipped.wo = geo.ho, geo.wo, geo.h, geo.w
        pads = (geo.dh * (geo.kh - 1) - geo.pt, geo.dw * (geo.kw - 1) - geo.pl)
        geometry = ((1, 1), pads, (geo.dh, geo.dw))
        _forward(g, w[:, :, ::-1, ::-1], None, flipped, geometry, layout, gx)
        return
    parts = _parts(geo, geo.n)
    if layout == NHWC:  # a gather: writes every pixel
        geometry = _geometry(geo)
        (sh, sw), (pt, pl), (dh, dw) = geometry
        from_h = _readers(geo.h, geo.ho, geo.kh, sh, pt, dh)
        from_w = _readers(geo.w, geo.wo, geo.kw, sw, pl, dw)
        unused = _unused(parts, gx)
        _kernel(NHWC, "input", (), unused)(
            gx, _tap_major(w)[None], g, unused, geo.n, (from_h, from_w)
        )
        return
    gx[...] = 0  # the NCHW scatter adds
    unused = np.empty((parts, 1, 1, 1), gx.dtype)
    w = np.ascontiguousarray(w)[None]
    _kernel(NCHW, "input", (geo.sw,), unused)(gx, w, g, unused, geo.n, _taps_args(geo))


def _taps_args(geo):
    """nchw_taps' arguments after the images' count."""
    return (geo.sh, geo.pt, geo.pl, geo.dh, geo.dw, *_tables(geo, _geometry(geo)))


def weight_grad(x, g, geo, layout):
    """The weight gradient (C_out, 1, kH, kW) of images x and grad g, each part of the
    batch summing into a weight gradient of its own."""
    if layout == NHWC and geo.c_out != geo.c:
        x, geo = _repeated(x, geo)
    parts = _parts(geo, geo.n)
    if layout == NHWC:
        gw, unused = np.zeros((parts, geo.kh, geo.kw, geo.c_out), x.dtype), _unused(parts, x)
        _kernel(NHWC, "weight", (), unused)(x, gw, g, unused, geo.n, _pixels_args(geo))
        return np.ascontiguousarray(gemm.parts_total(gw).transpose(2, 0, 1))[:, None]
    gw = np.zeros((parts, geo.c_out, 1, geo.kh, geo.kw), x.dtype)
    sums = np.zeros((parts, geo.kh, geo.kw, geo.wo), x.dtype)
    _kernel(NCHW, "weight", (geo.sw,), sums)(x, gw, g, sums, geo.n, _taps_args(geo))
    return gemm.parts_total(gw)
