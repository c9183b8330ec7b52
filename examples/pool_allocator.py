"""The pool allocator ("allocator" layer, lamina.memory) on and off, measured.

    python examples/pool_allocator.py [--n 16000000] [--steps 15] [--rounds 3] [--threads 1]

Each round runs one training step of an elementwise model (``relu(x * w + 1)``, a sum
of squares, backward, an SGD update) over ``n`` float32 values in two child processes,
pool off and pool on, and prints the median time per step and the minor page faults per
step (``resource.getrusage``) of each.
"""

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, resource, statistics, sys, time
import numpy as np
import lamina as lm

n, steps, on, threads = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "on", int(sys.argv[4])
lm.set_num_threads(threads)
rng = np.random.default_rng(0)
x = lm.asarray(rng.standard_normal(n).astype(np.float32))
w = lm.asarray(rng.standard_normal(n).astype(np.float32), requires_grad=True)


def step():
    h = lm.maximum(x * w + 1.0, 0.0)
    lm.sum(h * h).backward()
    with lm.no_grad():
        w.__isub__(0.001 * w.grad)
    w.grad = None


if on:
    lm.layers.enable("allocator")
for _ in range(3):
    step()
times, before = [], resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(steps):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"ms": statistics.median(times) * 1e3, "faults": faults / steps}))
"""


def run(n, steps, mode, threads):
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), str(steps), mode, str(threads)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16_000_000)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    results = {"off": [], "on": []}
    for r in range(args.rounds):
        for mode in results:
            print(f"\rround {r + 1}/{args.rounds}: pool {mode} ", end="", file=sys.stderr)
            results[mode].append(run(args.n, args.steps, mode, args.threads))
    print("\r" + " " * 40 + "\r", end="", file=sys.stderr)
    print(f"training step over {args.n:,} float32, median of {args.rounds} rounds")
    print(f"{'pool':6s} {'ms/step':>10s} {'minor faults/step':>18s}")
    for mode, rows in results.items():
        ms = statistics.median(row["ms"] for row in rows)
        faults = statistics.median(row["faults"] for row in rows)
        print(f"{mode:6s} {ms:10.2f} {faults:18,.0f}")


if __name__ == "__main__":
    main()
