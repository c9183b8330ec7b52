"""The LSTM and GRU cells in one pass, forward and backward (PyTorch's fused cells do
the same): a step of a layer is otherwise about ten elementwise calls, each an autograd
node, on a state of a few thousand elements, where the calls cost more than their
arithmetic. A whole layer's sequence in one call, forward and backward: a Python loop
over the steps of the BLAS product (into a buffer) and the cell's kernel, where one
operator call per step costs its dispatch and its autograd node.

Gates come as (G, *state shape): the layer's states in columns make each gate a block
of rows (Note [States in columns] in lamina.nn.recurrent), so the kernels read them in
place as (G, n); LSTMCell's, in rows, are a strided view, copied. The loops run over
contiguous vectors, which LLVM vectorizes with the vector math inlined.
"""

import os

import numpy as np

from lamina.backends import jit
from lamina.dispatch.tensor import from_array

from .. import gemm
from .. import kernels as K

# Note [Kernel cache]: the kernels call kernels.py's vector math, so they close over
# that file's stamp (Numba keys its cache by this file alone), as activation.py's do
_stat = os.stat(K.__file__)
_MATH_STAMP = (_stat.st_mtime_ns, _stat.st_size)


def lstm_cell_loop(sigmoid, tanh, stamp=_MATH_STAMP):
    def kernel(gates, c, h, c_next, activations):
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        for k in range(c.shape[0]):
            i, f = sigmoid(gates[0, k]), sigmoid(gates[1, k])
            g, o = tanh(gates[2, k]), sigmoid(gates[3, k])
            x = f * c[k] + i * g
            c_next[k] = x
            h[k] = o * tanh(x)
            activations[0, k] = i
            activations[1, k] = f
            activations[2, k] = g
            activations[3, k] = o

    return kernel


def lstm_cell_backward_loop(sigmoid, tanh, stamp=_MATH_STAMP):
    def kernel(grad_h, grad_c, c, c_next, activations, grad_gates, grad_c_prev):
        """An empty grad_h or grad_c stands for zeros."""
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        one, zero = c.dtype.type(1.0), c.dtype.type(0.0)
        has_h, has_c = grad_h.size != 0, grad_c.size != 0
        for k in range(c.shape[0]):
            i, f = activations[0, k], activations[1, k]
            g, o = activations[2, k], activations[3, k]
            t = tanh(c_next[k])
            gh = grad_h[k] if has_h else zero
            gc = gh * o * (one - t * t) + (grad_c[k] if has_c else zero)
            grad_gates[0, k] = gc * g * i * (one - i)
            grad_gates[1, k] = gc * c[k] * f * (one - f)
            grad_gates[2, k] = gc * i * (one - g * g)
            grad_gates[3, k] = gh * t * o * (one - o)
            grad_c_prev[k] = gc * f

    return kernel


def gru_cell_loop(sigmoid, tanh, stamp=_MATH_STAMP):
    def kernel(x, hw, h, activations):
        """x and hw: the step's projections of the input and of h (with its bias),
        blocks r, z, n; h, written in place: the previous h, then the next."""
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        for k in range(h.shape[0]):
            r, z = sigmoid(x[0, k] + hw[0, k]), sigmoid(x[1, k] + hw[1, k])
            n = tanh(x[2, k] + r * hw[2, k])
            h[k] = n + z * (h[k] - n)  # (1 - z) n + z h
            activations[0, k] = r
            activations[1, k] = z
            activations[2, k] = n
            activations[3, k] = hw[2, k]

    return kernel


def gru_cell_backward_loop(sigmoid, tanh, stamp=_MATH_STAMP):
    def kernel(grad_h, h, activations, grad_x, grad_hw):
        """grad_h, written in place: the next h's gradient, then the part of the
        previous h's that skips w_hh (grad_h * z); h: the previous h."""
        stamp  # noqa: B018 (a closure cell, for the cache key: Note [Kernel cache])
        one = h.dtype.type(1.0)
        for k in range(h.shape[0]):
            r, z = activations[0, k], activations[1, k]
            n, hn = activations[2, k], activations[3, k]
            gh = grad_h[k]
            gn = gh * (one - z) * (one - n * n)
            gz = gh * (h[k] - n) * z * (one - z)
            gr = gn * hn * r * (one - r)
            grad_x[0, k] = gr
            grad_x[1, k] = gz
            grad_x[2, k] = gn
            grad_hw[0, k] = gr
            grad_hw[1, k] = gz
            grad_hw[2, k] = gn * r
            grad_h[k] = gh * z

    return kernel


def _flat(t, blocks=False):
    """t's values as a C-contiguous vector, or (4, n) for gates and activations: a view
    where they are contiguous (a layer's, whose states are columns), else a copy."""
    a = np.ascontiguousarray(t._data)
    return a.reshape(4, -1) if blocks else a.reshape(-1)


def native_lstm_cell(ks, gates, c):
    c1 = _flat(c)
    h, c_next = np.empty_like(c1), np.empty_like(c1)
    activations = np.empty((4, c1.size), c1.dtype)
    _kernel(lstm_cell_loop, c1.dtype)(_flat(gates, True), c1, h, c_next, activations)
    shape = c._shape
    return (
        from_array(h.reshape(shape)),
        from_array(c_next.reshape(shape)),
        from_array(activations.reshape(4, *shape)),
    )


def native_lstm_cell_backward(ks, grad_h, grad_c, c, c_next, activations):
    c1 = _flat(c)
    none = np.empty(0, c1.dtype)
    grad_gates = np.empty((4, c1.size), c1.dtype)
    grad_c_prev = np.empty_like(c1)
    _kernel(lstm_cell_backward_loop, c1.dtype)(
        none if grad_h is None else _flat(grad_h),
        none if grad_c is None else _flat(grad_c),
        c1,
        _flat(c_next),
        _flat(activations, True),
        grad_gates,
        grad_c_prev,
    )
    shape = c._shape
    return from_array(grad_gates.reshape(4, *shape)), from_array(grad_c_prev.reshape(shape))


def _weight_hh_grad(grad_gates, hs, h0):
    """weight_hh's gradient from every step's gates' gradient (G * H, L, N) and the
    output hs (H, L, N): the steps after the first against the h's before them, as
    (G * H, (L - 1) N) and (H, (L - 1) N) views, in one product; the first against h0
    (Note [Sequence in columns] in lamina.nn.recurrent)."""
    rows, length, n = grad_gates.shape
    later = max(length - 1, 0) * n
    grad_w = gemm.matmul(
        grad_gates[:, 1:].reshape(rows, later), hs[:, :-1].reshape(hs.shape[0], later).T
    )
    if length:
        grad_w += gemm.matmul(grad_gates[:, 0], h0.T)
    return grad_w


def native_lstm_sequence(ks, projections, h0, c0, weight_hh):
    xw, w = projections._data, weight_hh._data
    rows, length, n = xw.shape
    size = rows // 4
    output = np.empty((size, length, n), xw.dtype)
    cs = np.empty((length, size * n), xw.dtype)
    activations = np.empty((length, 4, size * n), xw.dtype)
    h = np.array(h0._data, order="C")  # the step's h, written in place by the cell
    c = _flat(c0)
    gates = np.empty((rows, n), xw.dtype)
    cell = _kernel(lstm_cell_loop, xw.dtype)
    for t in range(length):
        gemm.matmul(w, h, out=gates)
        gates += xw[:, t]
        cell(gates.reshape(4, -1), c, h.reshape(-1), cs[t], activations[t])
        output[:, t] = h
        c = cs[t]
    return (
        from_array(output),
        from_array(h),
        from_array(c.reshape(size, n).copy()),  # not a view: cs is saved for backward
        from_array(cs.reshape(length, size, n)),
        from_array(activations.reshape(length, 4, size, n)),
    )


def native_lstm_sequence_backward(
    ks, grad_output, grad_h_n, grad_c_n, h0, c0, weight_hh, output, cs, activations
):
    """The steps in reverse, each the cell's backward and the product w_hh.T @ (the
    step's gates' gradient) for the previous h's; then weight_hh's gradient, one
    product over the steps (Note [Sequence in columns] in lamina.nn.recurrent)."""
    hs, w = np.ascontiguousarray(output._data), weight_hh._data
    size, length, n = hs.shape
    dtype = hs.dtype
    grad_xw = np.empty((4 * size, length, n), dtype)
    # the running gradients of h and c, which the steps overwrite: copies
    grad_h = np.zeros((size, n), dtype) if grad_h_n is None else np.array(grad_h_n._data, order="C")
    grad_c = np.zeros((size, n), dtype) if grad_c_n is None else np.array(grad_c_n._data, order="C")
    grad_c = grad_c.reshape(-1)
    grad_c_prev, grad_gates = np.empty_like(grad_c), np.empty((4, size * n), dtype)
    c = np.ascontiguousarray(cs._data).reshape(length, size * n)
    acts = np.ascontiguousarray(activations._data).reshape(length, 4, size * n)
    c_first, w_t = _flat(c0), w.T
    cell = _kernel(lstm_cell_backward_loop, dtype)
    for t in reversed(range(length)):
        if grad_output is not None:
            grad_h += grad_output._data[:, t]
        c_prev = c[t - 1] if t else c_first
        cell(grad_h.reshape(-1), grad_c, c_prev, c[t], acts[t], grad_gates, grad_c_prev)
        step = grad_gates.reshape(4 * size, n)
        grad_xw[:, t] = step
        gemm.matmul(w_t, step, out=grad_h)
        grad_c, grad_c_prev = grad_c_prev, grad_c
    grad_w = _weight_hh_grad(grad_xw, hs, np.ascontiguousarray(h0._data))
    return (
        from_array(grad_xw),
        from_array(grad_h),
        from_array(grad_c.reshape(size, n)),
        from_array(grad_w),
    )


def native_gru_sequence(ks, projections, h0, weight_hh, bias_hh):
    xw, w = projections._data, weight_hh._data
    rows, length, n = xw.shape
    size = rows // 3
    dtype = xw.dtype
    output = np.empty((size, length, n), dtype)
    activations = np.empty((length, 4, size * n), dtype)
    x = np.ascontiguousarray(np.moveaxis(xw, 1, 0))  # (L, 3H, N): each step contiguous
    bias = None if bias_hh is None else bias_hh._data[:, None]
    h = np.array(h0._data, order="C")  # the step's h, written in place by the cell
    hw = np.empty((rows, n), dtype)
    cell = _kernel(gru_cell_loop, dtype)
    for t in range(length):
        gemm.matmul(w, h, out=hw)
        if bias is not None:
            hw += bias
        cell(x[t].reshape(3, -1), hw.reshape(3, -1), h.reshape(-1), activations[t])
        output[:, t] = h
    return (
        from_array(output),
        from_array(h),
        from_array(activations.reshape(length, 4, size, n)),
    )


def native_gru_sequence_backward(ks, grad_output, grad_h_n, h0, weight_hh, output, activations):
    """The steps in reverse, each the cell's backward and the product w_hh.T @ (the
    step's hidden projections' gradient) for the previous h's; then weight_hh's
    gradient, one product over the steps, and bias_hh's, a sum (Note [Sequence in
    columns] in lamina.nn.recurrent)."""
    hs, w = np.ascontiguousarray(output._data), weight_hh._data
    size, length, n = hs.shape
    dtype = hs.dtype
    rows = 3 * size
    grad_xw, grad_hw = np.empty((rows, length, n), dtype), np.empty((rows, length, n), dtype)
    # the running gradient of h, which the steps overwrite: a copy
    grad_h = np.zeros((size, n), dtype) if grad_h_n is None else np.array(grad_h_n._data, order="C")
    grad_x_t, grad_hw_t = np.empty((3, size * n), dtype), np.empty((3, size * n), dtype)
    through_w = np.empty((size, n), dtype)
    h_steps = np.ascontiguousarray(np.moveaxis(hs, 1, 0))  # (L, H, N): each step contiguous
    acts = np.ascontiguousarray(activations._data).reshape(length, 4, size * n)
    h_first, w_t = np.ascontiguousarray(h0._data), w.T
    cell = _kernel(gru_cell_backward_loop, dtype)
    for t in reversed(range(length)):
        if grad_output is not None:
            grad_h += grad_output._data[:, t]
        h_prev = h_steps[t - 1] if t else h_first
        cell(grad_h.reshape(-1), h_prev.reshape(-1), acts[t], grad_x_t, grad_hw_t)
        step = grad_hw_t.reshape(rows, n)
        grad_xw[:, t] = grad_x_t.reshape(rows, n)
        grad_hw[:, t] = step
        gemm.matmul(w_t, step, out=through_w)
        grad_h += through_w
    grad_w = _weight_hh_grad(grad_hw, hs, h_first)
    grad_b = grad_hw.reshape(rows, length * n).sum(axis=1)
    return from_array(grad_xw), from_array(grad_h), from_array(grad_w), from_array(grad_b)


# each cell template's arguments: "v" a vector, "b" blocks (G, n)
_ARGUMENTS = {
    lstm_cell_loop: "bvvvb",
    lstm_cell_backward_loop: "vvvvbbv",
    gru_cell_loop: "bbvb",
    gru_cell_backward_loop: "vvbbb",
}


def _kernel(template, dtype):
    def build():
        kinds = {"v": jit.array(dtype, 1), "b": jit.array(dtype, 2)}
        signature = jit.types.void(*[kinds[k] for k in _ARGUMENTS[template]])
        fn = template(K.vector_sigmoid, K.vector_tanh)
        return jit.compile_kernel(fn, signature, fastmath=frozenset({"contract"}))

    return jit.cached((template, dtype), build)


KERNELS = {
    "native_lstm_cell": native_lstm_cell,
    "native_lstm_cell_backward": native_lstm_cell_backward,
    "native_lstm_sequence": native_lstm_sequence,
    "native_lstm_sequence_backward": native_lstm_sequence_backward,
    "native_gru_sequence": native_gru_sequence,
    "native_gru_sequence_backward": native_gru_sequence_backward,
}


def register(registry):
    for name, fn in KERNELS.items():
        registry.register(name, "cpu", fn)
