"""Printable internals: ``dump_table``, an operator's dispatch table (the role of
PyTorch's ``_dispatch_dump_table``), with the reason ``entries.compute_entry`` stored for
each key (Note [Table entry precedence]); ``operators``, the schema as records."""

from __future__ import annotations

from . import keys
from .entries import describe
from .format import aligned
from .schema import CONVENTIONS, OPERATORS, Operator, get


class TableDump(list):
    """Rows of (key, kernel, plugin, priority, rule); prints as an aligned table."""

    head = ("key", "kernel", "plugin", "priority", "rule")

    def __init__(self, op: Operator, rows: list[tuple]) -> None:
        super().__init__(rows)
        self.op = op

    def __str__(self) -> str:
        title = (
            f"dispatch table of {self.op.name}{self.op.signature_text}  (mask {self.op.mask:#x})"
        )
        return aligned(title, self.head, list(self))

    __repr__ = __str__


def dump_table(name: str) -> TableDump:
    """Each key -> the kernel that serves it (a wrapper chain reads outermost first,
    ``a -> b``), the plugin that provided it, its priority, and the rule of Note
    [Table entry precedence] that chose it, with the reason."""
    op = get(name)
    rows = []
    for key in keys.all_keys():
        entry = op.entries[key]
        kernel, plugin, priority = describe(entry)
        rows.append((keys.key_name(key), kernel, plugin, priority, f"{entry.rule}: {entry.reason}"))
    return TableDump(op, rows)


class OperatorList(list):
    """Records of ``operators()``; prints as an aligned table."""

    columns = ("name", "kind", "kernel_call", "tags")

    def __str__(self) -> str:
        rows = [(r["name"], r["kind"], r["kernel_call"], " ".join(sorted(r["tags"]))) for r in self]
        return aligned(f"{len(self)} operators (docs/operators.md)", self.columns, rows)

    __repr__ = __str__


def operators(category: str | None = None, tag: str | None = None) -> OperatorList:
    """One record (a dict) per operator of the schema, in definition order; the ones
    of one ``category`` or carrying one ``tag`` if given. A record holds ``name``,
    ``signature`` (the public one, annotations are argument kinds), ``kernel_call``
    (what a kernel receives: ``sum(ks, x, axis, dtype, keepdims)``), ``category``,
    ``kind`` (unary / binary / ternary / inplace / the category), ``tags``,
    ``dtypes`` and ``result`` (its dtype rules), ``convention`` (the category's
    calling convention), ``public`` (False for internal operators such as getitem)
    and ``doc``. Prints as a table."""
    if category is not None and category not in CONVENTIONS:
        raise ValueError(f"unknown category {category!r}; categories: {', '.join(CONVENTIONS)}")
    return OperatorList(
        {
            "name": op.name,
            "signature": op.signature_text,
            "kernel_call": op.kernel_call,
            "category": op.category,
            "kind": op.kind,
            "tags": op.tags,
            "dtypes": op.dtypes,
            "result": op.result,
            "convention": op.convention,
            "public": op.namespace is not None,
            "doc": op.doc,
        }
        for op in OPERATORS.values()
        if (category is None or op.category == category) and (tag is None or tag in op.tags)
    )
