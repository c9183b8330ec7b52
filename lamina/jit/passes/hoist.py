"""Calls on parameters and buffers alone -- a folded batch norm's weight and bias, a
transposed or reshaped weight -- computed once and again only when one of those tensors
changes, not at every call.

Note [Hoisted calls]: a call is hoisted when it has no effect (Node.impure) and every
tensor it reads is a parameter, a constant or the result of a hoisted call; its results
must not be returned (each call of the program returns tensors of its own). The hoisted
calls become one ``hoisted`` node at the top of the graph, which runs them (their own
plan) when the storage or the version counter (Note [Version counters]) of a tensor
they read differs from the last run's, and otherwise hands back the last run's results:
an optimizer step, a ``load_state_dict`` or any in-place operation on a parameter is
seen (a write through a NumPy view of it, ``p.numpy()[...] = v``, is not: version
counters do not see it, in PyTorch either).
A graph that writes a tensor in place is left alone: a hoisted call would read the
tensor before a write that it followed. Nor is a call whose result requires grad
hoisted (traced in grad mode, from a parameter): the plan records autograd (a program
compiled without a joint graph), and the result must link to the parameter's graph at
every call -- an LSTM's two biases, added once, got no gradient. In a joint graph
(Note [Joint graph]) no result requires grad, and under ``no_grad`` none does.
"""

from __future__ import annotations

from typing import Any

from ..executor import Plan
from ..graph import CONSTANT, PARAMETER, Graph, Node


class Hoisted:
    """The target of the ``hoisted`` node: the calls' plan, and its last results with
    what they were computed from."""

    def __init__(self, plan: Plan) -> None:
        self.name = f"hoisted[{', '.join(n.name for n in plan.graph.nodes)}]"
        self.plan = plan
        self.key: list | None = None  # (storage, version) of each tensor read, last run
        self.results: Any = None

    def run(self, tensors: tuple) -> Any:
        key = [(t._data, t._version) for t in tensors]
        old = self.key
        if old is None or any(a is not b or u != v for (a, u), (b, v) in zip(old, key)):
            self.results = self.plan.run(tensors)
            self.key = key
        return self.results

    def emit(self, arguments: list[str], results: list[str], bind: Any) -> list[str]:
        me = bind(self, "k")
        tensors = "".join(a + ", " for a in arguments)
        return ["".join(r + ", " for r in results) + f"= {me}.run(({tensors}))"]


def run(graph: Graph) -> Graph:
    if any(node.writes() for node in graph.nodes):
        return graph
    returned = set(graph.output_values())
    known = {v for v in graph.inputs if v.kind in (PARAMETER, CONSTANT)}
    hoisted: list[Node] = []
    for node in graph.nodes:
        inputs = list(node.inputs())
        if (
            inputs
            and not node.impure
            and all(v in known for v in inputs)
            and not any(r in returned or r.requires_grad for r in node.results)
        ):
            hoisted.append(node)
            known.update(node.results)
    if not hoisted:
        return graph
    rest = [n for n in graph.nodes if n not in set(hoisted)]
    made = {r for n in hoisted for r in n.results}
    read = list(dict.fromkeys(v for n in hoisted for v in n.inputs() if v not in made))
    used = list(dict.fromkeys(v for n in rest for v in n.inputs() if v in made))
    if not used:  # the rest reads none of them (dead code, left for dce)
        return graph
    inner = Graph()
    inner.inputs, inner.nodes, inner.outputs = list(read), hoisted, tuple(used)
    node = Node(Hoisted(Plan(inner, positional=read)), tuple(read), several=True)
    for v in used:
        v.node = node
    node.results = used
    graph.nodes = [node, *rest]
    return graph
