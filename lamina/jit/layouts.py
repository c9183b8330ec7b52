"""Which memory layout a compiled program's images run in.

Note [Compiled layout]: lamina's image kernels run in either memory layout, and which
is faster depends on the network and its batch. Measured on 2 cores, float32,
inference at batch 32, eager channels-last time / NCHW time: MobileNet v2 0.84x (1
thread) and 0.78x (2), ResNet-18 on 32 x 32 images 0.83x and 0.88x, VGG 0.90x,
Inception v1 1.22x, AlexNet 1.01x. Every image operator gives its result in its
input's layout (Note [Layout regions]), so one conversion where images enter a program
runs all of it in the other layout, and one where images leave puts them back: the
program traced with its image arguments converted first (``in_layout``), its results
as eager would give them.

``lm.jit.compile(..., layout=...)`` says which: ``"auto"`` (the default) traces a
variant as it comes and, where it takes NCHW images, calls image operators and has no
effect (``worth_a_trial``: inference), also channels-last, times both plans on the
call's own inputs (``faster``) and keeps channels-last only where it is faster by
MARGIN. A variant with effects -- a training step writes batch norm's statistics,
dropout draws random numbers -- keeps its inputs' layout: the trials would repeat
them. ``"NHWC"`` or ``"NCHW"`` runs every variant's images in that layout, training
steps included; ``None`` keeps the inputs' layouts. The choice is made once per kind
of variant (Note [Dynamic sizes]), so the sizes of one kind share their layout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lamina.dispatch import layouts
from lamina.dispatch.tensor import Tensor
from lamina.nn.functional import layout_of, to_layout

from .executor import Plan
from .graph import Graph

CHOICES = ("auto", None, layouts.NCHW, layouts.NHWC)
MARGIN = 0.95  # channels-last is kept where it takes at most this much of NCHW's time
TRIAL_ROUNDS = 3  # timed runs of each plan, alternating, after one untimed run


def check(layout: Any) -> None:
    if layout not in CHOICES:
        raise ValueError(
            f"lm.jit.compile: layout must be one of {', '.join(map(repr, CHOICES))}, got {layout!r}"
        )


def _image_layout(a: Any) -> str | None:
    """The memory layout of a 4-D CPU tensor with images to convert, else None."""
    if not isinstance(a, Tensor) or a.ndim != 4 or a.device != "cpu":
        return None
    return layout_of(a)


def in_layout(fn: Callable, args: tuple, target: str) -> Callable | None:
    """``fn`` taking the 4-D image tensors among ``args`` (positional) in layout
    ``target``, and giving its 4-D results back in their layout; None where no argument
    is an image in another layout."""
    sources = [_image_layout(a) for a in args]
    moved = [i for i, s in enumerate(sources) if s not in (None, target)]
    if not moved:
        return None
    source = sources[moved[0]]

    def back(out: Any) -> Any:
        if isinstance(out, Tensor) and out.ndim == 4:
            return to_layout(out, source)
        if isinstance(out, (tuple, list)):
            return type(out)(back(o) for o in out)
        return out

    def converted(*args: Any, **kwargs: Any) -> Any:
        args = tuple(to_layout(a, target) if i in moved else a for i, a in enumerate(args))
        return back(fn(*args, **kwargs))

    return converted


def worth_a_trial(plan: Any, args: tuple) -> bool:
    """Whether a variant's plan (traced in its inputs' layouts) is one that ``"auto"``
    times channels-last too: a plan without effects, of NCHW images, calling image
    operators (Note [Compiled layout])."""
    if not isinstance(plan, Plan) or layouts.NCHW not in map(_image_layout, args):
        return False
    graph: Graph = plan.graph
    if any(node.impure for node in graph.nodes):
        return False
    return any(
        getattr(node.target, "category", None) == "nn"
        and any(v.shape is not None and len(v.shape) == 4 for v in node.inputs())
        for node in graph.nodes
    )


def faster(challenger: Plan, incumbent: Plan, tensors: list) -> bool:
    """Whether ``challenger`` runs on ``tensors`` in at most MARGIN of ``incumbent``'s
    time: the fastest of TRIAL_ROUNDS runs each, alternating, after one untimed run of
    each (it loads their kernels)."""
    plans = (challenger, incumbent)
    for plan in plans:
        plan.run(list(tensors))
    best = [float("inf")] * len(plans)
    for _ in range(TRIAL_ROUNDS):
        for i, plan in enumerate(plans):
            start = time.perf_counter()
            plan.run(list(tensors))
            best[i] = min(best[i], time.perf_counter() - start)
    return best[0] <= MARGIN * best[1]
