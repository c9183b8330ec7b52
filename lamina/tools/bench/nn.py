"""Seed 2's primitives, lamina beside PyTorch (``python -m lamina.bench nn``).

Times conv2d (forward, and forward + backward for data and weight), max and average
pooling, local response normalization, batch normalization in training and relu on a
16 x 64 x 56 x 56 float32 input, in both memory layouts (NCHW and channels-last),
with lamina and -- when it is importable -- PyTorch on the same number of threads,
each library in a child process of its own (Note [Separate processes] in
lamina.tools.bench.timing; ``--in-process`` times them in this one), round after round
(each round runs every case of lamina, then of PyTorch, so a slow phase of a shared
machine slows both); reports medians, lamina / PyTorch, the issue's goal for each row,
and GFLOP/s for the convolutions. Without PyTorch it reports lamina alone. lamina
runs with its pool allocator on (``--allocator off`` to measure without), as in
``bench convnet``: without it, a forward + backward call's fresh 12.8 MB gradients
took ~1,100 page faults (relu: 3.6-7.7 ms a call instead of 1.2).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import timing


@dataclass
class Case:
    name: str
    layout: str
    goal: float | None  # lamina / PyTorch the issue asks for (None: no goal)
    flops: float | None  # per call, for GFLOP/s
    make: Callable  # make(lib, inputs) -> a function running one call


def _conv_flops(n, c, h, w, c_out, k):
    return 2.0 * n * h * w * c_out * c * k * k  # padding 1, stride 1: output h x w


def _cases(shape):
    """The issue's goals: conv2d in the same layout as PyTorch, the other primitives
    against PyTorch's NCHW figures (its reference table is NCHW)."""
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
    known = {(c.name, c.layout): c for c in _cases(shape)}
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
    cases = [
        c
        for c in _cases(tuple(args.shape))
        if args.layout in ("both", c.layout) and (not args.only or args.only in c.name)
    ]
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
    return cases, results, libs


def report(args, cases, results, libs):
    peer = len(libs) > 1
    torch_version = f" and PyTorch {libs[1].version} interleaved" if peer else ""
    if args.in_process:
        where = "in this process"
    else:
        where = "each in its own process" if peer else "in a process of its own"
    shape = "x".join(map(str, args.shape))
    lines = [
        f"seed 2's primitives: float32, input {shape}, {args.threads} thread(s), "
        f"median of {args.rounds} rounds (lamina{torch_version}, {where}; "
        f"lamina's pool allocator {args.allocator})",
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
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    right = {i for i, h in enumerate(head) if h not in ("primitive", "layout")}

    def line(cells):
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    lines += [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
    if peer:
        lines += [
            "",
            "* above the issue's goal (lamina / PyTorch; conv2d in the same layout, the "
            "others against PyTorch's NCHW)",
        ]
    lines.append(
        f"(lamina {libs[0].version}; GFLOP/s for conv2d: forward 2 N H W C_out C_in 9, "
        "forward + backward three times that)"
    )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=2, help="threads of both libraries (2)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (7)")
    p.add_argument("--layout", choices=["NCHW", "NHWC", "both"], default="both")
    p.add_argument(
        "--shape", type=int, nargs=4, default=[16, 64, 56, 56], metavar=("N", "C", "H", "W")
    )
    p.add_argument(
        "--settle", type=float, default=0.3, help="seconds to wait between libraries (0.3)"
    )
    timing.add_allocator_option(p)
    p.add_argument("--only", default="", help="only the primitives whose name contains this")
    p.add_argument(
        "--no-torch", action="store_true", help="lamina alone, even if PyTorch is installed"
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="time every library in this process (default: each in a child process of its "
        "own, so that their thread pools do not compete)",
    )
    p.add_argument("--json", action="store_true", help="print the medians as JSON")


def run(args) -> None:
    if args.threads < 1 or args.rounds < 1:
        raise SystemExit("--threads and --rounds must be positive")
    cases, results, libs = measure(args)
    names = [lib.name for lib in libs]
    if args.json:
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
        print(report(args, cases, results, libs))
