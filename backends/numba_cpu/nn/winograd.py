"""Stride-1 convolutions by Winograd's minimal filtering: F(2x2, 3x3), F(4x4, 3x3),
F(3x3, 4x4) and F(2x2, 5x5) (Note [Winograd family]).

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
largest magnitude on this shape (the im2col GEMM by ~1e-7); float64 by ~1e-15. So
float32 runs F(4x4, 3x3) only where the user allows it, and F(2x2, 3x3), whose
transforms only add and subtract, by default (Note [Float32 precision] in
lamina.backends.precision). ``LAMINA_WINOGRAD=0`` turns Winograd off.

Note [Winograd and infinities]: the transforms mix a tile's values, so one infinity or
NaN in the input would make the whole tile's 16 outputs NaN where the direct sum keeps
the others finite. The kernels return the sum of the values they wrote (non-finite if
any was, or if an intermediate overflowed), and a convolution that meets one is
computed again by im2col.

The backward operators reuse the transforms: the input gradient of a stride-1 3x3
convolution is a stride-1 3x3 convolution (Note [Convolution]), and the weight gradient
is the adjoint of the filter transform applied to sum over tiles of
(B^T d B) * (A grad A^T): the input's transform, the output gradient's (m x m -> n x n
by A) and, per position, one GEMM (C_in x tiles) @ (tiles x C_out).

The kernels are written for any tile: n x n input tiles (6 or 4), m x m output tiles,
n^2 positions. A block is a range of tile rows of the batch (row r: image r // th, tile
row r % th), sized so its transformed input and products stay in the L2 cache
(BLOCK_BYTES), or as big as the transformed filters where those are bigger (Note
[Winograd blocks]); a tile t of it is r's tile column tx at (r - r0) * tw + tx.
"""

import math
import os

import numpy as np

from lamina.backends import jit, precision, threads

from .. import blas
from .filter_cache import prepared
from .layout import NCHW, NHWC

ENABLED = os.environ.get("LAMINA_WINOGRAD", "1") != "0"
MIN_CHANNELS = 8  # below this the GEMMs are too thin to pay for the transforms
MIN_SIZE = 4  # a narrower output wastes most of a tile (a tile is 2 to 4 wide)
# Note [Enough tiles]: Winograd pays where a convolution has enough output tiles: every
# block reads all of the transformed filters U (16/9 or 4 times the weight's size), and
# in training, where the weights change every step so the filter cache never serves,
# the forward's filters and the input gradient's flipped ones are transformed on every
# call (Note [Filter transforms]). Each thread's part (Note [Winograd parts]) needs
# MIN_TILES tiles; and past the L2 cache (L2_BYTES), where U is read from the L3, the
# batch needs sqrt(U's bytes / L2_BYTES) times MIN_TILES however many threads share
# them (fitted below: the threads read U from the L3 side by side). Those that have
# fewer -- ResNet's late stages at small batches, 3 x 3 on 8 x 8 to 2 x 2 images of 256
# and 512 channels -- run by im2col (Note [Small planes] in conv.py). Measured on 2 cores
# (Zen 4), float32, F(2x2, 3x3), forward + both gradients with the weight changed
# before every call, im2col time / Winograd time (above 1: Winograd is faster; -: not
# measured; two figures: two sessions):
#
#     channels  tiles  1 thread  2 threads   | channels  tiles  1 thread  2 threads
#     64        32     1.03      0.94        | 256       32     0.75      -
#     64        64     -         1.16        | 256       64     1.11      0.94-1.17
#     128       32     1.05      -           | 256       128    1.45      1.37
#     128       64     -         1.20        | 512       64     0.83-0.88 0.70-0.86
#     128       128    -         1.21        | 512       128    1.24-1.26 1.09-1.26
#                                            | 512       256    1.58      1.49
#
# So a part needs 32 tiles, and the batch 64 tiles at 256 channels and 128 at 512, on
# one thread or two. (Tiles per part times sqrt(U / L2), the rule before this one, left
# 512 channels at 128 tiles on two threads to im2col: ResNet-18 on 32 x 32 images at
# batch 32.) The rule before those, 256 tiles of the whole batch on any thread count,
# left ResNet-18's 256-channel convolutions on 4 x 4 images at batch 32 to im2col
# (1.45x and 1.37x slower on one and two threads). Inference takes Winograd from fewer
# tiles (Note [Steady filters]).
MIN_TILES = 32
L2_BYTES = 1 << 20  # per core
# Note [Winograd blocks]: a block's transformed input and products fill BLOCK_BYTES (the
# L2 cache), or as many bytes as the transformed filters U where those are bigger: every
# block's GEMMs read all of U, so with wide channels (U of 256 x 256 channels is 4 MB, of
# 512 x 512 16 MB) 1 MB blocks of few tiles read U many times over in thin GEMMs.
# Measured one thread, float32, F(2x2, 3x3), 1 MB blocks / U-sized, inference and
# forward + both gradients (ms): 32 x 256 x 16 x 16 65 / 45 and 184 / 139, 32 x 512 x 8 x 8
# 82 / 39 and 285 / 193, 32 x 256 x 32 x 32 224 / 167 and 633 / 505; 128 channels or
# fewer keep 1 MB blocks (their U is at most 1 MB).
BLOCK_BYTES = 1 << 20

# Note [Winograd family]: F(m x m, r x r) interpolates at n - 1 points and infinity,
# n = m + r - 1 the input tile's size. Those with n = 6 (m + r = 7) share the points 0,
# 1, -1, 2, -2 and the 6x6 input transform B^T (``input_6``); the filter transform G
# (n x r) and the output transform A^T (m x n) are the rows of powers of those points
# (with the scale factors F(4, 3)'s G puts on them). So one set of kernels runs
# F(4x4, 3x3), F(3x3, 4x4) and F(2x2, 5x5): a 3x3, 4x4 or 5x5 kernel, 36
# multiplications per output tile of 16, 9 or 4 outputs (direct: 9, 16, 25 each), and
# F(2x2, 3x3) with n = 4 and the points 0, 1, -1: 16 multiplications per 4 outputs.
SIX_POINTS, SIX_SCALES = (0, 1, -1, 2, -2), (1 / 4, -1 / 6, -1 / 6, 1 / 24, 1 / 24)
FOUR_POINTS, FOUR_SCALES = (0, 1, -1), (1, 1 / 2, 1 / 2)


def _filter_transform(points, scales, r):
    """G (n x r): row j is scales[j] times the powers of points[j]; the last,
    infinity's, picks the kernel's last tap."""
    g = np.zeros((len(points) + 1, r))
    for j, (p, scale) in enumerate(zip(points, scales)):
        g[j] = [scale * p**k for k in range(r)]
    g[-1, r - 1] = 1
    return g


# Note [Winograd constants]: the transforms multiply by 2, 4 and 8 as additions
# (exact, like the multiplications), because a Python number times a float32 makes a
# float64 in Numba and the kernels would compute in double precision.
#
# Note [Tile reads]: a transform reads its values itself, a[x + q dx, y + q dy, c] for
# q < its count, from the array that holds them (a slab row, a column of the first
# pass's results, one position of every transformed tile): Numba cannot build a tuple
# of a length the kernel chooses, and indexing the whole arrays keeps the channel loops
# vectorized (Note [Whole-array indexing]). Each returns a tuple, which ``write_n`` stores
# the same way. The first pass of a tile stores its results transposed (tmp[q, i] for
# row i): stored along the second axis, LLVM vectorized the pass less well (measured:
# the input transform of 16x64x56x56, F(4x4, 3x3), one thread, 6.4 -> 2.8 ms).


@jit.jitable
def twice(a):
    return a + a


@jit.jitable
def read_2(a, x, y, c, dx, dy):
    """a[x + q dx, y + q dy, c] for q < 2 (Note [Tile reads]); read_3, 4, 6 likewise."""
    return a[x, y, c], a[x + dx, y + dy, c]


@jit.jitable
def read_3(a, x, y, c, dx, dy):
    return read_2(a, x, y, c, dx, dy) + (a[x + 2 * dx, y + 2 * dy, c],)


@jit.jitable
def read_4(a, x, y, c, dx, dy):
    return read_2(a, x, y, c, dx, dy) + read_2(a, x + 2 * dx, y + 2 * dy, c, dx, dy)


@jit.jitable
def read_6(a, x, y, c, dx, dy):
    return read_3(a, x, y, c, dx, dy) + read_3(a, x + 3 * dx, y + 3 * dy, c, dx, dy)


@jit.jitable
def write_2(a, x, y, c, dx, dy, v):
    """a[x + q dx, y + q dy, c] = v[q] for q < 2 (Note [Tile reads]); returns their
    sum. write_3, 4, 6 likewise."""
    a[x, y, c], a[x + dx, y + dy, c] = v[0], v[1]
    return v[0] + v[1]


@jit.jitable
def write_3(a, x, y, c, dx, dy, v):
    a[x + 2 * dx, y + 2 * dy, c] = v[2]
    return write_2(a, x, y, c, dx, dy, v[:2]) + v[2]


@jit.jitable
def write_4(a, x, y, c, dx, dy, v):
    return write_2(a, x, y, c, dx, dy, v[:2]) + write_2(a, x + 2 * dx, y + 2 * dy, c, dx, dy, v[2:])


@jit.jitable
def write_6(a, x, y, c, dx, dy, v):
    return write_3(a, x, y, c, dx, dy, v[:3]) + write_3(a, x + 3 * dx, y + 3 * dy, c, dx, dy, v[3:])


WRITE = {2: write_2, 3: write_3, 4: write_4, 6: write_6}


@jit.jitable
def input_6(a, x, y, c, dx, dy):
    """B^T d for a column d of six values (Note [Tile reads], [Winograd constants])."""
    d0, d1, d2, d3, d4, d5 = read_6(a, x, y, c, dx, dy)
    return (
        twice(twice(d0 - d2)) - d2 + d4,
        d3 + d4 - twice(twice(d1 + d2)),
        twice(twice(d1 - d2)) - d3 + d4,
        twice(d3 - d1) - d2 + d4,
        twice(d1 - d3) - d2 + d4,
        twice(twice(d1 - d3)) - d3 + d5,
    )


@jit.jitable
def output_4(a, x, y, c, dx, dy):
    """A^T m of F(4, 3): six products to four outputs (rows 1, p, p^2, p^3 + infinity)."""
    m0, m1, m2, m3, m4, m5 = read_6(a, x, y, c, dx, dy)
    s, d, t, e = m1 + m2, m1 - m2, m3 + m4, m3 - m4
    return (m0 + s + t, d + twice(e), s + twice(twice(t)), d + twice(twice(twice(e))) + m5)


@jit.jitable
def output_3(a, x, y, c, dx, dy):
    """A^T m of F(3, 4), as ``output_4``."""
    m0, m1, m2, m3, m4, m5 = read_6(a, x, y, c, dx, dy)
    s, d, t, e = m1 + m2, m1 - m2, m3 + m4, m3 - m4
    return (m0 + s + t, d + twice(e), s + twice(twice(t)) + m5)


@jit.jitable
def output_2(a, x, y, c, dx, dy):
    """A^T m of F(2, 5)."""
    m0, m1, m2, m3, m4, m5 = read_6(a, x, y, c, dx, dy)
    return (m0 + m1 + m2 + m3 + m4, m1 - m2 + twice(m3 - m4) + m5)


@jit.jitable
def grad_4(a, x, y, c, dx, dy):
    """A e of F(4, 3): four output gradients to six (the adjoint of ``output_4``)."""
    e0, e1, e2, e3 = read_4(a, x, y, c, dx, dy)
    s, t = e0 + e2, e1 + e3
    u, v = e0 + twice(twice(e2)), twice(e1 + twice(twice(e3)))
    return (e0, s + t, s - t, u + v, u - v, e3)


@jit.jitable
def grad_3(a, x, y, c, dx, dy):
    """A e of F(3, 4)."""
    e0, e1, e2 = read_3(a, x, y, c, dx, dy)
    u = e0 + twice(twice(e2))
    return (e0, e0 + e1 + e2, e0 - e1 + e2, u + twice(e1), u - twice(e1), e2)


@jit.jitable
def grad_2(a, x, y, c, dx, dy):
    """A e of F(2, 5)."""
    e0, e1 = read_2(a, x, y, c, dx, dy)
    return (e0, e0 + e1, e0 - e1, e0 + twice(e1), e0 - twice(e1), e1)


@jit.jitable
def input_4(a, x, y, c, dx, dy):
    """B^T d of F(2, 3) for a column d of four values: additions only, so the input
    transform rounds as little as the direct sum's products (Note [Float32 precision]
    in lamina.backends.precision)."""
    d0, d1, d2, d3 = read_4(a, x, y, c, dx, dy)
    return (d0 - d2, d1 + d2, d2 - d1, d1 - d3)


@jit.jitable
def output_2x3(a, x, y, c, dx, dy):
    """A^T m of F(2, 3): four products to two outputs."""
    m0, m1, m2, m3 = read_4(a, x, y, c, dx, dy)
    return (m0 + m1 + m2, m1 - m2 - m3)


@jit.jitable
def grad_2x3(a, x, y, c, dx, dy):
    """A e of F(2, 3): two output gradients to four (the adjoint of ``output_2x3``)."""
    e0, e1 = read_2(a, x, y, c, dx, dy)
    return (e0, e0 + e1, e0 - e1, -e1)


class Algorithm:
    """F(m x m, r x r) of Note [Winograd family]: its transforms and tile sizes."""

    def __init__(self, name, r, points, scales, input, output, grad):
        self.name, self.r = name, r
        self.n = len(points) + 1  # the input tile's size
        self.m = self.n - r + 1  # the output tile's
        self.input, self.output, self.grad = input, output, grad
        g = _filter_transform(points, scales, r)
        self.gg = np.kron(g, g)  # (n^2, r^2): vec(G k G^T) = gg vec(k), row-major
        self.gg_t = np.ascontiguousarray(self.gg.T)  # the adjoint's


F2x3 = Algorithm("F(2x2,3x3)", 3, FOUR_POINTS, FOUR_SCALES, input_4, output_2x3, grad_2x3)
FAST = {  # Note [Float32 precision]: float64, and float32 where the setting allows
    r: Algorithm(f"F({7 - r}x{7 - r},{r}x{r})", r, SIX_POINTS, SIX_SCALES, input_6, *fns)
    for r, fns in ((3, (output_4, grad_4)), (4, (output_3, grad_3)), (5, (output_2, grad_2)))
}
PRECISE = {3: F2x3}  # float32 at "highest": the others' error is ~10x the direct sum's


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
def store_nhwc(rows, i, wo, bias, floor, out, n, row):
    """Output row ``row`` of NHWC image n = rows[i, :wo] (Wo, K) + bias, raised to
    floor where below it (Note [Fused epilogues] in conv.py)."""
    for w in range(wo):
        for k in range(rows.shape[2]):
            y = rows[i, w, k] + bias[k]
            out[n, row, w, k] = floor if y < floor else y


@jit.jitable
def store_nchw(rows, i, wo, bias, floor, out, n, row):
    """Output row ``row`` of NCHW image n = rows[i, :wo] transposed, + bias, raised to
    floor."""
    for k in range(rows.shape[2]):
        b = bias[k]
        for w in range(wo):
            y = rows[i, w, k] + b
            out[n, k, row, w] = floor if y < floor else y


def transform_input(fetch, alg):
    """The kernel writing V (n^2, T, C) = B^T d B of every n x n input tile (m apart) of
    tile rows [r0, r1), the rows copied into ``slab`` (n, m tw + n - m, C) by ``fetch``;
    the slab arrives zeroed: its columns outside the input stay zero. Returns the sum of
    V (Note [Winograd and infinities])."""
    n, m, transform, write = alg.n, alg.m, alg.input, WRITE[alg.n]

    def kernel(x, h, w, pt, pl, r0, r1, th, slab, tmp, V):
        tw, channels = (slab.shape[1] - n + m) // m, slab.shape[2]
        inside, total = min(w, slab.shape[1] - pl), np.zeros(1, tmp.dtype)[0]
        for r in range(r0, r1):
            image, ty = r // th, r % th
            first = 0
            if r > r0 and ty > 0:  # the last n - m rows of tile row ty - 1 are its first
                for i in range(n - m):
                    for j in range(slab.shape[1]):
                        for c in range(channels):
                            slab[i, j, c] = slab[i + m, j, c]
                first = n - m
            for i in range(first, n):
                row = m * ty - pt + i
                if 0 <= row < h:
                    fetch(x, image, row, slab, i, pl, inside)
                else:
                    slab[i] = 0
            for tx in range(tw):
                t, j = (r - r0) * tw + tx, m * tx
                for i in range(n):
                    for c in range(channels):
                        write(tmp, 0, i, c, 1, 0, transform(slab, i, j, c, 0, 1))
                for a in range(n):
                    for c in range(channels):
                        total += write(V, a, t, c, n, 0, transform(tmp, a, 0, c, 0, 1))
        return total

    return kernel


def transform_output(store, alg):
    """The kernel writing the output rows of tile rows [r0, r1) from M (n^2, T, K):
    A^T p A + bias per tile, raised to floor, through ``rows`` (m, m tw, K). Returns
    the sum of the outputs before the bias."""
    n, m, transform, write = alg.n, alg.m, alg.output, WRITE[alg.m]

    def kernel(M, ho, wo, r0, r1, th, bias, floor, tmp, rows, out):
        tw, channels, total = rows.shape[1] // m, rows.shape[2], np.zeros(1, tmp.dtype)[0]
        for r in range(r0, r1):
            image, ty = r // th, r % th
            for tx in range(tw):
                t, j = (r - r0) * tw + tx, m * tx
                for a in range(n):
                    for k in range(channels):
                        write(tmp, 0, a, k, 1, 0, transform(M, a, t, k, n, 0))
                for i in range(m):
                    for k in range(channels):
                        total += write(rows, i, j, k, 0, 1, transform(tmp, i, 0, k, 0, 1))
            for i in range(min(m, ho - m * ty)):
                store(rows, i, wo, bias, floor, out, image, m * ty + i)
        return total

    return kernel


def transform_grad(fetch, alg):
    """The kernel writing Z (n^2, T, K) = A e A^T of every m x m output-gradient tile of
    tile rows [r0, r1), through ``slab`` (m, m tw, K) as ``transform_input`` (its
    columns past Wo stay zero). Returns the sum of Z."""
    n, m, transform, write = alg.n, alg.m, alg.grad, WRITE[alg.n]

    def kernel(g, ho, wo, r0, r1, th, slab, tmp, Z):
        tw, channels = slab.shape[1] // m, slab.shape[2]
        total = np.zeros(1, tmp.dtype)[0]
        for r in range(r0, r1):
            image, ty = r // th, r % th
            for i in range(m):
                row = m * ty + i
                if row < ho:
                    fetch(g, image, row, slab, i, 0, wo)
                else:
                    slab[i] = 0
            for tx in range(tw):
                t, j = (r - r0) * tw + tx, m * tx
                for i in range(m):
                    for k in range(channels):
                        write(tmp, 0, i, k, 1, 0, transform(slab, i, j, k, 0, 1))
                for a in range(n):
                    for k in range(channels):
                        total += write(Z, a, t, k, n, 0, transform(tmp, a, 0, k, 0, 1))
        return total

    return kernel


@jit.jitable
def block(r0, rows, rows_per_block, tw, in_buf, out_buf, shape):
    """The block of tile rows from r0 of a block loop: (its end r1, the (n^2, T, C_in)
    and (n^2, T, C_out) views of in_buf and out_buf for its T tiles), ``shape`` being
    (n^2, C_in, C_out)."""
    r1 = min(rows, r0 + rows_per_block)
    t = (r1 - r0) * tw
    positions, cin, cout = shape
    return (
        r1,
        in_buf[: positions * t * cin].reshape(positions, t, cin),
        out_buf[: positions * t * cout].reshape(positions, t, cout),
    )


def forward_blocks(transform, finish):
    """The block loop of ``forward`` over tile rows [start, stop) of all the images
    (Note [Winograd parts]): each block's input tiles transformed (``transform``,
    a ``transform_input`` function), multiplied by the filters u position by position,
    and transformed into the output (``finish``, a ``transform_output`` function). One
    kernel where it can call the BLAS, else Python calling the transforms' kernels (Note
    [GEMM in kernels]). False if a value on the way was not finite."""

    def run(x, u, bias, floor, h, w, pt, pl, ho, wo, th, tw, rows_per_block, start, stop,
            buffers, out):  # fmt: skip
        slab, tmp_in, tmp_out, rows, v_buf, m_buf = buffers
        for r0 in range(start, stop, rows_per_block):
            r1, v, m = block(r0, stop, rows_per_block, tw, v_buf, m_buf, u.shape)
            if not math.isfinite(transform(x, h, w, pt, pl, r0, r1, th, slab, tmp_in, v)):
                return False
            blas.gemms(v, u, m, False, False, 0)
            if not math.isfinite(finish(m, ho, wo, r0, r1, th, bias, floor, tmp_out, rows, out)):
                return False
        return True

    return run


def weight_grad_blocks(transform_x, transform_g):
    """The block loop of ``weight_grad``: total (n^2, C_in, C_out) += V^T Z of each
    block, position by position, V and Z the transforms of its input tiles
    (``transform_x``) and output-gradient tiles (``transform_g``); as
    ``forward_blocks``."""

    def run(x, g, h, w, pt, pl, ho, wo, th, tw, rows_per_block, start, stop, buffers, total):
        slab, gslab, tmp_in, tmp_g, v_buf, z_buf = buffers
        for r0 in range(start, stop, rows_per_block):
            r1, v, z = block(r0, stop, rows_per_block, tw, v_buf, z_buf, total.shape)
            check = transform_x(x, h, w, pt, pl, r0, r1, th, slab, tmp_in, v)
            check += transform_g(g, ho, wo, r0, r1, th, gslab, tmp_g, z)
            if not math.isfinite(check):
                return False
            blas.gemms(v, z, total, True, False, 1)
        return True

    return run


def forward_parts(loop):
    """``loop`` (forward_blocks') over parts of the tile rows in parallel, part p with
    buffers[k][p] (Note [Winograd parts]); done[p] whether part p's values stayed
    finite."""

    def run(x, u, bias, floor, h, w, pt, pl, ho, wo, th, tw, rows, buffers, out, done):
        parts = done.size
        for p in jit.prange(parts):
            start, stop = jit.part(x.shape[0] * th, parts, p)
            own = (buffers[0][p], buffers[1][p], buffers[2][p], buffers[3][p], buffers[4][p],
                   buffers[5][p])  # fmt: skip
            done[p] = loop(x, u, bias, floor, h, w, pt, pl, ho, wo, th, tw, rows, start, stop,
                           own, out)  # fmt: skip

    return run


def weight_grad_parts(loop):
    """``loop`` (weight_grad_blocks') over parts of the tile rows in parallel, part p
    summing into totals[p]; as ``forward_parts``."""

    def run(x, g, h, w, pt, pl, ho, wo, th, tw, rows, buffers, totals, done):
        parts = done.size
        for p in jit.prange(parts):
            start, stop = jit.part(x.shape[0] * th, parts, p)
            own = (buffers[0][p], buffers[1][p], buffers[2][p], buffers[3][p], buffers[4][p],
                   buffers[5][p])  # fmt: skip
            done[p] = loop(x, g, h, w, pt, pl, ho, wo, th, tw, rows, start, stop, own, totals[p])

    return run


_PARTS = {forward_blocks: forward_parts, weight_grad_blocks: weight_grad_parts}
_FETCH = {NHWC: fetch_nhwc, NCHW: fetch_nchw}
_STORE = {NHWC: store_nhwc, NCHW: store_nchw}
_STEPS = {  # the transforms a block loop calls
    forward_blocks: (transform_input, transform_output),
    weight_grad_blocks: (transform_input, transform_grad),
}


def _signature(template, dtype):
    t = jit.types
    a1, a2, a3, a4 = (jit.array(dtype, d) for d in (1, 2, 3, 4))
    i, x, done = t.int64, a1.dtype, jit.array(np.bool_, 1)
    buffers = t.Tuple((a4, a4, a4, a4, a2, a2))  # a part axis first
    own = t.Tuple((a3, a3, a3, a3, a1, a1))  # one part's
    return {
        forward_parts: t.void(a4, a3, a1, x, *[i] * 9, buffers, a4, done),
        weight_grad_parts: t.void(a4, a4, *[i] * 9, buffers, a4, done),
        forward_blocks: t.boolean(a4, a3, a1, x, *[i] * 11, own, a4),
        weight_grad_blocks: t.boolean(a4, a4, *[i] * 11, own, a3),
        transform_input: x(a4, *[i] * 7, a3, a3, a3),
        transform_output: x(a3, *[i] * 5, a1, x, a3, a3, a4),
        transform_grad: x(a4, *[i] * 5, a3, a3, a3),
    }[template]


def _step(template, algorithm, layout):
    """Transform ``template``'s Python function for ``algorithm`` and ``layout``, made
    once and jitable: ``_transform`` compiles it for each dtype."""

    def build():
        move = (_STORE if template is transform_output else _FETCH)[layout]
        return jit.jitable(template(move, algorithm), fastmath=jit.REASSOCIATE, **jit.CALLEE)

    return jit.cached(("step", template, algorithm.name, layout), build)


def _transform(template, algorithm, dtype, layout):
    """Transform ``template``'s kernel for ``algorithm``, dtype and ``layout``, shared
    by both block loops: run from Python, or called by its name, ``_symbol``'s (Note
    [Kernels called by name] in backends/jit.py)."""

    def build():
        fn, sig = _step(template, algorithm, layout), _signature(template, dtype)
        symbol = _symbol(template, algorithm, dtype, layout)
        return jit.compile_kernel(fn, sig, fastmath=jit.REASSOCIATE, nogil=True, symbol=symbol)

    return jit.cached((template, algorithm.name, np.dtype(dtype), layout), build)


def _symbol(template, algorithm, dtype, layout):
    return jit.kernel_name("winograd", template.__name__, algorithm.name, np.dtype(dtype), layout)


def _by_name(template, algorithm, dtype, layout):
    """A jitable calling ``_transform``'s kernel by its name, the kernel compiled or
    loaded first: that registers the name, which a block loop calling it needs before
    it loads."""
    _transform(template, algorithm, dtype, layout)
    return jit.by_name(_symbol(template, algorithm, dtype, layout))


def _kernel(template, algorithm, dtype, layout, parallel):
    """The block loop ``template`` (``forward_blocks``, ``weight_grad_blocks``) for
    ``algorithm``, dtype and images in ``layout``, over parts of the images (``_PARTS``):
    one kernel, without the GIL, its loop over the parts parallel or not, calling the
    block loop over a part by name (``_part_loop``); else the loops in Python over the
    transforms' kernels, the parts one after the other."""
    native = blas.available()

    def build():
        parts = _PARTS[template]
        if native:
            loop = jit.by_name(_part_loop(template, algorithm, dtype, layout))
            return jit.compile_kernel(parts(loop), _signature(parts, dtype), parallel, nogil=True)
        return parts(template(*(_transform(t, algorithm, dtype, layout) for t in _STEPS[template])))

    key = (template, algorithm.name, np.dtype(dtype), layout, native, native and parallel)
    return jit.cached(key, build)


def _part_loop(template, algorithm, dtype, layout):
    """The name of the block loop ``template`` over one part's tile rows: a kernel of
    its own, compiled once for the serial and the parallel loop over the parts, calling
    the transforms' kernels by name (Note [Kernels called by name] in backends/jit.py)
    and the BLAS (Note [GEMM in kernels])."""
    symbol = _symbol(template, algorithm, dtype, layout)

    def build():
        loop = template(*(_by_name(t, algorithm, dtype, layout) for t in _STEPS[template]))
        signature = _signature(template, dtype)
        return jit.compile_kernel(loop, signature, nogil=True, symbol=symbol)

    jit.cached((_part_loop, template, algorithm.name, np.dtype(dtype), layout), build)
    return symbol


# ---------------------------------------------------------------- the convolutions


def algorithm(geo, dtype, steady=False):
    """The Winograd algorithm conv2d of geometry ``geo`` runs by (Note [Winograd
    family]), or None: for float32 at "highest" the precise ones only (Note [Float32
    precision] in lamina.backends.precision); where each thread's part has enough output
    tiles (Note [Enough tiles]), or, with ``steady`` filters, from MIN_STEADY_TILES
    tiles of the batch (Note [Steady filters]). Decided once a call (Note [Decisions of
    one call] in conv.py)."""
    if not ENABLED or geo.kh != geo.kw or geo.kh not in FAST:  # 1 x 1: most of a net's
        return None
    key = ("winograd", dtype, steady)
    if key not in geo.decisions:
        geo.decisions[key] = _algorithm(geo, np.dtype(dtype), steady)
    return geo.decisions[key]


def _algorithm(geo, dtype, steady):
    fast = dtype != _FLOAT32 or precision.fast_float32()
    alg = (FAST if fast else PRECISE).get(geo.kh)
    if (
        alg is None
        or (geo.sh, geo.sw, geo.dh, geo.dw, geo.groups) != (1, 1, 1, 1, 1)
        or min(geo.cin, geo.c_out) < MIN_CHANNELS
        or min(geo.ho, geo.wo) < MIN_SIZE
        or dtype not in _FLOATS
    ):
        return None
    tile_rows = geo.n * -(-geo.ho // alg.m)
    tiles = tile_rows * -(-geo.wo // alg.m)
    if steady:
        return alg if tiles >= MIN_STEADY_TILES else None
    u_bytes = alg.n * alg.n * geo.cin * geo.c_out * dtype.itemsize
    needed = MIN_TILES * max(_parts(geo, tile_rows), math.sqrt(u_bytes / L2_BYTES))
    return alg if tiles >= needed else None


_FLOAT32 = np.dtype(np.float32)
_FLOATS = (_FLOAT32, np.dtype(np.float64))


def _parts(geo, tile_rows):
    """How many parts (threads) a convolution's tile rows run in (Note [Winograd
    parts])."""
    return threads.parts_for(geo.flops // 2, tile_rows)


# Note [Filter transforms]: the filter transform U[p, i, o] = sum_q gg[p, q] w[o, i, q]
# and its adjoint, the weight gradient's last step gw[o, i, q] = sum_p gg[p, q]
# total[p, i, o], run per input channel i, in parallel: that channel's r^2 x C_out
# weights (or n^2 x C_out transformed sums) are read once, the sums made in float64
# along the C_out values, vectorized, and rounded once; gg's zeros (80 of F(2x2, 3x3)'s
# 144) are skipped. In training both run on every call (the forward's filters, the
# input gradient's flipped ones, then the adjoint). They were one float64 GEMM each with
# gg around a transposed copy and two conversions; measured float32, F(2x2, 3x3),
# transform / adjoint, ms, before -> after: one thread, 128 channels 2.4-3.0 / 0.34 ->
# 0.26 / 0.31, 256 1.9-4.3 / 2.5-3.2 -> 1.0 / 1.6, 512 13-16 / 21-23 -> 9.0 / 11.6; two
# threads, 256 channels 1.7-2.0 / 2.0-2.6 -> 0.8 / 0.9. (A kernel for each direction,
# reading the adjoint's sums in place, was 10-40% faster still: 1.1 ms for the 256-channel
# adjoint on one thread; the copy into rows is what lets both share one loop.) The
# adjoint reads the sums of each part of the weight gradient (Note [Winograd parts])
# and adds them up as it copies a row, in float64: their total was a pass of its own,
# 0.9 of the 3.8 ms of a 256-channel weight gradient on 4 x 4 images at batch 32 on two
# threads. A 256-channel 3 x 3 convolution on 4 x 4 images at batch 32, forward and both
# gradients, one thread: 19.6-21.4 -> 17.6 ms (by im2col: 23.6-25.5).


# Note [Steady filters]: from MIN_STEADY_TILES output tiles of the batch, fewer than
# Note [Enough tiles] asks for, Winograd pays only where U comes from the filter cache,
# as in inference: a weight seen unchanged from one call to the next has its U made on
# the second call and served after, and until then (in training, every call) the
# convolution runs by im2col, at the cost of copying the weight (0.7 ms for 512 x 512 x
# 3 x 3; the compare stops early). Measured one thread, float32, ResNet-18 (32 x 32
# images) inference, 256 tiles of the batch alone / with steady filters from 64 tiles:
# batch 32 279 -> 246 ms (its 512-channel 3 x 3 on 4 x 4 images, 128 tiles: 22 -> 13 ms
# each, PyTorch's 14.6), batch 8 80 -> 70 ms (the 256-channel ones on 8 x 8 images);
# from 32 tiles batch 8 was slower (75 ms).
MIN_STEADY_TILES = 64


def filters(w, alg, steady=False):
    """U (n^2, C_in, C_out) = G k G^T of every (output, input) channel pair of w (Note
    [Filter transforms]), from the cache where w has not changed (Note [Filter cache]);
    ``steady``: ``prepared``'s."""
    return prepared(w, alg.name, lambda w: _transform_filters(w, alg), steady)


def forward_filters(w, geo, dtype):
    """(algorithm, U) of the forward convolution of w, geometry ``geo``: by
    ``algorithm``, or with fewer tiles from the filter cache (Note [Steady filters]);
    (None, None) where it runs by im2col."""
    alg = algorithm(geo, dtype)
    if alg is not None:
        return alg, filters(w, alg)
    alg = algorithm(geo, dtype, steady=True)
    u = None if alg is None else filters(w, alg, steady=True)
    return (None, None) if u is None else (alg, u)


def _transform_filters(w, alg):
    c_out, c_in = w.shape[:2]
    u = np.empty((1, alg.n * alg.n, c_in, c_out), w.dtype)
    _filter_sums(np.ascontiguousarray(w).reshape(c_out, c_in, -1), alg.gg, u, True)
    return u[0]


def filter_sums(by_pair, m, by_position, transform):
    """The filter transform (``transform``): by_position[0, p, i, o] = sum_q m[p, q]
    by_pair[o, i, q], m = gg; else its adjoint of the parts' sums (Note [Winograd
    parts]): by_pair[o, i, q] = sum_p m[q, p] sum_k by_position[k, p, i, o], m = gg^T,
    the parts added as each row is read (Note [Filter transforms])."""
    c_out, c_in = by_pair.shape[:2]
    for i in jit.prange(c_in):
        rows, sums = np.empty((m.shape[1], c_out)), np.empty(c_out)
        if transform:  # each array read in its own order
            for o in range(c_out):
                for b in range(m.shape[1]):
                    rows[b, o] = by_pair[o, i, b]
        else:
            for b in range(m.shape[1]):
                jit.assign(rows[b], by_position[0, b, i])  # Note [Assignment in kernels]
                for k in range(1, by_position.shape[0]):
                    for o in range(c_out):
                        rows[b, o] += by_position[k, b, i, o]
        for a in range(m.shape[0]):
            jit.assign(sums, 0.0)
            for b in range(m.shape[1]):
                f = m[a, b]
                if f != 0.0:
                    for o in range(c_out):
                        sums[o] += f * rows[b, o]
            if transform:
                jit.assign(by_position[0, a, i], sums)
            else:
                jit.assign(by_pair[:, i, a], sums)


def _filter_sums(by_pair, m, by_position, transform):
    """``filter_sums`` compiled for the arrays' dtype, its input channels in parallel
    from the parallel threshold."""
    dtype, work = by_pair.dtype, by_pair.shape[1] * by_position.size
    parallel = threads.parts_for(work, 2) > 1

    def build():
        a3, a4 = jit.array(dtype, 3), jit.array(dtype, 4)
        signature = jit.types.void(a3, jit.array(np.float64, 2), a4, jit.types.boolean)
        return jit.compile_kernel(filter_sums, signature, parallel)

    jit.cached((filter_sums, np.dtype(dtype), parallel), build)(by_pair, m, by_position, transform)


class _Tiles:
    """The tiling of one convolution: tile rows (of each image) and columns, the parts
    of the tile rows of all images (Note [Winograd parts]), tile rows per block."""

    def __init__(self, geo, alg, itemsize):
        m = alg.m
        self.th, self.tw = -(-geo.ho // m), -(-geo.wo // m)
        self.parts = _parts(geo, geo.n * self.th)
        self.positions = alg.n * alg.n
        per_row = self.positions * self.tw * (geo.cin + geo.c_out) * itemsize
        filters = self.positions * geo.cin * geo.c_out * itemsize  # U, read by every block
        most = -(-geo.n * self.th // self.parts)  # the biggest part's tile rows
        self.rows = max(1, min(most, max(BLOCK_BYTES, filters) // per_row))
        self.slab = (alg.n, m * self.tw + alg.n - m, geo.cin)  # transform_input's
        self.grad_slab = (m, m * self.tw, geo.c_out)  # transform_grad's

    def transformed(self, channels):
        """The size of a buffer for one block's transformed tiles of ``channels``
        channels."""
        return self.positions * self.rows * self.tw * channels

    def geometry(self, geo):
        """The block loops' geometry arguments, after their operands."""
        return (geo.h, geo.w, geo.pt, geo.pl, geo.ho, geo.wo, self.th, self.tw, self.rows)


# Note [Winograd parts]: a convolution's block loop runs in a parallel loop over parts
# of the tile rows of all its images (``_Tiles.parts``), one part per thread from
# PARALLEL_ELEMENTS multiply-adds, each part with buffers of its own and, in the weight
# gradient, a sum of its own that the parts' total ends. A tile row's output rows are
# its own, so the parts never write the same values, and a single image has as many
# parts as a batch (cut by images, one image ran on one thread). Run instead as
# ``threads.split``'s parts, whose Python calls the loop kernel, the parts waited on
# each other: measured on 2 cores, ResNet's 128 -> 128 channels 3 x 3 on 8 x 8 images at
# batch 8, one thread 0.89 ms, two as split parts 0.80, two in the parallel loop 0.39;
# at batch 32 3.32 / 2.05 / 1.71 ms.


def _part_buffers(parts, *shapes_and_fills):
    """One buffer per (shape, zeroed) for each part, a part axis first."""
    return tuple(
        (np.zeros if zeroed else np.empty)((parts, *shape), dtype)
        for shape, zeroed, dtype in shapes_and_fills
    )


def forward(x, u, alg, geo, layout, bias, floor, out) -> bool:
    """out = conv2d(x) + bias for images x in ``layout``, with filters u (``filters``),
    raised to ``floor`` (Note [Fused epilogues] in conv.py), in parts on lamina's threads
    (Note [Winograd parts]); False if a value on the way was not finite (Note [Winograd
    and infinities])."""
    dtype, tiles = x.dtype, _Tiles(geo, alg, x.itemsize)
    parts = tiles.parts
    buffers = _part_buffers(
        parts,
        (tiles.slab, True, dtype),
        ((alg.n, alg.n, geo.cin), False, dtype),
        ((alg.m, alg.n, geo.c_out), False, dtype),
        ((alg.m, alg.m * tiles.tw, geo.c_out), False, dtype),  # output rows
        ((tiles.transformed(geo.cin),), False, dtype),
        ((tiles.transformed(geo.c_out),), False, dtype),
    )
    bias = np.zeros(geo.c_out, dtype) if bias is None else np.ascontiguousarray(bias, dtype)
    done = np.zeros(parts, np.bool_)
    run = _kernel(forward_blocks, alg, dtype, layout, parts > 1)
    run(x, u, bias, dtype.type(floor), *tiles.geometry(geo), buffers, out, done)
    return bool(done.all())


def weight_grad(x, g, alg, geo, layout):
    """The (C_out, C_in, r, r) gradient of the weight from input x and grad g (both in
    ``layout``), in parts as ``forward``; None if a value on the way was not finite."""
    dtype, tiles = x.dtype, _Tiles(geo, alg, x.itemsize)
    parts = tiles.parts
    buffers = _part_buffers(
        parts,
        (tiles.slab, True, dtype),
        (tiles.grad_slab, True, dtype),
        ((alg.n, alg.n, geo.cin), False, dtype),
        ((alg.n, alg.m, geo.c_out), False, dtype),
        ((tiles.transformed(geo.cin),), False, dtype),
        ((tiles.transformed(geo.c_out),), False, dtype),
    )
    totals = np.zeros((parts, tiles.positions, geo.cin, geo.c_out), dtype)
    done = np.zeros(parts, np.bool_)
    run = _kernel(weight_grad_blocks, alg, dtype, layout, parts > 1)
    run(x, g, *tiles.geometry(geo), buffers, totals, done)
    if not done.all():
        return None
    gw = np.empty((geo.c_out, geo.cin, alg.r * alg.r), dtype)
    _filter_sums(gw, alg.gg_t, totals, False)
    return gw.reshape(geo.c_out, geo.cin, alg.r, alg.r)
