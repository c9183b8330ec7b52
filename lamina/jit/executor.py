"""The executor: a graph turned into one generated Python function that calls each
node's kernel directly, with no dispatch per node.

Note [Executor]: every check a call makes in eager mode -- argument kinds, dtype rules,
shapes, the choice of kernel by key set -- depends only on what the graph's guards fix
(Note [Guards] in compiler.py), so it was made once, while tracing. What is left per
node is the kernel the dispatch table held for the node's key set when the plan was
made: ``op.table[ks.bit_length()](ks, *args)``, its arguments straight from local
variables, Python numbers and the like inlined or bound as constants. The source can be
printed (``Plan.source``), like any generated code in lamina. Tables rebuilt since
(a plugin registered, a layer switched) change ``entries.generation``, which the guards
check, so a plan never calls a kernel its table no longer holds.

Note [Kernels of plans]: a kernel may offer ``kernel.for_plan()``: a callable of the
kernel's own signature that one node of a plan calls instead, made once per node, which
may keep between calls what a call decides from its arguments' shapes, layouts and
constants -- they stay as the guards fixed them, except for the sizes a symbolic graph
leaves free -- and from settings it keys by itself (the CPU convolutions' geometry and
memory order: Note [Convolutions of a plan] in their backend). Eager calls, and the
kernels of plugins that offer none, decide on every call.
"""

from __future__ import annotations

import math
from typing import Any

from lamina.backends.threads import concurrently
from lamina.dispatch import keys
from lamina.dispatch.schema import Operator
from lamina.dispatch.tensor import bump_version

from .graph import INPUT, Graph, Node, Value, map_values, values_in
from .symbolic import Sym, SymbolicFused, symbol_places


def node_keys(node: Node, grad: bool) -> int:
    """The key set of a node's call on the CPU: CPU (creation operators take their
    device from it too), and AUTOGRAD where autograd recorded the call in the trace: an
    input requires grad, its result does (not under a ``no_grad`` inside the program)
    and ``grad`` (grad mode at the trace) is on."""
    ks = keys.CPU
    recorded = any(v.requires_grad for v in node.results) or not node.results
    if grad and recorded and any(v.requires_grad for v in node.inputs()):
        ks |= keys.AUTOGRAD
    return ks & node.target.mask


class Plan:
    """A graph's generated function: ``plan(inputs)`` with the real tensors of the
    graph's INPUT values (or of ``positional``), in order; the other inputs,
    parameters and constants, are their tensors (the same objects at each call). With
    ``consume``, ``inputs`` is a list the plan empties once it has read it."""

    def __init__(
        self,
        graph: Graph,
        grad: bool = False,
        positional: list | None = None,
        consume: bool = False,
    ) -> None:
        self.graph, self.grad, self.consume = graph, grad, consume
        names: dict[Value, str] = {}
        bound: dict[str, Any] = {}

        def bind(obj: Any, prefix: str) -> str:
            name = f"{prefix}{len(bound)}"
            bound[name] = obj
            return name

        def arg(a: Any) -> str:
            if isinstance(a, Value):
                return names[a]
            if isinstance(a, Sym):  # the call's size, from the symbols (Note [Symbolic sizes])
                return repr(a)
            if isinstance(a, tuple) and hasattr(a, "_fields"):  # a named tuple
                return f"{bind(type(a), 'c')}(" + ", ".join(arg(x) for x in a) + ")"
            if isinstance(a, tuple):
                return "(" + "".join(arg(x) + ", " for x in a) + ")"
            if isinstance(a, list):
                return "[" + ", ".join(arg(x) for x in a) + "]"
            if isinstance(a, dict):
                return "{" + ", ".join(f"{k!r}: {arg(v)}" for k, v in a.items()) + "}"
            if (
                a is None
                or type(a) in (bool, int, str)
                or (type(a) is float and a == a and abs(a) != float("inf"))
            ):
                return repr(a)
            return bind(a, "c")

        inputs = [v for v in graph.inputs if v.kind == INPUT] if positional is None else positional
        self.positional = positional
        lines = ["def run(inputs):"]
        for i, v in enumerate(inputs):
            names[v] = f"x{i}"
        if inputs:
            lines.append("    " + "".join(names[v] + ", " for v in inputs) + "= inputs")
            if consume:  # the caller's list lets go: each input is released after its
                lines.append("    inputs.clear()")  # last use (Note [Released values])
        places = symbol_places(inputs, graph.symbols)
        lines += [f"    s{i} = {names[inputs[k]]}._shape[{d}]" for i, (k, d) in enumerate(places)]
        for v in graph.inputs:
            if v not in names:
                names[v] = bind(v.source, "p")
        nodes, groups = _schedule(graph)
        for i, node in enumerate(nodes):
            for j, r in enumerate(node.results):
                names[r] = f"v{i}_{j}"

        def emit(node: Node) -> list[str]:
            """The node's lines, unindented."""
            args = ", ".join(arg(a) for a in node.args)
            if isinstance(node.target, Operator):
                ks = node_keys(node, grad)
                entry = _entry(node.target, ks, node.args)
                if hasattr(entry, "for_plan"):  # Note [Kernels of plans]
                    entry = entry.for_plan()
                kernel = bind(entry, "k")
                call = f"{kernel}({ks}, {args})"
            elif hasattr(node.target, "emit"):  # a kernel a pass made: its own lines
                results = [names[r] for r in node.results]
                return node.target.emit([arg(a) for a in node.args], results, bind)
            else:  # another kernel a pass made: called with its arguments
                call = f"{bind(node.target, 'k')}({args})"
            # Note [Version counters] (dispatch/tensor.py): a write bumps its storage's
            # version, so that autograd refuses a saved tensor changed since
            bumps = [f"{bind(bump_version, 'c')}({names[v]})" for v in node.writes()]
            if not node.results:
                return [call, *bumps]
            if node.several:
                return ["".join(names[r] + ", " for r in node.results) + f"= {call}", *bumps]
            return [f"{names[node.results[0]]} = {call}", *bumps]

        last_use = _last_uses(nodes, graph)
        for group in groups:
            if len(group) == 1:  # the common case: one call after another
                lines += ["    " + line for line in emit(nodes[group[0]])]
            else:  # Note [Inter-op parallelism]: one task per call
                tasks = []
                for i in group:
                    results = "".join(names[r] + ", " for r in nodes[i].results)
                    lines.append(f"    def t{i}():")
                    lines += ["        " + line for line in emit(nodes[i])]
                    lines.append(f"        return ({results})")
                    tasks.append(f"t{i}")
                unpack = "".join(
                    "(" + "".join(names[r] + ", " for r in nodes[i].results) + "), " for i in group
                )
                costs = tuple(_cost(nodes[i]) for i in group)
                run = bind(concurrently, "c")
                lines.append(f"    {unpack}= {run}(({', '.join(tasks)},), {costs})")
            for i in group:
                lines += _release(last_use.get(i, ()), names)
        lines.append(f"    return {arg(graph.outputs)}")
        self.source = "\n".join(lines) + "\n"
        namespace = dict(bound)
        exec(
            compile(self.source, f"<lamina.jit plan of {len(graph.nodes)} nodes>", "exec"),
            namespace,
        )
        self.run = namespace["run"]
        only = graph.nodes[0] if len(graph.nodes) == 1 else None
        direct = (  # a plan that is one call on its inputs, giving its result
            only is not None
            and not consume
            and len(only.args) == len(inputs)
            and all(a is v for a, v in zip(only.args, inputs))
            and only.results == [graph.outputs]
        )
        if direct and getattr(only.target, "c_loop", False):  # one fused C loop: its call
            self.run = only.target.entry.run
        self.loop_at = None  # one symbolic loop: the loop's call for given inputs' sizes
        if direct and isinstance(only.target, SymbolicFused):
            self.loop_at = lambda tensors: (
                only.target.at(*(tensors[k]._shape[d] for k, d in places)).run
            )

    def __call__(self, inputs: list) -> Any:
        return self.run(inputs)


def _last_uses(nodes: list[Node], graph: Graph) -> dict[int, list[Value]]:
    """Note [Released values]: node index -> the values that node is the last to use
    (or makes without anyone using them), none that the graph returns or was given:
    the plan deletes its name for each then, so its memory goes back to the pool for
    the calls after it, as eager's intermediate tensors do when their last reference
    goes -- a plan's locals would otherwise hold every value until it returns."""
    kept = set(graph.output_values()) | {v for v in graph.inputs if v.kind is not None}
    last: dict[Value, int] = {}
    for i, node in enumerate(nodes):
        for v in (*node.inputs(), *node.results):
            last[v] = i
    found: dict[int, list[Value]] = {}
    for v, i in last.items():
        if v not in kept:
            found.setdefault(i, []).append(v)
    return found


def _release(values: Any, names: dict) -> list[str]:
    return ["    del " + ", ".join(names[v] for v in values)] if values else []


# Note [Inter-op parallelism]: calls that do not depend on each other -- the branches of
# an Inception block -- may run at once (``lm.set_num_interop_threads``), each on one of
# lamina's threads (``concurrently``: a split, Note [Split work], whose parts run the
# calls given them one after another, their own kernels serially). A plan groups its
# calls by level (the longest chain of calls before each), and a level with two or more
# big calls (convolutions, pooling, matrix products: WORTH_A_THREAD elements of result
# or more) becomes one group whose calls are spread over the threads by their cost;
# every other call runs alone, in order. A call runs at the latest level its readers
# allow, unless the graph returns one of its results: a backward's recomputed pool
# indices are then made next to the scatter that reads them, not all at its start
# where they would all be alive at once, while a parameter's gradient is made as soon
# as it can be and the gradient it reads released. Only a graph that writes nothing
# and draws no random numbers (no impure node) is reordered so: levels keep every
# dependency that flows through values, and no other kind.
WORTH_A_THREAD = 1 << 12
_BIG = ("nn", "linalg")  # the operator categories whose calls may be big


def _schedule(graph: Graph) -> tuple[list[Node], list[list[int]]]:
    """The graph's nodes in the order the plan runs them, and the groups of their
    indices run together, consecutive (Note [Inter-op parallelism]): each node alone,
    in the graph's order, unless the graph can run levels of big calls at once."""
    nodes = graph.nodes
    if any(node.impure for node in nodes):
        return nodes, [[i] for i in range(len(nodes))]
    levels = _levels(graph)
    ordered: list[Node] = []
    groups: list[list[int]] = []
    for depth in sorted(set(levels)):
        members = [i for i, d in enumerate(levels) if d == depth]
        big = [i for i in members if _cost(nodes[i]) >= WORTH_A_THREAD]
        big = big if len(big) >= 2 else []  # run first, together; the others one by one
        rest = [i for i in members if i not in big]
        start = len(ordered)
        groups += [list(range(start, start + len(big)))] if big else []
        groups += [[start + len(big) + j] for j in range(len(rest))]
        ordered += [nodes[i] for i in big + rest]
    if len(groups) == len(nodes):
        return nodes, [[i] for i in range(len(nodes))]  # nothing at once: graph order
    return ordered, groups


def _levels(graph: Graph) -> list[int]:
    """Each node's level (Note [Inter-op parallelism]): one more than the deepest of
    the calls it reads from; then, from the last node back, one less than the lowest
    of its readers' for a node whose results the graph does not return."""
    nodes = graph.nodes
    level: dict[Value, int] = {}
    levels = []
    for node in nodes:
        depth = 1 + max((level.get(v, 0) for v in node.inputs()), default=0)
        levels.append(depth)
        level.update(dict.fromkeys(node.results, depth))
    returned = set(values_in([graph.outputs]))
    readers: dict[Value, list[int]] = {}
    for i in reversed(range(len(nodes))):
        node = nodes[i]
        reading = [levels[j] for r in node.results for j in readers.get(r, ())]
        if reading and not returned.intersection(node.results):
            levels[i] = min(reading) - 1
        for v in node.inputs():
            readers.setdefault(v, []).append(i)
    return levels


def _cost(node: Node) -> int:
    """A big call's work, roughly: its results' elements, times the weight's elements
    per output channel for a convolution or a product (0 for other calls)."""
    target = node.target
    if not isinstance(target, Operator) or target.category not in _BIG:
        return 0
    elements = sum(math.prod(r.shape) for r in node.results if r.shape is not None)
    weights = [v for v in node.inputs() if v.shape is not None and len(v.shape) >= 2]
    per_output = math.prod(weights[1].shape[1:]) if len(weights) > 1 else 1
    return elements * per_output


NUMBERS = (bool, int, float, complex)  # the Python numbers a call may take as operands


def _entry(op: Operator, ks: int, args: tuple) -> Any:
    """The kernel a call of ``op`` with key set ``ks`` reaches: the scalar table's
    entry for a binary elementwise call with a Python number operand (Note [Kernel
    variants]), else the table's."""
    if op.category == "elementwise" and len(args) == 2 and any(type(a) in NUMBERS for a in args):
        return op.scalar_table[ks.bit_length()]
    return op.table[ks.bit_length()]


def call_node(node: Node, env: dict, grad: bool = False) -> list:
    """Run one operator node now on the real tensors ``env`` gives its Values (with
    ``grad``, recorded by autograd as in the trace): the results as a list (empty for
    an in-place call)."""
    ks = node_keys(node, grad)
    args = map_values(node.args, env.__getitem__)
    out = _entry(node.target, ks, args)(ks, *args)
    if "inplace" in node.target.tags:
        return []
    return list(out) if node.several else [out]
