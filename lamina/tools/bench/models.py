"""ResNet-18, MobileNet v2 and a Transformer encoder, lamina beside PyTorch.

The reference models of modern vision and language work, at sizes 2 cores train:

* ResNet-18 (basic blocks, [2, 2, 2, 2]), 100 classes: ``resnet18_cifar`` on 32 x 32
  images with the CIFAR stem (3 x 3 convolution, stride 1, no max pooling),
  ``resnet18`` on 64 x 64 images with the ImageNet stem (7 x 7 stride-2 convolution,
  3 x 3 stride-2 max pooling);
* ``mobilenet_v2``: MobileNet v2, width 1.0 (inverted residual blocks expanding 6
  times, depthwise 3 x 3 convolutions as convolutions of one group per channel, ReLU6),
  on 64 x 64 images, 100 classes;
* ``transformer``: a Transformer encoder classifier: token embedding (vocabulary
  1000, width 256) plus a learned position embedding, 6 encoder layers (4 heads,
  feed-forward width 1024, GELU, dropout 0, batch first), mean pooling over the
  sequence, a linear layer to 10 classes; sequences of 128 tokens.

Each model is written once (``MODELS``) and built with lamina.nn and, when it is
importable, torch.nn; PyTorch gets lamina's initial weights (copied by name) and the
same inputs. As in ``bench convnet`` (lamina.tools.bench.convnet, whose checking and
timing this reuses), one training step's loss and every gradient must agree with
PyTorch's before the model is timed; then training steps (forward, cross-entropy
loss, backward, SGD step) and inference (evaluation mode, no gradients) are timed for
every batch size and thread count, each library in a child process of its own, all
interleaved round by round, and reported as items (images or sequences) per second,
medians, with lamina / PyTorch. A model that needs a layer lamina lacks is reported
as not run, naming the layer; the other models are timed.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import convnet, output, timing
from .convnet import Case, Lib

CHECK_BATCH = 4  # the agreement check's batch (batch norm needs more than one image)


class MissingLayer(Exception):
    """A layer a model needs that the library does not have."""


class _Layers:
    """A library's ``nn`` namespace whose missing layers raise ``MissingLayer``."""

    def __init__(self, nn):
        self._nn = nn

    def __getattr__(self, name):
        try:
            return getattr(self._nn, name)
        except AttributeError:
            raise MissingLayer(name) from None


def _conv_bn(nn, c_in, c_out, kernel, stride=1, groups=1, activation=None) -> list:
    """A convolution without bias (batch normalization follows, which would cancel it),
    batch normalization and, when given, the activation module class."""
    conv = nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False)
    return [conv, nn.BatchNorm2d(c_out)] + ([activation()] if activation else [])


def _resnet18(lib: Lib, spec: Model, imagenet_stem: bool):
    """ResNet-18 as torchvision builds it; the CIFAR stem keeps the input's size."""
    nn = _Layers(lib.nn)

    class BasicBlock(nn.Module):
        def __init__(self, c_in, c_out, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(c_out)
            self.relu = nn.ReLU()
            self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(c_out)
            self.downsample = None
            if stride != 1 or c_in != c_out:
                self.downsample = nn.Sequential(*_conv_bn(nn, c_in, c_out, 1, stride))

        def forward(self, x):
            shortcut = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + shortcut)

    if imagenet_stem:
        stem = _conv_bn(nn, 3, 64, 7, 2, activation=nn.ReLU) + [nn.MaxPool2d(3, 2, 1)]
    else:
        stem = _conv_bn(nn, 3, 64, 3, 1, activation=nn.ReLU)
    stages, c_in = [], 64
    for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        stages.append(nn.Sequential(BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)))
        c_in = c_out
    head = [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, spec.classes)]
    return nn.Sequential(*stem, *stages, *head)


# MobileNet v2's inverted residual stages: (expansion, channels, blocks, first stride)
MOBILENET_V2_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def _mobilenet_v2(lib: Lib, spec: Model):
    """MobileNet v2 (width 1.0) as torchvision builds it, without the dropout before
    the classifier (the agreement check needs both libraries to compute the same)."""
    nn = _Layers(lib.nn)

    class InvertedResidual(nn.Module):
        def __init__(self, c_in, c_out, stride, expansion):
            super().__init__()
            hidden = c_in * expansion
            expand = [] if expansion == 1 else _conv_bn(nn, c_in, hidden, 1, activation=nn.ReLU6)
            depthwise = _conv_bn(nn, hidden, hidden, 3, stride, hidden, activation=nn.ReLU6)
            project = _conv_bn(nn, hidden, c_out, 1)
            self.conv = nn.Sequential(*expand, *depthwise, *project)
            self.residual = stride == 1 and c_in == c_out

        def forward(self, x):
            return x + self.conv(x) if self.residual else self.conv(x)

    layers, c_in = _conv_bn(nn, 3, 32, 3, 2, activation=nn.ReLU6), 32
    for expansion, c_out, blocks, stride in MOBILENET_V2_STAGES:
        for i in range(blocks):
            layers.append(InvertedResidual(c_in, c_out, stride if i == 0 else 1, expansion))
            c_in = c_out
    layers += _conv_bn(nn, c_in, 1280, 1, activation=nn.ReLU6)
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, spec.classes)]
    return nn.Sequential(*layers)


def _transformer(lib: Lib, spec: Model):
    """Token and learned position embeddings, a Transformer encoder, mean pooling over
    the sequence and a linear classifier."""
    nn = _Layers(lib.nn)
    width, heads, feedforward, layers = 256, 4, 1024, 6
    (sequence,), vocabulary, classes = spec.input, spec.vocabulary, spec.classes

    class TransformerClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(vocabulary, width)
            self.position = nn.Parameter(lib.tensor(np.zeros((sequence, width), np.float32)))
            nn.init.normal_(self.position, std=0.02)
            layer = nn.TransformerEncoderLayer(
                width, heads, feedforward, dropout=0.0, activation="gelu", batch_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, layers)
            self.head = nn.Linear(width, classes)

        def forward(self, tokens):
            x = self.encoder(self.embedding(tokens) + self.position)
            return self.head(x.mean(dim=1))

    return TransformerClassifier()


@dataclass(frozen=True)
class Model:
    """A reference model: how to build it in a library, and its inputs."""

    build: Callable  # build(lib, this Model) -> the model
    input: tuple  # one item's shape: an image (C, H, W) or a sequence (length,)
    classes: int
    vocabulary: int = 0  # token ids in [0, vocabulary) when the input is a sequence

    def inputs(self, rng, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """A batch of inputs and their classes, NumPy arrays (images float32)."""
        if self.vocabulary:
            x = rng.integers(0, self.vocabulary, (batch, *self.input))
        else:
            x = rng.standard_normal((batch, *self.input), dtype=np.float32)
        return x, rng.integers(0, self.classes, batch)

    def tensor(self, lib: Lib, x: np.ndarray, layout: str):
        """``x`` as the model's input in ``lib``: images in ``layout``."""
        return lib.tensor(x) if self.vocabulary else lib.to_layout(lib.tensor(x), layout)

    def make(self, lib: Lib, layout: str):
        """The model in ``lib``, float32, in ``layout`` (images only)."""
        model = self.build(lib, self).float()
        return model if self.vocabulary else lib.model_to_layout(model, layout)


MODELS = {
    "resnet18_cifar": Model(functools.partial(_resnet18, imagenet_stem=False), (3, 32, 32), 100),
    "resnet18": Model(functools.partial(_resnet18, imagenet_stem=True), (3, 64, 64), 100),
    "mobilenet_v2": Model(_mobilenet_v2, (3, 64, 64), 100),
    "transformer": Model(_transformer, (128,), 10, vocabulary=1000),
}


# ---------------------------------------------------------------- checking


@dataclass
class NotRun:
    """A model lamina could not build or run: not checked, not timed."""

    model: str
    reason: str
    ok = False

    def message(self) -> str:
        return f"{self.model}: NOT RUN -- {self.reason}"


def _failure(error: Exception) -> str:
    if isinstance(error, MissingLayer):
        return f"lamina.nn has no {error.args[0]} layer"
    return f"lamina failed: {type(error).__name__}: {error}"


def check(name: str, libs: list[Lib], layout: str, batch: int = CHECK_BATCH):
    """({library: the model}, its Agreement with PyTorch -- None without PyTorch), or
    (None, NotRun) when lamina cannot build or train it. The lamina model is built
    first, from lamina's random generator; PyTorch's gets its weights."""
    spec = MODELS[name]
    x, y = spec.inputs(np.random.default_rng(1), batch)
    if not spec.vocabulary:
        x = x.astype(np.float64)  # compare_step runs in float64
    try:
        models = {"lamina": spec.make(libs[0], layout)}
        if len(libs) == 1:  # still run a training step: a model that fails is not timed
            step(libs[0], models["lamina"], "train", batch, layout, name)()
            return models, None
        models["torch"] = spec.make(libs[1], layout)
        unknown = set(models["torch"].state_dict()) ^ set(models["lamina"].state_dict())
        if unknown:
            names = ", ".join(sorted(unknown)[:4])
            return None, NotRun(name, f"its parameters are named unlike PyTorch's: {names}")
        convnet.copy_weights(models["lamina"], models["torch"])
        agreement = convnet.compare_step(
            name, models, libs, lambda lib: spec.tensor(lib, x, layout), y
        )
    except Exception as error:  # one model's failure must not stop the others
        return None, NotRun(name, _failure(error))
    return models, agreement


# ---------------------------------------------------------------- measuring


def step(lib: Lib, model, mode: str, batch: int, layout: str, name: str) -> Callable:
    """One training step or inference (convnet.run_step) of ``batch`` items, the same
    in every process (the random generator starts from the batch size)."""
    spec = MODELS[name]
    x, y = spec.inputs(np.random.default_rng(batch), batch)
    return convnet.run_step(lib, model, mode, spec.tensor(lib, x, layout), lib.tensor(y))


def runner(library: str, config: dict) -> timing.Runner:
    """One library's cases (Note [Separate processes] in lamina.tools.bench.timing):
    the models of the weights file ``config["weights"]``, on ``config["threads"]``
    threads until the runner closes."""
    lib = convnet._lamina() if library == "lamina" else convnet._torch()
    layout = config["layout"]
    models = {}
    for name, state in convnet.load_states(config["weights"]).items():
        for mode in ("train", "infer"):  # Note [Inference models] in convnet.py
            models[name, mode] = MODELS[name].make(lib, layout)
            models[name, mode].load_state_dict({k: lib.tensor(a.copy()) for k, a in state.items()})
    cases = {
        (m, mode, batch): functools.partial(step, lib, models[m, mode], mode, batch, layout, m)
        for m, mode, batch in config["cases"]
    }
    undo = timing.apply_settings(library, config, lib.get_threads, lib.set_threads)
    return timing.Runner(library, cases, target=0.05, most=20, on_close=undo)


def measure(args):
    """(cases, {(model, mode, batch): {(library, threads): median seconds}}, libraries,
    {model: Agreement, NotRun or None}); models that lamina cannot run or that disagree
    with PyTorch are left out of the results."""
    import lamina as lm

    libs = [convnet._lamina()]
    peer = None if args.no_torch else convnet._torch()
    if peer is not None:
        libs.append(peer)
    states, verdicts = {}, {}
    for name in args.models:
        lm.random.seed(0)
        models, verdicts[name] = check(name, libs, args.layout)
        if verdicts[name] is not None:
            print(verdicts[name].message(), file=sys.stderr)
        if models is not None:
            states[name] = {k: v.numpy().copy() for k, v in models["lamina"].state_dict().items()}
    cases = [
        Case(m, mode, b)
        for m in args.models
        for mode in args.modes
        for b in args.batches
        if m in states and (verdicts[m] is None or verdicts[m].ok)
    ]
    results = convnet.time_cases("models", [lib.name for lib in libs], states, cases, args)
    return cases, results, libs, verdicts


# ---------------------------------------------------------------- reporting


def _input(name: str) -> str:
    spec = MODELS[name]
    return f"{spec.input[0]} tokens" if spec.vocabulary else "x".join(map(str, spec.input))


def report(args, cases, results, libs, verdicts) -> str:
    peer = len(libs) > 1
    versions = " and ".join(f"{lib.name} {lib.version}" for lib in libs)
    threads = ", ".join(map(str, args.threads))
    lines = [] if peer else [output.without_torch(args)]
    lines += [
        "Reference models, training step (forward, cross-entropy, backward, SGD) and "
        f"inference: items (images or sequences) per second, float32, {threads} thread(s), "
        f"image layout {args.layout} (median of {args.rounds} rounds; {versions}"
        + (", interleaved" if peer else "")
        + (", in this process" if args.in_process else ", each in its own process")
        + f"; lamina's pool allocator {args.allocator})",
        "",
    ]
    columns = convnet._columns(args, peer, unit="items/s")
    head = ["model", "input", "mode", "batch"] + [heading for heading, _ in columns]
    rows = [
        [c.model, _input(c.model), c.mode, str(c.batch)]
        + [cell(c.batch, results[c.model, c.mode, c.batch]) for _, cell in columns]
        for c in cases
    ]
    lines += output.table(head, rows, left=3) if rows else ["(nothing timed)"]
    messages = [v.message() for v in verdicts.values() if v is not None]
    if messages:
        lines += ["", *messages]
    if peer and any(isinstance(v, convnet.Agreement) for v in verdicts.values()):
        lines.append(convnet.tolerance_text(CHECK_BATCH))
    return "\n".join(lines)


def _verdict_json(v) -> dict | None:
    if isinstance(v, NotRun):
        return {"ok": False, "not_run": v.reason}
    if v is None:
        return None
    return {
        "ok": v.ok,
        "loss": list(v.loss),
        "worst_parameter": v.worst,
        "worst_ratio_to_tolerance": v.worst_ratio,
        "worst_abs_difference": v.worst_abs,
    }


def _json(args, cases, results, libs, verdicts) -> str:
    rows = []
    for c in cases:
        r = results[c.model, c.mode, c.batch]
        for t in args.threads:
            row = {"model": c.model, "mode": c.mode, "batch": c.batch, "threads": t}
            for lib in libs:
                row[f"{lib.name}_seconds"] = r[lib.name, t]
                row[f"{lib.name}_items_per_second"] = c.batch / r[lib.name, t]
            rows.append(row)
    out = {
        "threads": args.threads,
        "layout": args.layout,
        "rounds": args.rounds,
        "processes": "one" if args.in_process else "one per library",
        "allocator": args.allocator,
        "versions": {lib.name: lib.version for lib in libs},
        "inputs": {name: _input(name) for name in args.models},
        "agreement": {name: _verdict_json(v) for name, v in verdicts.items()},
        "tolerance": {
            "loss": convnet.LOSS_TOLERANCE,
            "gradient": convnet.GRAD_TOLERANCE,
            "gradient_scale_floor": convnet.ZERO_GRADIENT,
        },
        "results": rows,
    }
    return json.dumps(out, indent=2)


def plot(path, args, cases, results, libs) -> None:
    title = (
        "Reference models: items (images or sequences) per second, {libraries}\n"
        f"float32, image layout {args.layout}, median of {args.rounds} rounds"
    )
    convnet.draw_rates(path, cases, results, libs, args.batches, args.threads, "items/s", title)


# ---------------------------------------------------------------- the command

# the settings of a full run, and of a first look (--quick); options given win
FULL = {"batches": [1, 8, 32], "threads": [1, 2], "rounds": 5}
QUICK = {"batches": [1, 8], "threads": [1], "rounds": 2}


def _models(text: str) -> list[str]:
    names = list(MODELS) if text == "all" else [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--models: expected 'all' or some of {', '.join(MODELS)}, got {text!r}"
        )
    return list(dict.fromkeys(names))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models",
        type=_models,
        default=list(MODELS),
        help=f"comma-separated, of {', '.join(MODELS)} (all)",
    )
    p.add_argument(
        "--modes",
        choices=["train", "infer", "both"],
        default="both",
        help="training steps, inference or both (both)",
    )
    p.add_argument(
        "--batches",
        type=convnet._counts("--batches", "1,8,32"),
        help="batch sizes (1,8,32; --quick: 1,8)",
    )
    p.add_argument(
        "--threads",
        type=convnet._counts("--threads", "1,2"),
        help="threads of both libraries (1,2; --quick: 1); several add each library's scaling",
    )
    p.add_argument("--rounds", type=int, help="interleaved rounds (5; --quick: 2)")
    p.add_argument(
        "--quick", action="store_true", help="a first look: batches 1,8, one thread, 2 rounds"
    )
    p.add_argument("--layout", choices=["NCHW", "NHWC"], default="NCHW", help="of the images")
    timing.add_allocator_option(p)
    timing.add_library_options(p)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw items/s per model and mode as bars")


def run(args) -> None:
    for option, value in (QUICK if args.quick else FULL).items():
        if getattr(args, option) is None:
            setattr(args, option, value)
    args.modes = ["train", "infer"] if args.modes == "both" else [args.modes]
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
