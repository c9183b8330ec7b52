"""``lamina.nn.functional``: the neural-network functions, PyTorch's names, signatures
and semantics (code ports by changing the import).

The dispatched operators of namespace "nn.functional" (dispatch/operators.py: conv2d,
linear, the poolings, relu, softmax, the losses, to_layout, ...) are installed here
from the schema (their signatures: ``functional.pyi``, generated beside this file); the
functions below are composites of operators, as in PyTorch:
pooling with ``return_indices``, batch, layer, group and local response
normalization over the internal operators that also return what backward needs,
embedding, scaled_dot_product_attention, cross_entropy, dropout, flatten and
``layout_of``.
"""

from __future__ import annotations

import math

from lamina.autograd import is_grad_enabled
from lamina.dispatch import arguments, bindings, dtypes, meta, ops
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
# the internal pooling operators without indices, behind bindings that check arguments
_max_pool_values = bindings.generated_binding(OPERATORS["max_pool2d"])
_min_pool_values = bindings.generated_binding(OPERATORS["min_pool2d"])
_COMPOSITES = [
    "adaptive_max_pool2d",
    "batch_norm",
    "binary_cross_entropy",
    "cross_entropy",
    "dropout",
    "embedding",
    "flatten",
    "kl_div",
    "l1_loss",
    "group_norm",
    "layer_norm",
    "layout_of",
    "local_response_norm",
    "max_pool2d",
    "min_pool2d",
    "one_hot",
    "relu6",
    "scaled_dot_product_attention",
]
__all__ = sorted([op.name for op in bindings.public_operators("nn.functional")] + _COMPOSITES)

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
    """Max pooling to output_size where the input's size is a multiple of it (windows of
    equal size, as adaptive pooling makes them then)."""
    h, w = input.shape[-2:]
    sizes = meta.adaptive_output_size("adaptive_max_pool2d", input, output_size)
    if h % sizes[0] or w % sizes[1]:
        raise ValueError(
            f"adaptive_max_pool2d: the input's size {h} x {w} must be a multiple of "
            f"output_size {sizes} (windows of unequal size are not supported)"
        )
    kernel = (h // sizes[0], w // sizes[1])
    return max_pool2d(input, kernel, kernel, return_indices=return_indices)


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
    if isinstance(normalized_shape, int):
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
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if target.dtype.kind in "iu" and target.dtype != dtypes.int64:
        target = ops.astype(target, dtypes.int64)  # uint8 (PyTorch's Byte): class indices
    dim = 0 if input.ndim == 1 else 1
    logp = log_softmax(input, dim)  # noqa: F821 (installed from the schema)
    classes = input.shape[dim]
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


@checked
def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """min(max(input, 0), 6): hardtanh(input, 0, 6), as in PyTorch (its gradient is 0
    at 0 and 6). ``inplace`` is accepted for PyTorch compatibility; the result is a
    new tensor."""
    return hardtanh(input, 0.0, 6.0)  # noqa: F821 (installed from the schema)


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
    meta._reduction(fn, reduction)
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
    """|input - target| (its gradient 0 where they are equal, as PyTorch's sign)."""
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
    """The memory layout of a CPU tensor: "NCHW" (C-contiguous), "NHWC" (channels-last
    strides of a 4-D tensor) or None (any other strides). A tensor that is both (one
    channel, or 1 x 1 images) is "NCHW"."""
    data = input.numpy()
    if data.flags.c_contiguous:
        return "NCHW"
    if data.ndim == 4 and data.transpose(0, 2, 3, 1).flags.c_contiguous:
        return "NHWC"
    return None
