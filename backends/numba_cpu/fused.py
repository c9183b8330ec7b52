"""Fused elementwise kernels: one generated Numba loop for a group of elementwise
operators, so that a chain like ``exp(a * b + c) - d`` reads each input once and
writes each result once, instead of making a temporary per operator.

Note [Fused kernels]: a graph pass (lamina.jit's fusion) describes a group as a
``Group``: the dtype of each tensor input, and steps in order, each an elementwise
operator applied to inputs, earlier steps and Python numbers. Every step computes as
the operator's own kernel does -- its operands converted to the operator's computation
dtype (``in_dtypes``), its scalar function (``ELEMENTWISE_SCALARS``), the result
converted to the operator's result dtype -- so a fused result equals the unfused one
bit for bit where eager runs the operator's own loop. Where eager hands a transcendental
function to NumPy's SIMD loop instead (tanh, sin and the others of Note [NumPy SIMD
loops] in elementwise.py, for float32 and float64), the two differ by at most the ulps
of Note [Vector math].
The loop runs over the group's shape: flat when every tensor input has that shape and
is C-contiguous (or has one element), else over each axis with the inputs broadcast to
the shape; parallel (``prange``) from the parallel threshold on. The source is a pure
function of the group (``Group.key``), written once to a file of the loop cache's
directory: a flat serial loop is a C function the loop cache keeps (Note [Fused loops]
in lamina.dispatch.reference), any other a kernel whose Numba cache makes later
processes load, not compile, it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lamina.backends import jit, loop_cache
from lamina.backends import setup as S
from lamina.dispatch import dtypes as D

from .elementwise import BY_NAME
from .kernels import vector_width


@dataclass(frozen=True)
class Step:
    """One operator of a group: ``operands`` are ("input", k), ("step", j) or
    ("number", value)."""

    op: str
    operands: tuple
    comp: D.DType  # the computation dtype
    result: D.DType


@dataclass(frozen=True)
class Group:
    inputs: tuple  # the DType of each tensor input
    steps: tuple  # Steps
    outputs: tuple  # indices of the steps whose results leave the group
    ndim: int
    flat: bool
    scalars: tuple = ()  # inputs of one element, read at index 0 (flat groups)
    # Note [Fused reductions]: ("sum" / "max" / "min", the result's DType) folding the
    # last step's values row by row into the one output; () for none
    reduction: tuple = ()

    def key(self) -> str:
        text = repr(
            (self.inputs, self.steps, self.outputs, self.ndim, self.flat, self.scalars)
            + ((self.reduction,) if self.reduction else ())
        )
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def output_dtypes(self) -> tuple:
        if self.reduction:
            return (self.reduction[1],)
        return tuple(self.steps[j].result for j in self.outputs)


# Note [Fused reductions]: a flat, serial group whose last value only a sum, max or min
# over all axes or the last one reads ends in that reduction: its loop (the C loop of
# Note [Fused loops], called with (rows, row length)) folds each row's values as it
# computes them, so they are never stored. A fold steps as the reduction kernel's does
# (Note [Vector reductions]): max and min with fold_max and fold_min, starting from the
# row's first value; a float32 sum in float64 from 0, rounded once, with an add that
# may be reassociated (``sum_step``: only its own instructions, so the group's steps
# keep their rounding and the fold still vectorizes). max and min are exact in any
# order; a float32 sum accumulated in float64 in another order than the kernel's differs
# only where float64 rounding crosses a float32 rounding boundary, so other sums
# (float64, integers) are left to their kernel.
REDUCTIONS = {"sum": ("sum_step", "np.float64(0.0)"), "max": ("fold_max", None)}
REDUCTIONS["min"] = ("fold_min", None)


@jit.jitable(fastmath=jit.REASSOCIATE)
def sum_step(acc, x):
    """A fused sum's step (Note [Fused reductions])."""
    return acc + x


def can_fuse(op: Any, comp: D.DType, operands: list) -> bool:
    """Whether an elementwise call of ``op`` computing in ``comp`` (``operands``: what
    the dtype rules read, tensors' stand-ins and numbers) has a loop body a group can
    use: an operator with a scalar function, no value checks for ``comp`` (integer
    powers refuse negative exponents), no integer beyond 64 bits, and not a comparison
    the CPU kernel gives to NumPy (Note [Mixed-sign comparisons])."""
    ew = BY_NAME.get(op.name)
    if ew is None or comp.kind in ew.validate_kinds:
        return False
    if any(type(a) is int and not -(2**63) <= a < 2**63 for a in operands):
        return False  # no int64 literal holds it: the kernel converts it
    return not S.mixed_sign_comparison(op, operands)


def _ctor(dtype: D.DType) -> str:
    return f"np.{dtype.np.name}" if dtype.kind != "b" else "np.bool_"


def source(group: Group, name: str, parallel: bool, c_loop: bool = False) -> str:
    """The Python source of the group's kernel ``name(a0, ..., o0, ...)``; with
    ``c_loop``, of its C loop ``name(pointers, rows, inner)`` (a flat, serial group:
    Note [Fused loops] in lamina.dispatch.reference), which views the pointers as the
    same arrays of ``rows * inner`` elements (``rows`` for a reduction's output)."""
    ins = [f"a{k}" for k in range(len(group.inputs))]
    outs = [f"o{m}" for m in range(len(group.output_dtypes()))]
    lines = [f"def {name}({'p, rows, inner' if c_loop else ', '.join(ins + outs)}):"]
    if c_loop:
        lines.append("    n = rows * inner")
        dtypes = group.inputs + group.output_dtypes()
        for k, (array, dtype) in enumerate(zip(ins + outs, dtypes)):
            size = "1" if k in group.scalars else "n"
            size = "rows" if group.reduction and k >= len(ins) else size
            lines.append(f"    {array} = carray(p[{k}], ({size},), {_ctor(dtype)})")
    if group.reduction:
        return "\n".join(lines + _reduction(group)) + "\n"
    outer = "prange" if parallel else "range"
    if group.flat:
        lines.append(f"    for i in {outer}(o0.size):")
        index, depth = "[i]", 2
    elif group.ndim == 0:
        index, depth = "[()]", 1
    else:
        for d in range(group.ndim):
            lines.append(
                f"{'    ' * (d + 1)}for i{d} in {outer if d == 0 else 'range'}(o0.shape[{d}]):"
            )
        index, depth = "[" + ", ".join(f"i{d}" for d in range(group.ndim)) + "]", group.ndim + 1
    lines += _steps(group, index, "    " * depth)
    for m, j in enumerate(group.outputs):
        lines.append(f"{'    ' * depth}o{m}{index} = s{j}")
    return "\n".join(lines) + "\n"


def _steps(group: Group, index: str, pad: str) -> list[str]:
    """The lines computing each step's value ``s{j}`` at ``index``."""
    lines = []
    for j, step in enumerate(group.steps):
        args = []
        for (kind, what), dtype in zip(step.operands, BY_NAME[step.op].in_dtypes(step.comp)):
            at = "[0]" if kind == "input" and what in group.scalars else index
            expr = {"input": f"a{what}{at}", "step": f"s{what}", "number": _literal(what)}[kind]
            args.append(f"{_ctor(dtype)}({expr})")
        lines.append(f"{pad}s{j} = {_ctor(step.result)}(F{j}({', '.join(args)}))")
    return lines


def _literal(number: Any) -> str:
    """A Python number as source: NumPy's names for the infinities and NaN."""
    if isinstance(number, float) and not math.isfinite(number):
        return "np.nan" if number != number else ("np.inf" if number > 0 else "-np.inf")
    return repr(number)


def _reduction(group: Group) -> list[str]:
    """A reduction group's loop over rows (Note [Fused reductions])."""
    step, start = REDUCTIONS[group.reduction[0]]
    last = f"s{len(group.steps) - 1}"
    accumulate = f"acc = {step}(acc, np.float64({last}))" if start else f"acc = {step}(acc, {last})"
    lines = ["    for r in range(rows):"]
    if start:
        lines.append(f"        acc = {start}")
    else:  # the row's first value (max and min have no identity; the row is not empty)
        lines += _steps(group, "[r * inner]", "        ")
        lines.append(f"        acc = {last}")
    lines.append("        for j in range(inner):")
    lines += _steps(group, "[r * inner + j]", "            ")
    lines.append(f"            {accumulate}")
    lines.append(f"        o0[r] = {_ctor(group.reduction[1])}(acc)")
    return lines


def _module_text(group: Group, name: str, parallel: bool, c_loop: bool = False) -> str:
    imports = ["import numpy as np"] + (["from numba import prange"] if parallel else [])
    imports += ["from numba import carray"] if c_loop else []
    if group.reduction:
        step = REDUCTIONS[group.reduction[0]][0]
        where = __name__ if step == "sum_step" else "lamina.backends.numba_cpu.kernels"
        imports.append(f"from {where} import {step}")
    for j, step in enumerate(group.steps):
        fn = BY_NAME[step.op].scalar_fn(step.comp)
        imports.append(f"from {fn.__module__} import {fn.__name__} as F{j}")
    doc = '"""A fused elementwise kernel lamina generated (Note [Fused kernels])."""'
    return "\n".join([doc, *imports, "", ""]) + source(group, name, parallel, c_loop)


def compile_group(group: Group, parallel: bool) -> Callable:
    """The entry point of ``group``'s loop (serial, or parallel over its outer axis),
    for C-contiguous inputs and outputs (strided ones, of layout "A", where the group
    is not flat), compiled once per process (Numba's cache across processes)."""
    key = (group.key(), parallel)
    entry = _entries.get(key)
    if entry is None:
        name = f"fused_{group.key()}_{'parallel' if parallel else 'serial'}"
        pyfunc = getattr(_load_module(_module_text(group, name, parallel), name), name)
        ndim, layout = (1, "C") if group.flat else (group.ndim, "A")
        types = [jit.array(d.np, ndim, layout) for d in group.inputs]
        types += [jit.array(group.steps[j].result.np, ndim, "C") for j in group.outputs]
        signature, width = jit.types.void(*types), _vector_width(group)
        entry = _entries[key] = jit.compile_kernel(pyfunc, signature, parallel, vector_width=width)
    return entry


def _vector_width(group: Group) -> int | None:
    """512 bits where a step runs the vector math (Note [Vector width] in
    lamina.backends.jit): the loop's time is in that step, as in eager's loop."""
    widths = [vector_width(BY_NAME[step.op].scalar_fn(step.comp)) for step in group.steps]
    return max((w for w in widths if w is not None), default=None)


_entries: dict = {}  # (Group.key(), parallel) -> entry point


def loop_address(group: Group) -> int:
    """The C address of a flat group's serial loop (Note [Fused loops] in
    lamina.dispatch.reference), from the loop cache (no Numba in a process that finds
    it there: Note [Loop cache]) or compiled on first use."""
    assert group.flat, "only a flat group has a C loop"
    name = f"fused_{group.key()}_loop"

    def build(cache: bool) -> Any:
        pyfunc = getattr(_load_module(_module_text(group, name, False, True), name), name)
        types = jit.types
        signature = types.void(types.CPointer(types.voidptr), types.int64, types.int64)
        return jit.compile_cfunc(pyfunc, signature, cache, vector_width=_vector_width(group))

    return jit.c_loop(("fused", group.key()), build)


def _load_module(text: str, name: str):
    """Import generated source ``text`` as module ``name`` from a file in the loop
    cache's directory (where Numba caches its kernels: Note [Numba's cache files]), or,
    with the cache off, from a temporary file whose kernels Numba does not cache."""
    directory = loop_cache.directory()
    if directory is None:
        import tempfile

        directory = tempfile.mkdtemp(prefix="lamina-fused-")
    path = directory if isinstance(directory, str) else str(directory / "fused")
    os.makedirs(path, exist_ok=True)
    file = os.path.join(path, name + ".py")
    try:
        with open(file) as f:
            same = f.read() == text
    except OSError:
        same = False
    if not same:  # written under another name and renamed: readers see all of it or none
        temporary = f"{file}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:
            f.write(text)
        os.replace(temporary, file)
    spec = importlib.util.spec_from_file_location(f"lamina_fused.{name}", file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
