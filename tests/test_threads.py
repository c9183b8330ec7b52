"""Threads (README, "Threads"): what several threads may do at once, and what is
process-wide with a safe exit. The switch interval is lowered while the races run, so
the interleavings that lost updates show up in a few hundred iterations."""

import contextlib
import contextvars
import os
import subprocess
import sys
import threading
import time

import numba
import numpy as np
import pytest

import lamina as lm
from lamina.backends import threads
from lamina.dispatch import registry


@contextlib.contextmanager
def often_switching():
    """Threads switch every microsecond instead of every 5 ms."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def run_threads(target, n=4):
    errors = []

    def guarded(i):
        try:
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


def test_gradients_accumulated_from_four_threads_lose_no_update():
    """The issue's example: 4 threads x backward of sum(w * 1.0) on one shared leaf."""
    w = lm.ones(3, requires_grad=True)

    def work(i):
        for _ in range(300):
            lm.sum(w * 1.0).backward()

    with often_switching():
        run_threads(work)
    assert w.grad.tolist() == [1200.0] * 3


def test_grad_finds_the_leaf_of_graphs_recorded_in_other_threads():
    """Two threads recording with a fresh leaf at once must share its AccumulateGrad
    node, or grad() would miss the gradient of the other thread's graph."""
    for _ in range(30):
        w = lm.ones(2, requires_grad=True)
        outs = [None] * 4

        def record(i, w=w, outs=outs):
            outs[i] = lm.sum(w * float(i + 1))

        with often_switching():
            run_threads(record)
        (g,) = lm.autograd.grad(outs[0] + outs[1] + outs[2] + outs[3], [w])
        assert g.tolist() == [10.0, 10.0]


def test_hook_handles_made_in_several_threads_are_distinct():
    w = lm.ones(2, requires_grad=True)
    y = w * 2.0
    handles = [[] for _ in range(4)]

    def add_hooks(i):
        for _ in range(200):
            handles[i].append(y.register_hook(lambda g: None))

    with often_switching():
        run_threads(add_hooks)
    ids = [h.id for hs in handles for h in hs]
    assert len(set(ids)) == len(ids) == 800


def _step(event_in, event_out):
    event_in.wait(10)
    event_out.set()


def test_use_blocks_left_in_any_order_leave_the_blocks_still_open():
    """Note [Preferred plugin]: thread A enters use("numpy_ref"), thread B enters
    use("numba_cpu"), A leaves, then B leaves. A saved-and-restored global ended with
    numpy_ref preferred for the whole process."""
    a_in, b_in, a_out, b_out = (threading.Event() for _ in range(4))
    seen = {}

    def a(_):
        with lm.backends.use("numpy_ref"):
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b(_):
        a_in.wait(10)
        with lm.backends.use("numba_cpu"):
            b_in.set()
            a_out.wait(10)
            seen["inside B after A left"] = registry.preferred_plugin
        b_out.set()

    threads = [threading.Thread(target=f, args=(0,)) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == {"inside B after A left": "numba_cpu"}
    assert registry.preferred_plugin is None


def test_layer_off_blocks_in_two_threads_do_not_switch_each_other_back_on():
    a_in, b_in, a_out = (threading.Event() for _ in range(3))
    seen = {}

    def a():
        with lm.layers.off("checks"):
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b():
        a_in.wait(10)
        with lm.layers.off("checks"):
            b_in.set()
            a_out.wait(10)
            seen["checks inside B after A left"] = lm.layers.state()["checks"]

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == {"checks inside B after A left": False}
    assert lm.layers.state()["checks"] is True


def test_a_worker_thread_uses_the_process_wide_thread_count():
    """Note [Thread count]: Numba's count is per thread, lamina's per process; a big
    kernel started from a worker used every core (here 4) instead of the 2 asked for."""
    code = (
        "import threading, numba, lamina as lm\n"
        "lm.set_num_threads(2)\n"
        "x = lm.ones(1 << 18)\n"
        "seen = []\n"
        "def work():\n"
        "    seen.append(lm.get_num_threads())\n"
        "    (x + x), lm.exp(x), lm.sum(x)\n"
        "    seen.append(numba.get_num_threads())\n"
        "t = threading.Thread(target=work); t.start(); t.join()\n"
        "print(seen)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, NUMBA_NUM_THREADS="4"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2, 2]"


@pytest.mark.parametrize("seconds", [2.0])
def test_mixed_work_and_switches_from_four_threads_give_right_results(seconds):
    """The stress test: three threads run forward and backward passes (elementwise,
    broadcasting, reductions, matmul, views, in-place, a shared leaf) and check every
    value and gradient against NumPy, while a fourth switches tables (registers and
    unregisters a wrapper plugin, use() blocks, check_kernels()) and layers (checks,
    sparse) -- none of which may change a result. Bounded by ``seconds``."""
    rng = np.random.default_rng(0)
    a_np, b_np = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))
    # float64 throughout, as the NumPy references (the default dtype is not the subject)
    shared = lm.zeros(3, dtype=lm.float64, requires_grad=True)
    stop, counts = threading.Event(), [0] * 4

    def compute(i, once=False):
        a = lm.asarray(a_np, requires_grad=True)
        b = lm.asarray(b_np, requires_grad=True)
        while once or not stop.is_set():
            c = lm.tanh(a @ b) * 2.0 + a[:, :1]  # (4, 5), broadcast
            loss = lm.sum(c * c) + lm.sum(a[0] * shared)
            loss.backward()
            t = np.tanh(a_np @ b_np)
            cc = t * 2.0 + a_np[:, :1]
            assert np.allclose(c.numpy(), cc) and np.isclose(loss.item(), (cc * cc).sum())
            dc = 2 * cc
            dt = dc * 2.0 * (1 - t * t)
            ga = dt @ b_np.T
            ga[:, 0] += dc.sum(axis=1)
            assert np.allclose(a.grad.numpy(), ga), "a.grad"
            assert np.allclose(b.grad.numpy(), a_np.T @ dt), "b.grad"
            a.grad = b.grad = None
            z = lm.zeros((4, 3), dtype=lm.float64)
            z += lm.asarray(a_np)
            z[1:3] = 7.0
            assert z.numpy()[1:3].tolist() == [[7.0] * 3] * 2 and lm.max(z).item() == 7.0
            counts[i] += 1
            if once:
                return

    class Wrap:
        @lm.backends.hookimpl
        def lamina_register_kernels(self, registry):
            for name in ("add", "multiply", "matmul", "sum"):
                registry.register_wrapper(name, "cpu", lambda next_kernel: next_kernel)

    def switch(i, once=False):
        while once or not stop.is_set():
            lm.backends.register(Wrap(), "stress_wrapper")
            with lm.backends.use("numpy_ref"):
                with lm.layers.off("checks", "sparse"):
                    pass
            lm.backends.unregister("stress_wrapper")
            with lm.backends.check_kernels():
                pass
            counts[i] += 1
            if once:
                return

    def worker(i):
        (switch if i == 3 else compute)(i)

    # one round of each first, in this thread: on a cold Numba cache (CI) the kernels'
    # first compilation could take the whole window and starve the threads
    compute(0, once=True)
    switch(3, once=True)
    counts[:] = [0] * 4
    shared.grad = None

    # The window ends after ``seconds`` once every thread has done a round, or at 45 s:
    # on a loaded machine a thread can wait seconds for the GIL before its first round,
    # and a fixed window made the test fail without anything being wrong.
    def stop_when_all_worked():
        deadline = time.monotonic() + 45
        time.sleep(seconds)
        while not all(counts) and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.01)
        stop.set()

    watcher = threading.Thread(target=stop_when_all_worked)
    watcher.start()
    try:
        run_threads(worker)
    finally:
        stop.set()
        watcher.join()
    assert all(counts), counts  # every thread did work
    assert shared.grad.tolist() == pytest.approx((a_np[0] * sum(counts[:3])).tolist()), (
        "the shared leaf's gradient lost updates"
    )


# These stay after the stress test above: under LAMINA_PURE_PYTHON=1 it starved its
# threads (counts like [5187, 1, 0, 0]) in about half the runs when even the quick
# warning test below ran before it in the same process -- not understood yet, and
# the same symptom CI showed once before (commit eb47fa4).


@pytest.mark.parametrize(
    "user, seen",
    [
        ({}, {"GOMP_SPINCOUNT": str(threads.SPIN_COUNT), "OMP_WAIT_POLICY": None}),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": "PASSIVE"}),
        ({"GOMP_SPINCOUNT": "7"}, {"GOMP_SPINCOUNT": "7", "OMP_WAIT_POLICY": None}),
    ],
)
def test_numba_pool_starts_with_lamina_spin_count_unless_the_user_chose(user, seen, monkeypatch):
    """Note [Wait policy]: what libgomp reads when Numba's pool starts (here a stand-in
    for Numba), and the environment afterwards as it was."""
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    before = dict(os.environ)
    read = {}

    class Numba:
        def get_num_threads(self):
            read.update({name: os.environ.get(name) for name in seen})
            return 1

    monkeypatch.setattr(threads, "_pool_started", False)
    threads._start_numba_pool(Numba())
    assert read == seen
    assert dict(os.environ) == before
    assert threads._pool_started


def test_lamina_num_threads_is_a_set_num_threads_call_at_import():
    """Note [LAMINA_NUM_THREADS]: Numba's pool gets the count, BLAS one thread."""
    code = (
        "import numba, lamina as lm\n"
        "from lamina.backends import threads\n"
        "print(lm.get_num_threads(), numba.get_num_threads(), threads.blas_num_threads())\n"
    )
    env = dict(os.environ, NUMBA_NUM_THREADS="4", LAMINA_NUM_THREADS="3")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    count, numba_count, blas = out.stdout.split(maxsplit=2)
    assert (count, numba_count) == ("3", "3")
    assert set(eval(blas)) == {1}  # Note [BLAS threads]


@pytest.mark.parametrize("text", ["two", "1.5", "0", "-2"])
def test_a_bad_lamina_num_threads_is_refused_naming_the_variable(text):
    with pytest.raises(ValueError, match="LAMINA_NUM_THREADS") as info:
        threads.count_from_environment({"LAMINA_NUM_THREADS": text})
    assert repr(text) in str(info.value)


def test_lamina_num_threads_above_the_cores_is_lowered_with_a_warning():
    cores = numba.config.NUMBA_NUM_THREADS
    with pytest.warns(RuntimeWarning, match=f"LAMINA_NUM_THREADS={cores + 1} .* {cores} cores"):
        assert threads.count_from_environment({"LAMINA_NUM_THREADS": str(cores + 1)}) == cores
    assert threads.count_from_environment({"LAMINA_NUM_THREADS": " 1 "}) == 1
    assert threads.count_from_environment({"LAMINA_NUM_THREADS": ""}) is None
    assert threads.count_from_environment({}) is None


@pytest.fixture
def two_threads():
    blas = threads.blas_num_threads()
    before = lm.get_num_threads()
    lm.set_num_threads(2)
    yield
    lm.set_num_threads(before)
    threads._blas_libraries().limit(limits=blas[0])


def test_split_runs_the_parts_in_parallel_with_serial_blas(two_threads):
    """Note [Split work]: the parts meet at a barrier (so they run at once, in two
    threads), see BLAS on one thread and the caller's context, and come back in order;
    a split inside a part runs serially."""
    barrier = threading.Barrier(2, timeout=30)
    seen = contextvars.ContextVar("seen", default="no context")
    seen.set("the caller's")

    def part(start, stop):
        barrier.wait()
        inner = threads.split(lambda a, b: (a, b, threading.get_ident()), 10)
        return start, stop, threads.blas_num_threads(), seen.get(), inner

    results = threads.split(part, 5)
    assert [r[:2] for r in results] == [(0, 2), (2, 5)]
    assert all(r[2] == [1] and r[3] == "the caller's" for r in results)
    assert all(len(r[4]) == 1 and r[4][0][:2] == (0, 10) for r in results)
    assert threads.split(lambda a, b: (a, b), 1) == [(0, 1)]  # fewer items than threads


def test_a_child_forked_after_parallel_work_runs_on_one_thread():
    """Note [Fork]: a child forked before any parallel work may use threads; one forked
    after it runs on one thread and refuses more, naming the reason, where GNU OpenMP
    would have terminated it (forked in a fresh interpreter, not in the test process)."""
    code = (
        "import os, numpy as np, lamina as lm\n"
        "from lamina.backends import threads\n"
        "x = lm.asarray(np.ones(1 << 18, np.float32))\n"
        "def child():\n"
        "    try:\n"
        "        lm.set_num_threads(2)\n"
        "        refused = ''\n"
        "    except RuntimeError as e:\n"
        "        refused = 'forked' in str(e) and 'spawn' in str(e)\n"
        "    parts = threads.split(lambda a, b: (a, b), 4)\n"
        "    print(lm.get_num_threads(), parts, float(lm.sum(x * 2.0)), refused, flush=True)\n"
        "    os._exit(0)\n"
        "for parallel in (False, True):\n"
        "    if parallel:\n"
        "        lm.set_num_threads(2)\n"
        "        threads.split(lambda a, b: None, 2)\n"  # the parent's pool runs a region
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        child()\n"
        "    print(os.waitpid(pid, 0)[1], flush=True)\n"
        "print(lm.get_num_threads(), threads.split(lambda a, b: (a, b), 4))\n"
    )
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    env.pop("LAMINA_NUM_THREADS", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    free, status_free, one, status_one, parent = out.stdout.strip().splitlines()
    assert free.split(" ", 1)[0] == "2" and "[(0, 2), (2, 4)]" in free and status_free == "0"
    assert one.split(" ", 1)[0] == "1" and "[(0, 4)]" in one and one.endswith("True")
    assert status_one == "0"
    assert float(one.split()[-2]) == 2 << 18  # a parallel-sized kernel ran, serially
    assert parent == "2 [(0, 2), (2, 4)]"  # the parent keeps its threads


def test_a_failing_part_raises_after_every_part_ended(two_threads):
    ended = []

    def part(start, stop):
        if start:
            raise ValueError("part 2 failed")
        time.sleep(0.05)
        ended.append(start)

    with pytest.raises(ValueError, match="part 2 failed"):
        threads.split(part, 2)
    assert ended == [0]


def test_concurrent_calls_return_in_order_and_raise_the_first_error():
    """Note [Inter-op parallelism] in lamina.jit's executor: tasks spread over lamina's
    threads by cost, their results in task order; a task's exception is raised once
    all have ended; one interop thread runs them in the caller, one after another."""
    count = lm.get_num_threads()
    lm.set_num_threads(2)
    try:
        for interop in (1, 2):
            lm.set_num_interop_threads(interop)
            ran = []
            tasks = tuple((lambda i=i: ran.append(threading.get_ident()) or i) for i in range(5))
            assert threads.concurrently(tasks, (5, 1, 4, 2, 3)) == [0, 1, 2, 3, 4]
            assert len(ran) == 5
            if interop == 1:
                assert set(ran) == {threading.get_ident()}

            def fails():
                raise ValueError("task failed")

            with pytest.raises(ValueError, match="task failed"):
                threads.concurrently((lambda: 1, fails), (1, 1))
    finally:
        lm.set_num_interop_threads(1)
        lm.set_num_threads(count)
    assert lm.get_num_interop_threads() == 1
    for bad, error in ((0, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="set_num_interop_threads: n must"):
            lm.set_num_interop_threads(bad)
