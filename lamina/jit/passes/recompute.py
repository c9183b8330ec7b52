"""Backprop state: what a training step's forward saves for its backward. A joint-graph
pass (Note [Joint graph] in training.py): it sees the forward's calls and the
backward's, before they are split by what the backward reads.

Note [Recomputed pool indices]: max pooling with indices saves an int64 index per
output (twice the output's bytes in float32) for the backward's scatter. Where the
backward reads the pooling's input anyway (the batch norm + relu, relu or LRN before
it saves its result, which is that input), the indices cost a pooling pass to compute
again, next to the scatter, and nothing to keep: the forward pools values only, as in
inference, and the step's saved state shrinks by the indices (VGG at batch 32: 7.5 of
73 MiB).
"""

from __future__ import annotations

from lamina.dispatch.schema import OPERATORS

from ..graph import Graph, Node, Value, map_values
from ..tracer import record_calls


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
        readers = [n for n in backward if indices in list(n.inputs())]
        if any(indices in list(n.inputs()) for n in forward) or not readers:
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
    new_backward = []
    for node in backward:
        new_backward += before.get(node, [])
        node.args = map_values(node.args, lambda v: renamed.get(v, v))
        new_backward.append(node)
    return new_forward, new_backward
