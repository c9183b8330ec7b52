"""Activations and their gradients (relu, leaky_relu, gelu, sigmoid), softmax and
log_softmax.

The activations are one flat loop over the memory of a dense tensor (Note [Layouts]):
the result has the input's strides, so a channels-last activation stays channels-last.
Two templates, ``unary`` and ``binary`` (a gradient and the tensor it depends on),
instantiated with the scalar functions below (Note [Kernel cache]: they live in this
file, beside the templates); each takes one parameter of the data's dtype (the slope,
or 0), so the arithmetic stays in float32 for float32 data.
"""

import math

import numpy as np

from lamina.backends import jit, threads
from lamina.backends.jit import jitable
from lamina.dispatch.tensor import from_array

from .layout import dense, flat_like, flat_output

_parallel_min = float("inf")  # Note [Parallel threshold] (lamina.backends.threads)


def _set_threshold(threshold):
    global _parallel_min
    _parallel_min = threshold


threads.on_change(_set_threshold)

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TANH_BETA = math.sqrt(2.0 / math.pi)
_TANH_KAPPA = 0.044715


# ---------------------------------------------------------------- scalar functions


@jitable
def relu(x, zero):
    # NaN and -0.0 pass unchanged, as in PyTorch (its clamp_min(x, 0))
    return zero if x < 0 else x


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


@jitable
def gelu(x, unused):
    return 0.5 * x * (1.0 + math.erf(x * _SQRT_HALF))


@jitable
def gelu_backward(g, x, unused):
    cdf = 0.5 * (1.0 + math.erf(x * _SQRT_HALF))
    return g * (cdf + x * _INV_SQRT_2PI * math.exp(-0.5 * x * x))


@jitable
def gelu_tanh(x, unused):
    return 0.5 * x * (1.0 + math.tanh(_TANH_BETA * (x + _TANH_KAPPA * x * x * x)))


@jitable
def gelu_tanh_backward(g, x, unused):
    t = math.tanh(_TANH_BETA * (x + _TANH_KAPPA * x * x * x))
    du = _TANH_BETA * (1.0 + 3.0 * _TANH_KAPPA * x * x)
    return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


@jitable
def sigmoid(x, unused):
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------- templates


def unary(fn, loop):
    def kernel(x, out, p):
        for i in loop(out.size):
            out[i] = fn(x[i], p)

    return kernel


def binary(fn, loop):
    def kernel(a, b, out, p):
        for i in loop(out.size):
            out[i] = fn(a[i], b[i], p)

    return kernel


def _entry(template, fn, dtype, size):
    loop = range if size < _parallel_min else jit.prange

    def build():
        arr = jit.array(dtype)
        operands = (arr,) * (2 if template is unary else 3)
        sig = jit.types.void(*operands, jit.numba.from_dtype(dtype))
        return jit.compile_kernel(template(fn, loop), sig, parallel=loop is jit.prange)

    return jit.cached((template, fn, dtype, loop), build)


def _unary(fn, x, p=0.0):
    flat, data = dense(x._data)
    out_flat, out = flat_output(data)
    _entry(unary, fn, data.dtype, flat.size)(flat, out_flat, p)
    return from_array(out)


def _binary(fn, grad, x, p=0.0):
    """fn(grad, x) elementwise, in x's memory order."""
    flat, data = dense(x._data)
    out_flat, out = flat_output(data)
    g = flat_like(grad._data, data)
    _entry(binary, fn, data.dtype, flat.size)(g, flat, out_flat, p)
    return from_array(out)


def relu_kernel(ks, input):
    return _unary(relu, input)


def relu_backward_kernel(ks, grad, result):
    return _binary(relu_backward, grad, result)


def leaky_relu_kernel(ks, input, negative_slope):
    return _unary(leaky_relu, input, negative_slope)


def leaky_relu_backward_kernel(ks, grad, input, negative_slope):
    return _binary(leaky_relu_backward, grad, input, negative_slope)


def gelu_kernel(ks, input, approximate):
    return _unary(gelu_tanh if approximate == "tanh" else gelu, input)


def gelu_backward_kernel(ks, grad, input, approximate):
    return _binary(gelu_tanh_backward if approximate == "tanh" else gelu_backward, grad, input)


def sigmoid_kernel(ks, input):
    return _unary(sigmoid, input)


# ---------------------------------------------------------------- softmax


def softmax_rows(log, loop):
    """Each row (of length >= 1) shifted by its maximum, so exp never overflows; the
    sum accumulates in float64. A NaN anywhere in a row makes the row NaN, and so does
    a row of -inf only (as in PyTorch)."""

    def kernel(x, out):
        n = x.shape[1]
        for r in loop(x.shape[0]):
            row, res = x[r], out[r]
            m = row[0]
            for j in range(1, n):
                v = row[j]
                if v > m or v != v:
                    m = v
            s = 0.0
            for j in range(n):
                s += math.exp(row[j] - m)
            if log:
                shift = m + math.log(s)
                for j in range(n):
                    res[j] = row[j] - shift
            else:
                inv = 1.0 / s
                for j in range(n):
                    res[j] = math.exp(row[j] - m) * inv

    return kernel


def _softmax(x, dim, log):
    data = x._data
    moved = np.ascontiguousarray(np.moveaxis(data, dim, -1))
    rows = moved.reshape(-1, moved.shape[-1]) if moved.size else moved.reshape(0, 1)
    out = np.empty_like(rows)
    if rows.size:
        loop = range if rows.size < _parallel_min else jit.prange

        def build():
            arr = jit.array(data.dtype, 2)
            sig = jit.types.void(arr, arr)
            return jit.compile_kernel(softmax_rows(log, loop), sig, parallel=loop is jit.prange)

        jit.cached((softmax_rows, log, data.dtype, loop), build)(rows, out)
    result = np.moveaxis(out.reshape(moved.shape), -1, dim)
    like = np.empty_like(data)  # the input's memory order: kept, as by the activations
    if like.strides == result.strides:
        return from_array(result)
    like[...] = result
    return from_array(like)


def softmax_kernel(ks, input, dim):
    return _softmax(input, dim, False)


def log_softmax_kernel(ks, input, dim):
    return _softmax(input, dim, True)


KERNELS = {
    "relu": relu_kernel,
    "relu_backward": relu_backward_kernel,
    "leaky_relu": leaky_relu_kernel,
    "leaky_relu_backward": leaky_relu_backward_kernel,
    "gelu": gelu_kernel,
    "gelu_backward": gelu_backward_kernel,
    "sigmoid": sigmoid_kernel,
    "softmax": softmax_kernel,
    "log_softmax": log_softmax_kernel,
}


def register(registry):
    for name, fn in KERNELS.items():
        fn.__name__ = fn.__qualname__ = name
        registry.register(name, "cpu", fn)
