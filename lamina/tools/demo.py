"""A two-minute tour: ``python -m lamina.demo``.

Creates tensors, runs a few operators through the dispatcher, prints a dispatch table
and the plugin list, and times the per-operator overhead loop ``output = output + x``
next to NumPy.
"""

import statistics
import time

import numpy as np

import lamina as lm


def _loop(zeros_like, x, k):
    out = zeros_like(x)
    for _ in range(k):
        out = out + x
    return out


def _ns_per_op(zeros_like, x, k=20000, rounds=5):
    _loop(zeros_like, x, 200)  # warm-up (and JIT compilation on a cold cache)
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        _loop(zeros_like, x, k)
        times.append((time.perf_counter() - t) / k * 1e9)
    return statistics.median(times)


def main():
    lm.set_num_threads(1)
    x = lm.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=lm.float32)
    print("x =", x)
    print("x * 2 + 1 =", x * 2 + 1)
    print("lm.sum(x, axis=0) =", lm.sum(x, axis=0))
    print("x @ x.T =", x @ x.T)
    print("x[:, ::-1] (a view, negative strides) =", x[:, ::-1])
    print()
    print(lm.dispatch.dump_table("add"))
    print()
    print("backend plugins:")
    for row in lm.backends.list():
        print(
            f"  {row['name']:10s} {row['source']:12s} {row['kernels']:4d} kernels "
            f"on {', '.join(row['devices'])}"
        )
    print()
    data = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    ours = _ns_per_op(lm.zeros_like, lm.asarray(data))
    numpy = _ns_per_op(np.zeros_like, data.copy())
    print("per-operator overhead, output = output + x, 100 float32, 1 thread (median ns/op):")
    print(f"  lamina {ours:7.0f}\n  numpy  {numpy:7.0f}\n  ratio  {ours / numpy:7.2f}x")


if __name__ == "__main__":
    main()
