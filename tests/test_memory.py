"""The pool allocator, the "allocator" layer (lamina.memory, Note [Pool allocator] in
dispatch/csrc/pool.c): under the C core it serves NumPy's large allocations from cached
blocks, within its limit, from several threads; under the pure-Python core it cannot be
switched on."""

import gc
import resource
import threading

import numpy as np
import pytest

import lamina as lm
from lamina.dispatch import core

C_CORE = core.IMPLEMENTATION == "c"
MiB = 1 << 20
KiB = 1 << 10
DEFAULT_THRESHOLD = 128 * KiB  # Note [Pool allocator]: glibc's initial mmap threshold


@pytest.fixture
def pool():
    """The layer on, a clean cache and the default sizes; everything undone afterwards.
    Its value is the pool's bytes in use before the test: arrays an earlier test in
    this process made from the pool may still live (the filter cache keeps some
    weights' transforms and copies), and are not the test's."""
    gc.collect()  # an earlier test's garbage freed now, not during the test
    lm.memory.empty_cache()
    lm.memory.configure(threshold=DEFAULT_THRESHOLD, limit=1 << 30)
    lm.layers.enable("allocator")
    lm.memory.reset_stats()
    try:
        yield lm.memory.stats()["bytes_in_use"]
    finally:
        lm.layers.disable("allocator")
        lm.memory.empty_cache()
        lm.memory.configure(threshold=DEFAULT_THRESHOLD, limit=1 << 30)


def handler_name():
    return np._core.multiarray.get_handler_name()


def test_the_layer_needs_the_c_core():
    """Under the C core it switches NumPy's allocator; under the pure-Python core it
    refuses, naming why, and changes nothing."""
    if C_CORE:
        lm.layers.enable("allocator")
        assert handler_name() == "lamina_pool" and lm.layers.state()["allocator"] is True
        lm.layers.disable("allocator")
    else:
        with pytest.raises(RuntimeError, match="allocator layer needs the C core"):
            lm.layers.enable("allocator")
        assert set(lm.memory.stats().values()) == {0}
    assert handler_name() == "default_allocator" and lm.layers.state()["allocator"] is False


needs_c_core = pytest.mark.skipif(
    not C_CORE, reason="the C core's pool; the pure-Python run checks its refusal"
)


@needs_c_core
def test_the_layer_installs_the_pool_as_numpys_allocator(pool):
    assert handler_name() == "lamina_pool"
    with lm.layers.off("allocator"):
        assert handler_name() == "default_allocator"
    assert handler_name() == "lamina_pool"
    lm.layers.disable("allocator")
    assert handler_name() == "default_allocator" and lm.layers.state()["allocator"] is False
    lm.layers.enable("allocator")


@needs_c_core
def test_freed_blocks_are_reused_and_zeroed_when_asked(pool):
    for i in range(4):
        a = np.empty(3 * MiB // 8)
        a[:] = i + 1  # dirty the block for the next request
        del a
    s = lm.memory.stats()
    assert s["allocations"] == 4 and s["hits"] == 3 and s["blocks_cached"] == 1
    z = np.zeros(3 * MiB // 8)  # calloc of a cached, dirty block
    assert not z.any()
    small = np.empty(100)  # below the threshold: not the pool's
    assert lm.memory.stats()["allocations"] == 5
    del small


@needs_c_core
def test_a_repeated_step_is_served_from_the_pool_without_page_faults(pool):
    """A training step's pattern -- the same sizes allocated, written and freed every
    step, from the default threshold (128 KiB, glibc's initial mmap threshold: Note
    [Pool allocator]) up -- is all hits after the first step, and the later steps
    touch only pages the pool already has: (almost) no minor page faults."""
    sizes = [128 * KiB, 300 * KiB, 700 * KiB, 3 * MiB, 5 * MiB + 1, 300 * KiB, 8 * MiB]
    pages = sum(sizes) // 4096

    def step():
        live = [np.ones(n, np.uint8) for n in sizes]  # written: every page touched
        live.append(np.zeros(MiB, np.uint8))  # calloc of a cached block
        assert not live[-1].any()
        return sum(int(a[-1]) for a in live[:-1])

    step()
    first = lm.memory.stats()
    assert first["allocations"] == len(sizes) + 1 and first["hits"] == 0  # all live at once
    assert lm.memory.stats()["threshold"] == DEFAULT_THRESHOLD
    below = np.ones(DEFAULT_THRESHOLD - 1, np.uint8)  # not the pool's
    assert lm.memory.stats()["allocations"] == first["allocations"]
    del below
    step()  # the first step's calloc got untouched pages, this one writes them
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        assert step() == len(sizes)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    s = lm.memory.stats()
    assert s["allocations"] - first["allocations"] == 6 * (len(sizes) + 1)
    assert s["hits"] - first["hits"] == 6 * (len(sizes) + 1) and s["returned"] == 0
    assert s["bytes_in_use"] == pool and s["blocks_cached"] == len(sizes) + 1
    assert faults < 0.05 * 5 * pages, f"{faults} minor faults for 5 steps of {pages} pages"


@needs_c_core
def test_size_classes_bound_the_waste_and_count_bytes(pool):
    a = np.empty(5 * MiB, np.uint8)  # 5 MiB -> the class of 5 MiB (4 + 1 quarter)
    s = lm.memory.stats()
    assert s["bytes_in_use"] - pool == 5 * MiB and s["peak_bytes_in_use"] - pool == 5 * MiB
    b = np.empty(5 * MiB + 1, np.uint8)  # -> 6 MiB, at most 25% of an octave more
    assert lm.memory.stats()["bytes_in_use"] - pool == 11 * MiB
    assert a.ctypes.data % 64 == 0 and b.ctypes.data % 64 == 0  # cache-line aligned
    del a, b
    s = lm.memory.stats()
    assert s["bytes_in_use"] == pool and s["bytes_cached"] == 11 * MiB and s["blocks_cached"] == 2


@needs_c_core
def test_the_limit_returns_blocks_and_empty_cache_returns_all(pool):
    lm.memory.configure(limit=3 * MiB)
    a, b = np.empty(2 * MiB, np.uint8), np.empty(2 * MiB, np.uint8)
    del a, b  # the second would take the cache to 4 MiB: returned
    s = lm.memory.stats()
    assert s["bytes_cached"] == 2 * MiB and s["returned"] == 1
    lm.memory.empty_cache()
    s = lm.memory.stats()
    assert s["bytes_cached"] == 0 and s["blocks_cached"] == 0 and s["returned"] == 2
    c = np.empty(2 * MiB, np.uint8)
    lm.memory.configure(limit=0)  # below what is cached: emptied; nothing is cached later
    del c
    assert lm.memory.stats()["bytes_cached"] == 0


@needs_c_core
def test_an_array_from_the_pool_returns_to_it_after_the_layer_is_off(pool):
    a = np.ones(2 * MiB, np.uint8)
    lm.layers.disable("allocator")
    b = np.ones(2 * MiB, np.uint8)  # NumPy's own
    assert lm.memory.stats()["allocations"] == 1
    del a, b
    assert lm.memory.stats()["bytes_cached"] == 2 * MiB
    lm.layers.enable("allocator")


@needs_c_core
def test_resize_keeps_the_data_across_classes(pool):
    a = np.arange(1000, dtype=np.float64)  # small: plain malloc
    a.resize(300_000, refcheck=False)  # into the pool
    np.testing.assert_array_equal(a[:1000], np.arange(1000.0))
    assert not a[1000:].any()
    a.resize(600_000, refcheck=False)  # a bigger class
    np.testing.assert_array_equal(a[:1000], np.arange(1000.0))
    a.resize(10, refcheck=False)
    np.testing.assert_array_equal(a, np.arange(10.0))


@needs_c_core
def test_lamina_results_are_right_with_the_pool(pool):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 600)).astype(np.float32)
    w = rng.standard_normal((600, 512)).astype(np.float32)
    for _ in range(3):  # the second and third rounds run in reused blocks
        t = lm.asarray(x, requires_grad=True)
        y = lm.sum(lm.maximum(t @ lm.asarray(w), 0.0) * 2.0)
        y.backward()
        np.testing.assert_allclose(float(y), np.sum(np.maximum(x @ w, 0) * 2), rtol=1e-4)
        grad = ((x @ w) > 0) * 2.0 @ w.T
        np.testing.assert_allclose(t.grad.numpy(), grad, rtol=1e-3, atol=1e-3)
    assert lm.memory.stats()["hits"] > 0


@needs_c_core
def test_threads_share_the_pool_safely(pool):
    errors = []

    def work(seed):
        try:
            lm.layers.enable("allocator")  # NumPy's allocator is per thread (context)
            for i in range(200):
                a = np.full(MiB // 8 + seed * 1000 + i % 7, float(seed))
                if not (a == seed).all():  # a 128 KiB bool array: the pool's too
                    errors.append(seed)
        except Exception as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = lm.memory.stats()
    assert s["bytes_in_use"] == pool and s["allocations"] == 1600 and s["hits"] > 0


@needs_c_core
def test_configure_rejects_bad_sizes(pool):
    with pytest.raises(TypeError, match="threshold must be an int"):
        lm.memory.configure(threshold=1.5)
    with pytest.raises(ValueError, match="threshold must be at least 1"):
        lm.memory.configure(threshold=0)
    with pytest.raises(ValueError, match="limit must be at least 0"):
        lm.memory.configure(limit=-1)
    assert lm.memory.stats()["threshold"] == DEFAULT_THRESHOLD
