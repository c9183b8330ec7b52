"""Graph passes: each a module with one function ``run(graph) -> graph`` that keeps
the program's meaning (Note [Graph values]) and the invariants ``Graph.lint`` checks.

``DEFAULT`` is the order ``lm.jit.compile`` runs them in; ``passes=`` picks others, so
the effect of each can be measured alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..graph import Graph
from . import cse, dce, fold, fold_batch_norm, fuse, hoist, layout, rewrite

PASSES: dict[str, Callable[[Graph], Graph]] = {
    "cse": cse.run,
    "fold": fold.run,
    "layout": layout.run,
    "dce": dce.run,
    "fold_batch_norm": fold_batch_norm.run,
    "rewrite": rewrite.run,
    "hoist": hoist.run,
    "fuse": fuse.run,
}
DEFAULT = ("cse", "fold", "layout", "dce", "fold_batch_norm", "rewrite", "hoist", "fuse")


def apply(graph: Graph, names: Sequence[str] = DEFAULT) -> Graph:
    for name in names:
        if name not in PASSES:
            raise ValueError(f"unknown pass {name!r}; the passes are {', '.join(PASSES)}")
        graph = PASSES[name](graph)
    return graph
