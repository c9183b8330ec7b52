"""Fusions as declared patterns, registered in one place (Note [Rewrites]).

Note [Rewrites]: a rewrite replaces a chain of operator calls, each consuming the first
result of the call before it, by one call that computes the same values in fewer passes
over memory (oneDNN's post-ops). It declares

* ``pattern``: the operators' names, in call order;
* ``apply(x, *stages)``: the fused call. ``x`` is the chain's input; ``stages[i](y)``
  gives the arguments of the chain's i-th call with ``y`` as its first argument (the
  values flowing between calls are never computed, so a stage is asked with the chain's
  input; a rewrite only reads the arguments that do not depend on it);
* whether the fused result equals the chain's bit for bit.

Who applies them: ``lamina.nn.Sequential``, eagerly, to consecutive children whose
forward is one operator call (``Module.operator`` and ``Module.operator_args``), and
the graph passes to captured graphs. Neither knows any fusion by name: adding one is a
``rewrite(...)`` here (and its fused operator, if it needs a new one). The fused
operators stay ordinary operators with kernels on each device and formulas
(``native_batch_norm``'s ``relu`` argument: Note [Fused batch norm and relu];
``conv2d_relu`` and ``linear_relu``: Note [Fused epilogues] in the CPU backend's
conv.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .schema import OPERATORS

Stage = Callable[[Any], tuple]


@dataclass(frozen=True)
class Rewrite:
    """One fusion (Note [Rewrites])."""

    name: str
    pattern: tuple[str, ...]
    apply: Callable[..., Any]
    exact: bool  # the fused result equals the chain's bit for bit
    doc: str


REWRITES: dict[str, Rewrite] = {}


def rewrite(name: str, pattern: Sequence[str], *, exact: bool, doc: str) -> Callable:
    """Register the decorated ``apply(x, *stages)`` as the fusion ``name`` of ``pattern``."""
    for op in pattern:
        if op not in OPERATORS:
            raise ValueError(f"rewrite {name!r}: unknown operator {op!r} in its pattern")

    def register(apply: Callable[..., Any]) -> Callable[..., Any]:
        if name in REWRITES:
            raise ValueError(f"rewrite {name!r} is registered twice")
        REWRITES[name] = Rewrite(name, tuple(pattern), apply, exact, doc)
        return apply

    return register


def match(operators: Sequence[str | None]) -> Rewrite | None:
    """The rewrite whose pattern begins ``operators`` (the longest, when several do)."""
    found = None
    for r in REWRITES.values():
        n = len(r.pattern)
        if tuple(operators[:n]) == r.pattern and (found is None or n > len(found.pattern)):
            found = r
    return found


@rewrite(
    "batch_norm_relu",
    ("native_batch_norm", "relu"),
    exact=True,
    doc="relu(batch_norm(x)) as one batch-norm pass that writes max(y, 0) "
    "(Note [Fused batch norm and relu])",
)
def _batch_norm_relu(x: Any, batch_norm: Stage, relu: Stage) -> Any:
    op = OPERATORS["native_batch_norm"]
    *args, _ = batch_norm(x)
    return op(*args, True)[0]


def _relu_epilogue(base: str) -> None:
    """``base`` followed by relu as the operator ``{base}_relu``, whose bias pass
    writes max(y, 0) (Note [Fused epilogues])."""
    fused = f"{base}_relu"

    @rewrite(
        fused,
        (base, "relu"),
        exact=True,
        doc=f"relu({base}(x)) as one {base} call whose bias pass writes max(y, 0) "
        "(Note [Fused epilogues])",
    )
    def apply(x: Any, call: Stage, relu: Stage) -> Any:
        return OPERATORS[fused](*call(x))


for _base in ("conv2d", "linear"):
    _relu_epilogue(_base)
