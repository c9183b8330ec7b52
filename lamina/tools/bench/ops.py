"""Every eager operator beside PyTorch and NumPy: a sweep over sizes and threads.

Times each elementwise (unary and binary), reduction (over all elements and along the
last axis), scan, sorting and nn-function operator of lamina -- the list comes from
lamina's operator schema (``lamina.dispatch.schema.OPERATORS``, by category) --
beside its PyTorch and NumPy equivalents (NumPy has none for the nn functions) on
float32 inputs of 10^2, 10^4 and 10^6 elements (square matrices: 10 x 10, 100 x 100,
1000 x 1000) at 1 and 2 threads. Each library runs in a child process of its own
(Note [Separate processes] in lamina.tools.bench.timing), round after round, and the
report gives medians in microseconds, lamina / PyTorch, lamina / the faster of PyTorch
and NumPy ("best"), their geometric means per category and thread count, and the
operators furthest behind. NumPy runs single-threaded whatever ``--threads`` says.
The libraries do the same work: sorting is stable in all three (lamina's default),
variance has no Bessel's correction, ``any`` and ``all`` get inputs that take a full
scan, and ``positive``, ``conj`` and ``real`` (the identity on real input, where
PyTorch returns its input itself) are left out. Without PyTorch, lamina is timed
beside NumPy alone.

A sample times as many calls as fill ``--target`` seconds (0.01; at most 10^4 calls,
so that a sub-microsecond call is not lost in the timer's resolution), after an untimed
run of as many calls and as long: the ~300 cases times three libraries times two
thread counts would take over a quarter of an hour with the 0.1 s of untimed calls
that ``bench nn`` and ``bench convnet`` run before each sample (the default sweep
takes about four minutes of CPU time).
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import importlib
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import output, timing

SIZES = (10**2, 10**4, 10**6)
THREADS = (1, 2)
LIBRARIES = ("lamina", "torch", "numpy")
CATEGORIES = ("elementwise", "reduction", "scan", "sorting", "nn")  # the report's order


@dataclass(frozen=True)
class Op:
    """One row of the sweep: how each library calls the operator. ``paths`` and
    ``kwargs`` map a library to its dotted path under the library's module
    (``"linalg.vector_norm"``; None where it has no equivalent) and its keywords."""

    name: str  # the row's label: the operator, and its axis where it has one
    category: str
    paths: dict[str, str | None]
    inputs: tuple[str, ...]  # kinds of the positional inputs (_INPUT_KINDS)
    kwargs: dict[str, dict]


# float32 inputs each library accepts: every dtype rule but the integer- and
# complex-only ones (dispatch/schema.py DTYPE_RULES)
_FLOAT_RULES = {"any", "real", "numeric", "real_numeric", "float", "real_float", "floating"}

# The identity on real input, where PyTorch returns its input itself (and NumPy a view
# for real): left out, since the sweep would time lamina's copy against nothing.
_IDENTITY_ON_REAL = {"positive", "conj", "real"}

# Where PyTorch's name differs from lamina's (or names another operation: torch.equal
# compares whole tensors, torch.max along a dim also returns indices).
_TORCH_NAMES = {
    "equal": "eq",
    "max": "amax",
    "min": "amin",
    "cumulative_sum": "cumsum",
    "cumulative_prod": "cumprod",
}

# Inputs where the usual ones -- the first in (-1, 1), the others positive, so that
# division stays finite -- fall outside the operator's domain or its common use.
_INPUTS = {
    "log": ("positive",),
    "log2": ("positive",),
    "log10": ("positive",),
    "sqrt": ("positive",),
    "pow": ("positive", "positive"),
    "acosh": ("above_one",),
    "logical_not": ("bool",),
    "logical_and": ("bool", "bool"),
    "logical_or": ("bool", "bool"),
    "logical_xor": ("bool", "bool"),
    "where": ("bool", "x", "positive"),
    # inputs that take a full scan: PyTorch and NumPy stop at the first value that
    # decides, which in random bools is at the start
    "any": ("false",),
    "all": ("true",),
    # a product of 10^6 values: near one, neither underflowing to subnormals nor zero
    "prod": ("near_one",),
    "cumulative_prod": ("near_one",),
}

# Keywords beyond the positional inputs, for every library alike.
_KWARGS = {"clip": {"min": -0.5, "max": 0.5}}

# The nn functions: (inputs, lamina's keywords); each in lamina.nn.functional and
# torch.nn.functional under the same name (one lamina lacks is left out: ``select``).
_NN = {
    "relu": (("x",), {}),
    "leaky_relu": (("x",), {}),
    "gelu": (("x",), {}),
    "silu": (("x",), {}),
    "sigmoid": (("x",), {}),
    "softmax": (("x",), {"axis": -1}),
    "log_softmax": (("x",), {"axis": -1}),
    "cross_entropy": (("x", "labels"), {}),
    "nll_loss": (("x", "labels"), {}),
    "mse_loss": (("x", "positive"), {}),
}


def _keywords(name: str, kwargs: dict) -> dict[str, dict]:
    """lamina's keywords, and PyTorch's and NumPy's for the same computation: ``dim``
    for ``axis`` in PyTorch, variance without Bessel's correction (lamina's and NumPy's
    default), stable sorting (lamina's default)."""
    torch = {"dim" if k == "axis" else k: v for k, v in kwargs.items()}
    numpy = dict(kwargs)
    if name in ("var", "std"):
        torch["correction"] = 0
    if name in ("sort", "argsort"):
        torch["stable"] = True
        numpy["kind"] = "stable"
    return {"lamina": kwargs, "torch": torch, "numpy": numpy}


def _schema_op(op, label: str, kwargs: dict) -> Op:
    prefix = f"{op.namespace}." if op.namespace else ""
    arity = sum(p.kind.name == "POSITIONAL_ONLY" for p in op.params)
    paths = {
        "lamina": prefix + op.name,
        "torch": prefix + _TORCH_NAMES.get(op.name, op.name),
        "numpy": prefix + (op.numpy or op.name),
    }
    inputs = _INPUTS.get(op.name, ("x",) + ("positive",) * (arity - 1))
    return Op(
        label,
        op.category,
        paths,
        inputs,
        _keywords(op.name, {**_KWARGS.get(op.name, {}), **kwargs}),
    )


@functools.cache
def operators() -> tuple[Op, ...]:
    """Every operator the sweep knows, by category, in the schema's order within each,
    with every library's path, whether or not that library has it (``available``)."""
    from lamina.dispatch.schema import OPERATORS

    public = [
        op
        for op in OPERATORS.values()
        if op.inplace_of is None
        and op.namespace is not None
        and op.dtypes in _FLOAT_RULES
        and op.name not in _IDENTITY_ON_REAL
    ]
    ops = []
    for op in public:
        if op.category == "elementwise":
            ops.append(_schema_op(op, op.name, {}))
        elif op.category == "reduction":
            ops.append(_schema_op(op, op.name, {}))
            ops.append(_schema_op(op, f"{op.name} axis=-1", {"axis": -1}))
        elif op.category in ("scan", "sorting"):
            ops.append(_schema_op(op, op.name, {"axis": -1}))
    for name, (inputs, kwargs) in _NN.items():
        path = f"nn.functional.{name}"
        paths = {"lamina": path, "torch": path, "numpy": None}
        ops.append(Op(name, "nn", paths, inputs, _keywords(name, kwargs)))
    return tuple(sorted(ops, key=lambda op: CATEGORIES.index(op.category)))


def available(op: Op, library: str) -> bool:
    """Whether ``library`` has ``op`` (and is importable). Only the parent asks about
    every library: a child imports its own alone (Note [Separate processes])."""
    return resolve(library, op.paths[library]) is not None


def resolve(library: str, path: str | None) -> Callable | None:
    """The callable at ``path`` under ``library``'s module; None where there is none."""
    if path is None:
        return None
    try:
        obj = importlib.import_module(library)
    except ImportError:
        return None
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj if callable(obj) else None


def select(pattern: str) -> list[Op]:
    """The operators lamina has (an nn function it lacks is left out) whose label
    matches ``pattern`` (fnmatch, or a comma-separated list of them; empty: all)."""
    patterns = [p.strip() for p in pattern.split(",") if p.strip()] or ["*"]
    return [
        op
        for op in operators()
        if available(op, "lamina") and any(fnmatch.fnmatchcase(op.name, p) for p in patterns)
    ]


def shape_of(size: int) -> tuple[int, int]:
    """The most nearly square matrix of ``size`` elements."""
    rows = math.isqrt(size)
    while size % rows:
        rows -= 1
    return (rows, size // rows)


def _input(kind: str, position: int, shape: tuple[int, int]) -> np.ndarray:
    """The input at ``position`` of kind ``kind``: the same in every process (Note
    [Separate processes]), and different from one of its kind at another position."""
    rng = np.random.default_rng([list(_INPUT_KINDS).index(kind), position])
    return _INPUT_KINDS[kind](rng, shape)


_INPUT_KINDS = {
    "x": lambda rng, shape: rng.uniform(-1, 1, shape).astype(np.float32),
    "positive": lambda rng, shape: rng.uniform(0.5, 1.5, shape).astype(np.float32),
    "above_one": lambda rng, shape: rng.uniform(1.5, 2.5, shape).astype(np.float32),
    "near_one": lambda rng, shape: rng.uniform(0.999, 1.001, shape).astype(np.float32),
    "bool": lambda rng, shape: rng.uniform(-1, 1, shape) > 0,
    "false": lambda rng, shape: np.zeros(shape, bool),
    "true": lambda rng, shape: np.ones(shape, bool),
    "labels": lambda rng, shape: rng.integers(0, shape[1], shape[0]),
}


# ---------------------------------------------------------------- measuring


def _library(library: str):
    """(to_tensor, get_threads, set_threads) of one library."""
    if library == "lamina":
        import lamina as lm

        return lm.asarray, lm.get_num_threads, lm.set_num_threads
    if library == "torch":
        import torch

        return torch.from_numpy, torch.get_num_threads, torch.set_num_threads
    return np.asarray, lambda: 1, lambda n: None  # NumPy's loops are single-threaded


def make_case(library: str, op: Op, size: int) -> Callable:
    """A function calling ``library``'s ``op`` once on inputs of ``size`` elements."""
    fn = resolve(library, op.paths[library])
    if fn is None:
        # a placeholder, so that every library's runner has the same cases and the
        # progress bar counts them alike; its time is never reported (``measure``)
        return lambda: None
    to_tensor = _library(library)[0]
    shape = shape_of(size)
    inputs = [to_tensor(_input(kind, i, shape)) for i, kind in enumerate(op.inputs)]
    kwargs = op.kwargs[library]
    return lambda: fn(*inputs, **kwargs)


def runner(library: str, config: dict) -> timing.Runner:
    """One library's cases ``config["cases"]`` ([operator, size] pairs) on
    ``config["threads"]`` threads until the runner closes."""
    _, get_threads, set_threads = _library(library)
    known = {op.name: op for op in operators()}
    cases = {
        (name, size): functools.partial(make_case, library, known[name], size)
        for name, size in config["cases"]
    }
    undo = timing.apply_settings(library, config, get_threads, set_threads)
    return timing.Runner(
        library,
        cases,
        target=config["target"],
        prime=config["target"],
        most=10**4,
        on_close=undo,
    )


def libraries(no_torch: bool) -> list[str]:
    """The libraries to time: lamina, PyTorch where importable (and not refused), NumPy."""
    torch = not no_torch and resolve("torch", "from_numpy") is not None
    return [lib for lib in LIBRARIES if lib != "torch" or torch]


def measure(args, ops: list[Op]) -> tuple[dict, list[str]]:
    """({(operator, size, threads): {library: median seconds or None}}, libraries), the
    libraries interleaved round by round, one thread count after the other."""
    names = libraries(args.no_torch)
    cases = [[op.name, size] for op in ops for size in args.sizes]
    known = {op.name: op for op in ops}
    results = {}
    for threads in args.threads:
        config = {
            "threads": threads,
            "allocator": timing.allocator_wanted(args),
            "cases": cases,
            "target": args.target,
        }
        with timing.started("ops", names, config, args.in_process) as runners:
            samples = timing.time_rounds(runners, len(cases), args.rounds, args.settle)
        for name, size in cases:
            results[name, size, threads] = {
                lib: statistics.median(samples[name, size, lib])
                if available(known[name], lib)
                else None
                for lib in names
            }
    return results, names


# ---------------------------------------------------------------- the report


def ratios(times: dict) -> tuple[float | None, float | None]:
    """(lamina / PyTorch, lamina / the faster of PyTorch and NumPy) of one case's
    times; None where a library is missing."""
    lamina = times.get("lamina")
    if lamina is None:
        return None, None
    torch = times.get("torch")
    peers = [t for t in (torch, times.get("numpy")) if t is not None]
    return (
        lamina / torch if torch is not None else None,
        lamina / min(peers) if peers else None,
    )


def geometric_mean(values) -> float | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _us(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e6:,.1f}"


def _x(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


def summary(ops: list[Op], results: dict, args) -> list[list[str]]:
    """Rows of geometric means: per category and thread count, then over all."""
    rows = []
    groups = [
        (c, [op for op in ops if op.category == c]) for c in dict.fromkeys(o.category for o in ops)
    ]
    groups.append(("all", ops))
    for threads in args.threads:
        for category, members in groups:
            r = [ratios(results[op.name, s, threads]) for op in members for s in args.sizes]
            rows.append(
                [
                    category,
                    str(threads),
                    str(len(r)),
                    _x(geometric_mean(t for t, _ in r)),
                    _x(geometric_mean(b for _, b in r)),
                ]
            )
    return rows


def worst(ops: list[Op], results: dict, args, count: int) -> list[tuple]:
    """The ``count`` cases with the highest lamina / best, highest first."""
    cases = [
        (ratios(results[op.name, s, threads])[1], op.name, s, threads)
        for op in ops
        for s in args.sizes
        for threads in args.threads
    ]
    cases = [c for c in cases if c[0] is not None]
    return sorted(cases, reverse=True)[:count]


def report(args, ops: list[Op], results: dict, names: list[str]) -> str:
    versions = ", ".join(f"{lib} {_version(lib)}" for lib in names)
    lines = [] if "torch" in names else [_without_torch(args)]
    where = "in this process" if args.in_process else "each library in its own process"
    lines += [
        f"eager operators, float32, median of {args.rounds} interleaved rounds "
        f"({versions}; {where}; lamina's pool allocator {args.allocator}); times in "
        "microseconds per call; best = the faster of PyTorch and NumPy",
        "",
    ]
    head = ["operator", "category", "elements", "threads", "lamina us", "torch us"]
    head += ["NumPy us", "lamina/torch", "lamina/best"]
    rows = []
    for op in ops:
        for size in args.sizes:
            for threads in args.threads:
                times = results[op.name, size, threads]
                to_torch, to_best = ratios(times)
                rows.append(
                    [
                        op.name,
                        op.category,
                        f"{size:,}",
                        str(threads),
                        _us(times["lamina"]),
                        _us(times.get("torch")),
                        _us(times.get("numpy")),
                        _x(to_torch),
                        _x(to_best),
                    ]
                )
    lines += output.table(head, rows, left=2)
    lines += ["", "geometric means of the ratios", ""]
    head = ["category", "threads", "cases", "lamina/torch", "lamina/best"]
    lines += output.table(head, summary(ops, results, args), left=1)
    lines += ["", "furthest behind (lamina / best)", ""]
    rows = [
        [name, f"{size:,}", str(t), _x(r)] for r, name, size, t in worst(ops, results, args, 10)
    ]
    lines += output.table(["operator", "elements", "threads", "lamina/best"], rows, left=1)
    return "\n".join(lines)


def _without_torch(args) -> str:
    if args.no_torch:
        return "PyTorch not used (--no-torch): lamina is timed beside NumPy alone"
    return (
        "PyTorch not found: lamina is timed beside NumPy alone; "
        f"`pip install torch=={output.TORCH_VERSION}` adds it"
    )


def _version(library: str) -> str:
    return importlib.import_module(library).__version__.split("+")[0]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=list(SIZES),
        help="elements per input (10^2 10^4 10^6)",
    )
    p.add_argument(
        "--threads", type=int, nargs="+", default=list(THREADS), help="thread counts (1 2)"
    )
    p.add_argument(
        "--ops",
        default="",
        metavar="PATTERN",
        help="only the operators matching this (fnmatch, comma-separated: 'sum*,exp')",
    )
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    p.add_argument("--target", type=float, default=0.01, help="seconds per timed sample (0.01)")
    timing.add_library_options(p)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: a few operators, 10^2 elements, 1 thread, 2 short rounds",
    )
    timing.add_allocator_option(p)
    p.add_argument("--json", action="store_true", help="print the medians as JSON")


QUICK_OPS = "add,exp,sum,sum axis=-1,cumulative_sum,argsort,softmax"


def run(args) -> None:
    if args.quick:
        args.sizes, args.threads, args.rounds = [10**2], [1], 2
        args.target, args.settle = 0.002, 0.0
        args.ops = args.ops or QUICK_OPS
    if min(args.sizes) < 1 or min(args.threads) < 1 or args.rounds < 1:
        raise SystemExit("--sizes, --threads and --rounds must be positive")
    ops = select(args.ops)
    if not ops:
        raise SystemExit(
            f"--ops {args.ops!r}: no operator matches ({', '.join(op.name for op in select(''))})"
        )
    results, names = measure(args, ops)
    if args.json:
        if "torch" not in names:
            print(_without_torch(args), file=sys.stderr)  # stdout stays JSON
        out = [
            {
                "operator": name,
                "elements": size,
                "threads": threads,
                **{f"{lib}_seconds": t for lib, t in times.items()},
            }
            for (name, size, threads), times in results.items()
        ]
        print(json.dumps(out, indent=2))
    else:
        print(report(args, ops, results, names))
