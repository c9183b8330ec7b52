"""AlexNet-, VGG- and Inception-v1-like convnets, lamina beside PyTorch.

Three convnets sized for 2 cores: an AlexNet-like net (11 x 11 stride-4
convolution, local response normalization, max pooling, three linear layers), a
VGG-like net (3 x 3 convolution stacks with batch normalization, max pooling) and an
Inception-v1-like net (a stem, then two blocks of parallel 1 x 1 / 3 x 3 / 5 x 5 /
pool-projection branches joined by concatenation on channels, global average pooling,
a linear layer), on 64 x 64 RGB images and 100 classes, float32.

Each architecture is written once (``ARCHITECTURES``) and built with lamina.nn and,
when it is importable, torch.nn; PyTorch gets lamina's initial weights (copied) and
the same inputs. Before anything is timed, one training step's loss and every
parameter's gradient must agree with PyTorch's within float32 tolerance
(``LOSS_TOLERANCE``, ``GRAD_TOLERANCE``); a model that does not is not timed, and the
report names its worst parameter. Then training steps (forward, cross-entropy loss,
backward, SGD step) and inference (evaluation mode, no gradients) are timed for every
batch size, each library in a child process of its own (Note [Separate processes]
in lamina.tools.bench.timing; ``--in-process`` times them in this one), both libraries
interleaved round by round, and reported as images per second (medians) with lamina /
PyTorch (``--plot`` draws them as bars). lamina runs with its pool allocator on
(``--allocator off`` to measure it without), as the README advises for training:
without it a training step takes thousands of page faults, which two threads then take
in turn.

``--jit`` adds each library's compiled models: lamina's (``lm.jit.compile(model)``:
in training its forward and backward compiled as one joint graph, the loss and the SGD
step as in eager; ``--passes`` picks the graph passes) and torch.compile's (inductor,
static shapes), each timed in a process of its own beside the eager ones, with lamina
compiled / eager and lamina compiled / torch.compile. Before that, fresh processes
check every compiled model against its library's eager one (a training step's loss
and gradients, an inference's outputs, within the same tolerances; one that fails or
disagrees is reported and not timed) and measure its compile time, cold (the first
process, with the caches as they are) and warm (a second one); and, where models
train, each library's memory of a training step: lamina's pool allocator's peak
bytes in use and, for both libraries, the growth of the process's peak resident
memory (PyTorch on the CPU counts no allocated bytes).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from . import output, timing

CLASSES = 100
IMAGE = (3, 64, 64)
CHECK_BATCH = 4  # the agreement check's batch (batch norm needs more than one image)
# |lamina - torch| <= atol + rtol |torch|; a gradient's atol is scaled by the largest
# |gradient| of its parameter, since gradients of different layers differ by decades.
LOSS_TOLERANCE = {"rtol": 1e-3, "atol": 1e-4}
GRAD_TOLERANCE = {"rtol": 1e-3, "atol": 1e-4}  # atol times max |torch gradient|
# Note [Gradients zero but for rounding]: a parameter whose shift a later batch norm
# cancels has a gradient that is zero but for rounding: a convolution's bias before
# batch norm (which is why the descriptions leave it out), or MobileNet v2's last
# projection's batch-norm bias, followed by a 1 x 1 convolution and batch norm (its
# gradient ~1e-17 in float64, lamina's and PyTorch's rounding apart by as much). Scaled
# by that noise, the tolerance would compare rounding with rounding; so a gradient's
# scale is at least this fraction of the model's largest gradient.
ZERO_GRADIENT = 1e-9


def _vgg_stage(channels: int, convs: int) -> tuple:
    return (("conv", channels, 3, 1, 1), ("bn",), ("relu",)) * convs + (("maxpool", 2, 2, 0),)


# Note [Architecture descriptions]: one tuple per layer, (kind, *arguments), read by
# ``build`` for both libraries, so the two models cannot drift apart and their
# parameters get the same dotted names (weights are copied by name).
#   conv (out_channels, kernel, stride, padding), with a bias unless batch norm
#   follows (which would cancel it: its gradient is zero up to rounding); bn; relu; lrn (size);
#   maxpool (kernel, stride, padding); avgpool (global); flatten; linear (out);
#   inception (1x1, (3x3 reduce, 3x3), (5x5 reduce, 5x5), pool projection).
# fmt: off
ARCHITECTURES = {
    "alexnet": (
        ("conv", 48, 11, 4, 2), ("relu",), ("lrn", 5), ("maxpool", 3, 2, 0),
        ("conv", 128, 5, 1, 2), ("relu",), ("lrn", 5), ("maxpool", 3, 2, 0),
        ("conv", 192, 3, 1, 1), ("relu",),
        ("conv", 128, 3, 1, 1), ("relu",),
        ("flatten",),
        ("linear", 512), ("relu",),
        ("linear", 512), ("relu",),
        ("linear", CLASSES),
    ),
    "vgg": (
        _vgg_stage(16, 2)
        + _vgg_stage(32, 2)
        + _vgg_stage(64, 2)
        + _vgg_stage(128, 1)
        + (("flatten",), ("linear", 256), ("relu",), ("linear", CLASSES))
    ),
    "inception": (
        ("conv", 32, 7, 2, 3), ("relu",), ("maxpool", 3, 2, 1),
        ("conv", 64, 3, 1, 1), ("relu",), ("maxpool", 3, 2, 1),
        ("inception", 32, (32, 48), (8, 16), 16),
        ("inception", 48, (48, 64), (12, 24), 24),
        ("avgpool",), ("flatten",),
        ("linear", CLASSES),
    ),
}
# fmt: on


# ---------------------------------------------------------------- the two libraries


@dataclass
class Lib:
    """What a benchmark needs of one library."""

    name: str
    nn: object  # lamina.nn or torch.nn
    cat: Callable  # cat(list of tensors) along channels
    tensor: Callable  # tensor(numpy array) -> tensor
    to_layout: Callable  # to_layout(images, layout) -> images in that memory layout
    model_to_layout: Callable  # model_to_layout(model, layout) -> model
    numpy: Callable  # numpy(tensor) -> numpy array
    no_grad: Callable
    sgd: Callable  # sgd(parameters, lr) -> optimizer
    set_threads: Callable
    get_threads: Callable
    version: str
    inception: type = field(init=False)

    def __post_init__(self):
        self.inception = _inception_class(self.nn, self.cat)


def _lamina() -> Lib:
    import lamina as lm

    return Lib(
        "lamina",
        lm.nn,
        lambda ts: lm.concat(ts, axis=1),
        lm.asarray,
        lambda x, layout: lm.nn.functional.to_layout(x, layout),
        lambda model, layout: model,  # lamina's kernels follow the input's layout
        lambda t: t.detach().numpy(),
        lm.no_grad,
        lambda params, lr: lm.optim.SGD(params, lr=lr),
        lm.set_num_threads,
        lm.get_num_threads,
        lm.__version__,
    )


def _torch() -> Lib | None:
    try:
        import torch
    except ImportError:
        return None

    def to_layout(x, layout):
        return x.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else x

    def model_to_layout(model, layout):
        return model.to(memory_format=torch.channels_last) if layout == "NHWC" else model

    return Lib(
        "torch",
        torch.nn,
        lambda ts: torch.cat(ts, 1),
        torch.from_numpy,
        to_layout,
        model_to_layout,
        lambda t: t.detach().numpy(),
        torch.no_grad,
        lambda params, lr: torch.optim.SGD(params, lr=lr),
        torch.set_num_threads,
        torch.get_num_threads,
        torch.__version__.split("+")[0],
    )


def _inception_class(nn, cat) -> type:
    """Inception v1's block in library ``nn``: four branches over the same input,
    their outputs concatenated on channels."""

    def conv_relu(c_in, c_out, k):
        return [nn.Conv2d(c_in, c_out, k, padding=k // 2), nn.ReLU()]

    class Inception(nn.Module):
        def __init__(self, c_in, c1, c3, c5, pool_proj):
            super().__init__()
            self.branch1 = nn.Sequential(*conv_relu(c_in, c1, 1))
            self.branch3 = nn.Sequential(*conv_relu(c_in, c3[0], 1), *conv_relu(c3[0], c3[1], 3))
            self.branch5 = nn.Sequential(*conv_relu(c_in, c5[0], 1), *conv_relu(c5[0], c5[1], 5))
            self.branch_pool = nn.Sequential(nn.MaxPool2d(3, 1, 1), *conv_relu(c_in, pool_proj, 1))
            self.out_channels = c1 + c3[1] + c5[1] + pool_proj

        def forward(self, x):
            branches = (self.branch1, self.branch3, self.branch5, self.branch_pool)
            return cat([b(x) for b in branches])

    return Inception


def _size(n, kernel, stride, padding):
    return (n + 2 * padding - kernel) // stride + 1


def build(arch: tuple, lib: Lib):
    """The model of an architecture description (Note [Architecture descriptions])
    in ``lib``, for IMAGE-shaped inputs."""
    nn = lib.nn
    c, h, w = IMAGE
    layers = []
    for i, (kind, *a) in enumerate(arch):
        if kind == "conv":
            out, k, s, p = a
            normalized = i + 1 < len(arch) and arch[i + 1][0] == "bn"
            layers.append(nn.Conv2d(c, out, k, s, p, bias=not normalized))
            c, h, w = out, _size(h, k, s, p), _size(w, k, s, p)
        elif kind == "maxpool":
            k, s, p = a
            layers.append(nn.MaxPool2d(k, s, p))
            h, w = _size(h, k, s, p), _size(w, k, s, p)
        elif kind == "bn":
            layers.append(nn.BatchNorm2d(c))
        elif kind == "relu":
            layers.append(nn.ReLU())
        elif kind == "lrn":
            layers.append(nn.LocalResponseNorm(a[0]))
        elif kind == "avgpool":
            layers.append(nn.AdaptiveAvgPool2d(1))
            h = w = 1
        elif kind == "flatten":
            layers.append(nn.Flatten())
            c, h, w = c * h * w, 1, 1
        elif kind == "linear":
            layers.append(nn.Linear(c, a[0]))
            c = a[0]
        elif kind == "inception":
            layers.append(lib.inception(c, *a))
            c = layers[-1].out_channels
        else:
            raise ValueError(f"unknown layer kind {kind!r} in an architecture description")
    return nn.Sequential(*layers).float()  # whatever the default dtype is


def copy_weights(lamina_model, torch_model) -> None:
    """Every parameter and buffer of the lamina model into the torch model, by name."""
    import torch

    state = lamina_model.state_dict()
    with torch.no_grad():
        for name, t in torch_model.state_dict().items():
            t.copy_(torch.from_numpy(state[name].numpy().copy()))


# ---------------------------------------------------------------- agreement


@dataclass
class Agreement:
    model: str
    ok: bool
    loss: tuple  # (lamina, torch)
    worst: str  # the parameter whose gradient is farthest from torch's, relative to tolerance
    worst_ratio: float  # max |difference| / tolerance of that parameter (<= 1: agrees)
    worst_abs: float  # its largest absolute difference

    def message(self) -> str:
        if self.ok:
            return (
                f"{self.model}: loss and gradients agree with PyTorch "
                f"(worst: {self.worst}, {self.worst_ratio:.2g} of the tolerance)"
            )
        return (
            f"{self.model}: NOT TIMED -- one training step disagrees with PyTorch: loss "
            f"{self.loss[0]:.6g} vs {self.loss[1]:.6g}; worst gradient {self.worst!r} off by "
            f"{self.worst_abs:.3g} ({self.worst_ratio:.3g} times the tolerance)"
        )


def _ratio(mine, ref, rtol, atol) -> float:
    return float(np.max(np.abs(mine - ref) / (atol + rtol * np.abs(ref)), initial=0.0))


def check_agreement(name, models, libs, layout, batch=CHECK_BATCH) -> Agreement:
    """One training step's loss and gradients on ``batch`` random images, lamina's
    against torch's (``compare_step``)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, *IMAGE))
    y = rng.integers(0, CLASSES, batch)
    return compare_step(name, models, libs, lambda lib: lib.to_layout(lib.tensor(x), layout), y)


def compare_step(name, models, libs, input_of: Callable, y) -> Agreement:
    """One training step's loss and gradients, lamina's against torch's, on the input
    ``input_of(lib)`` and the classes ``y`` (a NumPy array), in float64: in
    float32 a batch-norm output within ~1e-6 of zero may round to either side in the two
    libraries and flip a relu mask, which backward spreads far beyond any tolerance (the
    float32 kernels are checked alone, against NumPy, by the test suite). The models are
    float32 again afterwards (float32 -> float64 -> float32 is exact)."""
    losses, grads = [], []
    for lib in libs:
        model = models[lib.name].double().train()
        model.zero_grad()
        loss = lib.nn.CrossEntropyLoss()(model(input_of(lib)), lib.tensor(y))
        loss.backward()
        losses.append(float(lib.numpy(loss)))
        grads.append({n: lib.numpy(p.grad) for n, p in model.named_parameters()})
        model.zero_grad()
        model.float()
    (loss, loss_ref), (mine, ref) = losses, grads
    found = _agreement({"loss": loss, **mine}, {"loss": loss_ref, **ref})
    return Agreement(
        name, found["agrees"], tuple(found["loss"]), found["worst"], found["worst_ratio"],
        found["worst_abs"],
    )  # fmt: skip


def _worst(mine: dict, ref: dict) -> tuple[str, float, float]:
    """(name, max |difference| / tolerance, max |difference|) of the array of ``mine``
    farthest from its namesake in ``ref`` within GRAD_TOLERANCE (infinite where one is
    missing or of another shape)."""
    worst, worst_ratio, worst_abs = "", -1.0, 0.0
    largest = max((float(np.max(np.abs(g), initial=0.0)) for g in ref.values()), default=0.0)
    for n, g_ref in ref.items():
        g = mine.get(n)
        if g is None or g.shape != g_ref.shape:
            return n, float("inf"), float("inf")
        scale = max(float(np.max(np.abs(g_ref), initial=0.0)), ZERO_GRADIENT * largest, 1e-30)
        atol = GRAD_TOLERANCE["atol"] * scale
        r = _ratio(g, g_ref, GRAD_TOLERANCE["rtol"], atol)
        if r > worst_ratio:
            worst, worst_ratio = n, r
            worst_abs = float(np.max(np.abs(g - g_ref)))
    return worst, worst_ratio, worst_abs


def _agreement(got: dict, want: dict) -> dict:
    """How a result ({"loss": ..., name: array}, as ``result_of`` gives) stands against
    a reference: the loss within LOSS_TOLERANCE and every array within GRAD_TOLERANCE
    (``_worst``)."""
    got, want = dict(got), dict(want)
    loss = [float(got.pop("loss")), float(want.pop("loss"))] if "loss" in want else None
    worst, ratio, difference = _worst(got, want)
    loss_ok = loss is None or _ratio(np.float64(loss[0]), loss[1], **LOSS_TOLERANCE) <= 1
    return {
        "agrees": loss_ok and ratio <= 1,
        "loss": loss,
        "worst": worst,
        "worst_ratio": ratio,
        "worst_abs": difference,
    }


# Note [Agreement in either layout]: lamina.jit's layout "auto" may run a model
# channels-last, where a convolution's sums are added in another order. A max pool
# whose window holds two values a rounding apart may then pick the other one, and the
# gradients of every layer before it move by a tenth of their size: VGG at batch 32,
# one window of 65,536 held 0.4633914 and 0.4633942, and 0.4633936 and 0.4633926
# channels-last. No tolerance tells that from a wrong gradient. So a compiled lamina
# model agrees where it agrees with eager lamina in either layout, and the report
# says where that was channels-last.


# ---------------------------------------------------------------- measuring


@dataclass
class Case:
    model: str
    mode: str  # "train" or "infer"
    batch: int


def step(lib: Lib, model, mode: str, batch: int, layout: str) -> Callable:
    """A function running one training step or one inference of ``batch`` images
    (``run_step``), the same inputs in every process (the random generator starts from
    the batch size)."""
    return run_step(lib, model, mode, *inputs(lib, batch, layout))


def inputs(lib: Lib, batch: int, layout: str) -> tuple:
    """(images, classes) of a batch, the same in every process (the random generator
    starts from the batch size)."""
    rng = np.random.default_rng(batch)
    x = lib.to_layout(lib.tensor(rng.standard_normal((batch, *IMAGE), dtype=np.float32)), layout)
    return x, lib.tensor(rng.integers(0, CLASSES, batch))


def run_step(lib: Lib, model, mode: str, x, y) -> Callable:
    """A function running one training step (forward, cross-entropy loss against the
    classes ``y``, backward, SGD step) or one inference (``mode`` "infer": evaluation
    mode, no gradients) of the batch ``x``."""
    if mode == "infer":

        def infer():
            model.eval()
            with lib.no_grad():
                model(x)

        return infer
    loss_fn = lib.nn.CrossEntropyLoss()
    optimizer = lib.sgd(model.parameters(), 1e-3)

    def train():
        model.train()
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

    return train


def _cases(args) -> list[Case]:
    models = list(ARCHITECTURES) if args.model == "all" else [args.model]
    modes = ["train", "infer"] if args.mode == "both" else [args.mode]
    return [Case(m, mode, b) for m in models for mode in modes for b in args.batch]


def save_states(path: str, states: dict) -> None:
    """``states`` ({model: {parameter or buffer name: NumPy array}}) into an .npz file."""
    np.savez(path, **{f"{m}/{k}": a for m, state in states.items() for k, a in state.items()})


def load_states(path: str) -> dict:
    """The states ``save_states`` wrote."""
    states = {}
    with np.load(path) as archive:
        for key in archive.files:
            model, name = key.split("/", 1)
            states.setdefault(model, {})[name] = archive[key]
    return states


def models_of(lib: Lib, states: dict, layout: str) -> dict:
    """{model name: the model in ``lib`` with the parameters and buffers of
    ``states``, in ``layout``}."""
    models = {}
    for name, state in states.items():
        model = build(ARCHITECTURES[name], lib)
        model.load_state_dict({k: lib.tensor(a.copy()) for k, a in state.items()})
        models[name] = lib.model_to_layout(model, layout)
    return models


def runner(library: str, config: dict) -> timing.Runner:
    """One library's cases (Note [Separate processes] in lamina.tools.bench.timing):
    the models of the weights file ``config["weights"]`` (``save_states``), compiled
    for a compiled library (``COMPILED``), on ``config["threads"]`` threads until the
    runner closes. The (model, mode) pairs of ``config["refused"][library]`` are
    not run.

    Note [Inference models]: inference runs on a model of its own, with the same
    weights: a deployed model's, which no training step changes between its calls, as
    training in the same process otherwise would between every sample's calls. lamina
    prepares steady weights once for inference (Note [Filter cache] in
    backends/numba_cpu/nn/filter_cache.py); each library gets the same two models."""
    names = list(load_states(config["weights"]))
    lib, trained = prepared(eager_of(library), config, names)
    models = {"train": trained, "infer": prepared(eager_of(library), config, names)[1]}
    layout = config["layout"]
    compile_model = compiler(library, config.get("passes")) if library in COMPILED else None
    refused = {tuple(pair) for pair in config.get("refused", {}).get(library, [])}
    cases = {}
    for m, mode, batch in config["cases"]:
        if (m, mode) in refused:
            cases[m, mode, batch] = lambda: timing.not_run
            continue
        # a compiled model per case: the compilers' caches hold only so many variants
        model = models[mode][m]
        model = model if compile_model is None else compile_model(model)
        cases[m, mode, batch] = functools.partial(step, lib, model, mode, batch, layout)
    undo = timing.apply_settings(eager_of(library), config, lib.get_threads, lib.set_threads)
    return timing.Runner(library, cases, target=0.05, most=20, on_close=undo)


# ---------------------------------------------------------------- compiled models

# a compiled library: the eager library whose models it compiles
COMPILED = {"lamina.jit": "lamina", "torch.compile": "torch"}
RECOMPILE_LIMIT = 256  # torch.compile's variants of one model's forward (``compiler``)


def eager_of(library: str) -> str:
    return COMPILED.get(library, library)


def compiler(library: str, passes: list[str] | None) -> Callable:
    """model -> the model compiled by ``library``: lm.jit.compile (with ``passes``;
    None: its default ones) or torch.compile (its default backend, inductor, with static
    shapes as lamina.jit's default: torch.compile's default would compile a second
    batch size again with symbolic ones)."""
    if library == "lamina.jit":
        import lamina as lm

        options = {} if passes is None else {"passes": passes}
        return lambda model: lm.jit.compile(model, **options)
    import torch

    # Dynamo limits the variants of one code object, and every model here runs
    # Sequential.forward: past the default limit (8) a runner's later cases would run
    # eagerly under torch.compile's heading (3 models x 2 modes x 2 batches did)
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
    return functools.partial(torch.compile, dynamic=False)


def prepared(library: str, config: dict, names: list[str]) -> tuple[Lib, dict]:
    """The Lib of eager ``library`` and {model name: model} of ``names``, from the
    weights file ``config["weights"]``."""
    lib = _lamina() if library == "lamina" else _torch()
    states = load_states(config["weights"])
    return lib, models_of(lib, {n: states[n] for n in names}, config["layout"])


def result_of(lib: Lib, model, call: Callable, mode: str, x, y) -> dict[str, np.ndarray]:
    """What a compiled model must reproduce of its eager one: a training step's loss
    and every gradient of ``model``'s parameters (forward by ``call``, the model or its
    compiled form, cross-entropy loss, backward; no SGD step: the weights stay as they
    are), or an inference's outputs."""
    if mode == "infer":
        model.eval()
        with lib.no_grad():
            return {"output": lib.numpy(call(x)).copy()}
    model.train()
    model.zero_grad()
    loss = lib.nn.CrossEntropyLoss()(call(x), y)
    loss.backward()
    found = {n: lib.numpy(p.grad).copy() for n, p in model.named_parameters()}
    return {"loss": np.asarray(lib.numpy(loss), np.float64), **found}


def _error_text(e: Exception, call: int) -> str:
    """An exception of the compiled model's ``call``-th call in one line: its type, its
    message's first line, and where it was raised (in lamina's packages, relative to
    the folder that holds them)."""
    frame = traceback.extract_tb(e.__traceback__)[-1]
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))
    where = frame.filename
    if where.startswith(root + os.sep):
        where = os.path.relpath(where, root)
    message = (str(e).strip().splitlines() or [""])[0]
    return (
        f"{type(e).__name__} at compiled call {call}: {message} (raised at {where}:{frame.lineno})"
    )


def first_calls(config: dict, path: str) -> None:
    """In a fresh process (``fresh``): ``config["model"]``'s result (``result_of``) in
    ``config["mode"]`` at ``config["batch"]``, eagerly twice (the first call loads the
    kernels), then compiled by ``config["library"]`` four times. Writes to ``path``
    (JSON) the first compiled call's seconds, the median of the other three, and how far
    the compiled result is from the eager one (``_agreement``; for lamina.jit, the
    nearer of eager's in either layout: Note [Agreement in either layout]), or the
    error compiling or running the compiled model raised."""
    library, name, mode = config["library"], config["model"], config["mode"]
    lib, models = prepared(eager_of(library), config, [name])
    timing.apply_settings(eager_of(library), config, lib.get_threads, lib.set_threads)
    x, y = inputs(lib, config["batch"], config["layout"])
    model = models[name]
    layouts = [config["layout"]]
    if library == "lamina.jit":
        layouts += [layout for layout in ("NCHW", "NHWC") if layout != config["layout"]]
    wants = {}
    for layout in layouts:
        for _ in range(2):
            wants[layout] = result_of(lib, model, model, mode, lib.to_layout(x, layout), y)
    compiled = compiler(library, config.get("passes"))(model)
    seconds = []
    try:
        for _ in range(4):
            start = time.perf_counter()
            got = result_of(lib, model, compiled, mode, x, y)
            seconds.append(time.perf_counter() - start)
    except Exception as e:
        found = {"error": _error_text(e, len(seconds) + 1)}
    else:
        candidates = [
            {**_agreement(got, want), "layout": None if layout == layouts[0] else layout}
            for layout, want in wants.items()
        ]
        found = min(candidates, key=lambda c: (not c["agrees"], c["worst_ratio"]))
        found.update(first=seconds[0], then=statistics.median(seconds[1:]))
    with open(path, "w") as f:
        json.dump(found, f)


def step_memory(config: dict, path: str) -> None:
    """In a fresh process (``fresh``): three training steps of ``config["model"]`` at
    ``config["batch"]`` in ``config["library"]``. Writes to ``path`` (JSON) the
    increase of the process's peak resident memory over them ("rss", bytes) and, for
    lamina with its pool allocator on, the pool's peak bytes in use during the third
    above those in use before it ("pool", else None)."""
    library, name = config["library"], config["model"]
    lib, models = prepared(eager_of(library), config, [name])
    timing.apply_settings(eager_of(library), config, lib.get_threads, lib.set_threads)
    model = models[name]
    if library in COMPILED:
        model = compiler(library, config.get("passes"))(model)
    train = run_step(lib, model, "train", *inputs(lib, config["batch"], config["layout"]))
    before = _peak_rss()
    train()
    train()
    pool = None
    if eager_of(library) == "lamina" and config["allocator"]:
        import lamina as lm

        lm.memory.reset_stats()  # the peak starts again from the bytes in use now
        resting = lm.memory.stats()["bytes_in_use"]
        train()
        pool = lm.memory.stats()["peak_bytes_in_use"] - resting
    else:
        train()
    with open(path, "w") as f:
        json.dump({"rss": _peak_rss() - before, "pool": pool}, f)


def _peak_rss() -> int:
    """The process's peak resident memory so far, in bytes: Linux's VmHWM where there
    is one, since getrusage's peak on Linux starts from the parent's at fork (a bench
    that imported PyTorch and built the models would hide a child's whole growth);
    else getrusage's (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024  # "VmHWM:   123456 kB"
    except (OSError, StopIteration):
        import resource  # Unix only

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def fresh(function: str, config: dict) -> dict | None:
    """What ``function(config, path)`` of this module wrote to ``path`` in a fresh
    Python process; None where that process failed (then what it printed goes to
    stderr; otherwise nothing of it: compilers' warnings would bury the report)."""
    with tempfile.TemporaryDirectory(prefix="lamina-convnet-") as tmp:
        path = os.path.join(tmp, "result.json")
        code = (
            f"import json; from lamina.tools.bench.convnet import {function}; "
            f"{function}(json.loads({json.dumps(config)!r}), {path!r})"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if done.returncode != 0:
            print(done.stdout, file=sys.stderr)
            return None
        with open(path) as f:
            return json.load(f)


def _states(models: dict) -> dict:
    """{model name: {parameter or buffer name: NumPy array}} of the lamina models."""
    return {
        name: {k: v.numpy().copy() for k, v in m["lamina"].state_dict().items()}
        for name, m in models.items()
    }


def measure(args):
    """(cases, {(model, mode, batch): {(library, threads): median seconds, None where
    not run}}, libraries, {model: Agreement}, Probes with ``--jit``, else None); models
    that disagree with PyTorch are left out of the results, compiled models that fail
    or disagree with their eager ones are not run (``probe_compiled``).
    Every thread count of ``args.threads`` has runners of its own, and all of them are
    interleaved round by round, so that the scaling columns compare samples taken
    side by side."""
    import lamina as lm

    libs = [_lamina()]
    peer = None if args.no_torch else _torch()
    if peer is not None:
        libs.append(peer)
    cases = _cases(args)
    names = sorted({c.model for c in cases}, key=list(ARCHITECTURES).index)
    lm.random.seed(0)
    models, agreements = {}, {}
    for name in names:
        models[name] = {libs[0].name: build(ARCHITECTURES[name], libs[0])}
    states = _states(models)
    if peer is not None:
        for name in names:
            models[name]["torch"] = build(ARCHITECTURES[name], peer)
            copy_weights(models[name]["lamina"], models[name]["torch"])
            models[name]["torch"] = peer.model_to_layout(models[name]["torch"], args.layout)
            agreements[name] = check_agreement(name, models[name], libs, args.layout)
            print(agreements[name].message(), file=sys.stderr)
    cases = [c for c in cases if c.model not in agreements or agreements[c.model].ok]
    names = timed_libraries(args, [lib.name for lib in libs])
    probes = probe_compiled(args, states, cases, names) if args.jit else None
    refused = probes.refused() if probes else {}
    results = time_cases("convnet", names, states, cases, args, passes=args.passes, refused=refused)
    return cases, results, libs, agreements, probes


def timed_libraries(args, eager: list[str]) -> list[str]:
    """The eager libraries ``eager``, each followed with ``--jit`` by its compiler."""
    compilers = {e: c for c, e in COMPILED.items()} if args.jit else {}
    return [n for e in eager for n in (e, compilers.get(e)) if n]


def time_cases(
    module: str, names: list[str], states: dict, cases: list[Case], args, **extra
) -> dict:
    """{(model, mode, batch): {(library, threads): median seconds, None where not run}}
    of ``cases``, timed by the runners of bench ``module`` (its ``runner(library,
    config)``) for the libraries ``names``, with the models' weights ``states``
    (``save_states``) and ``extra`` added to the runners' config."""
    states = {name: state for name, state in states.items() if any(c.model == name for c in cases)}
    allocator = timing.allocator_wanted(args)
    with (
        tempfile.TemporaryDirectory(prefix=f"lamina-{module}-") as tmp,
        contextlib.ExitStack() as on,
    ):
        weights = os.path.join(tmp, "weights.npz")
        save_states(weights, states)
        runners = []
        for threads in args.threads:
            config = {
                "weights": weights,
                "layout": args.layout,
                "threads": threads,
                "allocator": allocator,
                "cases": [[c.model, c.mode, c.batch] for c in cases],
                **extra,
            }
            tag = f" {threads}t"
            runners += on.enter_context(timing.started(module, names, config, args.in_process, tag))
        samples = timing.time_rounds(runners, len(cases), args.rounds, args.settle)
    return {
        (c.model, c.mode, c.batch): {
            (n, t): _median(samples[c.model, c.mode, c.batch, f"{n} {t}t"])
            for n in names
            for t in args.threads
        }
        for c in cases
    }


def _median(samples: list) -> float | None:
    return None if None in samples else statistics.median(samples)


@dataclass
class Probes:
    """What fresh processes found of the compiled models (``probe_compiled``)."""

    batch: int  # of the agreement check and the compile times
    checks: dict  # {(start, library, model, mode): first_calls' result, None if it failed}
    memory_batch: int
    memory: dict  # {(library, model): step_memory's result, None if it failed}
    libraries: list[str]  # all timed, eager and compiled

    def check(self, library: str, model: str, mode: str) -> dict | None:
        """The cold start's result: its agreement check decides what is timed."""
        return self.checks["cold", library, model, mode]

    def refused(self) -> dict[str, list[list[str]]]:
        """{compiled library: [[model, mode] that failed or disagree with eager]}."""
        found = {}
        for start, library, model, mode in self.checks:
            check = self.check(library, model, mode)
            if start == "cold" and (check is None or not check.get("agrees")):
                found.setdefault(library, []).append([model, mode])
        return found


def probe_compiled(args, states: dict, cases: list[Case], names: list[str]) -> Probes:
    """Each compiled library's models checked against their eager ones and their compile
    times (``first_calls``), in a fresh process each, cold then warm (a second process
    after the first); and, where ``cases`` train, each library's memory of a training
    step at the largest batch (``step_memory``)."""
    pairs = list(dict.fromkeys((c.model, c.mode) for c in cases))
    compilers = [n for n in names if n in COMPILED]
    trained = list(dict.fromkeys(c.model for c in cases if c.mode == "train"))
    total = 2 * len(compilers) * len(pairs) + len(names) * len(trained)
    probes = Probes(min(args.batch), {}, max(args.batch), {}, names)
    with tempfile.TemporaryDirectory(prefix="lamina-convnet-") as tmp:
        weights = os.path.join(tmp, "weights.npz")
        save_states(weights, states)
        config = {
            "weights": weights,
            "layout": args.layout,
            "threads": args.threads[0],
            "allocator": timing.allocator_wanted(args),
            "passes": args.passes,
        }
        for start in ("cold", "warm"):
            for library in compilers:
                for model, mode in pairs:
                    timing.progress(len(probes.checks), total, f"{start} {library} {model} {mode}")
                    asked = {"library": library, "model": model, "mode": mode}
                    found = fresh("first_calls", {**config, **asked, "batch": probes.batch})
                    probes.checks[start, library, model, mode] = found
                    if start == "cold":
                        print(_check_message(library, model, mode, found), file=sys.stderr)
        refused = probes.refused()
        for model in trained:
            for library in names:
                if [model, "train"] in refused.get(library, []):
                    continue
                done = len(probes.checks) + len(probes.memory)
                timing.progress(done, total, f"memory {library} {model}")
                asked = {"library": library, "model": model, "batch": probes.memory_batch}
                probes.memory[library, model] = fresh("step_memory", {**config, **asked})
    timing.progress(total, total, "compiled models probed")
    return probes


def _check_message(library: str, model: str, mode: str, found: dict | None) -> str:
    """A line saying whether ``library``'s compiled ``model`` agrees with its eager one."""
    what = f"{library} {model} {mode}: "
    if found is None:
        return what + "NOT TIMED -- its process failed (its error is above)"
    if "error" in found:
        return what + f"NOT TIMED -- compiling or running it failed: {found['error']}"
    against = f"eager {eager_of(library)}"
    if found.get("layout"):  # Note [Agreement in either layout]
        against += f" run {'channels-last' if found['layout'] == 'NHWC' else 'channels-first'}"
    if found["agrees"]:
        return (
            what + f"agrees with {against} (worst: {found['worst']}, "
            f"{found['worst_ratio']:.2g} of the tolerance)"
        )
    loss = "" if found["loss"] is None else "loss {:.6g} vs {:.6g}; ".format(*found["loss"])
    return (
        what + f"NOT TIMED -- differs from {against}: {loss}worst {found['worst']!r} off by "
        f"{found['worst_abs']:.3g} ({found['worst_ratio']:.3g} times the tolerance)"
    )


# ---------------------------------------------------------------- reporting


def _columns(
    args, peer: bool, unit: str = "img/s", compiled: bool = False
) -> list[tuple[str, Callable]]:
    """(heading, cell(batch, one case's results)) of the table's measured columns: per
    thread count lamina's ``unit`` (items per second), and PyTorch's with lamina /
    PyTorch; with ``compiled``, each library's compiled model's beside it, with lamina
    compiled / eager and lamina compiled / torch.compile; with several thread counts,
    then each library's scaling from the first count to the last. A case a library did
    not run (None) has empty cells."""
    counts = args.threads
    libs = timed_libraries(
        SimpleNamespace(jit=compiled), ["lamina", "torch"] if peer else ["lamina"]
    )
    ratios = [("lamina", "torch")] if peer else []
    if compiled:
        ratios += [("lamina.jit", "lamina")] + ([("lamina.jit", "torch.compile")] if peer else [])
    several = len(counts) > 1

    def rate(lib, t):
        return lambda b, r: "" if r[lib, t] is None else f"{b / r[lib, t]:.1f}"

    def ratio(over, under, t):
        return lambda b, r: _times(r[under, t], r[over, t])

    def scaling(lib):
        return lambda b, r: _times(r[lib, counts[0]], r[lib, counts[-1]])

    columns = []
    for t in counts:
        at = f" {t}t" if several else f" {unit}"
        columns += [(f"{lib}{at}", rate(lib, t)) for lib in libs]
        columns += [
            (f"{over}/{under}{f' {t}t' if several else ''}", ratio(over, under, t))
            for over, under in ratios
        ]
    if several:
        for lib in libs:
            columns.append((f"{lib} {counts[-1]}t/{counts[0]}t", scaling(lib)))
    return columns


def _times(a: float | None, b: float | None) -> str:
    """a / b as "1.23x"; empty where either is missing."""
    return "" if a is None or b is None else f"{a / b:.2f}x"


# the models' names in titles (ARCHITECTURES' keys are what --model takes)
TITLES = {"alexnet": "AlexNet", "vgg": "VGG", "inception": "Inception-v1"}


def _models_title(args) -> str:
    """The models asked for, as titles name them: "AlexNet-like convnet", or for all
    three "AlexNet-, VGG- and Inception-v1-like convnets"."""
    names = [TITLES[m] for m in (ARCHITECTURES if args.model == "all" else [args.model])]
    if len(names) == 1:
        return f"{names[0]}-like convnet"
    return f"{'-, '.join(names[:-1])}- and {names[-1]}-like convnets"


def report(args, cases, results, libs, agreements, probes=None) -> str:
    peer = len(libs) > 1
    versions = " and ".join(f"{lib.name} {lib.version}" for lib in libs)
    threads = ", ".join(map(str, args.threads))
    lines = [] if peer else [output.without_torch(args)]
    lines += [
        f"{_models_title(args)} on {'x'.join(map(str, IMAGE))} float32 images, "
        f"{CLASSES} classes, layout {args.layout}, {threads} thread(s), images/s "
        f"(median of {args.rounds} rounds; {versions}"
        + (", interleaved" if peer or probes else "")
        + (", in this process" if args.in_process else ", each in its own process")
        + f"; lamina's pool allocator {args.allocator}"
        + (f"; lamina.jit's passes: {_passes_text(args.passes)}" if probes else "")
        + ")",
        "",
    ]
    columns = _columns(args, peer, compiled=probes is not None)
    head = ["model", "mode", "batch"] + [name for name, _ in columns]
    rows = []
    for c in cases:
        r = results[c.model, c.mode, c.batch]
        rows.append([c.model, c.mode, str(c.batch)] + [cell(c.batch, r) for _, cell in columns])
    if rows:
        lines += output.table(head, rows, left=2)
    else:
        lines.append("(nothing timed)")
    if peer:
        lines.append("")
        lines += [a.message() for a in agreements.values()]
        lines.append(tolerance_text(CHECK_BATCH))
    if probes:
        lines += compiled_report(args, probes)
    return "\n".join(lines)


def _passes_text(passes: list[str] | None) -> str:
    if passes is None:
        return "the default ones"
    return ", ".join(passes) or "none"


def _seconds(found: dict | None) -> str:
    """A compile time: the first compiled call's seconds minus the next ones'."""
    if found is None or "error" in found:
        return "failed"
    seconds = found["first"] - found["then"]
    return "<0.01" if seconds < 0.005 else f"{seconds:.2f}"  # below: the calls' noise


def _mib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**20:.1f}"


def compiled_report(args, probes: Probes) -> list[str]:
    """The report's lines on the compiled models: their agreement with the eager ones,
    their compile times and the memory of a training step."""
    compilers = list(dict.fromkeys(library for _, library, _, _ in probes.checks))
    pairs = list(dict.fromkeys((model, mode) for _, _, model, mode in probes.checks))
    lines = ["", "compiled models against their eager ones, before timing:"]
    lines += [
        _check_message(library, model, mode, probes.check(library, model, mode))
        for library in compilers
        for model, mode in pairs
    ]
    lines.append(
        f"(at batch {probes.batch} in float32; a training step's loss within rtol "
        f"{LOSS_TOLERANCE['rtol']:g} + atol {LOSS_TOLERANCE['atol']:g}, each gradient and "
        f"an inference's outputs within rtol {GRAD_TOLERANCE['rtol']:g} + atol "
        f"{GRAD_TOLERANCE['atol']:g} x its largest |value|)"
    )
    lines += [
        "",
        f"compile time, seconds: in a fresh process, at batch {probes.batch} on "
        f"{args.threads[0]} thread(s), the first compiled call minus the median of the next "
        "three, after two eager calls loaded the kernels; cold: the first such process, "
        "with the kernel and compiler caches as this machine has them (empty only the first "
        "time lamina.jit or TorchInductor compiles these models here), warm: a second "
        "process after it",
        "",
    ]
    head = ["model", "mode"] + [f"{c} {start}" for c in compilers for start in ("cold", "warm")]
    rows = [
        [model, mode]
        + [
            _seconds(probes.checks[start, c, model, mode])
            for c in compilers
            for start in ("cold", "warm")
        ]
        for model, mode in pairs
    ]
    lines += output.table(head, rows, left=2)
    if probes.memory:
        lines += _memory_report(probes)
    return lines


def _memory_report(probes: Probes) -> list[str]:
    libraries = probes.libraries
    models = list(dict.fromkeys(model for _, model in probes.memory))
    pooled = [n for n in libraries if eager_of(n) == "lamina"]
    lines = [
        "",
        f"memory of a training step at batch {probes.memory_batch}, MiB: pool, lamina's "
        "pool allocator's peak bytes in use during one step (after two) above those in "
        "use before it (lm.memory.stats(); arrays of at least its threshold, 128 KiB by "
        "default, at their size class); RSS, the increase of the process's peak resident "
        "memory over its first three steps (coarse: it includes loading the "
        "kernels and compiling, and PyTorch on the CPU has no allocator counter)",
        "",
    ]
    head = ["model"] + [f"{n} pool" for n in pooled] + [f"{n} RSS" for n in libraries]

    def cell(library, model, what):
        if (library, model) not in probes.memory:
            return "not run"  # the compiled model failed or disagrees
        found = probes.memory[library, model]
        return "failed" if found is None else _mib(found[what])

    rows = [
        [model]
        + [cell(n, model, "pool") for n in pooled]
        + [cell(n, model, "rss") for n in libraries]
        for model in models
    ]
    return lines + output.table(head, rows, left=1)


def tolerance_text(batch: int) -> str:
    """The report's line saying what agreeing with PyTorch means."""
    return (
        f"(agreement: one training step at batch {batch} in float64; loss within rtol "
        f"{LOSS_TOLERANCE['rtol']:g} + atol {LOSS_TOLERANCE['atol']:g}, each gradient "
        f"within rtol {GRAD_TOLERANCE['rtol']:g} + atol {GRAD_TOLERANCE['atol']:g} x "
        f"its largest |value|, or {ZERO_GRADIENT:g} x the model's largest if more)"
    )


def _json(args, cases, results, libs, agreements, probes=None) -> str:
    rows = []
    for c in cases:
        r = results[c.model, c.mode, c.batch]
        for t in args.threads:
            row = {"model": c.model, "mode": c.mode, "batch": c.batch, "threads": t}
            for name in dict.fromkeys(n for n, _ in r):  # None: not run
                row[f"{name}_seconds"] = r[name, t]
                row[f"{name}_images_per_second"] = r[name, t] and c.batch / r[name, t]
            rows.append(row)
    out = {
        "threads": args.threads,
        "layout": args.layout,
        "rounds": args.rounds,
        "processes": "one" if args.in_process else "one per library",
        "allocator": args.allocator,
        "versions": {lib.name: lib.version for lib in libs},
        "agreement": {
            name: {
                "ok": a.ok,
                "loss": list(a.loss),
                "worst_parameter": a.worst,
                "worst_ratio_to_tolerance": a.worst_ratio,
                "worst_abs_difference": a.worst_abs,
            }
            for name, a in agreements.items()
        },
        "tolerance": {
            "loss": LOSS_TOLERANCE,
            "gradient": GRAD_TOLERANCE,
            "gradient_scale_floor": ZERO_GRADIENT,
        },
        "results": rows,
    }
    if probes:
        out["compiled"] = {
            "passes": args.passes,
            "check_batch": probes.batch,
            "first_calls": [
                {
                    "start": start,
                    "library": library,
                    "model": model,
                    "mode": mode,
                    **(found or {"error": "its process failed"}),
                }
                for (start, library, model, mode), found in probes.checks.items()
            ],
            "memory_batch": probes.memory_batch,
            "memory_bytes": [
                {"library": library, "model": model, **(found or {"error": "its process failed"})}
                for (library, model), found in probes.memory.items()
            ],
        }
    return json.dumps(out, indent=2)


def plot(path, args, cases, results, libs) -> None:
    """images/s as grouped bars (``draw_rates``), with ``--jit`` the compiled models'
    beside their libraries'."""
    title = (
        f"{_models_title(args)}: images/s, {{libraries}}\n"
        f"{'x'.join(map(str, IMAGE))} float32 images, layout {args.layout}, "
        f"median of {args.rounds} rounds"
    )
    versions = {lib.name: lib.version for lib in libs}
    drawn = [
        SimpleNamespace(name=n, version=versions[eager_of(n)])
        for n in timed_libraries(args, list(versions))
    ]
    draw_rates(path, cases, results, drawn, args.batch, args.threads, "images/s", title)


def draw_rates(path, cases, results, libs, batches, threads, unit: str, title: str) -> None:
    """Items per second (``unit``) as grouped bars: a group per model and mode, in it a
    bar per library and batch size (a colour per library, darker for larger batches), a
    panel per thread count; ``title`` with the libraries' names put in for
    ``{libraries}``."""
    plt = output.pyplot()
    groups = list(dict.fromkeys((c.model, c.mode) for c in cases))
    if not groups:
        raise SystemExit("--plot: nothing was timed, so there is nothing to plot")
    maps = {
        "lamina": plt.cm.Blues,
        "lamina.jit": plt.cm.Greens,
        "torch": plt.cm.Oranges,
        "torch.compile": plt.cm.Reds,
    }
    names = {
        lib.name: f"{'PyTorch' if lib.name == 'torch' else lib.name} {lib.version}" for lib in libs
    }
    bars = [(lib.name, b) for b in batches for lib in libs]
    width = 0.8 / len(bars)
    fig, axes = plt.subplots(
        len(threads),
        1,
        figsize=(max(7.0, 0.3 * len(groups) * len(bars) + 3), 1.2 + 3.6 * len(threads)),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    rates = [c.batch / s for c in cases for s in results[c.model, c.mode, c.batch].values() if s]
    for ax, t in zip(axes[:, 0], threads):
        for i, (lib, b) in enumerate(bars):
            shade = 0.45 + 0.45 * batches.index(b) / max(1, len(batches) - 1)
            xs = [g + (i - (len(bars) - 1) / 2) * width for g in range(len(groups))]
            seconds = [results[m, mode, b][lib, t] for m, mode in groups]
            ys = [math.nan if s is None else b / s for s in seconds]  # None: not run
            drawn = ax.bar(xs, ys, width, color=maps[lib](shade), label=f"{names[lib]}, batch {b}")
            labels = ["" if math.isnan(y) else f"{y:.0f}" for y in ys]
            ax.bar_label(drawn, labels, fontsize=7, rotation=90, padding=2)
        # a log scale keeps equal ratios equally tall across models whose rates differ by
        # decades; its bottom is set below the lowest bar, which would otherwise vanish,
        # its top leaves room for the value labels
        ax.set_yscale("log")
        ax.set_ylim(min(rates) / 3, max(rates) * 4)
        # 50, 100, 200, 500 ...: a decade alone leaves two labels on a narrow range
        ax.yaxis.set_major_locator(plt.LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")  # 100, not 10^2
        ax.set_ylabel(f"{unit} (log scale)")
        ax.set_title(f"{t} thread{'s' if t > 1 else ''}")
        ax.grid(axis="y", which="major", alpha=0.3)
    axes[-1, 0].set_xticks(range(len(groups)), [f"{m}\n{mode}" for m, mode in groups])
    axes[-1, 0].set_xlabel("model and mode (train: forward, backward, SGD step; infer: forward)")
    axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.suptitle(title.format(libraries=" beside ".join(names[lib.name] for lib in libs)))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _counts(option: str, example: str) -> Callable[[str], list[int]]:
    """The parser of a comma-separated list of positive whole numbers."""

    def parse(text: str) -> list[int]:
        try:
            counts = [int(b) for b in text.split(",") if b.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{option}: expected numbers like {example}, got {text!r}"
            ) from None
        if not counts or min(counts) < 1:
            raise argparse.ArgumentTypeError(f"{option}: numbers must be positive, got {text!r}")
        if len(set(counts)) < len(counts):
            raise argparse.ArgumentTypeError(f"{option}: each number once, got {text!r}")
        return counts

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=[*ARCHITECTURES, "all"], default="all")
    p.add_argument("--mode", choices=["train", "infer", "both"], default="both")
    p.add_argument(
        "--batch", type=_counts("--batch", "1,8,32"), default=[8, 32], help="batch sizes (8,32)"
    )
    p.add_argument(
        "--threads",
        type=_counts("--threads", "1,2"),
        default=[2],
        help="threads of both libraries (2); several (1,2) add each library's scaling",
    )
    p.add_argument("--layout", choices=["NCHW", "NHWC"], default="NCHW")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    timing.add_allocator_option(p)
    timing.add_library_options(p)
    p.add_argument(
        "--jit",
        action="store_true",
        help="add each library's compiled models (lm.jit.compile, torch.compile): images/s, "
        "compile times and the memory of a training step",
    )
    p.add_argument(
        "--passes",
        type=_passes,
        default=None,
        help="with --jit, lamina.jit's graph passes, comma-separated, in order (default: "
        "its default ones; '' for none), to measure one pass's effect",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw images/s per model and mode as bars, lamina beside PyTorch",
    )


def _passes(text: str) -> list[str]:
    """The parser of ``--passes``: names of lamina.jit's graph passes."""
    from lamina.jit import passes

    names = [name.strip() for name in text.split(",") if name.strip()]
    try:
        passes.check(names)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--passes: {error}") from None
    return names


def run(args) -> None:
    if args.rounds < 1:
        raise SystemExit("--rounds must be positive")
    if args.in_process and len(args.threads) > 1:
        raise SystemExit("--in-process times one thread count: a library's is process-wide")
    if args.passes is not None and not args.jit:
        raise SystemExit("--passes chooses lamina.jit's passes: it needs --jit")
    if args.plot:
        output.pyplot()  # fail before measuring, not after
    measured = measure(args)
    if args.json:
        if len(measured[2]) == 1:
            print(output.without_torch(args), file=sys.stderr)  # stdout stays JSON
        print(_json(args, *measured))
    else:
        print(report(args, *measured))
    if args.plot:
        plot(args.plot, args, *measured[:3])
