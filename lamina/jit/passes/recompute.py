"""Backprop state: what a training step's forward saves for its backward. Joint-graph
passes (Note [Joint graph] in training.py): they see the forward's calls and the
backward's, before they are split by what the backward reads, and trade a call made
again in the backward for a value the forward would keep.

Note [Recomputed pool indices]: max pooling with indices saves an int64 index per
output (twice the output's bytes in float32) for the backward's scatter. Where the
backward reads the pooling's input anyway (the batch norm + relu, relu or LRN before
it saves its result, which is that input), the indices cost a pooling pass to compute
again, next to the scatter, and nothing to keep: the forward pools values only, as in
inference, and the step's saved state shrinks by the indices (VGG at batch 32: 7.5 of
73 MiB).

Note [Recomputed normalizations]: a training batch norm's backward reads its input,
so the forward keeps that; its result (after the fused relu) is read again by the
backward too -- the relu's gate, the next convolution's weight gradient -- and would
be kept beside it, as eager keeps both. Computed again from the input in the
backward, just before its first use there, it is kept by nobody: a batch norm layer
then saves one activation instead of two (VGG at batch 32: 29 of 66 MiB, its step's
peak 65 -> 41 MiB), for a second statistics-and-normalize pass per layer (VGG's step
1-4% slower). Local response normalization keeps its input, its result and the scale
it divided by; the scale, read only by its own backward, is made again there. The
call is the forward's own, on the same input with the same threads, so its results
are the forward's bit for bit.

Note [Recomputed conversions]: a compiled step that runs channels-last converts its
input images on the way in, and the first convolution's weight gradient reads the
converted copy, which the forward would keep through the whole backward (AlexNet at
batch 32: 1.5 MiB of its 13 MiB peak). The caller holds the input anyway, so the
backward converts it again just before that use (a transposition of the input batch:
~0.3 ms). The step then saves the input itself, as an eager convolution does.

Note [Values worth recomputing]: a second call costs time whatever its size, and a
small value costs little memory to keep, so a value under ``RECOMPUTE_BYTES`` (512
KiB) is kept. At batch 1 recomputing every pool index and normalization made training
steps 5-7% slower (VGG 7.70 -> 8.12 ms, Inception 4.23 -> 4.46 ms, one thread) to
lower peaks of 1-3 MiB by under 1 MiB; at batch 32 the three convnets' peaks are the
same with the floor as without it (VGG 0.58x, AlexNet 0.74x, Inception 0.78x of
eager's), the few values under it being a step's smallest (VGG's last pool indices,
128 channels x 4 x 4 x 32 images, 512 KiB, are still made again). The choice is made
at the traced sizes, a symbolic size by its hint (Note [Symbolic sizes]).
"""

from __future__ import annotations

import math

from lamina.dispatch.schema import OPERATORS

from ..graph import INPUT, Graph, Node, Value, map_values
from ..tracer import record_calls

RECOMPUTE_BYTES = 1 << 19  # Note [Values worth recomputing]


def run(
    graph: Graph, forward: list[Node], backward: list[Node], outputs: list[Value]
) -> tuple[list, list]:
    """The forward and backward calls with recomputed pool indices where they pay
    (never for a pooling whose values the step returns)."""
    read = {v for n in backward for v in n.inputs()}
    renamed: dict[Value, Value] = {}
    before: dict[Node, list[Node]] = {}  # a backward call -> the calls to make before it
    new_forward = []
    for node in forward:
        node.args = map_values(node.args, lambda v: renamed.get(v, v))
        if node.name != "max_pool2d_with_indices" or node.args[0] not in read:
            new_forward.append(node)
            continue
        values, indices = node.results
        if values in outputs:
            new_forward.append(node)
            continue
        readers = [n for n in backward if read_by(n, [indices])]
        used_by_forward = any(indices in list(n.inputs()) for n in forward)
        if used_by_forward or not readers or not worth_recomputing([indices]):
            new_forward.append(node)
            continue
        x, *window = node.args
        pooled, new_values = record_calls(graph, OPERATORS["max_pool2d"], x, *window)
        again, (_, new_indices) = record_calls(
            graph, OPERATORS["max_pool2d_with_indices"], x, *window
        )
        new_forward += pooled
        renamed[values], renamed[indices] = new_values, new_indices
        if values in read:  # the next pooling may read it
            read.add(new_values)
        before.setdefault(readers[0], []).extend(again)
    return new_forward, _recomputing(backward, before, renamed)


def normalizations(
    graph: Graph, forward: list[Node], backward: list[Node], outputs: list[Value]
) -> tuple[list, list]:
    """The backward computes results of each normalization again from the input it
    reads anyway (Note [Recomputed normalizations])."""
    return _made_again(graph, forward, backward, outputs, AGAIN, lambda x, read: x in read)


def conversions(
    graph: Graph, forward: list[Node], backward: list[Node], outputs: list[Value]
) -> tuple[list, list]:
    """The backward converts the step's input images to another layout again (Note
    [Recomputed conversions])."""
    to_layout = {"to_layout": (lambda args: args, (0,))}
    held = lambda x, read: x.kind == INPUT  # by the step's caller
    return _made_again(graph, forward, backward, outputs, to_layout, held)


def _made_again(graph, forward, backward, outputs, table, kept_anyway):
    """The forward and backward calls with the results ``table`` names (operator ->
    (the arguments of the call made again, from the forward's, or None; the indices of
    its results taken)) made again in the backward, just before their first use there,
    where the call's input is kept anyway (``kept_anyway(x, read by the backward)``),
    nothing writes it or the results, nor a view of them, and the step returns none of
    the call's results."""
    nodes = forward + backward
    written = {v for n in nodes for v in n.writes()}
    touched = lambda v: not written.isdisjoint(_aliases(v, nodes))
    read = {v for n in backward for v in n.inputs()}
    renamed: dict[Value, Value] = {}
    before: dict[Node, list[Node]] = {}
    for node in forward:
        arguments, taken = table.get(node.name, (lambda args: None, ()))
        args = arguments(node.args)
        results = [node.results[k] for k in taken if node.results[k] in read]
        x = node.args[0]
        returned = any(r in outputs for r in node.results)
        if args is None or not results or not kept_anyway(x, read) or returned:
            continue
        if not worth_recomputing(results) or any(map(touched, [x, *node.results])):
            continue
        again, new = record_calls(graph, node.target, *args)
        new = new if isinstance(new, tuple) else (new,)
        renamed.update((node.results[k], new[k]) for k in taken)
        before.setdefault(next(n for n in backward if read_by(n, results)), []).extend(again)
    return forward, _recomputing(backward, before, renamed)


# operator -> (the arguments of its call made again in the backward, from the forward
# call's, or None where it is not made again; the indices of the results the backward
# takes from it), Note [Recomputed normalizations]. A training batch norm gives its
# result, and updates no running statistics a second time; local response
# normalization its scale, which only its own backward reads (its result is the next
# layer's input, kept for that layer's backward or a pooling's recomputed indices).
AGAIN = {
    "native_batch_norm": (lambda a: (*a[:3], None, None, *a[5:]) if a[5] else None, (0,)),
    "native_local_response_norm": (lambda a: a, (1,)),
}


def worth_recomputing(values: list[Value]) -> bool:
    """Whether the forward keeping ``values`` is worth a second call (Note [Values
    worth recomputing])."""
    return sum(math.prod(v.shape) * v.dtype.itemsize for v in values) >= RECOMPUTE_BYTES


def _aliases(value: Value, nodes: list[Node]) -> set[Value]:
    """``value`` and the views ``nodes`` make of it, and of those in turn (Note
    [Mutation]; an in-place call makes no new Value)."""
    found = {value}
    for node in nodes:
        if "view" in getattr(node.target, "tags", ()) and node.args and node.args[0] in found:
            found.update(node.results)
    return found


def read_by(node: Node, values: list[Value]) -> bool:
    return any(v in values for v in node.inputs())


def _recomputing(backward: list[Node], before: dict, renamed: dict) -> list[Node]:
    """The backward with the calls ``before`` gives each node made just before it,
    and every value read through ``renamed``."""
    new_backward = []
    for node in backward:
        new_backward += before.get(node, [])
        node.args = map_values(node.args, lambda v: renamed.get(v, v))
        new_backward.append(node)
    return new_backward
