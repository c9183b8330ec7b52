"""Modes (Note [Modes]): keys a thread adds to or removes from every call's key set,
calls without tensor arguments included; and the table generation number (Note
[Generation])."""

import threading

import pytest

import lamina as lm
from lamina.dispatch import entries, keys, modes
from lamina.dispatch import registry as R


@pytest.fixture
def probe():
    """A layer key with a kernel for a few operators that records each call and passes
    it on below itself."""
    key = keys.register_layer_key("probe")
    seen = []

    def recording(name):
        op = lm.dispatch.get(name)

        def kernel(ks, *args):
            seen.append(name)
            below = ks & ~key
            return op.table[below.bit_length()](below, *args)

        return kernel

    names = ("full", "rand", "add", "exp", "sum", "matmul")
    for name in names:
        R.register_kernel(name, key, recording(name), "probe")
    entries.rebuild()
    yield key, seen
    R.unregister_plugin("probe")
    keys.unregister_layer_key("probe")
    entries.rebuild()


def test_a_mode_key_sees_every_call_creation_and_random_included(probe):
    key, seen = probe
    x = lm.ones((2, 2))
    lm.exp(x)
    assert seen == []  # no mode: the key is in no call's key set
    gen = lm.Generator().manual_seed(1)
    with modes.include(key):
        y = lm.zeros((2, 2)) + lm.rand((2, 2), generator=gen)  # no tensor argument
        z = lm.sum(lm.exp(x) @ y)
        x + 1.0  # a Python scalar operand
        lm.negative(x)  # no kernel at the mode's key: falls through
    assert seen == ["full", "rand", "add", "exp", "matmul", "sum", "add"]
    assert modes.current() == (0, 0)
    ref = lm.sum(lm.exp(x) @ (lm.zeros((2, 2)) + lm.rand((2, 2), generator=gen.manual_seed(1))))
    assert float(z) == float(ref)


def test_modes_belong_to_their_thread_and_nest(probe):
    key, seen = probe
    seen_in_thread = []

    def other():
        lm.exp(lm.ones(3))
        seen_in_thread.extend(seen)

    with modes.include(key):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        with modes.exclude(key):
            lm.exp(lm.ones(3))
        assert modes.current() == (key, 0)
        lm.exp(lm.ones(3))
    assert seen_in_thread == [] and seen == ["full", "exp"]  # not inside exclude


def test_a_mode_can_exclude_a_layer():
    x = lm.ones(3).requires_grad_()
    with modes.exclude(keys.AUTOGRAD):
        y = lm.exp(x)
    assert not y.requires_grad and lm.exp(x).requires_grad


def test_the_generation_changes_on_every_rebuild():
    before = entries.generation
    lm.layers.disable("autograd")
    lm.layers.enable("autograd")
    assert entries.generation == before + 2
