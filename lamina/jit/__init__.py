"""lamina.jit: capture a function or a Module as a graph of operators, optimize it, and
run it without per-operator dispatch (the README's "Compile" section; the Notes of
tracer.py, compiler.py, executor.py and passes/ say how)."""

from .compiler import (
    CompiledFunction,
    Explanation,
    RecompileWarning,
    SideEffectError,
    compile,
    explain,
    trace,
)
from .graph import Graph, GraphError, Node, Value
from .passes import DEFAULT as DEFAULT_PASSES
from .passes import PASSES
from .tracer import GraphBreak

__all__ = [
    "DEFAULT_PASSES",
    "PASSES",
    "CompiledFunction",
    "Explanation",
    "Graph",
    "GraphBreak",
    "GraphError",
    "Node",
    "RecompileWarning",
    "SideEffectError",
    "Value",
    "compile",
    "explain",
    "trace",
]
