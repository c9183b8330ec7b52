"""``python -m lamina.precompile``: compile every CPU kernel into Numba's on-disk cache.

lamina compiles a kernel the first time a call needs it (one dtype, one variant at a
time, ~0.1-0.4 s each) and Numba caches it on disk, so later processes load it in
milliseconds; the C core's loops go to the loop cache, which later processes open
without importing Numba at all (Note [Loop cache] in backends/loop_cache.py). A fresh
machine, a new virtual environment, a container image or a CI cache therefore pays
those compilations once, spread over the first calls; this command pays them all up
front, with a progress bar: the elementwise operators (contiguous, strided and scalar
loops, and the C core's; ``--parallel`` adds the multi-threaded variants used from
2**17 elements on), reductions, scans and integer matmul, for every dtype each
accepts. ``--dtypes float32,int64`` limits it to some dtypes.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np

import lamina as lm
from lamina.backends import setup as S
from lamina.backends.numba_cpu import elementwise
from lamina.dispatch import core
from lamina.dispatch import dtypes as D


def _elementwise_jobs(dtypes: list[D.DType], parallel: bool) -> list[tuple[str, Callable]]:
    jobs = []
    for name, ew in sorted(elementwise.BY_NAME.items()):
        families = ["flat", "strided"] + (["scalar"] if ew.arity == 2 else [])
        if parallel:
            families += [f + "_parallel" for f in families]
        for d in dtypes:
            try:
                accepted = S.check_dtype(ew.op, d) is d
            except TypeError:
                accepted = False
            if not accepted:
                continue
            for fam in families:
                family = getattr(ew, fam)
                jobs.append((f"{name} {d.name} {fam}", _builder(family, d.index)))
            if core.IMPLEMENTATION == "c" and ew.arity != 3:
                jobs.append((f"{name} {d.name} C loops", _c_loops(ew, d.index)))
    return jobs


def _c_loops(ew: elementwise.Elementwise, index: int) -> Callable:
    forms = [core.LOOP_FLAT, core.LOOP_STRIDED] + ([core.LOOP_SCALAR] if ew.arity == 2 else [])

    def build() -> None:
        for form in forms:
            ew.address(form, index)

    return build


def _builder(family: elementwise.jit.Family, index: int) -> Callable:
    def build() -> None:
        if isinstance(family[index], elementwise.jit._Stub):
            family[index] = family.build(index)

    return build


def _call_jobs(dtypes: list[D.DType]) -> list[tuple[str, Callable]]:
    """Operators whose kernels are compiled per layout: called on small tensors (a
    C-contiguous, a column-major and a strided one) of each dtype."""
    jobs = []
    for d in dtypes:

        def run(d: D.DType = d) -> None:
            base = np.arange(6).reshape(2, 3).astype(d.np)
            ordered = d.kind != "c"  # complex numbers have no max, min, argmax, argmin
            for data in (base, np.asfortranarray(base), base[:, ::2]):
                x = lm.asarray(data)
                for axis in (0, 1):
                    for fn in (lm.sum, lm.prod, lm.all, lm.any, lm.cumulative_sum):
                        fn(x, axis=axis)
                    lm.cumulative_prod(x, axis=axis)
                    if ordered:
                        for fn in (lm.max, lm.min, lm.argmax, lm.argmin):
                            fn(x, axis=axis)
                if d.kind in "fiuc":
                    lm.mean(lm.astype(x, D.default_float if d.kind in "iu" else d), axis=1)
            if d.kind in "iu":
                lm.matmul(lm.asarray(base), lm.asarray(base.T.copy()))

        jobs.append((f"reductions, scans, matmul {d.name}", run))
    return jobs


def _bar(done: int, total: int, label: str, width: int = 30) -> str:
    filled = width * done // max(total, 1)
    return f"\r[{'#' * filled}{'.' * (width - filled)}] {done:>4}/{total}  {label[:40]:<40}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lamina.precompile", description=__doc__)
    parser.add_argument("--parallel", action="store_true", help="also the parallel variants")
    parser.add_argument("--dtypes", help="comma-separated dtype names (default: all)")
    args = parser.parse_args(argv)
    dtypes = list(D.ALL)
    if args.dtypes:
        dtypes = [D.as_dtype(name.strip()) for name in args.dtypes.split(",")]
    jobs = _elementwise_jobs(dtypes, args.parallel) + _call_jobs(dtypes)
    start = time.perf_counter()
    out = sys.stderr
    for i, (label, job) in enumerate(jobs):
        out.write(_bar(i, len(jobs), label))
        out.flush()
        job()
    out.write(_bar(len(jobs), len(jobs), "done") + "\n")
    print(f"compiled or loaded {len(jobs)} kernel groups in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
