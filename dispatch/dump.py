"""``dump_table``: an operator's dispatch table as an aligned, printable table (the
role of PyTorch's ``_dispatch_dump_table``), with the reason ``entries.compute_entry``
stored for each key (Note [Table entry precedence])."""

from __future__ import annotations

from . import keys
from .entries import describe
from .schema import Operator, get


class TableDump(list):
    """Rows of (key, kernel, plugin, priority, rule); prints as an aligned table."""

    head = ("key", "kernel", "plugin", "priority", "rule")

    def __init__(self, op: Operator, rows: list[tuple]) -> None:
        super().__init__(rows)
        self.op = op

    def __str__(self) -> str:
        rows = [self.head] + [tuple(str(c) for c in r) for r in self]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.head))]
        lines = [
            f"dispatch table of {self.op.name}{self.op.signature_text}  (mask {self.op.mask:#x})"
        ]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(2, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

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
