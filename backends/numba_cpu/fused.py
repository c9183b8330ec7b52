"""Fused elementwise kernels: one generated Numba loop for a group of elementwise
operators, so that a chain like ``exp(a * b + c) - d`` reads each input once and
writes each result once, instead of making a temporary per operator.

Note [Fused kernels]: a graph pass (lamina.jit's fusion) describes a group as a
``Group``: the dtype of each tensor input, and steps in order, each an elementwise
operator applied to inputs, earlier steps and Python numbers. Every step computes as
the operator's own kernel does -- its operands converted to the operator's computation
dtype (``in_dtypes``), its scalar function (``ELEMENTWISE_SCALARS``), the result
converted to the operator's result dtype -- so a fused result equals the unfused one
bit for bit. The loop runs over the group's shape: flat when every tensor input has that
shape and is C-contiguous (or has one element), else over each axis with the inputs
broadcast to the shape; parallel (``prange``) from the parallel threshold on. The
source is a pure function of the group (``Group.key``), written once to a file of the
loop cache's directory whose Numba cache makes later processes load, not compile, it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lamina.backends import jit, loop_cache
from lamina.backends import setup as S
from lamina.dispatch import dtypes as D

from .elementwise import BY_NAME


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

    def key(self) -> str:
        text = repr((self.inputs, self.steps, self.outputs, self.ndim, self.flat, self.scalars))
        return hashlib.sha256(text.encode()).hexdigest()[:20]


def can_fuse(op: Any, comp: D.DType, operands: list) -> bool:
    """Whether an elementwise call of ``op`` computing in ``comp`` (``operands``: what
    the dtype rules read, tensors' stand-ins and numbers) has a loop body a group can
    use: an operator with a scalar function, no value checks for ``comp`` (integer
    powers refuse negative exponents), and not a comparison the CPU kernel gives to
    NumPy (Note [Mixed-sign comparisons])."""
    ew = BY_NAME.get(op.name)
    if ew is None or comp.kind in ew.validate_kinds:
        return False
    return not S.mixed_sign_comparison(op, operands)


def _ctor(dtype: D.DType) -> str:
    return f"np.{dtype.np.name}" if dtype.kind != "b" else "np.bool_"


def source(group: Group, name: str, parallel: bool, c_loop: bool = False) -> str:
    """The Python source of the group's kernel ``name(a0, ..., o0, ...)``; with
    ``c_loop``, of its C loop ``name(pointers, n)`` (a flat, serial group: Note [Fused
    loops] in lamina.dispatch.reference), which views the pointers as the same arrays."""
    ins = [f"a{k}" for k in range(len(group.inputs))]
    outs = [f"o{m}" for m in range(len(group.outputs))]
    lines = [f"def {name}({'p, n' if c_loop else ', '.join(ins + outs)}):"]
    if c_loop:
        dtypes = [*group.inputs, *(group.steps[j].result for j in group.outputs)]
        for k, (array, dtype) in enumerate(zip(ins + outs, dtypes)):
            size = "1" if k in group.scalars else "n"
            lines.append(f"    {array} = carray(p[{k}], ({size},), {_ctor(dtype)})")
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
    pad = "    " * depth
    for j, step in enumerate(group.steps):
        args = []
        for (kind, what), dtype in zip(step.operands, BY_NAME[step.op].in_dtypes(step.comp)):
            at = "[0]" if kind == "input" and what in group.scalars else index
            expr = {"input": f"a{what}{at}", "step": f"s{what}", "number": repr(what)}[kind]
            args.append(f"{_ctor(dtype)}({expr})")
        lines.append(f"{pad}s{j} = {_ctor(step.result)}(F{j}({', '.join(args)}))")
    for m, j in enumerate(group.outputs):
        lines.append(f"{pad}o{m}{index} = s{j}")
    return "\n".join(lines) + "\n"


def _module_text(group: Group, name: str, parallel: bool, c_loop: bool = False) -> str:
    imports = ["import numpy as np"] + (["from numba import prange"] if parallel else [])
    imports += ["from numba import carray"] if c_loop else []
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
        entry = _entries[key] = jit.compile_kernel(pyfunc, jit.types.void(*types), parallel)
    return entry


_entries: dict = {}  # (Group.key(), parallel) -> entry point


def loop_address(group: Group) -> int:
    """The C address of a flat group's serial loop (Note [Fused loops] in
    lamina.dispatch.reference), from the loop cache (no Numba in a process that finds
    it there: Note [Loop cache]) or compiled on first use."""
    assert group.flat, "only a flat group has a C loop"
    name = f"fused_{group.key()}_loop"

    def build(cache: bool) -> Any:
        pyfunc = getattr(_load_module(_module_text(group, name, False, True), name), name)
        signature = jit.types.void(jit.types.CPointer(jit.types.voidptr), jit.types.int64)
        return jit.compile_cfunc(pyfunc, signature, cache)

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
