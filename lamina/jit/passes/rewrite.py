"""Operator replacement: each chain of calls that a declared fusion covers becomes its
one call (Note [Rewrites] in lamina.dispatch.rewrites: the table ``lamina.nn.Sequential``
applies to its children eagerly, here applied to any captured program, functional code
and branches included).

Note [Chains in graphs]: a chain is a run of calls, each taking the first result of
the one before as its first argument, where that result is read by nothing else (no
other argument, no other call, not returned) and no other result of a call but the
last one's first is used at all: the fused call computes only the chain's final value,
so a value it skips must be one nobody asks for. The fused call takes the place of the
chain's last call, where every argument of the chain is defined and no use of its value
has come yet.
"""

from __future__ import annotations

from lamina.dispatch import rewrites

from ..graph import Graph, Node, Value, map_values, values_in
from ..tracer import record_calls


def chain_of(node: Node, users: dict[Value, list[Node]], returned: set[Value]) -> list[Node]:
    """The longest chain (Note [Chains in graphs]) that begins with ``node``."""
    chain = [node]
    while True:
        last = chain[-1]
        if not last.results or any(r in returned or r in users for r in last.results[1:]):
            return chain
        value = last.results[0]
        readers = users.get(value, [])
        if value in returned or len(readers) != 1:
            return chain
        reader = readers[0]
        if not reader.args or reader.args[0] is not value or value in values_in(reader.args[1:]):
            return chain
        chain.append(reader)


def _fused(rewrite: rewrites.Rewrite) -> object:
    def call(x: object, *rests: tuple) -> object:
        stages = [lambda y, rest=rest: (y, *rest) for rest in rests]
        return rewrite.apply(x, *stages)

    return call


def run(graph: Graph) -> Graph:
    users, returned = graph.users(), set(graph.output_values())
    at_last: dict[Node, tuple[list[Node], dict]] = {}  # a chain's last call -> fused
    dropped: set[Node] = set()
    for node in graph.nodes:
        if node in dropped or not node.args or not isinstance(node.args[0], Value):
            continue
        chain = chain_of(node, users, returned)
        found = rewrites.match([n.name for n in chain])
        if found is None:
            continue
        chain = chain[: len(found.pattern)]
        if any(r in returned or r in users for r in chain[-1].results[1:]):
            continue
        grad = chain[-1].results[0].requires_grad
        nodes, value = record_calls(
            graph, _fused(found), node.args[0], *[n.args[1:] for n in chain], grad=grad
        )
        for n in nodes:
            n.line = chain[-1].line
        at_last[chain[-1]] = (nodes, {chain[-1].results[0]: value})
        dropped.update(chain)
    return splice(graph, at_last, dropped)


def splice(
    graph: Graph, at: dict[Node, tuple[list[Node], dict[Value, Value]]], dropped: set[Node]
) -> Graph:
    """``graph`` with each node of ``at`` replaced by its new nodes, whose Values take
    the places the node's entry names (old Value -> new), and the ``dropped`` nodes
    removed."""
    renamed: dict[Value, Value] = {}
    kept: list[Node] = []
    for node in graph.nodes:
        if node in at:
            nodes, places = at[node]
            renamed.update(places)
        elif node in dropped:
            continue
        else:
            nodes = [node]
        for n in nodes:  # an argument may be the value of a call replaced above
            n.args = map_values(n.args, lambda v: renamed.get(v, v))
        kept += nodes
    graph.nodes = kept
    graph.outputs = map_values(graph.outputs, lambda v: renamed.get(v, v))
    return graph
