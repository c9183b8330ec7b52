"""Activations and their gradients (relu, leaky_relu, gelu, sigmoid, silu, hardtanh,
hardswish), softmax and log_softmax; the optimizers' in-place step (add_scaled_).

The activations are one flat loop over the memory of a dense tensor (Note [Layouts]):
the result has the input's strides, so a channels-last activation stays channels-last.
Three templates, ``unary``, ``binary`` (a gradient and the tensor it depends on) and
``inplace`` (add_scaled_'s, which writes its first operand), instantiated with the
scalar functions below (Note [Kernel cache]: they live in this file, beside the
templates); each takes one parameter of the data's dtype (the slope,
or 0; hardtanh's a pair of them, its bounds), so the arithmetic stays in float32 for
float32 data. relu, sigmoid, silu and gelu run the elementwise kernels instead, with
kernels.py's scalar functions (Note [Pointwise activations]).
"""

import math
import os

import numpy as np

from lamina.backends import jit, threads
from lamina.backends.jit import jitable
from lamina.dispatch import core
from lamina.dispatch import dtypes as D
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array

from .. import kernels as K
from ..elementwise import Elementwise, binary_kernel, scalar_kernel, unary_kernel
from .layout import dense, flat_like, flat_output

_parallel_min = float("inf")  # Note [Parallel threshold] (lamina.backends.threads)
ROWS_KERNELS = []  # softmax's and log_softmax's (Note [C rows]): their limits follow it


def _set_threshold(threshold):
    global _parallel_min
    _parallel_min = threshold
    for kernel in ROWS_KERNELS:
        kernel.set_limit(threshold)


threads.on_change(_set_threshold)

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
# Note [Kernel cache]: the kernels here that call kernels.py's vector math (Note [Vector
# math]) close over that file's stamp (Numba's own: mtime and size), since Numba keys
# their cache by this file alone
_stat = os.stat(K.__file__)
_MATH_STAMP = (_stat.st_mtime_ns, _stat.st_size)


# ---------------------------------------------------------------- scalar functions


@jitable
def relu_backward(g, r, zero):
    # PyTorch's threshold_backward: g passes where the result is NaN (NaN input)
    return zero if r <= 0 else g


@jitable
def leaky_relu(x, slope):
    return x if x > 0 else x * slope


@jitable
def leaky_relu_backward(g, x, slope):
    return g if x > 0 else g * slope


# the gradients compute as the forward functions do (kernels.py: relu, silu, gelu)


@K.wide_vectors
@jitable(inline="always", **jit.CALLEE)
def gelu_backward(g, x, unused):
    c = type(x)
    cdf = c(0.5) * (c(1.0) + K.vector_erf(x * c(K.SQRT_HALF)))
    return g * (cdf + x * c(_INV_SQRT_2PI) * K.vector_exp(c(-0.5) * x * x))


@K.wide_vectors
@jitable(inline="always", **jit.CALLEE)
def gelu_tanh_backward(g, x, unused):
    c = type(x)
    beta, kappa = K.TANH_GELU_BETA, K.TANH_GELU_KAPPA
    t = K.vector_tanh(c(beta) * (x + c(kappa) * x * x * x))
    du = c(beta) * (c(1.0) + c(3.0 * kappa) * x * x)
    return g * (c(0.5) * (c(1.0) + t) + c(0.5) * x * (c(1.0) - t * t) * du)


@K.wide_vectors
@jitable(inline="always", **jit.CALLEE)
def silu_backward(g, x, unused):
    c = type(x)
    s = c(1.0) / (c(1.0) + K.vector_exp(-x))
    return g * s * (c(1.0) + x * (c(1.0) - s))


# hardtanh and hardswish: NaN passes through the forward (clamp's rule) and no gradient
# passes at or beyond the kinks, NaN included, as in PyTorch; hardswish's gradient is
# grad itself at NaN (PyTorch's branches: neither x <= -3 nor x < 3 holds)


@jitable
def hardtanh(x, bounds):
    lo, hi = bounds
    return lo if x < lo else (hi if x > hi else x)


@jitable
def hardtanh_backward(g, x, bounds):
    lo, hi = bounds
    return g if lo < x < hi else type(g)(0.0)


@jitable
def hardswish(x, unused):
    c = type(x)
    t = x + c(3.0)
    return x * (c(0.0) if t < 0 else (c(6.0) if t > 6 else t)) / c(6.0)


@jitable
def hardswish_backward(g, x, unused):
    c = type(x)
    if x <= -3:
        return c(0.0)
    return g * (x / c(3.0) + c(0.5)) if x < 3 else g


@jitable
def add_scaled(x, g, alpha):
    return x + alpha * g


# ---------------------------------------------------------------- templates


def unary(fn, loop, stamp=_MATH_STAMP):
    def kernel(x, out, p):
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        for i in loop(out.size):
            out[i] = fn(x[i], p)

    return kernel


def binary(fn, loop):
    def kernel(a, b, out, p):
        for i in loop(out.size):
            out[i] = fn(a[i], b[i], p)

    return kernel


def inplace(fn, loop):
    """x = fn(x, b) elementwise: two arrays, so LLVM's check that they do not overlap
    passes and the loop runs in vectors (the binary template with out = a fails it and
    ran its scalar loop: 3x the time of PyTorch's add_ on 131,072 float32)."""

    def kernel(x, b, p):
        for i in loop(x.size):
            x[i] = fn(x[i], b[i], p)

    return kernel


def _entry(template, fn, dtype, size, pair):
    """The kernel of template and fn for dtype; its parameter is a scalar of dtype, or
    a pair of them (fixed by fn, which the cache key holds)."""
    loop = range if size < _parallel_min else jit.prange

    def build():
        arr = jit.array(dtype)
        operands = (arr,) * (3 if template is binary else 2)
        scalar = jit.numba.from_dtype(dtype)
        param = jit.types.UniTuple(scalar, 2) if pair else scalar
        sig = jit.types.void(*operands, param)
        parallel, width = loop is jit.prange, K.vector_width(fn)
        return jit.compile_kernel(template(fn, loop), sig, parallel=parallel, vector_width=width)

    return jit.cached((template, fn, dtype, loop), build)


def _unary(fn, x, p=0.0):
    flat, data = dense(x._data)
    out_flat, out = flat_output(data)
    _entry(unary, fn, data.dtype, flat.size, isinstance(p, tuple))(flat, out_flat, p)
    return from_array(out)


def _binary(fn, grad, x, p=0.0):
    """fn(grad, x) elementwise, in x's memory order."""
    flat, data = dense(x._data)
    out_flat, out = flat_output(data)
    g = flat_like(grad._data, data)
    _entry(binary, fn, data.dtype, flat.size, isinstance(p, tuple))(g, flat, out_flat, p)
    return from_array(out)


def add_scaled_kernel(ks, x1, x2, alpha):
    """x1 += alpha * x2 in one pass over x1's memory; a strided x1 takes NumPy's two
    passes (a dense copy would not be x1)."""
    data = x1._data
    flat, dense_data = dense(data)
    if dense_data is not data:
        data += alpha * x2._data
        return x1
    _entry(inplace, add_scaled, data.dtype, flat.size, False)(
        flat, flat_like(x2._data, data), alpha
    )
    return x1


def relu_backward_kernel(ks, grad, result):
    return _binary(relu_backward, grad, result)


def leaky_relu_backward_kernel(ks, grad, input, negative_slope):
    return _binary(leaky_relu_backward, grad, input, negative_slope)


def gelu_backward_kernel(ks, grad, input, approximate):
    return _binary(gelu_tanh_backward if approximate == "tanh" else gelu_backward, grad, input)


def silu_backward_kernel(ks, grad, input):
    return _binary(silu_backward, grad, input)


def hardtanh_kernel(ks, input, min_val, max_val):
    return _unary(hardtanh, input, (min_val, max_val))


def hardtanh_backward_kernel(ks, grad, input, min_val, max_val):
    return _binary(hardtanh_backward, grad, input, (min_val, max_val))


def hardswish_kernel(ks, input):
    return _unary(hardswish, input)


def hardswish_backward_kernel(ks, grad, input):
    return _binary(hardswish_backward, grad, input)


# ---------------------------------------------------------------- softmax
# Note [Softmax kernels]: softmax and log_softmax read their input in memory order, so
# no layout is copied: the input as a C-contiguous array of shape (outer, n, inner),
# n along dim. Rows (inner == 1: dim is innermost in memory) take three passes over a
# row that stays in cache: its maximum, exp(x - max) stored (softmax) and summed, the
# scaling; otherwise the same passes run with each inner position a lane, so every loop
# steps through contiguous memory and vectorizes. A row's maximum is max's integer fold
# of order keys (kernels.extreme; LLVM's NaN-propagating maximum took 2.5 us, not 1.0,
# on 100 rows of 100 float32), the columns' that maximum in each lane
# (kernels.fold_max): both exact, NaN where a NaN is. A row's sum runs in the data's
# dtype over blocks of _SUM_BLOCK elements, in vector lanes (the kernels may reorder
# sums: jit.REASSOCIATE), and adds the blocks' sums in float64; a column's sums are
# float64.
# The backward kernels (softmax_backward, log_softmax_backward) take the same path.
# A NaN anywhere in a row makes the row NaN, and so does a row of -inf only, or one
# holding +inf (as in PyTorch).
_SUM_BLOCK = 1024


@jitable
def softmax_finish(s, m, take_log, cast):
    """What a row's elements are scaled by (softmax) or shifted by (log_softmax), in
    the data's dtype (float64 factors would widen every element's arithmetic)."""
    return cast(m + math.log(s) if take_log else 1.0 / s)


def softmax_rows(exp, cast, take_log, loop, stamp=_MATH_STAMP):
    def kernel(x, out):
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        n = x.shape[1]
        for r in loop(x.shape[0]):
            row, res = x[r], out[r]
            m = K.extreme(row, row[0], True)
            s = 0.0
            for b in range(0, n, _SUM_BLOCK):
                block, into = row[b : b + _SUM_BLOCK], res[b : b + _SUM_BLOCK]
                part = cast(0.0)
                for j in range(block.shape[0]):
                    e = exp(block[j] - m)
                    if not take_log:
                        into[j] = e
                    part += e
                s += part
            f = softmax_finish(s, m, take_log, cast)
            for j in range(n):
                res[j] = row[j] - f if take_log else res[j] * f

    return kernel


def softmax_columns(exp, cast, take_log, loop, stamp=_MATH_STAMP):
    def kernel(x, out):
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        outer, n, inner = x.shape
        for o in loop(outer):
            m = x[o, 0].copy()
            for j in range(n):
                row = x[o, j]
                for k in range(inner):
                    m[k] = K.fold_max(m[k], row[k])
            s = np.zeros(inner)
            for j in range(n):
                row, res = x[o, j], out[o, j]
                for k in range(inner):
                    e = exp(row[k] - m[k])
                    if not take_log:
                        res[k] = e
                    s[k] += e
            f = np.empty_like(m)
            for k in range(inner):
                f[k] = softmax_finish(s[k], m[k], take_log, cast)
            for j in range(n):
                row, res = x[o, j], out[o, j]
                for k in range(inner):
                    res[k] = row[k] - f[k] if take_log else res[k] * f[k]

    return kernel


def softmax_backward_rows(exp, cast, take_log, loop, stamp=_MATH_STAMP):
    """Per row of gradient g and result r: r * (g - sum(g * r)) (softmax), or
    g - exp(r) * sum(g) (log_softmax); the sum as the forward's."""

    def kernel(r, g, out):
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        n = r.shape[1]
        for i in loop(r.shape[0]):
            gs, rs, res = g[i], r[i], out[i]
            s = 0.0
            for b in range(0, n, _SUM_BLOCK):
                gb, rb = gs[b : b + _SUM_BLOCK], rs[b : b + _SUM_BLOCK]
                part = cast(0.0)
                for j in range(gb.shape[0]):
                    part += gb[j] if take_log else gb[j] * rb[j]
                s += part
            t = cast(s)
            for j in range(n):
                res[j] = gs[j] - exp(rs[j]) * t if take_log else rs[j] * (gs[j] - t)

    return kernel


def softmax_backward_columns(exp, cast, take_log, loop, stamp=_MATH_STAMP):
    def kernel(r, g, out):
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        outer, n, inner = r.shape
        for o in loop(outer):
            s = np.zeros(inner)
            for j in range(n):
                gs, rs = g[o, j], r[o, j]
                for k in range(inner):
                    s[k] += gs[k] if take_log else gs[k] * rs[k]
            t = np.empty(inner, r.dtype)
            for k in range(inner):
                t[k] = cast(s[k])
            for j in range(n):
                gs, rs, res = g[o, j], r[o, j], out[o, j]
                for k in range(inner):
                    res[k] = gs[k] - exp(rs[k]) * t[k] if take_log else rs[k] * (gs[k] - t[k])

    return kernel


def _along_dim(templates, take_log, dim, data, *others):
    """Note [Softmax kernels]: ``templates`` (rows, columns) run over ``data`` and
    ``others`` (the same shape) in data's memory order; the result has data's strides."""
    if data.size == 0:
        return from_array(np.empty_like(data))
    order = sorted(range(data.ndim), key=lambda d: -data.strides[d])
    if not data.transpose(order).flags.c_contiguous:  # not dense: a C-contiguous copy
        data, order = np.ascontiguousarray(data), list(range(data.ndim))
    out = np.empty_like(data)  # data's strides (order "K" keeps a dense layout)
    arrays = [data, *(a if _alike(a, data) else _copy_like(a, out) for a in others)]
    arrays = [a.transpose(order) for a in (*arrays, out)]
    shape, axis = arrays[0].shape, order.index(dim % data.ndim)
    outer, n, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    template = templates[inner > 1]
    arrays = [a.reshape((outer, n, inner) if inner > 1 else (outer, n)) for a in arrays]
    exp, cast = _exp_and_cast(data.dtype)
    loop = jit.prange if outer > 1 and data.size >= _parallel_min else range

    def build():
        arr = jit.array(data.dtype, arrays[0].ndim)
        sig = jit.types.void(*[arr] * len(arrays))
        kernel = template(exp, cast, take_log, loop)
        parallel = loop is jit.prange
        return jit.compile_kernel(kernel, sig, parallel=parallel, fastmath=jit.REASSOCIATE)

    jit.cached((template, take_log, data.dtype, loop), build)(*arrays)
    return from_array(out)


def _exp_and_cast(dtype):
    return (K.float32_exp, np.float32) if dtype == np.float32 else (K.float64_exp, float)


class RowsSpec:
    """What the C core's fast path along the last axis needs of softmax or log_softmax
    (Note [C rows] in dispatch/csrc/fastpath.c): the dtypes with a loop, the size limit
    and the loops' addresses -- softmax_rows compiled as a C function, with the flags
    of the Python kernel's (Note [Softmax kernels])."""

    def __init__(self, take_log):
        self.take_log, self.limit = take_log, _parallel_min
        self.dtypes = [d if d.name in ("float32", "float64") else None for d in D.ALL]

    def address(self, form, index):
        d = D.ALL[index]

        def build(cache):
            exp, cast = _exp_and_cast(d.np)
            kernel = jitable(softmax_rows(exp, cast, self.take_log, range), inline="always")
            return K.c_loop(K.rows_cloop, kernel, d, d, [d], cache)

        return jit.c_loop((K.rows_cloop, softmax_rows, self.take_log, d), build)


def _rows_kernel(kernel, take_log):
    fast = core.RowsKernel(kernel, RowsSpec(take_log))
    if fast is not kernel:
        ROWS_KERNELS.append(fast)
        fast.__name__ = fast.__qualname__ = kernel.__name__  # how dumps show it
        fast.__module__ = __name__
    return fast


def _alike(a, b):
    return a.dtype == b.dtype and a.strides == b.strides


def _copy_like(a, like):
    copy = np.empty_like(like)
    copy[...] = a
    return copy


_FORWARD = softmax_rows, softmax_columns
_BACKWARD = softmax_backward_rows, softmax_backward_columns


def softmax_kernel(ks, input, dim):
    return _along_dim(_FORWARD, False, dim, input._data)


def log_softmax_kernel(ks, input, dim):
    return _along_dim(_FORWARD, True, dim, input._data)


def softmax_backward_kernel(ks, grad, result, dim):
    return _along_dim(_BACKWARD, False, dim, result._data, grad._data)


def log_softmax_backward_kernel(ks, grad, result, dim):
    return _along_dim(_BACKWARD, True, dim, result._data, grad._data)


KERNELS = {
    "add_scaled_": add_scaled_kernel,
    "relu_backward": relu_backward_kernel,
    "leaky_relu_backward": leaky_relu_backward_kernel,
    "gelu_backward": gelu_backward_kernel,
    "silu_backward": silu_backward_kernel,
    "hardtanh": hardtanh_kernel,
    "hardtanh_backward": hardtanh_backward_kernel,
    "hardswish": hardswish_kernel,
    "hardswish_backward": hardswish_backward_kernel,
    "softmax": softmax_kernel,
    "log_softmax": log_softmax_kernel,
    "softmax_backward": softmax_backward_kernel,
    "log_softmax_backward": log_softmax_backward_kernel,
}


# Note [Pointwise activations]: relu, sigmoid, silu and gelu (either form) are
# elementwise operators in all but their namespace and signature: their kernels are the
# elementwise module's, instantiated with kernels.py's scalar functions, so a call on a
# C-contiguous tensor below the parallel threshold takes the C core's fast path (Note
# [Fast path]) as exp's does, and every other call runs the same loops over the input's
# memory (dense()), so that the result keeps a dense input's layout.
POINTWISE = {
    "relu": K.relu,
    "sigmoid": K.vector_sigmoid,
    "silu": K.silu,
    "gelu": K.gelu,
    "gelu_tanh": K.gelu_tanh,
}


def pointwise_kernel(name, scalar_fn):
    ew = Elementwise(OPERATORS[name], 1, lambda dtype: scalar_fn)

    def general(ks, input):
        flat, data = dense(input._data)
        out_flat, out = flat_output(data)
        ew.run(input._dtype, out_flat, [flat])
        return from_array(out)

    return unary_kernel(ew, general)


def gradient_kernel(name, scalar_fn):
    """A gradient from an activation's result, grad and result elementwise (Note
    [Pointwise activations]): two contiguous tensors of one shape take the C core's fast
    path, the others the elementwise general path (dispatch.layouts.ELEMENTWISE_LIKE)."""
    kernel, *_variants = binary_kernel(Elementwise(OPERATORS[name], 2, lambda dtype: scalar_fn))
    return kernel


def leaky_relu_kernel():
    """leaky_relu is a tensor and a number, the slope (Note [Pointwise activations]): a
    contiguous call takes the C core's scalar fast path, the others the loop over the
    input's memory."""
    ew = Elementwise(OPERATORS["leaky_relu"], 2, lambda dtype: leaky_relu)
    return scalar_kernel(ew, lambda ks, input, slope: _unary(leaky_relu, input, slope))


def register(registry):
    for name, fn in KERNELS.items():
        fn.__name__ = fn.__qualname__ = name
        if name in ("softmax", "log_softmax"):
            fn = _rows_kernel(fn, take_log=name == "log_softmax")
        registry.register(name, "cpu", fn)
    kernels = {name: pointwise_kernel(name.split("_")[0], fn) for name, fn in POINTWISE.items()}
    for name in ("relu", "sigmoid", "silu"):
        registry.register(name, "cpu", kernels[name])
    registry.register("leaky_relu", "cpu", leaky_relu_kernel())
    registry.register("tanh_backward", "cpu", gradient_kernel("tanh_backward", K.tanh_grad))
    registry.register(
        "sigmoid_backward", "cpu", gradient_kernel("sigmoid_backward", K.sigmoid_grad)
    )
    by_approximation = {"none": kernels["gelu"], "tanh": kernels["gelu_tanh"]}

    def gelu(ks, input, approximate):
        return by_approximation[approximate](ks, input)

    gelu.__qualname__ = "gelu"  # how dumps show it
    registry.register("gelu", "cpu", gelu)
