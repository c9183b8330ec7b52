"""Elementwise fusion: maximal groups of elementwise calls of one shape become one
generated loop (Note [Fused kernels] in lamina.backends.numba_cpu.fused), so a chain
reads its inputs once and writes only the values that leave it.

Note [Fusion groups]: the pass walks the nodes in order. An elementwise call the CPU's
fused loops can compute (``fused.can_fuse``), whose result is a new C-contiguous tensor
that needs no gradient, joins the open group of one of its inputs' producers when it has
that group's shape (the open groups of that shape it reads from merge into one); else
it opens a group. A group closes when a call outside it uses one of its values: the
fused call takes the place of the group's last member, so a value read in between would
not exist yet. A call that writes a tensor (in place, ``setitem``) closes every group,
and a group never ends in a reduction past one: a member moved after the write would
read the written value. A group of one call stays that call, unless it ends in a reduction. The
values a group returns are those used after it or returned by the graph; the others live
only in registers. A group whose last value only a sum, max or min reads may end in it
(Note [Fused reductions] in lamina.backends.numba_cpu.fused): the fused call takes the
reduction's place.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from lamina.backends import threads
from lamina.backends.numba_cpu import fused
from lamina.dispatch import core, decompositions, layouts, meta
from lamina.dispatch import dtypes as D
from lamina.dispatch.schema import Operator
from lamina.dispatch.tensor import from_array, from_flat

from ..executor import NUMBERS
from ..graph import Graph, Node, Value
from ..tracer import record_calls
from .rewrite import splice


class _Operand:
    """What the dtype rules read off an operand: a Value's dtype; a number is itself."""

    def __init__(self, value: Value) -> None:
        self._dtype, self._shape = value.dtype, value.shape


def _computation(node: Node) -> D.DType | None:
    """The dtype the node's call computes in, or None where a group cannot take it."""
    op = node.target
    if not isinstance(op, Operator) or op.category != "elementwise" or len(node.results) != 1:
        return None
    result = node.results[0]
    if result.requires_grad or result.strides != layouts.contiguous(result.shape):
        return None
    if not all(isinstance(a, Value) or type(a) in NUMBERS for a in node.args):
        return None
    operands = [_Operand(a) if isinstance(a, Value) else a for a in node.args]
    try:
        comp = meta.promote(op, operands)
    except (TypeError, ValueError):
        return None
    return comp if fused.can_fuse(op, comp, operands) else None


class FusedCall:
    """The target of a fused node: the group's loop over ``shape``, compiled when the
    plan is made (the guards fix every input's dtype and layout) and called inline by
    the plan (``emit``). A flat group below the parallel threshold is one call of its
    C loop (Note [Fused loops] in lamina.dispatch.reference), which may end in a
    reduction of rows of ``inner`` values to ``result_shape`` (Note [Fused reductions]
    in lamina.backends.numba_cpu.fused); another is its outputs allocated, its Numba
    kernel, its outputs wrapped as tensors. ``code`` is the compiled loop (an address,
    or the kernel), which groups of other sizes share."""

    def __init__(
        self,
        group: fused.Group,
        shape: tuple,
        ops: list[str],
        result_shape: tuple | None = None,
        inner: int = 1,
    ) -> None:
        self.group, self.shape, self.ops = group, shape, ops
        self.result_shape, self.inner = result_shape, inner  # for loop_at at other sizes
        self.name = "fused[" + ", ".join(ops) + "]"
        self.size = math.prod(shape)
        parallel = self.size >= threads.parallel_threshold()
        self.c_loop = group.flat and not parallel
        if self.c_loop:
            self.code = fused.loop_address(group)
            self.entry = self.loop_at(shape, result_shape, inner)
        else:
            assert not group.reduction, "a reduction group runs as a C loop"
            self.code = self.entry = fused.compile_group(group, parallel)

    def loop_at(self, shape: tuple, result_shape: tuple | None, inner: int) -> Any:
        """The C loop's call at these sizes: this node's, or a symbolic graph's at the
        sizes of a call (Note [Symbolic sizes] in lamina.jit.symbolic)."""
        group, size = self.group, math.prod(shape)
        inputs = tuple((d, 1 if k in group.scalars else size) for k, d in enumerate(group.inputs))
        result_shape = shape if result_shape is None else result_shape
        rows = math.prod(result_shape) if group.reduction else size
        return core.FusedLoop(self.code, result_shape, inputs, group.output_dtypes(), rows, inner)

    def emit(self, args: list[str], results: list[str], bind: Callable[[Any, str], str]) -> list:
        group, kernel = self.group, bind(self.entry, "k")
        if self.c_loop:
            targets = results[0] if len(results) == 1 else "".join(r + ", " for r in results)
            return [f"{targets} = {kernel}({', '.join(args)})"]
        empty, shape = bind(np.empty, "c"), repr(self.shape)
        if group.flat:
            size, wrap = self.size, bind(from_flat, "c")
            operands = [f"{a}._flat" for a in args]
        else:
            size, wrap = shape, bind(from_array, "c")
            broadcast = bind(np.broadcast_to, "c")
            operands = [f"{broadcast}({a}._data, {shape})" for a in args]
        outs = [f"{r}_out" for r in results]
        lines = []
        for out, j in zip(outs, group.outputs):
            lines.append(f"{out} = {empty}({size}, {bind(group.steps[j].result.np, 'c')})")
        lines.append(f"{kernel}({', '.join(operands + outs)})")
        for r, out, j in zip(results, outs, group.outputs):
            if group.flat:
                dtype = bind(group.steps[j].result, "c")
                lines.append(f"{r} = {wrap}({out}, {shape}, {dtype})")
            else:
                lines.append(f"{r} = {wrap}({out})")
        return lines


def _make(
    members: list[Node], comps: dict, leaving: list[Value], reduction: Node | None = None
) -> Node | None:
    """The fused node of ``members``, ending in ``reduction`` if given; None where the
    group cannot take it (not flat, or parallel: Note [Fused reductions])."""
    inputs: list[Value] = []
    steps = []
    index = {}
    for j, node in enumerate(members):
        operands = []
        for a in node.args:
            if isinstance(a, Value) and a in index:
                operands.append(("step", index[a]))
            elif isinstance(a, Value):
                if a not in inputs:
                    inputs.append(a)
                operands.append(("input", inputs.index(a)))
            else:
                operands.append(("number", a))
        r = node.results[0]
        index[r] = j
        steps.append(fused.Step(node.name, tuple(operands), comps[node], r.dtype))
    shape = members[-1].results[0].shape
    scalars = tuple(k for k, v in enumerate(inputs) if math.prod(v.shape) == 1 != math.prod(shape))
    flat = all(
        k in scalars or (v.shape == shape and v.strides == layouts.contiguous(shape))
        for k, v in enumerate(inputs)
    )
    if reduction is not None and (not flat or math.prod(shape) >= threads.parallel_threshold()):
        return None
    result = None if reduction is None else reduction.results[0]
    group = fused.Group(
        tuple(v.dtype for v in inputs),
        tuple(steps),
        () if reduction else tuple(index[v] for v in leaving),
        len(shape),
        flat,
        scalars if flat else (),
        () if reduction is None else (reduction.name, result.dtype),
    )
    names = [n.name for n in members]
    if reduction is None:
        target = FusedCall(group, shape, names)
    else:
        inner = _row_length(shape, reduction.args[1])
        target = FusedCall(group, shape, [*names, reduction.name], result.shape, inner)
        leaving = [result]
    node = Node(target, tuple(inputs), line=(reduction or members[-1]).line, several=True)
    node.results = leaving
    for v in leaving:
        v.node = node
    return node


def _reduction_of(
    group: list[Node], leaving: list[Value], users: dict, returned: set
) -> Node | None:
    """The reduction a group's loop can end in (Note [Fused reductions]): the one user
    of its last value, when that is the only value leaving it (and not returned), a
    sum (of float32), max or min (of float32 or float64) over all axes or the last one
    that needs no gradient; a max or min of rows of no elements raises in its kernel."""
    last = group[-1].results[0]
    readers = users.get(last, ())
    if leaving != [last] or len(readers) != 1 or last in returned:
        return None
    node = readers[0]
    if not isinstance(node.target, Operator) or node.name not in fused.REDUCTIONS:
        return None
    axis, result = node.args[1], node.results[0]
    if node.args[0] is not last or result.requires_grad or len(node.results) != 1:
        return None
    inner = _row_length(last.shape, axis)
    if inner is None:
        return None
    if node.name == "sum":
        dtypes_fit = last.dtype == D.float32 == result.dtype and node.args[2] is None
    else:
        dtypes_fit = last.dtype in (D.float32, D.float64) and inner > 0
    return node if dtypes_fit else None


def _row_length(shape: tuple, axis: Any) -> int | None:
    """The length of the rows a reduction over ``axis`` folds, when they are the last
    axis or all of them; None otherwise."""
    if axis is None or tuple(axis) == tuple(range(len(shape))):
        return math.prod(shape)
    return shape[-1] if tuple(axis) == (len(shape) - 1,) else None


# Note [Pointwise backward operators]: the nn operators that are elementwise in all but
# their namespace (layouts.ELEMENTWISE_LIKE: tanh's and sigmoid's gradients) are one
# kernel each in eager, where their formulas were three elementwise calls. In a graph
# their decompositions -- those formulas -- take their place, so that a fusion group
# sees through them and they join the calls around them.
def _inline(graph: Graph) -> Graph:
    at: dict[Node, tuple[list[Node], dict]] = {}
    for node in graph.nodes:
        if isinstance(node.target, Operator) and node.target.name in layouts.ELEMENTWISE_LIKE:
            decomposition = decompositions.DECOMPOSITIONS[node.target.name]
            grad = node.results[0].requires_grad
            nodes, value = record_calls(
                graph, lambda *a: decomposition(0, *a), *node.args, grad=grad
            )
            if all(_computation(n) is not None for n in nodes):
                for n in nodes:
                    n.line = node.line
                at[node] = (nodes, {node.results[0]: value})
    return splice(graph, at, set())


def run(graph: Graph) -> Graph:
    graph = _inline(graph)
    comps = {n: c for n in graph.nodes if (c := _computation(n)) is not None}
    position = {n: i for i, n in enumerate(graph.nodes)}
    group_of: dict[Value, list[Node]] = {}  # a value of an open group -> the group
    groups: list[list[Node]] = []
    for node in graph.nodes:
        if node in comps:
            shape = node.results[0].shape
            # the open groups of this shape it reads from merge into one (each is open:
            # nothing outside it has read its values yet); others it reads from close
            joined: list[Node] | None = None
            for v in node.inputs():
                group = group_of.get(v)
                if group is None or group is joined:
                    continue
                if group[-1].results[0].shape != shape:
                    _close(group_of, group)
                elif joined is None:
                    joined = group
                else:
                    joined += group
                    joined.sort(key=position.__getitem__)
                    for n in group:
                        group_of[n.results[0]] = joined
                    group.clear()  # merged: no longer a group of its own
            if joined is None:
                joined = []
                groups.append(joined)
            joined.append(node)
            group_of[node.results[0]] = joined
        elif node.writes():  # a write closes every group: none may move past it
            group_of.clear()
        else:
            for v in node.inputs():
                if v in group_of:
                    _close(group_of, group_of[v])
    writes = [position[n] for n in graph.nodes if n.writes()]
    returned = set(graph.output_values())
    users = graph.users()
    replaced: dict[Node, Node | None] = {}
    for group in groups:
        if not group:
            continue
        inside = set(group)
        leaving = [
            n.results[0]
            for n in group
            if n.results[0] in returned or any(u not in inside for u in users.get(n.results[0], ()))
        ]
        reduction = _reduction_of(group, leaving, users, returned)
        if reduction and any(position[group[-1]] < w < position[reduction] for w in writes):
            reduction = None  # the group would move past the write
        fused_node = reduction and _make(group, comps, leaving, reduction)
        if fused_node:  # in the reduction's place: it comes after the whole group
            replaced.update(dict.fromkeys(group))
            replaced[reduction] = fused_node
        elif len(group) >= 2:
            replaced.update(dict.fromkeys(group[:-1]))
            replaced[group[-1]] = _make(group, comps, leaving)
    graph.nodes = [replaced.get(n, n) for n in graph.nodes if replaced.get(n, n) is not None]
    return graph


def _close(group_of: dict, group: list) -> None:
    for n in group:
        group_of.pop(n.results[0], None)
