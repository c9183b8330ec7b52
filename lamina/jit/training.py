"""Compiled training: the backward of a compiled function is a compiled graph too.

Note [Joint graph]: AOTAutograd's joint graph, on lamina's operators. The forward is
traced with autograd on (the meta twins of tensors that require grad require grad, so
the autograd layer below TRACE records its nodes on meta tensors); then, still under
the trace, ``autograd.grad`` runs the derivative formulas -- dispatched operators like
any other -- from placeholder gradients of the outputs, and the trace records them too.
The nodes before that point are the forward graph, the rest the backward graph. The
forward returns the user's outputs and every forward value the backward reads (what it
saves: the partition is by use, so nothing the formulas do not read is kept); the
backward takes the output gradients and those values and returns one gradient per
input that requires grad. Both are optimized and planned like any graph (elementwise
chains of the backward fuse as the forward's do) and run without autograd. A call runs
the forward plan, then records one autograd node (``Derivative`` "compiled") whose
formula runs the backward plan: ``loss.backward()``, gradient hooks, gradient
accumulation and optimizers see an ordinary node.
"""

from __future__ import annotations

from typing import Any

from lamina.autograd import derivatives, engine
from lamina.autograd import graph as autograd_graph
from lamina.autograd.grad_mode import is_grad_enabled, no_grad
from lamina.dispatch import modes, ops
from lamina.dispatch.tensor import Tensor

from . import passes as P
from .executor import Plan
from .graph import CONSTANT, INPUT, PARAMETER, Graph, Value
from .tracer import GraphBreak, trace_key, tracing


class Training:
    """A compiled function's forward and backward plans (Note [Joint graph])."""

    def __init__(
        self,
        forward: Plan,
        backward: Plan,
        n_outputs: int,
        single: bool,
        diff: list[Value],
        inputs: list[Value],
        saved: list[Value],
        n_kept: int,
        reach: list[frozenset[int]],
    ) -> None:
        self.forward, self.backward = forward, backward
        self.reach = reach  # per differentiable input, the outputs that depend on it
        self.n_outputs, self.single = n_outputs, single
        self.diff, self.inputs, self.saved = diff, inputs, saved
        self.n_kept = (
            n_kept  # the first saved values: the user's (Note [Saved values of a compiled step])
        )
        self.derivative = derivatives.Derivative(
            "compiled", self._formula, saves=None, releases=True
        )
        self.graph = forward.graph

    def run(self, tensors: list) -> Any:
        with no_grad():
            produced = self.forward.run(tensors)
        n, k = self.n_outputs, self.n_outputs + self.n_kept
        outputs, kept, box = list(produced[:n]), produced[n:k], list(produced[k:])
        del produced
        real = dict(zip(self.inputs, tensors))
        diff = [real[v] if v.kind == INPUT else v.source for v in self.diff]
        like = [(o.shape, o.dtype) for o in outputs]  # for gradients that do not come
        autograd_graph.record(self.derivative, (*diff, *kept, like, box), tuple(outputs))
        return outputs[0] if self.single else tuple(outputs)

    def _formula(self, g: Any, result: Any, needs: list, release: bool, *args: Any) -> list:
        """Note [Saved values of a compiled step]: the values the backward reads that
        the user can reach -- inputs, parameters, the outputs -- are saved as any
        formula's (autograd checks that they did not change in place since); the
        forward's own intermediates travel in one list, which the last backward empties
        into the plan's inputs (Note [Releasing saved values]), so each goes back to
        the pool after its last use in the backward, as eager's saved tensors go node
        by node (Note [Released values] in executor.py)."""
        if is_grad_enabled():  # backward(create_graph=True): this plan records nothing
            raise NotImplementedError(
                "a compiled function's backward cannot be differentiated again "
                "(create_graph=True); call the function uncompiled for higher derivatives"
            )
        kept, like, box = args[len(self.diff) : -2], args[-2], args[-1]
        grads = list(g) if self.n_outputs > 1 else [g]
        missing = {k for k, grad in enumerate(grads) if grad is None}
        with no_grad():
            for k in missing:  # an output the loss did not read (an RNN's last state)
                grads[k] = ops.zeros(like[k][0], dtype=like[k][1])
            inputs = [*grads, *kept, *box]
            if release:
                box.clear()
            out = self.backward.run(inputs)  # it empties ``inputs``
        if missing:  # an input only those outputs read gets none, as in eager mode
            out = [None if self.reach[i] <= missing else grad for i, grad in enumerate(out)]
        return [*out, *([None] * (len(kept) + 2))]


def build(
    fn: Any, args: tuple, kwargs: dict, start: Any, names: Any, no_global_writes: Any
) -> Training | None:
    """The training plans of ``fn`` on these arguments, or None where the function's
    result is not a floating tensor or a tuple of them that all require grad (such
    functions run with autograd recording through the forward plan instead)."""
    tracer, _, targs, tkwargs = start(fn, args, kwargs)
    graph = tracer.graph
    with no_global_writes(fn), tracing(tracer):
        try:
            out = fn(*targs, **tkwargs)
        except GraphBreak:  # compiled in segments, autograd recording through them
            return None
        single = isinstance(out, Tensor)
        outs = [out] if single else list(out) if isinstance(out, tuple) else None
        if not outs or not all(isinstance(o, Tensor) and o.requires_grad for o in outs):
            return None
        forward_count = len(graph.nodes)
        if any(v.requires_grad for node in graph.nodes for v in node.writes()):
            return None  # a write into autograd's graph: it records through the forward
            # plan, and checks the tensors it saved (a batch norm's statistics are not)
        twins = [t for t in tracer.keep if id(t) in tracer.values and t.requires_grad]
        kinds = [tracer.values[id(t)].kind for t in twins]
        if CONSTANT in kinds:  # a non-leaf read from elsewhere: its graph is not ours
            return None
        diff_twins = [t for t, kind in zip(twins, kinds) if kind in (INPUT, PARAMETER)]
        if not diff_twins:
            return None
        placeholders = []
        with modes.exclude(trace_key()):  # made, not recorded
            for k, o in enumerate(outs):
                twin = ops.empty(o.shape, dtype=o.dtype, device="meta")
                tracer._bind(twin, graph.new_value(twin, None, f"g{k}"))
                placeholders.append(twin)
        try:
            grads = engine.grad(outs, diff_twins, placeholders, allow_unused=True)
        except GraphBreak:  # a derivative formula reads values (sort's): autograd records
            return None  # through the forward plan instead
    outputs = [tracer.values[id(o)] for o in outs]
    diff = [tracer.values[id(t)] for t in diff_twins]
    gvalues = [tracer.values[id(p)] for p in placeholders]
    forward_nodes, backward_nodes = graph.nodes[:forward_count], graph.nodes[forward_count:]
    reach = _reach(forward_nodes, outputs, diff)
    for name in names:
        if name in P.JOINT:  # what the forward saves for the backward
            forward_nodes, backward_nodes = P.JOINT[name](
                graph, forward_nodes, backward_nodes, outputs
            )
    produced = {r for n in backward_nodes for r in n.results}
    read = list(
        dict.fromkeys(
            v for n in backward_nodes for v in n.inputs() if v not in produced and v not in gvalues
        )
    )
    # a gradient may be an alias the engine made of a traced tensor: meta_of finds it
    grad_values = [None if g is None else tracer.value_of(tracer.meta_of(g)) for g in grads]
    for v in grad_values:  # a gradient that is a forward value or an input as is
        if v is not None and v not in produced and v not in gvalues and v not in read:
            read.append(v)
    # the user's tensors first (Note [Saved values of a compiled step])
    users = [v for v in read if v.node is None or v in outputs]
    read = users + [v for v in read if v not in users]
    inputs = [v for v in graph.inputs if v.kind == INPUT]

    for node in graph.nodes:  # both graphs run without autograd (Note [Joint graph])
        for v in node.results:
            v.requires_grad = False
    fwd = Graph()
    fwd.inputs, fwd.nodes = list(graph.inputs), forward_nodes
    fwd.outputs = tuple(outputs + read)
    bwd = Graph()
    bwd.inputs, bwd.nodes = gvalues + read, backward_nodes
    fwd._count = bwd._count = graph._count  # a pass's new values: named past the joint's
    bwd.outputs = tuple(grad_values)
    forward_plan = Plan(_optimized(fwd, names))
    backward_plan = Plan(_optimized(bwd, names), positional=gvalues + read, consume=True)
    return Training(
        forward_plan, backward_plan, len(outs), single, diff, inputs, read, len(users), reach
    )


def _reach(nodes: list, outputs: list[Value], diff: list[Value]) -> list[frozenset[int]]:
    """For each differentiable input, the indices of the outputs whose values depend on
    it (through ``nodes``, the forward's)."""
    depends: dict[Value, frozenset[int]] = {v: frozenset([i]) for i, v in enumerate(diff)}
    for node in nodes:
        found = frozenset().union(*(depends.get(v, ()) for v in node.inputs()))
        for r in node.results:
            depends[r] = found
    reach: list[set[int]] = [set() for _ in diff]
    for k, o in enumerate(outputs):
        for i in depends.get(o, ()):
            reach[i].add(k)
    return [frozenset(r) for r in reach]


def _optimized(graph: Graph, names: Any) -> Graph:
    graph = P.apply(graph, names)
    graph.lint()
    return graph
