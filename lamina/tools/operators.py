"""``python -m lamina.tools.operators``: the operator reference, docs/operators.md,
and the type stub of the generated public functions, dispatch/ops.pyi.

Both are generated from the operator schema (dispatch/operators.py);
``tests/test_architecture.py`` checks that the committed files are what this renders,
so they cannot drift. Run with ``--write`` to update them.
"""

from __future__ import annotations

import argparse
import inspect
import pathlib

from lamina.dispatch import arguments, decompositions, schema

HEADER = """\
# Operators

Every operator of lamina, generated from its entry in `dispatch/operators.py` (the
schema, Note [Operator schema]) by `python -m lamina.tools.operators --write`; a test
checks that this file is fresh. A plugin registers kernels against these names
(docs/backends.md); the public function of an operator has the signature shown, and
its kernels receive the arguments as the calling convention of its category says.
"""


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\\\|")

    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return lines


def _public_name(op: schema.Operator) -> str:
    if op.namespace is None:
        return "(internal)"
    return f"lamina.{op.namespace + '.' if op.namespace else ''}{op.name}"


def render() -> str:
    ops = [op for op in schema.OPERATORS.values() if op.inplace_of is None]
    lines = [HEADER, "## Argument kinds", ""]
    lines += _table(("kind", "accepts"), sorted(arguments.DESCRIPTIONS.items()))
    lines += ["", "## Calling conventions", ""]
    lines += _table(("category", "kernels are called as"), list(schema.CONVENTIONS.items()))
    lines += ["", "## Dtype rules", ""]
    lines += _table(("inputs", "accepts"), list(schema.DTYPE_RULES.items()))
    lines += [""]
    lines += _table(("result", "dtype"), list(schema.RESULT_RULES.items()))
    inplace = sorted(op.inplace.name for op in ops if op.inplace is not None)
    lines += ["", f"In-place variants (`x1 op= x2`, same signature): {', '.join(inplace)}.", ""]
    for category in schema.CONVENTIONS:
        members = [op for op in ops if op.category == category]
        if not members:
            continue
        lines += [f"## {category} ({len(members)})", ""]
        rows = []
        for op in members:
            extras = sorted(op.tags) + ([f"`__{op.dunder}__`"] if op.dunder else [])
            if op.numpy:
                extras.append(f"NumPy `{op.numpy}`")
            rows.append(
                (
                    f"`{op.name}{op.signature_text}`",
                    _public_name(op),
                    f"{op.dtypes} → {op.result}",
                    ", ".join(extras),
                    op.doc,
                )
            )
        lines += _table(("signature", "public as", "dtypes → result", "tags", "what"), rows)
        lines.append("")
    return "\n".join(lines)


# What each argument kind is to a type checker (dispatch/arguments.py's kinds)
STUB_TYPES = {
    "Tensor": "Tensor",
    "TensorOrScalar": "Tensor | bool | int | float | complex",
    "Tensors": "Sequence[Tensor]",
    "int": "int",
    "float": "float",
    "bool": "bool",
    "Axis": "int",
    "NewAxis": "int",
    "Axes": "int | tuple[int, ...] | None",
    "OneAxisOrAll": "int | None",
    "Shape": "int | Sequence[int]",
    "DType": "DTypeLike",
    "Device": "str | Device",
    "Any": "Any",
}
STUB_HEADER = """\
# Generated from dispatch/operators.py by `python -m lamina.tools.operators --write`;
# tests/test_architecture.py checks that it is fresh. The functions below are made at
# import time from the operator schema (dispatch/bindings.py); this stub tells type
# checkers their signatures. The composite functions are typed in composites.py.
from collections.abc import Sequence
from typing import Any

from .arguments import AxisError as AxisError
from .composites import *
from .devices import Device
from .dtypes import DType
from .tensor import Tensor

DTypeLike = DType | str | type | Any
"""


def _stub_param(p: schema.Param) -> str:
    kind = STUB_TYPES[p.type] + (" | None" if p.annotation.endswith("| None") else "")
    return f"{p.name}: {kind}" + ("" if p.default is inspect.Parameter.empty else " = ...")


def render_stub() -> str:
    lines = [STUB_HEADER]
    for op in schema.OPERATORS.values():
        if op.namespace != "":
            continue
        params, seen_kwonly = [], False
        for i, p in enumerate(op.params):
            if p.kind == inspect.Parameter.KEYWORD_ONLY and not seen_kwonly:
                params.append("*")
                seen_kwonly = True
            params.append(_stub_param(p))
            posonly = inspect.Parameter.POSITIONAL_ONLY
            last_posonly = p.kind == posonly and (
                i + 1 == len(op.params) or op.params[i + 1].kind != posonly
            )
            if last_posonly:
                params.append("/")
        returns = STUB_TYPES.get(op.returns, op.returns)
        lines.append(f"def {op.name}({', '.join(params)}) -> {returns}: ...")
    return "\n".join(lines) + "\n"


DUNDER_HEADER = """\
# Generated from dispatch/operators.py by `python -m lamina.tools.operators --write`;
# tests/test_architecture.py checks that it is fresh. Tensor's operator methods are
# installed at import time from the schema (dispatch/bindings.py); this stub, Tensor's
# base class for type checkers only (Note [Typed dunders] in dispatch/tensor.py), types
# them.
from typing import Any

from .tensor import Tensor

Operand = Tensor | bool | int | float | complex

class Dunders:
"""


def render_dunder_stub() -> str:
    lines = [DUNDER_HEADER.rstrip("\n")]
    for op in schema.OPERATORS.values():
        d = op.dunder
        if d is None:
            continue
        if op.category != "elementwise":
            other = "Tensor"
            names = [d, f"r{d}"]
        elif op.kind == "unary":
            lines.append(f"    def __{d}__(self) -> Tensor: ...")
            continue
        elif "comparison" in op.tags:
            lines.append(
                f"    def __{d}__(self, other: Any) -> Tensor: ...  # type: ignore[override]"
            )
            continue
        else:
            other = "Operand"
            names = [d, f"r{d}"] + ([f"i{d}"] if op.inplace is not None else [])
        lines += [f"    def __{n}__(self, other: {other}) -> Tensor: ..." for n in names]
    return "\n".join(lines) + "\n"


FUNCTIONAL_HEADER = """\
# Generated from dispatch/operators.py and lamina/nn/functional.py by
# `python -m lamina.tools.operators --write`; tests/test_architecture.py checks that it
# is fresh. The operators of lamina.nn.functional are installed at import time from the
# operator schema (dispatch/bindings.py); this stub shows readers and type checkers
# their signatures, beside those of the functions written in functional.py.
from typing import Any

from lamina.dispatch.tensor import Tensor

Pair = int | tuple[int, int]
Size2 = int | tuple[int, int]
"""
FUNCTIONAL_TYPES = STUB_TYPES | {"Pair": "Pair", "str": "str"}


def render_functional_stub() -> str:
    """lamina/nn/functional.pyi: the schema's nn operators and functional.py's own."""
    from lamina.nn import functional

    lines = [FUNCTIONAL_HEADER]
    defined = {}
    for op in schema.OPERATORS.values():
        if op.namespace == "nn.functional":
            params = []
            for p in op.params:
                kind = FUNCTIONAL_TYPES[p.type] + (" | None" if p.optional else "")
                default = "" if p.default is inspect.Parameter.empty else f" = {p.default!r}"
                params.append(f"{p.name}: {kind}{default}")
            defined[op.name] = f"({', '.join(params)}) -> {op.returns}"
    for name in functional._COMPOSITES:
        signature = inspect.signature(getattr(functional, name))
        params = [
            f"{p.name}: {p.annotation}"
            + ("" if p.default is inspect.Parameter.empty else f" = {p.default!r}")
            for p in signature.parameters.values()
        ]
        defined[name] = f"({', '.join(params)}) -> {signature.return_annotation}"
    lines += [f"def {name}{sig}: ..." for name, sig in sorted(defined.items())]
    return "\n".join(lines) + "\n"


ROOT = pathlib.Path(__file__).resolve().parents[2]
PATH = ROOT / "docs" / "operators.md"
STUB_PATH = ROOT / "dispatch" / "ops.pyi"
DUNDER_STUB_PATH = ROOT / "dispatch" / "_dunders.pyi"
FUNCTIONAL_STUB_PATH = ROOT / "lamina" / "nn" / "functional.pyi"
# every generated file and what generates it (tests/test_architecture.py: fresh)
GENERATED = {
    PATH: render,
    STUB_PATH: render_stub,
    DUNDER_STUB_PATH: render_dunder_stub,
    FUNCTIONAL_STUB_PATH: render_functional_stub,
}


def render_core() -> str:
    """The core operators (Note [Core operators] in dispatch/decompositions.py) by
    category: what a new device implements; every other operator has a decomposition."""
    core = decompositions.core_operators()
    lines = [
        f"{len(core)} core operators of {len(schema.OPERATORS)}; the other "
        f"{len(decompositions.DECOMPOSITIONS)} have decompositions into them:"
    ]
    for category in schema.CONVENTIONS:
        names = [n for n in core if schema.OPERATORS[n].category == category]
        if names:
            lines.append(f"  {category:<13} {', '.join(names)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lamina.tools.operators", description=__doc__)
    p.add_argument("--write", action="store_true", help="write the reference and the stubs")
    p.add_argument("--stub", action="store_true", help="print the stub, not the reference")
    p.add_argument(
        "--core", action="store_true", help="list the core operators a new device implements"
    )
    args = p.parse_args(argv)
    if args.write:
        for path, make in GENERATED.items():
            path.write_text(make())
    else:
        print(render_core() if args.core else render_stub() if args.stub else render(), end="")


if __name__ == "__main__":
    main()
