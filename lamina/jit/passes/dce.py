"""Dead-code elimination: drop the calls whose results nothing uses and that have no
effect (Node.impure: writes, random draws)."""

from __future__ import annotations

from ..graph import Graph


def run(graph: Graph) -> Graph:
    live = set(graph.output_values())
    kept = []
    for node in reversed(graph.nodes):
        if node.impure or any(r in live for r in node.results):
            kept.append(node)
            live.update(node.inputs())
    graph.nodes = kept[::-1]
    return graph
