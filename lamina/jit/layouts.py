"""Which memory layout a compiled program's images run in.

Note [Compiled layout]: lamina's image kernels run in either memory layout, and which
is faster depends on the network and its batch. Measured on 2 cores, float32,
inference at batch 32, eager channels-last time / NCHW time: MobileNet v2 0.84x (1
thread) and 0.78x (2), ResNet-18 on 32 x 32 images 0.86x and 0.84x, VGG 0.91x,
Inception v1 1.22x, AlexNet 1.01x. Every image operator gives its result in its
input's layout (Note [Layout regions]), so one conversion where images enter a program
runs all of it in the other layout, and one where images leave puts them back: the
program traced with its image arguments converted first (``in_layout``), its results
as eager would give them.

``lm.jit.compile(..., layout=...)`` says which: ``"auto"`` (the default) traces a
variant as it comes and, where it takes NCHW images and calls image operators
(``worth_a_trial``), also channels-last, times both plans on the call's own inputs
(``faster``: an inference, or a training step's forward and backward without autograd,
so no ``.grad`` moves; fewer runs where they would take over TRIAL_SECONDS) and keeps
channels-last only where it is faster by MARGIN. What the trials write -- batch norm's
running statistics -- is put back as it was; a variant that draws random numbers
(dropout) or writes a tensor it was given is not tried, as its effects could not be
undone. ``"NHWC"`` or ``"NCHW"`` runs every variant's images in that layout; ``None``
keeps the inputs' layouts. The choice is made once per kind of variant
(Note [Dynamic sizes]), so the sizes of one kind share it.
Measured on 2 cores, float32, batch 32, compiled with ``layout=None`` / ``"auto"``:
MobileNet v2 inference 36.2 / 33.8 ms (1 thread) and 29.1 / 22.7 ms (2), ResNet-18 on
32 x 32 images 336 / 239 and 180 / 135 ms; training channels-last took 0.73x and 0.74x
(MobileNet v2) and 0.83x and 0.85x (ResNet-18) of the NCHW step's time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from lamina.autograd.grad_mode import no_grad
from lamina.dispatch import layouts, ops
from lamina.dispatch.tensor import Tensor, bump_version
from lamina.nn.functional import layout_of, to_layout

from .executor import Plan
from .graph import Graph
from .training import Training

# Note [Failed trials]: a program may work only in the layout it was written for: a
# ``view`` of a convolution's result (``y.view(-1)``) that NCHW strides allow and
# channels-last ones cannot give, which eager PyTorch refuses as well for channels-last
# images. A channels-last trial that raises, in its trace or its run, keeps the program
# in its own layout, as written (it failed to compile: found by review). The trial's
# writes are put back by ``faster`` either way.
CHOICES = ("auto", None, layouts.NCHW, layouts.NHWC)
MARGIN = 0.95  # channels-last is kept where it takes at most this much of NCHW's time
# Timed runs of each plan, alternating, after TRIAL_WARMUP untimed runs: the first
# loads a plan's kernels, the second makes the filters that wait for a weight seen
# unchanged (Note [Steady filters] in the CPU backend), so only the third runs as every
# later call will. Then up to TRIAL_ROUNDS timed runs, fewer (at least one) where they
# would take more than TRIAL_SECONDS (a big training step). After one untimed run and
# three timed ones, Inception's inference at batch 1 kept channels-last in 4 processes
# of 5 (one thread): its timed runs still fell from 1.1 to 0.8 ms, and the first
# process's fastest channels-last run was 0.92 ms against 0.89 channels-first.
TRIAL_WARMUP = 2
TRIAL_ROUNDS = 5
TRIAL_SECONDS = 1.0


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


def _written(graph: Graph) -> list[Tensor] | None:
    """The module tensors the graph writes (batch norm's statistics), which trials
    restore; None where a trial could not be undone: a random draw, or a write to a
    tensor the call was given."""
    written = []
    for node in graph.nodes:
        if "generator" in getattr(node.target, "writes", ()):
            return None
        for v in node.writes():
            if not isinstance(v.source, Tensor):
                return None
            written.append(v.source)
    return written


def worth_a_trial(plan: Any, args: tuple) -> bool:
    """Whether a variant's plan (traced in its inputs' layouts) is one that ``"auto"``
    times channels-last too: a plan of NCHW images calling image operators, whose
    effects trials can undo (Note [Compiled layout])."""
    if not isinstance(plan, (Plan, Training)) or layouts.NCHW not in map(_image_layout, args):
        return False
    graph = plan.graph  # a training step's: its forward's (Note [Joint graph])
    if _written(graph) is None:
        return False
    return any(
        getattr(node.target, "category", None) == "nn"
        and any(v.shape is not None and len(v.shape) == 4 for v in node.inputs())
        for node in graph.nodes
    )


def _run(plan: Any, tensors: list) -> None:
    """One run of an inference plan, or of a training step's forward and backward
    (every result's gradient ones) without autograd: no parameter's ``.grad`` moves."""
    if isinstance(plan, Plan):
        plan.run(list(tensors))
        return
    with no_grad():
        produced = plan.forward.run(list(tensors))
        grads = [ops.ones_like(o) for o in produced[: plan.n_outputs]]
        plan.backward.run([*grads, *produced[plan.n_outputs :]])


def faster(challenger: Any, incumbent: Any, tensors: list) -> bool:
    """Whether ``challenger`` runs on ``tensors`` in at most MARGIN of ``incumbent``'s
    time: the fastest of its timed runs each (TRIAL_ROUNDS and TRIAL_SECONDS),
    alternating, after TRIAL_WARMUP untimed runs of each; the tensors they write are
    then as before."""
    plans = (challenger, incumbent)
    written = _written(incumbent.graph) or []
    before = [t._data.copy() for t in written]
    try:
        for _ in range(TRIAL_WARMUP):
            warm = sum(_timed(plan, tensors) for plan in plans)
        rounds = max(1, min(TRIAL_ROUNDS, int(TRIAL_SECONDS / warm)))
        best = [float("inf")] * len(plans)
        for _ in range(rounds):
            for i, plan in enumerate(plans):
                best[i] = min(best[i], _timed(plan, tensors))
    finally:
        for t, values in zip(written, before):
            np.copyto(t._data, values)
            bump_version(t)  # Note [Version counters]
    return best[0] <= MARGIN * best[1]


def _timed(plan: Any, tensors: list) -> float:
    start = time.perf_counter()
    _run(plan, tensors)
    return time.perf_counter() - start
