"""What ``bench convnet`` and ``bench nn`` print and draw alike: aligned tables, the
line saying PyTorch is not timed, and matplotlib for ``--plot``."""

from __future__ import annotations

# The PyTorch release the published tables were measured against (docs/performance.md),
# so that a reader who installs it compares like with like.
TORCH_VERSION = "2.13.0"


def table(head: list[str], rows: list[list[str]], left: int) -> list[str]:
    """Lines of an aligned table whose first ``left`` columns are text. A column empty
    in every row is left out: a heading over nothing reads as a missing measurement."""
    kept = [i for i in range(len(head)) if any(row[i] for row in rows)]
    head = [head[i] for i in kept]
    rows = [[row[i] for i in kept] for row in rows]
    left = sum(i < left for i in kept)
    widths = [max(len(c) for c in col) for col in zip(head, *rows)]

    def line(cells):
        padded = (
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )
        return "  ".join(padded).rstrip()

    return [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]


def without_torch(args) -> str:
    """The report's first line when PyTorch is not timed beside lamina."""
    if args.no_torch:
        return "PyTorch not used (--no-torch): lamina alone is timed"
    return (
        "PyTorch not found: lamina alone is timed; "
        f"`pip install torch=={TORCH_VERSION}` adds it as a peer"
    )


def pyplot():
    """matplotlib.pyplot drawing to files: imported only for ``--plot``, since the
    benchmarks run without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit(
            "--plot needs matplotlib, which lamina's bench extra installs: "
            "pip install 'lamina[bench]'"
        ) from None
    return plt
