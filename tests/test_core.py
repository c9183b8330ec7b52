"""The per-call core (Note [Two cores] in dispatch/reference.py): the C extension and its
pure-Python reference give the same results -- the whole suite runs under both (CI runs
``pytest`` and ``LAMINA_PURE_PYTHON=1 pytest``) -- and the C core is safe: reference
counts balance over a hundred thousand mixed operations, tensors are freed when their last
reference goes, threads get correct results, and malformed tensors never reach a loop.
"""

import gc
import os
import subprocess
import sys
import threading
import weakref

import numpy as np

import lamina as lm
from lamina.dispatch import core


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _mixed(n, rng):
    """n rounds of what every call pays for: the fast path, Python scalars, the general
    path (broadcasting, strides), reductions, errors, and autograd."""
    a = lm.asarray(rng.standard_normal(100).astype(np.float32))
    m = lm.asarray(rng.standard_normal((10, 10)).astype(np.float32))
    row = lm.asarray(rng.standard_normal(10).astype(np.float32))
    w = lm.asarray(rng.standard_normal(10).astype(np.float32), requires_grad=True)
    for _ in range(n):
        b = a + a
        b = b * 2.0
        b = 1.0 - b
        b = -b
        c = m + row
        c = m.T * m
        c = lm.sum(m, axis=0) + lm.max(m, axis=1)
        try:
            a + "x"
        except TypeError:
            pass
        else:
            raise AssertionError("a + 'x' did not raise")
        loss = lm.sum(w * row + w)
        loss.backward()
        w.grad = None
    return b, c


def test_a_hundred_thousand_mixed_operations_keep_memory_flat_and_free_every_tensor():
    """Python's count of allocated memory blocks catches a leaked object of any size (a
    leak of one per round would add 8,000; 7-12 come and go), the resident set size a
    leaked buffer (one of the 100-float results per operation would be 40 MiB)."""
    rng = np.random.default_rng(0)
    _mixed(2000, rng)  # compile, warm the caches and the allocator
    gc.collect()
    blocks, rss = sys.getallocatedblocks(), _rss_bytes()
    out = _mixed(8000, rng)  # 13 operations a round: about 10**5
    gc.collect()
    grown = sys.getallocatedblocks() - blocks
    assert grown < 1000, f"{grown} more memory blocks after 10**5 operations"
    grown = _rss_bytes() - rss
    assert grown < 8 * 2**20, f"memory grew by {grown / 2**20:.1f} MiB over 10**5 operations"
    refs = [weakref.ref(t) for t in out]
    del out
    assert all(r() is None for r in refs), "a result outlived its last reference"


def test_results_and_graphs_are_freed_by_reference_counting_alone():
    gc.disable()
    try:
        x = lm.ones(100, dtype=lm.float32, requires_grad=True)
        y = x * x + x
        z = lm.sum(y)
        refs = [weakref.ref(t) for t in (y, z)] + [weakref.ref(z.grad_fn), weakref.ref(y.grad_fn)]
        s = lm.ones(50, dtype=lm.float32)[::2] * 3.0  # the general path
        refs.append(weakref.ref(s))
        del y, z, s
        assert all(r() is None for r in refs), "a tensor or node waited for the collector"
    finally:
        gc.enable()


def test_two_threads_on_the_fast_path_and_autograd_get_correct_results():
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        a_np = rng.standard_normal(64).astype(np.float32)
        a = lm.asarray(a_np)
        w = lm.asarray(a_np.astype(np.float64), requires_grad=True)
        try:
            for _ in range(3000):
                out = a + a * 2.0
                assert np.array_equal(out.numpy(), a_np + a_np * np.float32(2.0))
                loss = lm.sum(w * w)
                loss.backward()
                assert np.allclose(w.grad.numpy(), 2 * a_np.astype(np.float64))
                w.grad = None
        except Exception as exc:  # reported below, with the thread's traceback lost
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_malformed_tensors_take_the_reference_path_and_never_reach_a_loop():
    """Note [C safety]: a tensor whose fields disagree with its storage (assembled by
    hand, against Note [Tensor fields]) is not run on its fields' word."""
    good = lm.ones(4, dtype=lm.float32)
    bad = object.__new__(lm.Tensor)
    bad._data = bad._flat = np.ones(2, np.int8)  # claims float32 x 4, holds 2 bytes
    bad._ks, bad._dtype, bad._shape = 1, lm.float32, (4,)
    for call in (
        lambda: bad + good,
        lambda: good + bad,
        lambda: bad * 2.0,
        lambda: -bad,
        lambda: lm.sum(bad, axis=0),
        lambda: lm.nn.functional.softmax(bad, dim=-1),
        lambda: lm.nn.functional.relu(bad),
        lambda: lm.clip(bad, 0.0, 1.0),
        lambda: lm.cumulative_sum(bad),
    ):
        try:
            out = call()
        except (TypeError, ValueError):
            continue  # refused by the reference path: fine
        assert out.shape in ((4,), (2,), ())  # computed from the real storage, not its claim


def test_a_build_without_the_extension_warns_once_and_uses_the_reference():
    code = (
        "import sys, warnings\n"
        "sys.modules['lamina.dispatch._core'] = None\n"  # as if it had not been built
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import lamina as lm\n"
        "from lamina.dispatch import core\n"
        "print(core.IMPLEMENTATION, sum('C core could not be loaded' in str(x.message) "
        "for x in w), (lm.ones(3) + 1).tolist())"
    )
    env = {k: v for k, v in os.environ.items() if k != "LAMINA_PURE_PYTHON"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["python", "1", "[2.0,", "2.0,", "2.0]"]


def test_the_core_in_use_serves_the_hot_path():
    """The C objects where the C core is in use, each with its reference twin; the
    reference's own objects otherwise."""
    from lamina.dispatch import reference

    kernel = lm.dispatch.get("add").table[lm.dispatch.CPU.bit_length()]
    if core.IMPLEMENTATION == "c":
        from lamina.dispatch import _core

        assert isinstance(kernel, _core.ElementwiseKernel)
        assert isinstance(kernel.reference, reference.ElementwiseKernel)
        assert isinstance(lm.add, _core.Binding) and lm.add.fallback.__name__ == "call"
        assert lm.Tensor.__mro__[1] is _core.TensorBase
    else:
        assert isinstance(kernel, reference.ElementwiseKernel)
        assert lm.Tensor.__mro__[1] is reference.TensorBase


def test_the_core_builds_a_compiled_functions_guard_key():
    """lamina.jit's guard key (Note [Guards] in its compiler), built by the core in use
    (the suite runs under both): per tensor its shape, dtype, key set and strides
    (False for a C-contiguous CPU storage); None, the compiler's general path, as soon
    as an argument is not a tensor or has no strides (a sparse one)."""
    dense = lm.asarray(np.arange(12.0).reshape(3, 4))
    tensors = (dense, dense.T, lm.asarray(1.0), lm.zeros((0, 2)), dense.to_device("meta"))
    strides = [False, (8, 32), False, False, (4, 1)]
    want = ("generation", True, *[(t._shape, t._dtype, t._ks, s) for t, s in zip(tensors, strides)])
    assert core.guard_key(("generation", True), tensors) == want
    for other in (dense.to_sparse(), 2.0, "x"):
        assert core.guard_key((), (dense, other)) is None
    assert core.guard_key((1,), ()) == (1,)


def test_a_compiled_function_is_its_cores_hot_path_and_has_the_functions_attributes():
    """Note [Guard tokens]: with the C core ``lm.jit.compile`` returns a CompiledCall,
    whose calls of known variants never reach Python; everything else is the compiled
    function's, the reference's hot path."""

    def scaled(x):
        """Doubles x."""
        return x * 2.0

    compiled = lm.jit.compile(scaled)
    x = lm.asarray(np.arange(3.0))
    for _ in range(3):
        np.testing.assert_array_equal(compiled(x).numpy(), [0.0, 2.0, 4.0])
    assert len(compiled.variants) == len(compiled.runs) == 1
    assert (compiled.__name__, compiled.__doc__, compiled.__wrapped__) == (
        "scaled",
        "Doubles x.",
        scaled,
    )
    assert compiled.__module__ == __name__
    general = lm.jit.CompiledFunction
    if core.IMPLEMENTATION == "c":
        assert type(compiled).__name__ == "CompiledCall"
        assert isinstance(compiled.general, general) and compiled.runs is compiled.general.runs
    else:
        assert isinstance(compiled, general)
    np.testing.assert_array_equal(compiled(x=x).numpy(), [0.0, 2.0, 4.0])  # the general path


def test_every_hot_call_looks_its_run_up_again():
    """Note [Guard tokens]: the hot path reuses the last call's token, but runs what
    ``runs`` holds for it now: a run replaced or dropped by the Python side is never
    run again; a fused loop's run (called without a tuple) and any other both work."""
    compiled = lm.jit.compile(lambda x: x * 2.0)
    x = lm.asarray(np.arange(3.0))
    for _ in range(3):  # the second and third calls take the hot path
        np.testing.assert_array_equal(compiled(x).numpy(), [0.0, 2.0, 4.0])
    (token,) = compiled.runs
    compiled.runs[token] = lambda arguments: ("replaced", arguments)
    assert compiled(x) == ("replaced", (x,))
    compiled.runs.clear()  # the general path runs it and fills runs again
    np.testing.assert_array_equal(compiled(x).numpy(), [0.0, 2.0, 4.0])
    assert list(compiled.runs) == [token]
    np.testing.assert_array_equal(compiled(lm.asarray([5.0])).numpy(), [10.0])  # a new token


def test_the_guard_token_holds_exactly_the_guard_keys_facts():
    """Note [Guard tokens] in lamina.jit's compiler: two calls of CPU tensors have one
    token exactly when they have one guard key; None where the key's general path
    decides."""
    dense = lm.asarray(np.arange(12.0).reshape(3, 4))
    calls = [
        (dense,),
        (lm.asarray(np.ones((3, 4))),),  # the same facts, other values
        (dense.T,),
        (lm.asarray(np.ones((4, 3))),),  # the transpose's shape, contiguous
        (lm.astype(dense, lm.float32),),
        (dense[:, :2],),
        (dense[:, ::2],),
        (lm.asarray(1.0),),
        (lm.zeros((0, 2)),),
        (lm.zeros((2, 0)),),
        (dense, dense),
        (dense, dense.T),
        (),
    ]
    for prefix in [(0, True), (0, False), (1, True), (1, True, 3)]:
        for a in calls:
            token = core.guard_token(prefix, a)
            assert token is not None and hash(token) == hash(core.guard_token(prefix, a))
            for b in calls:
                same_key = core.guard_key(prefix, a) == core.guard_key(prefix, b)
                assert (token == core.guard_token(prefix, b)) == same_key
    assert core.guard_token((0, True), (dense,)) != core.guard_token((0, True, 0), (dense,))
    for other in (dense.to_sparse(), 2.0, "x"):
        assert core.guard_token((0,), (dense, other)) is None


def test_kernels_along_the_last_axis_give_their_python_kernels_results():
    """Note [C rows]: softmax, log_softmax and the float scans along the last axis of a
    contiguous tensor run the C core's loop, compiled from the Python kernel's template:
    the same values, bit for bit; other axes, layouts and dtypes, options and empty
    tensors are the Python kernel's."""
    rng = np.random.default_rng(0)
    data = rng.standard_normal((3, 37)) * 30
    tensors = [
        lm.asarray(data.astype(np.float32)),
        lm.asarray(data[0]),
        lm.asarray(data.astype(np.float32)).T,
        lm.asarray(data.astype(np.int32)),
        lm.zeros((2, 0)),
    ]
    calls = {
        "softmax": lambda k, x, dim: k(x._ks, x, dim),
        "log_softmax": lambda k, x, dim: k(x._ks, x, dim),
        "cumulative_sum": lambda k, x, dim: k(x._ks, x, dim, None, False),
        "cumulative_prod": lambda k, x, dim: k(x._ks, x, dim, None, dim == 0),
    }
    for name, call in calls.items():
        kernel = lm.dispatch.get(name).table[lm.dispatch.CPU.bit_length()]
        python_kernel = getattr(kernel, "reference", kernel)
        assert (python_kernel is not kernel) == (core.IMPLEMENTATION == "c")
        for x in tensors:
            if name.endswith("softmax") and x.dtype == lm.int32:
                continue  # refused by the binding
            for dim in range(x.ndim):
                got, want = call(kernel, x, dim), call(python_kernel, x, dim)
                assert got.dtype == want.dtype and got.shape == want.shape
                np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_operands_in_one_dense_order_get_the_general_paths_result_and_strides():
    """Note [C permuted path]: channels-last operands (one tensor, two of one shape and
    strides, one with a Python scalar) give the reference's general path's values,
    dtype and strides exactly, sizes of 1 included (a bool result's strides are in its
    own itemsize); operands in two different dense orders give its C order."""
    from lamina.dispatch import layouts

    rng = np.random.default_rng(0)

    def general(name, *args):  # the reference's general path
        kernel = lm.dispatch.get(name).table[lm.dispatch.CPU.bit_length()]
        return getattr(kernel, "reference", kernel).general(lm.dispatch.CPU, *args)

    def permuted(shape, axes, dtype=np.float32):
        data = rng.standard_normal([shape[a] for a in axes]).astype(dtype)
        return lm.asarray(data.transpose(np.argsort(axes)))

    nhwc = (0, 2, 3, 1)
    for shape in [(2, 3, 4, 5), (1, 3, 1, 5), (2, 3, 1, 5), (2, 1, 4, 1), (3, 7, 1, 1)]:
        a, b = permuted(shape, nhwc), permuted(shape, nhwc)
        other = permuted(shape, (0, 2, 1, 3))
        cases = [
            ("add", lambda: lm.add(a, b), (a, b)),
            ("greater", lambda: a > b, (a, b)),
            ("exp", lambda: lm.exp(a), (a,)),
            ("multiply", lambda: a * 2.5, (a, 2.5)),
            ("subtract", lambda: 2.5 - a, (2.5, a)),
            ("add", lambda: a + other, (a, other)),
        ]
        for name, compute, args in cases:
            got = compute()
            want = general(name, *args)
            where = f"{name} {shape}"
            assert got.dtype == want.dtype and got.shape == want.shape, where
            np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=where)
            assert layouts.strides_of(got) == layouts.strides_of(want), where
            assert got._flat is None or got.numpy().flags.c_contiguous, where
    assert layouts.strides_of(a + other) == layouts.contiguous(a.shape)
    a.requires_grad_(True)  # recorded by the autograd layer, computed the same way
    got = a * b
    assert layouts.strides_of(got) == layouts.strides_of(general("multiply", a, b))
    got.sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), b.numpy())
