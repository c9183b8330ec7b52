"""Many backends in one process: three third-party plugins, installed together with the
example backend and found through their entry points (the ``*.dist-info`` folders in
``tests/thirdparty``): two new devices -- ``remote`` (storage behind handles in a store
of its own, copying converters) and ``pinned`` (host memory, native elementwise and
view kernels) -- and a CPU override, ``vendor_cpu`` (float64 kernels that decline the
rest, a wrapper). Each runs in a child process with ``tests/thirdparty`` on the path."""

import os
import pathlib
import subprocess
import sys

import pytest
import test_autograd

HERE = pathlib.Path(__file__).resolve().parent
THIRD_PARTY_DEVICES = ("remote", "pinned")  # the example backend adds "counting"
DEVICES = ("counting", *THIRD_PARTY_DEVICES)


def _child(*args, timeout=600):
    path = os.pathsep.join(p for p in (str(HERE / "thirdparty"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, *args],
        env=dict(os.environ, PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=HERE.parent,
    )


SCRIPT = """
import math
import lamina as lm, lamina_vendor_cpu as vendor, lamina_remote as remote

print(sorted((r["name"], r["source"]) for r in lm.backends.list() if r["source"] != "built-in"))
print([d for d in lm.dispatch.keys.devices()])
print(lm.dispatch.dump_table("exp")[0][1:4])
print(lm.dispatch.dump_table("add")[0][1:4])
# moves between every pair of devices keep values and gradients
devices = ["cpu", "counting", "remote", "pinned"]
for a in devices:
    for b in devices:
        w = lm.asarray([0.5, 1.5, -2.0], dtype=lm.float64, device=a, requires_grad=True)
        y = lm.sum(lm.exp(w.to(b)) * w.to(b))
        y.backward()
        assert y.device == b and w.grad.device == a, (a, b)
        want = [math.exp(v) * (1 + v) for v in (0.5, 1.5, -2.0)]
        assert all(abs(g - e) < 1e-12 for g, e in zip(w.grad.tolist(), want)), (a, b)
print("moves ok")
f32, f64 = lm.ones(3, dtype=lm.float32), lm.ones(3, dtype=lm.float64)
m64 = lm.ones((2, 2), dtype=lm.float64)
lm.exp(f32), lm.exp(f64), m64 @ m64, lm.ones(2) + 1
print(dict(vendor.CALLS))
before = len(remote.STORE)
t = lm.ones(1000, device="remote")
assert len(remote.STORE) == before + 1
del t
print("store released", len(remote.STORE) == before)
"""


def test_three_plugins_load_with_the_example_without_a_warning():
    out = _child("-W", "error", "-W", "ignore:cpu fallback", "-c", SCRIPT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    plugins = set(eval(lines[0]))  # other installed plugins may be there too
    assert {(p, "entry point") for p in ("example", "pinned", "remote", "vendor_cpu")} <= plugins
    assert {"cpu", *DEVICES} <= set(eval(lines[1]))
    assert lines[2] == (
        "('[declines] lamina_vendor_cpu.exp -> lamina.backends.numba_cpu.elementwise.exp', "
        "'vendor_cpu -> numba_cpu', '5 -> 0')"
    )
    assert lines[3] == (
        "('lamina_vendor_cpu.count_add -> lamina.backends.numba_cpu.elementwise.add', "
        "'vendor_cpu -> numba_cpu', '0 -> 0')"
    )
    assert lines[4] == "moves ok"
    calls = eval(lines[5])
    assert calls["exp"] >= 1 and calls["matmul"] == 1 and calls["add (wrapped)"] >= 1
    assert lines[6] == "store released True"


# the CPU operators vendor_cpu serves (float64) or wraps: their gradchecks run on its kernels
VENDOR_OPERATORS = ("exp", "tanh", "matmul", "add")


# Note [Core-independent tests]: the plugins' devices and kernels, in another process;
# the pure-Python core's bindings meet a plugin's device in the suite's own run of
# tests/test_autograd.py (the example backend's ``counting``)
@pytest.mark.core_independent
def test_the_autograd_suite_passes_on_every_device_with_all_of_them_installed():
    """tests/test_autograd.py's device tests on the two devices only this process has:
    every sample's values and gradients on ``remote`` and ``pinned`` match the CPU's
    (test_every_sample_runs_on_a_plugin_device) and the first sample of each formula
    passes gradcheck there; and the CPU's gradchecks of the operators vendor_cpu serves
    or wraps pass through its kernels. (The suite's own run covers ``counting`` and the
    CPU without plugins: running the whole file again here took two minutes of CI.)"""
    vendor = " or ".join(VENDOR_OPERATORS)
    selected = (
        f"plugin_device and not counting or test_gradcheck and not plugin_device and ({vendor})"
    )
    # -n0: one process, this test already runs in one of the suite's workers
    out = _child(
        "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-n0", "-k", selected,
        "tests/test_autograd.py",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    passed = [line for line in out.stdout.splitlines() if line.startswith("PASSED ")]
    per_device = len(test_autograd.CASES) + len(test_autograd.SAMPLES)
    for device in THIRD_PARTY_DEVICES:
        assert sum(p.endswith(f"-{device}]") for p in passed) == per_device, device
    assert not any(p.endswith("-counting]") for p in passed)
    on_cpu = {p.split("[")[1][:-1] for p in passed if "::test_gradcheck[" in p}
    vendors = {c.id for c in test_autograd.CASES if c.values[0] in VENDOR_OPERATORS}
    assert vendors and vendors <= on_cpu, sorted(vendors - on_cpu)
