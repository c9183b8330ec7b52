"""Convolutions on few input channels (a network's first layer on RGB images): the
forward pass and the weight gradient by direct loops over the kernel's taps.

Note [Direct convolution of few channels]: with C_in <= DIRECT_CHANNELS, im2col's
matrix is a row of kH kW C_in values per output pixel built from almost nothing (the
image is 3 channels, the matrix 49 times its size for a 7 x 7 kernel), then a GEMM
of inner dimension 27-363. The copy costs as much as the product: ResNet-18's 7 x 7
stride-2 stem took 8.8 ms at batch 32 channels-last (PyTorch's direct convolution:
5.9). Here each output row is summed in registers, in explicit vectors of output
channels (Note [Explicit vectors] in vectors.py): PIXELS = 4 neighbouring output
pixels a step, up to four vectors of output channels each, so that each weight vector
loaded serves four pixels and each input value (one broadcast) every vector. A
pixel's taps are read as runs ("segments"): in channels-last images a kernel row's
taps are one run of kW C_in input values (Note [Kernel rows as runs] in conv.py), in
channels-first ones a kernel row of one channel is a run of kW; the weight's rows are
in the same order ((kH, kW, C_in) or (C_in, kH, kW)). The images are copied
zero-padded first (a few channels: a small copy), so every pixel has all its taps,
and an infinite weight (or gradient) meets the padding's zeros as im2col's matrix
does: NaN, numpy_ref's result. Channels-first outputs are made a row at a time
channels-last, then transposed into place.

The weight gradient runs the same steps: each tap's row of sums (a part's own, added
at the end) loaded once for four pixels, whose gradient vectors stay in registers
through the taps.

Measured at batch 32, 64 x 64 images, one thread, Zen 4, float32, channels-last
(channels-first), before -> after, PyTorch's channels-last in brackets:

    stem (3 channels in)       forward                       + weight gradient
    ResNet-18, 64 7x7 s2       8.8 -> 5.5 (8.8 -> 6.4) [5.9]   15.8 -> 13.5 [12.9]
    Inception, 32 7x7 s2       5.7 -> 2.9 (4.9 -> 3.5) [3.0]   13.0 -> 6.7 (12.2 -> 8.3) [5.9]
    MobileNet v2, 32 3x3 s2    1.7 -> 0.64 (1.4 -> 1.1) [0.63]  2.8 -> 2.1 [1.4]

The forward pass runs at 110-114 GFLOP/s, where OpenBLAS's GEMM alone reached 95.

Note [Registers]: a step's sums stay in registers through its taps only where they
fit: PIXELS x vectors sums, PIXELS broadcast inputs and a weight vector. AVX-512 has
32 vector registers, which hold four vectors' 16 sums and the rest; AVX2 has 16, and
LLVM stored and reloaded the sums that did not fit at every tap. There a step takes
two vectors of output channels (8 sums). Measured on a Zen 3 VM (AVX2), one thread,
float32 forward, channels-last, four vectors -> two, us: Inception's stem (32 7 x 7
stride 2, 64 x 64 images) at batch 1 242-335 -> 159-280, at batch 32 6170-9328 ->
4469-5934; ResNet-18's (64) at batch 8 3067-4338 -> 2294-3144 (PyTorch's: ~190 at
batch 1, ~4450 at batch 32). Channels-first it moved within noise. The weight
gradient keeps four vectors: its gradient vectors are only read, and a spilled one is
an operand loaded from the cache, where a spilled sum is stored and loaded again.

Note [Up to 16]: channels-last convolutions of kernels wider than 1 x 1 run their
forward pass direct up to 16 input channels, and their weight gradient up to 8
(DIRECT_CHANNELS_LAST). There a kernel row's taps are still one run of kW C_in values,
and with so few channels Winograd's products and im2col's GEMMs, whose inner dimension
is C_in (or kH kW C_in), are too thin to pay for their transforms and copies. Measured
on a Zen 3 VM (AVX2), float32, channels-last, 3 x 3 kernels, one thread, batch 32
(batch 1), ms, before -> after, each pass alone:

    convolution                    forward                      weight gradient
    16 -> 16 on 64 x 64 (VGG's)    20.1 -> 11.6 (0.60 -> 0.41)  16.8 -> 18.8 (0.45 -> 0.49)
    16 -> 32 on 32 x 32            7.2 -> 5.7 (0.27 -> 0.21)    4.4 -> 4.9 (0.20 -> 0.19)
    16 -> 64 on 16 x 16            2.87 -> 2.90 (0.17 -> 0.16)  1.85 -> 3.10 (0.12 -> 0.13)
    12 -> 24 on 32 x 32            4.7 -> 3.0 (0.32 -> 0.25)    3.6 -> 3.5 (0.19 -> 0.13)
    12 -> 48 on 16 x 16                                         1.27 -> 1.54 (0.10 -> 0.08)
    8 -> 32 on 32 x 32             5.6 -> 3.3 (0.25 -> 0.15)    3.3 -> 2.9 (0.18 -> 0.12)
    5 -> 16 on 64 x 64                                          8.7 -> 5.8 (0.29 -> 0.19)
    16 -> 16 stride 2, 64 x 64     6.6 -> 4.1 (0.20 -> 0.17)

PyTorch took 17.5-20.3 ms for the first forward pass at batch 32. On two threads the
forward passes ran 1.0-2.4x as fast, the weight gradients of 5 and 8 channels
0.99-1.65x, of 12 0.89-1.25x, of 16 0.74-0.90x. The forward pass lost with 24 channels
(24 -> 48 on 16 x 16: 2.0 -> 2.8), and both lost channels-first, where a run is one
channel's kernel row (16 -> 32 forward: 6.1 -> 8.8), and in 1 x 1 convolutions at
batch 1, whose input is the GEMM's matrix already (16 -> 96: 0.16 -> 0.18): those keep
DIRECT_CHANNELS. A stride-1 convolution's input gradient is a forward pass (conv.py),
so one of at most 16 output channels runs direct too. A strided one's runs by col2im
rather than space-to-depth, which is only taken where the forward pass is not direct
(conv.py's ``_space_to_depth``): as fast or faster, measured (forward and input
gradient, 16 -> 16 stride 2: 0.61 against 0.64 ms at batch 1, 10.8 against 11.6 at
batch 32).
"""

import numpy as np

from lamina.backends import jit, threads
from lamina.backends.jit import jitable

from .. import gemm
from .. import vectors as v
from .filter_cache import prepared
from .layout import NHWC

DIRECT_CHANNELS = 4  # input channels up to which convolutions run direct
# and channels-last ones of kernels wider than 1 x 1, by pass (Note [Up to 16])
DIRECT_CHANNELS_LAST = {"forward": 16, "weight": 8}
PIXELS = 4  # output pixels a step (Note [Direct convolution of few channels])


def applies(geo, layout, mode="forward"):
    """Whether the ``mode`` pass ("forward", or "weight": the weight gradient) of conv2d
    of ``geo`` on images in ``layout`` runs direct (Note [Direct convolution of few
    channels]): one group of few input channels (Note [Up to 16]), kernel columns
    adjacent."""
    wide = layout == NHWC and geo.kh * geo.kw > 1
    few = DIRECT_CHANNELS_LAST[mode] if wide else DIRECT_CHANNELS
    return geo.groups == 1 and 0 < geo.c <= few and geo.dw == 1


@jitable(**jit.CALLEE, inline="always")
def _put(out, at, acc, count):
    """out[at : at + count] = acc's first ``count`` lanes (all of them when it has
    fewer)."""
    if count >= v.lanes(out):
        v.store(out, at, acc)
    else:
        v.store_first(out, at, acc, count)


@jitable(**jit.CALLEE, inline="always")
def _segment(base, i, taps, ow, pixels, zero):
    """Where segment i's taps start for a step's four pixels from output column ow
    (the row's first pixel's taps from ``base``): ``step`` after one another, at
    ``zero`` (a run of zeros) for the pixels past the row's end."""
    _, kh, plane, height, _, step = taps
    q = base + (i // kh) * plane + (i % kh) * height + ow * step
    q1 = q + step if pixels > 1 else zero
    q2 = q + 2 * step if pixels > 2 else zero
    q3 = q + 3 * step if pixels > 3 else zero
    return q, q1, q2, q3


@jitable(**jit.CALLEE, inline="always")
def _splats(xp, starts, t):
    """Tap t of the four pixels whose segment starts at ``starts``, each broadcast
    to a vector."""
    q0, q1, q2, q3 = starts
    return v.splat(xp, q0 + t), v.splat(xp, q1 + t), v.splat(xp, q2 + t), v.splat(xp, q3 + t)


@jitable(**jit.CALLEE)
def row(xp, w, bias, base, taps, wo, cout, dst, at):
    """One output row, channels last ((wo, C_out) from dst's element at) = the
    convolution of the padded images xp with w (a row per tap, C_out rounded up to
    whole vectors), starting from bias (as long): the row's first pixel's taps are
    xp[base + segment offset + t], t < run, for each segment (kernel row, or kernel
    row of one channel) in taps = (segments, kh, plane, height, run, step)."""
    segments, run = taps[0], taps[4]
    lanes = v.lanes(w)
    most = 4 if v.registers() >= 32 else 2  # vectors of channels a pass: Note [Registers]
    padded = w.shape[1]
    zero = xp.size - xp.size // xp.shape[0]  # the last image's: zeros
    for cb in range(0, padded, most * lanes):
        vectors = min(most, (padded - cb) // lanes)
        s0 = v.load(bias, cb)
        s1 = v.load(bias, cb + lanes) if vectors > 1 else s0
        s2 = v.load(bias, cb + 2 * lanes) if vectors > 2 else s0
        s3 = v.load(bias, cb + 3 * lanes) if vectors > 3 else s0
        for ow in range(0, wo, PIXELS):
            pixels = min(PIXELS, wo - ow)  # the row's last step may have fewer
            a0, a1, a2, a3 = s0, s0, s0, s0
            b0, b1, b2, b3 = s1, s1, s1, s1
            c0, c1, c2, c3 = s2, s2, s2, s2
            d0, d1, d2, d3 = s3, s3, s3, s3
            for i in range(segments):
                starts = _segment(base, i, taps, ow, pixels, zero)
                first = i * run * padded + cb
                for t in range(run):
                    x0, x1, x2, x3 = _splats(xp, starts, t)
                    k = first + t * padded
                    w0 = v.load(w, k)
                    a0, a1 = v.multiply_add(x0, w0, a0), v.multiply_add(x1, w0, a1)
                    a2, a3 = v.multiply_add(x2, w0, a2), v.multiply_add(x3, w0, a3)
                    if vectors > 1:
                        w1 = v.load(w, k + lanes)
                        b0, b1 = v.multiply_add(x0, w1, b0), v.multiply_add(x1, w1, b1)
                        b2, b3 = v.multiply_add(x2, w1, b2), v.multiply_add(x3, w1, b3)
                    if vectors > 2:
                        w2 = v.load(w, k + 2 * lanes)
                        c0, c1 = v.multiply_add(x0, w2, c0), v.multiply_add(x1, w2, c1)
                        c2, c3 = v.multiply_add(x2, w2, c2), v.multiply_add(x3, w2, c3)
                    if vectors > 3:
                        w3 = v.load(w, k + 3 * lanes)
                        d0, d1 = v.multiply_add(x0, w3, d0), v.multiply_add(x1, w3, d1)
                        d2, d3 = v.multiply_add(x2, w3, d2), v.multiply_add(x3, w3, d3)
            o = at + ow * cout + cb
            for p, (a, b, c, d) in enumerate(
                ((a0, b0, c0, d0), (a1, b1, c1, d1), (a2, b2, c2, d2), (a3, b3, c3, d3))
            ):
                if p < pixels:
                    _put(dst, o + p * cout, a, cout - cb)
                    if vectors > 1:
                        _put(dst, o + p * cout + lanes, b, cout - cb - lanes)
                    if vectors > 2:
                        _put(dst, o + p * cout + 2 * lanes, c, cout - cb - 2 * lanes)
                    if vectors > 3:
                        _put(dst, o + p * cout + 3 * lanes, d, cout - cb - 3 * lanes)


def in_parts(xp, w, bias, out, rows, taps, rise, ho, wo, cout, channels_last):
    """``row`` over the batch's output rows in parts, in parallel: into out itself
    where it is channels last, else into rows[p], then transposed into out. An output
    row's taps start ``rise`` elements of xp after the row above's."""
    parts, total = rows.shape[0], out.shape[0] * ho
    image = xp.size // xp.shape[0]
    for p in jit.prange(parts):
        r0, r1 = jit.part(total, parts, p)
        for r in range(r0, r1):
            n, oh = r // ho, r % ho
            base = n * image + oh * rise
            if channels_last:
                row(xp, w, bias, base, taps, wo, cout, out, r * wo * cout)
                continue
            made = rows[p]
            row(xp, w, bias, base, taps, wo, cout, made, 0)
            for c in range(cout):
                for ow in range(wo):
                    out[n, c, oh, ow] = made[ow * cout + c]


def forward(x, w, bias, geo, layout, out):
    """out (C-contiguous images in ``layout``) = the convolution of the images x (in
    ``layout``) with w, plus bias (None: none), in parts on lamina's threads."""
    if not out.size:
        return
    lanes = v.lanes_of(x.dtype)
    padded = -(-geo.c_out // lanes) * lanes
    start = np.full(padded, -0.0, x.dtype)  # no bias: negative zeros (Note [Fused epilogues])
    if bias is not None:
        start[: geo.c_out] = bias
    weight = prepared(w, ("direct", layout, padded), lambda w: _weight(w, layout, padded))
    parts = threads.parts_for(geo.flops // 2, geo.n * geo.ho)
    rows = np.empty((parts, 0 if layout == NHWC else geo.wo * geo.c_out), x.dtype)
    xp = _padded(x, geo, layout)
    kernel = _kernel(in_parts, x.dtype, parts > 1)
    kernel(xp, weight, start, out, rows, *_taps(geo, layout), *_sizes(geo, layout))


def _sizes(geo, layout):
    """The kernels' last arguments: the output's height, width and channels, and
    whether its images are channels last."""
    return geo.ho, geo.wo, geo.c_out, int(layout == NHWC)


def _extent(geo):
    """The padded image's rows and columns that some output pixel's taps reach."""
    return (geo.ho - 1) * geo.sh + (geo.kh - 1) * geo.dh + 1, (geo.wo - 1) * geo.sw + geo.kw


def _taps(geo, layout):
    """``row``'s taps in the padded images of ``layout`` -- (segments, kh, plane,
    height, run, step): channels last a segment per kernel row (kW C_in values),
    channels first one per kernel row of each channel (kW) -- and how far an output
    row's taps start after the row above's."""
    hp, wp = _extent(geo)
    unit = geo.c if layout == NHWC else 1  # a pixel's values in an image row
    segments, plane = (geo.kh, 0) if layout == NHWC else (geo.c * geo.kh, hp * wp)
    # a stride or dilation only steps where there is a next pixel, row or kernel row
    # (one of 2**63 - 1 would overflow the kernel's int64 where there is not)
    step = geo.sw * unit if geo.wo > 1 else 0
    height = geo.dh * wp * unit if geo.kh > 1 else 0
    taps = (segments, geo.kh, plane, height, geo.kw * unit, step)
    return taps, geo.sh * wp * unit if geo.ho > 1 else 0


@jitable(**jit.CALLEE)
def weight_row(xp, grads, sums, base, taps, wo):
    """sums (a row per tap, C_out rounded up to whole vectors) += one output row's
    pixels' taps (as ``row`` reads them) times their gradients, grads (wo + PIXELS - 1
    rows of sums' width, zeros past the row's pixels and C_out): four pixels a step,
    their gradient vectors in registers through the taps, each tap's row of sums
    loaded and stored once for the four."""
    segments, run = taps[0], taps[4]
    lanes = v.lanes(sums)
    padded = sums.shape[1]
    zero = xp.size - xp.size // xp.shape[0]
    for cb in range(0, padded, 4 * lanes):
        vectors = min(4, (padded - cb) // lanes)
        for ow in range(0, wo, PIXELS):
            pixels = min(PIXELS, wo - ow)
            g = ow * padded + cb
            # gradient vector j of pixel k: g<k><j> (channels cb + j lanes onwards)
            g00, g10 = v.load(grads, g), v.load(grads, g + padded)
            g20, g30 = v.load(grads, g + 2 * padded), v.load(grads, g + 3 * padded)
            g01, g11, g21, g31 = g00, g10, g20, g30
            g02, g12, g22, g32 = g00, g10, g20, g30
            g03, g13, g23, g33 = g00, g10, g20, g30
            if vectors > 1:
                g01, g11 = v.load(grads, g + lanes), v.load(grads, g + padded + lanes)
                g21, g31 = (
                    v.load(grads, g + 2 * padded + lanes),
                    v.load(grads, g + 3 * padded + lanes),
                )
            if vectors > 2:
                h = g + 2 * lanes
                g02, g12 = v.load(grads, h), v.load(grads, h + padded)
                g22, g32 = v.load(grads, h + 2 * padded), v.load(grads, h + 3 * padded)
            if vectors > 3:
                h = g + 3 * lanes
                g03, g13 = v.load(grads, h), v.load(grads, h + padded)
                g23, g33 = v.load(grads, h + 2 * padded), v.load(grads, h + 3 * padded)
            for i in range(segments):
                starts = _segment(base, i, taps, ow, pixels, zero)
                first = i * run * padded + cb
                for t in range(run):
                    x0, x1, x2, x3 = _splats(xp, starts, t)
                    k = first + t * padded
                    s0 = v.multiply_add(x0, g00, v.load(sums, k))
                    s0 = v.multiply_add(x1, g10, s0)
                    s0 = v.multiply_add(x2, g20, s0)
                    v.store(sums, k, v.multiply_add(x3, g30, s0))
                    if vectors > 1:
                        s1 = v.multiply_add(x0, g01, v.load(sums, k + lanes))
                        s1 = v.multiply_add(x1, g11, s1)
                        s1 = v.multiply_add(x2, g21, s1)
                        v.store(sums, k + lanes, v.multiply_add(x3, g31, s1))
                    if vectors > 2:
                        s2 = v.multiply_add(x0, g02, v.load(sums, k + 2 * lanes))
                        s2 = v.multiply_add(x1, g12, s2)
                        s2 = v.multiply_add(x2, g22, s2)
                        v.store(sums, k + 2 * lanes, v.multiply_add(x3, g32, s2))
                    if vectors > 3:
                        s3 = v.multiply_add(x0, g03, v.load(sums, k + 3 * lanes))
                        s3 = v.multiply_add(x1, g13, s3)
                        s3 = v.multiply_add(x2, g23, s3)
                        v.store(sums, k + 3 * lanes, v.multiply_add(x3, g33, s3))


def weight_parts(xp, grad, sums, rows, taps, rise, ho, wo, cout, channels_last):
    """``weight_row`` over the batch's output rows in parts, in parallel, part p into
    sums[p], each row's gradients (grad: images channels last or first) copied into
    rows[p] first."""
    parts, total = sums.shape[0], grad.shape[0] * ho
    image, padded = xp.size // xp.shape[0], sums.shape[2]
    for p in jit.prange(parts):
        r0, r1 = jit.part(total, parts, p)
        grads = rows[p]
        for r in range(r0, r1):
            n, oh = r // ho, r % ho
            if channels_last:
                for ow in range(wo):
                    for c in range(cout):
                        grads[ow * padded + c] = grad[n, oh, ow, c]
            else:
                for c in range(cout):
                    for ow in range(wo):
                        grads[ow * padded + c] = grad[n, c, oh, ow]

            weight_row(xp, grads, sums[p], n * image + oh * rise, taps, wo)


def weight_grad(x, grad, geo, layout):
    """The weight gradient (C_out, C_in, kH, kW) of the convolution of the images x
    with gradient ``grad`` (both C-contiguous in ``layout``), in parts on lamina's
    threads, each into sums of its own, added at the end."""
    lanes = v.lanes_of(x.dtype)
    padded = -(-geo.c_out // lanes) * lanes
    parts = threads.parts_for(geo.flops // 2, geo.n * geo.ho)
    sums = np.zeros((parts, geo.c * geo.kh * geo.kw, padded), x.dtype)
    rows = np.zeros((parts, (geo.wo + PIXELS - 1) * padded), x.dtype)
    if geo.n * geo.ho * geo.wo:
        kernel = _kernel(weight_parts, x.dtype, parts > 1)
        grad = np.ascontiguousarray(grad)
        kernel(_padded(x, geo, layout), grad, sums, rows, *_taps(geo, layout), *_sizes(geo, layout))
    total = gemm.parts_total(sums)[:, : geo.c_out]
    if layout == NHWC:
        return np.ascontiguousarray(total.reshape(geo.kh, geo.kw, geo.c, -1).transpose(3, 2, 0, 1))
    return np.ascontiguousarray(total.reshape(geo.c, geo.kh, geo.kw, -1).transpose(3, 0, 1, 2))


def _weight(w, layout, padded):
    """(C_out, C_in, kH, kW) -> a row per tap in ``row``'s order of taps, (kH, kW, C_in)
    channels last, (C_in, kH, kW) first, of C_out padded with zeros to ``padded``."""
    c_out = w.shape[0]
    rows = np.zeros((w[0].size, padded), w.dtype)
    order = (2, 3, 1, 0) if layout == NHWC else (1, 2, 3, 0)
    rows[:, :c_out] = w.transpose(order).reshape(-1, c_out)
    return rows


def _padded(x, geo, layout):
    """The images x (C-contiguous in ``layout``) with the padding each output pixel's
    taps reach as zeros (and none of the rows and columns no tap reaches), and one
    more image of zeros, where the taps of the pixels past a row's end are read."""
    hp, wp = _extent(geo)
    h, w = max(0, min(geo.h, hp - geo.pt)), max(0, min(geo.w, wp - geo.pl))
    rows, cols = slice(geo.pt, geo.pt + h), slice(geo.pl, geo.pl + w)
    if layout == NHWC:
        xp = np.zeros((geo.n + 1, hp, wp, geo.c), x.dtype)
        xp[:-1, rows, cols] = x[:, :h, :w]
    else:
        xp = np.zeros((geo.n + 1, geo.c, hp, wp), x.dtype)
        xp[:-1, :, rows, cols] = x[:, :, :h, :w]
    return xp


_SIGNATURES = {  # (arrays: 1-D, 2-D, 3-D, 4-D), the taps' tuple, the ints after it
    in_parts: lambda a1, a2, a3, a4, taps, i: (a4, a2, a1, a4, a2, taps, *[i] * 5),
    weight_parts: lambda a1, a2, a3, a4, taps, i: (a4, a4, a3, a2, taps, *[i] * 5),
}


def _kernel(kernel, dtype, parallel):
    def build():
        t, i64 = jit.types, jit.types.int64
        arrays = (jit.array(dtype, d) for d in (1, 2, 3, 4))
        signature = t.void(*_SIGNATURES[kernel](*arrays, t.UniTuple(i64, 6), i64))
        return jit.compile_kernel(kernel, signature, parallel, nogil=True)

    return jit.cached((kernel, np.dtype(dtype), parallel), build)
