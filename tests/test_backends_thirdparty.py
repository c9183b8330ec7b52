"""Third-party backends (docs/backends.md): entry-point discovery, new devices, moves,
device mismatches, backend fallbacks, kernel overrides and wrappers, inspection, and
fault isolation.

Needs the example distribution installed (the README's test command does it):
``pip install -e examples/lamina-example-backend``. It registers the plugin
``example`` (entry point group ``lamina.backends``) with the device ``counting``.
See Note [Backend fallback], Note [Device check], Note [Kernel wrappers] in
dispatch/table.py and Note [Device keys] in dispatch/keys.py.
"""

import contextlib
import functools
import importlib.metadata
import itertools
import os
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

import lamina as lm
from lamina.dispatch import entries, keys, registry
from lamina.dispatch.decompositions import DECOMPOSITIONS

try:
    import lamina_example_backend as example
    from lamina_example_backend import CountingBackend, CountingStorage
except ImportError:  # pragma: no cover
    pytest.fail(
        "the example backend is not installed: run "
        "`pip install -e examples/lamina-example-backend` (see README.md)",
        pytrace=False,
    )

CPU = keys.CPU
_names = itertools.count()


# ---------------------------------------------------------------- helpers


def _slot(fn):
    # error kernels are fresh closures after every rebuild; a device's checked and
    # fallback slots are too once its plugin was unregistered and registered again
    name = getattr(fn, "__qualname__", "")
    if name == "missing_kernel.<locals>.no_kernel":
        return "missing"
    return name if name.startswith(("device_checked[", "fallback_kernel[")) else fn


def snapshot():
    """Everything a rebuild may change (tables, masks, winners, devices)."""
    return (
        {
            name: (
                [_slot(f) for f in op.table],
                op.mask,
                {k: (w.name, w.plugin, w.priority) for k, w in op.winners.items()},
            )
            for name, op in lm.dispatch.OPERATORS.items()
        },
        keys.devices(),
    )


def rows(name):
    """dump_table(name) as {key name: (kernel, plugin, priority)} (without the rule)."""
    return {r[0]: tuple(r[1:4]) for r in lm.dispatch.dump_table(name)}


def record(name):
    return next(r for r in lm.backends.list() if r["name"] == name)


def counting(values, dtype=None):
    return lm.asarray(values, dtype=dtype, device="counting")


@pytest.fixture(autouse=True)
def tables_restored():
    """Every test leaves the tables, devices and plugins as it found them."""
    before, plugins = snapshot(), [r["name"] for r in lm.backends.list()]
    example.plugin.calls.clear()
    example.plugin.fallback_calls.clear()
    yield
    for name in [r["name"] for r in lm.backends.list()]:
        if name not in plugins:
            lm.backends.unregister(name)
    if not lm.backends.plugin_manager.has_plugin("example"):
        lm.backends.register(example.plugin, "example", "entry point")
    assert registry.preferred_plugin is None
    assert snapshot() == before, "the test left the dispatch tables or devices changed"


@pytest.fixture
def second():
    """A second third-party device, ``counting2``, registered at run time."""
    plugin = CountingBackend("counting2")
    assert lm.backends.register(plugin, "example2") is True
    return plugin


def make_plugin(hook):
    class Plugin:
        @lm.backends.hookimpl
        def lamina_register_kernels(self, registry):
            hook(registry)

    return Plugin()


def fresh_name(prefix="tp_plugin"):
    return f"{prefix}_{next(_names)}"


# ---------------------------------------------------------------- discovery


def test_the_example_is_discovered_through_its_entry_point():
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="lamina.backends")}
    assert eps["example"].value == "lamina_example_backend:plugin"
    assert eps["example"].dist.name == "lamina-example-backend"
    assert lm.backends.plugin_manager.get_plugin("example") is example.plugin
    assert record("example") == {
        "name": "example",
        "source": "entry point",
        "devices": ["counting"],
        "new_devices": ["counting"],
        "priority": [0],
        "kernels": 4,
    }
    assert "counting" in keys.devices() and keys.devices()[0] == "cpu"
    key = keys.device_key("counting")
    assert key & keys.BACKEND_MASK and key > CPU and key & (key - 1) == 0
    assert keys.all_keys() == [
        *(keys.device_key(d) for d in keys.devices()),
        keys.SPARSE,
        keys.AUTOGRAD,
        keys.LAYER_KEYS["trace"],  # lamina.jit's tracer
    ]


def test_a_fresh_process_discovers_the_example_without_warnings():
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "warnings.filterwarnings('ignore', 'cpu fallback')  # the example's design\n"
        "import lamina as lm\n"
        "x = lm.ones(3, device='counting') + 1\n"
        "print(x.device, x.tolist(), [r['name'] for r in lm.backends.list()])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120
    )
    assert out.returncode == 0, out.stderr
    device, rest = out.stdout.split(" ", 1)
    assert device == "counting" and rest.startswith("[2.0, 2.0, 2.0]")
    assert "'example'" in rest and "'numba_cpu'" in rest


def test_the_entry_point_scan_says_maybe_wherever_importlib_metadata_could_find_one(
    tmp_path, monkeypatch
):
    """``import lamina`` asks importlib.metadata only if this scan finds a maybe; it must
    never say no where a plugin could be installed."""
    from lamina.backends._manager import _GROUP, _may_have_entry_points

    assert _may_have_entry_points(_GROUP)  # this environment: the example's dist-info
    dist = tmp_path / "other-1.0.dist-info"
    dist.mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(tmp_path / "missing")])
    assert not _may_have_entry_points(_GROUP)  # no entry_points.txt
    (dist / "entry_points.txt").write_text("[console_scripts]\nx = y:z\n")
    assert not _may_have_entry_points(_GROUP)  # another group only
    (dist / "entry_points.txt").write_text("[console_scripts]\nx = y:z\n\n[lamina.backends]\n")
    assert _may_have_entry_points(_GROUP)
    (dist / "entry_points.txt").unlink()
    (tmp_path / "plugins.zip").write_bytes(b"")  # a zip file on sys.path: cannot tell
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(tmp_path / "plugins.zip")])
    assert _may_have_entry_points(_GROUP)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])

    class Finder:  # a finder of distributions of its own: cannot tell either
        def find_distributions(self, context=None):
            return iter(())

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder()])
    assert _may_have_entry_points(_GROUP)


def test_registering_a_device_plugin_rebuilds_the_tables_once(monkeypatch):
    calls = []
    real = entries.rebuild
    monkeypatch.setattr(entries, "rebuild", lambda: (calls.append(1), real())[1])
    lm.backends.register(CountingBackend("counting2"), "example2")
    assert len(calls) == 1
    lm.backends.unregister("example2")
    assert len(calls) == 2


# ---------------------------------------------------------------- devices and moves


def test_creation_functions_make_tensors_on_the_new_device():
    made = {
        "asarray": lm.asarray([[1.0, 2.0]], device="counting"),
        "zeros": lm.zeros((2, 3), device="counting"),
        "ones": lm.ones(3, dtype=lm.int32, device="counting"),
        "full": lm.full((2,), 7, device="counting"),
        "empty": lm.empty((4,), device="counting"),
        "arange": lm.arange(5, device="counting"),
        "linspace": lm.linspace(0.0, 1.0, 5, device="counting"),
        "eye": lm.eye(3, device="counting"),
        "rand": lm.rand(2, 2, device="counting"),
        "randn": lm.randn(3, device="counting"),
        "zeros_like": lm.zeros_like(lm.ones(2, device="counting")),
        "from_dlpack": lm.from_dlpack(np.arange(3.0), device="counting"),
    }
    for name, t in made.items():
        assert t.device == "counting" and str(t.device) == "counting", name
        assert isinstance(t._data, CountingStorage), name
        assert t._ks == keys.device_key("counting") and t._flat is None, name
    assert made["ones"].dtype == lm.int32 and made["ones"].tolist() == [1, 1, 1]
    assert made["full"].tolist() == [7, 7] and made["full"].dtype == lm.int64
    assert made["arange"].tolist() == [0, 1, 2, 3, 4]
    assert made["eye"].to("cpu").numpy().tolist() == np.eye(3).tolist()
    assert made["zeros"].shape == (2, 3) and made["zeros"].ndim == 2
    assert (
        repr(made["asarray"]) == "tensor([[1., 2.]], device='counting')"
    )  # default float: implied
    assert example.plugin.calls["from_host"] == 2  # asarray and from_dlpack: native
    assert example.plugin.fallback_calls["full"] >= 3  # zeros, ones, full, zeros_like


def test_moves_between_cpu_and_the_device_copy_and_report_the_device():
    x = lm.asarray([1.0, 2.0, 3.0])
    c = x.to("counting")
    assert c.device == "counting" and c.tolist() == [1.0, 2.0, 3.0]
    assert x.to_device("counting").device == "counting"
    assert c.to("counting") is c and c.to_device(c.device) is c
    back = c.to_device("cpu")
    assert back.device == "cpu" and back.tolist() == [1.0, 2.0, 3.0]
    # a move never shares storage, although the counting converters do
    back[0] = 100.0
    x[1] = 200.0
    assert c.tolist() == [1.0, 2.0, 3.0]
    assert lm.asarray(x, device="counting").device == "counting"
    assert lm.asarray(c, device="cpu").tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="moving a tensor from counting to cpu needs a copy"):
        lm.asarray(c, device="cpu", copy=False)
    f = lm.astype(x, lm.float32, device="counting")
    assert f.device == "counting" and f.dtype == lm.float32
    with pytest.raises(
        ValueError,
        match=f"to: unknown device 'gpu'; known devices: {', '.join(keys.devices())}",
    ):
        c.to("gpu")


def test_numpy_raises_for_device_tensors_but_python_conversions_work():
    c = counting([[1.5, 2.5]])
    with pytest.raises(
        TypeError, match="numpy\\(\\) needs a dense CPU tensor; this one is on counting"
    ):
        c.numpy()
    with pytest.raises(TypeError, match="this one is on counting"):
        np.asarray(c)
    assert c.tolist() == [[1.5, 2.5]]
    assert c[0, 1].item() == 2.5 and float(c[0, 0]) == 1.5 and int(c[0, 1]) == 2
    assert bool(counting(1.0)) is True


# ---------------------------------------------------------------- device mismatch


def test_mixing_devices_raises_a_clear_error_naming_both(second):
    x, c, d = lm.ones(3), lm.ones(3, device="counting"), lm.ones(3, device="counting2")
    calls = [
        lambda: x + c,
        lambda: c + x,
        lambda: lm.multiply(c, x),
        lambda: lm.where(x > 0, c, 0.0),
        lambda: lm.concat([c, x]),
        lambda: lm.matmul(x, c),
        lambda: c.__iadd__(x),
    ]
    for call in calls:
        with pytest.raises(
            ValueError, match="expected all tensors on one device, got tensors on cpu and counting"
        ):
            call()
    with pytest.raises(ValueError, match="add: .* on counting and counting2"):
        c + d
    with pytest.raises(
        ValueError,
        match="on cpu and counting2; move them to one device first, e.g. with x.to\\('cpu'\\)",
    ):
        d * x
    assert (c + 1).tolist() == [2.0, 2.0, 2.0]  # Python scalars belong to no device
    assert c.tolist() == [1.0, 1.0, 1.0]


def test_the_cpu_slot_is_the_bare_kernel_even_with_devices_registered(second):
    # Note [Device check]: only non-CPU device slots are checked; CPU's is the kernel
    for name in ("add", "multiply", "sum", "matmul", "reshape"):
        op = lm.dispatch.get(name)
        assert op.table[CPU.bit_length()] is op.winners[CPU].fn
        assert op.winners[CPU].plugin in ("numba_cpu", "numpy_ref")
        for dev in ("counting", "counting2"):
            slot = op.table[keys.device_key(dev).bit_length()]
            assert slot.__qualname__.startswith("device_checked["), (name, dev)


# ---------------------------------------------------------------- fallback


def test_operators_without_a_device_kernel_run_through_the_fallback():
    data = np.arange(1.0, 7.0).reshape(2, 3)
    x, c = lm.asarray(data), counting(data)
    samples = {
        "exp": lambda t: lm.exp(t),
        "negative": lambda t: -t,
        "multiply": lambda t: t * t,
        "subtract": lambda t: t - 1,
        "divide": lambda t: 1 / t,
        "greater": lambda t: t > 2.5,
        "sum": lambda t: lm.sum(t, axis=0),
        "mean": lambda t: lm.mean(t),
        "argmax": lambda t: lm.argmax(t, axis=1),
        "max": lambda t: lm.max(t),
        "reshape": lambda t: lm.reshape(t, (3, 2)),
        "matrix_transpose": lambda t: t.T,
        "permute_dims": lambda t: lm.permute_dims(t, (1, 0)),
        "getitem": lambda t: t[1, ::-1],
        "flip": lambda t: lm.flip(t, axis=0),
        "clip": lambda t: lm.clip(t, 2.0, 5.0),
        "where": lambda t: lm.where(t > 3, t, 0.0),
        "matmul": lambda t: t @ t.T,
        "astype": lambda t: lm.astype(t, lm.int32),
        "concat": lambda t: lm.concat([t, t], axis=1),
        "stack": lambda t: lm.stack([t, t]),
        "broadcast_to": lambda t: lm.broadcast_to(t[0], (2, 3)),
    }
    for name, f in samples.items():
        want, got = f(x), f(c)
        assert got.device == "counting", name
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.tolist() == want.tolist(), name
        # Note [Core operators]: the others run as their decompositions on the device
        decomposed = name in DECOMPOSITIONS
        assert (example.plugin.fallback_calls[name] == 0) == decomposed, name
    assert 5 < len(set(samples) & set(DECOMPOSITIONS)) < len(samples) - 5
    parts = lm.split(c, 1, axis=0)
    assert isinstance(parts, tuple) and [p.device for p in parts] == ["counting"] * 2
    assert [p.tolist() for p in parts] == [[[1.0, 2.0, 3.0]], [[4.0, 5.0, 6.0]]]
    # add has a kernel of its own on counting: no fallback
    adds = example.plugin.calls["add"]  # decompositions called it already (subtract)
    assert (c + c).tolist() == (x + x).tolist()
    assert example.plugin.calls["add"] == adds + 1 and example.plugin.fallback_calls["add"] == 0
    kernel, plugin, priority = rows("exp")["counting"]
    assert kernel == "[fallback] lamina_example_backend.CountingBackend.fallback"
    assert (plugin, priority) == ("example", 0)


def test_fallback_in_place_operators_and_views_write_through():
    c = counting([1.0, 2.0, 3.0, 4.0])
    c += 1
    assert c.tolist() == [2.0, 3.0, 4.0, 5.0] and c.device == "counting"
    c[0] = -1.0
    v = c[1:3]
    v *= 10
    assert c.tolist() == [-1.0, 30.0, 40.0, 5.0]
    c[lm.asarray([3], device="counting")] = 0.0
    assert c.tolist() == [-1.0, 30.0, 40.0, 0.0]
    assert {"setitem", "getitem"} <= set(example.plugin.fallback_calls)
    assert not {"add_", "multiply_"} & set(example.plugin.fallback_calls)  # decomposed


def test_a_device_without_fallback_names_the_missing_kernel():
    plugin = CountingBackend("nofallback")
    name = fresh_name()
    lm.backends.register(
        make_plugin(
            lambda r: r.add_device("nofallback", to_cpu=plugin.to_cpu, from_cpu=plugin.from_cpu)
        ),
        name,
    )
    t = lm.ones(2).to("nofallback")  # moves need only the converters
    assert t.device == "nofallback" and t.tolist() == [1.0, 1.0]
    with pytest.raises(NotImplementedError, match="'exp' has no kernel for key nofallback"):
        lm.exp(t)
    with pytest.raises(NotImplementedError, match="'full' has no kernel for key nofallback"):
        lm.zeros(2, device="nofallback")
    assert rows("exp")["nofallback"] == ("[missing: NotImplementedError]", "", "")


def test_a_fallback_without_a_device_converter_is_an_error():
    op = lm.dispatch.get("exp")
    with pytest.raises(NotImplementedError, match="cpu_fallback: exp"):
        lm.backends.cpu_fallback(op, CPU, lm.ones(2))


# ---------------------------------------------------------------- overrides


def test_the_opt_in_cpu_matmul_wrapper_counts_and_delegates(second):
    # installing the example changes nothing on the CPU ...
    assert rows("matmul")["CPU"][1:] == ("numba_cpu", 0)
    add_slot = lm.dispatch.get("add").table[CPU.bit_length()]
    counter = CountingBackend("counting3", count_cpu_matmul=True)
    name = fresh_name("matmul_counter")
    lm.backends.register(counter, name)
    # ... opting in puts a priority-10 wrapper over whatever served CPU matmul; the dump
    # names every link of the chain, with its plugin and priority
    kernel, plugin, priority = rows("matmul")["CPU"]
    assert (plugin, priority) == (f"{name} -> numba_cpu", "10 -> 0")
    assert kernel == (
        "lamina_example_backend.CountingBackend.count_matmul -> "
        "lamina.backends.numba_cpu.linalg.matmul"
    )
    op = lm.dispatch.get("matmul")
    # the slot checks its first result (Note [Result checks]), then is the wrapper's
    # kernel itself, nothing in front of it
    assert op.table[CPU.bit_length()].__qualname__ == "first_call_checked[matmul, CPU]"
    a = lm.asarray([[1.0, 2.0], [3.0, 4.0]])
    assert (a @ a).tolist() == [[7.0, 10.0], [15.0, 22.0]]
    assert op.table[CPU.bit_length()].__qualname__ == (
        "CountingBackend.count_matmul.<locals>.counting_matmul"
    )
    assert lm.matmul(a, a).tolist() == [[7.0, 10.0], [15.0, 22.0]]
    assert counter.cpu_matmul_calls == 2
    assert lm.dispatch.get("add").table[CPU.bit_length()] is add_slot
    with lm.backends.use("numpy_ref"):  # use() picks the kernel; wrappers still wrap it
        assert rows("matmul")["CPU"][1] == f"{name} -> numpy_ref"
        a @ a
    assert counter.cpu_matmul_calls == 3
    lm.backends.unregister(name)
    assert rows("matmul")["CPU"] == ("lamina.backends.numba_cpu.linalg.matmul", "numba_cpu", 0)
    a @ a
    assert counter.cpu_matmul_calls == 3


def test_the_entry_point_plugin_wraps_cpu_matmul_when_asked():
    code = (
        "import lamina as lm, lamina_example_backend as ex\n"
        "a = lm.ones((2, 2)); a @ a; a @ a\n"
        "print(ex.plugin.cpu_matmul_calls, lm.dispatch.dump_table('matmul')[0][:4])\n"
    )
    env = dict(os.environ, LAMINA_EXAMPLE_COUNT_CPU_MATMUL="1")
    out = subprocess.run(
        [sys.executable, "-W", "error", "-W", "ignore:cpu fallback", "-c", code],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("2 ")
    assert out.stdout.strip() == (
        "2 ('CPU', 'lamina_example_backend.CountingBackend.count_matmul -> "
        "lamina.backends.numba_cpu.linalg.matmul', 'example -> numba_cpu', '10 -> 0')"
    )


def test_a_plugin_overrides_a_device_kernel_and_unregistering_restores_it():
    c = counting([1.0, 2.0])
    before = rows("add")["counting"]
    name = fresh_name()
    lm.backends.register(
        make_plugin(lambda r: r.register("add", "counting", lambda ks, a, b: a, priority=5)),
        name,
    )
    assert (c + c) is c
    assert rows("add")["counting"][1:] == (name, 5)
    lm.backends.unregister(name)
    assert rows("add")["counting"] == before
    assert (c + c).tolist() == [2.0, 4.0]


def test_a_wrapper_wraps_what_is_below_it_and_is_skipped_with_nothing_below():
    seen = []

    def wrapper(next_kernel):
        def traced(ks, *args):
            seen.append(ks)
            return next_kernel(ks, *args)

        return traced

    def hook(registry):
        registry.register_wrapper("exp", "counting", wrapper)  # wraps the fallback
        registry.register_wrapper("logical_and", "autograd", wrapper)  # nothing below

    name = fresh_name()
    with pytest.warns(
        lm.backends.PluginWarning, match="logical_and on Autograd has nothing to wrap"
    ):
        lm.backends.register(make_plugin(hook), name)
    assert lm.exp(counting([0.0])).tolist() == [1.0]
    assert seen == [keys.device_key("counting")] and example.plugin.calls["exp"] == 1
    kernel, plugin, priority = rows("exp")["counting"]
    assert kernel.endswith(
        "<locals>.wrapper -> [fallback] lamina_example_backend.CountingBackend.fallback"
    )
    assert (plugin, priority) == (f"{name} -> example", "0 -> 0")
    assert rows("logical_and")["Autograd"] == ("[fallthrough]", "", "")
    assert not lm.dispatch.get("logical_and").mask & keys.AUTOGRAD


# ---------------------------------------------------------------- inspection


def test_backends_list_records_and_prints_as_an_aligned_table(second):
    records = lm.backends.list()
    assert isinstance(records, list)
    by_name = {r["name"]: r for r in records}
    assert by_name["example2"] == {
        "name": "example2",
        "source": "runtime",
        "devices": ["counting2"],
        "new_devices": ["counting2"],
        "priority": [0],
        "kernels": 4,
    }
    assert by_name["numba_cpu"]["source"] == "built-in"
    assert by_name["numpy_ref"]["priority"] == [-10]
    text = str(records)
    assert text == repr(records)
    lines = text.splitlines()
    head, dashes, body = lines[1], lines[2], lines[3:]
    columns = ["name", "source", "devices", "new_devices", "priority", "kernels"]
    assert head.split() == columns and len(body) == len(records)
    starts = [i for i, ch in enumerate(dashes) if ch == "-" and (i == 0 or dashes[i - 1] == " ")]
    assert [head.index(c) for c in columns] == starts
    line = next(ln for ln in body if ln.startswith("example2 "))
    assert line[starts[1] :].startswith("runtime") and line[starts[2] :].startswith("counting2")
    assert line[starts[4] :].startswith("0") and line[starts[5] :] == "4"


def test_dump_table_shows_the_new_device_keys_and_their_plugins(second):
    dump = lm.dispatch.dump_table("add")
    names = [r[0] for r in dump]  # other installed plugins' devices may sit between
    assert names[0] == "CPU" and names[-3:] == ["Sparse", "Autograd", "Trace"]
    assert names.index("counting") < names.index("counting2")
    r = rows("add")
    assert r["counting"] == ("lamina_example_backend.CountingBackend.add", "example", 0)
    assert r["counting2"] == ("lamina_example_backend.CountingBackend.add", "example2", 0)
    assert rows("sum")["counting2"] == (
        "[fallback] lamina_example_backend.CountingBackend.fallback",
        "example2",
        0,
    )
    assert "counting2  lamina_example_backend.CountingBackend.add" in str(dump)


# ---------------------------------------------------------------- two devices


def test_two_third_party_devices_at_once_with_moves_between_them(second):
    c = lm.arange(4.0, device="counting")
    d = c.to("counting2")
    assert d.device == "counting2" and d.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert keys.device_key("counting") != keys.device_key("counting2")
    d += 1
    assert c.tolist() == [0.0, 1.0, 2.0, 3.0], "a move must not share storage"
    e = (d * 2).to("counting")
    assert e.device == "counting" and e.tolist() == [2.0, 4.0, 6.0, 8.0]
    assert lm.sum(d).to("cpu").item() == 10.0
    assert second.calls["multiply"] == 1 and example.plugin.calls["multiply"] == 0
    # d += 1 runs as its decomposition on the device: add (its kernel), then setitem
    assert "add_" not in second.fallback_calls and second.fallback_calls["setitem"] == 1
    assert second.calls["sum"] == 1
    assert example.plugin.calls["arange"] == 1 and "arange" not in second.calls


# ---------------------------------------------------------------- fault isolation


def test_unregistering_the_device_plugin_removes_the_device_and_restores():
    before = snapshot()
    old_key = keys.device_key("counting")
    t = lm.ones(2, device="counting")
    lm.backends.unregister("example")
    assert "counting" not in keys.devices()
    assert all("counting" not in [r[0] for r in lm.dispatch.dump_table(n)] for n in ("add", "exp"))
    with pytest.raises(ValueError, match="unknown device 'counting'"):
        lm.ones(2, device="counting")
    with pytest.raises(NotImplementedError, match="no registered plugin provides"):
        t + t
    lm.backends.register(example.plugin, "example", "entry point")
    assert keys.device_key("counting") == old_key  # Note [Device keys]
    assert snapshot() == before
    assert (t + t).tolist() == [2.0, 2.0]


def _entry_point(name, load):
    return types.SimpleNamespace(
        name=name, value=f"fake_pkg:{name}", group="lamina.backends", load=load
    )


def test_a_plugin_that_fails_to_import_warns_and_the_rest_keeps_working(monkeypatch):
    def fails():
        raise ModuleNotFoundError("No module named 'vendor_gpu_runtime'")

    good = CountingBackend("counting2")
    eps = [_entry_point("vendor_gpu", fails), _entry_point("example2", lambda: good)]
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group=None: [e for e in eps if e.group == group]
    )
    with pytest.warns(
        RuntimeWarning,
        match="plugin 'vendor_gpu' \\(fake_pkg:vendor_gpu\\) "
        "failed to import and was skipped: "
        "ModuleNotFoundError: No module named "
        "'vendor_gpu_runtime'",
    ):
        lm.backends.load_entry_points()
    assert record("example2")["source"] == "entry point"
    assert (lm.ones(2, device="counting2") + 1).tolist() == [2.0, 2.0]
    assert (lm.ones(2, device="counting") + 1).tolist() == [2.0, 2.0]


@pytest.mark.parametrize(
    "failure",
    [
        "raises",
        "unknown_operator",
        "taken_device",
        "bad_device_name",
        "bad_converter",
        "layer_fallback",
    ],
)
def test_a_plugin_whose_hook_fails_warns_and_leaves_nothing_behind(failure):
    before = snapshot()
    plugin = CountingBackend("broken_dev")

    def hook(registry):
        registry.add_device("broken_dev", to_cpu=plugin.to_cpu, from_cpu=plugin.from_cpu)
        registry.register("add", "cpu", lambda ks, a, b: "hijacked", priority=100)
        registry.register_fallback("broken_dev", plugin.fallback)
        if failure == "raises":
            raise RuntimeError("driver not found")
        if failure == "unknown_operator":
            registry.register("matmull", "broken_dev", plugin.add)
        if failure == "taken_device":
            registry.add_device("counting", to_cpu=plugin.to_cpu, from_cpu=plugin.from_cpu)
        if failure == "bad_device_name":
            registry.add_device("my gpu", to_cpu=plugin.to_cpu, from_cpu=plugin.from_cpu)
        if failure == "bad_converter":
            registry.add_device("other_dev", to_cpu=None, from_cpu=plugin.from_cpu)
        if failure == "layer_fallback":
            registry.register_fallback("autograd", plugin.fallback)

    expected = {
        "raises": "RuntimeError: driver not found",
        "unknown_operator": "ValueError: unknown operator 'matmull' \\(did you mean 'matmul'",
        "taken_device": "device 'counting' is already provided by plugin 'example'",
        "bad_device_name": "a device name must be",
        "bad_converter": "TypeError: to_cpu of device 'other_dev' must be callable",
        "layer_fallback": "fallbacks are for devices, not the 'autograd' layer",
    }[failure]
    name = fresh_name("broken")
    with pytest.warns(
        RuntimeWarning,
        match=f"plugin '{name}' failed while registering its kernels and was skipped: .*{expected}",
    ):
        assert lm.backends.register(make_plugin(hook), name) is False
    assert snapshot() == before
    assert "broken_dev" not in keys.devices() and registry.kernels_of(name) == []
    assert not lm.backends.plugin_manager.has_plugin(name)
    assert (lm.ones(2) + lm.ones(2)).tolist() == [2.0, 2.0]
    assert (lm.ones(2, device="counting") + 1).tolist() == [2.0, 2.0]


def test_a_wrapper_that_fails_at_table_build_time_warns_and_is_dropped():
    before = snapshot()

    def bad_wrapper(next_kernel):
        raise RuntimeError("cannot wrap")

    name = fresh_name("bad_wrapper")
    with pytest.warns(
        RuntimeWarning,
        match=f"plugin '{name}' failed while building its "
        "kernel wrappers and was skipped: RuntimeError: "
        "cannot wrap",
    ):
        assert (
            lm.backends.register(
                make_plugin(lambda r: r.register_wrapper("matmul", "cpu", bad_wrapper, 50)), name
            )
            is False
        )
    assert snapshot() == before and not entries.broken
    assert not lm.backends.plugin_manager.has_plugin(name)


def test_unknown_operator_or_bad_kernel_raises_and_does_not_corrupt_tables():
    before = snapshot()
    kernels_before = {k: list(v) for k, v in registry.kernels.items()}
    reg = lm.backends.Registry("bad_test")
    with pytest.raises(ValueError, match="unknown operator 'mtamul'.*did you mean 'matmul'"):
        reg.register("mtamul", "counting", lambda ks, a, b: None)
    with pytest.raises(
        ValueError,
        match="unknown operator 'no_such_op'; operators are listed in lamina.dispatch.OPERATORS",
    ):
        reg.register("no_such_op", "cpu", lambda ks: None)
    with pytest.raises(TypeError, match="the kernel for 'add' must be callable"):
        reg.register("add", "cpu", "not a function")
    with pytest.raises(TypeError, match="priority must be an int"):
        reg.register("add", "cpu", lambda ks, a, b: None, priority="high")
    with pytest.raises(ValueError, match="unknown device or layer 'gpu'"):
        reg.register_fallback("gpu", lambda op, ks, *a: None)
    assert registry.kernels_of("bad_test") == []
    assert {k: list(v) for k, v in registry.kernels.items()} == kernels_before
    entries.rebuild()
    assert snapshot() == before


def test_same_slot_same_priority_resolves_by_name_with_a_warning():
    def kernel(tag):
        def fake_add(ks, a, b):
            out = a.to("cpu").to("counting")
            out.tag = tag
            return out

        return fake_add

    c = counting([1.0])
    winners = set()
    for order in (("tie_b", "tie_a"), ("tie_a", "tie_b")):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for name in order:
                lm.backends.register(
                    make_plugin(
                        lambda r, name=name: r.register("add", "counting", kernel(name), 7)
                    ),
                    name,
                )
        runtime = [w for w in record if issubclass(w.category, RuntimeWarning)]
        assert len(runtime) == 1, [str(w.message) for w in runtime]
        message = str(runtime[0].message)
        assert message.startswith(
            "lamina backend plugins 'tie_a' and 'tie_b' both register kernels for add on "
            "counting at priority 7: 'tie_a''s"
        ), message
        assert "serving now: add on counting: 'tie_a' (" in message
        assert runtime[0].category is lm.backends.PluginWarning
        assert runtime[0].filename == __file__
        winners.add((c + c).tag)
        assert rows("add")["counting"][1:] == ("tie_a", 7)
        for name in order:
            lm.backends.unregister(name)
    assert winners == {"tie_a"}, "the winner must not depend on registration order"
    assert rows("add")["counting"][1] == "example"


def test_autograd_works_through_the_new_device_without_plugin_support():
    """The layer sits above every device key: formulas call operators, which dispatch
    to the device's kernels or its fallback (issue: autograd through a new device)."""
    x = lm.asarray([1.0, 2.0, 3.0], device="counting", requires_grad=True)
    w = lm.asarray([0.5, -1.0, 2.0], device="counting", requires_grad=True)
    y = lm.sum(lm.exp(x) * w + x * x)
    assert y.device == "counting" and y.requires_grad
    y.backward()
    assert x.grad.device == "counting" and w.grad.device == "counting"
    xv, wv = np.array([1.0, 2.0, 3.0]), np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(x.grad.to("cpu").numpy(), np.exp(xv) * wv + 2 * xv)
    np.testing.assert_allclose(w.grad.to("cpu").numpy(), np.exp(xv))


@pytest.mark.parametrize("checks", ["on", "off"])
def test_a_functools_wraps_wrapper_sees_scalar_calls(checks):
    """functools.wraps copies the wrapped kernel's ``with_scalar`` and ``unchecked``
    attributes; the dispatcher must not take them from a wrapper (Note [Kernel
    variants]), or a Python-scalar call, or any call with checks off, would skip it."""
    seen = []

    def wrapper(next_kernel):
        @functools.wraps(next_kernel)
        def traced(ks, *args):
            seen.append(args)
            return next_kernel(ks, *args)

        return traced

    name = fresh_name()
    lm.backends.register(
        make_plugin(lambda r: r.register_wrapper("multiply", "cpu", wrapper, 10)), name
    )
    x = lm.asarray([1.0, 2.0])
    with lm.layers.off(*(["checks"] if checks == "off" else [])):
        assert (x * x).tolist() == [1.0, 4.0]
        assert (x * 2.0).tolist() == [2.0, 4.0]
        assert (3 * x).tolist() == [3.0, 6.0]
    assert len(seen) == 3


@pytest.mark.parametrize(
    "layers", [("checks",), ("checks", "dispatcher"), ("dispatcher", "checks")]
)
def test_python_scalars_reach_every_kernel_with_checks_off(layers):
    """With the checks layer off the CPU slot is the unchecked kernel; callers that
    reach it without the scalar table (the direct bindings, the sparse layer, a
    device's CPU fallback) must still handle a Python scalar."""
    x = lm.asarray([1.0, 2.0])
    with contextlib.ExitStack() as stack:
        for layer in layers:
            stack.enter_context(lm.layers.off(layer))
        assert (x * 2.0).tolist() == [2.0, 4.0]
        if "dispatcher" not in layers:
            s = lm.asarray([[0.0, 1.0], [2.0, 0.0]]).to_sparse()
            assert (s * 2.0).to_dense().tolist() == [[0.0, 2.0], [4.0, 0.0]]
            assert (counting([1.0, 2.0]) * 2.0).tolist() == [2.0, 4.0]


# ---------------------------------------------------------------- core operators


def test_a_device_gets_decompositions_before_its_fallback_and_fallbacks_announce_themselves():
    """Note [Core operators]: an operator outside the core set without a kernel on the
    device runs as its decomposition there (below every kernel of the device's plugin,
    above its fallback); a core operator without one reaches cpu_fallback, which warns
    once per operator and device, or raises, or stays silent (set_cpu_fallback)."""
    assert rows("subtract")["counting"] == (
        "lamina.dispatch.decompositions.subtract",
        "decompositions",
        -(2**31),
    )
    c = counting([1.0, 2.0])
    fallback = lm.backends.fallback
    before = lm.backends.set_cpu_fallback("warn")
    try:
        fallback._warned.discard(("exp", "counting"))
        with pytest.warns(lm.backends.FallbackWarning, match="cpu fallback: exp .* .counting."):
            lm.exp(c)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            lm.exp(c)  # once per operator and device
        assert (c - 1.0).tolist() == [0.0, 1.0]  # a decomposition, on the device
        assert example.plugin.fallback_calls["subtract"] == 0
        lm.backends.set_cpu_fallback("error")
        with pytest.raises(NotImplementedError, match="exp has no kernel on device .counting."):
            lm.exp(c)
        with pytest.raises(ValueError, match="mode must be one of"):
            lm.backends.set_cpu_fallback("never")
    finally:
        lm.backends.set_cpu_fallback(before)
