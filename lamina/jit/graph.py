"""The graph a trace records: a flat SSA list of operator calls (torch.fx's Graph, JAX's
jaxpr), printable and checkable.

Note [Graph values]: a ``Value`` is one tensor of the program: an input of the graph (a
tensor argument of the traced function, a parameter of a Module, or a tensor the
function read from elsewhere: a constant, read at each call, never copied), or one
result of a node. Each carries the dtype, shape and strides its description gave
(Note [Result rules]), so a pass can plan on them without running anything. A node's
``args`` are its operator's canonical arguments (as the kernels get them: positional,
checked) with Values in place of tensors; everything else in them (Python numbers,
shapes, dtypes, devices, a generator or None) is taken as is at each call, so a random
operator reads its generator's state when it runs: a compiled graph never freezes a
random draw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lamina.dispatch import dtypes as D
from lamina.dispatch import layouts

INPUT, PARAMETER, CONSTANT = "input", "parameter", "constant"  # kinds of graph inputs


@dataclass(eq=False)
class Value:
    """One tensor of the graph (Note [Graph values])."""

    name: str
    dtype: D.DType
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    device: str = "cpu"
    kind: str | None = None  # INPUT, PARAMETER or CONSTANT for an input; None: a result
    node: Node | None = None  # the node that made it
    source: Any = None  # a constant's or a parameter's tensor
    requires_grad: bool = False

    def type_str(self) -> str:
        shape = ", ".join(map(str, self.shape))
        layout = ""
        if tuple(self.strides) != layouts.contiguous(self.shape):
            layout = "{" + ",".join(map(str, self.strides)) + "}"
        device = "" if self.device == "cpu" else f" @{self.device}"
        return f"{self.dtype.name}[{shape}]{layout}{device}"

    def __repr__(self) -> str:
        return self.name


@dataclass(eq=False)
class Node:
    """One call: ``target`` (an operator, or a kernel a pass made: anything with a
    ``name``) applied to ``args``; ``results`` are its tensors, ``line`` the user's
    source line that made the call."""

    target: Any
    args: tuple
    results: list[Value] = field(default_factory=list)
    line: str = ""
    several: bool = False  # the target returns a tuple (even of one)

    @property
    def name(self) -> str:
        return self.target.name

    def inputs(self) -> Iterator[Value]:
        """The Values among the arguments, in order, nested sequences included."""
        yield from values_in(self.args)

    def writes(self) -> list[Value]:
        """The Values among the arguments this call writes (Note [Mutation]; a random
        generator is not a Value, and may be left out of a traced call)."""
        written = getattr(self.target, "writes", ())
        if "inplace" in getattr(self.target, "tags", ()):
            written = (self.target.params[0].name, *written)
        names = [p.name for p in getattr(self.target, "params", ())]
        places = dict.fromkeys(map(names.index, written))  # in-place ops name arg 0 twice
        args = [self.args[i] for i in places if i < len(self.args)]
        return [a for a in args if isinstance(a, Value)]

    @property
    def impure(self) -> bool:
        """Whether dropping, merging or reordering the call could change the program:
        it writes an argument (a tensor, or a random generator: Note [Mutation]) or
        makes uninitialized memory (``empty``: two calls are two tensors)."""
        target = self.target
        return (
            bool(getattr(target, "writes", ()))
            or "inplace" in getattr(target, "tags", ())
            or self.name == "empty"
        )


def values_in(args: Any) -> Iterator[Value]:
    for a in args.values() if isinstance(args, dict) else args:
        if isinstance(a, Value):
            yield a
        elif isinstance(a, (tuple, list, dict)):
            yield from values_in(a)


def map_values(args: Any, fn: Callable[[Value], Any]) -> Any:
    """``args`` with each Value replaced by ``fn(value)``; sequences keep their type."""
    if isinstance(args, Value):
        return fn(args)
    if isinstance(args, (tuple, list)):
        items = [map_values(a, fn) for a in args]
        return type(args)(*items) if hasattr(args, "_fields") else type(args)(items)
    if isinstance(args, dict):
        return {k: map_values(v, fn) for k, v in args.items()}
    return args


class GraphError(ValueError):
    """A graph that breaks an invariant ``Graph.lint`` checks."""


class Graph:
    """Inputs, nodes in execution order, and outputs (a structure of Values and Python
    values, as the traced function returned them)."""

    def __init__(self) -> None:
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self.outputs: Any = None
        self._count = 0
        self.symbols = 0  # how many symbolic sizes its shapes use (Note [Symbolic sizes])

    def new_value(self, like: Any, kind: str | None = None, name: str | None = None) -> Value:
        """A Value of ``like``'s dtype, shape and strides (a tensor or a Description)."""
        if name is None:
            name, self._count = f"%{self._count}", self._count + 1
        strides = like.strides if hasattr(like, "key") else layouts.strides_of(like)
        shape = tuple(like.shape)
        device = "cpu"  # the device the graph runs on (traced on meta twins)
        value = Value(name, like.dtype, shape, tuple(strides), device, kind)
        value.requires_grad = bool(getattr(like, "requires_grad", False))
        if kind is not None:
            self.inputs.append(value)
        return value

    def output_values(self) -> list[Value]:
        return list(values_in([self.outputs]))

    def users(self) -> dict[Value, list[Node]]:
        found: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for v in node.inputs():
                found.setdefault(v, []).append(node)
        return found

    # ------------------------------------------------------------ printing

    def __str__(self) -> str:
        # tensors passed in (inputs, a backward's gradients and saved values) in the
        # header; parameters and constants, read from their tensors, below it
        passed = [v for v in self.inputs if v.kind in (INPUT, None)]
        ins = ", ".join(f"{v.name}: {v.type_str()}" for v in passed)
        lines = [f"graph({ins}):"]
        for v in self.inputs:
            if v.kind not in (INPUT, None):
                lines.append(f"  {v.name}: {v.type_str()} = {v.kind}")
        for node in self.nodes:
            lines.append("  " + format_node(node))
        lines.append(f"  return {_format_arg(self.outputs)}")
        return "\n".join(lines)

    def print(self) -> None:
        print(self)

    # ------------------------------------------------------------ checks

    def lint(self) -> None:
        """Check the invariants every pass keeps (GraphError names the first broken):
        each Value defined once, before its uses, by the node it names; no node without
        results unless it writes an argument; every output defined."""
        defined = set(self.inputs)
        if len(defined) != len(self.inputs):
            raise GraphError("an input is listed twice")
        for i, node in enumerate(self.nodes):
            for v in node.inputs():
                if v not in defined:
                    raise GraphError(
                        f"node {i} ({format_node(node)}) uses {v.name} before it is defined"
                    )
            for r in node.results:
                if r in defined:
                    raise GraphError(f"node {i} ({format_node(node)}) redefines {r.name}")
                if r.node is not node:
                    raise GraphError(f"{r.name} names another node than the one defining it")
                defined.add(r)
            if not node.results and not node.impure:
                raise GraphError(f"node {i} ({format_node(node)}) has no result and no effect")
        for v in self.output_values():
            if v not in defined:
                raise GraphError(f"output {v.name} is not defined")


def _format_arg(a: Any) -> str:
    if isinstance(a, Value):
        return a.name
    if isinstance(a, tuple):
        inner = ", ".join(map(_format_arg, a))
        return f"({inner},)" if len(a) == 1 else f"({inner})"
    if isinstance(a, list):
        return "[" + ", ".join(map(_format_arg, a)) + "]"
    if isinstance(a, D.DType):
        return a.name
    if a is not None and type(a).__name__ == "Generator":
        return "generator"
    return repr(a)


def format_node(node: Node) -> str:
    args = ", ".join(_format_arg(a) for a in node.args)
    call = f"{node.name}({args})"
    if not node.results:
        return call
    lhs = ", ".join(f"{r.name}: {r.type_str()}" for r in node.results)
    return f"{lhs} = {call}"
