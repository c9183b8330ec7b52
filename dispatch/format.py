"""``repr`` of tensors, in the style of NumPy's and PyTorch's, and the aligned tables
lamina prints for people (dispatch tables, plugins, operators)."""

import numpy as np

from . import dtypes as D
from .layouts import MetaStorage


def _implied(dtype):
    """Whether the printed values imply ``dtype``: the default float (PyTorch's rule,
    Note [Default dtype]), int64 and bool."""
    return dtype is D.default_float or dtype is D.int64 or dtype is D.bool_


def format_sparse(t):
    """PyTorch's style: tensor(indices=..., values=..., size=..., nnz=..., layout=...)."""
    c, pad = t._data, " " * len("tensor(")
    text = [
        np.array2string(
            a, separator=", ", prefix=pad + name + "=tensor(", threshold=1000, edgeitems=3
        )
        for name, a in (("indices", c.indices), ("values", c.values))
    ]
    extras = [f"size={t.shape}", f"nnz={c.values.size}"]
    if not _implied(t.dtype):
        extras.append(f"dtype={t.dtype!r}")
    return (
        f"tensor(indices=tensor({text[0]}),\n{pad}values=tensor({text[1]}),\n"
        f"{pad}{', '.join(extras)}, layout=sparse_coo)"
    )


def format_tensor(t):
    if t.is_sparse:
        return format_sparse(t)
    try:
        data = t._host()  # a CPU copy for tensors of other devices
    except RuntimeError:
        if not isinstance(t._data, MetaStorage):
            raise
        # no values (a meta tensor a trace does not stand for): PyTorch's style
        dtype = "" if _implied(t.dtype) else f", dtype={t.dtype!r}"
        return f"tensor(..., device='meta', size={t.shape}{dtype})"
    prefix = "tensor("
    body = np.array2string(data, separator=", ", prefix=prefix, threshold=1000, edgeitems=3)
    extras = []
    if data.size == 0 and data.shape != (0,):
        extras.append(f"shape={t.shape}")
    if not _implied(t.dtype) or (data.size == 0 and t.dtype is not D.default_float):
        extras.append(f"dtype={t.dtype!r}")
    if t.device != "cpu" and not isinstance(t._data, MetaStorage):  # meta: a trace's read
        extras.append(f"device={str(t.device)!r}")
    return prefix + body + "".join(", " + e for e in extras) + ")"


def aligned(title: str, head: tuple[str, ...], rows: list[tuple]) -> str:
    """``title``, then ``head`` and ``rows`` as left-aligned columns under a dash rule."""
    cells = [head] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = [title] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(2, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
