"""Compiled functions (lamina.jit) beside eager lamina, PyTorch eager, torch.compile and NumPy.

Four workloads, float32, one thread, every library running the same code:

* a chain of ten elementwise operations (``chain``: multiply, add, subtract, scale,
  exp, add, multiply, subtract, tanh, multiply) at 10^2 and 10^6 elements (``--sizes``),
  also per operation: at 10^2 elements a chain is mostly the cost of calling each
  operator, which a compiled function fuses into one generated loop;
* the cost of a compiled call itself -- checking its guards and running its plan --
  on a function adding 8 inputs of one element (``add_eight``);
* an MLP training step (256 inputs, 512 tanh units, 10 classes, batch 128:
  cross-entropy loss, backward, SGD step), the forward pass and loss compiled, the
  same initial weights in every library; NumPy, without autograd, has no such step;
* compile times: from a fresh process, the time to the first compiled result of the
  chain minus that process's time to its first eager result, with an empty compiler
  cache (cold: a new ``LAMINA_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR``) and again in
  another fresh process with the cache the first filled (warm).

Before anything is timed, each library's first result is checked against NumPy's in
float64 (for the MLP: the loss and every parameter's gradient of the first step); a
library that disagrees stops the benchmark, naming the workload. Each library -- eager
lamina, compiled lamina, eager PyTorch, torch.compile, NumPy -- runs in a child process
of its own (Note [Separate processes] in lamina.tools.bench.timing), all interleaved
round by round, and the report gives medians in microseconds per call, compiled /
eager of both libraries and compiled lamina / torch.compile. torch.compile is timed
where PyTorch is importable and it works (it needs a C++ compiler), with static shapes
(``dynamic=False``) as lamina.jit compiles by default.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import ops, output, timing

LIBRARIES = ("lamina", "lamina.jit", "torch", "torch.compile", "numpy")
COMPILERS = {"lamina.jit": "LAMINA_CACHE_DIR", "torch.compile": "TORCHINDUCTOR_CACHE_DIR"}
HEADINGS = {
    "lamina": "lamina eager",
    "lamina.jit": "lamina compiled",
    "torch": "torch eager",
    "torch.compile": "torch.compile",
    "numpy": "NumPy",
}
SIZES = (10**2, 10**6)
CHAIN_OPERATIONS = 10
MLP = {"batch": 128, "inputs": 256, "hidden": 512, "classes": 10}
LEARNING_RATE = 0.01  # small: thousands of timed steps must not make the weights blow up
# |got - want| <= rtol |want| + atol max |want|, against NumPy in float64: a float32
# result of these workloads is within ~1e-6 of it, a wrong one far outside.
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


# ---------------------------------------------------------------- the workloads


def chain(xp, x, y, a):
    """Ten elementwise operations, written once for lamina, PyTorch and NumPy (``xp``)."""
    t = x * y
    t = t + x
    t = t - y
    t = t * 0.5
    t = xp.exp(t)
    t = t + a
    t = t * x
    t = t - 1.0
    t = xp.tanh(t)
    return t * y


def chain_in(xp) -> Callable:
    """The chain as a function of its three tensors, with ``xp``'s exp and tanh."""
    return lambda x, y, a: chain(xp, x, y, a)


def add_eight(a, b, c, d, e, f, g, h):
    return a + b + c + d + e + f + g + h


def _mlp_class(nn, tanh) -> type:
    class TanhMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden = nn.Linear(MLP["inputs"], MLP["hidden"])
            self.out = nn.Linear(MLP["hidden"], MLP["classes"])

        def forward(self, x):
            return self.out(tanh(self.hidden(x)))

    return TanhMLP


def _inputs(count: int, shape: tuple, seed: int) -> list[np.ndarray]:
    """``count`` float32 arrays in (-1, 1): the same in every process."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(count)]


@functools.cache
def mlp_data() -> dict[str, np.ndarray]:
    """The MLP's initial parameters (by their names in ``_mlp_class``), its inputs ``x``
    and its ``labels``: the same in every process."""
    rng = np.random.default_rng(2)
    n, i, h, c = MLP["batch"], MLP["inputs"], MLP["hidden"], MLP["classes"]

    def uniform(shape, fan_in):  # nn.Linear's initial range
        bound = 1 / math.sqrt(fan_in)
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    return {
        "hidden.weight": uniform((h, i), i),
        "hidden.bias": uniform(h, i),
        "out.weight": uniform((c, h), h),
        "out.bias": uniform(c, h),
        "x": rng.standard_normal((n, i)).astype(np.float32),
        "labels": rng.integers(0, c, n),
    }


def mlp_reference() -> dict[str, np.ndarray]:
    """The first training step's loss and gradients, by hand in NumPy, in float64."""
    d = {k: v.astype(np.float64) for k, v in mlp_data().items() if k != "labels"}
    labels = mlp_data()["labels"]
    hidden = np.tanh(d["x"] @ d["hidden.weight"].T + d["hidden.bias"])
    logits = hidden @ d["out.weight"].T + d["out.bias"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    rows = np.arange(len(labels))
    d_logits = np.exp(log_probabilities)
    d_logits[rows, labels] -= 1
    d_logits /= len(labels)
    d_hidden = (d_logits @ d["out.weight"]) * (1 - hidden**2)
    return {
        "loss": -log_probabilities[rows, labels].mean(),
        "hidden.weight": d_hidden.T @ d["x"],
        "hidden.bias": d_hidden.sum(axis=0),
        "out.weight": d_logits.T @ hidden,
        "out.bias": d_logits.sum(axis=0),
    }


# ---------------------------------------------------------------- the libraries


@dataclass
class Lib:
    """What the workloads need of one library, eager or compiled."""

    name: str  # one of LIBRARIES
    xp: Any  # the namespace of the chain's exp and tanh
    tensor: Callable  # tensor(NumPy array)
    numpy: Callable  # numpy(tensor) -> NumPy array
    compile: Callable  # compile(function) -> function; eager: the function itself
    mlp: type | None  # the MLP's Module class; None without autograd
    cross_entropy: Callable | None
    sgd: Callable | None  # sgd(parameters, lr) -> optimizer
    get_threads: Callable
    set_threads: Callable


def _eager(fn: Callable) -> Callable:
    return fn


def _library(name: str) -> Lib:
    if name.startswith("lamina"):
        import lamina as lm

        return Lib(
            name,
            lm,
            lm.asarray,
            lambda t: t.detach().numpy(),
            lm.jit.compile if name == "lamina.jit" else _eager,
            _mlp_class(lm.nn, lm.tanh),
            lm.nn.functional.cross_entropy,
            lambda params, lr: lm.optim.SGD(params, lr=lr),
            lm.get_num_threads,
            lm.set_num_threads,
        )
    if name.startswith("torch"):
        import torch

        return Lib(
            name,
            torch,
            torch.from_numpy,
            lambda t: t.detach().numpy(),
            # static shapes, as lamina.jit's default: torch.compile's default would
            # recompile the chain's second size with symbolic ones
            functools.partial(torch.compile, dynamic=False) if name == "torch.compile" else _eager,
            _mlp_class(torch.nn, torch.tanh),
            torch.nn.functional.cross_entropy,
            lambda params, lr: torch.optim.SGD(params, lr=lr),
            torch.get_num_threads,
            torch.set_num_threads,
        )
    return Lib(name, np, np.asarray, np.asarray, _eager, None, None, None, lambda: 1, _eager)


def agree(library: str, what: str, got, want) -> None:
    """Stops the benchmark when ``got`` is not ``want`` within TOLERANCE."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.max(np.abs(want), initial=0.0))
    bound = TOLERANCE["rtol"] * np.abs(want) + TOLERANCE["atol"] * scale
    if got.shape != want.shape:
        raise SystemExit(f"{library} {what}: shape {got.shape}, NumPy's {want.shape}; not timed")
    if not np.all(np.abs(got - want) <= bound):  # a NaN fails too
        worst = float(np.max(np.abs(got - want)))
        raise SystemExit(
            f"{library} {what}: the result differs from NumPy's (in float64) by up to "
            f"{worst:.3g}, beyond rtol {TOLERANCE['rtol']:g} + atol {TOLERANCE['atol']:g} "
            "x its largest |value|; not timed"
        )


def _first_call(lib: Lib, what: str, call: Callable) -> Any:
    """``call()``, which compiles; where torch.compile cannot work (no C++ compiler),
    None and a line saying so. lamina.jit's failures are reported as they are."""
    if lib.name != "torch.compile":
        return call()
    try:
        return call()
    except Exception as e:
        reason = (str(e).strip().splitlines() or [""])[0]
        print(
            f"torch.compile fails on {what}, left out: {type(e).__name__}: {reason}",
            file=sys.stderr,
        )
        return None


def elementwise_case(lib: Lib, what: str, fn: Callable, arrays: list, reference: Callable):
    """``fn`` of ``arrays`` as ``lib``'s tensors, compiled for a compiled library,
    checked against ``reference`` of the arrays in float64."""
    tensors = [lib.tensor(a) for a in arrays]
    run = lib.compile(fn)
    got = _first_call(lib, what, lambda: lib.numpy(run(*tensors)))
    if got is None:
        return timing.not_run
    agree(lib.name, what, got, reference(*(a.astype(np.float64) for a in arrays)))
    return lambda: run(*tensors)


def mlp_case(lib: Lib) -> Callable:
    if lib.mlp is None:
        return timing.not_run
    data = mlp_data()
    model = lib.mlp()
    model.load_state_dict({k: lib.tensor(v.copy()) for k, v in data.items() if "." in k})
    x, labels = lib.tensor(data["x"]), lib.tensor(data["labels"])
    cross_entropy = lib.cross_entropy
    loss_of = lib.compile(lambda x, labels: cross_entropy(model(x), labels))
    optimizer = lib.sgd(model.parameters(), LEARNING_RATE)

    def train_step():
        optimizer.zero_grad()
        loss = loss_of(x, labels)
        loss.backward()
        optimizer.step()
        return loss

    loss = _first_call(lib, "the MLP training step", lambda: lib.numpy(train_step()))
    if loss is None:
        return timing.not_run
    want = mlp_reference()
    agree(lib.name, "MLP training step: loss", loss, want["loss"])
    for name, p in model.named_parameters():
        agree(lib.name, f"MLP training step: gradient of {name}", lib.numpy(p.grad), want[name])
    return train_step


def _case(lib: Lib, workload: str, size: int) -> Callable:
    if workload == "chain":
        arrays = _inputs(3, (size,), seed=size)
        what = f"chain of {size} elements"
        return elementwise_case(lib, what, chain_in(lib.xp), arrays, chain_in(np))
    if workload == "add8":
        arrays = _inputs(8, (1,), seed=8)
        return elementwise_case(lib, "add of 8 inputs", add_eight, arrays, add_eight)
    return mlp_case(lib)


# ---------------------------------------------------------------- measuring


def runner(library: str, config: dict) -> timing.Runner:
    """One library's cases ``config["cases"]`` ([workload, size] pairs) on one thread."""
    lib = _library(library)
    cases = {
        (workload, size): functools.partial(_case, lib, workload, size)
        for workload, size in config["cases"]
    }
    settings_of = "lamina" if library.startswith("lamina") else library  # the pool allocator
    undo = timing.apply_settings(settings_of, config, lib.get_threads, lib.set_threads)
    return timing.Runner(
        library, cases, target=config["target"], prime=config["target"], most=10**4, on_close=undo
    )


def libraries(no_torch: bool) -> list[str]:
    torch = not no_torch and importlib.util.find_spec("torch") is not None
    return [lib for lib in LIBRARIES if torch or not lib.startswith("torch")]


def cases(args) -> list[tuple[str, int]]:
    return [("chain", size) for size in args.sizes] + [("add8", 1), ("mlp", MLP["batch"])]


def measure(args) -> tuple[dict, list[str]]:
    """({(workload, size): {library: median seconds per call, or None}}, libraries)."""
    names = libraries(args.no_torch)
    timed = cases(args)
    config = {
        "threads": 1,
        "allocator": timing.allocator_wanted(args),
        "cases": [list(c) for c in timed],
        "target": args.target,
    }
    with timing.started("jit", names, config, args.in_process) as runners:
        samples = timing.time_rounds(runners, len(timed), args.rounds, args.settle)
    results = {}
    for case in timed:
        results[case] = {}
        for lib in names:
            times = samples[(*case, lib)]
            results[case][lib] = None if None in times else statistics.median(times)
    return results, names


def first_results(library: str, size: int, path: str) -> None:
    """In a fresh process (``compile_time``): writes to ``path`` the seconds from this
    call to the first eager result of the chain and then to the first compiled one."""
    start = time.perf_counter()
    lib = _library(library)
    lib.set_threads(1)
    tensors = [lib.tensor(a) for a in _inputs(3, (size,), seed=size)]
    want = lib.numpy(chain_in(lib.xp)(*tensors))
    eager = time.perf_counter() - start
    got = lib.numpy(lib.compile(chain_in(lib.xp))(*tensors))
    compiled = time.perf_counter() - start
    agree(library, f"chain of {size} elements", got, want)
    with open(path, "w") as f:
        json.dump({"eager": eager, "compiled": compiled}, f)


def compile_time(library: str, cache: str, size: int) -> float | None:
    """Seconds from the first eager result of the chain to the first compiled one in a
    fresh process whose compiler cache is ``cache``; None where torch.compile fails."""
    path = os.path.join(cache, "first-results.json")
    code = (
        "from lamina.tools.bench.jit import first_results; "
        f"first_results({library!r}, {size}, {path!r})"
    )
    env = {**os.environ, COMPILERS[library]: cache}
    done = subprocess.run([sys.executable, "-c", code], env=env, stdout=sys.stderr)
    if done.returncode != 0:
        if library == "torch.compile":
            print("torch.compile fails in a fresh process (above): left out", file=sys.stderr)
            return None
        raise SystemExit(f"{library}'s compile-time process failed with status {done.returncode}")
    with open(path) as f:
        first = json.load(f)
    return first["compiled"] - first["eager"]


def compile_times(names: list[str], size: int) -> dict[str, dict[str, float | None]]:
    """{compiler: {"cold": seconds, "warm": seconds}}: cold with an empty cache, warm in
    another fresh process with the cache the cold one filled."""
    times = {}
    for library in (n for n in names if n in COMPILERS):
        with tempfile.TemporaryDirectory(prefix="lamina-bench-jit-") as cache:
            cold = compile_time(library, cache, size)
            warm = None if cold is None else compile_time(library, cache, size)
        times[library] = {"cold": cold, "warm": warm}
        timing.progress(len(times), sum(n in COMPILERS for n in names), f"compile {library}")
    return times


# ---------------------------------------------------------------- the report


def rows(results: dict) -> list[tuple[str, str, dict]]:
    """(workload, size, {library: seconds or None}) of the table, a chain also per
    operation."""
    found = []
    for (workload, size), times in results.items():
        if workload == "chain":
            found.append(("chain of 10 ops", f"{size:,}", times))
            per_op = {k: None if t is None else t / CHAIN_OPERATIONS for k, t in times.items()}
            found.append(("  per op", f"{size:,}", per_op))
        elif workload == "add8":
            found.append(("add of 8 inputs", "8 x 1", times))
        else:
            shape = f"{MLP['batch']}x{MLP['inputs']}"
            found.append((f"MLP step ->{MLP['hidden']}->{MLP['classes']}", shape, times))
    return found


RATIOS = (
    ("lamina compiled/eager", "lamina.jit", "lamina"),
    ("torch compiled/eager", "torch.compile", "torch"),
    ("lamina compiled/torch.compile", "lamina.jit", "torch.compile"),
)


def _us(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e6:,.2f}"


def _x(times: dict, over: str, under: str) -> str:
    a, b = times.get(over), times.get(under)
    return "" if a is None or b is None else f"{a / b:.2f}x"


def _seconds(s: float | None) -> str:
    return "failed" if s is None else f"{s:.2f}"


def report(args, results: dict, names: list[str], compiled: dict | None) -> str:
    versions = ", ".join(
        f"{n} {_version(n)}" for n in dict.fromkeys(n.split(".")[0] for n in names)
    )
    where = "in this process" if args.in_process else "each library in its own process"
    lines = [] if "torch" in names else [ops._without_torch(args)]  # NumPy stays
    lines += [
        f"compiled and eager, float32, 1 thread, median of {args.rounds} interleaved rounds "
        f"({versions}; {where}; lamina's pool allocator {args.allocator}); microseconds per "
        "call; every result checked against NumPy's in float64 first",
        "",
    ]
    head = ["workload", "size"] + [f"{HEADINGS[n]} us" for n in LIBRARIES]
    head += [heading for heading, _, _ in RATIOS]
    table = [
        [workload, size]
        + [_us(times.get(n)) for n in LIBRARIES]
        + [_x(times, over, under) for _, over, under in RATIOS]
        for workload, size, times in rows(results)
    ]
    lines += output.table(head, table, left=1)
    if compiled:
        lines += [
            "",
            f"compile time of the chain ({args.sizes[0]:,} elements), seconds: in a fresh "
            "process, its first compiled result minus its first eager result; cold with an "
            "empty compiler cache, warm in another process with the cache the cold one filled",
            "",
        ]
        table = [
            [HEADINGS[n], _seconds(t["cold"]), _seconds(t["warm"])] for n, t in compiled.items()
        ]
        lines += output.table(["compiler", "cold s", "warm s"], table, left=1)
    return "\n".join(lines)


def _version(library: str) -> str:
    return importlib.import_module(library).__version__.split("+")[0]


def _json(args, results: dict, names: list[str], compiled: dict | None) -> str:
    out = {
        "threads": 1,
        "rounds": args.rounds,
        "processes": "one" if args.in_process else "one per library",
        "allocator": args.allocator,
        "versions": {n: _version(n) for n in dict.fromkeys(n.split(".")[0] for n in names)},
        "tolerance": TOLERANCE,
        "results": [
            {"workload": w, "size": s, **{f"{lib}_seconds": t for lib, t in times.items()}}
            for (w, s), times in results.items()
        ],
        "compile_seconds": compiled or {},
    }
    return json.dumps(out, indent=2)


def plot(path: str, args, results: dict, names: list[str]) -> None:
    """Microseconds per call as grouped bars: a group per row of the table, a bar per
    library, on a log scale (the workloads differ by decades)."""
    plt = output.pyplot()
    table = rows(results)
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.4 * len(table) + 3), 4.8))
    for i, lib in enumerate(names):
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(table))]
        ys = [times.get(lib) for _, _, times in table]
        ys = [math.nan if y is None else y * 1e6 for y in ys]
        drawn = ax.bar(xs, ys, width, label=HEADINGS[lib])
        labels = ["" if math.isnan(y) else f"{y:,.3g}" if y < 1000 else f"{y:,.0f}" for y in ys]
        ax.bar_label(drawn, labels, fontsize=7, rotation=90, padding=2)
    ax.set_yscale("log")
    drawn_us = [t * 1e6 for _, _, times in table for t in times.values() if t is not None]
    ax.set_ylim(min(drawn_us) / 3, max(drawn_us) * 6)  # room for the labels above the bars
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")
    ax.set_ylabel("microseconds per call (log scale)")
    ax.set_xticks(range(len(table)), [f"{w.strip()}\n{s}" for w, s, _ in table], fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.set_title(f"compiled and eager, float32, 1 thread, median of {args.rounds} rounds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=list(SIZES),
        help="elements of the chain's inputs (10^2 10^6)",
    )
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    p.add_argument("--target", type=float, default=0.02, help="seconds per timed sample (0.02)")
    timing.add_library_options(p)
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: 2 short rounds, no pause between"
    )
    p.add_argument(
        "--no-compile-times",
        action="store_true",
        help="leave out the compile times (a cold start takes torch.compile half a minute)",
    )
    timing.add_allocator_option(p)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw the times per call as bars")


def run(args) -> None:
    if args.quick:
        args.rounds, args.target, args.settle = 2, 0.005, 0.0
    if min(args.sizes) < 1 or args.rounds < 1:
        raise SystemExit("--sizes and --rounds must be positive")
    if args.plot:
        output.pyplot()  # fail before measuring, not after
    results, names = measure(args)
    compiled = None if args.no_compile_times else compile_times(names, args.sizes[0])
    if args.json:
        if "torch" not in names:
            print(ops._without_torch(args), file=sys.stderr)  # stdout stays JSON
        print(_json(args, results, names, compiled))
    else:
        print(report(args, results, names, compiled))
    if args.plot:
        plot(args.plot, args, results, names)
