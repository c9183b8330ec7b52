"""Stride-1 convolutions by Winograd's minimal filtering: F(4x4, 3x3), F(3x3, 4x4) and
F(2x2, 5x5) (Note [Winograd family]).

Note [Winograd]: a 4x4 tile of a 3x3 convolution's output is A^T [(G g G^T) * (B^T d B)] A
(Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2015), where d is
the 6x6 input tile under it, g the 3x3 kernel and * the elementwise product of 6x6
matrices. Summed over input channels, each of the 36 elementwise positions is one GEMM,
(tiles x C_in) @ (C_in x C_out): 36 multiplications per output tile and channel pair
where the direct convolution (and im2col) does 16 x 9 = 144, so the GEMMs do a quarter
of the work. The transforms B^T d B and A^T m A are additions and multiplications by
small constants, vectorized over the channels (contiguous in a "slab" of input rows
both layouts are copied into: NCHW rows are transposed on the way).

Measured on 16x64x56x56 float32, 64 -> 64 channels, padding 1, one thread: the blocked
im2col + GEMM path takes ~42-46 ms; this one ~13.5 ms channels-last (GEMMs ~8.4 ms at
~110 GFLOP/s, input transform ~2.3, output ~1.5) and ~18 ms NCHW (the rows transposed
into the slab and out of it); PyTorch's oneDNN 32-35 ms.

Rounding: the transforms' constants (up to 8 and 1/24) make the error grow with the
channel count: float32 results differ from the direct sum by ~1e-6 of the output's
largest magnitude on this shape (the im2col GEMM by ~1e-7); float64 by ~1e-15.
``LAMINA_WINOGRAD=0`` turns the algorithm off.

Note [Winograd and infinities]: the transforms mix a tile's values, so one infinity or
NaN in the input would make the whole tile's 16 outputs NaN where the direct sum keeps
the others finite. The kernels return the sum of the values they wrote (non-finite if
any was, or if an intermediate overflowed), and a convolution that meets one is
computed again by im2col.

The backward operators reuse the transforms: the input gradient of a stride-1 3x3
convolution is a stride-1 3x3 convolution (Note [Convolution]), and the weight gradient
is the adjoint of the filter transform applied to sum over tiles of
(B^T d B) * (A grad A^T): the input's transform, the output gradient's (4x4 -> 6x6 by
A) and, per position, one GEMM (C_in x tiles) @ (tiles x C_out).

A block is a range of tile rows of the batch (row r: image r // th, tile row r % th),
sized so its transformed input and products stay in the L2 cache (BLOCK_BYTES); a tile
t of it is r's tile column tx at (r - r0) * tw + tx.
"""

import math
import os

import numpy as np

from lamina.backends import jit

from .. import blas
from .layout import NCHW, NHWC

ENABLED = os.environ.get("LAMINA_WINOGRAD", "1") != "0"
MIN_CHANNELS = 8  # below this the GEMMs are too thin to pay for the transforms
MIN_SIZE = 4  # a narrower output wastes most of a tile (a tile is 2 to 4 wide)
BLOCK_BYTES = 1 << 20  # transformed input + products of one block (the L2 cache)

# Note [Winograd family]: F(m x m, r x r) for m + r = 7 all interpolate at the points
# 0, 1, -1, 2, -2 and infinity and share the 6x6 input transform B^T (``input_6``); the
# filter transform G (6 x r) and the output transform A^T (m x 6) are the rows of
# powers of those points (with the scale factors F(4, 3)'s G puts on them). So one set
# of kernels runs F(4x4, 3x3), F(3x3, 4x4) and F(2x2, 5x5): a 3x3, 4x4 or 5x5 kernel,
# 36 multiplications per output tile of 16, 9 or 4 outputs (direct: 9, 16, 25 each).
POINTS, SCALES = (0, 1, -1, 2, -2), (1 / 4, -1 / 6, -1 / 6, 1 / 24, 1 / 24)


def _filter_transform(r):
    """G (6 x r): row j is SCALES[j] times the powers of POINTS[j]; the last, infinity's,
    picks the kernel's last tap."""
    g = np.zeros((6, r))
    for j, (p, scale) in enumerate(zip(POINTS, SCALES)):
        g[j] = [scale * p**k for k in range(r)]
    g[5, r - 1] = 1
    return g


# Note [Winograd constants]: the transforms multiply by 2, 4 and 8 as additions
# (exact, like the multiplications), because a Python number times a float32 makes a
# float64 in Numba and the kernels would compute in double precision.


@jit.jitable
def twice(a):
    return a + a


@jit.jitable
def input_6(d0, d1, d2, d3, d4, d5):
    """B^T d for one column of six values (Note [Winograd constants])."""
    return (
        twice(twice(d0 - d2)) - d2 + d4,
        d3 + d4 - twice(twice(d1 + d2)),
        twice(twice(d1 - d2)) - d3 + d4,
        twice(d3 - d1) - d2 + d4,
        twice(d1 - d3) - d2 + d4,
        twice(twice(d1 - d3)) - d3 + d5,
    )


@jit.jitable
def output_4(m0, m1, m2, m3, m4, m5):
    """A^T m of F(4, 3): six products to four outputs (rows 1, p, p^2, p^3 + infinity)."""
    a, b, c, d = m1 + m2, m1 - m2, m3 + m4, m3 - m4
    return (m0 + a + c, b + twice(d), a + twice(twice(c)), b + twice(twice(twice(d))) + m5)


@jit.jitable
def output_3(m0, m1, m2, m3, m4, m5):
    """A^T m of F(3, 4), as ``output_4``, padded to four values."""
    a, b, c, d = m1 + m2, m1 - m2, m3 + m4, m3 - m4
    return (m0 + a + c, b + twice(d), a + twice(twice(c)) + m5, m5)


@jit.jitable
def output_2(m0, m1, m2, m3, m4, m5):
    """A^T m of F(2, 5), padded to four values."""
    a, b, c, d = m1 + m2, m1 - m2, m3 + m4, m3 - m4
    return (m0 + a + c, b + twice(d) + m5, m5, m5)


@jit.jitable
def grad_4(e0, e1, e2, e3):
    """A e of F(4, 3): four output gradients to six (the adjoint of ``output_4``)."""
    a, b = e0 + e2, e1 + e3
    c, d = e0 + twice(twice(e2)), twice(e1 + twice(twice(e3)))
    return (e0, a + b, a - b, c + d, c - d, e3)


@jit.jitable
def grad_3(e0, e1, e2, e3):
    """A e of F(3, 4) (e3 unused)."""
    c = e0 + twice(twice(e2))
    return (e0, e0 + e1 + e2, e0 - e1 + e2, c + twice(e1), c - twice(e1), e2)


@jit.jitable
def grad_2(e0, e1, e2, e3):
    """A e of F(2, 5) (e2, e3 unused)."""
    return (e0, e0 + e1, e0 - e1, e0 + twice(e1), e0 - twice(e1), e1)


class Algorithm:
    """F(m x m, r x r) of Note [Winograd family]: its transforms and tile size."""

    def __init__(self, r, output, grad):
        self.r, self.m = r, 7 - r
        self.output, self.grad = output, grad
        g = _filter_transform(r)
        self.gg = np.kron(g, g)  # (36, r^2): vec(G k G^T) = gg vec(k), row-major


ALGORITHMS = {
    r: Algorithm(r, *fns)
    for r, fns in ((3, (output_4, grad_4)), (4, (output_3, grad_3)), (5, (output_2, grad_2)))
}


# ---------------------------------------------------------------- kernels
# Note [Whole-array indexing]: the loops index the whole arrays (slab[i, j, c]), never
# views made inside them (d = slab[i, j : j + 6]; d[q, c]): with views LLVM did not
# vectorize the channel loops (measured: the input transform's first pass 4.4 -> 0.65 ms).


@jit.jitable
def fetch_nhwc(x, n, row, slab, i, start, count):
    """slab[i, start : start + count] = columns [0, count) of row ``row`` of NHWC image
    n, as (W, C)."""
    for j in range(count):
        for c in range(slab.shape[2]):
            slab[i, start + j, c] = x[n, row, j, c]


@jit.jitable
def fetch_nchw(x, n, row, slab, i, start, count):
    """The same of an NCHW image: transposed on the way."""
    for c in range(slab.shape[2]):
        for j in range(count):
            slab[i, start + j, c] = x[n, c, row, j]


@jit.jitable
def store_nhwc(rows, i, wo, out, n, row):
    """Output row ``row`` of NHWC image n = rows[i, :wo] (Wo, K)."""
    for w in range(wo):
        for k in range(rows.shape[2]):
            out[n, row, w, k] = rows[i, w, k]


@jit.jitable
def store_nchw(rows, i, wo, out, n, row):
    """Output row ``row`` of NCHW image n = rows[i, :wo] transposed."""
    for k in range(rows.shape[2]):
        for w in range(wo):
            out[n, k, row, w] = rows[i, w, k]


def transform_input(fetch, m):
    """The kernel writing V (36, T, C) = B^T d B of every 6x6 input tile (m apart) of
    tile rows [r0, r1), the rows copied into ``slab`` (6, m tw + 6 - m, C) by ``fetch``;
    the slab arrives zeroed: its columns outside the input stay zero. Returns the sum of
    V (Note [Winograd and infinities])."""

    def kernel(x, h, w, pt, pl, r0, r1, th, slab, tmp, V):
        tw, channels = (slab.shape[1] - 6 + m) // m, slab.shape[2]
        inside, total = min(w, slab.shape[1] - pl), np.zeros(1, tmp.dtype)[0]
        for r in range(r0, r1):
            n, ty = r // th, r % th
            first = 0
            if r > r0 and ty > 0:  # the last 6 - m rows of tile row ty - 1 are its first
                for i in range(6 - m):
                    for j in range(slab.shape[1]):
                        for c in range(channels):
                            slab[i, j, c] = slab[i + m, j, c]
                first = 6 - m
            for i in range(first, 6):
                row = m * ty - pt + i
                if 0 <= row < h:
                    fetch(x, n, row, slab, i, pl, inside)
                else:
                    slab[i] = 0
            for tx in range(tw):
                t, j = (r - r0) * tw + tx, m * tx
                for i in range(6):
                    for c in range(channels):
                        e0, e1, e2, e3, e4, e5 = input_6(
                            slab[i, j, c], slab[i, j + 1, c], slab[i, j + 2, c],
                            slab[i, j + 3, c], slab[i, j + 4, c], slab[i, j + 5, c],
                        )  # fmt: skip
                        tmp[i, 0, c], tmp[i, 1, c], tmp[i, 2, c] = e0, e1, e2
                        tmp[i, 3, c], tmp[i, 4, c], tmp[i, 5, c] = e3, e4, e5
                for a in range(6):
                    for c in range(channels):
                        v0, v1, v2, v3, v4, v5 = input_6(
                            tmp[0, a, c], tmp[1, a, c], tmp[2, a, c],
                            tmp[3, a, c], tmp[4, a, c], tmp[5, a, c],
                        )  # fmt: skip
                        V[a, t, c], V[6 + a, t, c], V[12 + a, t, c] = v0, v1, v2
                        V[18 + a, t, c], V[24 + a, t, c], V[30 + a, t, c] = v3, v4, v5
                        total += v0 + v1 + v2 + v3 + v4 + v5
        return total

    return kernel


def transform_output(store, m, output):
    """The kernel writing the output rows of tile rows [r0, r1) from M (36, T, K):
    A^T p A + bias per tile (``output``: A^T of six values, padded to four), through
    ``rows`` (m, m tw, K). Returns the outputs' sum."""

    def kernel(M, ho, wo, r0, r1, th, bias, tmp, rows, out):
        tw, channels, total = rows.shape[1] // m, rows.shape[2], np.zeros(1, tmp.dtype)[0]
        for r in range(r0, r1):
            n, ty = r // th, r % th
            for tx in range(tw):
                t, j = (r - r0) * tw + tx, m * tx
                for a in range(6):
                    for k in range(channels):
                        s0, s1, s2, s3 = output(
                            M[a, t, k], M[6 + a, t, k], M[12 + a, t, k],
                            M[18 + a, t, k], M[24 + a, t, k], M[30 + a, t, k],
                        )  # fmt: skip
                        tmp[0, a, k], tmp[1, a, k], tmp[2, a, k], tmp[3, a, k] = s0, s1, s2, s3
                for i in range(m):
                    for k in range(channels):
                        y0, y1, y2, y3 = output(
                            tmp[i, 0, k], tmp[i, 1, k], tmp[i, 2, k],
                            tmp[i, 3, k], tmp[i, 4, k], tmp[i, 5, k],
                        )  # fmt: skip
                        b = bias[k]
                        rows[i, j, k], rows[i, j + 1, k] = y0 + b, y1 + b
                        total += y0 + y1
                        if m > 2:
                            rows[i, j + 2, k] = y2 + b
                            total += y2
                        if m > 3:
                            rows[i, j + 3, k] = y3 + b
                            total += y3
            for i in range(min(m, ho - m * ty)):
                store(rows, i, wo, out, n, m * ty + i)
        return total

    return kernel


def transform_grad(fetch, m, grad):
    """The kernel writing Z (36, T, K) = A e A^T of every m x m output-gradient tile of
    tile rows [r0, r1) (``grad``: A e of four values, the ones past m unused), through
    ``slab`` (4, m tw + 4 - m, K) as ``transform_input`` (its columns past Wo stay
    zero). Returns the sum of Z."""

    def kernel(g, ho, wo, r0, r1, th, slab, tmp, Z):
        tw, channels = (slab.shape[1] - 4 + m) // m, slab.shape[2]
        total = np.zeros(1, tmp.dtype)[0]
        for r in range(r0, r1):
            n, ty = r // th, r % th
            for i in range(m):
                row = m * ty + i
                if row < ho:
                    fetch(g, n, row, slab, i, 0, wo)
                else:
                    slab[i] = 0
            for tx in range(tw):
                t, j = (r - r0) * tw + tx, m * tx
                for i in range(m):
                    for k in range(channels):
                        f0, f1, f2, f3, f4, f5 = grad(
                            slab[i, j, k], slab[i, j + 1, k], slab[i, j + 2, k], slab[i, j + 3, k]
                        )
                        tmp[i, 0, k], tmp[i, 1, k], tmp[i, 2, k] = f0, f1, f2
                        tmp[i, 3, k], tmp[i, 4, k], tmp[i, 5, k] = f3, f4, f5
                for a in range(6):
                    for k in range(channels):
                        z0, z1, z2, z3, z4, z5 = grad(
                            tmp[0, a, k], tmp[1, a, k], tmp[2, a, k], tmp[3, a, k]
                        )
                        Z[a, t, k], Z[6 + a, t, k], Z[12 + a, t, k] = z0, z1, z2
                        Z[18 + a, t, k], Z[24 + a, t, k], Z[30 + a, t, k] = z3, z4, z5
                        total += z0 + z1 + z2 + z3 + z4 + z5
        return total

    return kernel


@jit.jitable
def block(r0, rows, rows_per_block, tw, in_buf, out_buf, channels):
    """The block of tile rows from r0 of a block loop: (its end r1, the (36, T, C_in)
    and (36, T, C_out) views of in_buf and out_buf for its T tiles), ``channels``
    being (C_in, C_out)."""
    r1 = min(rows, r0 + rows_per_block)
    t = (r1 - r0) * tw
    cin, cout = channels
    return (
        r1,
        in_buf[: 36 * t * cin].reshape(36, t, cin),
        out_buf[: 36 * t * cout].reshape(36, t, cout),
    )


def forward_blocks(transform, finish):
    """The block loop of ``forward``: each block's input tiles transformed (``transform``,
    a ``transform_input`` function), multiplied by the filters u position by position,
    and transformed into the output (``finish``, a ``transform_output`` function). One
    kernel where it can call the BLAS, else Python calling the transforms' kernels (Note
    [GEMM in kernels]). False if a value on the way was not finite."""

    def run(x, u, bias, h, w, pt, pl, ho, wo, th, tw, rows_per_block, buffers, out):
        slab, tmp_in, tmp_out, rows, v_buf, m_buf = buffers
        total = x.shape[0] * th
        for r0 in range(0, total, rows_per_block):
            r1, v, m = block(r0, total, rows_per_block, tw, v_buf, m_buf, u.shape[1:])
            if not math.isfinite(transform(x, h, w, pt, pl, r0, r1, th, slab, tmp_in, v)):
                return False
            blas.gemms(v, u, m, False, False, 0)
            if not math.isfinite(finish(m, ho, wo, r0, r1, th, bias, tmp_out, rows, out)):
                return False
        return True

    return run


def weight_grad_blocks(transform_x, transform_g):
    """The block loop of ``weight_grad``: total (36, C_in, C_out) += V^T Z of each
    block, position by position, V and Z the transforms of its input tiles
    (``transform_x``) and output-gradient tiles (``transform_g``); as
    ``forward_blocks``."""

    def run(x, g, h, w, pt, pl, ho, wo, th, tw, rows_per_block, buffers, total):
        slab, gslab, tmp_in, tmp_g, v_buf, z_buf = buffers
        rows = x.shape[0] * th
        for r0 in range(0, rows, rows_per_block):
            r1, v, z = block(r0, rows, rows_per_block, tw, v_buf, z_buf, total.shape[1:])
            check = transform_x(x, h, w, pt, pl, r0, r1, th, slab, tmp_in, v)
            check += transform_g(g, ho, wo, r0, r1, th, gslab, tmp_g, z)
            if not math.isfinite(check):
                return False
            blas.gemms(v, z, total, True, False, 1)
        return True

    return run


_FETCH = {NHWC: fetch_nhwc, NCHW: fetch_nchw}
_STORE = {NHWC: store_nhwc, NCHW: store_nchw}
_STEPS = {  # the transforms a block loop calls
    forward_blocks: (transform_input, transform_output),
    weight_grad_blocks: (transform_input, transform_grad),
}


def _signature(template, dtype):
    t = jit.types
    a1, a3, a4 = (jit.array(dtype, d) for d in (1, 3, 4))
    i, x = t.int64, a1.dtype
    buffers = t.Tuple((a3, a3, a3, a3, a1, a1))
    return {
        forward_blocks: t.boolean(a4, a3, a1, *[i] * 9, buffers, a4),
        weight_grad_blocks: t.boolean(a4, a4, *[i] * 9, buffers, a3),
        transform_input: x(a4, *[i] * 7, a3, a3, a3),
        transform_output: x(a3, *[i] * 5, a1, a3, a3, a4),
        transform_grad: x(a4, *[i] * 5, a3, a3, a3),
    }[template]


def _step(template, algorithm, layout):
    """Transform ``template``'s Python function for ``algorithm`` and ``layout``, made
    once and jitable: the block loops compile it into themselves, as the cache needs
    (Note [Closure cells] in backends/jit.py)."""

    def build():
        m = algorithm.m
        if template is transform_output:
            fn = template(_STORE[layout], m, algorithm.output)
        elif template is transform_grad:
            fn = template(_FETCH[layout], m, algorithm.grad)
        else:
            fn = template(_FETCH[layout], m)
        return jit.jitable(fn, fastmath=jit.REASSOCIATE, **jit.CALLEE)

    return jit.cached(("step", template, algorithm.r, layout), build)


def _transform(template, algorithm, dtype, layout):
    """Transform ``template``'s kernel for ``algorithm``, dtype and ``layout``, shared
    by both block loops run from Python."""

    def build():
        fn, sig = _step(template, algorithm, layout), _signature(template, dtype)
        return jit.compile_kernel(fn, sig, fastmath=jit.REASSOCIATE, nogil=True)

    return jit.cached((template, algorithm.r, np.dtype(dtype), layout), build)


def _kernel(template, algorithm, dtype, layout):
    """The block loop ``template`` (``forward_blocks``, ``weight_grad_blocks``) for
    ``algorithm``, dtype and images in ``layout``: one kernel, without the GIL, calling
    the transforms and the BLAS where kernels can (Note [GEMM in kernels]), else the loop
    in Python over the transforms' kernels."""
    native = blas.available()

    def build():
        if native:
            steps = [_step(t, algorithm, layout) for t in _STEPS[template]]
            return jit.compile_kernel(template(*steps), _signature(template, dtype), nogil=True)
        return template(*(_transform(t, algorithm, dtype, layout) for t in _STEPS[template]))

    return jit.cached((template, algorithm.r, np.dtype(dtype), layout, native), build)


# ---------------------------------------------------------------- the convolutions


def algorithm(geo, dtype):
    """The Winograd algorithm conv2d of geometry ``geo`` runs by (Note [Winograd
    family]), or None."""
    alg = ALGORITHMS.get(geo.kh) if ENABLED and geo.kh == geo.kw else None
    if (
        alg is None
        or (geo.sh, geo.sw, geo.dh, geo.dw, geo.groups) != (1, 1, 1, 1, 1)
        or min(geo.cin, geo.c_out) < MIN_CHANNELS
        or min(geo.ho, geo.wo) < MIN_SIZE
        or np.dtype(dtype) not in (np.float32, np.float64)
    ):
        return None
    return alg


# Note [Filter transforms]: the filter transform and its adjoint (the weight gradient's
# last step) are one GEMM each with gg (36 x r^2), arranged so that the big operand --
# U or the weight gradient's transformed sum, 36 x C_in x C_out -- is read and written
# in its own order; only the weight (r^2 values per channel pair) is transposed. The
# transposed read of the big one had cost more than the GEMM: measured one thread,
# 64 -> 128 channels, float32, U 0.43 -> 0.28 ms, the adjoint 0.99 -> 0.18 ms (of a
# 2.9 ms weight gradient at batch 32 on 8 x 8 images).


def filters(w, alg):
    """U (36, C_in, C_out) = G k G^T of every (output, input) channel pair of w (Note
    [Filter transforms])."""
    c_out, c_in, r = w.shape[:3]
    k = np.ascontiguousarray(w.reshape(c_out, c_in, r * r).transpose(1, 0, 2))
    u = np.dot(alg.gg.astype(w.dtype), k.reshape(c_in * c_out, r * r).T)
    return u.reshape(36, c_in, c_out)


class _Tiles:
    """The tiling of one convolution: tile rows and columns, rows per block."""

    def __init__(self, geo, alg, itemsize):
        m = alg.m
        self.th, self.tw = -(-geo.ho // m), -(-geo.wo // m)
        per_row = 36 * self.tw * (geo.cin + geo.c_out) * itemsize
        self.rows = max(1, min(geo.n * self.th, BLOCK_BYTES // per_row))
        self.slab = (6, m * self.tw + 6 - m, geo.cin)  # transform_input's
        self.grad_slab = (4, m * self.tw + 4 - m, geo.c_out)  # transform_grad's

    def transformed(self, channels, dtype):
        """A buffer for one block's transformed tiles of ``channels`` channels."""
        return np.empty(36 * self.rows * self.tw * channels, dtype)

    def geometry(self, geo):
        """The block loops' geometry arguments, after their operands."""
        return (geo.h, geo.w, geo.pt, geo.pl, geo.ho, geo.wo, self.th, self.tw, self.rows)


def forward(x, u, alg, geo, layout, bias, out) -> bool:
    """out = conv2d(x) + bias for images x in ``layout``, with filters u (``filters``);
    False if a value on the way was not finite (Note [Winograd and infinities])."""
    dtype = x.dtype
    tiles = _Tiles(geo, alg, x.itemsize)
    buffers = (
        np.zeros(tiles.slab, dtype),
        np.empty((6, 6, geo.cin), dtype),
        np.empty((4, 6, geo.c_out), dtype),
        np.empty((alg.m, alg.m * tiles.tw, geo.c_out), dtype),  # output rows
        tiles.transformed(geo.cin, dtype),
        tiles.transformed(geo.c_out, dtype),
    )
    bias = np.zeros(geo.c_out, dtype) if bias is None else np.ascontiguousarray(bias, dtype)
    run = _kernel(forward_blocks, alg, dtype, layout)
    return run(x, u, bias, *tiles.geometry(geo), buffers, out)


def weight_grad(x, g, alg, geo, layout):
    """The (C_out, C_in, r, r) gradient of the weight from input x and grad g (both in
    ``layout``); None if a value on the way was not finite."""
    dtype = x.dtype
    tiles = _Tiles(geo, alg, x.itemsize)
    buffers = (
        np.zeros(tiles.slab, dtype),
        np.zeros(tiles.grad_slab, dtype),
        np.empty((6, 6, geo.cin), dtype),
        np.empty((4, 6, geo.c_out), dtype),
        tiles.transformed(geo.cin, dtype),
        tiles.transformed(geo.c_out, dtype),
    )
    total = np.zeros((36, geo.cin, geo.c_out), dtype)
    run = _kernel(weight_grad_blocks, alg, dtype, layout)
    if not run(x, g, *tiles.geometry(geo), buffers, total):
        return None
    # the adjoint of ``filters`` (Note [Filter transforms]): gw[o, i] = gg^T total[:, i, o]
    gw = np.dot(alg.gg.T.astype(dtype), total.reshape(36, -1))
    return np.ascontiguousarray(gw.reshape(alg.r, alg.r, geo.cin, geo.c_out).transpose(3, 2, 0, 1))
