"""Data-parallel training on 1 and 2 processes, lamina beside PyTorch's DDP.

One training step (forward, cross-entropy loss, backward with the gradients averaged
over the processes, SGD step) of an MLP and of the AlexNet-, VGG- and
Inception-v1-like convnets of ``bench convnet`` (the same architecture descriptions),
each process on its own batch (weak scaling) and one thread, timed in four jobs:
lamina's DistributedDataParallel on 1 and on 2 processes (over MPI) and PyTorch's on
1 and 2 (gloo backend, over TCP on this machine). Every job also times the same step
without the wrapper, so without communication: on 2 processes that is the machine's
ceiling (two independent processes side by side; the efficiency a perfect exchange
would reach), and DDP's step over it is the cost of the exchange left after overlap.
The jobs are interleaved round by round (lamina.tools.bench.timing); a job's
processes start each case together and take the same number of steps.

Reported: images/s of all processes together; weak-scaling efficiency (images/s on 2
processes / twice that on 1); the ceiling's efficiency; lamina / PyTorch on 2
processes; overlap (time of a DDP step / the step without communication). Then the
bandwidth of ``all_reduce`` on float32 tensors beside mpi4py's own ``Allreduce`` on
NumPy arrays of the same size, in the same processes.

Note [Overlap bound]: DDP fills its gradient buckets in reverse parameter order, so the
buckets that hold the first layer's gradients are complete only when backward ends:
their exchange overlaps nothing, and no DDP step takes less than the step without
communication plus that exchange. The report's bound is 1 + the time of those buckets'
all-reduces (started and waited for as DDP does, on 2 processes) / the step without
communication: the MLP's first layer holds 24 of its 25 MB of gradients, so its
overlap cannot come near 1.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

from . import convnet, output, timing

# an MLP on the convnets' images: 12288 -> 512 -> 512 -> classes, 6.6 M parameters, so
# its exchange (26 MB of gradients) is large beside its computation
ARCHITECTURES = {
    "mlp": (("flatten",), ("linear", 512), ("relu",), ("linear", 512), ("relu",))
    + (("linear", convnet.CLASSES),),
    **convnet.ARCHITECTURES,
}
TITLES = {"mlp": "MLP", **convnet.TITLES}
QUICK_SIZES, FULL_SIZES = [1, 10], [1, 10, 100]  # all_reduce sizes, MB


# ---------------------------------------------------------------- in each process


class Lockstep:
    """Times cases in every process of a job at once: rank 0 (driven by the parent as a
    ``timing.Child``) passes each command on to the other ranks (``share`` sends rank
    0's value to all), so that all start a case together and take the same number of
    steps, as the collectives inside a step require."""

    def __init__(self, name, cases, share, *, target, most, on_close):
        self.name, self.cases, self.share = name, cases, share
        self.target, self.most, self.on_close = target, most, on_close
        self.runs = {}

    def warm(self):
        self.share("warm")
        yield from self._warm()

    def round(self):
        self.share("round")
        yield from self._round()

    def _warm(self):
        for key, make in self.cases.items():
            fn = make()
            fn()  # warm-up: kernels compile or load, buckets fill
            t = time.perf_counter()
            fn()
            once = time.perf_counter() - t
            self.runs[key] = (fn, self.share(max(1, min(self.most, int(self.target / once)))))
            yield key

    def _round(self):
        for key, (fn, number) in self.runs.items():
            self.share(None)  # start together
            fn()  # primes the caches as timing.Runner does
            t = time.perf_counter()
            for _ in range(number):
                fn()
            yield key, (time.perf_counter() - t) / number

    def close(self):
        self.share("close")
        self.on_close()

    def follow(self):
        """The loop of every rank but 0: do what rank 0 does, until it closes."""
        while True:
            command = self.share(None)
            if command == "close":
                self.on_close()
                return
            for _ in self._warm() if command == "warm" else self._round():
                pass


def _lamina_group():
    """(rank, share): share(value) is rank 0's value (JSON) on every rank. It pauses
    between polls: an MPI blocking call would spin, and take a core from the job being
    timed while this one waits for its turn."""
    import lamina.distributed as dist
    from lamina.distributed import collectives

    dist.init_process_group()
    g = collectives.group("bench distributed")

    def share(value):
        box = np.zeros(256, np.uint8)
        if g.rank == 0:
            text = json.dumps(value).encode()
            box[: len(text)] = np.frombuffer(text, np.uint8)
        g.wait(g.comm.Ibcast(box, root=0), "bench distributed", pause=0.001)
        return json.loads(box.tobytes().rstrip(b"\0"))

    return g.rank, share


def _torch_group(config):
    import torch.distributed as dist

    rank = int(os.environ["LAMINA_BENCH_RANK"])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{config['port']}",
        rank=rank,
        world_size=config["processes"],
    )

    def share(value):
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    return rank, share


def _allreduce_cases(library, sizes):
    from mpi4py import MPI

    import lamina as lm
    import lamina.distributed as dist

    cases = {}
    for mb in sizes:
        n = mb * 2**20 // 4
        tensor = lm.ones(n, dtype=lm.float32)
        array = np.ones(n, np.float32)
        cases["allreduce", str(mb), "lamina"] = lambda t=tensor: lambda: dist.all_reduce(t)
        cases["allreduce", str(mb), "mpi4py"] = lambda a=array: (
            lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        )
    return cases


def _last_bucket_cases(lib, models):
    """For each model, the all-reduce of its last-ready gradient buckets (those holding
    the first layer's parameters) as DDP starts them (nonblocking, then waited for):
    Note [Overlap bound]."""
    import inspect

    from lamina.distributed import collectives, ddp

    g = collectives.group("bench distributed")
    cap_mb = inspect.signature(ddp.DistributedDataParallel).parameters["bucket_cap_mb"].default
    cases = {}
    for name in models:
        named = list(convnet.build(ARCHITECTURES[name], lib).named_parameters())
        first_layer = named[0][0].rpartition(".")[0]
        last = [
            np.empty(b.offsets[-1], b.dtype)
            for b in ddp._buckets(named, cap_mb * 2**20)
            if any(n.rpartition(".")[0] == first_layer for n in b.names)
        ]

        def exchange(buffers=last):
            requests = [g.comm.Iallreduce(g.mpi.IN_PLACE, b, g.mpi.SUM) for b in buffers]
            for r in requests:
                g.wait(r, "bench distributed")

        cases["bucket", name] = lambda exchange=exchange: exchange
    return cases


def runner(library: str, config: dict):
    """One job's process (Note [Separate processes] in lamina.tools.bench.timing): the
    training cases of ``config["models"]`` with and without DDP and, for lamina on 2
    processes, the all_reduce cases. Rank 0 returns the runner its parent drives; the
    other ranks follow it here and exit."""
    lib = convnet._lamina() if library == "lamina" else convnet._torch()
    rank, share = _lamina_group() if library == "lamina" else _torch_group(config)
    undo = timing.apply_settings(library, config, lib.get_threads, lib.set_threads)
    states = convnet.load_states(config["weights"])
    cases = {}
    for name in config["models"]:
        for kind in ("ddp", "local"):
            cases["train", name, kind] = lambda name=name, kind=kind: _step(
                lib, states[name], name, kind, config["batch"]
            )
    if library == "lamina" and config["processes"] > 1:
        cases.update(_allreduce_cases(library, config["sizes"]))
        cases.update(_last_bucket_cases(lib, config["models"]))
    job = Lockstep(library, cases, share, target=0.3, most=20, on_close=undo)
    if rank == 0:
        return job
    job.follow()
    sys.exit(0)


def _step(lib, state, name, kind, batch):
    model = convnet.build(ARCHITECTURES[name], lib)
    model.load_state_dict({k: lib.tensor(a.copy()) for k, a in state.items()})
    if kind == "ddp":
        if lib.name == "lamina":
            from lamina.distributed import DistributedDataParallel
        else:
            from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    return convnet.step(lib, model, "train", batch, "NCHW")


# ---------------------------------------------------------------- the parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ONE_THREAD = dict.fromkeys(
    ("LAMINA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1"
)


class Job(timing.Child):
    """A ``timing.Child`` of several processes: lamina's through the MPI launcher (which
    passes the parent's commands to rank 0), PyTorch's started here one by one."""

    def __init__(self, library: str, processes: int, config: dict):
        from lamina.distributed.run import find_mpiexec

        self.name = library
        config = {**config, "processes": processes, "port": _free_port()}
        command = [sys.executable, "-m", "lamina.tools.bench._child", "distributed", library]
        command.append(json.dumps(config))
        env = {**os.environ, **ONE_THREAD}
        self.followers = []
        if library == "lamina":
            command = [find_mpiexec(), "-n", str(processes), *command]
        else:
            for rank in range(1, processes):
                self.followers.append(
                    subprocess.Popen(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=sys.stderr,
                        env={**env, "LAMINA_BENCH_RANK": str(rank)},
                    )
                )
            env["LAMINA_BENCH_RANK"] = "0"
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def close(self) -> None:
        super().close()
        for follower in self.followers:
            follower.wait(timeout=60)


def measure(args):
    """({(job name, *case key): median seconds}, libraries)."""
    import tempfile

    import lamina as lm

    libs = [convnet._lamina()]
    peer = None if args.no_torch else convnet._torch()
    if peer is not None:
        libs.append(peer)
    lm.random.seed(0)
    states = {
        name: {
            k: v.numpy().copy()
            for k, v in convnet.build(ARCHITECTURES[name], libs[0]).state_dict().items()
        }
        for name in args.models
    }
    allocator = timing.allocator_wanted(args)
    with tempfile.TemporaryDirectory(prefix="lamina-distributed-") as tmp:
        weights = os.path.join(tmp, "weights.npz")
        convnet.save_states(weights, states)
        config = {
            "weights": weights,
            "models": args.models,
            "batch": args.batch,
            "sizes": args.sizes,
            "threads": 1,
            "allocator": allocator,
        }
        jobs = []
        try:
            for lib in libs:
                for processes in (1, 2):
                    jobs.append(Job(lib.name, processes, config))
                    jobs[-1].name = f"{lib.name} {processes}p"
            cases = 3 * len(args.models) + 2 * len(args.sizes)  # for the progress bar
            samples = timing.time_rounds(jobs, cases, args.rounds, args.settle)
        finally:
            for job in jobs:
                job.close()
    # time_rounds' keys end with the job's name; the report's start with it
    return {(key[-1], *key[:-1]): statistics.median(s) for key, s in samples.items()}, libs


# ---------------------------------------------------------------- reporting


def report(args, results, libs) -> str:
    peer = len(libs) > 1
    versions = " and ".join(f"{lib.name} {lib.version}" for lib in libs)
    lines = [] if peer else [output.without_torch(args)]
    lines += [
        f"One training step on 1 and 2 processes x 1 thread, batch {args.batch} per process, "
        f"{'x'.join(map(str, convnet.IMAGE))} float32 images; images/s of all processes "
        f"(median of {args.rounds} rounds; {versions}, interleaved; lamina over MPI"
        + (", PyTorch DDP over gloo" if peer else "")
        + ")",
        "",
    ]

    def rate(job, name, kind, processes):
        return processes * args.batch / results[job, "train", name, kind]

    def scaling(lib, name):
        """images/s on 1 and 2 processes, the efficiency, and the overlap."""
        one, two = rate(f"{lib} 1p", name, "ddp", 1), rate(f"{lib} 2p", name, "ddp", 2)
        alone = rate(f"{lib} 2p", name, "local", 2)
        return [f"{one:.1f}", f"{two:.1f}", f"{two / (2 * one):.2f}", f"{alone / two:.2f}x"], two

    head = ["model", "lamina 1p", "lamina 2p", "efficiency", "overlap", "bound", "ceiling"]
    if peer:
        head += ["torch 1p", "torch 2p", "torch eff.", "torch overlap", "lamina/torch 2p"]
    rows = []
    for name in args.models:
        cells, two = scaling("lamina", name)
        ceiling = rate("lamina 2p", name, "local", 2) / (2 * rate("lamina 1p", name, "local", 1))
        # Note [Overlap bound]
        bound = (
            1 + results["lamina 2p", "bucket", name] / results["lamina 2p", "train", name, "local"]
        )
        row = [TITLES[name], *cells, f"{bound:.2f}x", f"{ceiling:.2f}"]
        if peer:
            cells, torch_two = scaling("torch", name)
            row += [*cells, f"{two / torch_two:.2f}x"]
        rows.append(row)
    lines += output.table(head, rows, left=1)
    lines += [
        "",
        "efficiency: images/s on 2 processes / twice those on 1; ceiling: the same for two "
        "independent processes without communication (the machine's limit); overlap: a "
        "DDP step's time / the same step without communication, on 2 processes; bound: "
        "the least overlap can be, 1 + the exchange of the first layer's gradient buckets "
        "(ready only when backward ends) / the step without communication.",
        "",
        "all_reduce (sum) of float32 on 2 processes, GB/s (bytes of the tensor / time):",
        "",
    ]
    rows = []
    for mb in args.sizes:
        mine = results["lamina 2p", "allreduce", str(mb), "lamina"]
        raw = results["lamina 2p", "allreduce", str(mb), "mpi4py"]
        size = mb * 2**20
        rows.append(
            [
                f"{mb} MB",
                f"{size / mine / 1e9:.2f}",
                f"{size / raw / 1e9:.2f}",
                f"{raw / mine:.2f}x",
            ]
        )
    lines += output.table(
        ["size", "lamina all_reduce", "mpi4py Allreduce", "lamina/mpi4py"], rows, left=1
    )
    return "\n".join(lines)


def _models(text: str) -> list[str]:
    names = list(ARCHITECTURES) if text == "all" else [m.strip() for m in text.split(",")]
    unknown = [m for m in names if m not in ARCHITECTURES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--model: expected all or some of {', '.join(ARCHITECTURES)}, got {text!r}"
        )
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        dest="models",
        type=_models,
        default=list(ARCHITECTURES),
        help=f"all (default) or some of {','.join(ARCHITECTURES)}",
    )
    p.add_argument("--batch", type=int, default=32, help="images per process and step (32)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3; --full: 7)")
    p.add_argument(
        "--full",
        action="store_true",
        help=f"the full run: 7 rounds, all_reduce of {', '.join(map(str, FULL_SIZES))} MB "
        f"(default {', '.join(map(str, QUICK_SIZES))} MB)",
    )
    timing.add_allocator_option(p)
    p.add_argument("--settle", type=float, default=0.3, help="seconds to wait between jobs (0.3)")
    p.add_argument(
        "--no-torch", action="store_true", help="lamina alone, even if PyTorch is installed"
    )


def run(args) -> None:
    if args.rounds < 1 or args.batch < 1:
        raise SystemExit("--rounds and --batch must be positive")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise SystemExit(
            "bench distributed needs mpi4py and an MPI library: pip install 'lamina[distributed]'"
        ) from None
    args.sizes = FULL_SIZES if args.full else QUICK_SIZES
    if args.full:
        args.rounds = max(args.rounds, 7)
    print(report(args, *measure(args)))
