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
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

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
    ok = _ratio(np.float64(loss), np.float64(loss_ref), **LOSS_TOLERANCE) <= 1
    worst, worst_ratio, worst_abs = "", -1.0, 0.0
    largest = max((float(np.max(np.abs(g), initial=0.0)) for g in ref.values()), default=0.0)
    for n, g_ref in ref.items():
        g = mine.get(n)
        if g is None or g.shape != g_ref.shape:
            return Agreement(name, False, (loss, loss_ref), n, float("inf"), float("inf"))
        scale = max(float(np.max(np.abs(g_ref), initial=0.0)), ZERO_GRADIENT * largest, 1e-30)
        atol = GRAD_TOLERANCE["atol"] * scale
        r = _ratio(g, g_ref, GRAD_TOLERANCE["rtol"], atol)
        if r > worst_ratio:
            worst, worst_ratio = n, r
            worst_abs = float(np.max(np.abs(g - g_ref)))
    return Agreement(name, ok and worst_ratio <= 1, (loss, loss_ref), worst, worst_ratio, worst_abs)


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
    rng = np.random.default_rng(batch)
    x = lib.to_layout(lib.tensor(rng.standard_normal((batch, *IMAGE), dtype=np.float32)), layout)
    return run_step(lib, model, mode, x, lib.tensor(rng.integers(0, CLASSES, batch)))


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
    the models of the weights file ``config["weights"]`` (``save_states``), on
    ``config["threads"]`` threads until the runner closes."""
    lib = _lamina() if library == "lamina" else _torch()
    layout = config["layout"]
    models = models_of(lib, load_states(config["weights"]), layout)
    cases = {
        (m, mode, batch): functools.partial(step, lib, models[m], mode, batch, layout)
        for m, mode, batch in config["cases"]
    }
    undo = timing.apply_settings(library, config, lib.get_threads, lib.set_threads)
    return timing.Runner(library, cases, target=0.05, most=20, on_close=undo)


def _states(models: dict) -> dict:
    """{model name: {parameter or buffer name: NumPy array}} of the lamina models."""
    return {
        name: {k: v.numpy().copy() for k, v in m["lamina"].state_dict().items()}
        for name, m in models.items()
    }


def measure(args):
    """(cases, {(model, mode, batch): {(library, threads): median seconds}}, libraries,
    {model: Agreement}); models that disagree with PyTorch are left out of the results.
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
    results = time_cases("convnet", [lib.name for lib in libs], states, cases, args)
    return cases, results, libs, agreements


def time_cases(module: str, names: list[str], states: dict, cases: list[Case], args) -> dict:
    """{(model, mode, batch): {(library, threads): median seconds}} of ``cases``, timed
    by the runners of bench ``module`` (its ``runner(library, config)``) for the
    libraries ``names``, with the models' weights ``states`` (``save_states``)."""
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
            }
            tag = f" {threads}t"
            runners += on.enter_context(timing.started(module, names, config, args.in_process, tag))
        samples = timing.time_rounds(runners, len(cases), args.rounds, args.settle)
    return {
        (c.model, c.mode, c.batch): {
            (n, t): statistics.median(samples[c.model, c.mode, c.batch, f"{n} {t}t"])
            for n in names
            for t in args.threads
        }
        for c in cases
    }


# ---------------------------------------------------------------- reporting


def _columns(args, peer: bool, unit: str = "img/s") -> list[tuple[str, Callable]]:
    """(heading, cell(batch, one case's results)) of the table's measured columns: per
    thread count lamina's ``unit`` (items per second), and PyTorch's with lamina /
    PyTorch; with several thread counts, then each library's scaling from the first
    count to the last."""
    counts, libs = args.threads, ["lamina", "torch"] if peer else ["lamina"]
    several = len(counts) > 1

    def rate(lib, t):
        return lambda b, r: f"{b / r[lib, t]:.1f}"

    def ratio(t):
        return lambda b, r: f"{r['torch', t] / r['lamina', t]:.2f}x"

    def scaling(lib):
        return lambda b, r: f"{r[lib, counts[0]] / r[lib, counts[-1]]:.2f}x"

    columns = []
    for t in counts:
        at = f" {t}t" if several else f" {unit}"
        columns.append((f"lamina{at}", rate("lamina", t)))
        if peer:
            columns.append((f"torch{at}", rate("torch", t)))
            columns.append((f"lamina/torch{f' {t}t' if several else ''}", ratio(t)))
    if several:
        for lib in libs:
            columns.append((f"{lib} {counts[-1]}t/{counts[0]}t", scaling(lib)))
    return columns


# the models' names in titles (ARCHITECTURES' keys are what --model takes)
TITLES = {"alexnet": "AlexNet", "vgg": "VGG", "inception": "Inception-v1"}


def _models_title(args) -> str:
    """The models asked for, as titles name them: "AlexNet-like convnet", or for all
    three "AlexNet-, VGG- and Inception-v1-like convnets"."""
    names = [TITLES[m] for m in (ARCHITECTURES if args.model == "all" else [args.model])]
    if len(names) == 1:
        return f"{names[0]}-like convnet"
    return f"{'-, '.join(names[:-1])}- and {names[-1]}-like convnets"


def report(args, cases, results, libs, agreements) -> str:
    peer = len(libs) > 1
    versions = " and ".join(f"{lib.name} {lib.version}" for lib in libs)
    threads = ", ".join(map(str, args.threads))
    lines = [] if peer else [output.without_torch(args)]
    lines += [
        f"{_models_title(args)} on {'x'.join(map(str, IMAGE))} float32 images, "
        f"{CLASSES} classes, layout {args.layout}, {threads} thread(s), images/s "
        f"(median of {args.rounds} rounds; {versions}"
        + (", interleaved" if peer else "")
        + (", in this process" if args.in_process else ", each in its own process")
        + f"; lamina's pool allocator {args.allocator})",
        "",
    ]
    columns = _columns(args, peer)
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
    return "\n".join(lines)


def tolerance_text(batch: int) -> str:
    """The report's line saying what agreeing with PyTorch means."""
    return (
        f"(agreement: one training step at batch {batch} in float64; loss within rtol "
        f"{LOSS_TOLERANCE['rtol']:g} + atol {LOSS_TOLERANCE['atol']:g}, each gradient "
        f"within rtol {GRAD_TOLERANCE['rtol']:g} + atol {GRAD_TOLERANCE['atol']:g} x "
        f"its largest |value|, or {ZERO_GRADIENT:g} x the model's largest if more)"
    )


def _json(args, cases, results, libs, agreements) -> str:
    rows = []
    for c in cases:
        r = results[c.model, c.mode, c.batch]
        for t in args.threads:
            row = {"model": c.model, "mode": c.mode, "batch": c.batch, "threads": t}
            for lib in libs:
                row[f"{lib.name}_seconds"] = r[lib.name, t]
                row[f"{lib.name}_images_per_second"] = c.batch / r[lib.name, t]
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
    return json.dumps(out, indent=2)


def plot(path, args, cases, results, libs) -> None:
    """images/s as grouped bars (``draw_rates``)."""
    title = (
        f"{_models_title(args)}: images/s, {{libraries}}\n"
        f"{'x'.join(map(str, IMAGE))} float32 images, layout {args.layout}, "
        f"median of {args.rounds} rounds"
    )
    draw_rates(path, cases, results, libs, args.batch, args.threads, "images/s", title)


def draw_rates(path, cases, results, libs, batches, threads, unit: str, title: str) -> None:
    """Items per second (``unit``) as grouped bars: a group per model and mode, in it a
    bar per library and batch size (a colour per library, darker for larger batches), a
    panel per thread count; ``title`` with the libraries' names put in for
    ``{libraries}``."""
    plt = output.pyplot()
    groups = list(dict.fromkeys((c.model, c.mode) for c in cases))
    if not groups:
        raise SystemExit("--plot: nothing was timed, so there is nothing to plot")
    maps = {"lamina": plt.cm.Blues, "torch": plt.cm.Oranges}
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
    rates = [c.batch / s for c in cases for s in results[c.model, c.mode, c.batch].values()]
    for ax, t in zip(axes[:, 0], threads):
        for i, (lib, b) in enumerate(bars):
            shade = 0.45 + 0.45 * batches.index(b) / max(1, len(batches) - 1)
            xs = [g + (i - (len(bars) - 1) / 2) * width for g in range(len(groups))]
            ys = [b / results[m, mode, b][lib, t] for m, mode in groups]
            drawn = ax.bar(xs, ys, width, color=maps[lib](shade), label=f"{names[lib]}, batch {b}")
            ax.bar_label(drawn, [f"{y:.0f}" for y in ys], fontsize=7, rotation=90, padding=2)
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
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw images/s per model and mode as bars, lamina beside PyTorch",
    )


def run(args) -> None:
    if args.rounds < 1:
        raise SystemExit("--rounds must be positive")
    if args.in_process and len(args.threads) > 1:
        raise SystemExit("--in-process times one thread count: a library's is process-wide")
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
