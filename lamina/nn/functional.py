"""``lamina.nn.functional``: the neural-network functions, PyTorch's names, signatures
and semantics (code ports by changing the import).

The dispatched operators of namespace "nn.functional" (dispatch/operators.py: conv2d,
linear, the poolings, relu, softmax, the losses, to_layout, ...) are installed here
from the schema (their signatures: ``functional.pyi``, generated beside this file); the
functions below are composites of operators, as in PyTorch:
pooling with ``return_indices``, batch, layer, group and local response
normalization over the internal operators that also return what backward needs,
embedding, scaled_dot_product_attention, cross_entropy, dropout, flatten and
``layout_of``; conv1d, conv_transpose1d and conv_transpose2d over conv2d's operators,
pad and interpolate over resample2d (Note [Resampling]); the activations with PyTorch's
``inplace`` over their operators (Note [In-place activations]).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from lamina.autograd import is_grad_enabled
from lamina.dispatch import arguments, bindings, dtypes, layouts, meta, ops
from lamina.dispatch.arguments import checked
from lamina.dispatch.decompositions import attention_weights
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import Tensor

bindings.install(globals(), "nn.functional")

_NATIVE_BATCH_NORM = OPERATORS["native_batch_norm"]
_NATIVE_LAYER_NORM = OPERATORS["native_layer_norm"]
_NATIVE_GROUP_NORM = OPERATORS["native_group_norm"]
_EMBEDDING = OPERATORS["embedding"]
_ATTENTION = OPERATORS["native_scaled_dot_product_attention"]
_NATIVE_LRN = OPERATORS["native_local_response_norm"]
_CONV_INPUT = OPERATORS["conv2d_backward_input"]
_RESAMPLE = OPERATORS["resample2d"]
# the internal pooling operators without indices, behind bindings that check arguments
_max_pool_values = bindings.generated_binding(OPERATORS["max_pool2d"])
_min_pool_values = bindings.generated_binding(OPERATORS["min_pool2d"])
_cross_entropy_loss = bindings.generated_binding(OPERATORS["cross_entropy_loss"])
# the activations' operators, which the functions of the same names call: Note
# [In-place activations]
_relu, _leaky_relu, _hardtanh, _silu, _hardswish = (
    bindings.generated_binding(OPERATORS[name])
    for name in ("relu", "leaky_relu", "hardtanh", "silu", "hardswish")
)
_COMPOSITES = [
    "adaptive_max_pool2d",
    "batch_norm",
    "binary_cross_entropy",
    "conv1d",
    "conv_transpose1d",
    "conv_transpose2d",
    "cross_entropy",
    "dropout",
    "elu",
    "embedding",
    "flatten",
    "kl_div",
    "l1_loss",
    "group_norm",
    "hardswish",
    "hardtanh",
    "huber_loss",
    "layer_norm",
    "leaky_relu",
    "interpolate",
    "layout_of",
    "local_response_norm",
    "max_pool2d",
    "min_pool2d",
    "one_hot",
    "pixel_shuffle",
    "pixel_unshuffle",
    "relu",
    "relu6",
    "scaled_dot_product_attention",
    "silu",
    "softplus",
    "pad",
]
__all__ = sorted({op.name for op in bindings.public_operators("nn.functional")} | set(_COMPOSITES))

Size2 = int | tuple[int, int]


@checked
def max_pool2d(
    input: Tensor,
    kernel_size: Size2,
    stride: Size2 | None = None,
    padding: Size2 = 0,
    dilation: Size2 = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The largest value of each kernel_size window (padding counts as -inf); with
    return_indices also its flat index into the H x W plane (max_pool2d_with_indices).
    The indices are computed only when returned or needed for a gradient."""
    args = (input, kernel_size, stride, padding, dilation, ceil_mode)
    if return_indices or _needs_grad(input):
        out, indices = max_pool2d_with_indices(*args)  # noqa: F821 (from the schema)
        return (out, indices) if return_indices else out
    return _max_pool_values(*args)


@checked
def min_pool2d(
    input: Tensor,
    kernel_size: Size2,
    stride: Size2 | None = None,
    padding: Size2 = 0,
    dilation: Size2 = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The smallest value of each window (padding counts as +inf): max_pool2d's mirror
    image, with the same signature (seed 2's minimum pooling)."""
    args = (input, kernel_size, stride, padding, dilation, ceil_mode)
    if return_indices or _needs_grad(input):
        out, indices = min_pool2d_with_indices(*args)  # noqa: F821 (from the schema)
        return (out, indices) if return_indices else out
    return _min_pool_values(*args)


def _needs_grad(input: Tensor) -> bool:
    return is_grad_enabled() and input.requires_grad


@checked
def adaptive_max_pool2d(
    input: Tensor, output_size: Size2, return_indices: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
    """The largest value of each window [floor(i H / h), ceil((i + 1) H / h)) x (the
    same along W), and with return_indices its flat index into the H x W plane; max
    pooling's rules (the first largest value, a NaN wins). Where the input's size is a
    multiple of output_size the windows are max_pool2d's."""
    h, w = input.shape[-2:]
    sizes = meta.adaptive_output_size("adaptive_max_pool2d", input, output_size)
    if h % sizes[0] == 0 and w % sizes[1] == 0:
        kernel = (h // sizes[0], w // sizes[1])
        return max_pool2d(input, kernel, kernel, return_indices=return_indices)
    indices = _adaptive_max_indices(input.detach(), sizes)
    if layout_of(input) == "NHWC":  # the values follow the indices' layout
        indices = to_layout(indices, "NHWC")  # noqa: F821 (from the schema)
    out = OPERATORS["pool2d_gather"](input, indices)
    return (out, indices) if return_indices else out


def _adaptive_max_indices(x: Tensor, sizes: tuple[int, int]) -> Tensor:
    """Each adaptive window's argmax (flat into the plane): the window's k-th taps of
    every window, for each k, gathered by resample2d (a window shorter than the longest
    repeats its last tap, which changes no maximum) and the first largest (or NaN)
    taken, window taps in row-major order."""
    taps = []  # per axis: (window tap, output position) -> input position
    for n, o in zip(x.shape[-2:], sizes):
        first = np.arange(o) * n // o
        last = -(-(np.arange(o) + 1) * n // o)  # one past the window
        longest = int((last - first).max())
        taps.append(np.minimum(first[None] + np.arange(longest)[:, None], last[None] - 1))
    candidates = [_resample(x, r, c) for r in taps[0] for c in taps[1]]
    stacked = ops.stack(candidates, axis=-1)
    nan_first = ops.where(ops.isnan(stacked), np.inf, stacked)  # a NaN wins, as in max pooling
    best = ops.argmax(nan_first, axis=-1)
    width = x.shape[-1]
    positions = np.stack([r[:, None] * width + c[None] for r in taps[0] for c in taps[1]])
    table = ops.asarray(positions.transpose(1, 2, 0).reshape(-1), device=x.device)
    flat = best + ops.asarray(
        np.arange(sizes[0] * sizes[1]) * len(candidates), device=x.device
    ).reshape(sizes)
    return table[flat]


# ---------------------------------------------------------------- convolution variants
# Note [Convolution variants]: conv1d is conv2d on images of height 1, and
# conv_transpose2d is conv2d's input gradient (the adjoint of a convolution is the
# transposed convolution): both run conv2d's kernels (depthwise ones included), and
# their gradients are conv2d's operators' formulas -- the transposed convolution's
# input gradient is conv2d, its weight gradient conv2d's weight gradient with the
# roles of input and grad swapped.


@checked
def conv1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int] = 1,
    padding: int | tuple[int] | str = 0,
    dilation: int | tuple[int] = 1,
    groups: int = 1,
) -> Tensor:
    """The 1-D cross-correlation of a (N, C, L) or unbatched (C, L) input with weight
    (C_out, C / groups, k), plus bias (C_out,); padding is an int, 'valid' or 'same'
    (conv2d on images of height 1, Note [Convolution variants])."""
    if input.ndim not in (2, 3):
        raise ValueError(f"conv1d: input must be 2-D or 3-D (N, C, L), got shape {input.shape}")
    if weight.ndim != 3:
        raise ValueError(
            f"conv1d: weight must be 3-D (C_out, C_in / groups, k), got shape {weight.shape}"
        )
    stride, dilation = (
        _single(v, "conv1d", name) for v, name in ((stride, "stride"), (dilation, "dilation"))
    )
    if not isinstance(padding, str):
        padding = (0, _single(padding, "conv1d", "padding"))
    out = conv2d(  # noqa: F821 (from the schema)
        ops.expand_dims(input, axis=-2),
        ops.expand_dims(weight, axis=-2),
        bias,
        (1, stride),
        padding,
        (1, dilation),
        groups,
    )
    return ops.squeeze(out, axis=-2)


def _single(value, fn: str, name: str) -> int:
    """An int or a 1-tuple of one, as an int (PyTorch's ``_single``)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 1:
            raise ValueError(f"{fn}: {name} must be an int or a 1-tuple, got {value!r}")
        value = value[0]
    return arguments.integer(value, fn, name)


@checked
def conv_transpose2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Size2 = 1,
    padding: Size2 = 0,
    output_padding: Size2 = 0,
    groups: int = 1,
    dilation: Size2 = 1,
) -> Tensor:
    """The transposed convolution (the adjoint of conv2d in its input) of a (N, C_in, H,
    W) or unbatched input with weight (C_in, C_out / groups, kH, kW), plus bias (C_out,):
    output size (H - 1) stride - 2 padding + dilation (kH - 1) + output_padding + 1
    (Note [Convolution variants])."""
    fn = "conv_transpose2d"
    if input.ndim not in (3, 4):
        raise ValueError(f"{fn}: input must be 3-D or 4-D (N, C, H, W), got shape {input.shape}")
    if weight.ndim != 4:
        raise ValueError(
            f"{fn}: weight must be 4-D (C_in, C_out / groups, kH, kW), got shape {weight.shape}"
        )
    if groups < 1 or weight.shape[0] % groups:
        raise ValueError(
            f"{fn}: groups={groups} must be positive and divide the input channels "
            f"({weight.shape[0]} in weight {weight.shape})"
        )
    if input.shape[-3] != weight.shape[0]:
        raise ValueError(
            f"{fn}: input has {input.shape[-3]} channels, but weight {weight.shape} expects "
            f"{weight.shape[0]}"
        )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != input.dtype:
            raise TypeError(f"{fn}: {name} has dtype {t.dtype}, but input has dtype {input.dtype}")
    stride, padding, dilation, output_padding = (
        arguments.pair(v, fn, name)
        for v, name in (
            (stride, "stride"),
            (padding, "padding"),
            (dilation, "dilation"),
            (output_padding, "output_padding"),
        )
    )
    if min(*stride, *dilation) < 1 or min(*padding, *output_padding) < 0:
        raise ValueError(
            f"{fn}: stride and dilation must be positive, padding and output_padding "
            f"non-negative, got stride={stride}, dilation={dilation}, padding={padding}, "
            f"output_padding={output_padding}"
        )
    if any(op >= max(s, d) for op, s, d in zip(output_padding, stride, dilation)):
        raise ValueError(
            f"{fn}: output_padding {output_padding} must be smaller than stride {stride} "
            f"or dilation {dilation}"
        )
    size = tuple(
        (n - 1) * s - 2 * p + d * (k - 1) + op + 1
        for n, s, p, d, k, op in zip(
            input.shape[-2:], stride, padding, dilation, weight.shape[2:], output_padding
        )
    )
    if min(size) < 1:
        raise ValueError(f"{fn}: the output size {size} must be positive (input {input.shape})")
    c_out = weight.shape[1] * groups
    # the convolution whose input gradient this is: only its shape and layout are read
    batch = input.shape[:-3]
    like = ops.empty((*batch, *size, c_out), dtype=input.dtype, device=input.device)
    like = ops.permute_dims(like, (0, 3, 1, 2) if batch else (2, 0, 1))
    if layout_of(input) != "NHWC":
        like = ops.empty((*batch, c_out, *size), dtype=input.dtype, device=input.device)
    # output_padding of a stride or more (allowed below the dilation) adds rows that the
    # convolution's last outputs read: they come from zero rows of input
    extra = [op // s for op, s in zip(output_padding, stride)]
    if any(extra):
        input = pad(input, (0, extra[1], 0, extra[0]))
    pads = (padding[0], padding[0], padding[1], padding[1])
    out = _CONV_INPUT(input, weight, like, stride, pads, dilation, groups)
    if bias is None:
        return out
    if bias.shape != (c_out,):
        raise ValueError(f"{fn}: bias must have shape ({c_out},), got {bias.shape}")
    return out + ops.reshape(bias, (c_out, 1, 1))


@checked
def conv_transpose1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int] = 1,
    padding: int | tuple[int] = 0,
    output_padding: int | tuple[int] = 0,
    groups: int = 1,
    dilation: int | tuple[int] = 1,
) -> Tensor:
    """The 1-D transposed convolution of a (N, C_in, L) or unbatched (C_in, L) input
    with weight (C_in, C_out / groups, k), plus bias (C_out,): output length (L - 1)
    stride - 2 padding + dilation (k - 1) + output_padding + 1 (conv_transpose2d on
    images of height 1, Note [Convolution variants])."""
    fn = "conv_transpose1d"
    if input.ndim not in (2, 3):
        raise ValueError(f"{fn}: input must be 2-D or 3-D (N, C, L), got shape {input.shape}")
    if weight.ndim != 3:
        raise ValueError(
            f"{fn}: weight must be 3-D (C_in, C_out / groups, k), got shape {weight.shape}"
        )
    stride, padding, output_padding, dilation = (
        _single(v, fn, name)
        for v, name in (
            (stride, "stride"),
            (padding, "padding"),
            (output_padding, "output_padding"),
            (dilation, "dilation"),
        )
    )
    out = conv_transpose2d(
        ops.expand_dims(input, axis=-2),
        ops.expand_dims(weight, axis=-2),
        bias,
        (1, stride),
        (0, padding),
        (0, output_padding),
        groups,
        (1, dilation),
    )
    return ops.squeeze(out, axis=-2)


# ---------------------------------------------------------------- padding and resizing


@checked
def pad(
    input: Tensor, pad: tuple[int, ...], mode: str = "constant", value: float | None = None
) -> Tensor:
    """input padded on its last len(pad) // 2 axes: pad is (before, after) for the last
    axis, then for the one before it, ... (PyTorch's order). 'constant' fills with value
    (0 by default), on any axes; 'reflect' mirrors without repeating the edge,
    'replicate' repeats the edge, 'circular' wraps around, on the last 1-3 axes of a 2-5-D
    input (a batch of one or more channels). A negative pad crops, in every mode (Note
    [Negative pads])."""
    pad = tuple(pad)
    if len(pad) % 2 or not pad or len(pad) // 2 > input.ndim:
        raise ValueError(
            f"pad: pad must hold an even number of ints, two per padded axis, at most "
            f"{2 * input.ndim} for a {input.ndim}-D input, got {pad}"
        )
    pad = tuple(arguments.integer(p, "pad", "pad") for p in pad)
    axes = range(input.ndim - 1, input.ndim - 1 - len(pad) // 2, -1)  # last axis first
    if mode == "constant":
        fill = 0.0 if value is None else value
        pixels_last = len(pad) <= 4 and input.ndim == 4 and layout_of(input) == "NHWC"
        if pixels_last:  # pad the (N, H, W, C) view: its concats copy contiguous runs
            input, axes = ops.permute_dims(input, (0, 2, 3, 1)), (2, 1)
        for axis, (before, after) in zip(axes, zip(pad[::2], pad[1::2])):
            input = _pad_constant(input, axis, before, after, fill)
        return ops.permute_dims(input, (0, 3, 1, 2)) if pixels_last else input
    if mode not in _PAD_INDICES:
        raise ValueError(
            f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}"
        )
    if value:
        raise ValueError(f"pad: value applies to mode 'constant' only, got mode {mode!r}")
    dims = len(pad) // 2
    if dims > 3 or input.ndim not in (dims + 1, dims + 2):
        raise ValueError(
            f"pad: mode {mode!r} pads the last 1-3 axes of a (batch and) channels input: "
            f"{len(pad)} pads need a {dims + 1}-D or {dims + 2}-D input, got shape {input.shape}"
        )
    tables = []
    for axis, (before, after) in zip(axes, zip(pad[::2], pad[1::2])):
        size = input.shape[axis]
        if size + before + after < 0:
            raise ValueError(
                f"pad: the pads ({before}, {after}) would crop axis {axis} of size {size} below 0"
            )
        _PAD_CHECKS[mode](before, after, size, axis)
        tables.append(_PAD_INDICES[mode](before, after, size))
    if not all(t.size for t in tables):  # negative pads cropped an axis to nothing
        for axis, table in zip(axes, tables):
            input = ops.take(input, ops.asarray(table, device=input.device), axis=axis)
        return input
    # the last two axes by resample2d (one of height 1 for a single padded axis), a
    # third by indexing
    shape = input.shape
    if dims == 1:
        tables.append(np.zeros(1, np.int64))
        input = ops.expand_dims(input, axis=-2)
    elif dims == 3:
        input = ops.reshape(input, (*shape[:-4], shape[-4] * shape[-3], *shape[-2:]))
    out = _resample(input, tables[1], tables[0])
    if dims == 1:
        return ops.squeeze(out, axis=-2)
    if dims == 3:
        out = ops.reshape(out, (*shape[:-2], *out.shape[-2:]))
        out = out[(slice(None),) * (input.ndim - 3 + dims - 2) + (ops.asarray(tables[2]),)]
    return out


def _resample(input, rows, cols, row_weights=None, col_weights=None):
    """resample2d with tables (NumPy arrays: indices (size,) or (size, taps), weights
    (size, taps)) made tensors on the input's device."""
    device = input.device

    def table(a, dtype=dtypes.int64):
        a = a.reshape(a.shape[0], -1)
        return ops.asarray(np.ascontiguousarray(a), dtype=dtype, device=device)

    weights = (None, None)
    if row_weights is not None:
        weights = (table(row_weights, input.dtype), table(col_weights, input.dtype))
    return _RESAMPLE(*_RESAMPLE.check(input, table(rows), table(cols), *weights))


def _pad_constant(input: Tensor, axis: int, before: int, after: int, fill: float) -> Tensor:
    """input with ``before`` and ``after`` entries of ``fill`` around axis, cropped where
    they are negative."""
    size = input.shape[axis]
    if -before - after > size:
        raise ValueError(
            f"pad: the pads ({before}, {after}) would crop axis {axis} of size {size} below 0"
        )
    input = input[(slice(None),) * axis + (slice(max(-before, 0), size - max(-after, 0)),)]
    parts = []
    for count in (before, after):
        shape = input.shape[:axis] + (max(count, 0),) + input.shape[axis + 1 :]
        parts.append(ops.full(shape, fill, dtype=input.dtype, device=input.device))
    return ops.concat([parts[0], input, parts[1]], axis=axis)


def _reflect_check(before: int, after: int, size: int, axis: int) -> None:
    if max(before, after) >= size:
        raise ValueError(
            f"pad: reflect padding ({before}, {after}) must be smaller than the size {size} "
            f"of axis {axis}"
        )


def _replicate_check(before: int, after: int, size: int, axis: int) -> None:
    if size == 0 and max(before, after) > 0:
        raise ValueError(f"pad: replicate padding ({before}, {after}) needs axis {axis} non-empty")


def _circular_check(before: int, after: int, size: int, axis: int) -> None:
    kept = size - max(-before, 0) - max(-after, 0)  # Note [Negative pads]
    if kept < 0 or max(before, after) > kept:
        raise ValueError(
            f"pad: circular padding ({before}, {after}) must be at most the size {kept} of "
            f"axis {axis} (of size {size}) after its negative pads crop it"
        )


def _circular_indices(before: int, after: int, size: int) -> np.ndarray:
    first = max(-before, 0)  # Note [Negative pads]: the cropped axis wraps around
    kept = size - first - max(-after, 0)
    return first + np.arange(-max(before, 0), kept + max(after, 0)) % max(kept, 1)


def _positions(before: int, after: int, size: int) -> np.ndarray:
    """The positions of a padded axis's outputs, before the input's first position -1
    and on (a negative pad starts or ends them inside the input)."""
    return np.arange(-before, size + after)


_PAD_CHECKS = {
    "reflect": _reflect_check,
    "replicate": _replicate_check,
    "circular": _circular_check,
}
# Note [Negative pads]: the input position each output position of a padded axis reads.
# A negative pad crops, as in PyTorch, whose modes do so in two orders: reflect and
# replicate pad from the whole axis and then crop (reflect (-1, 1) of [0, 1] is [1, 0]),
# circular crops first and wraps around what is left (circular (-1, 1) is [1, 1]).
_PAD_INDICES = {
    "reflect": lambda before, after, size: (
        lambda i: np.where(i < 0, -i, np.where(i >= size, 2 * (size - 1) - i, i))
    )(_positions(before, after, size)),
    "replicate": lambda before, after, size: np.clip(_positions(before, after, size), 0, size - 1),
    "circular": _circular_indices,
}


@checked
def interpolate(
    input: Tensor,
    size: int | tuple[int, int] | None = None,
    scale_factor: float | tuple[float, float] | None = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> Tensor:
    """input (N, C, H, W) resized to ``size``, or scaled by ``scale_factor`` (the size
    rounded down), with PyTorch's sampling of each output row o (columns alike), scale
    = H / h for a given size or 1 / scale_factor (H / h too with
    recompute_scale_factor): 'nearest' reads input row floor(o scale) (row o at the
    same size, o // 2 at twice it), 'nearest-exact' row floor((o + 0.5) scale);
    'bilinear' weighs the two nearest rows of position (o + 0.5) scale - 0.5 (clamped
    at 0), or of o (H - 1) / (h - 1) with align_corners; 'bicubic' the four around that
    position (not clamped), by Keys' cubic convolution with a = -0.75, rows past the
    edges reading the edge's."""
    fn = "interpolate"
    if input.ndim != 4:
        raise ValueError(f"{fn}: input must be 4-D (N, C, H, W), got shape {input.shape}")
    if mode not in _SAMPLINGS:
        known = ", ".join(repr(m) for m in _SAMPLINGS)
        raise ValueError(f"{fn}: mode must be one of {known}, got {mode!r}")
    if mode.startswith("nearest") and align_corners is not None:
        raise ValueError(f"{fn}: align_corners applies to modes 'bilinear' and 'bicubic' only")
    if antialias:
        raise NotImplementedError(f"{fn}: antialias=True is not supported")
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{fn}: exactly one of size and scale_factor must be given")
    sizes_in = input.shape[2:]
    if size is not None:
        if recompute_scale_factor:
            raise ValueError(f"{fn}: recompute_scale_factor needs scale_factor, not size")
        sizes = arguments.pair(size, fn, "size")
        scales = [n / o if o else 0.0 for n, o in zip(sizes_in, sizes)]
    else:
        factors = scale_factor if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * 2
        if len(factors) != 2 or min(factors) <= 0:
            raise ValueError(
                f"{fn}: scale_factor must be positive, one or two, got {scale_factor!r}"
            )
        sizes = tuple(math.floor(n * f) for n, f in zip(sizes_in, factors))
        scales = [n / o if recompute_scale_factor and o else 1.0 / f
                  for n, o, f in zip(sizes_in, sizes, factors)]  # fmt: skip
    if min(sizes) < 1:
        raise ValueError(f"{fn}: the output size {sizes} must be positive")
    tables, weights = [], []
    for n, o, scale in zip(sizes_in, sizes, scales):
        index, weight = _SAMPLINGS[mode](n, o, scale, align_corners)
        tables.append(index)
        if weight is not None:
            weights.append(weight)
    return _resample(input, *tables, *weights)


# Note [Resampling tables]: each mode of interpolate gives, per axis, the input rows
# each output row reads, (o,) or (o, taps), and their weights (o, taps) (None: one
# row, read as it is), from the input's size n, the output's o and the scale of the
# (o + 0.5) scale - 0.5 rule; resample2d then reads both axes' tables in one pass.


def _nearest(n: int, o: int, scale: float, align_corners: bool | None) -> tuple:
    if o in (n, 2 * n):  # PyTorch's exact cases, whatever the scale_factor said
        return np.arange(o) // (o // n), None
    index = np.floor(np.arange(o, dtype=np.float32) * np.float32(scale)).astype(np.int64)
    return np.minimum(index, n - 1), None


def _nearest_exact(n: int, o: int, scale: float, align_corners: bool | None) -> tuple:
    # PyTorch's floorf of (o + 0.5) times its float32 scale, rounded to float32 first
    position = ((np.arange(o) + 0.5) * np.float64(np.float32(scale))).astype(np.float32)
    return np.minimum(np.floor(position).astype(np.int64), n - 1), None


def _source(o: int, n: int, scale: float, align_corners: bool | None) -> np.ndarray:
    """Each output row's position in the input: o (n - 1) / (o_size - 1) with
    align_corners, else (o + 0.5) scale - 0.5."""
    dst = np.arange(o, dtype=np.float64)
    if align_corners:
        return dst * ((n - 1) / (o - 1) if o > 1 else 0.0)
    return (dst + 0.5) * scale - 0.5


def _bilinear(n: int, o: int, scale: float, align_corners: bool | None) -> tuple:
    src = _source(o, n, scale, align_corners)
    src = src if align_corners else np.maximum(src, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), n - 1)
    far = src - lo
    return np.stack([lo, np.minimum(lo + 1, n - 1)], axis=1), np.stack([1.0 - far, far], axis=1)


CUBIC_A = -0.75  # PyTorch's (and OpenCV's) coefficient of Keys' cubic convolution


def _bicubic(n: int, o: int, scale: float, align_corners: bool | None) -> tuple:
    src = _source(o, n, scale, align_corners)
    first = np.floor(src).astype(np.int64)
    t = (src - first)[:, None]
    d = np.abs(np.array([-1.0, 0.0, 1.0, 2.0]) - t)  # each tap's distance
    a = CUBIC_A
    near = ((a + 2) * d - (a + 3)) * d * d + 1  # |d| <= 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a  # 1 < |d| < 2
    taps = np.clip(first[:, None] + np.arange(-1, 3), 0, n - 1)
    return taps, np.where(d <= 1, near, far)


_SAMPLINGS = {
    "nearest": _nearest,
    "nearest-exact": _nearest_exact,
    "bilinear": _bilinear,
    "bicubic": _bicubic,
}


@checked
def batch_norm(
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Batch normalization over every axis but 1: with ``training`` by the batch's mean
    and (biased) variance, updating the running statistics in place (the variance
    unbiased) by ``momentum``; otherwise by the running statistics."""
    args = (input, weight, bias, running_mean, running_var, training, momentum, eps)
    return _NATIVE_BATCH_NORM(*_NATIVE_BATCH_NORM.check(*args))[0]


@checked
def layer_norm(
    input: Tensor,
    normalized_shape: int | tuple[int, ...] | list[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Normalization of each slice over the trailing ``normalized_shape`` axes by its
    mean and (biased) variance, then * weight + bias (of normalized_shape)."""
    if isinstance(normalized_shape, numbers.Integral):  # NumPy's integers too
        normalized_shape = (normalized_shape,)
    args = (input, tuple(normalized_shape), weight, bias, eps)
    return _NATIVE_LAYER_NORM(*_NATIVE_LAYER_NORM.check(*args))[0]


@checked
def group_norm(
    input: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Normalization of (N, C, ...) over each of num_groups groups of C / num_groups
    channels (and every axis after them), then * weight + bias per channel."""
    args = (input, weight, bias, num_groups, eps)
    return _NATIVE_GROUP_NORM(*_NATIVE_GROUP_NORM.check(*args))[0]


@checked
def embedding(
    input: Tensor,
    weight: Tensor,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Tensor:
    """The rows of weight (num_embeddings, embedding_dim) at the integer indices
    ``input``: a result of shape input.shape + (embedding_dim,). The row padding_idx
    gets no gradient; repeated indices add their gradients. Renormalizing rows
    (max_norm), frequency scaling and sparse gradients are not supported."""
    for name, value, default in (
        ("max_norm", max_norm, None),
        ("scale_grad_by_freq", scale_grad_by_freq, False),
        ("sparse", sparse, False),
    ):
        if value != default:
            raise NotImplementedError(f"embedding: {name}={value!r} is not supported")
    return _EMBEDDING(*_EMBEDDING.check(weight, input, padding_idx))


@checked
def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """softmax(query @ key^T * scale + mask) @ value over (..., L, E) queries, (..., S,
    E) keys and (..., S, Ev) values; scale defaults to 1 / sqrt(E). A boolean attn_mask
    keeps the positions where it is True, a float one is added; either broadcasts to
    (..., L, S); a query whose every key is masked gets zeros (as in PyTorch).
    is_causal keeps the positions at or below the diagonal. dropout_p drops attention
    weights (always: pass 0 in evaluation, as in PyTorch)."""
    return _attention(query, key, value, attn_mask, dropout_p, is_causal, scale)[0]


def _attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    weights_carry_gradients: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """scaled_dot_product_attention's result and its attention weights (None where
    they are not needed: the fused operator then keeps none). The fused operator (Note
    [Fused attention]) takes the common case; dropout, leading axes that broadcast and
    weights that gradients flow through (MultiheadAttention's need_weights) take the
    composite of dispatched operators."""
    fn = "scaled_dot_product_attention"
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{fn}: dropout_p must be in [0, 1], got {dropout_p}")
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise ValueError(f"{fn}: query, key and value need at least 2 dimensions (..., L, E)")
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1]) if query.shape[-1] else 1.0
    same_lead = query.shape[:-2] == key.shape[:-2] == value.shape[:-2]
    if not dropout_p and same_lead and not weights_carry_gradients:
        need_weights = _needs_grad(query) or _needs_grad(key) or _needs_grad(value)
        need_weights |= attn_mask is not None and _needs_grad(attn_mask)
        args = (query, key, value, attn_mask, is_causal, scale, need_weights)
        out, weights = _ATTENTION(*_ATTENTION.check(*args))
        return out, weights if need_weights else None
    weights = attention_weights(query, key, attn_mask, is_causal, scale)
    if dropout_p:
        weights = dropout(weights, dropout_p)
    return ops.matmul(weights, value), weights


@checked
def local_response_norm(
    input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0
) -> Tensor:
    """input / (k + alpha / size * sum of squares over ``size`` neighbouring
    channels) ** beta (the window [c - size // 2, c + (size - 1) // 2], as PyTorch)."""
    return _NATIVE_LRN(*_NATIVE_LRN.check(input, size, alpha, beta, k))[0]


@checked
def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """The cross entropy of logits ``input`` (N, C, ...) with class indices (N, ...)
    or class probabilities (input's shape): nll_loss of log_softmax over axis 1, with
    label_smoothing mixing in the uniform distribution (PyTorch's definition)."""
    meta.check_reduction("cross_entropy", reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if target.dtype.kind in "iu" and target.dtype != dtypes.int64:
        target = ops.astype(target, dtypes.int64)  # uint8 (PyTorch's Byte): class indices
    if (
        input.ndim == 2
        and target.dtype.kind == "i"
        and weight is None
        and reduction == "mean"
        and not label_smoothing
    ):  # the common case in one pass (Note [One-pass cross entropy])
        return _cross_entropy_loss(input, target, ignore_index)
    dim = 0 if input.ndim == 1 else 1
    logp = log_softmax(input, dim)  # noqa: F821 (installed from the schema)
    classes = input.shape[dim]
    if weight is not None and weight.shape != (classes,):
        raise ValueError(
            f"cross_entropy: weight must hold one value per class, shape ({classes},), "
            f"got {weight.shape}"
        )
    if target.dtype.kind == "f":  # class probabilities
        if target.shape != input.shape:
            raise ValueError(
                f"cross_entropy: probability targets must have the input's shape "
                f"{input.shape}, got {target.shape}"
            )
        if label_smoothing:
            target = target * (1.0 - label_smoothing) + label_smoothing / classes
        terms = logp * target
        if weight is not None:
            terms = terms * _along(weight, dim, input.ndim)
        losses = -ops.sum(terms, axis=dim)
        if reduction == "none":
            return losses
        total = ops.sum(losses)
        return total / (input.size // classes) if reduction == "mean" else total
    loss = nll_loss(logp, target, weight, ignore_index, reduction)  # noqa: F821
    if not label_smoothing:
        return loss
    # the uniform part: -sum_c w_c logp_c / C per sample, over the samples that count
    w = ops.ones((classes,), dtype=input.dtype) if weight is None else weight
    smooth = -ops.sum(logp * _along(w, dim, input.ndim), axis=dim)
    keep = target != ignore_index
    counted = ops.astype(keep, input.dtype)
    # where, not a product: an ignored sample's gradient stays 0 when the mean's divisor
    # is 0 (every target ignored: PyTorch's zero gradient, not 0 * inf)
    smooth = ops.where(keep, smooth, 0.0)
    if reduction == "sum":
        smooth = ops.sum(smooth)
    elif reduction == "mean":
        picked = ops.sum(counted) if weight is None else _picked_weight_sum(w, target, counted)
        smooth = ops.sum(smooth) / picked
    return loss * (1.0 - label_smoothing) + smooth * (label_smoothing / classes)


# Note [In-place activations]: the functional activations take PyTorch's ``inplace``:
# the result is computed as a new tensor, then written into ``input``, which is
# returned. Where autograd records, the operator runs on a copy of ``input`` (its
# formula may save its input, which the write would change under it; PyTorch's
# in-place formulas read the result instead). The modules' ``inplace`` is accepted and
# ignored: a module's result is a new tensor.


def _applied(op, input: Tensor, inplace: bool, *settings) -> Tensor:
    if not inplace:
        return op(input, *settings)
    recorded = is_grad_enabled() and input.requires_grad
    input[...] = op(input.clone() if recorded else input, *settings)
    return input


def _in_place_too(fn):
    """``fn``, documented as its operator and Note [In-place activations]."""
    fn.__doc__ = (
        f"{OPERATORS[fn.__name__].doc} With inplace=True the result is written into "
        "input, which is returned (Note [In-place activations])."
    )
    return fn


@_in_place_too
@checked
def relu(input: Tensor, inplace: bool = False) -> Tensor:
    return _applied(_relu, input, inplace)


@_in_place_too
@checked
def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    return _applied(_leaky_relu, input, inplace, negative_slope)


@_in_place_too
@checked
def hardtanh(
    input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False
) -> Tensor:
    return _applied(_hardtanh, input, inplace, min_val, max_val)


@checked
def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """min(max(input, 0), 6): hardtanh(input, 0, 6), as in PyTorch (its gradient is 0
    at 0 and 6; Note [In-place activations])."""
    return _applied(_hardtanh, input, inplace, 0.0, 6.0)


@_in_place_too
@checked
def silu(input: Tensor, inplace: bool = False) -> Tensor:
    return _applied(_silu, input, inplace)


@_in_place_too
@checked
def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    return _applied(_hardswish, input, inplace)


@checked
def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """input where positive, alpha (exp(input) - 1) elsewhere (gradient alpha at 0, as
    PyTorch's; Note [In-place activations])."""
    return _applied(_elu, input, inplace, alpha)


def _elu(input: Tensor, alpha: float) -> Tensor:
    negative = input <= 0  # NaN is not: its gradient is 1, as PyTorch's
    # expm1 of the non-positive values only: exp of a large one would be inf, and its
    # zero share of the gradient inf * 0 = NaN
    return ops.where(negative, ops.expm1(ops.where(negative, input, 0.0)) * alpha, input)


@checked
def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta input)) / beta, and input itself where beta input exceeds
    threshold, as PyTorch (its gradient there 1)."""
    if beta == 0:
        raise ValueError("softplus: beta must not be 0")
    scaled = input * beta
    linear = scaled > threshold
    soft = ops.log1p(ops.exp(ops.where(linear, 0.0, scaled))) / beta  # no exp overflow
    return ops.where(linear, input, soft)


@checked
def huber_loss(
    input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0
) -> Tensor:
    """0.5 d^2 where abs(d) < delta, else delta (abs(d) - delta / 2), d = input - target:
    delta times smooth_l1_loss with beta = delta, as PyTorch defines both."""
    if not delta > 0:
        raise ValueError(f"huber_loss: delta must be positive, got {delta}")
    return smooth_l1_loss(input, target, reduction, delta) * delta  # noqa: F821 (schema)


@checked
def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """``(..., C r^2, H, W)`` -> ``(..., C, H r, W r)``, r = upscale_factor: each group of r^2
    channels spread over an r x r block of pixels, as PyTorch."""
    r = upscale_factor
    *lead, c, h, w = _shuffled("pixel_shuffle", input, r, r * r)
    blocks = ops.reshape(input, (*lead, c // (r * r), r, r, h, w))
    k = len(lead)
    order = (*range(k), k, k + 3, k + 1, k + 4, k + 2)
    return ops.reshape(ops.permute_dims(blocks, order), (*lead, c // (r * r), h * r, w * r))


@checked
def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """``(..., C, H r, W r)`` -> ``(..., C r^2, H, W)``, r = downscale_factor: pixel_shuffle
    undone."""
    r = downscale_factor
    *lead, c, h, w = _shuffled("pixel_unshuffle", input, r, 1)
    if h % r or w % r:
        raise ValueError(
            f"pixel_unshuffle: the height and width ({h}, {w}) must be multiples of "
            f"downscale_factor {r}"
        )
    blocks = ops.reshape(input, (*lead, c, h // r, r, w // r, r))
    k = len(lead)
    order = (*range(k), k, k + 2, k + 4, k + 1, k + 3)
    return ops.reshape(ops.permute_dims(blocks, order), (*lead, c * r * r, h // r, w // r))


def _shuffled(fn: str, input: Tensor, factor: int, divides_channels: int) -> tuple:
    if factor < 1:
        raise ValueError(f"{fn}: the factor must be positive, got {factor}")
    if input.ndim < 3 or input.shape[-3] % divides_channels:
        raise ValueError(
            f"{fn}: input must be (*, C, H, W) with C a multiple of {divides_channels}, "
            f"got shape {input.shape}"
        )
    return input.shape


@checked
def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """int64 (..., num_classes): 1 where the last index equals ``tensor``'s class
    index, 0 elsewhere; num_classes=-1 takes the largest index + 1."""
    if tensor.dtype.kind not in "iu":
        raise TypeError(f"one_hot: tensor must hold integer class indices, got {tensor.dtype}")
    if num_classes < -1:
        raise ValueError(f"one_hot: num_classes must be -1 or non-negative, got {num_classes}")
    if tensor.size == 0:
        if num_classes == -1:
            raise ValueError("one_hot: cannot infer num_classes from an empty tensor")
    else:
        low, high = int(ops.min(tensor)), int(ops.max(tensor))
        if low < 0:
            raise ValueError(f"one_hot: class values must be non-negative, got {low}")
        if num_classes == -1:
            num_classes = high + 1
        elif high >= num_classes:
            raise ValueError(
                f"one_hot: class values must be smaller than num_classes={num_classes}, got {high}"
            )
    classes = ops.arange(num_classes, dtype=dtypes.int64, device=tensor.device)
    return ops.astype(ops.expand_dims(tensor, axis=-1) == classes, dtypes.int64)


# Note [Composite losses]: binary_cross_entropy, l1_loss and kl_div are composites of
# dispatched elementwise operators (autograd and every device come with them), a few
# passes over memory each; smooth_l1_loss and binary_cross_entropy_with_logits, the
# losses of large detection and multi-label outputs, are operators with one-pass
# kernels (measured on 4096 x 1000: the composites took 1.5-3.5x PyTorch's time).


def _loss_operands(fn: str, input: Tensor, target: Tensor, weight: Tensor | None = None) -> None:
    """A floating input, a target of its shape, a weight that broadcasts to it."""
    if input.dtype.kind != "f":
        raise TypeError(f"{fn}: input must be a floating tensor, got {input.dtype}")
    if target.shape != input.shape:
        raise ValueError(
            f"{fn}: target shape {target.shape} differs from input shape {input.shape}"
        )
    if weight is not None and meta.broadcast_shapes(fn, weight.shape, input.shape) != input.shape:
        raise ValueError(
            f"{fn}: weight of shape {weight.shape} does not broadcast to the input's "
            f"shape {input.shape}"
        )


def _reduced(fn: str, losses: Tensor, reduction: str) -> Tensor:
    meta.check_reduction(fn, reduction)
    if reduction == "none":
        return losses
    return ops.sum(losses) if reduction == "sum" else ops.mean(losses)


@checked
def binary_cross_entropy(
    input: Tensor, target: Tensor, weight: Tensor | None = None, reduction: str = "mean"
) -> Tensor:
    """-weight (target log(input) + (1 - target) log(1 - input)) of probabilities in
    [0, 1], each log clamped to >= -100 as in PyTorch (so the loss stays finite; at
    input exactly 0 or 1 the clamp makes the gradient 0, where PyTorch's is
    +-1e12 (1 / its epsilon))."""
    _loss_operands("binary_cross_entropy", input, target, weight)
    for name, t in (("input", input), ("target", target)):
        if t.size and not bool(ops.all((t >= 0) & (t <= 1))):  # NaN fails too
            raise ValueError(f"binary_cross_entropy: all elements of {name} must be in [0, 1]")
    log_p = ops.maximum(ops.log(input), -100.0)
    log_q = ops.maximum(ops.log1p(-input), -100.0)
    losses = (target - 1.0) * log_q - target * log_p
    losses = losses if weight is None else losses * weight
    return _reduced("binary_cross_entropy", losses, reduction)


@checked
def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """abs(input - target) (its gradient 0 where they are equal, as PyTorch's sign)."""
    _loss_operands("l1_loss", input, target)
    return _reduced("l1_loss", ops.abs(input - target), reduction)


@checked
def kl_div(
    input: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False
) -> Tensor:
    """target (log(target) - input) for log-probabilities ``input`` (0 where target is
    0); with log_target, exp(target) (target - input). reduction='batchmean' divides
    the sum by the batch size (input.shape[0]), the mathematically right KL divergence."""
    _loss_operands("kl_div", input, target)
    if log_target:
        losses = ops.exp(target) * (target - input)
    else:
        # where, twice: target 0 gives 0 (xlogy's rule), and no 0 * log(0) reaches a
        # gradient with respect to target
        zero = target == 0
        losses = ops.where(zero, 0.0, target * ops.log(ops.where(zero, 1.0, target))) - (
            target * input
        )
    if reduction != "batchmean":
        return _reduced("kl_div", losses, reduction)
    total = ops.sum(losses)
    return total / input.shape[0] if input.ndim else total


def _along(v: Tensor, dim: int, ndim: int) -> Tensor:
    """A (C,) tensor shaped to broadcast along axis ``dim`` of an ndim tensor."""
    return ops.reshape(v, tuple(-1 if d == dim else 1 for d in range(ndim)))


def _picked_weight_sum(w: Tensor, target: Tensor, counted: Tensor) -> Tensor:
    safe = ops.where(counted > 0, target, 0)
    return ops.sum(w[safe] * counted)


@checked
def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Each element zeroed with probability p and the rest scaled by 1 / (1 - p) while
    training (the identity otherwise); the mask comes from lamina.random's generator,
    so lm.random.seed makes it reproducible."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input * 0.0
    keep = ops.rand(input.shape, dtype=input.dtype, device=input.device) >= p
    out = input * (ops.astype(keep, input.dtype) * (1.0 / (1.0 - p)))
    if inplace:
        if is_grad_enabled() and input.requires_grad:
            raise RuntimeError("dropout: inplace=True on a tensor that requires grad")
        input[...] = out
        return input
    return out


@checked
def flatten(input: Tensor, start_dim: int = 1, end_dim: int = -1) -> Tensor:
    """input with axes start_dim..end_dim merged into one (a copy in logical order for
    channels-last memory, as PyTorch's reshape)."""
    nd = max(input.ndim, 1)  # a 0-d tensor flattens to (1,), dims 0 and -1 (PyTorch)
    start = arguments.axis(start_dim, "flatten", "start_dim", nd)
    end = arguments.axis(end_dim, "flatten", "end_dim", nd)
    if start > end:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = input.shape
    merged = 1
    for s in shape[start : end + 1]:
        merged *= s
    return ops.reshape(input, shape[:start] + (merged,) + shape[end + 1 :])


@checked
def layout_of(input: Tensor) -> str | None:
    """The memory layout of a tensor: "NCHW" (C-contiguous), "NHWC" (channels-last
    strides of a 4-D tensor) or None (any other strides). A tensor that is both (one
    channel, or 1 x 1 images) is "NCHW". From its strides, so on any device (the meta
    device's included: lm.jit traces on it)."""
    data = input._data
    if not isinstance(data, np.ndarray):  # another device's storage: by its strides
        return layouts.image_layout(input._shape, layouts.strides_of(input))
    if data.flags.c_contiguous:  # NumPy's flags: ten times faster than the strides
        return "NCHW"
    if data.ndim == 4 and data.transpose(0, 2, 3, 1).flags.c_contiguous:
        return "NHWC"
    return None
