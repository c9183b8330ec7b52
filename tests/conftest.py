"""Every test must leave lamina's process-wide state as it found it: the layer
switches, the preferred backend, the registered plugins and devices, the dispatch
tables, grad mode and the thread count. The autouse fixture below fails a test that
changes any of them, naming what changed (Note [Upper layers] aside, this is all the
global mutable state a user can change)."""

import pytest

import lamina as lm
from lamina.backends import _manager
from lamina.dispatch import entries, keys, registry
from lamina.dispatch.schema import OPERATORS


def _entries(op):
    """What serves each key, by plugin and kernel name (a plugin registered again
    makes new function objects for the same table)."""
    return {
        key: (e.rule, e.in_mask, e.reason, tuple((k.plugin, k.name) for k in e.chain))
        for key, e in op.entries.items()
    }


_tables = (None, None)  # (generation, the tables' state at it)


def _tables_state():
    """Every operator's entries, mask and table length: computed again only after the
    tables changed (Note [Generation]: every change counts), ~5 ms each time."""
    global _tables
    if _tables[0] != entries.generation:
        tables = {name: (_entries(op), op.mask, len(op.table)) for name, op in OPERATORS.items()}
        _tables = (entries.generation, tables)
    return _tables[1]


def state():
    return {
        "layers": lm.layers.state(),
        "preferred plugin": registry.preferred_plugin,
        "plugins": sorted(_manager._sources),
        "devices": keys.devices(),
        "grad mode": lm.autograd.is_grad_enabled(),
        "threads": lm.get_num_threads(),
        "tables": _tables_state(),
    }


@pytest.fixture(autouse=True)
def _leaves_global_state_unchanged():
    before = state()
    yield
    after = state()
    changed = [what for what in before if before[what] != after[what]]
    assert not changed, f"the test left lamina's global state changed: {changed}"


@pytest.fixture(autouse=True)
def _winograd_at_any_tile_count(monkeypatch):
    """Winograd's kernels run on the small images tests can check: the tile count below
    which production leaves a convolution to im2col is a speed rule, tested on its own
    (test_nn.py restores it)."""
    from lamina.backends.numba_cpu.nn import winograd

    monkeypatch.setattr(winograd, "MIN_TILES", 1)


@pytest.fixture(autouse=True)
def _direct_on_few_channels_only(monkeypatch):
    """Channels-last convolutions of 5 to 16 input channels keep to the paths tests of
    Winograd, space-to-depth and im2col check them on: running them direct is a speed
    rule, tested on its own (test_nn.py restores it)."""
    from lamina.backends.numba_cpu.nn import direct

    few = dict.fromkeys(direct.DIRECT_CHANNELS_LAST, direct.DIRECT_CHANNELS)
    monkeypatch.setattr(direct, "DIRECT_CHANNELS_LAST", few)
