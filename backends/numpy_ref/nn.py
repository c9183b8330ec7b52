"""numpy_ref's neural-network primitives: the oracle of the nn kernels.

Written for obviousness, not speed: padding is materialized with np.pad, every kernel
tap is one slice and one einsum, pooling windows are visited tap by tap, adaptive
windows and losses are Python loops, backward passes are the adjoint loops of the
forward ones. Results are computed in NCHW and returned in the input's memory layout
(Note [Layouts]: channels-last stays channels-last), like numba_cpu's. Independent of
numba_cpu: nothing here is shared with it but the operator checks (dispatch/meta.py).
"""

import math

import numpy as np

from lamina.dispatch.meta import pool_output_size
from lamina.dispatch.tensor import bump_version, from_array


def _channels_last(data):
    return (
        data.ndim == 4
        and not data.flags.c_contiguous
        and data.transpose(0, 2, 3, 1).flags.c_contiguous
    )


def _result(out, like):
    """out (logical NCHW values) in the memory layout of the array ``like``."""
    if _channels_last(like) and out.ndim == 4:
        return from_array(np.ascontiguousarray(out.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2))
    return from_array(np.asarray(out, order="C"))


def _batched(a):
    return a[None] if a.ndim == 3 else a


def _unbatched(out, like):
    return out[0] if like.ndim == 3 else out


def _taps(size_out, stride, start):
    """The slice of a padded axis read by one kernel tap at offset ``start``."""
    return slice(start, start + stride * (size_out - 1) + 1, stride)


# ---------------------------------------------------------------- convolution


def _conv_setup(x, weight_shape, padding, groups):
    pt, pb, pl, pr = padding
    xp = np.pad(_batched(x), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    c_out, cin = weight_shape[:2]
    return xp, c_out // groups, cin


def conv2d(ks, input, weight, bias, stride, padding, dilation, groups):
    x, w = input._data, weight._data
    xp, cout, cin = _conv_setup(x, w.shape, padding, groups)
    (sh, sw), (dh, dw) = stride, dilation
    kh, kw = w.shape[2:]
    ho = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((xp.shape[0], w.shape[0], ho, wo), x.dtype)
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cin : (g + 1) * cin, _taps(ho, sh, i * dh), _taps(wo, sw, j * dw)]
                wg = w[g * cout : (g + 1) * cout, :, i, j]
                out[:, g * cout : (g + 1) * cout] += np.einsum("nchw,oc->nohw", patch, wg)
    if bias is not None:
        out += bias._data[:, None, None]
    return _result(_unbatched(out, x), x)


def conv2d_relu(ks, input, weight, bias, stride, padding, dilation, groups):
    return relu(ks, conv2d(ks, input, weight, bias, stride, padding, dilation, groups))


def conv2d_backward_input(ks, grad, weight, input, stride, padding, dilation, groups):
    g, w = _batched(grad._data), weight._data
    shape = _batched(input._data).shape
    pt, pb, pl, pr = padding
    (sh, sw), (dh, dw) = stride, dilation
    cout, cin = w.shape[0] // groups, w.shape[1]
    ho, wo = g.shape[2:]
    gxp = np.zeros((shape[0], shape[1], shape[2] + pt + pb, shape[3] + pl + pr), g.dtype)
    for grp in range(groups):
        for i in range(w.shape[2]):
            for j in range(w.shape[3]):
                part = np.einsum(
                    "nohw,oc->nchw",
                    g[:, grp * cout : (grp + 1) * cout],
                    w[grp * cout : (grp + 1) * cout, :, i, j],
                )
                gxp[
                    :, grp * cin : (grp + 1) * cin, _taps(ho, sh, i * dh), _taps(wo, sw, j * dw)
                ] += part
    gx = gxp[:, :, pt : pt + shape[2], pl : pl + shape[3]]
    return _result(_unbatched(gx, input._data), input._data)


def conv2d_backward_weight(
    ks, grad, input, weight_shape, stride, padding, dilation, groups, bias_grad
):
    g, x = _batched(grad._data), input._data
    xp, cout, cin = _conv_setup(x, weight_shape, padding, groups)
    (sh, sw), (dh, dw) = stride, dilation
    ho, wo = g.shape[2:]
    gw = np.zeros(weight_shape, x.dtype)
    for grp in range(groups):
        for i in range(weight_shape[2]):
            for j in range(weight_shape[3]):
                patch = xp[
                    :, grp * cin : (grp + 1) * cin, _taps(ho, sh, i * dh), _taps(wo, sw, j * dw)
                ]
                gw[grp * cout : (grp + 1) * cout, :, i, j] = np.einsum(
                    "nohw,nchw->oc", g[:, grp * cout : (grp + 1) * cout], patch
                )
    gb = g.sum(axis=(0, 2, 3)) if bias_grad else np.empty(0, x.dtype)
    return from_array(gw), from_array(gb)


def _resample_matrix(table, weights, size):
    """(out, size): each output position's weight on each input position."""
    m = np.zeros((table.shape[0], size))
    taps = 1 if weights is None else table.shape[1]
    for o in range(table.shape[0]):
        for a in range(taps):
            m[o, table[o, a]] += 1.0 if weights is None else weights[o, a]
    return m


def _resample_matrices(rows, cols, row_weights, col_weights, h, w):
    rw, cw = (None if t is None else t._data for t in (row_weights, col_weights))
    return _resample_matrix(rows._data, rw, h), _resample_matrix(cols._data, cw, w)


def resample2d(ks, input, rows, cols, row_weights, col_weights):
    x = input._data
    mh, mw = _resample_matrices(rows, cols, row_weights, col_weights, *x.shape[-2:])
    out = np.einsum("oh,...hw,pw->...op", mh, x, mw).astype(x.dtype)
    return _result(out, x)


def resample2d_backward(ks, grad, rows, cols, row_weights, col_weights, input):
    g, x = grad._data, input._data
    mh, mw = _resample_matrices(rows, cols, row_weights, col_weights, *x.shape[-2:])
    return _result(np.einsum("oh,...op,pw->...hw", mh, g, mw).astype(g.dtype), x)


def linear(ks, input, weight, bias):
    out = input._data @ weight._data.T
    if bias is not None:
        out = out + bias._data
    return from_array(np.ascontiguousarray(out))


def linear_relu(ks, input, weight, bias):
    return relu(ks, linear(ks, input, weight, bias))


# ---------------------------------------------------------------- pooling


def _index_pool(better, fill):
    """Taps visited row by row; a strictly better value or any NaN replaces (PyTorch's
    rule); every window starts at its first tap inside the input."""

    def kernel(ks, input, kernel_size, stride, padding, dilation, ceil_mode):
        x = _batched(input._data)
        n, c, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, padding, dilation
        ho = pool_output_size(h, ph, kh, sh, dh, ceil_mode)
        wo = pool_output_size(w, pw, kw, sw, dw, ceil_mode)
        # padded to cover every window: ceil_mode windows may run past the padding
        span_h, span_w = (ho - 1) * sh + (kh - 1) * dh + 1, (wo - 1) * sw + (kw - 1) * dw + 1
        xp = np.full((n, c, max(span_h, ph + h), max(span_w, pw + w)), fill, x.dtype)
        xp[:, :, ph : ph + h, pw : pw + w] = x
        best = np.full((n, c, ho, wo), fill, x.dtype)
        index = np.full((n, c, ho, wo), -1, np.int64)
        rows = np.arange(ho)[:, None] * sh - ph
        cols = np.arange(wo)[None, :] * sw - pw
        for i in range(kh):
            for j in range(kw):
                ih, iw = rows + i * dh, cols + j * dw
                inside = (ih >= 0) & (ih < h) & (iw >= 0) & (iw < w)
                v = xp[:, :, _taps(ho, sh, i * dh), _taps(wo, sw, j * dw)]
                first = inside & (index == -1)
                take = inside & (better(v, best) | np.isnan(v))
                best = np.where(take, v, best)
                index = np.where(take | first, ih * w + iw, index)
        return (
            _result(_unbatched(best, input._data), input._data),
            _result(_unbatched(index, input._data), input._data),
        )

    return kernel


max_pool2d_with_indices = _index_pool(np.greater, -np.inf)
min_pool2d_with_indices = _index_pool(np.less, np.inf)


def max_pool2d(ks, *args):
    return max_pool2d_with_indices(ks, *args)[0]


def min_pool2d(ks, *args):
    return min_pool2d_with_indices(ks, *args)[0]


def pool2d_scatter(ks, grad, indices, input_shape):
    g, idx = _batched(grad._data), _batched(indices._data)
    shape = tuple(input_shape) if len(input_shape) == 4 else (1, *input_shape)
    gx = np.zeros(shape, g.dtype).reshape(shape[0], shape[1], shape[2] * shape[3])
    for n in range(shape[0]):
        for c in range(shape[1]):
            np.add.at(gx[n, c], idx[n, c].reshape(-1), g[n, c].reshape(-1))
    return _result(_unbatched(gx.reshape(shape), indices._data), indices._data)


def pool2d_gather(ks, x, indices):
    data, idx = _batched(x._data), _batched(indices._data)
    # explicit sizes: -1 cannot be inferred for an empty batch
    planes = data.reshape(*data.shape[:2], data.shape[2] * data.shape[3])
    flat = idx.reshape(*idx.shape[:2], idx.shape[2] * idx.shape[3])
    out = np.take_along_axis(planes, flat, axis=2).reshape(idx.shape)
    return _result(_unbatched(out, indices._data), indices._data)


def _avg_taps(h, w, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor):
    """Per tap (i, j): its padded slice start and mask of windows it counts in, and each
    window's divisor: counted tap by tap."""
    (kh, kw), (sh, sw), (ph, pw) = kernel_size, stride, padding
    ho = pool_output_size(h, ph, kh, sh, 1, ceil_mode)
    wo = pool_output_size(w, pw, kw, sw, 1, ceil_mode)
    rows, cols = np.arange(ho)[:, None] * sh - ph, np.arange(wo)[None, :] * sw - pw
    count = np.zeros((ho, wo))
    for i in range(kh):
        for j in range(kw):
            ih, iw = rows + i, cols + j
            lo_h, hi_h = (-ph, h + ph) if count_include_pad else (0, h)
            lo_w, hi_w = (-pw, w + pw) if count_include_pad else (0, w)
            count += (ih >= lo_h) & (ih < hi_h) & (iw >= lo_w) & (iw < hi_w)
    divisors = np.full((ho, wo), float(divisor)) if divisor is not None else count
    return ho, wo, divisors


def _padded(shape, kernel_size, stride, padding, ho, wo, dtype):
    (kh, kw), (sh, sw), (ph, pw) = kernel_size, stride, padding
    n, c, h, w = shape
    return np.zeros(
        (n, c, max(h + 2 * ph, (ho - 1) * sh + kh), max(w + 2 * pw, (wo - 1) * sw + kw)), dtype
    )


def avg_pool2d(ks, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor):
    x = _batched(input._data)
    h, w = x.shape[2:]
    ho, wo, divisors = _avg_taps(
        h, w, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor
    )
    (kh, kw), (sh, sw), (ph, pw) = kernel_size, stride, padding
    xp = _padded(x.shape, kernel_size, stride, padding, ho, wo, x.dtype)
    xp[:, :, ph : ph + h, pw : pw + w] = x
    total = np.zeros(x.shape[:2] + (ho, wo), x.dtype)
    for i in range(kh):
        for j in range(kw):
            total += xp[:, :, _taps(ho, sh, i), _taps(wo, sw, j)]
    return _result(_unbatched((total / divisors).astype(x.dtype), input._data), input._data)


def avg_pool2d_backward(ks, grad, input, kernel_size, stride, padding, ceil_mode, cip, div):
    g = _batched(grad._data)
    shape = _batched(input._data).shape
    h, w = shape[2:]
    ho, wo, divisors = _avg_taps(h, w, kernel_size, stride, padding, ceil_mode, cip, div)
    (kh, kw), (sh, sw), (ph, pw) = kernel_size, stride, padding
    gxp = _padded(shape, kernel_size, stride, padding, ho, wo, g.dtype)
    for i in range(kh):
        for j in range(kw):
            gxp[:, :, _taps(ho, sh, i), _taps(wo, sw, j)] += (g / divisors).astype(g.dtype)
    gx = gxp[:, :, ph : ph + h, pw : pw + w]
    return _result(_unbatched(gx, input._data), input._data)


def _adaptive_bounds(size, out):
    return [(o * size // out, -(-(o + 1) * size // out)) for o in range(out)]


def adaptive_avg_pool2d(ks, input, output_size):
    x = _batched(input._data)
    rows, cols = (
        _adaptive_bounds(x.shape[2], output_size[0]),
        _adaptive_bounds(x.shape[3], output_size[1]),
    )
    out = np.empty(x.shape[:2] + tuple(output_size), x.dtype)
    for a, (h0, h1) in enumerate(rows):
        for b, (w0, w1) in enumerate(cols):
            out[:, :, a, b] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return _result(_unbatched(out, input._data), input._data)


def adaptive_avg_pool2d_backward(ks, grad, input):
    g = _batched(grad._data)
    shape = _batched(input._data).shape
    gx = np.zeros(shape, g.dtype)
    rows, cols = _adaptive_bounds(shape[2], g.shape[2]), _adaptive_bounds(shape[3], g.shape[3])
    for a, (h0, h1) in enumerate(rows):
        for b, (w0, w1) in enumerate(cols):
            gx[:, :, h0:h1, w0:w1] += g[:, :, a : a + 1, b : b + 1] / ((h1 - h0) * (w1 - w0))
    return _result(_unbatched(gx, input._data), input._data)


# ---------------------------------------------------------------- normalization


def _channel_axes(x):
    return tuple(d for d in range(x.ndim) if d != 1), tuple(
        -1 if d == 1 else 1 for d in range(x.ndim)
    )


def native_batch_norm(
    ks, input, weight, bias, running_mean, running_var, training, momentum, eps, relu
):
    x = input._data.astype(np.float64)
    axes, shape = _channel_axes(x)
    if training:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        count = x.size // x.shape[1]
        for stat, batch in ((running_mean, mean), (running_var, var * count / (count - 1))):
            if stat is not None:
                stat._data[...] = (1 - momentum) * stat._data + momentum * batch
                bump_version(stat)
    else:
        mean, var = running_mean._data.astype(np.float64), running_var._data.astype(np.float64)
    invstd = 1 / np.sqrt(var + eps)
    out = (x - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        out = out * weight._data.reshape(shape)
    if bias is not None:
        out = out + bias._data.reshape(shape)
    dtype = input._data.dtype
    out = np.where(out < 0, 0.0, out) if relu else out  # NaN and -0.0 pass (as relu)
    out = out.astype(dtype)
    return (
        _result(out, input._data),
        from_array(mean.astype(dtype)),
        from_array(invstd.astype(dtype)),
    )


def native_batch_norm_backward(ks, grad, input, weight, mean, invstd, training, result):
    if result is not None:  # batch norm with relu: relu's backward first
        grad = relu_backward(ks, grad, result)
    x, g = input._data.astype(np.float64), grad._data.astype(np.float64)
    axes, shape = _channel_axes(x)
    m, inv = mean._data.reshape(shape), invstd._data.reshape(shape)
    xhat = (x - m) * inv
    w = np.ones(x.shape[1]) if weight is None else weight._data
    gb, gw = g.sum(axis=axes), (g * xhat).sum(axis=axes)
    if training:
        gx = (
            w.reshape(shape)
            * inv
            * (
                g
                - g.mean(axis=axes, keepdims=True)
                - xhat * (g * xhat).mean(axis=axes, keepdims=True)
            )
        )
    else:
        gx = g * w.reshape(shape) * inv
    dtype = input._data.dtype
    return (
        _result(gx.astype(dtype), input._data),
        from_array(gw.astype(dtype)),
        from_array(gb.astype(dtype)),
    )


def _window_sum_of_squares(x, size):
    c = x.shape[1]
    total = np.zeros_like(x, dtype=np.float64)
    for ch in range(c):
        for other in range(ch - size // 2, ch + (size - 1) // 2 + 1):
            if 0 <= other < c:
                total[:, ch] += x[:, other].astype(np.float64) ** 2
    return total


def native_lstm_cell(ks, gates, c):
    z, c0 = gates._data.astype(np.float64), c._data.astype(np.float64)
    i, f, o = (1 / (1 + np.exp(-z[k])) for k in (0, 1, 3))
    g = np.tanh(z[2])
    c1 = f * c0 + i * g
    dtype = c._data.dtype
    return tuple(from_array(a.astype(dtype)) for a in (o * np.tanh(c1), c1, np.stack([i, f, g, o])))


def native_lstm_cell_backward(ks, grad_h, grad_c, c, c_next, activations):
    i, f, g, o = activations._data.astype(np.float64)
    c0, t = c._data.astype(np.float64), np.tanh(c_next._data.astype(np.float64))
    zero = np.zeros_like(c0)
    gh = zero if grad_h is None else grad_h._data.astype(np.float64)
    gc = (zero if grad_c is None else grad_c._data.astype(np.float64)) + gh * o * (1 - t * t)
    gates = np.stack(
        [gc * g * i * (1 - i), gc * c0 * f * (1 - f), gc * i * (1 - g * g), gh * t * o * (1 - o)]
    )
    dtype = c._data.dtype
    return from_array(gates.astype(dtype)), from_array((gc * f).astype(dtype))


def _sigmoid64(x):
    return 1 / (1 + np.exp(-x))


def native_lstm_sequence(ks, projections, h0, c0, weight_hh):
    xw, w = projections._data.astype(np.float64), weight_hh._data.astype(np.float64)
    h, c = h0._data.astype(np.float64), c0._data.astype(np.float64)
    hs, cs, acts = [], [], []
    for t in range(xw.shape[1]):
        z = (xw[:, t] + w @ h).reshape(4, *h.shape)
        i, f, g, o = _sigmoid64(z[0]), _sigmoid64(z[1]), np.tanh(z[2]), _sigmoid64(z[3])
        c = f * c + i * g
        h = o * np.tanh(c)
        hs.append(h)
        cs.append(c)
        acts.append(np.stack([i, f, g, o]))
    size, n = h.shape
    results = (
        np.stack(hs, axis=1) if hs else np.zeros((size, 0, n)),
        h,
        c,
        np.stack(cs) if cs else np.zeros((0, size, n)),
        np.stack(acts) if acts else np.zeros((0, 4, size, n)),
    )
    return tuple(from_array(a.astype(h0._data.dtype)) for a in results)


def native_lstm_sequence_backward(
    ks, grad_output, grad_h_n, grad_c_n, h0, c0, weight_hh, output, cs, activations
):
    def f64(t, shape):
        return np.zeros(shape) if t is None else t._data.astype(np.float64)

    hs = output._data.astype(np.float64)
    size, length, n = hs.shape
    w, c_all = weight_hh._data.astype(np.float64), cs._data.astype(np.float64)
    acts = activations._data.astype(np.float64)
    go = f64(grad_output, hs.shape)
    gh, gc = f64(grad_h_n, (size, n)), f64(grad_c_n, (size, n))
    h_prev = np.concatenate([h0._data.astype(np.float64)[:, None], hs[:, :-1]], axis=1)
    c_prev = np.concatenate([c0._data.astype(np.float64)[None], c_all[:-1]])
    grad_xw, grad_w = np.zeros((4 * size, length, n)), np.zeros(w.shape)
    for t in reversed(range(length)):
        i, f, g, o = acts[t]
        gh = gh + go[:, t]
        tc = np.tanh(c_all[t])
        gc = gc + gh * o * (1 - tc * tc)
        dz = np.concatenate(
            [
                gc * g * i * (1 - i),
                gc * c_prev[t] * f * (1 - f),
                gc * i * (1 - g * g),
                gh * tc * o * (1 - o),
            ]
        )
        grad_xw[:, t] = dz
        grad_w += dz @ h_prev[:, t].T
        gh, gc = w.T @ dz, gc * f
    dtype = output._data.dtype
    return tuple(from_array(a.astype(dtype)) for a in (grad_xw, gh, gc, grad_w))


def native_gru_sequence(ks, projections, h0, weight_hh, bias_hh):
    xw, w = projections._data.astype(np.float64), weight_hh._data.astype(np.float64)
    b = 0.0 if bias_hh is None else bias_hh._data.astype(np.float64)[:, None]
    h = h0._data.astype(np.float64)
    hs, acts = [], []
    for t in range(xw.shape[1]):
        x_r, x_z, x_n = np.split(xw[:, t], 3)
        h_r, h_z, h_n = np.split(w @ h + b, 3)
        r, z = _sigmoid64(x_r + h_r), _sigmoid64(x_z + h_z)
        n_t = np.tanh(x_n + r * h_n)
        h = (1 - z) * n_t + z * h
        hs.append(h)
        acts.append(np.stack([r, z, n_t, h_n]))
    size, n = h.shape
    results = (
        np.stack(hs, axis=1) if hs else np.zeros((size, 0, n)),
        h,
        np.stack(acts) if acts else np.zeros((0, 4, size, n)),
    )
    return tuple(from_array(a.astype(h0._data.dtype)) for a in results)


def native_gru_sequence_backward(ks, grad_output, grad_h_n, h0, weight_hh, output, activations):
    hs = output._data.astype(np.float64)
    size, length, n = hs.shape
    w, acts = weight_hh._data.astype(np.float64), activations._data.astype(np.float64)
    go = np.zeros(hs.shape) if grad_output is None else grad_output._data.astype(np.float64)
    gh = np.zeros((size, n)) if grad_h_n is None else grad_h_n._data.astype(np.float64)
    h_prev = np.concatenate([h0._data.astype(np.float64)[:, None], hs[:, :-1]], axis=1)
    grad_xw, grad_w = np.zeros((3 * size, length, n)), np.zeros(w.shape)
    grad_b = np.zeros(3 * size)
    for t in reversed(range(length)):
        r, z, n_t, h_n = acts[t]
        gh = gh + go[:, t]
        d_n = gh * (1 - z) * (1 - n_t * n_t)
        d_z = gh * (h_prev[:, t] - n_t) * z * (1 - z)
        d_r = d_n * h_n * r * (1 - r)
        d_hw = np.concatenate([d_r, d_z, d_n * r])
        grad_xw[:, t] = np.concatenate([d_r, d_z, d_n])
        grad_w += d_hw @ h_prev[:, t].T
        grad_b += d_hw.sum(axis=1)
        gh = w.T @ d_hw + gh * z
    dtype = output._data.dtype
    return tuple(from_array(a.astype(dtype)) for a in (grad_xw, gh, grad_w, grad_b))


def native_layer_norm(ks, input, normalized_shape, weight, bias, eps):
    x = input._data.astype(np.float64)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    with np.errstate(invalid="ignore", divide="ignore"):  # empty slices: NaN rstd
        mean = x.mean(axis=axes, keepdims=True) if x.size else np.zeros(_kept(x, axes))
        var = x.var(axis=axes, keepdims=True) if x.size else np.full(_kept(x, axes), np.nan)
    rstd = 1 / np.sqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight._data
    if bias is not None:
        out = out + bias._data
    dtype = input._data.dtype
    return tuple(from_array(np.asarray(a.astype(dtype), order="C")) for a in (out, mean, rstd))


def _kept(x, axes):
    return tuple(1 if d in axes else n for d, n in enumerate(x.shape))


def _normalized_gradient(g, xhat, rstd, axes):
    """The input gradient of xhat = (x - mean(x)) * rstd(x) given g, the gradient with
    respect to xhat: rstd * (g - mean(g) - xhat * mean(g * xhat)) over ``axes``."""
    return rstd * (
        g - g.mean(axis=axes, keepdims=True) - xhat * (g * xhat).mean(axis=axes, keepdims=True)
    )


def native_layer_norm_backward(ks, grad, input, normalized_shape, mean, rstd, weight):
    x, g = input._data.astype(np.float64), grad._data.astype(np.float64)
    lead = tuple(range(x.ndim - len(normalized_shape)))
    axes = tuple(range(len(lead), x.ndim))
    xhat = (x - mean._data) * rstd._data
    w = 1.0 if weight is None else weight._data.astype(np.float64)
    gx = _normalized_gradient(g * w, xhat, rstd._data, axes) if x.size else g
    dtype = input._data.dtype
    return (
        from_array(np.asarray(gx.astype(dtype), order="C")),
        from_array(np.asarray((g * xhat).sum(axis=lead).astype(dtype), order="C")),
        from_array(np.asarray(g.sum(axis=lead).astype(dtype), order="C")),
    )


def _groups(a, num_groups):
    """a (N, C, ...) as (N, num_groups, C / num_groups * ...)."""
    return a.reshape(a.shape[0], num_groups, a.shape[1] // num_groups * math.prod(a.shape[2:]))


def native_group_norm(ks, input, weight, bias, num_groups, eps):
    x = input._data.astype(np.float64)
    n, c = x.shape[:2]
    xg = _groups(x, num_groups)
    with np.errstate(invalid="ignore", divide="ignore"):  # empty groups: NaN rstd
        mean = xg.mean(axis=2) if xg.shape[2] else np.zeros((n, num_groups))
        rstd = (
            1 / np.sqrt(xg.var(axis=2) + eps) if xg.shape[2] else np.full((n, num_groups), np.nan)
        )
    out = ((xg - mean[:, :, None]) * rstd[:, :, None]).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * weight._data.reshape(shape)
    if bias is not None:
        out = out + bias._data.reshape(shape)
    dtype = input._data.dtype
    return (
        _result(out.astype(dtype), input._data),
        from_array(mean.astype(dtype)),
        from_array(rstd.astype(dtype)),
    )


def native_group_norm_backward(ks, grad, input, mean, rstd, weight, num_groups):
    x, g = input._data.astype(np.float64), grad._data.astype(np.float64)
    c = x.shape[1]
    shape = (1, c) + (1,) * (x.ndim - 2)
    m, inv = mean._data[:, :, None], rstd._data[:, :, None]
    xhat = ((_groups(x, num_groups) - m) * inv).reshape(x.shape)
    w = np.ones(c) if weight is None else weight._data.astype(np.float64)
    gw = _groups(g * w.reshape(shape), num_groups)
    gx = _normalized_gradient(gw, _groups(xhat, num_groups), inv, 2) if x.size else gw
    axes = tuple(d for d in range(x.ndim) if d != 1)
    dtype = input._data.dtype
    return (
        _result(gx.reshape(x.shape).astype(dtype), input._data),
        from_array((g * xhat).sum(axis=axes).astype(dtype)),
        from_array(g.sum(axis=axes).astype(dtype)),
    )


def _embedding_indices(indices, rows):
    i = indices._data.astype(np.int64)
    bad = (i < 0) | (i >= rows)
    if bad.any():
        raise IndexError(f"embedding: index {i[bad][0]} is out of range for {rows} embeddings")
    return i


def embedding(ks, weight, indices, padding_idx):
    return from_array(weight._data[_embedding_indices(indices, weight._shape[0])])


def embedding_dense_backward(ks, grad, indices, num_weights, padding_idx):
    i = _embedding_indices(indices, num_weights).reshape(-1)
    g = grad._data.reshape(i.size, grad._shape[-1])
    out = np.zeros((num_weights, g.shape[1]), g.dtype)
    np.add.at(out, i, g)
    if padding_idx is not None:
        out[padding_idx] = 0
    return from_array(out)


def native_scaled_dot_product_attention(
    ks, query, key, value, attn_mask, is_causal, scale, need_weights
):
    q, k, v = (t._data.astype(np.float64) for t in (query, key, value))
    scores = q @ np.swapaxes(k, -1, -2) * scale
    length, source = scores.shape[-2:]
    mask = np.tril(np.ones((length, source), bool)) if is_causal else None
    mask = attn_mask._data if attn_mask is not None else mask
    if mask is not None and mask.dtype == np.bool_:
        scores = np.where(mask, scores, -np.inf)
    elif mask is not None:
        scores = scores + mask
    top = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    with np.errstate(invalid="ignore"):
        weights = np.exp(scores - top)
        weights = weights / weights.sum(axis=-1, keepdims=True)
    weights = np.where(top == -np.inf, 0.0, weights)  # every key masked: zeros
    dtype = query._data.dtype
    out = from_array(np.ascontiguousarray((weights @ v).astype(dtype)))
    if not need_weights:
        return out, from_array(np.empty(0, dtype))
    return out, from_array(np.ascontiguousarray(weights.astype(dtype)))


def native_scaled_dot_product_attention_backward(ks, grad, query, key, value, weights, scale):
    g, q, k, v, p = (t._data.astype(np.float64) for t in (grad, query, key, value, weights))
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    dtype = query._data.dtype
    grads = (ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g)
    return tuple(from_array(np.ascontiguousarray(x.astype(dtype))) for x in grads)


def native_local_response_norm(ks, input, size, alpha, beta, k):
    x = input._data
    scale = k + alpha / size * _window_sum_of_squares(x, size)
    out = x * scale**-beta
    return _result(out.astype(x.dtype), x), _result(scale.astype(x.dtype), x)


def local_response_norm_backward(ks, grad, input, result, scale, size, alpha, beta, k):
    """d out_c / d x_i = [i == c] s_c**-beta - 2 alpha beta / size * x_c x_i s_c**(-beta-1)
    for every i in channel c's window."""
    x, g = input._data.astype(np.float64), grad._data.astype(np.float64)
    s = k + alpha / size * _window_sum_of_squares(x, size)
    c = x.shape[1]
    gx = g * s**-beta
    for ch in range(c):
        for i in range(ch - size // 2, ch + (size - 1) // 2 + 1):
            if 0 <= i < c:
                gx[:, i] -= (
                    2
                    * alpha
                    * beta
                    / size
                    * g[:, ch]
                    * x[:, ch]
                    * x[:, i]
                    * s[:, ch] ** (-beta - 1)
                )
    return _result(gx.astype(input._data.dtype), input._data)


# ---------------------------------------------------------------- activations


def _keep_layout(out, like):
    """An elementwise result with the memory order of ``like``."""
    res = np.empty_like(like)
    res[...] = out
    return from_array(res)


def relu(ks, input):
    x = input._data  # NaN and -0.0 pass unchanged (PyTorch's clamp_min)
    return _keep_layout(np.where(x < 0, x.dtype.type(0), x), x)


def relu_backward(ks, grad, result):
    # PyTorch's threshold_backward: grad passes where the result is NaN
    return _keep_layout(np.where(result._data <= 0, 0, grad._data), result._data)


def leaky_relu(ks, input, negative_slope):
    x = input._data
    return _keep_layout(np.where(x > 0, x, x * negative_slope), x)


def leaky_relu_backward(ks, grad, input, negative_slope):
    g = grad._data
    return _keep_layout(np.where(input._data > 0, g, g * negative_slope), input._data)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(ks, input, approximate):
    x = input._data.astype(np.float64)
    if approximate == "tanh":
        out = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    else:
        out = x * 0.5 * (1 + _erf(x / math.sqrt(2)))
    return _keep_layout(out, input._data)


def gelu_backward(ks, grad, input, approximate):
    x = input._data.astype(np.float64)
    if approximate == "tanh":
        u = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
        du = math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x**2)
        d = 0.5 * (1 + np.tanh(u)) + 0.5 * x * (1 - np.tanh(u) ** 2) * du
    else:
        d = 0.5 * (1 + _erf(x / math.sqrt(2))) + x * np.exp(-(x**2) / 2) / math.sqrt(2 * math.pi)
    return _keep_layout(grad._data * d, input._data)


def sigmoid(ks, input):
    x = input._data.astype(np.float64)
    with np.errstate(over="ignore"):
        return _keep_layout(1 / (1 + np.exp(-x)), input._data)


def silu(ks, input):
    x = input._data.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # -inf: -inf / inf = NaN
        return _keep_layout(x / (1 + np.exp(-x)), input._data)


def silu_backward(ks, grad, input):
    x = input._data.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        s = 1 / (1 + np.exp(-x))
        return _keep_layout(grad._data * (s * (1 + x * (1 - s))), input._data)


def tanh_backward(ks, grad, result):
    y = result._data.astype(np.float64)
    return _keep_layout(grad._data * (1 - y * y), result._data)


def sigmoid_backward(ks, grad, result):
    y = result._data.astype(np.float64)
    return _keep_layout(grad._data * y * (1 - y), result._data)


def hardtanh(ks, input, min_val, max_val):
    x = input._data  # NaN stays NaN: np.clip propagates it
    return _keep_layout(np.clip(x, min_val, max_val), x)


def hardtanh_backward(ks, grad, input, min_val, max_val):
    x = input._data
    return _keep_layout(np.where((x > min_val) & (x < max_val), grad._data, 0), x)


def hardswish(ks, input):
    x = input._data.astype(np.float64)
    with np.errstate(invalid="ignore"):  # -inf * 0
        return _keep_layout(x * np.clip(x + 3, 0, 6) / 6, input._data)


def hardswish_backward(ks, grad, input):
    x, g = input._data, grad._data
    with np.errstate(invalid="ignore"):  # NaN input: neither branch, grad passes
        d = np.where(x <= -3, 0.0, np.where(x < 3, g * (x / 3 + 0.5), g))
    return _keep_layout(d, x)


def softmax(ks, input, dim):
    x = input._data.astype(np.float64)
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return _keep_layout(e / e.sum(axis=dim, keepdims=True), input._data)


def log_softmax(ks, input, dim):
    x = input._data.astype(np.float64)
    shifted = x - x.max(axis=dim, keepdims=True)
    out = shifted - np.log(np.exp(shifted).sum(axis=dim, keepdims=True))
    return _keep_layout(out, input._data)


def softmax_backward(ks, grad, result, dim):
    g, r = grad._data.astype(np.float64), result._data.astype(np.float64)
    return _keep_layout(r * (g - (g * r).sum(axis=dim, keepdims=True)), result._data)


def log_softmax_backward(ks, grad, result, dim):
    g, r = grad._data.astype(np.float64), result._data.astype(np.float64)
    return _keep_layout(g - np.exp(r) * g.sum(axis=dim, keepdims=True), result._data)


# ---------------------------------------------------------------- losses


def add_scaled_(ks, x1, x2, alpha):
    x1._data += np.asarray(alpha, x1._data.dtype) * x2._data
    return x1


def cross_entropy_loss(ks, input, target, ignore_index):
    x = input._data.astype(np.float64)
    shifted = x - x.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    losses = []
    for row, cls in zip(logp, target._data):
        if cls == ignore_index:
            continue
        if not 0 <= cls < x.shape[1]:
            raise ValueError(
                f"cross_entropy: target values must be class indices in [0, {x.shape[1]}), "
                f"got {cls}"
            )
        losses.append(-row[cls])
    mean = np.mean(losses) if losses else np.nan
    return from_array(np.asarray(mean, input._data.dtype))


def cross_entropy_loss_backward(ks, grad, input, target, ignore_index):
    """(softmax - onehot(target)) * grad / count in the counted rows; an ignored row is
    softmax * 0 (NaN where softmax is)."""
    x = input._data.astype(np.float64)
    t = target._data
    counted = t != ignore_index
    for cls in t[counted]:
        if not 0 <= cls < x.shape[1]:
            raise ValueError(
                f"cross_entropy_loss_backward: target values must be class indices in "
                f"[0, {x.shape[1]}), got {cls}"
            )
    if not x.size:
        return from_array(np.zeros_like(input._data))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out = e / e.sum(axis=1, keepdims=True)
    rows = np.flatnonzero(counted)
    out[rows, t[rows]] -= 1.0
    with np.errstate(divide="ignore", invalid="ignore"):  # nothing counted: no row uses it
        scale = np.where(counted, float(grad._data) / counted.sum(), 0.0)
    return from_array((out * scale[:, None]).astype(input._data.dtype))


def nll_loss(ks, input, target, weight, ignore_index, reduction):
    x = input._data[None] if input._data.ndim == 1 else input._data
    t = target._data.reshape((x.shape[0],) + x.shape[2:])
    classes = x.shape[1]
    logp = np.moveaxis(x, 1, -1).reshape(-1, classes)
    losses, weights = [], []
    for row, cls in zip(logp, t.reshape(-1)):
        if cls == ignore_index:
            losses.append(0.0)
            weights.append(0.0)
            continue
        if not 0 <= cls < classes:
            raise ValueError(
                f"nll_loss: target values must be class indices in [0, {classes}), got {cls}"
            )
        wc = 1.0 if weight is None else float(weight._data[cls])
        losses.append(-row[cls] * wc)
        weights.append(wc)
    losses = np.array(losses, dtype=np.float64)
    if reduction == "none":
        return from_array(losses.reshape(target._shape).astype(x.dtype))
    if reduction == "sum":
        return from_array(np.asarray(losses.sum(), x.dtype))
    with np.errstate(invalid="ignore", divide="ignore"):
        return from_array(np.asarray(losses.sum() / np.sum(weights), x.dtype))


def nll_loss_backward(ks, grad, input, target, weight, ignore_index, reduction):
    x = input._data[None] if input._data.ndim == 1 else input._data
    classes = x.shape[1]
    t = target._data.reshape(-1)
    g = np.broadcast_to(grad._data.astype(np.float64), target._shape).reshape(-1)
    out = np.zeros((t.size, classes))  # one row per target, its classes last
    w = np.ones(classes) if weight is None else weight._data.astype(np.float64)
    counted = []
    for i, cls in enumerate(t):
        if cls == ignore_index:
            continue
        if not 0 <= cls < classes:
            raise ValueError(
                f"nll_loss_backward: target values must be class indices in [0, {classes}), "
                f"got {cls}"
            )
        out[i, cls] = -g[i] * w[cls]
        counted.append(i)
    if reduction == "mean":  # zero total weight: 0 / 0 in the counted rows, as PyTorch's
        with np.errstate(invalid="ignore", divide="ignore"):
            out[counted] /= w[t[counted]].sum()
    rows = out.reshape((x.shape[0],) + x.shape[2:] + (classes,))
    result = np.moveaxis(rows, -1, 1).reshape(input._shape)
    return from_array(np.ascontiguousarray(result, x.dtype))


def mse_loss(ks, input, target, reduction):
    squares = (input._data - target._data) ** 2
    if reduction == "none":
        return from_array(np.asarray(squares, order="C"))
    with np.errstate(invalid="ignore"):
        total = squares.sum() if reduction == "sum" else squares.mean()
    return from_array(np.asarray(total, squares.dtype))


def _reduced_loss(losses, reduction, dtype):
    if reduction == "none":
        return from_array(np.asarray(losses, dtype, order="C"))
    with np.errstate(invalid="ignore"):  # empty: 0 / 0, NaN
        total = losses.sum() if reduction == "sum" else losses.sum() / losses.size
    return from_array(np.asarray(total, dtype))


def smooth_l1_loss(ks, input, target, reduction, beta):
    d = np.abs(input._data.astype(np.float64) - target._data)
    with np.errstate(divide="ignore", invalid="ignore"):  # beta 0: the quadratic unused
        losses = np.where(d < beta, 0.5 * d**2 / beta, d - 0.5 * beta)
    return _reduced_loss(losses, reduction, input._data.dtype)


def smooth_l1_loss_backward(ks, grad, input, target, reduction, beta):
    d = input._data.astype(np.float64) - target._data
    with np.errstate(divide="ignore", invalid="ignore"):  # beta 0: d / beta unused
        slope = np.where(np.abs(d) < beta, d / beta, np.sign(d))
    g = grad._data / (d.size if reduction == "mean" and d.size else 1)
    return from_array(np.asarray(slope * g, input._data.dtype, order="C"))


def binary_cross_entropy_with_logits(ks, input, target, weight, reduction, pos_weight):
    x, t = input._data.astype(np.float64), target._data
    w = 1.0 if weight is None else weight._data
    pw = 1.0 if pos_weight is None else pos_weight._data
    # -log(sigmoid(x)) = log(1 + exp(-x)), -log(1 - sigmoid(x)) = log(1 + exp(x))
    losses = w * (pw * t * np.logaddexp(0, -x) + (1 - t) * np.logaddexp(0, x))
    return _reduced_loss(losses, reduction, input._data.dtype)


def to_layout(ks, input, layout):
    x = input._data
    if layout == "NHWC":
        return from_array(np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2))
    return from_array(np.ascontiguousarray(x))


KERNELS = [
    max_pool2d,
    min_pool2d,
    conv2d,
    conv2d_relu,
    conv2d_backward_input,
    conv2d_backward_weight,
    resample2d,
    resample2d_backward,
    linear,
    linear_relu,
    max_pool2d_with_indices,
    min_pool2d_with_indices,
    pool2d_scatter,
    pool2d_gather,
    avg_pool2d,
    avg_pool2d_backward,
    adaptive_avg_pool2d,
    adaptive_avg_pool2d_backward,
    native_batch_norm,
    native_batch_norm_backward,
    native_layer_norm,
    native_layer_norm_backward,
    native_lstm_cell,
    native_lstm_cell_backward,
    native_lstm_sequence,
    native_lstm_sequence_backward,
    native_gru_sequence,
    native_gru_sequence_backward,
    native_group_norm,
    native_group_norm_backward,
    embedding,
    embedding_dense_backward,
    native_scaled_dot_product_attention,
    native_scaled_dot_product_attention_backward,
    native_local_response_norm,
    local_response_norm_backward,
    relu,
    relu_backward,
    leaky_relu,
    leaky_relu_backward,
    gelu,
    gelu_backward,
    sigmoid,
    silu,
    silu_backward,
    tanh_backward,
    sigmoid_backward,
    hardtanh,
    hardtanh_backward,
    hardswish,
    hardswish_backward,
    softmax,
    log_softmax,
    softmax_backward,
    log_softmax_backward,
    nll_loss,
    cross_entropy_loss,
    cross_entropy_loss_backward,
    add_scaled_,
    nll_loss_backward,
    mse_loss,
    smooth_l1_loss,
    smooth_l1_loss_backward,
    binary_cross_entropy_with_logits,
    to_layout,
]
NAMES = {
    max_pool2d_with_indices: "max_pool2d_with_indices",
    min_pool2d_with_indices: "min_pool2d_with_indices",
}


def register(register):
    """Register every kernel with numpy_ref's ``register(name, fn)``."""
    for fn in KERNELS:
        register(NAMES.get(fn, fn.__name__), fn)
