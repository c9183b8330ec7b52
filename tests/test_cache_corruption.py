"""A damaged loop cache (Note [Checked libraries] in backends/loop_cache.py) is rebuilt,
never a crash. Each run is a fresh process with its own cache, so that a library the
loader should not have mapped shows up as a signal exit code, not a dead pytest."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from lamina.backends import loop_cache

# both per-call cores open the same libraries with the same loader (Note [C loops by
# address] in backends/jit.py): it runs once (Note [Core-independent tests])
pytestmark = pytest.mark.core_independent

# two loops (a flat one and a scalar one), and whether they came from the cache
PROGRAM = """
import json, warnings
warnings.simplefilter("always")
import lamina as lm
from lamina.backends import jit
x = lm.asarray([1.5, -2.0, 4.0], dtype=lm.float32)
print(json.dumps({"values": (x * x).tolist() + (x + 1.0).tolist(), "compiled": len(jit._cfuncs)}))
"""
_x = np.array([1.5, -2.0, 4.0], dtype=np.float32)
EXPECTED = np.concatenate([_x * _x, _x + np.float32(1.0)])
WARNING = "lamina's loop cache: ignoring"


def start(cache):
    environment = {**os.environ, "LAMINA_CACHE_DIR": str(cache)}
    environment.pop("LAMINA_LOOP_CACHE", None)
    return subprocess.Popen(
        [sys.executable, "-c", PROGRAM],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process):
    """What a run printed, once it is known to have exited 0 with the right values."""
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, f"exit code {process.returncode} (negative: a signal)\n{err}"
    result = json.loads(out)
    np.testing.assert_array_equal(np.array(result["values"], dtype=np.float32), EXPECTED)
    assert err.count(WARNING) <= 1, err  # one warning per process, however many libraries
    result["stderr"] = err
    return result


def run(cache):
    return finish(start(cache))


def libraries(cache):
    found = sorted(cache.glob("loops/*/*.so"))
    assert len(found) == 2, found
    return found


def assert_repaired(cache):
    again = run(cache)
    assert again["compiled"] == 0 and WARNING not in again["stderr"], again
    for library in libraries(cache):
        assert loop_cache._record_path(library).read_text() == loop_cache._record(
            library.read_bytes()
        )


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    cache = tmp_path_factory.mktemp("filled")
    assert run(cache)["compiled"] == 2
    libraries(cache)
    return cache


@pytest.fixture
def cache(filled, tmp_path):
    copy = tmp_path / "cache"
    shutil.copytree(filled, copy)
    return copy


def truncate(fraction):
    def damage(library):
        size = library.stat().st_size
        os.truncate(library, {0: 0, 0.5: size // 2, 1: size - 1}[fraction])

    return damage


def garbage(library):
    library.write_bytes(os.urandom(library.stat().st_size))


def overwrite_tail(library):
    with open(library, "r+b") as f:
        f.seek(-256, os.SEEK_END)
        f.write(b"\xff" * 256)


def with_record(damage):
    """``damage``, and a record that agrees with it: only the ELF check is left."""

    def both(library):
        damage(library)
        loop_cache._record_path(library).write_text(loop_cache._record(library.read_bytes()))

    return both


def other_machine(library):
    data = bytearray(library.read_bytes())
    data[18:20] = (0xB7 if data[18:20] != b"\xb7\x00" else 0x3E).to_bytes(2, "little")
    library.write_bytes(bytes(data))  # aarch64's e_machine, or x86-64's on aarch64


def not_elf(library):
    library.write_bytes(b"#!/bin/sh\necho not a library\n")


def no_record(library):
    loop_cache._record_path(library).unlink()


DAMAGES = {
    "truncated to 0": truncate(0),
    "truncated to half": truncate(0.5),
    "truncated by one byte": truncate(1),
    "garbage bytes": garbage,
    "tail overwritten": overwrite_tail,
    "another machine's library": with_record(other_machine),
    "not ELF": with_record(not_elf),
    "no checksum record": no_record,
}


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
def test_a_damaged_library_is_rebuilt_not_a_crash(cache, damage):
    for library in libraries(cache):
        damage(library)
    rebuilt = run(cache)
    assert rebuilt["compiled"] == 2
    assert WARNING in rebuilt["stderr"] and ".so" in rebuilt["stderr"]
    assert_repaired(cache)


def test_a_damaged_runtime_object_is_compiled_again(cache):
    """The libraries are linked with runtime.o: a damaged one must not stop them."""
    for library in libraries(cache):
        library.unlink()
    (runtime,) = cache.glob("loops/*/runtime.o")
    runtime.write_bytes(b"garbage")
    assert run(cache)["compiled"] == 2
    assert_repaired(cache)


def test_a_read_only_damaged_cache_is_worked_around(cache):
    for library in libraries(cache):
        truncate(0.5)(library)
    (stamp,) = cache.glob("loops/*")
    stamp.chmod(0o555)
    try:
        first = run(cache)
        assert first["compiled"] == 2 and WARNING in first["stderr"]
        if os.geteuid() == 0:  # root writes a read-only directory: it is repaired
            assert_repaired(cache)
        else:  # the damage stays, each process compiles around it, none crashes
            assert run(cache)["compiled"] == 2
    finally:
        stamp.chmod(0o755)


def test_two_processes_filling_an_empty_cache_at_once(tmp_path):
    """Both exit cleanly with the right values; each loop was compiled by one of them
    at least (the other may load what the first wrote, depending on their timing)."""
    results = [finish(p) for p in [start(tmp_path), start(tmp_path)]]
    assert sum(r["compiled"] for r in results) >= 2
    assert all(r["compiled"] <= 2 for r in results)
    assert_repaired(tmp_path)
