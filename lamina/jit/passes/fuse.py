"""Elementwise fusion: maximal groups of elementwise calls of one shape become one
generated loop (Note [Fused kernels] in lamina.backends.numba_cpu.fused), so a chain
reads its inputs once and writes only the values that leave it.

Note [Fusion groups]: the pass walks the nodes in order. An elementwise call the CPU's
fused loops can compute (``fused.can_fuse``), whose result is a new C-contiguous tensor
that needs no gradient, joins the open group of one of its inputs' producers when it has
that group's shape (the open groups of that shape it reads from merge into one); else
it opens a group. A group closes when a call outside it uses one of its values: the
fused call takes the place of the group's last member, so a value read in between would
not exist yet. A group of one call stays that call. The values a group returns are
those used after it or returned by the graph; the others live only in registers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from lamina.backends import threads
from lamina.backends.numba_cpu import fused
from lamina.dispatch import core, layouts, meta
from lamina.dispatch import dtypes as D
from lamina.dispatch.schema import Operator
from lamina.dispatch.tensor import from_array, from_flat

from ..executor import NUMBERS
from ..graph import Graph, Node, Value


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
    """The target of a fused node: the group's loop, compiled when the plan is made
    (the guards fix every input's dtype and layout) and called inline by the plan
    (``emit``). A flat group below the parallel threshold is one call of its C loop
    (Note [Fused loops] in lamina.dispatch.reference); another is its outputs
    allocated, its Numba kernel, its outputs wrapped as tensors. ``code`` is the
    compiled loop (an address, or the kernel), which groups of other sizes share."""

    def __init__(self, group: fused.Group, shape: tuple, ops: list[str]) -> None:
        self.group, self.shape, self.ops = group, shape, ops
        self.name = "fused[" + ", ".join(ops) + "]"
        self.size = math.prod(shape)
        parallel = self.size >= threads.parallel_threshold()
        self.c_loop = group.flat and not parallel
        if self.c_loop:
            inputs = tuple(
                (d, 1 if k in group.scalars else self.size) for k, d in enumerate(group.inputs)
            )
            outputs = tuple(group.steps[j].result for j in group.outputs)
            self.code = fused.loop_address(group)
            self.entry = core.FusedLoop(self.code, shape, inputs, outputs)
        else:
            self.code = self.entry = fused.compile_group(group, parallel)

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


def _make(members: list[Node], comps: dict, leaving: list[Value]) -> Node:
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
    group = fused.Group(
        tuple(v.dtype for v in inputs),
        tuple(steps),
        tuple(index[v] for v in leaving),
        len(shape),
        flat,
        scalars if flat else (),
    )
    target = FusedCall(group, shape, [n.name for n in members])
    node = Node(target, tuple(inputs), line=members[-1].line, several=True)
    node.results = leaving
    for v in leaving:
        v.node = node
    return node


def run(graph: Graph) -> Graph:
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
        else:
            for v in node.inputs():
                if v in group_of:
                    _close(group_of, group_of[v])
    returned = set(graph.output_values())
    users = graph.users()
    replaced: dict[Node, Node | None] = {}
    for group in groups:
        if len(group) < 2:
            continue
        inside = set(group)
        leaving = [
            n.results[0]
            for n in group
            if n.results[0] in returned or any(u not in inside for u in users.get(n.results[0], ()))
        ]
        fused_node = _make(group, comps, leaving)
        for n in group[:-1]:
            replaced[n] = None
        replaced[group[-1]] = fused_node
    graph.nodes = [replaced.get(n, n) for n in graph.nodes if replaced.get(n, n) is not None]
    return graph


def _close(group_of: dict, group: list) -> None:
    for n in group:
        group_of.pop(n.results[0], None)
