"""Nothing compiles twice (Note [Closure cells] in backends/jit.py): a training step of
a small convnet compiles its kernels in a first process and a second process sharing
the caches compiles none, every kernel coming from Numba's cache or the loop cache; and
stale files of Numba's cache are pruned (Note [Numba's cache files] in
backends/loop_cache.py), so that nothing accumulates across runs.

The first process compiles cold, in a fresh cache directory (~30 s on 2 cores, the
second under 2 s), so the model is as small as still takes the convolutions' block-loop
kernels (Winograd's and the flat im2col one's) and a split over two threads (Note
[Split work]).

Two helpers that keep kernels from compiling the same code into each are checked here
too: calls by name (Note [Kernels called by name]) and ``jit.assign`` (Note [Assignment
in kernels])."""

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from lamina.backends import loop_cache

# other processes, each with the C core's loops and kernels: what the pure-Python core
# compiles is a part of that (Note [Core-independent tests])
pytestmark = pytest.mark.core_independent

# one training step; prints what it compiled and what it ran
PROGRAM = """
import collections, json, sys
from numba.core import event

compiled = collections.Counter()


class Compiles(event.Listener):
    def on_start(self, ev):
        compiled[ev.data["dispatcher"].py_func.__qualname__] += 1

    def on_end(self, ev):
        pass


event.register("numba:compile", Compiles())

import numba
import numpy as np

import lamina as lm
from lamina import nn
from lamina.backends import jit, loop_cache, threads
from lamina.backends.numba_cpu.nn import winograd

winograd.MIN_TILES = 1  # Winograd on these small images too (its rule is a speed rule)
lm.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
lm.random.seed(0)
rng = np.random.default_rng(0)
model = nn.Sequential(
    nn.Conv2d(1, 5, 3, padding=1),  # 1 input channel: the direct kernels
    nn.Conv2d(5, 8, 3, padding=1),  # 5 -> 8 channels, NCHW, 12 x 12: flat im2col blocks
    nn.BatchNorm2d(8),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Conv2d(8, 8, 3, padding=1),  # 8 -> 8 on 6 x 6: Winograd
    nn.Flatten(),
    nn.Linear(8 * 6 * 6, 4),
).float()
x = lm.asarray(rng.normal(size=(4, 1, 12, 12)).astype(np.float32))
y = lm.asarray(rng.integers(0, 4, 4))
loss = nn.CrossEntropyLoss()(model(x), y)
loss.backward()
parts = threads.split(lambda i0, i1: i1 - i0, 2)  # the split kernel, on two threads
# the backend's own paths run the C core's loops by address (Note [C loops by address]):
# a promotion, and a reduction the C core leaves to the Python kernel
(lm.arange(6, dtype=lm.int16) + lm.arange(6, dtype=lm.int32)).numpy()
lm.mean(lm.ones(4, dtype=lm.complex64)).numpy()
lm.set_num_threads(1)
block_loops = {  # the convolutions' (conv.py's and winograd.py's) this step ran
    key[0].__name__
    for key in jit._entries
    if isinstance(key, tuple) and getattr(key[0], "__name__", "").endswith(("_blocks", "_step"))
}
print(json.dumps({
    "loss": loss.item(),
    "parts": parts,
    "compiled": compiled,
    "cfuncs compiled": sum(c.cache_hits == 0 for c in jit._cfuncs),
    "loops opened": len(loop_cache._libraries),
    "block loops": sorted(block_loops),
}))
"""

# the kernels that missed Numba's cache in every process (conv.py's and winograd.py's)
BLOCK_LOOPS = {
    "flat_forward_step",
    "flat_weight_grad_step",
    "forward_blocks",
    "weight_grad_blocks",
}


def run(tmp_path):
    numba_dir, lamina_dir = tmp_path / "numba", tmp_path / "lamina"
    environment = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(numba_dir),
        "LAMINA_CACHE_DIR": str(lamina_dir),
    }
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=environment, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def cache_files(tmp_path):
    return sorted(
        p.relative_to(tmp_path).as_posix()
        for p in tmp_path.rglob("*")
        if p.suffix in (".nbi", ".nbc", ".so")
    )


def plant_stale_files(numba_dir):
    """A stale index (another version of its source) with its data file, and a data
    file no index names, beside the fresh ones; and the record of the last prune made
    to look older, as after an edit of the sources."""
    import numba

    directory = next(p.parent for p in numba_dir.rglob("conv.*.nbi"))
    tag = f".py{sys.version_info[0]}{sys.version_info[1]}{sys.abiflags}"
    with open(directory / f"conv.moved-1{tag}.nbi", "wb") as f:
        pickle.dump(numba.__version__, f)
        f.write(pickle.dumps((b"an older source", {})))
    (directory / f"conv.moved-1{tag}.1.nbc").write_bytes(b"")
    fresh = next(directory.glob("conv.*.nbi")).name[: -len(".nbi")]
    (directory / f"{fresh}.99.nbc").write_bytes(b"")
    planted = [f"conv.moved-1{tag}.nbi", f"conv.moved-1{tag}.1.nbc", f"{fresh}.99.nbc"]
    for marker in numba_dir.rglob(loop_cache._PRUNED):
        marker.write_text("an older stamp")
    return [directory / name for name in planted]


def test_a_second_process_compiles_nothing_and_the_cache_does_not_grow(tmp_path):
    first = run(tmp_path)
    assert first["compiled"], "the first process compiles cold"
    assert {"binary_flat_at", "fold_at"} <= set(first["compiled"]), first["compiled"]
    assert set(first["block loops"]) == BLOCK_LOOPS, first["block loops"]
    files = cache_files(tmp_path)
    planted = plant_stale_files(tmp_path / "numba")

    second = run(tmp_path)
    assert second["compiled"] == {}
    assert second["cfuncs compiled"] == 0
    assert second["loss"] == first["loss"] and second["parts"] == first["parts"]
    assert sum(first["parts"]) == 2
    assert second["block loops"] == first["block loops"]
    assert second["loops opened"] == first["loops opened"]
    assert not any(p.exists() for p in planted)  # pruned
    assert cache_files(tmp_path) == files  # and nothing else removed or added


def test_a_kernel_capturing_a_dispatcher_is_refused():
    """Its cache key would differ in every process (Note [Closure cells])."""
    from lamina.backends import jit

    inner = jit.numba.njit(lambda v: v + 1)

    def kernel(v):
        return inner(v)

    with pytest.raises(TypeError, match="Closure cells"):
        jit.compile_kernel(kernel, jit.types.int64(jit.types.int64))


def test_a_kernel_called_by_name_computes_what_it_computes_called_directly():
    """Note [Kernels called by name]: arrays and scalars go in, the result comes back;
    outside a kernel the call is refused."""
    from lamina.backends import jit

    def scaled(x, k, out):  # out = k x; returns the sum of x
        for i in range(x.size):
            out[i] = k * x[i]
        return x.sum()

    def caller(x, out):
        return jit.call_symbol("lamina_test_scaled", (x, 3, out)) + 1.0

    t, a1 = jit.types, jit.array(np.float64)
    jit.compile_kernel(scaled, t.float64(a1, t.int64, a1), symbol="lamina_test_scaled")
    x, out = np.arange(5.0), np.zeros(5)
    assert jit.compile_kernel(caller, t.float64(a1, a1))(x, out) == 11.0
    np.testing.assert_array_equal(out, 3 * x)
    with pytest.raises(TypeError, match="from kernels only"):
        jit.call_symbol("lamina_test_scaled", (x, 3, out))


def test_a_call_by_name_is_typed_by_the_named_kernels_signature():
    """An argument converts to the named kernel's type (an int32 to int64, a
    C-contiguous array to any layout), or the call is refused, naming the kernel; the
    result has the named kernel's type."""
    from lamina.backends import jit

    def first(x, k):  # x[k], of any layout
        return x[k]

    t = jit.types
    signature = t.float32(jit.array(np.float32, 1, "A"), t.int64)
    jit.compile_kernel(first, signature, symbol="lamina_test_first")

    def caller(x, k):
        return jit.call_symbol("lamina_test_first", (x, k))

    x = np.arange(4, dtype=np.float32)
    call = jit.compile_kernel(caller, t.float64(jit.array(np.float32), t.int32))
    assert call(x, np.int32(2)) == 2.0
    for name, signature in [
        ("lamina_test_first", t.float64(jit.array(np.float64), t.int64)),  # float64 data
        ("lamina_test_nothing", t.float64(jit.array(np.float32), t.int64)),
    ]:

        def wrong(x, k):
            return jit.call_symbol(name, (x, k))

        with pytest.raises(TypeError, match=name):
            jit.compile_kernel(wrong, signature)


def test_a_c_function_called_by_address_gets_its_arguments():
    """Note [C loops by address]: pointers (as integers), a double and a count reach the
    C function given at run time; a Boolean is refused; outside a kernel the call is."""
    from lamina.backends import jit

    def scale_loop(x, k, out, n):
        for i in range(n):
            out[i] = k * x[i]

    t, f8p = jit.types, jit.types.CPointer(jit.types.float64)
    scale = jit.compile_cfunc(scale_loop, t.void(f8p, t.float64, f8p, t.int64), cache=False)

    def caller(address, x, k, out):
        jit.call_address(address, (x.ctypes.data, k, out.ctypes.data, out.size - 1))

    a1 = jit.array(np.float64)
    kernel = jit.compile_kernel(caller, t.void(t.int64, a1, t.float64, a1))
    x, out = np.arange(5.0), np.full(5, -1.0)
    kernel(scale.address, x, 2.5, out)
    np.testing.assert_array_equal(out, [0.0, 2.5, 5.0, 7.5, -1.0])  # n = size - 1

    def flagged(address, x):
        jit.call_address(address, (x.ctypes.data, x.size > 0))

    with pytest.raises(TypeError, match="not a Boolean"):
        jit.compile_kernel(flagged, t.void(t.int64, a1))
    with pytest.raises(TypeError, match="from kernels only"):
        jit.call_address(scale.address, (x.ctypes.data, 2.5, out.ctypes.data, 5))


def test_assign_in_a_kernel_is_numpys_assignment():
    """Note [Assignment in kernels]: an array of the view's shape (here a transposed,
    non-contiguous one) or a number, into a non-contiguous 3-D view, axis by axis;
    arrays of two shapes are refused; an empty view takes nothing."""
    from lamina.backends import jit

    def kernel(dst, src, value):
        jit.assign(dst[:, 1:, ::2], src)
        jit.assign(dst[:, :1], value)

    a3 = jit.array(np.float32, 3, "A")
    assign = jit.compile_kernel(kernel, jit.types.void(a3, a3, jit.types.float32))
    rng = np.random.default_rng(0)
    for shape in [(2, 3, 5), (0, 3, 5), (3, 1, 4)]:
        dst = rng.normal(size=shape).astype(np.float32)
        src = rng.normal(size=dst[:, 1:, ::2].shape[::-1]).astype(np.float32).T
        expected = dst.copy()
        expected[:, 1:, ::2] = src
        expected[:, :1] = -1.5
        assign(dst, src, np.float32(-1.5))
        np.testing.assert_array_equal(dst, expected)
    with pytest.raises(ValueError, match="shapes differ"):
        assign(np.zeros((2, 3, 5), np.float32), np.zeros((2, 2, 2), np.float32), np.float32(0))
