"""``python -m lamina.tools.operators``: the operator reference, docs/operators.md.

Generated from the operator schema (dispatch/operators.py); ``tests/test_docs.py``
checks that the committed file is what this prints, so it cannot drift. Run with
``--write`` to update the file.
"""

from __future__ import annotations

import argparse
import pathlib

from lamina.dispatch import arguments, schema

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


PATH = pathlib.Path(__file__).resolve().parents[2] / "docs" / "operators.md"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lamina.tools.operators", description=__doc__)
    p.add_argument("--write", action="store_true", help=f"write {PATH}")
    args = p.parse_args(argv)
    text = render()
    if args.write:
        PATH.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
