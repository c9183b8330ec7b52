"""The dispatcher and the plugin manager: keys, precomputed tables, dump_table,
priorities, lm.backends.use/register/unregister/list, errors and broken plugins.

See Note [Dispatch table], Note [Key priority], Note [Fallthrough] in dispatch/.
"""

import importlib.metadata
import itertools
import types
import warnings

import numpy as np
import pytest

import lamina as lm
from lamina.dispatch import entries, keys, registry
from lamina.dispatch.tensor import from_array

CPU, SPARSE, AUTOGRAD = keys.CPU, keys.SPARSE, keys.AUTOGRAD
BUILTINS = ("numba_cpu", "numpy_ref")
_names = itertools.count()


# ---------------------------------------------------------------- helpers


def _slot(fn):
    # error kernels for missing keys are fresh closures after every rebuild
    missing = getattr(fn, "__qualname__", "") == "missing_kernel.<locals>.no_kernel"
    return "missing" if missing else fn


def snapshot():
    """Everything a rebuild may change, to show that something did not change."""
    return {
        name: ([_slot(f) for f in op.table], op.mask, {k: w.fn for k, w in op.winners.items()})
        for name, op in lm.dispatch.OPERATORS.items()
    }


def rows(name):
    """dump_table(name) as {key name: (kernel, plugin, priority)} (without the rule)."""
    return {r[0]: tuple(r[1:4]) for r in lm.dispatch.dump_table(name)}


def cpu_plugin(name):
    return rows(name)["CPU"][1]


def make_plugin(*registrations, raises=None):
    """A runtime plugin (a class with a hookimpl) registering (op, device, fn, priority)."""

    class Plugin:
        @lm.backends.hookimpl
        def lamina_register_kernels(self, registry):
            for op, device, fn, priority in registrations:
                registry.register(op, device, fn, priority=priority)
            if raises is not None:
                raise raises

    return Plugin()


@pytest.fixture
def plugins():
    """register(plugin) -> its unique name; everything is unregistered afterwards."""
    registered = []

    def register(plugin, prefix="test_plugin"):
        name = f"{prefix}_{next(_names)}"
        if lm.backends.register(plugin, name):
            registered.append(name)
        return name

    before = snapshot()
    yield register
    for name in registered:
        if lm.backends.plugin_manager.has_plugin(name):
            lm.backends.unregister(name)
    assert registry.preferred_plugin is None
    assert snapshot() == before, "the test left the dispatch tables changed"


@pytest.fixture
def x():
    return lm.asarray([1.0, 2.0, 3.0])


def marker_kernel(tag):
    """A kernel returning zeros of its first tensor argument's shape and dtype (the
    result dtype of every call it serves here: the fixture ``x``, whatever the default
    floating dtype, with itself or a Python int), marked with (tag, ks) -- see
    ``marked``."""

    def fake_add(ks, *args):
        x = next(a for a in args if isinstance(a, lm.Tensor))
        t = lm.backends.new_tensor(np.zeros(x.shape, x.dtype.np))
        t.marker = (tag, ks)
        return t

    return fake_add


def marked(t):
    return getattr(t, "marker", None)


# ---------------------------------------------------------------- keys and key sets


def test_keys_are_single_bits_in_priority_order():
    backend_keys = [keys.device_key(d) for d in keys.devices()]
    assert keys.devices()[0] == "cpu" and CPU == 1 << 0
    for k in [*backend_keys, SPARSE, AUTOGRAD]:
        assert k > 0 and k & (k - 1) == 0, f"key {k:#x} is not a single bit"
    assert len(set(backend_keys)) == len(backend_keys)
    assert all(k & keys.BACKEND_MASK == k for k in backend_keys)
    assert max(backend_keys) < SPARSE < AUTOGRAD
    assert SPARSE == 1 << keys.MAX_BACKENDS and AUTOGRAD == SPARSE << 1
    trace = keys.LAYER_KEYS["trace"]  # lamina.jit's tracer, the layer above autograd
    assert trace == AUTOGRAD << 1
    assert keys.all_keys() == [*backend_keys, SPARSE, AUTOGRAD, trace]
    assert [keys.key_name(k) for k in (CPU, SPARSE, AUTOGRAD)] == ["CPU", "Sparse", "Autograd"]
    assert keys.keyset_names(CPU | SPARSE | AUTOGRAD) == ["CPU", "Sparse", "Autograd"]
    with pytest.raises(ValueError, match="unknown device 'nodevice'.*cpu"):
        keys.device_key("nodevice")


def test_cpu_tensors_carry_the_cpu_key_set(x):
    assert x._ks == CPU
    assert type(x._ks) is int
    for t in (
        lm.add(x, x),
        x + 1,
        lm.sum(x),
        lm.reshape(x, (3, 1)),
        x[1:],
        x @ x,
        lm.zeros((2,)),
        lm.concat([x, x]),
    ):
        assert t._ks == CPU, t
    assert x.device == "cpu"


# ---------------------------------------------------------------- tables


def test_every_operator_has_a_table_of_the_right_length():
    length = max(keys.all_keys()).bit_length() + 1
    assert length == keys.LAYER_KEYS["trace"].bit_length() + 1  # the layer above autograd
    assert len(lm.dispatch.OPERATORS) > 100
    for name, op in lm.dispatch.OPERATORS.items():
        assert op.name == name
        assert len(op.table) == length, name
        assert all(callable(k) for k in op.table), name
        # every key set made of known keys indexes inside the table
        assert (op.mask | CPU | SPARSE | AUTOGRAD).bit_length() < len(op.table)
        assert op.mask & CPU, f"{name}: the CPU key is not in its mask"
        assert op.table[CPU.bit_length()] is op.winners[CPU].fn, name


# the conversions of the COO layout belong to the sparse plugin, for dense inputs too
SPARSE_LAYOUT = {"to_dense", "to_sparse", "coalesce", "sparse_mask"}


def test_every_operator_has_a_production_cpu_kernel_and_an_oracle_kernel():
    """numpy_ref is the oracle: it has a kernel for every operator (but the sparse
    layout's conversions) and serves none in production."""
    for name, op in lm.dispatch.OPERATORS.items():
        plugins = {e.plugin for e in registry.kernels.get((name, CPU), [])}
        if name in SPARSE_LAYOUT:
            assert plugins == {"sparse"}, name
            continue
        assert "numpy_ref" in plugins, f"{name} has no numpy_ref kernel"
        assert "numba_cpu" in plugins, f"{name} has no numba_cpu kernel"
        assert op.winners[CPU].plugin == "numba_cpu", name


def test_dump_table_works_for_every_operator_and_prints_aligned():
    for name, op in lm.dispatch.OPERATORS.items():
        dump = lm.dispatch.dump_table(name)
        assert [r[0] for r in dump] == [keys.key_name(k) for k in keys.all_keys()]
        text = str(dump)
        assert isinstance(text, str) and text == repr(dump)
        lines = text.splitlines()
        assert lines[0].startswith(f"dispatch table of {name}(")
        assert f"{op.mask:#x}" in lines[0]
        head, dashes, body = lines[1], lines[2], lines[3:]
        assert head.split() == ["key", "kernel", "plugin", "priority", "rule"]
        assert len(body) == len(dump)
        starts = [i for i, c in enumerate(dashes) if c == "-" and (i == 0 or dashes[i - 1] == " ")]
        assert len(starts) == 5
        assert [head.index(h) for h in ("key", "kernel", "plugin", "priority", "rule")] == starts
        for line, row in zip(body, dump):
            for start, cell in zip(starts, row):
                assert line[start:].startswith(str(cell)), (name, line, row)
        kernel, plugin, priority = rows(name)["CPU"]
        winner = op.winners[CPU]
        assert (kernel, plugin, priority) == (winner.name, winner.plugin, winner.priority)
        assert plugin in ("numba_cpu", "sparse") and kernel.startswith(f"lamina.backends.{plugin}.")
        assert f"{kernel}  " in text and plugin in text
        # the rule column is the reason the table computation stored (one place)
        for r, key in zip(dump, keys.all_keys()):
            entry = op.entries[key]
            assert r[4] == f"{entry.rule}: {entry.reason}"


def test_dump_table_unknown_operator():
    with pytest.raises(ValueError, match="unknown operator 'no_such_op'"):
        lm.dispatch.dump_table("no_such_op")


def test_numba_cpu_serves_every_cpu_slot_and_numpy_ref_only_when_selected():
    provider = {name: cpu_plugin(name) for name in lm.dispatch.OPERATORS}
    assert {n for n, p in provider.items() if p != "numba_cpu"} == SPARSE_LAYOUT
    assert {rows(n)["CPU"][2] for n in provider} == {0}
    with lm.backends.use("numpy_ref"):
        oracle = {name: cpu_plugin(name) for name in lm.dispatch.OPERATORS}
    assert {n for n, p in oracle.items() if p != "numpy_ref"} == SPARSE_LAYOUT


# ---------------------------------------------------------------- fallthrough


def test_autograd_falls_through_without_an_autograd_kernel():
    # Note [Fallthrough]: AUTOGRAD is in an operator's mask only if it has a kernel there
    for name, op in lm.dispatch.OPERATORS.items():
        has_kernel = AUTOGRAD in op.winners
        assert bool(op.mask & AUTOGRAD) == has_kernel, name
        assert op.mask & SPARSE, f"{name}: SPARSE must never fall through silently"
        if not has_kernel:
            assert rows(name)["Autograd"] == ("[fallthrough]", "", "")
        if not op.differentiable:
            assert not has_kernel, f"{name} is not differentiable but has an autograd kernel"


def test_autograd_kernel_enters_the_mask_and_redispatches(plugins):
    name = "logical_and"  # not differentiable: no built-in autograd kernel
    op = lm.dispatch.get(name)
    assert AUTOGRAD not in op.winners
    t = from_array(np.array([True, False, True]), CPU | AUTOGRAD)
    u = lm.asarray([True, True, False])
    # without a kernel the AUTOGRAD bit is masked off: straight to the CPU kernel
    assert lm.logical_and(t, u).tolist() == [True, False, False]
    seen = []

    def autograd_kernel(ks, a, b):
        seen.append(ks)
        below = ks & ~AUTOGRAD  # redispatch: mask own key off, index the same table
        return op.table[below.bit_length()](below, a, b)

    pname = plugins(make_plugin((name, "autograd", autograd_kernel, 0)))
    assert op.mask & AUTOGRAD
    assert rows(name)["Autograd"][1:] == (pname, 0)
    assert lm.logical_and(t, u).tolist() == [True, False, False]
    assert seen == [CPU | AUTOGRAD]
    assert lm.logical_and(u, u).tolist() == [True, True, False]
    assert len(seen) == 1, "a tensor without the AUTOGRAD key entered the autograd kernel"
    try:
        lm.layers.disable("autograd")  # switched off: a fallthrough for everyone
        assert not op.mask & AUTOGRAD
        assert rows(name)["Autograd"][0] == "[off: fallthrough]"
        assert lm.logical_and(t, u).tolist() == [True, False, False]
        assert len(seen) == 1
    finally:
        lm.layers.enable("autograd")
    assert op.mask & AUTOGRAD
    lm.backends.unregister(pname)
    assert not op.mask & AUTOGRAD
    assert rows(name)["Autograd"][0] == "[fallthrough]"


def test_set_layer_rejects_unknown_layers():
    before = snapshot()
    with pytest.raises(ValueError, match="unknown layer 'tracing'"):
        lm.layers.disable("tracing")
    assert snapshot() == before


# ---------------------------------------------------------------- priorities and plugins


def test_higher_priority_plugin_takes_over_add_and_plus_until_unregistered(plugins, x):
    op = lm.dispatch.get("add")
    numba_add = op.winners[CPU].fn
    assert cpu_plugin("add") == "numba_cpu"
    fake = marker_kernel("plugin")
    name = plugins(make_plugin(("add", "cpu", fake, 10)))
    assert marked(lm.add(x, x)) == ("plugin", CPU)
    assert marked(x + x) == ("plugin", CPU)
    assert marked(x + 1) == ("plugin", CPU)
    assert marked(1 + x) == ("plugin", CPU)
    assert marked(op(x, x)) == ("plugin", CPU)
    kernel, plugin, priority = rows("add")["CPU"]
    assert (plugin, priority) == (name, 10) and kernel.endswith("fake_add")
    assert name in str(lm.dispatch.dump_table("add"))
    # other operators and the in-place variant are untouched
    assert cpu_plugin("add_") == "numba_cpu" and cpu_plugin("subtract") == "numba_cpu"
    assert (x - x).tolist() == [0.0, 0.0, 0.0]
    lm.backends.unregister(name)
    assert op.winners[CPU].fn is numba_add and cpu_plugin("add") == "numba_cpu"
    assert (x + x).tolist() == [2.0, 4.0, 6.0]
    assert lm.add(x, 1).tolist() == [2.0, 3.0, 4.0]
    assert name not in [r["name"] for r in lm.backends.list()]


def test_module_plugin_and_decorator_form(plugins, x):
    module = types.ModuleType("my_faster_cpu")

    @lm.backends.hookimpl
    def lamina_register_kernels(registry):
        @registry.implements("multiply", "cpu", priority=5)
        def fast_multiply(ks, x1, x2):
            return marker_kernel("fast")(ks, x1, x2)

    module.lamina_register_kernels = lamina_register_kernels
    name = plugins(module, prefix="my_faster_cpu")
    assert marked(x * x)[0] == "fast"
    assert rows("multiply")["CPU"][1:] == (name, 5)
    row = next(r for r in lm.backends.list() if r["name"] == name)
    assert row == {
        "name": name,
        "source": "runtime",
        "devices": ["cpu"],
        "new_devices": [],
        "priority": [5],
        "kernels": 1,
    }


def test_lower_priority_plugin_does_not_take_over(plugins, x):
    before = snapshot()
    plugins(
        make_plugin(
            ("add", "cpu", marker_kernel("low"), -5),
            ("reshape", "cpu", marker_kernel("lower"), -20),
        )
    )
    assert cpu_plugin("add") == "numba_cpu" and cpu_plugin("reshape") == "numba_cpu"
    assert (x + x).tolist() == [2.0, 4.0, 6.0]
    assert lm.reshape(x, (1, 3)).shape == (1, 3)
    assert snapshot() == before


def test_between_the_builtins_a_plugin_beats_only_numpy_ref(plugins, x):
    name = plugins(
        make_plugin(
            ("add", "cpu", marker_kernel("mid"), -5), ("reshape", "cpu", marker_kernel("mid"), -5)
        )
    )
    assert cpu_plugin("add") == "numba_cpu" and cpu_plugin("reshape") == "numba_cpu"
    for op in ("add", "reshape"):
        ranked = [e.plugin for e in sorted(registry.kernels[op, CPU], key=registry.rank)]
        assert ranked == ["numba_cpu", name, "numpy_ref"]
    with lm.backends.use(name):
        assert marked(lm.reshape(x, (3,))) == ("mid", CPU)


def test_a_call_never_rebuilds_tables(monkeypatch, plugins, x):
    calls = []
    real_rebuild = entries.rebuild
    monkeypatch.setattr(entries, "rebuild", lambda: (calls.append(1), real_rebuild())[1])
    op = lm.dispatch.get("add")
    the_table, contents = op.table, list(op.table)
    for _ in range(3):
        x + x, lm.add(x, 2.0), op(x, x), lm.sum(x), x[0], lm.matmul(x, x)
        with pytest.raises(NotImplementedError):  # equal has no sparse kernel
            lm.dispatch.get("equal")(types.SimpleNamespace(_ks=CPU | SPARSE), x)
    str(lm.dispatch.dump_table("add")), lm.backends.list()
    assert calls == [], "a call or an inspection rebuilt the tables"
    assert op.table is the_table and op.table == contents  # not even rebuilt in place

    name = plugins(make_plugin(("add", "cpu", marker_kernel("new"), 10)))
    assert len(calls) == 1, "registering a plugin must rebuild the tables exactly once"
    assert op.table is the_table, "the table must be updated in place (bindings hold it)"
    assert op.table != contents
    # Note [Result checks]: a plugin's CPU kernel has its first result checked, then
    # the bare kernel takes the slot's place
    assert op.table[CPU.bit_length()].__qualname__ == "first_call_checked[add, CPU]"
    assert marked(x + x) == ("new", CPU)
    assert op.table[CPU.bit_length()] is op.winners[CPU].fn
    assert len(calls) == 1
    lm.backends.unregister(name)
    assert len(calls) == 2 and op.table is the_table
    assert [_slot(f) for f in op.table] == [_slot(f) for f in contents]


def test_recording_a_kernel_changes_nothing_until_rebuild(x):
    op = lm.dispatch.get("add")
    before = snapshot()
    try:
        registry.register_kernel("add", CPU, marker_kernel("direct"), "direct_test", 100)
        assert snapshot() == before
        assert (x + x).tolist() == [2.0, 4.0, 6.0]
        entries.rebuild()
        assert op.winners[CPU].plugin == "direct_test"
        assert marked(x + x) == ("direct", CPU)
    finally:
        registry.unregister_plugin("direct_test")
        entries.rebuild()
    assert snapshot() == before


def test_use_switches_kernels_for_a_block_and_restores(plugins, x):
    op = lm.dispatch.get("add")
    the_table, before = op.table, snapshot()
    with lm.backends.use("numpy_ref"):
        assert cpu_plugin("add") == "numpy_ref" and cpu_plugin("sum") == "numpy_ref"
        assert op.table[CPU.bit_length()] is op.winners[CPU].fn
        assert op.winners[CPU].fn.__module__ == "lamina.backends.numpy_ref"
        assert (x + x).tolist() == [2.0, 4.0, 6.0]
        assert lm.sum(x).item() == 6.0
    assert snapshot() == before and op.table is the_table
    assert cpu_plugin("add") == "numba_cpu"

    with pytest.raises(ZeroDivisionError):
        with lm.backends.use("numpy_ref"):
            assert cpu_plugin("add") == "numpy_ref"
            _ = 1 / 0
    assert snapshot() == before and registry.preferred_plugin is None

    # the preferred plugin beats priority; nested blocks restore the outer choice
    name = plugins(make_plugin(("add", "cpu", marker_kernel("prio"), 10)))
    assert cpu_plugin("add") == name
    with lm.backends.use("numpy_ref"):
        assert cpu_plugin("add") == "numpy_ref"
        with lm.backends.use(name):
            assert marked(x + x) == ("prio", CPU)
            assert cpu_plugin("sum") == "numba_cpu"  # name has no sum kernel
        assert cpu_plugin("add") == "numpy_ref" and cpu_plugin("sum") == "numpy_ref"
    assert cpu_plugin("add") == name


def test_use_installs_kept_tables_again_unless_something_changed(x, monkeypatch):
    """Note [Preference snapshots]: a preference seen since the tables were computed
    gets its tables back (the identical slots, no entry computed); a kernel registered
    or a layer switched meanwhile has them computed anew."""
    op, cpu = lm.dispatch.get("add"), CPU.bit_length()
    with lm.backends.use("numpy_ref"):
        reference = op.table[cpu]
    before, numba_slot = snapshot(), op.table[cpu]
    computed = []
    real = entries.compute_entry
    monkeypatch.setattr(entries, "compute_entry", lambda *a: computed.append(a) or real(*a))
    with lm.backends.use("numpy_ref"):
        assert op.table[cpu] is reference and cpu_plugin("add") == "numpy_ref"
        assert (x + x).tolist() == [2.0, 4.0, 6.0]
    assert not computed and op.table[cpu] is numba_slot and snapshot() == before
    try:
        with lm.backends.use("numpy_ref"):
            registry.register_kernel("add", CPU, marker_kernel("direct"), "direct_test", 100)
        assert computed and marked(x + x) == ("direct", CPU)  # preferred nowhere: priority
    finally:
        registry.unregister_plugin("direct_test")
        entries.rebuild()
    with lm.backends.use("numpy_ref"):
        with lm.layers.off("autograd"):
            assert not lm.dispatch.get("add").mask & AUTOGRAD
        computed.clear()
    assert computed and snapshot() == before


def test_use_unknown_plugin_raises_and_changes_nothing():
    before = snapshot()
    with pytest.raises(ValueError, match="no backend plugin named 'nope'.*numba_cpu"):
        with lm.backends.use("nope"):
            pass  # pragma: no cover
    assert snapshot() == before and registry.preferred_plugin is None


def test_unregistering_numba_cpu_falls_back_to_numpy_ref(x):
    from lamina.backends import numba_cpu

    served = [n for n in lm.dispatch.OPERATORS if cpu_plugin(n) == "numba_cpu"]
    assert served
    try:
        lm.backends.unregister("numba_cpu")
        assert all(
            cpu_plugin(n) == "numpy_ref" for n in lm.dispatch.OPERATORS if n not in SPARSE_LAYOUT
        )
        assert (x + x).tolist() == [2.0, 4.0, 6.0]
        assert (x @ x).item() == 14.0
    finally:
        if not lm.backends.plugin_manager.has_plugin("numba_cpu"):
            lm.backends.register(numba_cpu, "numba_cpu", "built-in")
    assert [n for n in lm.dispatch.OPERATORS if cpu_plugin(n) == "numba_cpu"] == served


def test_register_twice_and_unregister_unknown(plugins):
    plugin = make_plugin()
    with pytest.warns(lm.backends.PluginWarning, match="registered nothing"):
        name = plugins(plugin)
    with pytest.raises(ValueError, match="already registered"):
        lm.backends.register(make_plugin(), name)
    with pytest.raises(ValueError, match="no backend plugin named 'nope'"):
        lm.backends.unregister("nope")
    assert name in [r["name"] for r in lm.backends.list()]


def test_backends_list_has_the_builtins():
    rows_ = lm.backends.list()
    assert isinstance(rows_, list)
    by_name = {r["name"]: r for r in rows_}
    for name in BUILTINS:
        row = by_name[name]
        assert row["source"] == "built-in" and row["devices"] == ["cpu"]
        assert row["kernels"] == len(registry.kernels_of(name)) > 0
    # numpy_ref has a kernel for every operator but the sparse layout's conversions
    assert by_name["numpy_ref"]["kernels"] == len(lm.dispatch.OPERATORS) - len(SPARSE_LAYOUT)


# ---------------------------------------------------------------- errors


def test_missing_kernel_names_operator_key_and_keys_with_kernels(x):
    name = (
        "add"
        if SPARSE not in lm.dispatch.get("add").winners
        else next(n for n, op in lm.dispatch.OPERATORS.items() if SPARSE not in op.winners)
    )
    op = lm.dispatch.get(name)
    fake = types.SimpleNamespace(_ks=SPARSE | CPU)
    with pytest.raises(NotImplementedError) as info:
        lm.dispatch.get(name)(fake, fake)
    msg = str(info.value)
    have = ", ".join(keys.key_name(k) for k in keys.all_keys() if k in op.winners)
    assert f"operator {name!r} has no kernel for key Sparse" in msg
    assert "the call's keys: CPU, Sparse" in msg
    assert msg.endswith(f"keys with kernels: {have}") and "CPU" in have
    # the fast binding path raises the same error
    if name == "add":
        with pytest.raises(NotImplementedError, match="'add' has no kernel for key Sparse"):
            lm.add(fake, x)
    assert rows(name)["Sparse"] == ("[missing: NotImplementedError]", "", "")
    # no tensor at all: key set 0
    with pytest.raises(NotImplementedError, match=f"{name!r} has no kernel for no key"):
        op(1, 2)
    # an unused backend bit
    free = 1 << (keys.MAX_BACKENDS - 1)
    assert free not in keys.all_keys()
    with pytest.raises(NotImplementedError, match=f"no kernel for key key{keys.MAX_BACKENDS - 1}"):
        op(types.SimpleNamespace(_ks=free))
    assert (x + x).tolist() == [2.0, 4.0, 6.0]


def test_unknown_operator_or_device_raises_and_does_not_corrupt_tables(x):
    before, kernels_before = snapshot(), {k: list(v) for k, v in registry.kernels.items()}
    with pytest.raises(ValueError, match="unknown operator 'no_such_op'"):
        registry.register_kernel("no_such_op", CPU, marker_kernel("x"), "bad_test")
    reg = lm.backends.Registry("bad_test")
    with pytest.raises(ValueError, match="unknown operator 'no_such_op'"):
        reg.register("no_such_op", "cpu", marker_kernel("x"))
    with pytest.raises(ValueError, match="unknown device or layer 'tpu'.*cpu.*autograd"):
        reg.register("add", "tpu", marker_kernel("x"))
    with pytest.raises(ValueError, match="unknown operator"):
        lm.dispatch.get("no_such_op")
    assert "no_such_op" not in lm.dispatch.OPERATORS
    assert registry.kernels_of("bad_test") == []
    assert {k: list(v) for k, v in registry.kernels.items()} == kernels_before
    entries.rebuild()
    assert snapshot() == before
    assert (x + x).tolist() == [2.0, 4.0, 6.0]


@pytest.mark.parametrize("error", [RuntimeError("boom"), None])
def test_broken_plugin_warns_with_its_name_and_everything_keeps_working(plugins, x, error):
    before = snapshot()
    # either its hook raises, or it registers a kernel for an unknown operator; both
    # after it has registered a kernel that would take over add
    bad = [] if error else [("no_such_op", "cpu", marker_kernel("broken"), 0)]
    plugin = make_plugin(("add", "cpu", marker_kernel("broken"), 100), *bad, raises=error)
    name = f"broken_plugin_{next(_names)}"
    with pytest.warns(RuntimeWarning, match=f"plugin '{name}' failed") as record:
        assert lm.backends.register(plugin, name) is False
    assert len(record) == 1
    msg = str(record[0].message)
    assert ("RuntimeError: boom" in msg) if error else ("unknown operator 'no_such_op'" in msg)
    assert record[0].filename == __file__, "the warning should point at the register call"
    # the kernel it registered before failing is gone, and so is the plugin
    assert snapshot() == before
    assert registry.kernels_of(name) == []
    assert not lm.backends.plugin_manager.has_plugin(name)
    assert name not in [r["name"] for r in lm.backends.list()]
    assert (x + x).tolist() == [2.0, 4.0, 6.0]
    # the name is free again, and other plugins still register
    good = make_plugin(("add", "cpu", marker_kernel("good"), 10))
    assert lm.backends.register(good, name) is True
    try:
        assert marked(x + x) == ("good", CPU)
    finally:
        lm.backends.unregister(name)
    assert snapshot() == before


class _EntryPoint:
    group = "lamina.backends"

    def __init__(self, name, load):
        self.name, self.value, self._load = name, f"fake_pkg:{name}", load

    def load(self):
        return self._load()


def test_broken_entry_points_warn_and_do_not_break_loading(monkeypatch, x):
    def bad_signature():
        module = types.ModuleType("bad_signature")

        @lm.backends.hookimpl
        def lamina_register_kernels(registry, extra):  # not in the hookspec
            pass  # pragma: no cover

        module.lamina_register_kernels = lamina_register_kernels
        return module

    def fails_to_import():
        raise ImportError("no module named fake_pkg")

    def good():
        module = types.ModuleType("good_ep")

        @lm.backends.hookimpl
        def lamina_register_kernels(registry):
            registry.register("add", "cpu", marker_kernel("entry point"), priority=10)

        module.lamina_register_kernels = lamina_register_kernels
        return module

    eps = [
        _EntryPoint("ep_bad_signature", bad_signature),
        _EntryPoint("ep_import_error", fails_to_import),
        _EntryPoint("numba_cpu", lambda: types.ModuleType("impostor")),  # name taken
        _EntryPoint("ep_good", good),
    ]
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda group=None: [ep for ep in eps if group == ep.group],
    )
    before = snapshot()
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            lm.backends.load_entry_points()
        messages = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
        for bad in ("ep_bad_signature", "ep_import_error", "numba_cpu"):
            assert any(f"plugin {bad!r}" in m for m in messages), (bad, messages)
        assert len(messages) == 3, messages
        by_name = {r["name"]: r for r in lm.backends.list()}
        assert by_name["ep_good"]["source"] == "entry point"
        assert by_name["numba_cpu"]["source"] == "built-in"
        assert "ep_bad_signature" not in by_name and "ep_import_error" not in by_name
        assert not lm.backends.plugin_manager.has_plugin("ep_bad_signature")
        assert marked(x + x) == ("entry point", CPU)
    finally:
        if lm.backends.plugin_manager.has_plugin("ep_good"):
            lm.backends.unregister("ep_good")
    assert snapshot() == before
    assert (x + x).tolist() == [2.0, 4.0, 6.0]
