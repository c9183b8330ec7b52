"""Attention and the Transformer encoder, as in PyTorch: ``MultiheadAttention``,
``TransformerEncoderLayer`` and ``TransformerEncoder``, with PyTorch's parameter names
(so state dicts carry over), initializations and masks.

Attention itself is F.scaled_dot_product_attention's: one fused operator, or with
dropout or weights to return a composite of dispatched operators (matmul, softmax,
where, dropout).
MultiheadAttention's masks follow PyTorch's convention, the opposite of
scaled_dot_product_attention's for booleans: True in ``attn_mask`` or
``key_padding_mask`` marks a position that is *not* attended to.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

from lamina.dispatch import dtypes, ops
from lamina.dispatch.arguments import checked
from lamina.dispatch.tensor import Tensor

from . import functional as F
from . import init
from .modules import Dropout, LayerNorm, Linear, Module, ModuleList, Parameter, _empty


class MultiheadAttention(Module):
    """Attention of num_heads heads of embed_dim / num_heads over projected queries,
    keys and values: in_proj_weight (3 embed_dim, embed_dim) and in_proj_bias project
    them (Xavier-uniform and zeros), out_proj (a Linear, bias zeros) the heads' joined
    result. Inputs are (L, N, E), or (N, L, E) with batch_first, or unbatched (L, E)."""

    @checked
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if embed_dim < 1 or num_heads < 1:
            raise ValueError(
                f"MultiheadAttention: embed_dim and num_heads must be positive, got "
                f"{embed_dim} and {num_heads}"
            )
        if embed_dim % num_heads:
            raise ValueError(
                f"MultiheadAttention: embed_dim={embed_dim} must be divisible by "
                f"num_heads={num_heads}"
            )
        for name, value in (("add_bias_kv", add_bias_kv), ("add_zero_attn", add_zero_attn)):
            if value:
                raise NotImplementedError(f"MultiheadAttention: {name}=True is not supported")
        if kdim not in (None, embed_dim) or vdim not in (None, embed_dim):
            raise NotImplementedError(
                "MultiheadAttention: keys and values of another size than embed_dim "
                "(kdim, vdim) are not supported"
            )
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1], got {dropout}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.dropout, self.batch_first = dropout, batch_first
        self.in_proj_weight = Parameter(_empty((3 * embed_dim, embed_dim), dtype, device))
        if bias:
            self.in_proj_bias = Parameter(_empty((3 * embed_dim,), dtype, device))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """(attention output in the query's layout, attention weights or None): the
        weights (N, L, S) averaged over the heads, or (N, num_heads, L, S), when
        need_weights. attn_mask is (L, S) or (N * num_heads, L, S), key_padding_mask
        (N, S); a boolean True masks a position out, a float is added. is_causal is a
        hint that attn_mask is the causal mask (which must be given, as in PyTorch)."""
        if is_causal and attn_mask is None:
            raise ValueError("MultiheadAttention: is_causal needs the causal attn_mask")
        self._check_inputs(query, key, value)
        batched, self_attention = query.ndim == 3, query is key and key is value
        # Note [Attention layouts]: the inputs stay (N, L, E) or (L, N, E) as given: the
        # projections' heads are views of (N, H, L, D) order, which the attention copies
        # once, and its (N, H, L, D) result is copied once back into the input's order
        axis = 0 if self.batch_first else 1  # the batch axis
        if not batched:  # (L, E): a batch of one
            query, key, value = (ops.expand_dims(t, axis=axis) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = ops.expand_dims(key_padding_mask, axis=0)
        batch, length, source = query.shape[axis], query.shape[1 - axis], key.shape[1 - axis]
        q, k, v = self._projections(query, key, value, self_attention)
        mask = self._mask(attn_mask, key_padding_mask, batch, length, source, q.dtype)
        p = self.dropout if self.training else 0.0
        out, weights = F._attention(q, k, v, mask, p, False, None, need_weights)
        out = ops.permute_dims(out, (0, 2, 1, 3) if self.batch_first else (2, 0, 1, 3))
        out = self.out_proj(ops.reshape(out, (*query.shape[:2], self.embed_dim)))
        if not batched:
            out = out[0] if self.batch_first else out[:, 0]
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = ops.mean(weights, axis=1)
        return out, weights if batched else weights[0]

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        """The shapes' agreement, named (a mismatch failed inside a reshape or a matmul)."""
        layout = "(N, L, E)" if self.batch_first else "(L, N, E)"
        shapes = {name: t.shape for name, t in (("query", query), ("key", key), ("value", value))}
        if query.ndim not in (2, 3) or any(len(v) != query.ndim for v in shapes.values()):
            raise ValueError(
                f"MultiheadAttention: query, key and value must all be 3-D {layout} or all "
                f"2-D (L, E), got shapes {shapes}"
            )
        features = {name: shape[-1] for name, shape in shapes.items()}
        if set(features.values()) != {self.embed_dim}:
            raise ValueError(
                f"MultiheadAttention: query, key and value must have embed_dim = "
                f"{self.embed_dim} features, got {features}"
            )
        batch = 0 if self.batch_first else 1
        if query.ndim == 3 and not query.shape[batch] == key.shape[batch] == value.shape[batch]:
            raise ValueError(
                f"MultiheadAttention: query, key and value must have the same batch size "
                f"(axis {batch} of {layout}), got shapes {shapes}"
            )
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(
                f"MultiheadAttention: key and value must have the same sequence length, "
                f"got shapes {shapes}"
            )

    def _projections(
        self, query: Tensor, key: Tensor, value: Tensor, self_attention: bool
    ) -> list[Tensor]:
        """q, k, v (N, H, L or S, D) from inputs (N, L, E) or (L, N, E): views of one
        product for self-attention, else of one product per input with its third of
        the weight (Note [Attention layouts])."""
        e, w, b = self.embed_dim, self.in_proj_weight, self.in_proj_bias
        heads = (self.num_heads, self.head_dim)
        order = (0, 2, 1, 3) if self.batch_first else (1, 2, 0, 3)
        if self_attention:  # (A, B, 3E) -> (A, B, 3, H, D) -> 3 x (N, H, L, D)
            joined = ops.reshape(F.linear(query, w, b), (*query.shape[:2], 3, *heads))
            # unstack, not joined[:, :, i]: its backward joins the three gradients in
            # one pass, where indexing's adds each into zeros of the whole
            return [ops.permute_dims(t, order) for t in ops.unstack(joined, axis=2)]
        projected = []
        for i, t in enumerate((query, key, value)):
            part = slice(i * e, (i + 1) * e)
            t = F.linear(t, w[part], None if b is None else b[part])
            projected.append(ops.permute_dims(ops.reshape(t, (*t.shape[:2], *heads)), order))
        return projected

    def _mask(
        self,
        attn_mask: Tensor | None,
        key_padding_mask: Tensor | None,
        batch: int,
        length: int,
        source: int,
        dtype: Any,
    ) -> Tensor | None:
        """One additive float mask broadcasting to (N, H, L, S), or None."""
        fn = "MultiheadAttention"
        total = None
        if attn_mask is not None:
            if attn_mask.shape == (batch * self.num_heads, length, source):
                attn_mask = ops.reshape(attn_mask, (batch, self.num_heads, length, source))
            elif attn_mask.shape != (length, source):
                raise ValueError(
                    f"{fn}: attn_mask must have shape {(length, source)} or "
                    f"{(batch * self.num_heads, length, source)}, got {attn_mask.shape}"
                )
            total = _additive(fn, "attn_mask", attn_mask, dtype)
        if key_padding_mask is not None:
            if key_padding_mask.shape != (batch, source):
                raise ValueError(
                    f"{fn}: key_padding_mask must have shape {(batch, source)}, got "
                    f"{key_padding_mask.shape}"
                )
            padding = _additive(fn, "key_padding_mask", key_padding_mask, dtype)
            padding = ops.reshape(padding, (batch, 1, 1, source))
            total = padding if total is None else total + padding
        return total

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"


def _additive(fn: str, name: str, mask: Tensor, dtype: Any) -> Tensor:
    """A mask as one to add: -inf where a boolean mask is True, a float one as it is."""
    if mask.dtype == dtypes.bool_:
        return ops.where(mask, -math.inf, ops.zeros((), dtype=dtype, device=mask.device))
    if mask.dtype.kind != "f":
        raise TypeError(f"{fn}: {name} must be boolean or floating, got {mask.dtype}")
    return mask


_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class TransformerEncoderLayer(Module):
    """Self-attention then a feed-forward block (linear1, activation, linear2), each
    with dropout, a residual connection and layer norm: after each block (post-norm,
    the default) or, with norm_first, on each block's input (pre-norm)."""

    @checked
    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Tensor], Tensor] = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        where = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(
            d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, **where
        )
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **where)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **where)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **where)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **where)
        self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout)
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise ValueError(
                    f"TransformerEncoderLayer: activation must be 'relu' or 'gelu' (or a "
                    f"function), got {activation!r}"
                )
            activation = _ACTIVATIONS[activation]
        self.activation = activation

    def forward(
        self,
        src: Tensor,
        src_mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._attention_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._feed_forward_block(self.norm2(x))
        x = self.norm1(x + self._attention_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._feed_forward_block(x))

    def _attention_block(
        self, x: Tensor, mask: Tensor | None, padding: Tensor | None, is_causal: bool
    ) -> Tensor:
        attended = self.self_attn(
            x,
            x,
            x,
            attn_mask=mask,
            key_padding_mask=padding,
            need_weights=False,
            is_causal=is_causal,
        )[0]
        return self.dropout1(attended)

    def _feed_forward_block(self, x: Tensor) -> Tensor:
        hidden = self.dropout(self.activation(self.linear1(x)))
        return self.dropout2(self.linear2(hidden))


class TransformerEncoder(Module):
    """num_layers copies of encoder_layer (deep copies: independent parameters, as in
    PyTorch) applied in turn, then the optional norm."""

    @checked
    def __init__(
        self,
        encoder_layer: TransformerEncoderLayer,
        num_layers: int,
        norm: Module | None = None,
        enable_nested_tensor: bool = True,
        mask_check: bool = True,
    ) -> None:
        super().__init__()
        if num_layers < 0:
            raise ValueError(f"TransformerEncoder: num_layers must be >= 0, got {num_layers}")
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers, self.norm = num_layers, norm

    def forward(
        self,
        src: Tensor,
        mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool | None = None,
    ) -> Tensor:
        x = src
        for layer in self.layers:
            x = layer(
                x,
                src_mask=mask,
                src_key_padding_mask=src_key_padding_mask,
                is_causal=bool(is_causal),
            )
        return x if self.norm is None else self.norm(x)
