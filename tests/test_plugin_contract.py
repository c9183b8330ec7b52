"""The plugin contract (docs/backends.md), as a plugin author meets it: how wrappers and
kernels rank, what the tie warnings say, that nothing a plugin registers is ignored
without a word, and that warnings point at the plugin's own code.

Each plugin here is registered at run time and unregistered by the ``registered``
fixture; the conftest fixture checks that the tables are as before."""

import itertools
import types
import warnings

import numpy as np
import pytest

import lamina as lm
from lamina.dispatch import keys

CPU = keys.CPU
_names = itertools.count()


@pytest.fixture
def register():
    """register(hook or plugin, name=None) -> (ok, name, warnings); every plugin is
    unregistered afterwards."""
    names = []

    def run(hook, name=None):
        name = name or f"contract_{next(_names)}"
        plugin = hook if not callable(hook) or isinstance(hook, types.ModuleType) else None
        if plugin is None:

            class Plugin:
                @lm.backends.hookimpl
                def lamina_register_kernels(self, registry):
                    hook(registry)

            plugin = Plugin()
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            ok = lm.backends.register(plugin, name)
        if lm.backends.plugin_manager.has_plugin(name):
            names.append(name)
        return ok, name, [w for w in record if issubclass(w.category, RuntimeWarning)]

    yield run
    for name in reversed(names):
        lm.backends.unregister(name)


def rows(name):
    return {r[0]: tuple(r[1:4]) for r in lm.dispatch.dump_table(name)}


def tracing(tag, seen):
    """A wrapper factory that records ``tag`` and delegates."""

    def factory(next_kernel):
        def traced(ks, *args):
            seen.append(tag)
            return next_kernel(ks, *args)

        return traced

    factory.__qualname__ = f"wrap_{tag}"
    return factory


x = lm.asarray([1.0, 2.0, 3.0])


# ---------------------------------------------------------------- wrappers and ranking


@pytest.mark.parametrize("priority", [0, -5])
def test_a_wrapper_wraps_the_serving_kernel_whatever_its_priority_and_name(register, priority):
    """Wrappers rank against wrappers only: a priority-0 wrapper from a plugin named
    'remote' (after 'numba_cpu' by name) used to lose the tie against the kernel it
    wraps and never ran; one below the kernel's priority was ignored on a kernel slot
    but applied on a fallback slot."""
    seen = []
    ok, _, _ = register(
        lambda r: r.register_wrapper("add", "cpu", tracing("remote", seen), priority), "remote"
    )
    assert ok
    assert (x + x).tolist() == [2.0, 4.0, 6.0] and lm.add(x, 1.0).tolist() == [2.0, 3.0, 4.0]
    assert seen == ["remote", "remote"]
    kernel, plugin, prio = rows("add")["CPU"]
    assert kernel == "test_plugin_contract.wrap_remote -> lamina.backends.numba_cpu.elementwise.add"
    assert (plugin, prio) == ("remote -> numba_cpu", f"{priority} -> 0")


def test_wrappers_stack_by_their_own_ranking_and_the_tie_warning_says_both_run(register):
    seen = []
    register(lambda r: r.register_wrapper("multiply", "cpu", tracing("a", seen), 3), "wrap_aa")
    _, _, caught = register(
        lambda r: r.register_wrapper("multiply", "cpu", tracing("b", seen), 3), "wrap_bb"
    )
    register(lambda r: r.register_wrapper("multiply", "cpu", tracing("c", seen), 9), "wrap_cc")
    x * x
    assert seen == ["c", "a", "b"]  # highest priority outermost, then by plugin name
    assert rows("multiply")["CPU"][1:] == (
        "wrap_cc -> wrap_aa -> wrap_bb -> numba_cpu",
        "9 -> 3 -> 3 -> 0",
    )
    (warning,) = caught
    message = str(warning.message)
    assert message.startswith(
        "lamina backend plugins 'wrap_aa' and 'wrap_bb' both register wrappers for "
        "multiply on CPU at priority 3: all of them wrap, 'wrap_aa''s (test_plugin_contract."
    ), message
    assert "outermost" in message and "is used" not in message


def test_the_tie_warning_names_what_really_serves(register):
    """Two kernels tie at priority 7 while a third plugin serves at priority 9: the
    warning must not claim that either of the tied ones is used."""

    def kernel(ks, a, b):
        return lm.backends.new_tensor(np.zeros(3))

    register(lambda r: r.register("subtract", "cpu", kernel, 9), "tie_top")
    register(lambda r: r.register("subtract", "cpu", kernel, 7), "tie_b")
    _, _, caught = register(lambda r: r.register("subtract", "cpu", kernel, 7), "tie_a")
    (warning,) = caught
    message = str(warning.message)
    assert message.startswith(
        "lamina backend plugins 'tie_a' and 'tie_b' both register kernels for subtract on "
        "CPU at priority 7: 'tie_a''s"
    ), message
    assert "serving now: subtract on CPU: 'tie_top' (" in message and "priority 9)" in message
    assert warning.filename == __file__  # the line of the registration that tied


def test_a_plugin_registering_one_slot_twice_at_one_priority_is_warned(register):
    def first(ks, a, b):
        return a

    def second(ks, a, b):
        return b

    def hook(r):
        r.register("maximum", "cpu", first, 4)
        r.register("maximum", "cpu", second, 4)

    _, name, caught = register(hook)
    (warning,) = caught
    assert str(warning.message).startswith(
        f"lamina backend plugin {name!r} registers 2 kernels for maximum on CPU at priority 4"
    )
    assert f"serving now: maximum on CPU: {name!r} (test_plugin_contract." in str(warning.message)
    assert rows("maximum")["CPU"][0].endswith("first")


def test_a_wrapper_with_nothing_to_wrap_is_warned_not_silently_inactive(register):
    seen = []
    _, name, caught = register(
        lambda r: r.register_wrapper("logical_or", "autograd", tracing("w", seen))
    )
    (warning,) = caught
    assert str(warning.message).startswith(
        f"lamina backend plugin {name!r}: its wrapper "
    ) and "logical_or on Autograd has nothing to wrap" in str(warning.message)
    assert warning.filename == __file__


def test_use_picks_kernels_and_keeps_every_wrapper(register):
    seen = []
    _, name, _ = register(lambda r: r.register_wrapper("negative", "cpu", tracing("w", seen)))
    with lm.backends.use("numpy_ref"):
        assert (-x).tolist() == [-1.0, -2.0, -3.0]
        assert rows("negative")["CPU"][1] == f"{name} -> numpy_ref"
    assert seen == ["w"]


# ---------------------------------------------------------------- plugins that register nothing


class MisspelledHook:
    @lm.backends.hookimpl
    def lamina_register_kernel(self, registry):  # one letter short
        registry.register("add", "cpu", lambda ks, a, b: a)


class UnmarkedHook:
    def lamina_register_kernels(self, registry):  # no @hookimpl: pluggy never calls it
        registry.register("add", "cpu", lambda ks, a, b: a)


class TypoUnmarked:
    def lamina_registr_kernels(self, registry):
        pass


class Empty:
    """No hook at all."""


class RegistersNothing:
    @lm.backends.hookimpl
    def lamina_register_kernels(self, registry):
        pass


@pytest.mark.parametrize(
    "plugin, why",
    [
        (
            MisspelledHook(),
            "its hook 'lamina_register_kernel' is not a lamina hook "
            "(the hook is 'lamina_register_kernels')",
        ),
        (
            UnmarkedHook(),
            "its lamina_register_kernels is not marked with @lamina.backends.hookimpl",
        ),
        (
            TypoUnmarked(),
            "it has no lamina_register_kernels hook (did you mean 'lamina_registr_kernels'?)",
        ),
        (Empty(), "it has no lamina_register_kernels hook"),
        (RegistersNothing(), "its hook ran but called no registry method"),
    ],
    ids=["misspelled", "unmarked", "typo-unmarked", "no-hook", "empty-hook"],
)
def test_a_plugin_that_registers_nothing_is_warned_and_told_why(register, plugin, why):
    ok, name, caught = register(plugin)
    assert ok and lm.backends.plugin_manager.has_plugin(name)
    (warning,) = caught
    assert warning.category is lm.backends.PluginWarning
    assert str(warning.message) == (
        f"lamina backend plugin {name!r} registered nothing: {why}; it serves no kernel"
    )
    assert warning.filename == __file__  # the plugin's definition


# ---------------------------------------------------------------- warnings point at the plugin


def test_a_failing_hook_is_reported_at_the_line_that_failed(register):
    def hook(registry):
        registry.register("add", "cpu", lambda ks, a, b: a)
        registry.register("matmull", "cpu", lambda ks, a, b: a)  # the line to point at

    ok, name, caught = register(hook)
    assert not ok
    (warning,) = caught
    assert str(warning.message).startswith(
        f"lamina backend plugin {name!r} failed while registering its kernels"
    )
    assert warning.filename == __file__
    assert warning.lineno == hook.__code__.co_firstlineno + 2
