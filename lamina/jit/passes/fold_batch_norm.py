"""Batch norm in evaluation folded into the convolution before it: conv2d then
native_batch_norm with running statistics is one conv2d with a scaled weight and a
shifted bias (PyTorch's ``fuse_conv_bn_eval``, oneDNN's inference recipe), so the
activations take one pass fewer.

With s = weight_bn / sqrt(running_var + eps), per output channel:
    bn(conv(x, w) + b) = conv(x, w * s) + (b - running_mean) * s + bias_bn
and a fused relu stays a relu after the convolution (the rewrite pass then fuses it,
where the table has that fusion). The new weight and bias are calls on parameters and
buffers only: the ``hoist`` pass computes them once per change of those tensors, not at
each call. The result equals the two calls' within rounding, not bit for bit (it
reassociates), as in PyTorch; a training graph (batch statistics) is left alone, as is a
convolution whose result anything else reads (Note [Chains in graphs] in rewrite.py).
"""

from __future__ import annotations

from typing import Any

from lamina.dispatch import ops
from lamina.dispatch.schema import OPERATORS

from ..graph import Graph, Node, Value
from ..tracer import record_calls
from .rewrite import chain_of, splice


def _folded(x, w, b, conv_args, gamma, beta, mean, var, eps, relu) -> Any:
    channels = (-1,) + (1,) * (len(w.shape) - 1)
    scale = ops.divide(1.0, ops.sqrt(ops.add(var, eps)))
    if gamma is not None:
        scale = ops.multiply(scale, gamma)
    shift = ops.multiply(ops.negative(mean) if b is None else ops.subtract(b, mean), scale)
    if beta is not None:
        shift = ops.add(shift, beta)
    weight = ops.multiply(w, ops.reshape(scale, channels))
    y = OPERATORS["conv2d"](x, weight, shift, *conv_args)
    return OPERATORS["relu"](y) if relu else y


def _foldable(conv: Node, bn: Node) -> bool:
    _, w, b, *_ = conv.args
    _, gamma, beta, mean, var, training, _, _, _ = bn.args
    params = (w, b, gamma, beta, mean, var)
    return (
        not training
        and isinstance(mean, Value)
        and isinstance(var, Value)
        and all(p is None or isinstance(p, Value) for p in params)
        and len({p.dtype for p in params if p is not None}) == 1
    )


def run(graph: Graph) -> Graph:
    users, returned = graph.users(), set(graph.output_values())
    replaced: dict[Node, tuple[list[Node], dict]] = {}
    dropped: set[Node] = set()
    for node in graph.nodes:
        if node.name != "conv2d":
            continue
        chain = chain_of(node, users, returned)
        if len(chain) < 2 or chain[1].name != "native_batch_norm" or not _foldable(*chain[:2]):
            continue
        conv, bn = chain[:2]
        if any(r in returned or r in users for r in bn.results[1:]):
            continue
        x, w, b, *conv_args = conv.args
        _, gamma, beta, mean, var, _, _, eps, relu = bn.args
        nodes, value = record_calls(
            graph, _folded, x, w, b, tuple(conv_args), gamma, beta, mean, var, eps, relu,
            grad=bn.results[0].requires_grad,
        )  # fmt: skip
        for n in nodes:
            n.line = bn.line
        replaced[bn] = (nodes, {bn.results[0]: value})
        dropped.add(conv)
    return splice(graph, replaced, dropped)
