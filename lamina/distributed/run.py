"""``python -m lamina.distributed.run -n N [--hostfile FILE] script.py [args]``: start
N processes of a training script through the MPI launcher (``mpiexec``) of this
environment, each with a share of the cores as its threads.

Note [Threads per process]: processes times threads never exceed the cores of a
machine, or the processes' thread pools take the cores from each other in turn and
every step waits for the slowest. So each process gets ``cores // processes on the
machine`` threads (at least one): on one machine the processes are N; with a host
file they are spread over its hosts, ``ceil(N / hosts)`` on each (the cores counted
are this machine's: give ``--threads`` when the hosts differ). The count is passed as
``LAMINA_NUM_THREADS`` and, for the BLAS and OpenMP pools, ``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS`` and ``MKL_NUM_THREADS``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys

THREAD_VARIABLES = (
    "LAMINA_NUM_THREADS",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
)


def find_mpiexec() -> str:
    """The ``mpiexec`` beside this Python (a virtual environment's, where the MPI
    package installed it), else the first on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec")
    if found is None:
        raise SystemExit(
            "no mpiexec found beside this Python or on PATH; install an MPI library, for "
            "example with pip install 'lamina[distributed]'"
        )
    return found


def hosts_in(path: str) -> list[str]:
    """The hosts of an MPI host file: one per line, ``host`` or ``host:slots``; blank
    lines and ``#`` comments skipped."""
    try:
        with open(path) as f:
            lines = [line.split("#", 1)[0].strip() for line in f]
    except OSError as e:
        raise SystemExit(f"--hostfile: cannot read {path}: {e.strerror}") from None
    hosts = [line.split(":", 1)[0] for line in lines if line]
    if not hosts:
        raise SystemExit(f"--hostfile: {path} lists no hosts")
    return hosts


def threads_per_process(processes: int, hosts: int, cores: int) -> int:
    """Note [Threads per process]."""
    return max(1, cores // math.ceil(processes / hosts))


def command(args: argparse.Namespace, cores: int) -> tuple[list[str], dict[str, str]]:
    """The launcher's command line and the variables to add to its environment."""
    hosts = 1 if args.hostfile is None else len(hosts_in(args.hostfile))
    threads = args.threads or threads_per_process(args.nproc, hosts, cores)
    line = [args.mpiexec or find_mpiexec(), "-n", str(args.nproc)]
    if args.hostfile is not None:
        line += ["-f", args.hostfile]
    line += [sys.executable, args.script, *args.script_args]
    return line, dict.fromkeys(THREAD_VARIABLES, str(threads))


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lamina.distributed.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-n", "--nproc", type=_positive, required=True, help="processes to start")
    p.add_argument("--hostfile", help="MPI host file: the machines to start them on")
    p.add_argument(
        "--threads",
        type=_positive,
        help="threads per process (default: this machine's cores / processes on it)",
    )
    p.add_argument("--mpiexec", help="the MPI launcher (default: the one of this environment)")
    p.add_argument(
        "--dry-run", action="store_true", help="print the command and its thread settings only"
    )
    p.add_argument("script", help="the training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def _cores() -> int:
    """The cores this process may run on (a container's or taskset's share)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    line, variables = command(args, _cores())
    if args.dry_run:
        settings = " ".join(f"{k}={v}" for k, v in variables.items())
        print(f"{settings} {' '.join(line)}")
        return 0
    return subprocess.call(line, env={**os.environ, **variables})


if __name__ == "__main__":
    sys.exit(main())
