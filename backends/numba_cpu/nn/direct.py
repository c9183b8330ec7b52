"""The forward pass of convolutions on few input channels (a network's first layer on
RGB images) by a direct loop over the kernel's taps.

Note [Direct convolution of few channels]: with C_in <= DIRECT_CHANNELS, im2col's
matrix is a row of kH kW C_in values per output pixel built from almost nothing (the
image is 3 channels, the matrix 49 times its size for a 7 x 7 kernel), then a GEMM
of inner dimension 27-363. The copy costs as much as the product: ResNet-18's 7 x 7
stride-2 stem took 8.6 ms at batch 32 (PyTorch channels-last, a direct convolution:
5.9). Here each output row is summed in registers, in explicit vectors of output
channels (Note [Explicit vectors] in vectors.py): PIXELS = 4 neighbouring output
pixels a step, two vectors of output channels each, so that each weight vector loaded
serves four pixels and each input value (one broadcast) two vectors. In channels-last
images a kernel row's taps are one contiguous run of kW C_in input values (Note
[Kernel rows as runs] in conv.py), so a pixel's taps are kH runs, read in the order
of the weight's rows (kH, kW, C_in). The images are copied zero-padded first (a few
channels: a small copy), so every pixel has all its taps, and an infinite weight
meets the padding's zeros as im2col's matrix does (NaN, numpy_ref's result).

Measured at batch 32, 64 x 64 images, one thread, Zen 4, float32: ResNet-18's stem (3
-> 64, 7 x 7 stride 2) 10.5 -> 5.6 ms, Inception's (3 -> 32) 5.6 -> 2.7, MobileNet
v2's (3 -> 32, 3 x 3 stride 2) 1.6 -> 0.5 (PyTorch channels-last 5.9, 3.0, 0.63):
110-114 GFLOP/s, where OpenBLAS's GEMM alone reached 95.
"""

import numpy as np

from lamina.backends import jit, threads
from lamina.backends.jit import jitable

from .. import vectors as v
from . import winograd
from .layout import NHWC

DIRECT_CHANNELS = 4  # input channels up to which the forward pass runs direct
PIXELS = 4  # output pixels a step (Note [Direct convolution of few channels])


def applies(geo):
    """Whether conv2d of ``geo``'s forward pass runs direct (Note [Direct convolution
    of few channels]): one group of few input channels, kernel columns adjacent."""
    return geo.groups == 1 and 0 < geo.c <= DIRECT_CHANNELS and geo.dw == 1


@jitable(**jit.CALLEE, inline="always")
def _put(out, at, acc, count):
    """out[at : at + count] = acc's first ``count`` lanes (all of them when it has
    fewer)."""
    if count >= v.lanes(out):
        v.store(out, at, acc)
    else:
        v.store_first(out, at, acc, count)


@jitable(**jit.CALLEE)
def row(xp, w, bias, base, taps, wo, cout, dst, at):
    """One output row, channels last ((wo, C_out) from dst's element at) = the
    convolution of the padded images xp with w (a row per tap, C_out rounded up to
    whole vectors), starting from bias (as long): the row's first pixel's taps are
    xp[base + segment offset + t], t < run, for each segment (kernel row, or kernel
    row of one channel) in taps = (segments, kh, plane, height, run, step)."""
    segments, kh, plane, height, run, step = taps
    lanes = v.lanes(w)
    padded = w.shape[1]
    for cb in range(0, padded, 4 * lanes):
        vectors = min(4, (padded - cb) // lanes)
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
                q = base + (i // kh) * plane + (i % kh) * height + ow * step
                first = i * run * padded + cb
                # a missing pixel reads its row's first one's taps, summed in vain
                q1 = q + step if pixels > 1 else q
                q2 = q + 2 * step if pixels > 2 else q
                q3 = q + 3 * step if pixels > 3 else q
                for t in range(run):
                    x0, x1 = v.splat(xp, q + t), v.splat(xp, q1 + t)
                    x2, x3 = v.splat(xp, q2 + t), v.splat(xp, q3 + t)
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


def in_parts(xp, w, bias, out, rows, taps, rise, ho, wo, cout):
    """``row`` over the batch's output rows in parts, in parallel, one part per row of
    ``rows`` (parts, wo C_out): a channels-first out's row is made there, then
    transposed into out; a channels-last one's in out itself. An output row's taps
    start ``rise`` elements of xp after the row above's."""
    parts, total = rows.shape[0], out.shape[0] * ho
    image = xp.size // xp.shape[0]
    for p in jit.prange(parts):
        r0, r1 = jit.part(total, parts, p)
        for r in range(r0, r1):
            n, oh = r // ho, r % ho
            base = n * image + oh * rise
            if rows.shape[1] == 0:  # channels last
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
    weight = winograd.prepared(w, ("direct", layout, padded), lambda w: _weight(w, layout, padded))
    parts = threads.parts_for(geo.flops // 2, geo.n * geo.ho)
    rows = np.empty((parts, 0 if layout == NHWC else geo.wo * geo.c_out), x.dtype)
    xp = _padded(x, geo, layout)
    _kernel(x.dtype, parts > 1)(xp, weight, start, out, rows, *_taps(geo, layout), geo.ho,
                                geo.wo, geo.c_out)  # fmt: skip


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
    taps = (segments, geo.kh, plane, geo.dh * wp * unit, geo.kw * unit, geo.sw * unit)
    return taps, geo.sh * wp * unit


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
    taps reach as zeros (and none of the rows and columns no tap reaches)."""
    hp, wp = _extent(geo)
    h, w = max(0, min(geo.h, hp - geo.pt)), max(0, min(geo.w, wp - geo.pl))
    rows, cols = slice(geo.pt, geo.pt + h), slice(geo.pl, geo.pl + w)
    if layout == NHWC:
        xp = np.zeros((geo.n, hp, wp, geo.c), x.dtype)
        xp[:, rows, cols] = x[:, :h, :w]
    else:
        xp = np.zeros((geo.n, geo.c, hp, wp), x.dtype)
        xp[:, :, rows, cols] = x[:, :, :h, :w]
    return xp


def _kernel(dtype, parallel):
    def build():
        t, i64 = jit.types, jit.types.int64
        a1, a2, a4 = (jit.array(dtype, d) for d in (1, 2, 4))
        signature = t.void(a4, a2, a1, a4, a2, t.UniTuple(i64, 6), *[i64] * 4)
        return jit.compile_kernel(in_parts, signature, parallel, nogil=True)

    return jit.cached((in_parts, np.dtype(dtype), parallel), build)
