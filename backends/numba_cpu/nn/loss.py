"""Losses: nll_loss and its gradient, Numba passes over the targets; cross_entropy_loss
and its gradient, one pass per row (Note [One-pass cross entropy]); mse_loss,
smooth_l1_loss and binary_cross_entropy_with_logits, one Numba pass that computes each
element's loss and stores or sums it. Their gradients are formulas of dispatched
operators (autograd/derivatives.py)."""

import functools
import math
import os

import numpy as np

from lamina.backends import jit, threads
from lamina.backends.jit import jitable
from lamina.dispatch import dtypes as D
from lamina.dispatch import meta
from lamina.dispatch.tensor import from_array, from_flat

from .. import kernels as K
from .activation import _SUM_BLOCK, _exp_and_cast, softmax_finish

# Note [Kernel cache]: these kernels call kernels.py's vector math, so they close over
# that file's stamp, as activation.py's do
_stat = os.stat(K.__file__)
_MATH_STAMP = (_stat.st_mtime_ns, _stat.st_size)
_parallel_min = float("inf")  # Note [Parallel threshold] (lamina.backends.threads)


def _set_threshold(threshold):
    global _parallel_min
    _parallel_min = threshold


threads.on_change(_set_threshold)


def _pick(x, t, weight, weighted, ignore_index, losses):
    """losses[n, r] = -x[n, t[n, r], r] * weight[t[n, r]] for x (N, C, R) and targets t
    (N, R), 0 where the target is ignore_index; returns the losses' float64 sum, the
    weights' sum and the flat index of the first target outside [0, C) (-1 if none)."""
    classes = x.shape[1]
    total = counted = 0.0
    for n in range(t.shape[0]):
        for r in range(t.shape[1]):
            k = t[n, r]
            if k == ignore_index:
                losses[n, r] = 0
                continue
            if k < 0 or k >= classes:
                return total, counted, n * t.shape[1] + r
            w = weight[k] if weighted else 1.0
            losses[n, r] = -x[n, k, r] * w
            total += losses[n, r]
            counted += w
    return total, counted, -1


def nll_loss(ks, input, target, weight, ignore_index, reduction):
    """One pass over the targets (a Numba loop: the gather, its weights and the checks
    in NumPy took ~15 calls, 15 us on any size)."""
    x, shape = input._data, input._shape
    if len(shape) == 2:  # the common case: (N, C) log-probabilities, (N,) targets
        rows, classes, positions = shape[0], shape[1], 1
    elif len(shape) == 1:  # one unbatched sample: (C,) log-probabilities, a 0-d target
        rows, classes, positions = 1, shape[0], 1
    else:  # (N, C, d1, ...): targets (N, d1, ...)
        rows, classes, positions = shape[0], shape[1], math.prod(shape[2:])
    x = x.reshape(rows, classes, positions)
    t = target._flat  # int64 (the check converts other integers)
    t = (np.ascontiguousarray(target._data) if t is None else t).reshape(rows, positions)
    kernel, no_weight = _pick_kernel(x.dtype)
    w = no_weight if weight is None else weight._data
    losses = np.empty(t.shape, x.dtype)
    total, counted, bad = kernel(x, t, w, weight is not None, ignore_index, losses)
    if bad >= 0:
        raise ValueError(
            f"nll_loss: target values must be class indices in [0, {classes}) (or ignore_index="
            f"{ignore_index}), got {t.reshape(-1)[bad]}"
        )
    if reduction == "none":
        return from_flat(losses.reshape(-1), target._shape, input._dtype)
    if reduction == "mean":  # everything ignored: NaN, as in PyTorch
        total = total / counted if counted else math.nan
    return from_array(np.asarray(total, x.dtype))


@functools.cache  # a C-level lookup on the hot path, before jit.cached's Python one
def _pick_kernel(dtype):
    """The kernel for dtype, and the empty weight it reads nothing from (unweighted)."""
    return jit.cached((_pick, dtype), lambda: _compile_pick(dtype)), np.empty(0, dtype)


def _compile_pick(dtype):
    x, w = jit.array(dtype, 3, "A"), jit.array(dtype, 1, "A")
    t, losses = jit.array(np.int64, 2), jit.array(dtype, 2)
    f64 = jit.types.float64
    sig = jit.types.Tuple((f64, f64, jit.types.int64))(
        x, t, w, jit.types.boolean, jit.types.int64, losses
    )
    return jit.compile_kernel(_pick, sig)


# Note [One-pass cross entropy]: cross_entropy's common case (cross_entropy_loss) runs
# log_softmax's row arithmetic (log_softmax_shift: Note [Softmax kernels]'s maximum,
# blocked sum of exp(x - max) in the data's dtype, and the shift softmax_finish gives) on
# each counted row but stores nothing: only the target's log-probability, row[target] -
# shift, rounded to the dtype as the row kernel rounds it, is added to a float64 total,
# as nll_loss adds it. So the mean equals log_softmax then nll_loss bit for bit, in one
# pass with no (N, C) intermediate. Its gradient (cross_entropy_loss_backward) is
# log_softmax, nll_loss_backward and log_softmax_backward in one pass per row, with
# their roundings: nll_loss_backward's coefficient c = -grad * (1 / count) in float64
# (mean_coefficient), rounded to the dtype, and log_softmax_backward's onehot(target) *
# c - exp(log-probability) * c of each element; an ignored row gets c = 0 (0, or NaN
# where its log-probabilities are NaN, as theirs). So it equals those three operators
# bit for bit on dense rows; on a strided view their log_softmax sums columns in
# float64 instead (Note [Softmax kernels]), while this copies the rows: within 20 eps
# of c (tests/test_nn.py). Nothing of (N, C) is stored but the gradient.


@jitable(inline="always", **jit.CALLEE)  # a call per row: 25% of 128 x 10's forward
def log_softmax_shift(row, exp, cast):
    """What log_softmax subtracts from each element of row (Note [Softmax kernels])."""
    m = K.extreme(row, row[0], True)
    s = 0.0
    for b in range(0, row.shape[0], _SUM_BLOCK):
        block = row[b : b + _SUM_BLOCK]
        part = cast(0.0)
        for j in range(block.shape[0]):
            part += exp(block[j] - m)
        s += part
    return softmax_finish(s, m, True, cast)


# flags of its own (Numba gives a function without them its caller's; an empty set
# reads as none), so that the kernel's reassociation cannot make it -grad / counted
@jitable(fastmath=frozenset({"contract"}), **jit.CALLEE)
def mean_coefficient(grad, counted):
    """nll_loss_backward's -grad * (1 / counted), rounded as it rounds it (1 / 0 where
    nothing counts: no row reads it)."""
    return -grad * (1.0 / counted)


def cross_entropy_rows(exp, cast, stamp=_MATH_STAMP):
    def kernel(x, t, ignore_index):
        """The float64 sum of -log_softmax(x)[n, t[n]] over targets other than
        ignore_index, their count, and the first target outside [0, C) (-1 if none)."""
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        classes = x.shape[1]
        total = counted = 0.0
        for n in range(t.shape[0]):
            k = t[n]
            if k == ignore_index:
                continue
            if k < 0 or k >= classes:  # before the row is read: C may be 0
                return total, counted, n
            row = x[n]
            total -= row[k] - log_softmax_shift(row, exp, cast)
            counted += 1.0
        return total, counted, -1

    return kernel


def cross_entropy_backward_rows(exp, cast, loop, stamp=_MATH_STAMP):
    def kernel(x, t, ignore_index, grad, out):
        """out = the gradient of the mean loss (Note [One-pass cross entropy]); returns
        the first target outside [0, C) (-1 if none), checked before anything is read."""
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        classes = x.shape[1]
        counted = 0.0
        for n in range(t.shape[0]):
            k = t[n]
            if k != ignore_index:
                if k < 0 or k >= classes:
                    return n
                counted += 1.0
        if classes == 0:  # no row to read
            return -1
        zero = cast(0.0)
        coefficient = cast(mean_coefficient(grad, counted))
        for n in loop(t.shape[0]):
            k, row, res = t[n], x[n], out[n]
            c = zero if k == ignore_index else coefficient
            f = log_softmax_shift(row, exp, cast)
            for j in range(classes):  # no branch on j == k here: 30% faster rows
                res[j] = zero - exp(row[j] - f) * c
            if k != ignore_index:
                res[k] = c - exp(row[k] - f) * c
        return -1

    return kernel


def cross_entropy_loss(ks, input, target, ignore_index):
    """Note [One-pass cross entropy]."""
    x = np.ascontiguousarray(input._data)
    t = np.ascontiguousarray(target._data)

    def build():
        exp, cast = _exp_and_cast(x.dtype)
        f64 = jit.types.float64
        sig = jit.types.Tuple((f64, f64, jit.types.int64))(
            jit.array(x.dtype, 2), jit.array(np.int64, 1), jit.types.int64
        )
        return jit.compile_kernel(cross_entropy_rows(exp, cast), sig, fastmath=jit.REASSOCIATE)

    total, counted, bad = jit.cached((cross_entropy_rows, x.dtype), build)(x, t, ignore_index)
    if bad >= 0:
        _bad_target("cross_entropy", x.shape[1], ignore_index, t[bad])
    return from_array(np.asarray(total / counted if counted else math.nan, x.dtype))


def cross_entropy_loss_backward(ks, grad, input, target, ignore_index):
    """Note [One-pass cross entropy]."""
    shape = input._shape
    if (
        len(shape) != 2
        or target._shape != shape[:1]
        or target._dtype is not D.int64
        or (grad._shape or grad._dtype is not input._dtype)
    ):  # internal callers do not run the operator's check: the kernel reads by these shapes
        grad, input, target, ignore_index = meta.cross_entropy_loss_backward(
            grad, input, target, ignore_index
        )
    x = np.ascontiguousarray(input._data)
    t = np.ascontiguousarray(target._data)
    out = np.empty_like(x)
    kernel = _backward_rows_kernel(x.dtype, x.size >= _parallel_min and x.shape[0] > 1)
    bad = kernel(x, t, ignore_index, float(grad._data), out)
    if bad >= 0:
        _bad_target("cross_entropy_loss_backward", x.shape[1], ignore_index, t[bad])
    return from_array(out)


@functools.cache  # a C-level lookup on the hot path, before jit.cached's Python one
def _backward_rows_kernel(dtype, parallel):
    loop = jit.prange if parallel else range

    def build():
        exp, cast = _exp_and_cast(dtype)
        x = jit.array(dtype, 2)
        sig = jit.types.int64(x, jit.array(np.int64, 1), jit.types.int64, jit.types.float64, x)
        kernel = cross_entropy_backward_rows(exp, cast, loop)
        return jit.compile_kernel(kernel, sig, parallel=parallel, fastmath=jit.REASSOCIATE)

    return jit.cached((cross_entropy_backward_rows, dtype, loop), build)


def _bad_target(fn, classes, ignore_index, value):
    raise ValueError(
        f"{fn}: target values must be class indices in [0, {classes}) (or "
        f"ignore_index={ignore_index}), got {value}"
    )


# ---------------------------------------------------------------- fused pointwise losses
# One scalar function per loss, of (input, target, parameter), as the activations'; the
# templates store each element's loss or add them up in float64. They live here, beside
# the scalar functions, for Numba's cache (Note [Kernel cache]).


@jitable
def squared_error(x, t, unused):
    d = x - t
    return d * d


@jitable
def smooth_l1(x, t, beta):
    d = abs(x - t)  # PyTorch's form; beta = 0 leaves |d| (the first branch never runs)
    return type(x)(0.5) * d * d / beta if d < beta else d - type(x)(0.5) * beta


@jitable
def smooth_l1_slope(x, t, beta_scale):
    # PyTorch's branches, but 0 at d = 0 when beta is 0 (l1's sign(0)); NaN stays NaN
    beta, scale = beta_scale
    d = x - t
    if d >= beta and d > 0:
        return scale
    if d <= -beta and d < 0:
        return -scale
    return d / beta * scale if beta > 0 else d * scale


@jitable(inline="always", **jit.CALLEE)
def bce_with_logits(x, t, unused):
    c = type(x)
    e = K.vector_exp(-abs(x))
    u = c(1.0) + e
    # log1p(e) to full precision from log(1 + e) (Goldberg's correction): log(u)
    # rounds away e's last bits, (u - 1) / e says by how much
    log1p_e = e if u == c(1.0) else K.vector_log(u) * (e / (u - c(1.0)))
    log_sigmoid = (x if x < 0 else c(0.0)) - log1p_e
    return (c(1.0) - t) * x - log_sigmoid


def each(fn, stamp=_MATH_STAMP):
    def kernel(x, t, out, p):
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        for i in range(out.size):
            out[i] = fn(x[i], t[i], p)

    return kernel


def summed(fn, stamp=_MATH_STAMP):
    def kernel(x, t, p):
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        total = 0.0
        for i in range(x.size):
            total += fn(x[i], t[i], p)
        return total

    return kernel


def _kernel(template, fn, dtype, pair=False):
    """template's kernel of fn for dtype; its parameter a scalar of dtype, or a pair of
    them (fixed by fn, which the cache key holds)."""

    def build():
        arr, scalar = jit.array(dtype), jit.numba.from_dtype(dtype)
        param = jit.types.UniTuple(scalar, 2) if pair else scalar
        if template is summed:  # its sum may be reordered, so that it vectorizes
            sig = jit.types.float64(arr, arr, param)
            return jit.compile_kernel(summed(fn), sig, fastmath=jit.REASSOCIATE)
        return jit.compile_kernel(each(fn), jit.types.void(arr, arr, arr, param))

    return jit.cached((template, fn, dtype), build)


def _pointwise_loss(fn, input, target, p, weight, reduction):
    """fn's loss of each element, times weight, reduced: one pass without a weight."""
    x = np.ascontiguousarray(input._data).reshape(-1)
    t = np.ascontiguousarray(target._data).reshape(-1)
    if reduction != "none" and weight is None:
        total = _kernel(summed, fn, x.dtype)(x, t, p)
        return _total(total, x.size, x.dtype, reduction)
    losses = np.empty_like(x)
    _kernel(each, fn, x.dtype)(x, t, losses, p)
    return _weighted(losses.reshape(input._shape), weight, reduction)


def _weighted(losses, weight, reduction):
    if weight is not None:
        losses = losses * weight._data
    if reduction == "none":
        return from_array(np.asarray(losses, order="C"))  # ascontiguousarray: 0-d -> 1-d
    return _total(losses.sum(dtype=np.float64), losses.size, losses.dtype, reduction)


def _total(total, size, dtype, reduction):
    if reduction == "mean":
        total = total / size if size else np.nan  # empty: NaN, as in PyTorch
    return from_array(np.asarray(total, dtype))


def _spread(g, t, weight, weighted, ignore_index, mean, out):
    """out (N, C, R), zeros, gets -g[n, r] * weight[t[n, r]] at class t[n, r] of each
    counted target, divided by the counted targets' total weight if ``mean``; returns
    the flat index of the first target outside [0, C) (-1 if none), checked first."""
    classes, total = out.shape[1], 0.0
    for n in range(t.shape[0]):
        for r in range(t.shape[1]):
            k = t[n, r]
            if k != ignore_index:
                if k < 0 or k >= classes:
                    return n * t.shape[1] + r
                total += weight[k] if weighted else 1.0
    scale = 1.0 / total if mean else 1.0  # no target counted: nothing to scale
    for n in range(t.shape[0]):
        for r in range(t.shape[1]):
            k = t[n, r]
            if k != ignore_index:
                w = weight[k] if weighted else 1.0
                out[n, k, r] = -g[n, r] * w * scale
    return -1


def nll_loss_backward(ks, grad, input, target, weight, ignore_index, reduction):
    """The gradient in two passes over the targets (the one-hot formula of dispatched
    operators, its decomposition, took ~12 calls)."""
    shape = input._shape
    rows, classes = (1, shape[0]) if len(shape) == 1 else shape[:2]
    out = np.zeros((rows, classes, math.prod(shape[2:])), input._data.dtype)
    t = np.ascontiguousarray(target._data, np.int64).reshape(rows, out.shape[2])
    g = np.broadcast_to(grad._data, target._shape).reshape(t.shape)
    w = np.empty(0, out.dtype) if weight is None else weight._data
    kernel = _spread_kernel(out.dtype)
    bad = kernel(g, t, w, weight is not None, ignore_index, reduction == "mean", out)
    if bad >= 0:
        raise ValueError(
            f"nll_loss_backward: target values must be class indices in [0, {classes}) (or "
            f"ignore_index={ignore_index}), got {t.reshape(-1)[bad]}"
        )
    return from_array(out.reshape(shape))


def _spread_kernel(dtype):
    def build():
        g, w = jit.array(dtype, 2, "A"), jit.array(dtype, 1, "A")
        t, out = jit.array(np.int64, 2), jit.array(dtype, 3)
        boolean = jit.types.boolean
        sig = jit.types.int64(g, t, w, boolean, jit.types.int64, boolean, out)
        return jit.compile_kernel(_spread, sig)

    return jit.cached((_spread, dtype), build)


def mse_loss(ks, input, target, reduction):
    """One pass for a reduced loss (NumPy's difference, square and float64 sum took
    three, 1.8x PyTorch's time on 10^6 elements)."""
    return _pointwise_loss(squared_error, input, target, 0.0, None, reduction)


def smooth_l1_loss(ks, input, target, reduction, beta):
    return _pointwise_loss(smooth_l1, input, target, beta, None, reduction)


def smooth_l1_loss_backward(ks, grad, input, target, reduction, beta):
    """One pass for a reduced loss's (0-d) grad; a full grad ('none') multiplies after."""
    x = np.ascontiguousarray(input._data).reshape(-1)
    t = np.ascontiguousarray(target._data).reshape(-1)
    g = grad._data
    scale = 1.0 if reduction == "none" else float(g)
    if reduction == "mean" and x.size:
        scale /= x.size
    out = np.empty_like(x)
    _kernel(each, smooth_l1_slope, x.dtype, pair=True)(x, t, out, (beta, scale))
    out = out.reshape(input._shape)
    if reduction == "none":
        np.multiply(out, g, out=out)
    return from_array(out)


def binary_cross_entropy_with_logits(ks, input, target, weight, reduction, pos_weight):
    if pos_weight is not None:  # the positive term weighted: NumPy's passes
        x, t = input._data, target._data
        with np.errstate(over="ignore", invalid="ignore"):  # NaN/inf data: no warnings
            log_sigmoid = np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x)))
            losses = (1 - t) * x - ((pos_weight._data - 1) * t + 1) * log_sigmoid
        return _weighted(losses, weight, reduction)
    return _pointwise_loss(bce_with_logits, input, target, 0.0, weight, reduction)


def register(registry):
    for fn in (
        nll_loss,
        nll_loss_backward,
        cross_entropy_loss,
        cross_entropy_loss_backward,
        mse_loss,
        smooth_l1_loss,
        smooth_l1_loss_backward,
        binary_cross_entropy_with_logits,
    ):
        registry.register(fn.__name__, "cpu", fn)
