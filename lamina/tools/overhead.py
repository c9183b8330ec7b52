"""Where does the time of one operator go?  ``python -m lamina.overhead``

Runs the per-operator framework overhead benchmark (``output = output + x`` for ``k``
iterations, from the PyTorch study of framework overhead) with the
layers switched off one after another, from the full stack down to the raw Numba kernel
on preallocated arrays, and attributes the full-stack time to buckets: binding,
dispatcher, autograd, sparse check, operator setup (incl. allocation), computation.
NumPy and (when importable) PyTorch run in the same rounds, interleaved. ``--callgrind``
gives the same attribution in instruction counts: each configuration runs under
``valgrind --tool=callgrind`` at ``k`` and ``2k`` iterations and reports
(instructions(2k) - instructions(k)) / k, so start-up and JIT compilation cancel out.

Both cores are measured (Note [Two cores] in dispatch/reference.py): the C core in this
process, the pure-Python one in a child process with ``LAMINA_PURE_PYTHON=1``, each with
NumPy and PyTorch in its own rounds; ``--stack c`` or ``--stack python`` measures one.
The raw kernel of the C core is its contiguous loop called by address from C
(``_core.time_loop``); of the Python core, the Numba entry point.

Note [Frozen imports]: before timing, the objects that importing lamina, NumPy, Numba
and PyTorch left behind are moved out of the garbage collector's reach
(``gc.freeze()``). Every library's own per-call garbage is still collected, but no
library pays for walking another's imports: with PyTorch's ~165,000 objects in the
process, each full collection a graph-recording loop triggers cost lamina ~6 us/op in
the rounds that had one, a cost a program without PyTorch in it never sees.
"""

import argparse
import gc
import json
import operator
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

# Each row switches off one more layer (cumulatively); see lamina/layers.py.
CONFIGS = [
    ("full", ()),
    ("autograd off", ("autograd",)),
    ("sparse off", ("autograd", "sparse")),
    ("checks off", ("autograd", "sparse", "checks")),
    ("dispatcher off", ("autograd", "sparse", "checks", "dispatcher")),
    ("raw kernel", None),
]
BUCKETS = ("binding", "dispatcher", "autograd", "sparse check", "operator setup", "computation")


class _Probe:
    """A Python object whose operator returns at once: the cost of the binding alone."""

    def __add__(self, other):
        return self

    __sub__ = __mul__ = __truediv__ = __add__

    def __call__(self, a, b):
        return a


def _inputs(args):
    import lamina as lm

    data = np.random.default_rng(0).standard_normal(args.n).astype(args.dtype)
    x = lm.asarray(data)
    if args.requires_grad:
        x.requires_grad_()
    if args.sparse:
        x = x.to_sparse()
    return x


def _step(args):
    """The loop body: ``out = out + x`` (through Tensor.__add__, as in the study), or
    ``out = op(out, x)`` for another --op."""
    import lamina as lm

    return operator.add if args.op == "add" else getattr(lm, args.op)


def _runner(config, args):
    """A function(k) that runs the loop k times in ``config`` and returns the seconds
    the loop took (switching layers is not timed); None where the config cannot run."""
    import lamina as lm

    name, off = config
    x = _inputs(args)
    if off is None or "autograd" in off:
        x = x.detach()  # nothing records below the autograd row, whatever x requires
    if name == "raw kernel":
        return None if args.sparse else _raw_loop(x, args)
    if args.sparse and ("sparse" in off or "checks" in off):
        return None
    step = _step(args)

    def loop(k):
        with lm.layers.off(*off):
            out = lm.zeros_like(x) if not args.sparse else x
            t = time.perf_counter()
            for _ in range(k):
                out = step(out, x)
            return time.perf_counter() - t

    try:
        loop(50)  # warm-up: JIT compilation, and a check that the config can run
    except Exception:
        return None
    return loop


def _raw_loop(x, args):
    """The loop alone on preallocated arrays: the computation bucket."""
    from lamina.backends.numba_cpu.elementwise import BY_NAME
    from lamina.dispatch import core

    ew = BY_NAME[args.op]
    if ew.numpy_ufunc(x.dtype.index) is not None:
        return None  # NumPy's loop computes: lamina has no loop of its own to time alone
    a = x.numpy().reshape(-1)
    out = np.zeros_like(a)
    if core.IMPLEMENTATION == "c":
        from lamina.dispatch import _core

        address = ew.address(core.TENSOR, x.dtype.index)

        def loop(k):
            t = time.perf_counter()
            _core.time_loop(address, 2, out, a, out, k)
            return time.perf_counter() - t

    else:
        entry = ew.flat[x.dtype.index]

        def loop(k):
            t = time.perf_counter()
            for _ in range(k):
                entry(out, a, out)
            return time.perf_counter() - t

    loop(10)
    return loop


def _peers(args):
    peers = {}
    data = np.random.default_rng(0).standard_normal(args.n).astype(args.dtype)
    if not args.sparse and not args.requires_grad:
        npfn = getattr(
            np, {"subtract": "subtract", "multiply": "multiply"}.get(args.op, args.op), None
        )

        def numpy_loop(k, x=data.copy(), fn=npfn):  # noqa: B008 (bound once, as locals)
            out = np.zeros_like(x)
            t = time.perf_counter()
            for _ in range(k):
                out = fn(out, x)
            return time.perf_counter() - t

        peers["numpy"] = numpy_loop
    try:
        import torch
    except ImportError:
        peers["torch"] = None
        return peers
    torch.set_num_threads(args.threads)
    t = torch.tensor(data, requires_grad=args.requires_grad)
    if args.sparse:
        t = t.detach().to_sparse()
    tfn = getattr(torch, args.op)

    def torch_loop(k, x=t, fn=tfn):
        out = torch.zeros_like(x) if not args.sparse else x
        t = time.perf_counter()
        for _ in range(k):
            out = fn(out, x)
        return time.perf_counter() - t

    peers["torch"] = torch_loop
    return peers


def _progress(msg):
    if sys.stderr.isatty():
        print(f"\r{msg:60s}", end="", file=sys.stderr, flush=True)


def measure(args):
    """Median ns per op of every configuration and peer, in interleaved rounds."""
    import lamina as lm

    lm.set_num_threads(args.threads)
    runners = {name: _runner((name, off), args) for name, off in CONFIGS}

    runners["binding probe"] = _probe_loop
    peers = _peers(args)
    for fn in peers.values():
        if fn is not None:
            fn(50)
    _freeze_imports()
    times = {name: [] for name, fn in {**runners, **peers}.items() if fn is not None}
    for r in range(args.rounds):
        for name, fn in list(runners.items()) + list(peers.items()):
            if fn is None:
                continue
            _progress(f"round {r + 1}/{args.rounds}: {name}")
            times[name].append(fn(args.k) / args.k * 1e9)
    _progress("")
    return {name: statistics.median(v) for name, v in times.items()}


def attribute(ns):
    """Buckets from the row medians. Rows are first made monotone from the top down
    (a row is never slower than the row above it; differences below zero are noise),
    so every bucket is >= 0 and they add up to the full-stack time exactly."""
    order = [name for name, _ in CONFIGS]
    capped, ceiling = {}, ns["full"]
    for name in order:
        if ns.get(name) is None:
            capped[name] = ceiling
            continue
        ceiling = capped[name] = min(ns[name], ceiling)
    raw = capped["raw kernel"]
    binding = min(ns.get("binding probe", 0.0), capped["dispatcher off"] - raw)
    return {
        "binding": binding,
        "dispatcher": capped["checks off"] - capped["dispatcher off"],
        "autograd": capped["full"] - capped["autograd off"],
        "sparse check": capped["autograd off"] - capped["sparse off"],
        "operator setup": (
            capped["sparse off"] - capped["checks off"] + capped["dispatcher off"] - binding - raw
        ),
        "computation": raw,
    }


def _bar(value, total, width=30):
    n = round(width * value / total) if total else 0
    return "#" * n


def report(args, ns, buckets, peers):
    full = ns["full"]
    what = f"{args.op}, n={args.n} {args.dtype}, {args.threads} thread(s)"
    what += ", requires_grad" if args.requires_grad else ""
    what += ", sparse" if args.sparse else ""
    unit = "instructions/op" if args.callgrind else "ns/op (median)"
    lines = [
        f"output = {args.op}(output, x): {what}; k={args.k}",
        "",
        f"{'configuration':18s} {unit:>16s}  {'x full':>7s}",
    ]
    for name, _ in CONFIGS:
        v = ns.get(name)
        lines.append(
            f"{name:18s} {'n/a':>16s}" if v is None else f"{name:18s} {v:16,.0f}  {v / full:7.2f}"
        )
    for name, v in peers.items():
        lines.append(
            f"{name:18s} {'not installed':>16s}"
            if v is None
            else f"{name:18s} {v:16,.0f}  {v / full:7.2f}   lamina/{name} = {full / v:.2f}x"
        )
    lines += ["", f"{'bucket':18s} {unit:>16s}  {'share':>6s}"]
    for name in BUCKETS:
        v = buckets[name]
        lines.append(f"{name:18s} {v:16,.0f}  {v / full:6.1%}  {_bar(v, full)}")
    lines.append(f"{'total':18s} {sum(buckets.values()):16,.0f}")
    if any(ns.get(name) is None for name, _ in CONFIGS):
        lines.append(
            "(n/a: that layer cannot be switched off for this workload; the "
            "time below the last measured row is counted as computation)"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- callgrind


def _freeze_imports():
    """Note [Frozen imports]."""
    gc.collect()
    gc.freeze()


def _control(*flags):
    subprocess.run(["callgrind_control", *flags, str(os.getpid())], check=True, capture_output=True)


def _child(args):
    """Under callgrind: every configuration's loop at k and at 2k iterations, with the
    instrumentation on only around each loop and a dump after it (the study's
    _valgrind_toggle, done with callgrind_control), so one process (one import, one
    JIT compilation) serves every row. A configuration that cannot run dumps nothing
    and is announced on stdout."""
    peers = _peers(args)
    for name in [name for name, _ in CONFIGS] + ["binding probe", *peers]:
        runner = (
            _probe_loop
            if name == "binding probe"
            else peers[name]
            if name in peers
            else _runner(next(c for c in CONFIGS if c[0] == name), args)
        )
        if runner is None:
            print(f"skip {name}", flush=True)
            continue
        runner(10)
        _freeze_imports()
        for k in (args.k, 2 * args.k):
            _control("-z")
            _control("-i", "on")
            runner(k)
            _control("-i", "off")
            _control("-d", name)
        print(f"done {name}", flush=True)


def _probe_loop(k, a=_Probe()):  # noqa: B008 (bound once, a local in the loop)
    out = a
    t = time.perf_counter()
    for _ in range(k):
        out = out + a
    return time.perf_counter() - t


def _read_dump(path):
    """(configuration name, instruction total) of one callgrind dump."""
    name = total = None
    with open(path) as f:
        for line in f:
            if line.startswith("desc: Trigger: dump "):
                name = line[len("desc: Trigger: dump ") :].strip()
            elif line.startswith("totals:"):
                total = int(line.split()[1])
    return name, total


def measure_callgrind(args):
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit(
            "--callgrind needs valgrind (with callgrind_control) on PATH; "
            "install it, e.g. apt-get install valgrind"
        )
    _progress("running every configuration under callgrind (a few minutes)")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "lamina.overhead",
            "--child",
            "all",
            "--k",
            str(args.k),
            "--n",
            str(args.n),
            "--op",
            args.op,
            "--dtype",
            args.dtype,
            "--threads",
            str(args.threads),
        ]
        cmd += ["--requires-grad"] if args.requires_grad else []
        cmd += ["--sparse"] if args.sparse else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(args.stack))
        if proc.returncode:
            raise RuntimeError(f"the callgrind run failed:\n{proc.stderr[-2000:]}")
        dumps = sorted(
            (p for p in os.listdir(tmp) if p.startswith("cg.out.")),
            key=lambda p: int(p.rsplit(".", 1)[1].split("-")[0]),
        )
        totals = {}  # configuration -> [total at k, total at 2k]
        for p in dumps:
            name, total = _read_dump(os.path.join(tmp, p))
            totals.setdefault(name, []).append(total)
    result = {}
    for line in proc.stdout.splitlines():
        name = line.split(" ", 1)[1]
        counts = totals.get(name, [])
        if len(counts) != 2:
            if line.startswith("done"):
                raise RuntimeError(f"callgrind wrote {len(counts)} dumps for {name!r}, expected 2")
            result[name] = None
        else:
            result[name] = (counts[1] - counts[0]) / args.k
    _progress("")
    return result


def _env(stack):
    """The environment of a process measuring ``stack`` ("c" or "python")."""
    env = dict(os.environ)
    env.pop("LAMINA_PURE_PYTHON", None)
    if stack == "python":
        env["LAMINA_PURE_PYTHON"] = "1"
    return env


def _measure_stack(args, stack):
    """(rows, buckets, peers) of one core: in this process when it is this process's."""
    from lamina.dispatch import core

    if args.callgrind:
        ns = measure_callgrind(argparse.Namespace(**{**vars(args), "stack": stack}))
    elif stack == core.IMPLEMENTATION:
        ns = measure(args)
    else:
        cmd = [sys.executable, "-m", "lamina.overhead", "--json", "--stack", stack]
        for flag in ("op", "n", "k", "rounds", "dtype", "threads"):
            cmd += [f"--{flag}", str(getattr(args, flag))]
        cmd += ["--requires-grad"] if args.requires_grad else []
        cmd += ["--sparse"] if args.sparse else []
        out = subprocess.run(cmd, capture_output=True, text=True, env=_env(stack))
        if out.returncode:
            raise RuntimeError(f"measuring the {stack} core failed:\n{out.stderr[-2000:]}")
        data = json.loads(out.stdout)[0]
        ns = {r["config"]: r["ns_per_op"] for r in data["rows"]} | data["peers"]
    if ns.get("full") is None:
        raise SystemExit(f"the full-stack configuration of the {stack} core could not run")
    peers = {name: ns.get(name) for name in ("numpy", "torch")}
    return ns, attribute(ns), peers


STACK_TITLES = {"c": "C core", "python": "pure-Python core (LAMINA_PURE_PYTHON=1)"}


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m lamina.overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--op", default="add", help="a binary elementwise operator (add)")
    p.add_argument("--n", type=int, default=100, help="elements per tensor (100)")
    p.add_argument("--k", type=int, default=20000, help="loop iterations per round")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (7)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--requires-grad", action="store_true")
    p.add_argument("--sparse", action="store_true")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--callgrind", action="store_true", help="instruction counts under valgrind instead of time"
    )
    p.add_argument(
        "--stack",
        choices=("both", "c", "python"),
        default="both",
        help="which core to measure (both: C, when built, and pure Python)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from lamina.backends.numba_cpu.elementwise import BY_NAME

    if args.op != "add" and getattr(BY_NAME.get(args.op), "arity", None) != 2:
        binary = ", ".join(sorted(n for n, ew in BY_NAME.items() if ew.arity == 2))
        p.error(f"--op {args.op!r} is not a binary elementwise operator; choose one of {binary}")
    os.environ.setdefault("NUMBA_NUM_THREADS", str(max(args.threads, 1)))
    if args.child:
        return _child(args)
    from lamina.dispatch import core

    stacks = {"both": ["c", "python"], "c": ["c"], "python": ["python"]}[args.stack]
    if core.IMPLEMENTATION == "python" and not core.PURE_PYTHON:
        stacks = ["python"]  # the C core is not built here
    results = {stack: _measure_stack(args, stack) for stack in stacks}
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "stack": stack,
                        "rows": [
                            {"config": name, "ns_per_op": ns.get(name)} for name, _ in CONFIGS
                        ],
                        "buckets": buckets,
                        "peers": peers,
                        "unit": "instructions" if args.callgrind else "ns",
                    }
                    for stack, (ns, buckets, peers) in results.items()
                ]
            )
        )
        return
    for i, (stack, (ns, buckets, peers)) in enumerate(results.items()):
        print(("\n" if i else "") + f"== {STACK_TITLES[stack]} ==")
        print(report(args, ns, buckets, peers))


if __name__ == "__main__":
    main()
