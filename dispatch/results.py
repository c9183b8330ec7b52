"""What a kernel must return, and the checks of what it did return.

Note [Result rules]: every operator's result follows from its schema entry and its
arguments -- the dtype from the dtype rules (``meta.promote``, ``check_dtype``,
``result_dtype``), the shape from broadcasting, reduced axes or the arguments
(``expected``), the device from the key set (the highest backend key; the target
device for ``to_device``) -- whatever kernel computes it. That is what lets a table
entry check a plugin's kernel without knowing it (Note [Result checks] in
``entries.py``): ``problem`` says what is wrong with a result, or None.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import dtypes as D
from . import keys, layouts, meta
from .schema import Operator
from .tensor import Tensor

Shape = tuple[int, ...]


class KernelResultError(TypeError):
    """A kernel returned something its operator cannot return (not a tensor, a tensor
    on another device, of another dtype or shape than the operator's rules give). The
    message names the operator, the kernel and the plugin it came from."""


def _shape(a: Any) -> Shape:
    return getattr(a, "_shape", ())


# ---------------------------------------------------------------- rules by category


def _elementwise(op: Operator, args: tuple) -> tuple:
    if op.name == "clip":  # x's dtype; the broadcast shape of x and the bounds
        return args[0]._dtype, meta.broadcast_shapes(op.name, *map(_shape, args))
    operands = args[1:] if op.name == "where" else args
    shape = meta.broadcast_shapes(op.name, *map(_shape, args))
    return meta.result_dtype(op, meta.promote(op, operands)), shape


def _reduction(op: Operator, args: tuple) -> tuple:
    x, axis = args[0], args[1]
    keepdims = args[[p.name for p in op.params].index("keepdims")]
    if op.name in ("sum", "prod"):
        dtype = meta.sum_dtype(op, x, args[2])
    else:
        dtype = meta.result_dtype(op, meta.check_dtype(op, x._dtype))
    return dtype, meta.reduced_shape(x._shape, axis, keepdims)


def _same(op: Operator, args: tuple) -> tuple:
    return args[0]._dtype, args[0]._shape


def _getitem(op: Operator, args: tuple) -> tuple:
    """The shape NumPy's indexing gives on a stand-in of x (nothing copied)."""
    x, key = args
    try:
        key = layouts.host_key(key)
    except NotImplementedError:  # a boolean mask: the shape depends on its values
        return x._dtype, None
    return x._dtype, np.shape(layouts.stand_in(x, strided=False)[key])


def _matmul(op: Operator, args: tuple) -> tuple:
    a, b = (_shape(t) for t in args)
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    rows = () if len(a) == 1 else (a2[-2],)  # a vector's and b vector's axes are dropped
    cols = () if len(b) == 1 else (b2[-1],)
    return meta.promote(op, args), (*meta.broadcast_shapes(op.name, a2[:-2], b2[:-2]), *rows, *cols)


def _tensordot(op: Operator, args: tuple) -> tuple:
    a, b, (axes_a, axes_b) = args
    shape = tuple(s for i, s in enumerate(a._shape) if i not in axes_a) + tuple(
        s for i, s in enumerate(b._shape) if i not in axes_b
    )
    return meta.promote(op, args[:2]), shape


def _vecdot(op: Operator, args: tuple) -> tuple:
    a, b, axis = args  # axis: negative, into the broadcast shape (meta.vecdot)
    shape = list(meta.broadcast_shapes(op.name, a._shape, b._shape))
    del shape[axis]
    return meta.promote(op, args[:2]), tuple(shape)


def _concat(op: Operator, args: tuple) -> tuple:
    arrays, axis = args
    dtype = D.result_type(*arrays)
    first = list(arrays[0]._shape)
    if op.name == "stack":
        return dtype, (*first[:axis], len(arrays), *first[axis:])
    first[axis] = sum(t._shape[axis] for t in arrays)
    return dtype, tuple(first)


def _view(op: Operator, args: tuple) -> tuple:
    x, *rest = args
    shape, name = x._shape, op.name
    if name in ("reshape", "broadcast_to"):
        shape = rest[0]
    elif name == "permute_dims":
        shape = tuple(shape[i] for i in rest[0])
    elif name == "matrix_transpose":
        shape = (*shape[:-2], shape[-1], shape[-2])
    elif name == "expand_dims":
        shape = (*shape[: rest[0]], 1, *shape[rest[0] :])
    elif name == "squeeze":
        shape = tuple(s for i, s in enumerate(shape) if i not in rest[0])
    return x._dtype, shape


def _scan(op: Operator, args: tuple) -> tuple:
    x, axis, dtype, include_initial = args
    shape = list(x._shape)
    shape[axis] += bool(include_initial)
    return meta.sum_dtype(op, x, dtype), tuple(shape)


def _sorting(op: Operator, args: tuple) -> tuple:
    x = args[0]
    return (D.int64 if op.result == "index" else x._dtype), x._shape


def _searchsorted(op: Operator, args: tuple) -> tuple:
    return D.int64, _shape(args[1])


def _linalg_float(op: Operator, args: tuple) -> D.DType:
    return meta.result_dtype(op, meta.check_dtype(op, meta.promote(op, args[:1])))


def _linalg(op: Operator, args: tuple) -> tuple:
    """The single-result LAPACK operators of lamina.linalg (the several-result ones are
    checked structurally, as split)."""
    x, name = args[0], op.name
    dtype, shape = _linalg_float(op, args), x._shape
    if name == "det":
        shape = shape[:-2]
    elif name in ("eigvalsh", "svdvals"):
        shape = (*shape[:-2], min(shape[-2:]))
    elif name == "solve":
        a, b = args
        if b.ndim == 1:
            shape = a._shape[:-1]
        else:
            batch = meta.broadcast_shapes(name, a._shape[:-2], b._shape[:-2])
            shape = (*batch, *b._shape[-2:])
        dtype = meta.result_dtype(op, meta.promote(op, args))
    return dtype, shape


def _fft(op: Operator, args: tuple) -> tuple:
    """The transformed axes take the sizes n or s (meta.fft1, meta.fftn); a real-input
    transform keeps the last one's n // 2 + 1 non-negative frequencies."""
    x, sizes, axes, _ = args
    if not isinstance(axes, tuple):  # the one-dimensional transforms
        sizes, axes = (sizes,), (axes,)
    shape = list(x._shape)
    for n, axis in zip(sizes, axes):
        shape[axis] = n
    if op.name in ("rfft", "rfftn", "ihfft"):
        shape[axes[-1]] = sizes[-1] // 2 + 1
    return meta.result_dtype(op, meta.check_dtype(op, x._dtype)), tuple(shape)


def _diagonal(op: Operator, args: tuple) -> tuple:
    x, offset = args
    rows, cols = x._shape[-2:]
    n = max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))
    return x._dtype, (*x._shape[:-2], n)


def _data_dependent(op: Operator, args: tuple) -> tuple:
    """A result whose shape depends on the values (unique_values): its dtype only."""
    return args[0]._dtype, None


def _creation(op: Operator, args: tuple) -> tuple:
    name = op.name
    if name == "arange":
        start, stop, step, dtype = args
        return dtype, (max(0, math.ceil((stop - start) / step)),)
    if name == "linspace":
        return args[3], (args[2],)
    if name == "eye":
        return args[3], (args[0], args[1])
    if name == "from_host":
        return args[1], args[0].shape
    shape, *rest = args  # full(shape, fill, dtype), empty(shape, dtype), rand, randn
    return (rest[1] if name == "full" else rest[0]), shape


def _image_sizes(x: Any, sizes: Shape, channels: int | None = None) -> Shape:
    """x's (N, C, H, W) or unbatched (C, H, W) shape with the spatial sizes replaced
    (and the channels, for a convolution)."""
    lead = x._shape[:-2] if channels is None else (*x._shape[:-3], channels)
    return (*lead, *sizes)


def _conv2d(op: Operator, args: tuple) -> tuple:
    x, weight, _, stride, padding, dilation, _ = args  # padding (top, bottom, left, right)
    sizes = tuple(
        meta.conv_output_size(n, pad, k, s, d)
        for n, pad, k, s, d in zip(
            x._shape[-2:],
            (padding[0] + padding[1], padding[2] + padding[3]),
            weight._shape[2:],
            stride,
            dilation,
        )
    )
    return x._dtype, _image_sizes(x, sizes, weight._shape[0])


def _pool2d(op: Operator, args: tuple) -> tuple:
    """max/min_pool2d (input, kernel, stride, padding, dilation, ceil_mode) and
    avg_pool2d (input, kernel, stride, padding, ceil_mode, ...): dilation 1."""
    x, kernel, stride, padding, *rest = args
    dilation, ceil = (rest[0], rest[1]) if op.name != "avg_pool2d" else ((1, 1), rest[0])
    sizes = tuple(
        meta.pool_output_size(n, p, k, s, d, ceil)
        for n, p, k, s, d in zip(x._shape[-2:], padding, kernel, stride, dilation)
    )
    return x._dtype, _image_sizes(x, sizes)


def _loss(op: Operator, args: tuple) -> tuple:
    """nll_loss (reduction 'none': the target's shape) and mse_loss (the input's)."""
    x, target, reduction = args[0], args[1], args[-1]
    shape = (target if op.name == "nll_loss" else x)._shape
    return x._dtype, shape if reduction == "none" else ()


def _pointwise_loss(i: int) -> Callable[[Operator, tuple], tuple]:
    """A loss of each element, reduced by argument ``i``: the input's shape for 'none'."""
    return lambda op, args: (args[0]._dtype, args[0]._shape if args[i] == "none" else ())


def _like(i: int) -> Callable[[Operator, tuple], tuple]:
    """The dtype of the first argument, the shape of argument ``i`` (a backward
    operator's result has its input's shape)."""
    return lambda op, args: (args[0]._dtype, args[i]._shape)


NN_RULES: dict[str, Callable[[Operator, tuple], tuple]] = {
    **dict.fromkeys(("conv2d", "conv2d_relu"), _conv2d),
    "conv2d_backward_input": _like(2),
    "resample2d": lambda op, args: (
        args[0]._dtype,
        (*args[0]._shape[:-2], args[1]._shape[0], args[2]._shape[0]),
    ),
    "resample2d_backward": _like(5),
    **dict.fromkeys(
        ("linear", "linear_relu"),
        lambda op, args: (args[0]._dtype, (*args[0]._shape[:-1], args[1]._shape[0])),
    ),
    **dict.fromkeys(("max_pool2d", "min_pool2d", "avg_pool2d"), _pool2d),
    "pool2d_scatter": lambda op, args: (args[0]._dtype, args[2]),
    "pool2d_gather": _like(1),
    "adaptive_avg_pool2d": lambda op, args: (args[0]._dtype, _image_sizes(args[0], args[1])),
    # backward operators of (grad, input, ...): the gradient has the input's shape
    **dict.fromkeys(
        ("avg_pool2d_backward", "adaptive_avg_pool2d_backward", "local_response_norm_backward"),
        _like(1),
    ),
    **dict.fromkeys(
        (
            "relu",
            "relu_backward",
            "leaky_relu",
            "leaky_relu_backward",
            "gelu",
            "gelu_backward",
            "sigmoid",
            "silu",
            "silu_backward",
            "tanh_backward",
            "sigmoid_backward",
            "hardtanh",
            "hardtanh_backward",
            "hardswish",
            "hardswish_backward",
            "softmax",
            "log_softmax",
        ),
        _same,
    ),
    **dict.fromkeys(("nll_loss", "mse_loss"), _loss),
    "cross_entropy_loss": lambda op, args: (args[0]._dtype, ()),
    "smooth_l1_loss": _pointwise_loss(2),
    "smooth_l1_loss_backward": _like(1),
    "nll_loss_backward": _like(1),
    "cross_entropy_loss_backward": _like(1),
    "binary_cross_entropy_with_logits": _pointwise_loss(3),
    "embedding": lambda op, args: (args[0]._dtype, (*args[1]._shape, args[0]._shape[1])),
    "embedding_dense_backward": lambda op, args: (
        args[0]._dtype,
        (args[2], args[0]._shape[-1]),
    ),
    **dict.fromkeys(("softmax_backward", "log_softmax_backward"), _like(1)),
}


# ---------------------------------------------------------------- several results


def _batch_norm(op: Operator, args: tuple) -> list:
    """native_batch_norm: (result, mean, inverse standard deviation); its backward:
    the gradients of input, weight and bias."""
    x = args[1] if op.name == "native_batch_norm_backward" else args[0]
    channels = (x._shape[1],)
    return [(x._dtype, x._shape), (x._dtype, channels), (x._dtype, channels)]


def _layer_norm(op: Operator, args: tuple) -> list:
    """native_layer_norm: (result, mean, inverse standard deviation), the statistics
    one per normalized slice, shaped to broadcast; its backward: the gradients of
    input, weight and bias (the last two of normalized_shape)."""
    if op.name == "native_layer_norm_backward":
        x, normalized = args[1], tuple(args[2])
        return [(x._dtype, x._shape)] + [(x._dtype, normalized)] * 2
    x, normalized = args[0], args[1]
    stats = x._shape[: len(x._shape) - len(normalized)] + (1,) * len(normalized)
    return [(x._dtype, x._shape)] + [(x._dtype, stats)] * 2


def _group_norm(op: Operator, args: tuple) -> list:
    """native_group_norm: (result, mean, inverse standard deviation), the statistics
    (N, num_groups); its backward: the gradients of input, weight and bias."""
    if op.name == "native_group_norm_backward":
        x = args[1]
        return [(x._dtype, x._shape)] + [(x._dtype, (x._shape[1],))] * 2
    x, num_groups = args[0], args[3]
    return [(x._dtype, x._shape)] + [(x._dtype, (x._shape[0], num_groups))] * 2


def _with_indices(op: Operator, args: tuple) -> list:
    dtype, shape = _pool2d(op, args)
    return [(dtype, shape), (D.int64, shape)]


def _conv2d_backward_weight(op: Operator, args: tuple) -> list:
    grad, _, weight_shape, *_, bias_grad = args
    biases = weight_shape[0] if bias_grad else 0
    return [(grad._dtype, tuple(weight_shape)), (grad._dtype, (biases,))]


def _split(op: Operator, args: tuple) -> list:
    x, sections, axis = args
    pieces = layouts.VIEWS["split"](layouts.stand_in(x), sections, axis)
    return [(x._dtype, piece.shape) for piece in pieces]


def _eigh(op: Operator, args: tuple) -> list:
    dtype, shape = _linalg_float(op, args), args[0]._shape
    return [(D.real_of(dtype), shape[:-1]), (dtype, shape)]


def _qr(op: Operator, args: tuple) -> list:
    (x, mode), dtype = args, _linalg_float(op, args)
    *batch, m, n = x._shape
    k = m if mode == "complete" else min(m, n)
    return [(dtype, (*batch, m, k)), (dtype, (*batch, k, n))]


def _svd(op: Operator, args: tuple) -> list:
    (x, full), dtype = args, _linalg_float(op, args)
    *batch, m, n = x._shape
    k = min(m, n)
    u, v = (m, n) if full else (k, k)
    return [(dtype, (*batch, m, u)), (D.real_of(dtype), (*batch, k)), (dtype, (*batch, v, n))]


def _slogdet(op: Operator, args: tuple) -> list:
    dtype = _linalg_float(op, args)
    batch = args[0]._shape[:-2]
    return [(dtype, batch), (D.real_of(dtype), batch)]


def _values_and_indices(*index_fields: bool) -> Callable[[Operator, tuple], list]:
    """unique_*: shapes that depend on the values; the values keep x's dtype, the
    indices and counts are int64."""
    return lambda op, args: [(D.int64 if i else args[0]._dtype, None) for i in index_fields]


def _attention(op: Operator, args: tuple) -> list:
    """native_scaled_dot_product_attention: (output (..., L, Ev), weights (..., L, S)
    or an empty (0,) without need_weights); its backward: the gradients of query, key
    and value."""
    if op.name == "native_scaled_dot_product_attention_backward":  # of query, key, value
        return [(t._dtype, t._shape) for t in args[1:4]]
    q, k, v, need_weights = args[0], args[1], args[2], args[-1]
    weights = (*q._shape[:-1], k._shape[-2]) if need_weights else (0,)
    return [(q._dtype, (*q._shape[:-1], v._shape[-1])), (q._dtype, weights)]


def _lstm_cell(op: Operator, args: tuple) -> list:
    """native_lstm_cell: (h, the next c, the activations), as c and as gates; its
    backward: the gradients of gates and c."""
    if op.name == "native_lstm_cell_backward":
        c, activations = args[2], args[4]
        return [(c._dtype, activations._shape), (c._dtype, c._shape)]
    gates, c = args
    return [(c._dtype, c._shape)] * 2 + [(c._dtype, gates._shape)]


def _lstm_sequence(op: Operator, args: tuple) -> list:
    """native_lstm_sequence: (every step's h (H, L, N), the last h and c (H, N), every
    step's c (L, H, N), the activations (L, 4, H, N)); its backward: the gradients of
    projections, h0, c0 and weight_hh, as they are."""
    if op.name == "native_lstm_sequence_backward":
        output, h0, c0, weight_hh = args[6], args[3], args[4], args[5]
        size, length, n = output._shape
        grads = [(4 * size, length, n), h0._shape, c0._shape, weight_hh._shape]
        return [(output._dtype, shape) for shape in grads]
    projections, h0 = args[0], args[1]
    (size, n), length = h0._shape, projections._shape[1]
    shapes = [(size, length, n), (size, n), (size, n), (length, size, n), (length, 4, size, n)]
    return [(h0._dtype, shape) for shape in shapes]


def _gru_sequence(op: Operator, args: tuple) -> list:
    """native_gru_sequence: (every step's h (H, L, N), the last h (H, N), the
    activations (L, 4, H, N)); its backward: the gradients of projections, h0,
    weight_hh and bias_hh (3H,)."""
    if op.name == "native_gru_sequence_backward":
        h0, weight_hh, output = args[2], args[3], args[4]
        size, length, n = output._shape
        grads = [(3 * size, length, n), h0._shape, weight_hh._shape, (3 * size,)]
        return [(output._dtype, shape) for shape in grads]
    projections, h0 = args[0], args[1]
    (size, n), length = h0._shape, projections._shape[1]
    shapes = [(size, length, n), (size, n), (length, 4, size, n)]
    return [(h0._dtype, shape) for shape in shapes]


SEVERAL: dict[str, Callable[[Operator, tuple], list]] = {
    "native_gru_sequence": _gru_sequence,
    "native_gru_sequence_backward": _gru_sequence,
    "native_lstm_sequence": _lstm_sequence,
    "native_lstm_sequence_backward": _lstm_sequence,
    "native_lstm_cell": _lstm_cell,
    "native_lstm_cell_backward": _lstm_cell,
    "native_batch_norm": _batch_norm,
    "native_batch_norm_backward": _batch_norm,
    "native_layer_norm": _layer_norm,
    "native_layer_norm_backward": _layer_norm,
    "native_group_norm": _group_norm,
    "native_group_norm_backward": _group_norm,
    "native_scaled_dot_product_attention": _attention,
    "native_scaled_dot_product_attention_backward": _attention,
    "max_pool2d_with_indices": _with_indices,
    "min_pool2d_with_indices": _with_indices,
    "native_local_response_norm": lambda op, args: [(args[0]._dtype, args[0]._shape)] * 2,
    "conv2d_backward_weight": _conv2d_backward_weight,
    "split": _split,
    "eigh": _eigh,
    "qr": _qr,
    "svd": _svd,
    "slogdet": _slogdet,
    "unique_all": _values_and_indices(False, True, True, True),
    "unique_counts": _values_and_indices(False, True),
    "unique_inverse": _values_and_indices(False, True),
    "nonzero": lambda op, args: [(D.int64, None)] * max(1, len(args[0]._shape)),
}


RULES: dict[str, Callable[[Operator, tuple], tuple]] = {
    "elementwise": _elementwise,
    "reduction": _reduction,
    "view": _view,
    "creation": _creation,
    "fft": _fft,
    "manipulation": _concat,
    # by operator name
    "getitem": _getitem,
    "index_add": _same,
    "matmul": _matmul,
    "tensordot": _tensordot,
    "vecdot": _vecdot,
    "astype": lambda op, args: (args[1], args[0]._shape),
    "copy": _same,
    "to_dense": _same,
    "to_sparse": _same,
    "coalesce": _same,
    "sparse_mask": lambda op, args: (args[0]._dtype, args[1]._shape),
    "to_device": _same,
    "scan": _scan,
    "sorting": _sorting,
    "searchsorted": _searchsorted,
    "unique_values": _data_dependent,
    "diagonal": _diagonal,
    **dict.fromkeys(("cholesky", "det", "inv", "solve", "eigvalsh", "svdvals"), _linalg),
    **NN_RULES,
}


# ---------------------------------------------------------------- descriptions


@dataclass(frozen=True)
class Description:
    """One result of an operator call, as its description gives it (Note [Result
    rules]): dtype, shape (None where it depends on the values), strides in elements
    (None with the shape), the backend key of its device, and the position of the
    argument whose storage it views (None for a new tensor)."""

    dtype: D.DType
    shape: Shape | None
    strides: Shape | None
    key: int
    view_of: int | None = None


def describe(op: Operator, ks: int, args: tuple) -> list[Description]:
    """What ``op`` returns for the canonical ``args`` (checked, as its kernels get
    them) and key set ``ks``: one Description per result, read by the meta device
    and the plugin result checks. ValueError for an operator without a rule."""
    if not has_description(op):
        raise ValueError(f"{op.name}: no description (an in-place operator returns its input)")
    found = (SEVERAL.get(op.name) or RULES.get(op.name) or RULES[op.category])(op, args)
    found = found if isinstance(found, list) else [found]
    key = expected_key(op, ks, args)
    if op.name == "astype" and not args[2] and args[1] is args[0]._dtype:
        return [Description(args[1], args[0]._shape, layouts.strides_of(args[0]), key, 0)]
    if "view" in op.tags:
        if any(shape is None for _, shape in found):
            return [Description(dtype, None, None, key, 0) for dtype, _ in found]
        return [
            Description(dtype, shape, strides, key, 0)
            for (dtype, shape), strides in zip(found, layouts.view_strides(op, args))
        ]
    like = layouts.layout_source(op, args)
    return [
        Description(
            dtype, shape, None if shape is None else layouts.new_strides(op, shape, like), key
        )
        for dtype, shape in found
    ]


def has_description(op: Operator) -> bool:
    """Whether ``describe`` knows ``op``'s results: every operator's but the in-place
    ones (they return their first argument); a test keeps it so."""
    return "inplace" not in op.tags and (
        op.name in SEVERAL or op.name in RULES or op.category in RULES
    )


# ---------------------------------------------------------------- checks


def expected_key(op: Operator, ks: int, args: tuple) -> int:
    """The backend key of the device ``op``'s result lives on."""
    if op.name == "to_device":
        return keys.device_key(str(args[1]))
    backend = ks & keys.BACKEND_MASK
    return 1 << (backend.bit_length() - 1) if backend else keys.CPU


def _what(out: Any) -> str:
    if isinstance(out, Tensor):
        return (
            f"a tensor on {', '.join(keys.device_names(out._ks)) or 'no device'} of dtype "
            f"{out._dtype.name} and shape {out._shape}"
        )
    if out is NotImplemented:
        return "NotImplemented (a kernel that may decline registers with declines=True)"
    return f"{type(out).__name__} {out!r:.60}"


def _inconsistent(t: Tensor) -> str | None:
    """How a CPU tensor's fields disagree with its NumPy storage (Note [Tensor fields]:
    kernels trust the fields, so a mismatch would make them read out of bounds)."""
    data = t._data
    if not isinstance(data, np.ndarray) or t._ks & keys.SPARSE:
        return None
    if data.shape != t._shape or data.dtype != t._dtype.np:
        return f"whose storage is {data.dtype} of shape {data.shape}"
    flat = t._flat
    if flat is not None and (flat.ndim != 1 or flat.size != data.size or flat.dtype != data.dtype):
        return f"whose flat alias has {flat.size} elements"
    return None


def problem(op: Operator, ks: int, args: tuple, out: Any, full: bool = True) -> str | None:
    """What is wrong with ``out`` as the result of ``op`` on ``args`` with key set
    ``ks``: not a tensor (a tuple of them for split; the first argument itself for an
    in-place operator), on another device, or -- with ``full`` -- of another dtype or
    shape than Note [Result rules] gives. None when nothing is."""
    key = expected_key(op, ks, args)
    if "inplace" in op.tags:
        return None if out is args[0] else f"returned {_what(out)}, not its first argument"
    several = op.returns != "Tensor"  # split, nonzero, the named results (result_types)
    outs = out if several and isinstance(out, tuple) else (out,)
    for o in outs:
        if o.__class__ is not Tensor:
            want = "a tuple of tensors" if several else "a lamina tensor"
            return f"returned {_what(out)}, not {want} (wrap arrays with new_tensor)"
        if o._ks & keys.BACKEND_MASK != key:
            return f"returned {_what(o)}, not a tensor on {keys.device_names(key)[0]}"
        inconsistent = _inconsistent(o)
        if inconsistent:
            return f"returned {_what(o)} {inconsistent} (made with from_flat?)"
    if not full or not has_description(op):
        return None
    try:
        described = describe(op, ks, args)
    except (TypeError, ValueError, IndexError, NotImplementedError) as exc:
        return f"returned {_what(out)} for arguments the operator's rules refuse ({exc})"
    if len(outs) != len(described):
        return f"returned {len(outs)} results, but the operator's rules give {len(described)}"
    for o, d in zip(outs, described):
        if o._dtype is not d.dtype or (d.shape is not None and o._shape != tuple(d.shape)):
            given = ", ".join(
                f"{a._dtype.name} {a._shape}" if isinstance(a, Tensor) else type(a).__name__
                for a in (args[0] if op.category == "manipulation" else args)
            )
            want = f"dtype {d.dtype.name}" + ("" if d.shape is None else f" and shape {d.shape}")
            return (
                f"returned {_what(o)}, but the operator's rules give {want} for these "
                f"arguments ({given})"
            )
    return None
