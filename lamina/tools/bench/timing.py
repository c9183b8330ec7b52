"""Timing libraries round by round, each in a process of its own or all in this one:
the machinery ``bench convnet`` and ``bench nn`` share.

A benchmark module (``lamina.tools.bench.convnet``, ``.nn``) provides
``runner(library, config) -> Runner``: the library's cases, ready to time, from a JSON
config. ``started`` makes one runner per library -- in child processes (``Child``,
the default) or in this process -- and ``time_rounds`` drives them: every case of
each once to warm up, then round after round one sample of every case of one
library, then of the next.

Note [Separate processes]: in one process two libraries' OpenMP pools (Numba's
libgomp, PyTorch's) and BLAS pools compete for the cores: on 2 cores lamina's AlexNet
training at batch 32 went 343 -> 165 images/s from 1 to 2 threads beside PyTorch,
327 -> 341 alone. So by default every library is timed in a child process of its own
(``python -m lamina.tools.bench._child MODULE CONFIG``, which calls the module's
``runner`` there), driven round by round from the parent, which keeps the progress
bar and the report; the children make their inputs from the config (file names,
random generators' starting points), so every process times the same thing.
``in_process`` times all libraries in the parent: quicker to start, distorted at more
than one thread.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator


def progress(done: int, total: int, what: str) -> None:
    """A progress bar on stderr, when it is a terminal."""
    if not sys.stderr.isatty():
        return
    width = 30
    filled = round(width * done / total)
    bar = "#" * filled + "-" * (width - filled)
    end = "\n" if done == total else ""
    print(f"\r[{bar}] {done}/{total} {what:45.45s}", end=end, file=sys.stderr, flush=True)


def calls_per_sample(fn: Callable, target: float, most: int) -> int:
    """Calls per timed sample (1 to ``most``), so that a sample lasts about ``target``
    seconds: from the quickest of up to three calls (one alone may catch a slow moment
    and make the samples of a quick case needlessly short), one call where that
    already takes ``target``."""
    quickest, spent = math.inf, 0.0
    for _ in range(3):
        t = time.perf_counter()
        fn()
        once = time.perf_counter() - t
        quickest, spent = min(quickest, once), spent + once
        if spent >= target:
            break
    return max(1, min(most, int(target / max(quickest, 1e-9))))


PRIME_SECONDS = 0.1  # the untimed run before each sample lasts at least this (Runner)


def not_run() -> None:
    """The function timed for a case a library cannot or may not run (NumPy's training
    step, a torch.compile that fails, a compiled model that disagrees with its eager
    one): every runner has the same cases, and this one's times are None."""


class Runner:
    """Times one library's cases in the calling process. ``cases`` maps a key (a
    tuple of JSON scalars) to a function making the function to time (so that inputs
    are made as each case warms up); ``warm`` runs each once (its kernels compile or
    load) and picks its calls per sample, ``round`` then gives one sample per case.
    Each sample follows an untimed run of as many calls, and of at least
    ``prime`` seconds (PRIME_SECONDS unless told), so that it measures calls made back
    to back, not the state the
    previous case or the pause between libraries left: the caches, and the CPUs
    waking from ``time_rounds``' ``settle`` pause. Measured on 2 cores: lamina's relu
    on 16x64x56x56 float32 took 0.72-0.76 ms per call in samples of ~3 ms right after
    a 0.3 s pause, 0.25-0.28 ms without one; even a whole training step, the convnet
    bench's VGG at batch 32 on two threads, took 106-110 ms right after the pause and
    79-83 back to back (on one thread 126 and 125: the idle second CPU is slow to come
    back), and bench nn's first case, the NCHW convolution, 18-21 ms after one untimed
    call against 10.6-10.9 back to back. A case whose function is ``not_run`` times
    as None. ``close`` calls ``on_close`` (restoring what the runner changed, such as
    thread counts)."""

    def __init__(
        self,
        name: str,
        cases: dict[tuple, Callable[[], Callable]],
        *,
        target: float,
        most: int,
        prime: float = PRIME_SECONDS,
        on_close: Callable[[], None] = lambda: None,
    ):
        self.name, self.cases = name, cases
        self.target, self.most, self.prime = target, most, prime
        self.on_close = on_close
        self.runs = {}

    def warm(self) -> Iterator[tuple]:
        """Yields each case's key once it is warm."""
        for key, make in self.cases.items():
            fn = make()
            fn()  # warm-up: kernels compile or load from the cache
            self.runs[key] = (fn, calls_per_sample(fn, self.target, self.most))
            yield key

    def round(self) -> Iterator[tuple[tuple, float]]:
        """Yields (key, seconds per call) for every case."""
        for key, (fn, number) in self.runs.items():
            if fn is not_run:
                yield key, None
                continue
            primed = time.perf_counter() + self.prime
            for i in itertools.count():
                fn()
                if i + 1 >= number and time.perf_counter() >= primed:
                    break
            t = time.perf_counter()
            for _ in range(number):
                fn()
            yield key, (time.perf_counter() - t) / number

    def close(self) -> None:
        self.on_close()


def add_library_options(p) -> None:
    """``--settle``, ``--no-torch`` and ``--in-process``: how the libraries are run."""
    p.add_argument(
        "--settle", type=float, default=0.3, help="seconds to wait between libraries (0.3)"
    )
    p.add_argument(
        "--no-torch", action="store_true", help="lamina alone, even if PyTorch is installed"
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="time every library in this process (default: each in a child process of its "
        "own, so that their thread pools do not compete)",
    )


def add_allocator_option(p) -> None:
    p.add_argument(
        "--allocator",
        choices=["on", "off"],
        default="on",
        help="lamina's pool allocator (on: the README's advice for training)",
    )


def allocator_wanted(args) -> bool:
    """``--allocator on`` where the core has the pool (the pure-Python one has none:
    then it says so, and ``args.allocator`` becomes "off" for the report)."""
    from lamina.dispatch import memory

    if args.allocator == "on" and not memory.AVAILABLE:
        print("lamina's pool allocator needs the C core: timing without it", file=sys.stderr)
        args.allocator = "off"
    return args.allocator == "on"


def apply_settings(
    library: str, config: dict, get_threads: Callable[[], int], set_threads: Callable
) -> Callable[[], None]:
    """Gives a runner's library ``config["threads"]`` threads and, for lamina when
    ``config["allocator"]`` asks for it, its pool allocator; returns what undoes both
    (the runner's ``on_close``)."""
    saved = get_threads()
    set_threads(config["threads"])
    pooled = library == "lamina" and config["allocator"]
    if pooled:
        import lamina as lm

        lm.layers.enable("allocator")

    def undo():
        set_threads(saved)
        if pooled:
            lm.layers.disable("allocator")

    return undo


class Child:
    """A ``Runner`` in a child process (Note [Separate processes]), made there by
    ``lamina.tools.bench.<module>.runner(library, config)`` and driven through JSON
    lines: the parent writes a command on the child's stdin, the child answers one line
    per case on a private copy of its stdout (its own stdout goes to stderr, so that
    nothing a library prints can garble the answers)."""

    def __init__(self, module: str, library: str, config: dict):
        self.name = library
        command = [sys.executable, "-m", "lamina.tools.bench._child", module, library]
        self.proc = subprocess.Popen(
            [*command, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _ask(self, command: str) -> Iterator[tuple[tuple, float | None]]:
        with contextlib.suppress(BrokenPipeError):  # a child that died: reported below
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                code = self.proc.wait()
                raise SystemExit(
                    f"the {self.name} benchmark process exited with status {code} "
                    "(its error is above)"
                )
            answer = json.loads(line)
            if "done" in answer:
                return
            yield tuple(answer["key"]), answer.get("seconds")

    def warm(self) -> Iterator[tuple]:
        for key, _ in self._ask("warm"):
            yield key

    def round(self) -> Iterator[tuple[tuple, float]]:
        yield from self._ask("round")

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()  # ends the child's command loop
        self.proc.wait(timeout=60)
        self.proc.stdout.close()


def _runner(module: str, library: str, config: dict) -> Runner:
    return importlib.import_module(f"lamina.tools.bench.{module}").runner(library, config)


def child_main(module: str, library: str, config: dict) -> None:
    """The loop of a ``Child``: make the runner, then answer ``warm`` and ``round``
    commands until stdin closes."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the libraries print goes to stderr
    runner = _runner(module, library, config)
    for command in sys.stdin:
        if command.strip() == "warm":
            results = ((key, None) for key in runner.warm())
        else:
            results = runner.round()
        for key, seconds in results:
            answers.write(json.dumps({"key": list(key), "seconds": seconds}) + "\n")
            answers.flush()
        answers.write('{"done": true}\n')
        answers.flush()
    runner.close()


@contextlib.contextmanager
def started(module: str, libraries: list[str], config: dict, in_process: bool, tag: str = ""):
    """One runner per library of benchmark ``module``, in child processes or (with
    ``in_process``) in this one, named after its library with ``tag`` added (the
    libraries' samples in ``time_rounds``); closed on exit."""
    runners = []
    try:
        for library in libraries:
            if in_process:
                runners.append(_runner(module, library, config))
            else:
                runners.append(Child(module, library, config))
            runners[-1].name = library + tag
        yield runners
    finally:
        # last first: runners in this process that change one library's settings (eager
        # and compiled lamina) each restore what the one before them found
        for runner in reversed(runners):
            runner.close()


def time_rounds(runners: list, cases: int, rounds: int, settle: float) -> dict:
    """{(*key, library): [seconds per call, one per round]} of ``runners`` that have
    ``cases`` cases each."""
    total = cases * len(runners) * (rounds + 1)
    done = 0
    for runner in runners:
        for key in runner.warm():
            done += 1
            progress(done, total, f"warm-up {' '.join(map(str, key))} {runner.name}")
    samples = {}
    for r in range(rounds):
        # One library's cases, then the next's: a library's threads spin for a while
        # after its last call (OpenBLAS's up to ~0.1 s) and would be charged to the
        # other's next call, so the switch waits ``settle`` seconds.
        for runner in runners:
            time.sleep(settle)
            for key, seconds in runner.round():
                samples.setdefault((*key, runner.name), []).append(seconds)
                done += 1
                what = f"round {r + 1}/{rounds}: {' '.join(map(str, key))} {runner.name}"
                progress(done, total, what)
    return samples
