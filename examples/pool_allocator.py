"""The pool allocator ("allocator" layer, lamina.memory) on and off, measured.

    python examples/pool_allocator.py [--model alexnet,vgg,inception] [--batch 32]
        [--threads 1,2] [--steps 12] [--rounds 2] [--n 16000000]

Each round runs every model at every thread count in two child processes, pool off and
pool on (the order alternating from round to round), and prints the median throughput
and the median minor page faults per step (``resource.getrusage``) of each, after four
warm-up steps. The models: a training step (forward, cross-entropy, backward, SGD) of
the convnets of ``python -m lamina.bench convnet`` at ``--batch`` images, NCHW, and
``elementwise``, a training step of ``relu(x * w + 1)`` over ``--n`` float32 values
(its throughput is steps/s).
"""

import argparse
import json
import statistics
import subprocess
import sys

CONVNETS = ("alexnet", "vgg", "inception")
WARMUP = 4

CHILD = r"""
import json, resource, statistics, sys, time
import numpy as np
import lamina as lm

model, on = sys.argv[1], sys.argv[2] == "on"
threads, batch, n, steps, warmup = map(int, sys.argv[3:])
lm.set_num_threads(threads)
if on:
    lm.layers.enable("allocator")
if model == "elementwise":
    rng = np.random.default_rng(0)
    x = lm.asarray(rng.standard_normal(n).astype(np.float32))
    w = lm.asarray(rng.standard_normal(n).astype(np.float32), requires_grad=True)

    def step():
        h = lm.maximum(x * w + 1.0, 0.0)
        lm.sum(h * h).backward()
        with lm.no_grad():
            w.__isub__(0.001 * w.grad)
        w.grad = None

    per_step = 1
else:
    from lamina.tools.bench import convnet

    lib = convnet._lamina()
    lm.random.seed(0)
    net = convnet.build(convnet.ARCHITECTURES[model], lib)
    step = convnet.step(lib, net, "train", batch, "NCHW")
    per_step = batch
for _ in range(warmup):
    step()
times, faults = [], []
for _ in range(steps):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
rate = per_step / statistics.median(times)
print(json.dumps({"rate": rate, "faults": statistics.median(faults)}))
"""


def run(model, mode, threads, args):
    command = [sys.executable, "-c", CHILD, model, mode, str(threads), str(args.batch)]
    command += [str(args.n), str(args.steps), str(WARMUP)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def _list(kind, choices=None):
    def parse(text):
        items = [kind(item) for item in text.split(",")]
        if choices is not None and not set(items) <= set(choices):
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}")
        return items

    return parse


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=_list(str, ("elementwise", *CONVNETS)), default=CONVNETS)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=_list(int), default=[1])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--n", type=int, default=16_000_000, help="elementwise values")
    parser.add_argument("--json", help="also write every child's result to this file")
    args = parser.parse_args(argv)
    results = {}
    total = args.rounds * len(args.threads) * len(args.model) * 2
    for r in range(args.rounds):
        for threads in args.threads:
            for model in args.model:
                for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    done = sum(map(len, results.values()))
                    print(
                        f"\r[{done + 1}/{total}] {model}, {threads} thread(s), pool {mode} ",
                        end="",
                        file=sys.stderr,
                    )
                    rows = results.setdefault((model, threads, mode), [])
                    rows.append(run(model, mode, threads, args))
    print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([[*key, rows] for key, rows in results.items()], f, indent=1)
    units = []
    if set(args.model) & set(CONVNETS):
        units.append(f"convnets at batch {args.batch} in images/s")
    if "elementwise" in args.model:
        units.append(f"elementwise over {args.n:,} float32 in steps/s")
    print(
        f"training steps ({', '.join(units)}), medians of {args.rounds} rounds x {args.steps} steps"
    )
    print(
        f"{'model':12s} {'threads':>7s} {'off /s':>9s} {'on /s':>9s} {'on/off':>7s} "
        f"{'faults/step off':>16s} {'on':>7s}"
    )
    for threads in args.threads:
        for model in args.model:
            off, on = (results[model, threads, mode] for mode in ("off", "on"))
            rate = [statistics.median(row["rate"] for row in rows) for rows in (off, on)]
            faults = [statistics.median(row["faults"] for row in rows) for rows in (off, on)]
            print(
                f"{model:12s} {threads:7d} {rate[0]:9.1f} {rate[1]:9.1f} "
                f"{rate[1] / rate[0]:6.2f}x {faults[0]:16,.0f} {faults[1]:7,.0f}"
            )


if __name__ == "__main__":
    main()
