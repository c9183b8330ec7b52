"""The loop cache (Note [Loop cache] in backends/loop_cache.py): the C core's loops kept
as shared libraries, opened by later processes without compiling."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from lamina.backends import loop_cache
from lamina.backends.numba_cpu import kernels as K
from lamina.dispatch import core
from lamina.dispatch import dtypes as D

C_CORE = core.IMPLEMENTATION == "c"

# one process's use of two loops (a flat one and a scalar one), and what it took
PROGRAM = """
import json, sys
import lamina as lm
from lamina.backends import jit, loop_cache
x = lm.asarray([1.5, -2.0, 4.0], dtype=lm.float32)
values = (x * x).tolist() + (x + 1.0).tolist()
print(json.dumps({"values": values, "compiled": len(jit._cfuncs),
                  "opened": len(loop_cache._libraries), "numba": "numba" in sys.modules}))
"""


def run(cache_dir, **env):
    environment = {**os.environ, "LAMINA_CACHE_DIR": str(cache_dir), **env}
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=environment, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def libraries(cache_dir):
    return sorted(p.name for p in cache_dir.glob("loops/*/*.so"))


EXPECTED = [2.25, 4.0, 16.0, 2.5, -1.0, 5.0]


def test_a_later_process_opens_the_loops_it_needs_without_compiling_or_numba(tmp_path):
    first = run(tmp_path)
    second = run(tmp_path)
    assert first["values"] == second["values"] == EXPECTED
    # both cores run these loops (Note [C loops by address] in backends/jit.py)
    assert len(libraries(tmp_path)) == 2
    assert first["compiled"] == 2 and first["opened"] == 2  # it uses what it stored
    assert second["compiled"] == 0 and second["opened"] == 2
    if C_CORE:  # the pure-Python core calls them from Numba kernels
        assert second["numba"] is False  # Note [Lazy Numba]: nothing needed it


# float % and // call fmod: a library's calls go to the bridge of Note [fmod in loop
# libraries], which must give NumPy's results, signed zeros and specials included
MODULO = """
import json, sys
import numpy as np
import lamina as lm
from lamina.backends import loop_cache
x = [5.5, -5.5, 0.0, -0.0, 7.0, 1e30, 3e-39, 1e-40, float("inf"), float("nan"), 2.0, -7.25]
y = [2.0, 2.0, -3.0, 3.0, -0.0, 3.0, 7e-40, -3e-41, 2.0, 1.0, float("inf"), -0.5]
out = {}
for dtype in ("float32", "float64"):
    a, b = lm.asarray(x, dtype=dtype), lm.asarray(y, dtype=dtype)
    out[dtype] = [lm.remainder(a, b).numpy().tobytes().hex(), (a // b).numpy().tobytes().hex()]
print(json.dumps({"out": out, "opened": len(loop_cache._libraries)}))
"""


def test_float_remainders_from_a_library_are_numpys(tmp_path):
    environment = {**os.environ, "LAMINA_CACHE_DIR": str(tmp_path)}
    x = [5.5, -5.5, 0.0, -0.0, 7.0, 1e30, 3e-39, 1e-40, math.inf, math.nan, 2.0, -7.25]
    y = [2.0, 2.0, -3.0, 3.0, -0.0, 3.0, 7e-40, -3e-41, 2.0, 1.0, math.inf, -0.5]
    for run_ in ("stores", "opens"):
        done = subprocess.run(
            [sys.executable, "-c", MODULO], env=environment, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["opened"] == 4, run_
        for dtype, (rem, div) in result["out"].items():
            a, b = np.asarray(x, dtype), np.asarray(y, dtype)
            with np.errstate(all="ignore"):
                expected = (np.remainder(a, b), np.floor_divide(a, b))
            for got, want in zip((rem, div), expected):
                got = np.frombuffer(bytes.fromhex(got), dtype)
                assert np.array_equal(np.isnan(got), np.isnan(want)), (run_, dtype, got, want)
                keep = ~np.isnan(want)
                assert got[keep].tobytes() == want[keep].tobytes(), (run_, dtype, got, want)


COMPILED = """
import json, sys
import lamina as lm
from lamina.backends import jit
x = lm.asarray([1.5, -2.0, 4.0], dtype=lm.float32)
values = lm.jit.compile(lambda x: lm.exp(x * 0.5) - x)(x).tolist()
print(json.dumps({"values": values, "compiled": len(jit._cfuncs), "numba": "numba" in sys.modules}))
"""


def test_a_compiled_functions_fused_loop_is_opened_without_numba(tmp_path):
    """Note [Fused loops]: a warm start of a compiled elementwise function compiles
    nothing and needs no Numba."""
    environment = {**os.environ, "LAMINA_CACHE_DIR": str(tmp_path)}
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", COMPILED], env=environment, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout))
    want = [math.exp(v * 0.5) - v for v in (1.5, -2.0, 4.0)]
    for run_ in runs:
        assert run_["values"] == pytest.approx(want, rel=1e-6)
    assert runs[0]["compiled"] >= 1 and runs[1]["compiled"] == 0
    if C_CORE:  # the pure-Python core's eager calls go through Numba entry points
        assert runs[1]["numba"] is False


def test_a_damaged_library_is_rebuilt(tmp_path):
    run(tmp_path)
    for library in tmp_path.glob("loops/*/*.so"):
        library.write_bytes(b"not a shared library")
    again = run(tmp_path)
    assert again["values"] == EXPECTED
    assert again["compiled"] == 2 and again["opened"] == 2
    assert run(tmp_path)["compiled"] == 0


def test_switched_off_it_writes_nothing(tmp_path):
    off = run(tmp_path, LAMINA_LOOP_CACHE="0")
    assert off["values"] == EXPECTED and off["opened"] == 0
    assert not (tmp_path / "loops").exists()


def test_keys_name_module_level_functions_only():
    """A closure or lambda has no name that is the same in every process: its loop is
    left to Numba's cache."""
    assert loop_cache._name((K.binary_cloop, K.add, D.float32)) == (
        "(lamina.backends.numba_cpu.kernels.binary_cloop,"
        "lamina.backends.numba_cpu.kernels.add,float32)"
    )
    assert loop_cache._name((K.binary_cloop, lambda x, y: x + y, D.float32)) is None
    assert loop_cache._name((K.binary_cloop, K.binary_cloop(K.add), D.float32)) is None
    assert loop_cache._name((K.binary_cloop, object())) is None


@pytest.mark.parametrize("edit", ["size", "mtime"])
def test_an_edited_source_changes_the_stamp(tmp_path, monkeypatch, edit):
    source = tmp_path / "kernels.py"
    source.write_text("x = 1\n")
    monkeypatch.setattr(loop_cache, "_SOURCES", tmp_path)
    before = loop_cache._stamp(loop_cache._source_stats())
    if edit == "size":
        source.write_text("x = 10\n")
    else:
        st = source.stat()
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert loop_cache._stamp(loop_cache._source_stats()) != before


def test_only_the_most_recently_used_stamp_directories_are_kept(tmp_path):
    loops = tmp_path / "loops"
    for i in range(loop_cache._KEEP + 3):
        stamp = loops / f"stamp{i}"
        stamp.mkdir(parents=True)
        (stamp / "x.so").write_bytes(b"")
        os.utime(stamp, (1000 + i, 1000 + i))
    loop_cache._prune(loops)
    kept = sorted(d.name for d in loops.iterdir())
    assert kept == sorted(f"stamp{i}" for i in range(3, loop_cache._KEEP + 3))
