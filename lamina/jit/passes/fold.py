"""Constant folding: calls whose every input is known when the graph is compiled --
creation operators, and calls on their results -- run once, at compile time; their
results become constants of the graph.

Never folded: random and other calls with an effect (Node.impure), a value the graph
returns (each call must return a tensor of its own, as eager does), and any call of a
graph that writes a tensor in place (a folded constant would carry one call's write
into the next)."""

from __future__ import annotations

from ..executor import call_node
from ..graph import CONSTANT, Graph, Value


def run(graph: Graph) -> Graph:
    if any(node.writes() for node in graph.nodes):
        return graph
    returned = set(graph.output_values())
    known: dict[Value, object] = {}
    kept = []
    for node in graph.nodes:
        inputs = list(node.inputs())
        foldable = (
            not node.impure
            and all(v in known for v in inputs)
            and not any(r in returned for r in node.results)
        )
        if not foldable:
            kept.append(node)
            continue
        results = call_node(node, known)
        for value, tensor in zip(node.results, results):
            known[value] = tensor
            value.kind, value.node, value.source = CONSTANT, None, tensor
    used = {v for node in kept for v in node.inputs()} | returned
    graph.inputs += [v for v in known if v in used]
    graph.nodes = kept
    return graph
