"""Convolution, pooling, LRN, batch norm and activation primitives beside PyTorch.

Times the primitives of AlexNet-, VGG- and Inception-v1-like convnets -- conv2d
(forward, and forward + backward for data and weight), max and average pooling, local
response normalization, batch normalization in training and relu -- on an
Inception-v1-sized 16 x 64 x 56 x 56 float32 input, in both memory layouts (NCHW and
channels-last), and those of ``bench models``' ResNet, MobileNet v2 and Transformer
at their sizes (named in each row: depthwise convolution, layer normalization,
embedding, scaled dot-product attention, GELU and SiLU; a primitive lamina lacks is
named and left out), with lamina and -- when it is importable -- PyTorch on the same number
of threads, each library in a child process of its own (Note [Separate processes] in
lamina.tools.bench.timing; ``--in-process`` times them in this one), round after round
(each round runs every case of lamina, then of PyTorch, so a slow phase of a shared
machine slows both); reports medians, lamina / PyTorch, lamina's goal for each row,
and GFLOP/s for the convolutions; ``--plot`` draws lamina / PyTorch per primitive.
Without PyTorch it reports lamina alone. lamina runs with its pool allocator on
(``--allocator off`` to measure without), as in ``bench convnet``: without it, a
forward + backward call's fresh 12.8 MB gradients took ~1,100 page faults (relu:
3.6-7.7 ms a call instead of 1.2).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import output, timing


@dataclass
class Case:
    name: str
    layout: str
    goal: float | None  # the lamina / PyTorch time lamina aims for (None: no goal)
    flops: float | None  # per call, for GFLOP/s
    make: Callable  # make(lib, inputs) -> a function running one call
    needs: str = ""  # the functional the case calls, where lamina may lack it


def _conv_flops(n, c, h, w, c_out, k):
    return 2.0 * n * h * w * c_out * c * k * k  # padding 1, stride 1: output h x w


def _cases(shape):
    """The cases, with lamina's goals: conv2d against PyTorch in the same layout, the
    other primitives against PyTorch's NCHW figures, the table the goals were set by."""
    n, c, h, w = shape
    conv = _conv_flops(n, c, h, w, c, 3)
    cases = []
    for layout in ("NCHW", "NHWC"):
        nchw = layout == "NCHW"
        cases += [
            Case("conv2d 3x3 pad 1, forward", layout, 1.0, conv, _conv),
            Case("conv2d forward + backward", layout, 1.2, 3 * conv, _conv_backward),
            Case(
                "max_pool2d 3x3 stride 2",
                layout,
                0.5 if nchw else None,
                None,
                _call("max_pool2d", 3, 2),
            ),
            Case(
                "avg_pool2d 3x3 stride 2",
                layout,
                1.0 if nchw else None,
                None,
                _call("avg_pool2d", 3, 2),
            ),
            Case(
                "local_response_norm 5",
                layout,
                0.3 if nchw else None,
                None,
                _call("local_response_norm", 5),
            ),
            Case("batch_norm, training", layout, 1.0 if nchw else None, None, _batch_norm),
            Case("relu", layout, 1.0 if nchw else None, None, _call("relu")),
            Case("relu forward + backward", layout, None, None, _call("relu", backward=True)),
        ]
    return cases


def _selected_cases(shape, primitives: str):
    """The cases of ``--primitives``: the convnets' on ``shape``, the models', or all."""
    return (_cases(shape) if primitives != "models" else []) + (
        _model_cases() if primitives != "convnets" else []
    )


MODEL_GOAL = 1.2  # lamina / PyTorch time for the primitives of bench models


def _model_cases(batch=16):
    """The primitives of ``bench models``' networks at their sizes, for ``batch``
    images or sequences: MobileNet v2's depthwise 3 x 3 convolution at 56 x 56 with 144
    channels, and for sequences of 128 tokens the Transformer's layer normalization,
    embedding, attention (4 heads of 64) and feed-forward activation (width 1024)."""
    depthwise = (batch, 144, 56, 56)
    tokens, width, attention = (batch, 128), 256, (batch, 4, 128, 64)
    activation = (batch, 128, 1024)
    dw_flops = 2.0 * np.prod(depthwise) * 9
    sdpa_flops = 4.0 * np.prod(attention) * attention[2]  # q k^T and (softmax) v
    size = "x".join
    cases = []
    for layout in ("NCHW", "NHWC"):
        for backward, flops in ((False, dw_flops), (True, 3 * dw_flops)):
            name = f"conv2d depthwise 3x3 {size(map(str, depthwise))}"
            cases.append(
                Case(
                    name + (" forward + backward" if backward else ""),
                    layout,
                    MODEL_GOAL,
                    flops,
                    _fixed(_depthwise, [depthwise, (depthwise[1], 1, 3, 3)], backward),
                    "conv2d",
                )
            )
    rows = f"{tokens[0] * tokens[1]}x{width}"
    for backward in (False, True):
        cases.append(
            Case(
                f"layer_norm {rows}" + (" forward + backward" if backward else ""),
                "",
                MODEL_GOAL,
                None,
                _fixed(_layer_norm, [(tokens[0] * tokens[1], width), (width,), (width,)], backward),
                "layer_norm",
            )
        )
    cases.append(
        Case(
            f"embedding 1000x{width}, indices {size(map(str, tokens))} forward + backward",
            "",
            MODEL_GOAL,
            None,
            _fixed(_embedding, [(tokens, 1000), (1000, width)], backward=True),
            "embedding",
        )
    )
    for backward in (False, True):
        cases.append(
            Case(
                f"scaled_dot_product_attention {size(map(str, attention))}"
                + (" forward + backward" if backward else ""),
                "",
                MODEL_GOAL,
                3 * sdpa_flops if backward else sdpa_flops,
                _fixed(_sdpa, [attention] * 3, backward),
                "scaled_dot_product_attention",
            )
        )
    for fn in ("gelu", "silu"):
        for backward in (False, True):
            cases.append(
                Case(
                    f"{fn} {size(map(str, activation))}"
                    + (" forward + backward" if backward else ""),
                    "",
                    MODEL_GOAL,
                    None,
                    _fixed(lambda F, x, fn=fn: getattr(F, fn)(x), [activation], backward),
                    fn,
                )
            )
    return cases


# ---------------------------------------------------------------- the two libraries


@dataclass
class Lib:
    """One library's way of making inputs and calling its functional namespace."""

    name: str
    F: object  # lamina.nn.functional or torch.nn.functional
    tensor: Callable  # tensor(numpy array, requires_grad=False) -> tensor
    channels_last: Callable  # channels_last(images) -> the images channels-last
    set_threads: Callable
    get_threads: Callable
    version: str


def _zero_grad(*ts):
    for t in ts:
        t.grad = None


def _lamina():
    import lamina as lm

    def tensor(a, requires_grad=False):
        return lm.asarray(a, requires_grad=requires_grad)

    def channels_last(t):
        out = lm.nn.functional.to_layout(t.detach(), "NHWC")
        return out.requires_grad_() if t.requires_grad else out

    return Lib(
        "lamina",
        lm.nn.functional,
        tensor,
        channels_last,
        lm.set_num_threads,
        lm.get_num_threads,
        lm.__version__,
    )


def _torch():
    try:
        import torch
    except ImportError:
        return None

    def tensor(a, requires_grad=False):
        return torch.tensor(a, requires_grad=requires_grad)

    def channels_last(t):
        out = t.detach().contiguous(memory_format=torch.channels_last)
        return out.requires_grad_() if t.requires_grad else out

    return Lib(
        "torch",
        torch.nn.functional,
        tensor,
        channels_last,
        torch.set_num_threads,
        torch.get_num_threads,
        torch.__version__.split("+")[0],
    )


def _image(lib, data, layout, requires_grad=False):
    x = lib.tensor(data, requires_grad)
    return lib.channels_last(x) if layout == "NHWC" else x


def _call(fn_name, *args, weight=False, backward=False):
    """A case calling ``fn_name(image, *args)`` -- ``fn_name(image, weight, *args)`` with
    ``weight`` -- and, with ``backward``, its backward pass into every input."""

    def make(lib, data, layout):
        inputs = [_image(lib, data["x"], layout, requires_grad=backward)]
        if weight:
            inputs.append(lib.tensor(data["w"], requires_grad=backward))
        fn = getattr(lib.F, fn_name)
        if not backward:
            return lambda: fn(*inputs, *args)
        g = _image(lib, data["g"], layout)

        def run():
            _zero_grad(*inputs)
            fn(*inputs, *args).backward(g)

        return run

    return make


_conv = _call("conv2d", None, 1, 1, weight=True)  # 3 x 3, no bias, stride 1, padding 1


def _fixed(call, inputs, backward=False):
    """A case calling ``call(F, *tensors)`` on inputs of their own sizes -- ``inputs``:
    a shape for random float32 values, (shape, n) for indices in [0, n) -- the first
    one and the output gradient in the case's layout (images: NCHW or NHWC, others "");
    with ``backward``, its backward pass into every float input, from a random output
    gradient."""

    def make(lib, data, layout):
        rng = np.random.default_rng(0)  # the same inputs in every process
        tensors = []
        for i, spec in enumerate(inputs):
            if isinstance(spec[0], tuple):
                tensors.append(lib.tensor(rng.integers(0, spec[1], spec[0])))
            else:
                values = rng.standard_normal(spec, dtype=np.float32)
                as_input = _image if i == 0 else lambda lib, v, layout, grad: lib.tensor(v, grad)
                tensors.append(as_input(lib, values, layout, backward))
        if not backward:
            return lambda: call(lib.F, *tensors)
        out_shape = tuple(call(lib.F, *tensors).shape)
        g = _image(lib, rng.standard_normal(out_shape, dtype=np.float32), layout)
        floats = [t for t in tensors if t.requires_grad]

        def run():
            _zero_grad(*floats)
            call(lib.F, *tensors).backward(g)

        return run

    return make


def _depthwise(F, x, w):
    return F.conv2d(x, w, None, 1, 1, 1, x.shape[1])


def _layer_norm(F, x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def _embedding(F, indices, weight):
    return F.embedding(indices, weight)


def _sdpa(F, q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


_conv_backward = _call("conv2d", None, 1, 1, weight=True, backward=True)


def _batch_norm(lib, data, layout):
    x = _image(lib, data["x"], layout)
    c = data["x"].shape[1]
    mean, var = lib.tensor(np.zeros(c, np.float32)), lib.tensor(np.ones(c, np.float32))
    weight, bias = lib.tensor(np.ones(c, np.float32)), lib.tensor(np.zeros(c, np.float32))
    return lambda: lib.F.batch_norm(x, mean, var, weight, bias, True, 0.1, 1e-5)


# ---------------------------------------------------------------- measuring


def _data(shape):
    """The inputs, the same in every process (Note [Separate processes])."""
    rng = np.random.default_rng(0)
    return {
        "x": rng.standard_normal(shape, dtype=np.float32),
        "w": rng.standard_normal((shape[1], shape[1], 3, 3), dtype=np.float32) * 0.05,
        "g": rng.standard_normal(shape, dtype=np.float32),
    }


def runner(library: str, config: dict) -> timing.Runner:
    """One library's cases ``config["cases"]`` ([name, layout] pairs) on an input of
    ``config["shape"]``, on ``config["threads"]`` threads until the runner closes."""
    lib = _lamina() if library == "lamina" else _torch()
    shape = tuple(config["shape"])
    data = _data(shape)
    known = {(c.name, c.layout): c for c in _selected_cases(shape, "all")}
    cases = {
        (name, layout): functools.partial(known[name, layout].make, lib, data, layout)
        for name, layout in config["cases"]
    }
    undo = timing.apply_settings(library, config, lib.get_threads, lib.set_threads)
    return timing.Runner(library, cases, target=0.02, most=50, on_close=undo)


def measure(args):
    """(cases, {(case name, layout): {library: median seconds per call}}, libraries),
    all cases and libraries interleaved round by round."""
    libs = [_lamina()]
    peer = None if args.no_torch else _torch()
    if peer is not None:
        libs.append(peer)
    selected = _selected_cases(tuple(args.shape), args.primitives)
    cases = [
        c
        for c in selected
        if args.layout in ("both", c.layout) or not c.layout
        if not args.only or args.only in c.name
    ]
    if not cases:
        names = "; ".join(dict.fromkeys(c.name for c in selected))
        raise SystemExit(f"--only {args.only!r}: no primitive's name contains it ({names})")
    missing = sorted({c.needs for c in cases if c.needs and not hasattr(libs[0].F, c.needs)})
    cases = [c for c in cases if c.needs not in missing]
    if not cases:
        raise SystemExit(f"lamina has no {', '.join(missing)} yet: nothing to time")
    config = {
        "shape": list(args.shape),
        "threads": args.threads,
        "allocator": timing.allocator_wanted(args),
        "cases": [[c.name, c.layout] for c in cases],
    }
    names = [lib.name for lib in libs]
    with timing.started("nn", names, config, args.in_process) as runners:
        samples = timing.time_rounds(runners, len(cases), args.rounds, args.settle)
    results = {
        (c.name, c.layout): {n: statistics.median(samples[c.name, c.layout, n]) for n in names}
        for c in cases
    }
    return cases, results, libs, missing


def report(args, cases, results, libs, missing=()):
    peer = len(libs) > 1
    versions = f"lamina {libs[0].version}" + (f" and PyTorch {libs[1].version}" if peer else "")
    if args.in_process:
        where = "in this process"
    else:
        where = "each in its own process" if peer else "in a process of its own"
    shape = "x".join(map(str, args.shape))
    lines = [] if peer else [output.without_torch(args)]
    what = []
    if args.primitives != "models":
        what.append(
            "convolution, pooling, LRN, batch norm and activation primitives of AlexNet-, "
            f"VGG- and Inception-v1-like convnets (input {shape})"
        )
    if args.primitives != "convnets":
        what.append(
            "the primitives of ResNet, MobileNet v2 and a Transformer encoder (at the sizes named)"
        )
    lines += [
        f"{' and '.join(what)}: float32, "
        f"{args.threads} thread(s), median of {args.rounds} rounds ({versions}"
        + (" interleaved" if peer else "")
        + f", {where}; lamina's pool allocator {args.allocator})",
        "",
    ]
    head = ["primitive", "layout", "lamina ms"]
    if peer:
        head += ["torch ms", "lamina/torch", "goal"]
    head += ["GFLOP/s lamina"] + (["GFLOP/s torch"] if peer else [])
    rows = []
    for case in cases:
        r = results[case.name, case.layout]
        cells = [case.name, case.layout, f"{r['lamina'] * 1e3:.2f}"]
        if peer:
            ratio = r["lamina"] / r["torch"]
            mark = "" if case.goal is None or ratio <= case.goal else " *"
            goal = "" if case.goal is None else f"<= {case.goal:.1f}x"
            cells += [f"{r['torch'] * 1e3:.2f}", f"{ratio:.2f}x{mark}", goal]
        flops = [
            case.flops / r[n] / 1e9 if case.flops else None
            for n in (["lamina", "torch"] if peer else ["lamina"])
        ]
        cells += ["" if f is None else f"{f:.0f}" for f in flops]
        rows.append(cells)
    lines += output.table(head, rows, left=2)
    notes = []
    if peer and any(c.goal is not None for c in cases):
        notes.append(
            "* above lamina's goal for lamina / PyTorch (conv2d against PyTorch in the same "
            "layout, the other primitives against PyTorch's NCHW)"
        )
    if any(c.flops for c in cases):
        notes.append(
            "GFLOP/s for conv2d: forward 2 N H W C_out C_in 9 (depthwise: C_in 1), "
            "attention 4 N heads L^2 d; forward + backward three times that"
        )
    if missing:
        notes.append(f"not timed: lamina has no {', '.join(missing)} yet")
    return "\n".join(lines + ([""] + notes if notes else []))


def plot(path, args, cases, results, libs) -> None:
    """lamina / PyTorch time per primitive as horizontal bars beside the 1.0 line, or,
    without PyTorch, lamina's milliseconds per call."""
    plt = output.pyplot()
    peer = len(libs) > 1
    r = [results[c.name, c.layout] for c in cases]
    if peer:
        values = [t["lamina"] / t["torch"] for t in r]
        series = [
            ("lamina faster", "tab:green", lambda v: v <= 1),
            ("lamina slower", "tab:red", lambda v: v > 1),
        ]
        text = "{:.3g}x"
        xlabel = "lamina time / PyTorch time, ratio (log scale)"
        what = f"lamina {libs[0].version} / PyTorch {libs[1].version}, time per call"
    else:
        values = [t["lamina"] * 1e3 for t in r]
        series = [(f"lamina {libs[0].version}", "tab:blue", lambda v: True)]
        text = "{:.3g} ms"
        xlabel = "lamina time per call, ms (log scale)"
        what = f"lamina {libs[0].version}, time per call (PyTorch not timed)"
    # ratios start from the 1.0 line, so a bar shows how far from PyTorch's time, either way
    base = 1.0 if peer else 0.0
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.38 * len(cases)))
    for label, color, belongs in series:
        ys = [i for i, v in enumerate(values) if belongs(v)]
        if ys:
            widths = [values[i] - base for i in ys]
            bars = ax.barh(ys, widths, left=base, color=color, label=label)
            ax.bar_label(bars, [text.format(values[i]) for i in ys], padding=3, fontsize=8)
    ax.set_yticks(range(len(cases)), [f"{c.name} ({c.layout})" for c in cases])
    ax.invert_yaxis()  # the table's order, top to bottom
    ax.set_xscale("log")
    # 0.2, 0.5, 1, 2 ...: a decade alone leaves two labels on a narrow range
    ax.xaxis.set_major_locator(plt.LogLocator(subs=(1, 2, 5)))
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:g}")  # 0.01, not 10^-2
    span = values + ([1.0] if peer else [])
    if peer:
        ax.axvline(1.0, color="black", linewidth=1, label="same time as PyTorch")
    # the log scale's room for the value labels beyond the longest bar
    ax.set_xlim(min(span) / 3, max(span) * 3)
    ax.set_xlabel(xlabel)
    shape = "x".join(map(str, args.shape))
    ax.set_title(
        f"{what}\nfloat32 input {shape}, {args.threads} thread(s), median of {args.rounds} rounds"
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # off the bars
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=2, help="threads of both libraries (2)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (7)")
    p.add_argument("--layout", choices=["NCHW", "NHWC", "both"], default="both")
    p.add_argument(
        "--shape", type=int, nargs=4, default=[16, 64, 56, 56], metavar=("N", "C", "H", "W")
    )
    timing.add_library_options(p)
    timing.add_allocator_option(p)
    p.add_argument(
        "--primitives",
        choices=["convnets", "models", "all"],
        default="all",
        help="those of bench convnet's nets on --shape, those of bench models' at their "
        "sizes, or all (all)",
    )
    p.add_argument("--only", default="", help="only the primitives whose name contains this")
    p.add_argument("--json", action="store_true", help="print the medians as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw lamina / PyTorch time per primitive (lamina's time without PyTorch)",
    )


def run(args) -> None:
    if args.threads < 1 or args.rounds < 1:
        raise SystemExit("--threads and --rounds must be positive")
    if args.plot:
        output.pyplot()  # fail before measuring, not after
    cases, results, libs, missing = measure(args)
    names = [lib.name for lib in libs]
    if args.json:
        if len(libs) == 1:
            print(output.without_torch(args), file=sys.stderr)  # stdout stays JSON
        if missing:
            print(f"not timed: lamina has no {', '.join(missing)} yet", file=sys.stderr)
        out = [
            {
                "primitive": c.name,
                "layout": c.layout,
                "goal": c.goal,
                "flops": c.flops,
                **{f"{n}_seconds": results[c.name, c.layout][n] for n in names},
            }
            for c in cases
        ]
        print(json.dumps(out, indent=2))
    else:
        print(report(args, cases, results, libs, missing))
    if args.plot:
        plot(args.plot, args, cases, results, libs)
