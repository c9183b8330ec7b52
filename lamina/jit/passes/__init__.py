"""Graph passes: each a module with one function ``run(graph) -> graph`` that keeps
the program's meaning (Note [Graph values]) and the invariants ``Graph.lint`` checks.

``DEFAULT`` is the order ``lm.jit.compile`` runs them in; ``passes=`` picks others, so
the effect of each can be measured alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..graph import Graph
from . import cse, dce, fold, fold_batch_norm, fuse, hoist, layout, recompute, rewrite, siblings

PASSES: dict[str, Callable[[Graph], Graph]] = {
    "cse": cse.run,
    "fold": fold.run,
    "layout": layout.run,
    "dce": dce.run,
    "fold_batch_norm": fold_batch_norm.run,
    "rewrite": rewrite.run,
    "siblings": siblings.run,
    "hoist": hoist.run,
    "fuse": fuse.run,
}
# passes over a training step's joint graph, before it is split into forward and
# backward (Note [Joint graph]): they choose what the forward saves
JOINT = {
    "recompute": recompute.run,
    "recompute_normalization": recompute.normalizations,
    "recompute_conversion": recompute.conversions,
}
DEFAULT = (
    "cse",
    "fold",
    "layout",
    "dce",
    "fold_batch_norm",
    "rewrite",
    "siblings",
    "hoist",
    "fuse",
    "recompute",
    "recompute_normalization",
    "recompute_conversion",
)


def check(names: Sequence[str]) -> None:
    for name in names:
        if name not in PASSES and name not in JOINT:
            known = ", ".join([*PASSES, *JOINT])
            raise ValueError(f"unknown pass {name!r}; the passes are {known}")


def apply(graph: Graph, names: Sequence[str] = DEFAULT) -> Graph:
    check(names)
    for name in names:
        if name in PASSES:
            graph = PASSES[name](graph)
    return graph
