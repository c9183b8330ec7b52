"""Batch, layer, group and local response normalization, forward and backward.

Note [Channel views]: both normalize along axis 1. A tensor is seen either
channels-first, as a C-contiguous (N, C, S) array (S the product of the other axes:
NCHW, and any contiguous rank), or channels-last, as a C-contiguous (M, C) array (M
the pixels: an NHWC image, or a 2-D (N, C) batch). Results keep the input's layout.

Batch norm, channels-first, works one channel at a time: its N x S values (200 KB for
16x64x56x56 float32) are read from memory once and stay in the L2 cache for the mean,
the variance (two passes: exact) and the normalization; small planes run as the
channels-last kernels do (Note [Batch norm of small planes]). Channels-last has no such
block, so the statistics are one pass of per-thread partial sums over pixel rows
(shifted by a sample of each channel, in float64: no cancellation to speak of) and
the normalization a second pass. Backward has the same structure: the two sums of
grad and of grad * (x - mean) per channel, then one elementwise pass. The mean and the
inverse standard deviation are saved for backward (Note [Saved outputs]).

Note [Fused batch norm and relu]: native_batch_norm(..., relu=True) writes max(y, 0)
for each normalized value y in the pass that computes y (oneDNN's fuse_norm_relu), and
its backward, given that result, zeroes grad where the result is not positive as it
reads it. Against batch norm then relu this saves relu's forward pass (a read and a
write of the activation) and an allocation; backward reads the result where relu's
backward did, so it saves the gradient relu wrote and batch norm read again (each of
batch norm's two backward passes now reads the result: channels-first that is one
pass less than before, channels-last none). The arithmetic is the same, and so are the
results, bit for bit: y is rounded to the data's dtype before or after the max, which
commutes with it, and the gated gradient is summed by the same loops (which holds
while LLVM vectorizes the gated and the plain loop alike; the tests compare the two
on the machine that runs them). The rewrite batch_norm_relu (Note [Rewrites]) puts
it in place of batch norm then relu: lamina.nn.Sequential applies it to a BatchNorm2d
followed by a ReLU.

Local response normalization sums squares over a window of channels; the scale
k + alpha / size * sum is saved for backward, which then needs no window of squares
again. scale ** -beta for the usual beta = 0.75 is 1 / (sqrt(s) sqrt(sqrt(s))): two
vectorized square roots, where a general power calls libm's pow per element.
"""

import math

import numpy as np

from lamina.backends import jit, threads
from lamina.backends.jit import jitable
from lamina.dispatch.tensor import bump_version, from_array

from .layout import NCHW, NHWC, in_layout, layout_of

_parallel_min = float("inf")  # Note [Parallel threshold] (lamina.backends.threads)


def _set_threshold(threshold):
    global _parallel_min
    _parallel_min = threshold


threads.on_change(_set_threshold)


def channel_view(data):
    """(array, channels_last) of Note [Channel views]."""
    if data.ndim == 2:
        return np.ascontiguousarray(data), True
    if layout_of(data) == NHWC:
        return data.transpose(0, 2, 3, 1).reshape(-1, data.shape[1]), True
    data = np.ascontiguousarray(data)
    return data.reshape(data.shape[0], data.shape[1], math.prod(data.shape[2:])), False


def from_channel_view(a, like, channels_last):
    """The result array ``a`` of a kernel (a channel view) in the logical shape of
    ``like``, with like's layout."""
    if not channels_last or like.ndim == 2:
        return a.reshape(like.shape)
    n, c, h, w = like.shape
    return a.reshape(n, h, w, c).transpose(0, 3, 1, 2)


def _same_view(data, like_data, channels_last):
    """Another tensor's data (grad, result) as the channel view ``channel_view`` gave
    for ``like_data``."""
    if like_data.ndim == 4:  # an image: in the other order, a tiled transpose
        data = in_layout(data, NHWC if channels_last else NCHW, False)
    else:
        data = np.ascontiguousarray(data)
    if channels_last:
        return data.reshape(-1, like_data.shape[1])
    return data.reshape(like_data.shape[0], like_data.shape[1], math.prod(like_data.shape[2:]))


def _entry(template, args, dtype, parallel_size, fastmath=jit.REASSOCIATE):
    """The kernel of ``template(*args, loop)`` for ``dtype``, parallel from
    ``parallel_size`` elements (Note [Parallel threshold])."""
    loop = range if parallel_size < _parallel_min else jit.prange

    def build():
        return jit.compile_kernel(
            template(*args, loop),
            jit.types.void(*_signature(template, dtype)),
            parallel=loop is jit.prange,
            fastmath=fastmath,
        )

    return jit.cached((template, args, dtype, loop), build)


def _threads():
    return 1 if _parallel_min == float("inf") else max(1, threads.get_num_threads())


# ---------------------------------------------------------------- scalar functions
# (Note [Kernel cache]: beside the templates; Note [Fused batch norm and relu])


@jitable
def unchanged(y, zero):
    return y


@jitable
def rectified(y, zero):
    return zero if y < 0 else y  # activation.py's relu (copied: Note [Kernel cache])


@jitable
def ungated(g, result, zero):
    return g


@jitable
def gated(g, result, zero):
    return zero if result <= 0 else g  # activation.py's relu_backward (NaN passes g)


@jitable
def affine(weight, bias, mean, var, eps):
    """(invstd, a, b) of one channel, float64: its normalization with its weight and
    bias is x * a + b."""
    inv = 1.0 / math.sqrt(var + eps)
    a = weight * inv
    return inv, a, bias - mean * a


@jitable
def gradient_affine(weight, invstd, total, total_x, count, training):
    """(a, b, c) of one channel, float64: its input gradient is g * a + (x - mean) * b
    + c, from the sums of g (total) and g (x - mean) (total_x) over its count values;
    in evaluation g * a (b = c = 0)."""
    a = weight * invstd
    if not training:
        return a, 0.0, 0.0
    return a, -a * invstd * invstd * total_x / count, -a * total / count


# by whether relu is fused: the forward's scalar function, the backward's gate
_ACTIVATION = {False: unchanged, True: rectified}
_GATE = {False: ungated, True: gated}


# ---------------------------------------------------------------- batch norm templates

# Note [Runs of rows]: a kernel that sums down many rows (batch norm's and group
# norm's statistics and gradient sums, layer norm's parameter gradients) adds each run
# of ROWS rows in the data's dtype, a vector of partial sums the loop keeps at full
# width, and then adds the run into float64 totals (``add_runs``): float64 all the way
# halves the vector width, float32 all the way loses digits over long columns
# (50176 x 64 float32, one thread: 0.77 -> 0.40 ms).
ROWS = 64


@jitable
def add_runs(totals, runs, other_totals, other_runs):
    """Two vectors of a run's partial sums added into their float64 totals and zeroed
    for the next run (Note [Runs of rows])."""
    for k in range(len(runs)):
        totals[k] += runs[k]
        other_totals[k] += other_runs[k]
        runs[k], other_runs[k] = 0, 0


def bn_forward_cf(activation, loop):
    """Per channel k of x (N, C, S): with ``training`` the mean and biased variance
    into mean[k], var[k] (else they are given), then out = activation(x * a + b)
    where a, b fold the normalization, weight and bias."""

    def kernel(x, weight, bias, mean, var, out, training, eps):
        n, c, s = x.shape
        count = n * s
        zero = x.dtype.type(0)
        for k in loop(c):
            if training:
                acc = 0.0
                for i in range(n):
                    row = x[i, k]
                    for j in range(s):
                        acc += row[j]
                m = acc / count
                q = 0.0
                for i in range(n):
                    row = x[i, k]
                    for j in range(s):
                        d = row[j] - m
                        q += d * d
                mean[k], var[k] = m, q / count
            _, a, b = affine(weight[k], bias[k], mean[k], var[k], eps)
            for i in range(n):
                row, res = x[i, k], out[i, k]
                for j in range(s):
                    res[j] = activation(row[j] * a + b, zero)

    return kernel


def bn_statistics_cl(loop):
    """The per-channel mean and (biased) variance, float64, of the rows of x (M, C
    per), each channel ``per`` columns (Note [Batch norm of small planes]): partial sums
    of (x - shift) and its square (the shift x's first row) over chunks of the rows, one
    chunk per row of the (chunks, C per) float64 ``sums`` and ``squares``, then added
    up, each column's mean and variance pooled over its channel's (Note [Runs of
    rows])."""

    def kernel(x, sums, squares, mean, var, per):
        m, c = x.shape
        chunks = sums.shape[0]
        for t in loop(chunks):
            s, q = sums[t], squares[t]
            sh = np.empty(c, x.dtype)
            ps, pq = np.zeros(c, x.dtype), np.zeros(c, x.dtype)
            for k in range(c):
                s[k], q[k], sh[k] = 0.0, 0.0, x[0, k]
            start, end = jit.part(m, chunks, t)
            for i0 in range(start, end, ROWS):
                for i in range(i0, min(end, i0 + ROWS)):
                    row = x[i]
                    for k in range(c):
                        d = row[k] - sh[k]
                        ps[k] += d
                        pq[k] += d * d
                add_runs(s, ps, q, pq)
        column_mean, column_var = np.empty(per), np.empty(per)
        for channel in range(c // per):
            pooled = 0.0
            for j in range(per):
                k = channel * per + j
                first, second = 0.0, 0.0
                for t in range(chunks):
                    first += sums[t, k]
                    second += squares[t, k]
                first, second = first / m, second / m
                spread = second - first * first
                column_mean[j] = np.float64(x[0, k]) + first
                column_var[j] = spread if not spread < 0.0 else 0.0  # NaN stays NaN
                pooled += column_mean[j]
            pooled /= per
            spread = 0.0
            for j in range(per):
                d = column_mean[j] - pooled
                spread += column_var[j] + d * d
            mean[channel], var[channel] = pooled, spread / per

    return kernel


def normalize_cl(activation, loop):
    """out[i, k] = activation(x[i, k] * a[k] + b[k]) over the rows of x (M, C per), with
    column k's channel's invstd, a and b from ``affine`` (float64, then x's dtype). The
    per-channel coefficients are made here, not by NumPy: a dozen NumPy calls on
    vectors of C values were half of a small batch norm's time."""

    def kernel(x, weight, bias, mean, var, eps, out, invstd, per):
        c = x.shape[1]
        a, b = np.empty(c, x.dtype), np.empty(c, x.dtype)
        for ch in range(c // per):
            columns = slice(ch * per, (ch + 1) * per)
            invstd[ch], a[columns], b[columns] = affine(
                weight[ch], bias[ch], mean[ch], var[ch], eps
            )
        zero = x.dtype.type(0)
        for i in loop(x.shape[0]):
            row, res = x[i], out[i]
            for k in range(c):
                res[k] = activation(row[k] * a[k] + b[k], zero)

    return kernel


def bn_backward_cf(gate, loop):
    """Per channel k of x, g (N, C, S), with g gated by the result r (``gate``): gb[k]
    = sum g, gw[k] = invstd * sum g (x - mean), and gx = g * a + (x - mean) * b + c for
    the coefficients of batch norm's gradient (training) or gx = g * a (evaluation)."""

    def kernel(g, x, r, weight, mean, invstd, gx, gw, gb, training):
        n, c, s = x.shape
        count = n * s
        zero = x.dtype.type(0)
        for k in loop(c):
            m = mean[k]
            sg = 0.0
            sgx = 0.0
            for i in range(n):
                grow, xrow, rrow = g[i, k], x[i, k], r[i, k]
                for j in range(s):
                    gj = gate(grow[j], rrow[j], zero)
                    sg += gj
                    sgx += gj * (xrow[j] - m)
            gb[k], gw[k] = sg, sgx * invstd[k]
            a, b, cc = gradient_affine(weight[k], invstd[k], sg, sgx, count, training)
            for i in range(n):
                grow, xrow, rrow, res = g[i, k], x[i, k], r[i, k], gx[i, k]
                if training:
                    for j in range(s):
                        res[j] = gate(grow[j], rrow[j], zero) * a + (xrow[j] - m) * b + cc
                else:  # x is not read: a NaN or infinite x leaves g * a (PyTorch's)
                    for j in range(s):
                        res[j] = gate(grow[j], rrow[j], zero) * a

    return kernel


def bn_grad_sums_cl(gate, loop):
    """Partial per-column sums of g and g * (x - mean), g gated by the result r, over
    chunks of rows (M, C per) (Note [Runs of rows])."""

    def kernel(g, x, r, channel_mean, sums, products, per):
        m, c = x.shape
        chunks = sums.shape[0]
        zero = x.dtype.type(0)
        mean = np.empty(c, x.dtype)
        for k in range(c):
            mean[k] = channel_mean[k // per]
        for t in loop(chunks):
            s, p = sums[t], products[t]
            ps, pp = np.zeros(c, x.dtype), np.zeros(c, x.dtype)
            for k in range(c):
                s[k], p[k] = 0.0, 0.0
            start, end = jit.part(m, chunks, t)
            for i0 in range(start, end, ROWS):
                for i in range(i0, min(end, i0 + ROWS)):
                    grow, xrow, rrow = g[i], x[i], r[i]
                    for k in range(c):
                        gk = gate(grow[k], rrow[k], zero)
                        ps[k] += gk
                        pp[k] += gk * (xrow[k] - mean[k])
                add_runs(s, ps, p, pp)

    return kernel


def bn_grad_cl(gate, loop):
    """gx[i, k] = g[i, k] * a[k] + (x[i, k] - mean[k]) * b[k] + c[k] (``training``) or
    g[i, k] * a[k] (evaluation: x not read, so a NaN or infinite x leaves g * a, as in
    PyTorch), g gated by the result r. The coefficients (``gradient_affine``) and the
    parameter gradients gw = invstd * sum g (x - mean) and gb = sum g come from the
    chunks' partial sums (bn_grad_sums_cl) over each channel's ``per`` columns, in
    float64, then in x's dtype."""

    def kernel(g, x, r, weight, channel_mean, invstd, sums, products, gx, gw, gb, training, per):
        zero = x.dtype.type(0)
        m, c = x.shape
        a, b, cc = np.empty(c, x.dtype), np.empty(c, x.dtype), np.empty(c, x.dtype)
        mean = np.empty(c, x.dtype)
        for ch in range(c // per):
            total, total_x = 0.0, 0.0
            for k in range(ch * per, (ch + 1) * per):
                for t in range(sums.shape[0]):
                    total += sums[t, k]
                    total_x += products[t, k]
            inv = np.float64(invstd[ch])
            gb[ch], gw[ch] = total, total_x * inv
            coefficients = gradient_affine(weight[ch], inv, total, total_x, m * per, training)
            for k in range(ch * per, (ch + 1) * per):
                a[k], b[k], cc[k] = coefficients
                mean[k] = channel_mean[ch]
        for i in loop(m):
            grow, xrow, rrow, res = g[i], x[i], r[i], gx[i]
            if training:
                for k in range(c):
                    gk = gate(grow[k], rrow[k], zero)
                    res[k] = gk * a[k] + (xrow[k] - mean[k]) * b[k] + cc[k]
            else:
                for k in range(c):
                    res[k] = gate(grow[k], rrow[k], zero) * a[k]

    return kernel


# ---------------------------------------------------------------- layer and group norm
# Note [Norm statistics]: layer and group norm take each slice's mean and variance from
# one pass of float64 sums of (x - shift) and its square, the shift a value of the
# slice (its first: the variance then loses no digits to cancellation unless the
# values themselves spread far beyond their distance from it). The float32 terms
# convert to float64 as they are added (vectorized); the normalization and the
# gradients then run in the data's dtype. Group norm's channels-first groups are longer:
# there runs of RUN terms are summed in the data's dtype first (full vector width), then
# added in float64.
RUN = 256


def ln_forward(loop):
    """Per row of x (R, D): mean[i] and rstd[i] = 1 / sqrt(var + eps) (Note [Norm
    statistics]), then out = (x - mean) * rstd * weight + bias, the row still in cache.
    x - mean is taken as (x - shift) - (mean - shift): exact in the data's dtype where
    x is within a factor 2 of the shift, where mean rounded to it would cost up to half
    an ulp of the mean (large against the spread for data far from zero)."""

    def kernel(x, weight, bias, mean, rstd, out, eps):
        d = x.shape[1]
        for i in loop(x.shape[0]):
            row, res = x[i], out[i]
            shift = np.float64(row[0])
            s = 0.0
            q = 0.0
            for j in range(d):
                v = row[j] - shift
                s += v
                q += v * v
            m = s / d
            inv = 1.0 / math.sqrt(max(q / d - m * m, 0.0) + eps)
            mean[i], rstd[i] = shift + m, inv
            first, mu, a = row[0], x.dtype.type(m), x.dtype.type(inv)
            for j in range(d):
                res[j] = ((row[j] - first) - mu) * a * weight[j] + bias[j]

    return kernel


def ln_backward(loop):
    """Per row of g, x (R, D), with gw = g * weight and xhat = (x - mean) * rstd:
    gx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)); the column sums of g * xhat
    and g (the weight's and bias's gradients) into float64 partial sums, one row of
    ``weight_sums`` and ``bias_sums`` per chunk of rows (Note [Runs of rows]: 2048 x
    256 float32, Zen 3, 0.28-0.39 -> 0.19 ms on two threads, 0.39 -> 0.33 on one)."""

    def kernel(g, x, weight, mean, rstd, gx, weight_sums, bias_sums):
        r, d = x.shape
        chunks = weight_sums.shape[0]
        for t in loop(chunks):
            sw, sb = weight_sums[t], bias_sums[t]
            pw, pb = np.zeros(d, x.dtype), np.zeros(d, x.dtype)
            for j in range(d):
                sw[j], sb[j] = 0.0, 0.0
            start, end = jit.part(r, chunks, t)
            for i0 in range(start, end, ROWS):
                for i in range(i0, min(end, i0 + ROWS)):
                    grow, xrow, res = g[i], x[i], gx[i]
                    first, inv = xrow[0], x.dtype.type(rstd[i])
                    mu = x.dtype.type(mean[i] - first)
                    a = 0.0
                    b = 0.0
                    for j in range(d):
                        xhat = ((xrow[j] - first) - mu) * inv
                        gw = grow[j] * weight[j]
                        a += gw
                        b += gw * xhat
                        pw[j] += grow[j] * xhat
                        pb[j] += grow[j]
                    ca, cb = x.dtype.type(a / d), x.dtype.type(b / d)
                    for j in range(d):
                        xhat = ((xrow[j] - first) - mu) * inv
                        res[j] = inv * (grow[j] * weight[j] - ca - xhat * cb)
                add_runs(sw, pw, sb, pb)

    return kernel


def gn_forward_cf(loop):
    """Per (n, group) of x (N, C, S), whose C / G channels are contiguous: mean[n, g]
    and rstd[n, g] (Note [Norm statistics], shifted by the group's first value), then
    out = (x - mean) * rstd * weight[c] + bias[c] while the group is in cache (x - mean
    taken relative to the shift, as ln_forward)."""

    def kernel(x, weight, bias, groups, mean, rstd, out, eps):
        c, s = x.shape[1], x.shape[2]
        per = c // groups
        count = per * s
        for t in loop(x.shape[0] * groups):
            i, g = t // groups, t % groups
            channels = range(g * per, (g + 1) * per)
            first, zero = x[i, g * per, 0], x.dtype.type(0)
            a = 0.0
            q = 0.0
            for k in channels:
                row = x[i, k]
                for j0 in range(0, s, RUN):
                    pa, pq = zero, zero
                    for j in range(j0, min(s, j0 + RUN)):
                        v = row[j] - first
                        pa += v
                        pq += v * v
                    a += pa
                    q += pq
            m = a / count
            inv = 1.0 / math.sqrt(max(q / count - m * m, 0.0) + eps)
            mean[i, g], rstd[i, g] = first + m, inv
            mu = x.dtype.type(m)
            for k in channels:
                row, res = x[i, k], out[i, k]
                scale, offset = x.dtype.type(inv * weight[k]), bias[k]
                for j in range(s):
                    res[j] = ((row[j] - first) - mu) * scale + offset

    return kernel


def gn_backward_cf(loop):
    """Per (n, group) of g, x (N, C, S): the per-channel float64 sums total[n, c] of g
    and products[n, c] of g * (x - mean), then, while the group is in cache,
    gx = g * rstd * weight[c] + (x - mean) * q + r with the group's coefficients of
    group norm's gradient (gn_backward_cl's in the other layout)."""

    def kernel(g, x, weight, groups, mean, rstd, gx, total, products):
        c, s = x.shape[1], x.shape[2]
        per = c // groups
        count = per * s
        for t in loop(x.shape[0] * groups):
            i, gr = t // groups, t % groups
            channels = range(gr * per, (gr + 1) * per)
            first = x[i, gr * per, 0]
            mu, inv = x.dtype.type(mean[i, gr] - first), rstd[i, gr]
            weighted = 0.0
            weighted_products = 0.0
            for k in channels:
                grow, xrow = g[i, k], x[i, k]
                a = 0.0
                b = 0.0
                for j0 in range(0, s, RUN):
                    pa, pb = x.dtype.type(0), x.dtype.type(0)
                    for j in range(j0, min(s, j0 + RUN)):
                        pa += grow[j]
                        pb += grow[j] * ((xrow[j] - first) - mu)
                    a += pa
                    b += pb
                total[i, k], products[i, k] = a, b
                weighted += weight[k] * a
                weighted_products += weight[k] * b
            q = x.dtype.type(-inv * inv * inv * weighted_products / count)
            r = x.dtype.type(-inv * weighted / count)
            for k in channels:
                grow, xrow, res = g[i, k], x[i, k], gx[i, k]
                p = x.dtype.type(inv * weight[k])
                for j in range(s):
                    res[j] = grow[j] * p + ((xrow[j] - first) - mu) * q + r

    return kernel


def gn_forward_cl(loop):
    """Per sample n of channels-last x (N, S, C) (in L2 at the usual sizes): float64
    per-channel sums of x - shift and its square down the pixels (Note [Runs of rows];
    the shift each channel's first value), combined
    by group: sum (x - mean)^2 = second + 2 (shift - mean) first + S (shift - mean)^2
    over its channels; then out = (x - mean) * rstd * weight + bias, x - mean taken relative to
    the shift (as ln_forward)."""

    def kernel(x, weight, bias, groups, mean, rstd, out, eps):
        s, c = x.shape[1], x.shape[2]
        per = c // groups
        count = per * s
        for i in loop(x.shape[0]):
            shift = x[i, 0]
            first, second = np.zeros(c), np.zeros(c)
            run_first, run_second = np.zeros(c, x.dtype), np.zeros(c, x.dtype)
            for j0 in range(0, s, ROWS):
                for j in range(j0, min(s, j0 + ROWS)):
                    row = x[i, j]
                    for k in range(c):
                        d = row[k] - shift[k]
                        run_first[k] += d
                        run_second[k] += d * d
                add_runs(first, run_first, second, run_second)
            centre, scale = np.empty(c, x.dtype), np.empty(c, x.dtype)
            for g in range(groups):
                channels = range(g * per, (g + 1) * per)
                total = 0.0
                for k in channels:
                    total += first[k] + s * np.float64(shift[k])
                m = total / count
                spread = 0.0
                for k in channels:
                    dev = shift[k] - m
                    spread += second[k] + dev * (2.0 * first[k] + s * dev)
                inv = 1.0 / math.sqrt(max(spread / count, 0.0) + eps)
                mean[i, g], rstd[i, g] = m, inv
                for k in channels:
                    centre[k], scale[k] = m - shift[k], inv * weight[k]
            for j in range(s):
                row, res = x[i, j], out[i, j]
                for k in range(c):
                    res[k] = ((row[k] - shift[k]) - centre[k]) * scale[k] + bias[k]

    return kernel


def gn_backward_cl(loop):
    """Per sample n of channels-last g, x (N, S, C): the per-channel float64 sums
    total[n, c] of g and products[n, c] of g * (x - mean) (Note [Runs of rows]), then
    gx = g * rstd * weight + (x - mean) * q + r with the group's coefficients (as
    gn_backward_cf's)."""

    def kernel(g, x, weight, groups, mean, rstd, gx, total, products):
        s, c = x.shape[1], x.shape[2]
        per = c // groups
        count = per * s
        for i in loop(x.shape[0]):
            shift, sums, sums_x = x[i, 0], total[i], products[i]
            centre = np.empty(c, x.dtype)
            run_g, run_x = np.zeros(c, x.dtype), np.zeros(c, x.dtype)
            for k in range(c):
                centre[k], sums[k], sums_x[k] = mean[i, k // per] - shift[k], 0.0, 0.0
            for j0 in range(0, s, ROWS):
                for j in range(j0, min(s, j0 + ROWS)):
                    grow, xrow = g[i, j], x[i, j]
                    for k in range(c):
                        run_g[k] += grow[k]
                        run_x[k] += grow[k] * ((xrow[k] - shift[k]) - centre[k])
                add_runs(sums, run_g, sums_x, run_x)
            p, q, r = np.empty(c, x.dtype), np.empty(c, x.dtype), np.empty(c, x.dtype)
            for gr in range(groups):
                channels = range(gr * per, (gr + 1) * per)
                weighted = 0.0
                weighted_products = 0.0
                for k in channels:
                    weighted += weight[k] * sums[k]
                    weighted_products += weight[k] * sums_x[k]
                inv = rstd[i, gr]
                for k in channels:
                    p[k] = inv * weight[k]
                    q[k] = -inv * inv * inv * weighted_products / count
                    r[k] = -inv * weighted / count
            for j in range(s):
                grow, xrow, res = g[i, j], x[i, j], gx[i, j]
                for k in range(c):
                    res[k] = grow[k] * p[k] + ((xrow[k] - shift[k]) - centre[k]) * q[k] + r[k]

    return kernel


def _signature(template, dtype):
    """The argument types of ``template``'s kernel for data of ``dtype``: made only when
    it compiles (making Numba types took ~50 us a call, serially between the parallel
    kernels)."""
    t, f64, f64_2 = jit.types, jit.array(np.float64), jit.array(np.float64, 2)
    vec, a2, a3 = (jit.array(dtype, d) for d in (1, 2, 3))
    lrn_forward = (t.int64, t.float64, t.float64, t.float64)
    lrn_backward = (t.int64, t.float64, t.float64)
    return {
        bn_forward_cf: (a3, vec, vec, f64, f64, a3, t.boolean, t.float64),
        bn_statistics_cl: (a2, f64_2, f64_2, f64, f64, t.int64),
        normalize_cl: (a2, vec, vec, f64, f64, t.float64, a2, vec, t.int64),
        bn_backward_cf: (a3, a3, a3, vec, f64, f64, a3, f64, f64, t.boolean),
        bn_grad_sums_cl: (a2, a2, a2, vec, f64_2, f64_2, t.int64),
        bn_grad_cl: (a2, a2, a2, vec, vec, vec, f64_2, f64_2, a2, vec, vec, t.boolean, t.int64),
        ln_forward: (a2, vec, vec, f64, f64, a2, t.float64),
        ln_backward: (a2, a2, vec, f64, f64, a2, f64_2, f64_2),
        gn_forward_cf: (a3, vec, vec, t.int64, f64_2, f64_2, a3, t.float64),
        gn_backward_cf: (a3, a3, vec, t.int64, f64_2, f64_2, a3, f64_2, f64_2),
        gn_forward_cl: (a3, vec, vec, t.int64, f64_2, f64_2, a3, t.float64),
        gn_backward_cl: (a3, a3, vec, t.int64, f64_2, f64_2, a3, f64_2, f64_2),
        lrn_forward_cf: (a3, a3, a3, *lrn_forward),
        lrn_backward_cf: (a3, a3, a3, a3, a3, *lrn_backward),
        lrn_forward_cl: (t.UniTuple(a2, 1), t.UniTuple(a2, 2), a2, a2, *lrn_forward),
        lrn_backward_cl: (t.UniTuple(a2, 4), t.UniTuple(a2, 1), a2, a2, *lrn_forward),
    }[template]


def _params(t, c, fill, dtype):
    return np.full(c, fill, dtype) if t is None else np.ascontiguousarray(t._data)


def native_batch_norm(
    ks, input, weight, bias, running_mean, running_var, training, momentum, eps, relu
):
    data = input._data
    activation = _ACTIVATION[relu]
    x, channels_last = channel_view(data)
    c = data.shape[1]
    count = data.size // c if c else 0
    w, b = _params(weight, c, 1, data.dtype), _params(bias, c, 0, data.dtype)
    if training and not count:  # an empty batch (or no channels): PyTorch's empty result,
        out = from_channel_view(np.empty_like(x), data, channels_last)  # stats untouched
        stat = np.zeros(c, data.dtype)
        return from_array(out), from_array(stat), from_array(stat + 1)
    if training:
        mean, var = np.empty(c), np.empty(c)
    else:
        mean = running_mean._data.astype(np.float64)
        var = running_var._data.astype(np.float64)
    out, invstd = np.empty_like(x), np.empty(c, data.dtype)
    if _by_channels(x, channels_last):
        forward = _entry(bn_forward_cf, (activation,), data.dtype, x.size)
        forward(x, w, b, mean, var, out, training, eps)
        invstd[:] = 1.0 / np.sqrt(var + eps)
    else:
        rows, per = _row_view(x, channels_last)
        if training:
            chunks = _threads() if x.size >= _parallel_min else 1
            sums, squares = np.empty((chunks, rows.shape[1])), np.empty((chunks, rows.shape[1]))
            statistics = _entry(bn_statistics_cl, (), data.dtype, x.size)
            statistics(rows, sums, squares, mean, var, per)
        normalize = _entry(normalize_cl, (activation,), data.dtype, x.size)
        normalize(rows, w, b, mean, var, eps, out.reshape(rows.shape), invstd, per)
    if training and running_mean is not None:
        _update_running(running_mean, mean, momentum)
    if training and running_var is not None:
        _update_running(running_var, var * count / max(count - 1, 1), momentum)
    return (
        from_array(from_channel_view(out, data, channels_last)),
        from_array(mean.astype(data.dtype)),
        from_array(invstd),
    )


# Note [Batch norm of small planes]: channels-first batch norm sums each channel's N
# rows of S pixels, rows of fewer than SMALL_PLANE pixels too short to vectorize: each
# sum waits on the last. Those run the channels-last kernels on x as (N, C S) rows,
# every column one pixel of one channel (``per`` = S columns a channel): the columns'
# float64 sums are pooled per channel (the variance: the columns' mean variance plus
# the variance of their means, N values each) and the channel's coefficients used in
# each of its columns. MobileNet v2's planes, batch 32, float32, Zen 3, us, channel by
# channel / as rows (PyTorch), forward and backward of a training step: one thread,
# 960 x 2 x 2 428 / 117 (453) and 1003 / 116 (1829), 384 x 4 x 4 270 / 165 (452) and
# 526 / 168 (208), but 192 x 8 x 8 218 / 281 (850) and 337 / 312 (231); two threads,
# 960 x 2 x 2 427 / 115 and 1062 / 113, 384 x 4 x 4 151 / 168 and 175 / 176.
SMALL_PLANE = 32


def _by_channels(x, channels_last):
    """Whether batch norm of channel view x runs channel by channel (Note [Batch norm of
    small planes]); so do empty planes, which make no columns."""
    return not channels_last and (x.shape[2] >= SMALL_PLANE or x.shape[2] == 0)


def _row_view(x, channels_last):
    """(rows, columns per channel): the (M, C) channel view itself, or the (N, C, S)
    one as (N, C S) rows (Note [Batch norm of small planes])."""
    if channels_last:
        return x, 1
    n, c, s = x.shape
    return x.reshape(n, c * s), s


def _update_running(stat, batch, momentum):
    """running = (1 - momentum) * running + momentum * batch, in place."""
    r = stat._data
    r *= 1.0 - momentum
    r += (momentum * batch).astype(r.dtype)
    bump_version(stat)  # Note [Version counters]: the statistic changed in place


def native_batch_norm_backward(ks, grad, input, weight, mean, invstd, training, result):
    data = input._data
    x, channels_last = channel_view(data)
    g = _same_view(grad._data, data, channels_last)
    gate = _GATE[result is not None]
    # without a result the kernels take g in its place and never read it (ungated)
    r = g if result is None else _same_view(result._data, data, channels_last)
    c = data.shape[1]
    count = data.size // c if c else 0
    w = _params(weight, c, 1, data.dtype)
    gx = np.empty_like(x)
    if not count:  # an empty batch: an empty input gradient, zero parameter gradients
        gw, gb = (from_array(np.zeros(c, data.dtype)) for _ in range(2))
        return from_array(from_channel_view(gx, data, channels_last)), gw, gb
    m, inv = np.ascontiguousarray(mean._data), np.ascontiguousarray(invstd._data)
    if _by_channels(x, channels_last):
        sums_w, sums_b = np.empty(c), np.empty(c)
        backward = _entry(bn_backward_cf, (gate,), data.dtype, x.size)
        backward(
            g, x, r, w, m.astype(np.float64), inv.astype(np.float64), gx, sums_w, sums_b, training
        )
        gw, gb = sums_w.astype(data.dtype), sums_b.astype(data.dtype)
    else:
        rows, per = _row_view(x, channels_last)
        g, r = g.reshape(rows.shape), r.reshape(rows.shape)
        chunks = _threads() if x.size >= _parallel_min else 1
        sums, products = np.empty((chunks, rows.shape[1])), np.empty((chunks, rows.shape[1]))
        _entry(bn_grad_sums_cl, (gate,), data.dtype, x.size)(g, rows, r, m, sums, products, per)
        gw, gb = np.empty(c, data.dtype), np.empty(c, data.dtype)
        grad_input = _entry(bn_grad_cl, (gate,), data.dtype, x.size)
        gx_rows = gx.reshape(rows.shape)
        grad_input(g, rows, r, w, m, inv, sums, products, gx_rows, gw, gb, training, per)
    return from_array(from_channel_view(gx, data, channels_last)), from_array(gw), from_array(gb)


def _rows(data, k):
    """data (C-contiguous) as (rows, product of the last k axes)."""
    return data.reshape(
        math.prod(data.shape[: data.ndim - k]), math.prod(data.shape[data.ndim - k :])
    )


def native_layer_norm(ks, input, normalized_shape, weight, bias, eps):
    data = np.ascontiguousarray(input._data)
    k = len(normalized_shape)
    x = _rows(data, k)
    stats_shape = data.shape[: data.ndim - k] + (1,) * k
    w = _params(weight, x.shape[1], 1, data.dtype).reshape(-1)
    b = _params(bias, x.shape[1], 0, data.dtype).reshape(-1)
    out = np.empty_like(x)
    mean, rstd = np.zeros(x.shape[0]), np.full(x.shape[0], np.nan)
    if x.size:  # else PyTorch's: empty slices have mean 0 and rstd NaN
        _entry(ln_forward, (), data.dtype, x.size)(x, w, b, mean, rstd, out, eps)
    return (
        from_array(out.reshape(data.shape)),
        from_array(mean.astype(data.dtype).reshape(stats_shape)),
        from_array(rstd.astype(data.dtype).reshape(stats_shape)),
    )


def native_layer_norm_backward(ks, grad, input, normalized_shape, mean, rstd, weight):
    data = np.ascontiguousarray(input._data)
    x = _rows(data, len(normalized_shape))
    g = _rows(np.ascontiguousarray(grad._data), len(normalized_shape))
    d = x.shape[1]
    w = _params(weight, d, 1, data.dtype).reshape(-1)
    gx = np.empty_like(x)
    chunks = _threads() if x.size >= _parallel_min else 1
    weight_sums, bias_sums = np.zeros((chunks, d)), np.zeros((chunks, d))
    if x.size:
        m = mean._data.astype(np.float64).reshape(-1)
        inv = rstd._data.astype(np.float64).reshape(-1)
        entry = _entry(ln_backward, (), data.dtype, x.size)
        entry(g, x, w, m, inv, gx, weight_sums, bias_sums)
    shape = tuple(normalized_shape)
    return (
        from_array(gx.reshape(data.shape)),
        from_array(weight_sums.sum(axis=0).astype(data.dtype).reshape(shape)),
        from_array(bias_sums.sum(axis=0).astype(data.dtype).reshape(shape)),
    )


def _group_view(data):
    """(x, channels_last): x (N, C, S) channels-first or (N, S, C) channels-last
    (Note [Channel views])."""
    x, channels_last = channel_view(data)
    if channels_last:
        return x.reshape(data.shape[0], -1, data.shape[1]), True
    return x, False


def _group_result(a, like, channels_last):
    """A kernel's result in _group_view's shape as an array shaped and laid out like
    ``like``."""
    return from_channel_view(
        a.reshape(-1, like.shape[1]) if channels_last else a, like, channels_last
    )


def _per_channel(stat, groups, c):
    """A (N, groups) statistic repeated for each channel of its group: (N, C)."""
    return np.repeat(stat, c // groups, axis=1)


def native_group_norm(ks, input, weight, bias, num_groups, eps):
    data = input._data
    n, c = data.shape[:2]
    x, channels_last = _group_view(data)
    out = np.empty_like(x)
    mean, rstd = np.zeros((n, num_groups)), np.full((n, num_groups), np.nan)
    w, b = _params(weight, c, 1, data.dtype), _params(bias, c, 0, data.dtype)
    if x.size:  # else PyTorch's: empty groups have mean 0 and rstd NaN
        template = gn_forward_cl if channels_last else gn_forward_cf
        _entry(template, (), data.dtype, x.size)(x, w, b, num_groups, mean, rstd, out, eps)
    return (
        from_array(_group_result(out, data, channels_last)),
        from_array(mean.astype(data.dtype)),
        from_array(rstd.astype(data.dtype)),
    )


def native_group_norm_backward(ks, grad, input, mean, rstd, weight, num_groups):
    data = input._data
    n, c = data.shape[:2]
    x, channels_last = _group_view(data)
    g = _same_view(grad._data, data, channels_last).reshape(x.shape)
    gx = np.empty_like(x)
    m, inv = mean._data.astype(np.float64), rstd._data.astype(np.float64)
    w = _params(weight, c, 1, data.dtype)
    total, products = np.zeros((n, c)), np.zeros((n, c))  # sum g, sum g (x - mean)
    if x.size:
        template = gn_backward_cl if channels_last else gn_backward_cf
        _entry(template, (), data.dtype, x.size)(g, x, w, num_groups, m, inv, gx, total, products)
    return (
        from_array(_group_result(gx, data, channels_last)),
        from_array((products * _per_channel(inv, num_groups, c)).sum(axis=0).astype(data.dtype)),
        from_array(total.sum(axis=0).astype(data.dtype)),
    )


# ---------------------------------------------------------------- local response norm


@jitable
def three_quarters(s, beta):
    return 1.0 / (math.sqrt(s) * math.sqrt(math.sqrt(s)))


@jitable
def power(s, beta):
    return s**-beta


def lrn_forward_cf(inv_pow, loop):
    """x (N, C, S): scale[n, c] = k + alpha / size * sum of x[n, j]**2 over the window j
    in [c - size // 2, c + (size - 1) // 2] (PyTorch's), out = x * scale**-beta."""

    def kernel(x, out, scale, size, alpha, beta, k):
        n, c, s = x.shape
        before, after = size // 2, (size - 1) // 2
        coef = alpha / size
        for i in loop(n):
            for ch in range(c):
                acc = scale[i, ch]
                for j in range(s):
                    acc[j] = 0.0
                for other in range(max(0, ch - before), min(c, ch + after + 1)):
                    row = x[i, other]
                    for j in range(s):
                        acc[j] += row[j] * row[j]
                xrow, res = x[i, ch], out[i, ch]
                for j in range(s):
                    sc = k + coef * acc[j]
                    acc[j] = sc
                    res[j] = xrow[j] * inv_pow(sc, beta)

    return kernel


# Note [Channels-last LRN]: channels-last, the window runs along each pixel's row of C
# channels, and loops over rows of a few dozen elements ran mostly scalar (LLVM's vector
# loop takes 64 floats a turn, so AlexNet's 48 channels fell to its scalar remainder).
# So the kernels copy LRN_PIXELS rows at a time (their squares, or backward's
# grad * result / scale) into a buffer whose rows are zero-padded to C + size - 1, the
# window's reach on either side, and sum the window over the whole buffer as one flat
# row (``window_sums``: ``size`` long vectorized passes; the sums at padding positions
# are not used). The padding adds zeros, so every sum is the channels-first kernel's,
# bit for bit: the same additions in the same order. Measured one thread, float32,
# AlexNet's two LRNs, 32 x 48 x 15 x 15 / 32 x 128 x 7 x 7, ms: forward 1.78 -> 0.63 /
# 0.99 -> 0.36 (channels-first 0.64 / 0.44), backward 2.41 -> 0.52 / 1.34 -> 0.30; at
# batch 1, forward 55 -> 20 / 31 -> 12 us. Blocks of 16 to 64 pixels were as fast;
# 128 and more, slower.
LRN_PIXELS = 32


@jitable
def window_sums(padded, total, size, sums):
    """sums[j] = padded[j] + padded[j + 1] + ... + padded[j + size - 1] for j < total,
    added in that order from zero (Note [Channels-last LRN])."""
    for j in range(total):
        sums[j] = 0.0
    for d in range(size):
        run = padded[d : d + total]
        for j in range(total):
            sums[j] += run[j]


def lrn_cl(inv_pow, backward, loop):
    """Either channels-last kernel over pixel rows (M, C), a block of rows at a time in
    part p's padded[p] and sums[p] (Note [Channels-last LRN]): forward, ``inputs`` (x,)
    and ``outputs`` (out, scale) as lrn_forward_cf's; backward, (g, x, y, scale) and
    (gx,) as lrn_backward_cf's. The window of backward's sums is forward's transposed:
    its rows' padding before them is forward's after."""

    def kernel(inputs, outputs, padded, sums, size, alpha, beta, k):
        m, c = inputs[0].shape
        before, after = size // 2, (size - 1) // 2
        lead, pitch, parts = after if backward else before, c + size - 1, padded.shape[0]
        coef = 2.0 * alpha * beta / size if backward else alpha / size
        for p in loop(parts):
            first, last = jit.part(-(-m // LRN_PIXELS), parts, p)
            for r0 in range(first * LRN_PIXELS, min(m, last * LRN_PIXELS), LRN_PIXELS):
                rows = min(m, r0 + LRN_PIXELS) - r0
                for r in range(rows):
                    terms = padded[p, r * pitch + lead : r * pitch + lead + c]
                    if backward:  # g y / scale
                        grow, yrow, srow = inputs[0][r0 + r], inputs[2][r0 + r], inputs[3][r0 + r]
                        for ch in range(c):
                            terms[ch] = grow[ch] * yrow[ch] / srow[ch]
                    else:  # x**2
                        row = inputs[0][r0 + r]
                        for ch in range(c):
                            terms[ch] = row[ch] * row[ch]
                window_sums(padded[p], rows * pitch, size, sums[p])
                for r in range(rows):
                    window = sums[p, r * pitch : r * pitch + c]
                    if backward:
                        grow, xrow, srow = inputs[0][r0 + r], inputs[1][r0 + r], inputs[3][r0 + r]
                        res = outputs[0][r0 + r]
                        for ch in range(c):
                            own = grow[ch] * inv_pow(srow[ch], beta)
                            res[ch] = own - coef * xrow[ch] * window[ch]
                    else:
                        row, res, acc = inputs[0][r0 + r], outputs[0][r0 + r], outputs[1][r0 + r]
                        for ch in range(c):
                            sc = k + coef * window[ch]
                            acc[ch] = sc
                            res[ch] = row[ch] * inv_pow(sc, beta)

    return kernel


def lrn_forward_cl(inv_pow, loop):
    return lrn_cl(inv_pow, False, loop)


def lrn_backward_cl(inv_pow, loop):
    return lrn_cl(inv_pow, True, loop)


def lrn_backward_cf(inv_pow, loop):
    """gx_i = g_i scale_i**-beta - 2 alpha beta / size * x_i * sum over the channels c
    whose window holds i of g_c y_c / scale_c (the window's transpose)."""

    def kernel(g, x, y, scale, gx, size, alpha, beta):
        n, c, s = x.shape
        before, after = size // 2, (size - 1) // 2
        coef = 2.0 * alpha * beta / size
        for i in loop(n):
            for ch in range(c):
                acc = gx[i, ch]
                for j in range(s):
                    acc[j] = 0.0
                for other in range(max(0, ch - after), min(c, ch + before + 1)):
                    grow, yrow, srow = g[i, other], y[i, other], scale[i, other]
                    for j in range(s):
                        acc[j] += grow[j] * yrow[j] / srow[j]
                grow, xrow, srow = g[i, ch], x[i, ch], scale[i, ch]
                for j in range(s):
                    acc[j] = grow[j] * inv_pow(srow[j], beta) - coef * xrow[j] * acc[j]

    return kernel


def _lrn_cl(template, inputs, outputs, size, alpha, beta, k):
    """Run a channels-last kernel (``lrn_cl``) with its zero-padded blocks and their
    window sums, one of each per part (Note [Channels-last LRN])."""
    x = inputs[0]
    m, c = x.shape
    entry = _entry(template, (_lrn_power(beta),), x.dtype, x.size, fastmath=False)
    parts = threads.parallel_parts(-(-m // LRN_PIXELS)) if x.size >= _parallel_min else 1
    pitch = c + size - 1
    padded = np.zeros((parts, LRN_PIXELS * pitch + size - 1), x.dtype)
    sums = np.empty((parts, LRN_PIXELS * pitch), x.dtype)
    entry(inputs, outputs, padded, sums, size, alpha, beta, k)


def _lrn_power(beta):
    return three_quarters if beta == 0.75 else power


def native_local_response_norm(ks, input, size, alpha, beta, k):
    data = input._data
    x, channels_last = channel_view(data)
    out, scale = np.empty_like(x), np.empty_like(x)
    if channels_last:
        _lrn_cl(lrn_forward_cl, (x,), (out, scale), size, alpha, beta, k)
    else:
        entry = _entry(lrn_forward_cf, (_lrn_power(beta),), data.dtype, x.size, fastmath=False)
        entry(x, out, scale, size, alpha, beta, k)
    return (
        from_array(from_channel_view(out, data, channels_last)),
        from_array(from_channel_view(scale, data, channels_last)),
    )


def local_response_norm_backward(ks, grad, input, result, scale, size, alpha, beta, k):
    data = input._data
    x, channels_last = channel_view(data)
    g, y, s = (_same_view(t._data, data, channels_last) for t in (grad, result, scale))
    gx = np.empty_like(x)
    if channels_last:
        _lrn_cl(lrn_backward_cl, (g, x, y, s), (gx,), size, alpha, beta, k)
    else:
        entry = _entry(lrn_backward_cf, (_lrn_power(beta),), data.dtype, x.size, fastmath=False)
        entry(g, x, y, s, gx, size, alpha, beta)
    return from_array(from_channel_view(gx, data, channels_last))


KERNELS = {
    "native_batch_norm": native_batch_norm,
    "native_batch_norm_backward": native_batch_norm_backward,
    "native_layer_norm": native_layer_norm,
    "native_layer_norm_backward": native_layer_norm_backward,
    "native_group_norm": native_group_norm,
    "native_group_norm_backward": native_group_norm_backward,
    "native_local_response_norm": native_local_response_norm,
    "local_response_norm_backward": local_response_norm_backward,
}


def register(registry):
    for name, fn in KERNELS.items():
        registry.register(name, "cpu", fn)
