"""Numba's cache under concurrent processes (Note [Numba's cache races] in
backends/loop_cache.py): saves are serialized by a lock file, and an index naming
another variant's data is detected and compiled around, never run; variants compiled
with other options are keyed apart; a kernel another process is compiling is loaded
once it is saved, not compiled again (Note [Compiling once]).

The kernel lives in a module written to a temporary directory, so its cache files
(``__pycache__`` beside it) belong to the test alone."""

import fcntl
import importlib.util
import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

from lamina.backends import jit, loop_cache

pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]

SOURCE = """
def double(x, out):
    for i in range(x.size):
        out[i] = x[i] * 2
"""


def fresh_module(tmp_path, monkeypatch, name, source):
    """Module ``name`` of ``source``, written to ``tmp_path``. It is in ``sys.modules``,
    as every kernel's module is: a cached variant names its module, and loading it
    imports that module by name."""
    (tmp_path / f"{name}.py").write_text(source)
    spec = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """``double`` from a fresh module in ``tmp_path``, and its cache directory."""
    module = fresh_module(tmp_path, monkeypatch, "doubling", SOURCE)
    return module.double, tmp_path / "__pycache__"


def compile_for(pyfunc, dtype):
    array = jit.array(dtype)
    return jit.compile_kernel(pyfunc, jit.types.none(array, array))


def check(entry, dtype):
    x = np.arange(5, dtype=dtype)
    out = np.zeros_like(x)
    entry(x, out)
    np.testing.assert_array_equal(out, x * 2)


def index_of(cache):
    (index,) = cache.glob("*double*.nbi")
    return index


def test_an_index_naming_another_variants_data_is_compiled_around(kernel):
    double, cache = kernel
    for dtype in (np.int64, np.float64):
        compile_for(double, dtype)
    # what two unlocked processes leave: each signature names the other one's data
    index = index_of(cache)
    with open(index, "rb") as f:
        version, rest = pickle.load(f), f.read()
    stamp, overloads = pickle.loads(rest)
    (int_key, int_data), (float_key, float_data) = overloads.items()
    swapped = {int_key: float_data, float_key: int_data}
    with open(index, "wb") as f:
        pickle.dump(version, f)
        f.write(pickle.dumps((stamp, swapped)))

    for dtype in (np.float64, np.int64):
        check(compile_for(double, dtype), dtype)


SCALED = """
def scaled_by(k):
    def scale(x, out):
        for i in range(x.size):
            out[i] = x[i] * k
    return scale
"""


def test_an_index_naming_another_closures_data_is_compiled_around(tmp_path, monkeypatch):
    """Two closures of one template share a signature; each data file carries its key,
    so a swapped index (what a race, or files copied over each other, leaves) is a miss
    and compiles again, never another variant's code run as this one's."""
    scaled_by = fresh_module(tmp_path, monkeypatch, "scaling", SCALED).scaled_by
    array = jit.array(np.float64)
    signature = jit.types.none(array, array)
    for k in (2, 3):
        jit.compile_kernel(scaled_by(k), signature)
    index = next((tmp_path / "__pycache__").glob("*scale*.nbi"))
    with open(index, "rb") as f:
        version, rest = pickle.load(f), f.read()
    stamp, overloads = pickle.loads(rest)
    (two, two_data), (three, three_data) = overloads.items()
    with open(index, "wb") as f:
        pickle.dump(version, f)
        f.write(pickle.dumps((stamp, {two: three_data, three: two_data})))

    x = np.arange(4.0)
    for k in (2, 3):
        out = np.zeros_like(x)
        jit.compile_kernel(scaled_by(k), signature)(x, out)
        np.testing.assert_array_equal(out, x * k)


def test_a_save_waits_for_the_lock_of_its_cache_directory(kernel):
    double, cache = kernel
    cache.mkdir()
    holder = os.open(cache / loop_cache._LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another process saving, as flock sees it
    entries = []
    saver = threading.Thread(target=lambda: entries.append(compile_for(double, np.float32)))
    try:
        saver.start()
        saver.join(timeout=2)
        assert not list(cache.glob("*double*.nbi")), "saved while the lock was held"
    finally:
        os.close(holder)
    saver.join(timeout=60)
    assert not saver.is_alive()
    check(entries[0], np.float32)
    assert index_of(cache).exists()


# another process compiling double for float32: it holds the compile's lock, says so,
# and compiles (saving the kernel) once told to go on
COMPILING = """
import contextlib, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import doubling
from lamina.backends import jit, loop_cache

locking = loop_cache.compiling_once


@contextlib.contextmanager
def held_until_told(cache, key):
    with locking(cache, key):
        print("locked", flush=True)
        sys.stdin.readline()
        yield


loop_cache.compiling_once = held_until_told
array = jit.array(np.float32)
jit.compile_kernel(doubling.double, jit.types.none(array, array))
"""


def test_a_kernel_another_process_is_compiling_is_waited_for_and_loaded(kernel, tmp_path):
    """Note [Compiling once]: while another process compiles a kernel, a process that
    needs it waits, then loads the kernel the other saved: it compiles nothing."""
    from numba.core import event

    double = kernel[0]
    other = subprocess.Popen(
        [sys.executable, "-c", COMPILING, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline() == "locked\n"
        compiled, entries = [], []

        class Compiles(event.Listener):
            def on_start(self, ev):
                compiled.append(ev.data["dispatcher"].py_func.__name__)

            def on_end(self, ev):
                pass

        waiter = threading.Thread(target=lambda: entries.append(compile_for(double, np.float32)))
        with event.install_listener("numba:compile", Compiles()):
            waiter.start()
            waiter.join(timeout=1.5)
            assert waiter.is_alive(), "compiled while another process held the lock"
            other.stdin.write("go\n")
            other.stdin.flush()
            waiter.join(timeout=120)
        assert not waiter.is_alive()
        assert other.wait(timeout=60) == 0
    finally:
        other.kill()
    assert compiled == [], "compiled what the other process saved"
    check(entries[0], np.float32)


def test_variants_compiled_with_other_options_are_cached_apart(tmp_path, monkeypatch):
    """Note [Cache keys and options]: with reassociation (and no signed zeros) LLVM
    folds (x + c) - c into x; strictly it rounds. The variant compiled second, with the
    other options, must not be the first one loaded from the cache."""
    source = "def cancel(x, out):\n    out[0] = (x[0] + 1e16) - 1e16\n"
    cancel = fresh_module(tmp_path, monkeypatch, "cancelling", source).cancel
    array = jit.array(np.float64)
    for fastmath, want in ((False, 0.0), ({"reassoc", "nsz"}, 1.0), (False, 0.0)):
        entry = jit.compile_kernel(cancel, jit.types.none(array, array), fastmath=fastmath)
        out = np.zeros(1)
        entry(np.ones(1), out)
        assert out[0] == want, fastmath


SCALE = """
def scale(x, out):
    for i in range(x.size):
        out[i] = x[i] * {}
"""


def imported_now(monkeypatch, directory):
    """As a process that imported the sources in ``directory`` now (Note [Source
    stamps]): they stand for the backends' sources."""
    monkeypatch.setattr(loop_cache, "_SOURCES", directory)
    monkeypatch.setattr(loop_cache, "_IMPORTED", loop_cache._source_stats())
    monkeypatch.setattr(loop_cache, "_imported_stamp", None)


def test_a_kernel_edited_while_its_process_runs_is_cached_as_the_source_it_ran(
    tmp_path, monkeypatch
):
    """Note [Source stamps]: a process that compiles a kernel after its file was edited
    saves nothing; the next process, which imports the edited file, runs the edited
    kernel. (The bytecode of x * 2 and x * 10 is the same, so Numba's key alone cannot
    tell the two versions apart: only the stamp can.)"""
    array = jit.array(np.float64)
    x = np.arange(4.0)
    old = fresh_module(tmp_path, monkeypatch, "scaling", SCALE.format(2)).scale
    imported_now(monkeypatch, tmp_path)
    (tmp_path / "scaling.py").write_text(SCALE.format(10))  # edited meanwhile
    out = np.zeros(4)
    jit.compile_kernel(old, jit.types.none(array, array))(x, out)
    np.testing.assert_array_equal(out, x * 2)  # this process runs what it imported
    assert not list((tmp_path / "__pycache__").glob("*scale*.nbi"))

    new = fresh_module(tmp_path, monkeypatch, "scaling", SCALE.format(10)).scale
    imported_now(monkeypatch, tmp_path)  # the next process
    for _ in range(2):  # compiled and saved, then loaded from the cache
        jit.compile_kernel(new, jit.types.none(array, array))(x, out)
        np.testing.assert_array_equal(out, x * 10)
    assert list((tmp_path / "__pycache__").glob("*scale*.nbi"))
