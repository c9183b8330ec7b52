"""Common subexpressions: a call equal to an earlier one (same operator, same
arguments) reuses its results.

Never merged: calls with an effect (Node.impure), and, in a graph that writes any
tensor in place, every call: a write to one result would then show through the other
(and through views of either), which the eager program keeps apart."""

from __future__ import annotations

from typing import Any

from ..graph import Graph, Value, map_values


def _key(node: Any, renamed: dict) -> Any:
    args = map_values(node.args, lambda v: renamed.get(v, v))
    try:
        return (id(node.target), _hashable(args))
    except TypeError:  # an unhashable argument (a host array): not merged
        return None


def _hashable(a: Any) -> Any:
    if isinstance(a, (tuple, list)):
        return (type(a).__name__, tuple(_hashable(x) for x in a))
    if isinstance(a, Value):
        return ("value", id(a))
    if isinstance(a, float) and a != a:  # NaN equals nothing: key it by its bits
        return ("nan", repr(a))
    hash(a)
    return (type(a).__name__, a)


def run(graph: Graph) -> Graph:
    if any(node.writes() for node in graph.nodes):
        return graph
    seen: dict[Any, Any] = {}
    renamed: dict[Value, Value] = {}
    kept = []
    for node in graph.nodes:
        node.args = map_values(node.args, lambda v: renamed.get(v, v))
        key = None if node.impure else _key(node, renamed)
        earlier = seen.get(key) if key is not None else None
        if earlier is not None:
            renamed.update(zip(node.results, earlier.results))
            continue
        if key is not None:
            seen[key] = node
        kept.append(node)
    graph.nodes = kept
    graph.outputs = map_values(graph.outputs, lambda v: renamed.get(v, v))
    return graph
