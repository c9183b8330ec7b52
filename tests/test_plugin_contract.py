"""The plugin contract (docs/backends.md), as a plugin author meets it: how wrappers and
kernels rank, what the tie warnings say, that nothing a plugin registers is ignored
without a word, and that warnings point at the plugin's own code.

Each plugin here is registered at run time and unregistered by the ``registered``
fixture; the conftest fixture checks that the tables are as before."""

import itertools
import os
import re
import subprocess
import sys
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


# ---------------------------------------------------------------- declining


def test_an_override_declines_what_it_does_not_handle(register):
    """Note [Declining kernels]: a float64-only CPU override hands every other dtype to
    the kernel below it (numba_cpu's), with no cost for the calls it keeps."""
    served = []

    def float64_multiply(ks, x1, x2):
        if (
            getattr(x1, "dtype", None) is not lm.float64
            or getattr(x2, "dtype", None) is not lm.float64
        ):
            return NotImplemented
        served.append(x1.shape)
        return lm.backends.new_tensor(np.multiply(x1.numpy(), x2.numpy()))

    _, name, caught = register(
        lambda r: r.register("multiply", "cpu", float64_multiply, 5, declines=True)
    )
    assert not caught
    f64, i32 = lm.asarray([1.0, 2.0], dtype=lm.float64), lm.asarray([1, 2], dtype=lm.int32)
    assert (f64 * f64).tolist() == [1.0, 4.0] and served == [(2,)]
    assert (i32 * i32).tolist() == [1, 4] and (i32 * i32).dtype == lm.int32
    assert (f64 * 2.0).tolist() == [2.0, 4.0]  # a scalar: declined too, numba_cpu serves
    assert served == [(2,)]
    kernel, plugin, priority = rows("multiply")["CPU"]
    assert kernel.startswith("[declines] test_plugin_contract.") and kernel.endswith(
        " -> lamina.backends.numba_cpu.elementwise.multiply"
    )
    assert (plugin, priority) == (f"{name} -> numba_cpu", "5 -> 0")


def test_a_device_kernel_declines_to_the_fallback(register):
    import lamina_example_backend as example

    def only_2d(ks, x):
        return (
            NotImplemented
            if x.ndim != 2
            else lm.backends.new_tensor(
                example.CountingStorage(np.exp(x._data.array)), "counting", x.dtype, x.shape
            )
        )

    register(lambda r: r.register("exp", "counting", only_2d, declines=True))
    before = example.plugin.fallback_calls["exp"]
    c1 = lm.ones(2, dtype=lm.float64, device="counting")
    c2 = lm.ones((1, 2), dtype=lm.float64, device="counting")
    # the fallback's CPU kernel and np.exp may differ in the last bit
    np.testing.assert_allclose(lm.exp(c1).tolist(), [np.e, np.e], rtol=4e-16)
    assert lm.exp(c2)[0].tolist() == [np.e, np.e]
    assert example.plugin.fallback_calls["exp"] == before + 1  # only the 1-D call


def test_kernels_that_all_decline_fall_through_a_layer_or_raise(register):
    def never(ks, *args):
        return NotImplemented

    def hook(r):
        r.register("logical_xor", "autograd", never, declines=True)  # nothing below
        r.register("logical_xor", "sparse", never, declines=True)

    ok, name, _ = register(hook)
    assert ok
    assert rows("logical_xor")["Autograd"][1:] == (f"{name} -> -", "0 -> -")
    assert rows("logical_xor")["Autograd"][0].endswith(".never -> [fallthrough]")
    assert rows("logical_xor")["Sparse"][0].endswith(".never -> [missing: NotImplementedError]")
    w = lm.asarray([1.0, 0.0], requires_grad=True)
    assert lm.logical_xor(w, w).tolist() == [False, False]  # fell through AUTOGRAD
    s = lm.asarray([[1.0, 0.0]]).to_sparse()
    with pytest.raises(NotImplementedError, match="'logical_xor' has no kernel for key Sparse"):
        lm.logical_xor(s, s)


# ---------------------------------------------------------------- arity and variants


@pytest.mark.parametrize(
    "registration, message",
    [
        (
            lambda r: r.register("add", "cpu", lambda ks, x: x),
            r"the kernel for 'add' is called as add\(ks, x1, x2\) \(3 positional arguments\), "
            r"but its signature is \(ks, x\)",
        ),
        (
            lambda r: r.register("full", "cpu", lambda ks, shape, fill_value, dtype, device: 0),
            r"full\(ks, shape, fill_value, dtype\) \(4 positional arguments\)",
        ),
        (
            lambda r: r.register_fallback("cpu", lambda op, ks, x: x),
            r"the fallback of device 'cpu' is called as fallback\(op, ks, x1, x2\)",
        ),
        (
            lambda r: r.register_wrapper("exp", "cpu", lambda: None),
            r"wrapper\(next_kernel\) \(1 positional arguments\), but its signature is \(\)",
        ),
        (
            lambda r: r.register("exp", "cpu", lambda ks, x: x, with_scalar=lambda ks, a, b: a),
            r"with_scalar is for binary operators; 'exp' is unary",
        ),
        (
            lambda r: r.register(
                "add", "cpu", lambda ks, a, b: a, declines=True, unchecked=lambda ks, a, b: a
            ),
            r"a kernel that declines \('add'\) cannot have a unchecked variant",
        ),
    ],
    ids=["kernel", "creation", "fallback", "wrapper", "with_scalar", "declines-variant"],
)
def test_a_registration_of_the_wrong_shape_fails_the_plugin_at_once(
    register, registration, message
):
    def hook(r):
        registration(r)

    ok, name, caught = register(hook)
    assert not ok and not lm.backends.plugin_manager.has_plugin(name)
    (warning,) = caught
    assert re.search(message, str(warning.message)), str(warning.message)
    assert warning.filename == __file__


# ---------------------------------------------------------------- checked results


def test_a_cpu_override_returning_an_array_is_an_error_naming_it(register):
    def square(ks, x):
        return np.square(x.numpy())  # forgot to wrap the array

    _, name, _ = register(lambda r: r.register("square", "cpu", square, 1))
    with pytest.raises(lm.backends.KernelResultError) as info:
        lm.square(x)
    array = {
        lm.float64: "array([1., 4., 9.])",
        lm.float32: "array([1., 4., 9.], dtype=float32)",
    }[lm.get_default_dtype()]  # x has the default dtype
    assert str(info.value) == (
        "square: the kernel test_plugin_contract.test_a_cpu_override_returning_an_array_is_an_"
        f"error_naming_it.<locals>.square (plugin {name!r}), serving square on CPU, returned "
        f"ndarray {array}, not a lamina tensor (wrap arrays with new_tensor)"
    )


@pytest.mark.parametrize(
    "bad, why",
    [
        (lambda x: None, "returned NoneType None, not a lamina tensor"),
        (lambda x: [1.0], "returned list [1.0], not a lamina tensor"),
        (
            lambda x: x.to("cpu"),
            "returned a tensor on cpu of dtype {default} and shape (2,), not a tensor on counting",
        ),
        (
            lambda x: NotImplemented,
            "returned NotImplemented (a kernel that may decline registers with declines=True)",
        ),
    ],
    ids=["None", "list", "wrong-device", "NotImplemented"],
)
def test_a_device_kernel_result_is_checked_on_every_call(register, bad, why):
    calls = []

    def kernel(ks, x):
        calls.append(1)
        return x if len(calls) == 1 else bad(x)  # right once, wrong after that

    _, name, _ = register(lambda r: r.register("negative", "counting", kernel))
    c = lm.ones(2, device="counting")
    assert -c is c
    with pytest.raises(
        lm.backends.KernelResultError,
        match=f"\\(plugin {name!r}\\), serving negative on counting, "
        + re.escape(why.format(default=lm.get_default_dtype().name)),
    ):
        lm.negative(c)


def test_the_first_result_of_a_cpu_override_is_checked_against_the_rules(register):
    """The issue's example: square(ones(3)) from a buggy kernel gave int8 of shape (7,)."""

    def square(ks, x):
        return lm.backends.new_tensor(np.zeros(7, np.int8))

    register(lambda r: r.register("square", "cpu", square, 1))
    default = lm.get_default_dtype().name  # of ones(3)
    with pytest.raises(
        lm.backends.KernelResultError,
        match=re.escape(
            "returned a tensor on cpu of dtype int8 and shape (7,), but the operator's rules "
            f"give dtype {default} and shape (3,) for these arguments ({default} (3,))"
        ),
    ):
        lm.square(lm.ones(3))


def test_check_kernels_checks_every_call_and_names_the_link_that_broke(register):
    calls = []

    def sometimes_wrong(ks, a, b):  # right on its first call, so only debug mode sees it
        calls.append(1)
        out = np.subtract(a.numpy(), b.numpy())
        return lm.backends.new_tensor(out if len(calls) == 1 else out[:1])

    def hook(r):
        r.register("subtract", "cpu", sometimes_wrong, 1)
        r.register_wrapper("subtract", "cpu", tracing("w", []))

    _, name, _ = register(hook)
    assert (x - x).shape == (3,)
    assert (x - x).shape == (1,)  # unchecked after the first call: cheap, not watertight
    with lm.backends.check_kernels():
        assert rows("subtract")["CPU"][1] == f"{name} -> {name}"
        with pytest.raises(lm.backends.KernelResultError) as info:
            x - x
    message = str(info.value)
    assert message.startswith(
        "subtract: the kernel test_plugin_contract.test_check_kernels_checks_every_call_and_"
        f"names_the_link_that_broke.<locals>.sometimes_wrong (plugin {name!r}), serving"
    ), message
    default = lm.get_default_dtype().name  # x's dtype
    assert f"shape (1,), but the operator's rules give dtype {default} and shape (3,)" in message
    with pytest.raises(lm.backends.KernelResultError):  # leaving it rebuilt the tables,
        x - x  # so the next call is a first call again


def test_check_kernels_from_the_environment_checks_the_builtins_too():
    """LAMINA_CHECK_KERNELS=1: every slot checks (the built-in kernels pass)."""
    code = (
        "import lamina as lm\n"
        "x = lm.asarray([[1.0, 2.0], [3.0, 4.0]])\n"
        "y = lm.sum(x @ x.T + 1, axis=0) * lm.exp(x[0])\n"
        "print(y.shape, lm.dispatch.dump_table('sum')[0][4])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, LAMINA_CHECK_KERNELS="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "(2,) 2: kernel of 'numba_cpu' (priority 0), every result checked (check_kernels)"
    )


# ---------------------------------------------------------------- moves and gradcheck


@pytest.mark.parametrize(
    "move",
    [
        lambda t, d: t.to(d),
        lambda t, d: t.to_device(d),
        lambda t, d: lm.asarray(t, device=d),
        lambda t, d: lm.astype(t, lm.float64, device=d),
    ],
    ids=["to", "to_device", "asarray", "astype"],
)
def test_moves_between_devices_are_differentiable(move):
    """PyTorch differentiates .to(): a move is the operator to_device, recorded by the
    autograd layer, whose gradient moves back."""
    w = lm.asarray([1.0, 2.0, 3.0], requires_grad=True)
    c = move(w, "counting")
    assert c.device == "counting" and c.requires_grad and c.grad_fn is not None
    y = lm.sum(move(c * c, "cpu") * lm.asarray([1.0, 10.0, 100.0]))
    y.backward()
    assert w.grad.device == "cpu" and w.grad.tolist() == [2.0, 40.0, 600.0]
    # and from a device leaf to the CPU, twice differentiated
    v = lm.asarray([0.5, 1.5], device="counting", requires_grad=True)
    (g,) = lm.autograd.grad(lm.sum(move(v, "cpu") ** 3), [v], create_graph=True)
    assert g.device == "counting" and g.tolist() == [0.75, 6.75]
    (h,) = lm.autograd.grad(lm.sum(g), [v])
    assert h.device == "counting" and h.tolist() == [3.0, 9.0]


def test_gradcheck_checks_a_device_where_it_runs(register):
    """gradcheck perturbs each input on its own device: a device kernel that is wrong
    (sin off by 1%, while its formula's cos runs through the fallback) is caught there,
    and the same function passes on the CPU."""
    import lamina_example_backend as example

    def sin(ks, x):
        array = np.sin(x._data.array) * 1.01
        return lm.backends.new_tensor(example.CountingStorage(array), "counting", x.dtype, x.shape)

    def f(t):
        return lm.sin(t) * 2.0

    cpu = lm.asarray([0.1, 0.7, -0.4], dtype=lm.float64, requires_grad=True)
    dev = lm.asarray([0.1, 0.7, -0.4], dtype=lm.float64, device="counting", requires_grad=True)
    assert lm.autograd.gradcheck(f, [cpu]) and lm.autograd.gradcheck(f, [dev])
    register(lambda r: r.register("sin", "counting", sin, 1))
    assert lm.autograd.gradcheck(f, [cpu])
    with pytest.raises(AssertionError, match="differs from finite differences"):
        lm.autograd.gradcheck(f, [dev])


def test_every_operator_has_a_description():
    """Note [Result rules]: a new operator needs its description in
    dispatch/results.py, several results included (only in-place operators, which
    return their first argument, have none)."""
    from lamina.dispatch import results

    missing = [
        op.name
        for op in lm.dispatch.OPERATORS.values()
        if not results.has_description(op) and "inplace" not in op.tags
    ]
    assert not missing, f"operators without a description: {missing}"


# ---------------------------------------------------------------- helpers for plugin authors


def test_operators_lists_the_schema_with_what_kernels_receive():
    records = lm.dispatch.operators()
    assert [r["name"] for r in records] == list(lm.dispatch.OPERATORS)
    by_name = {r["name"]: r for r in records}
    assert by_name["sum"] == {
        "name": "sum",
        "signature": "(x: Tensor, /, *, axis: Axes = None, dtype: DType | None = None, "
        "keepdims: bool = False) -> Tensor",
        "kernel_call": "sum(ks, x, axis, dtype, keepdims)",
        "category": "reduction",
        "kind": "reduction",
        "tags": frozenset({"differentiable"}),
        "dtypes": "any",
        "result": "sum",
        "convention": lm.dispatch.get("sum").convention,
        "public": True,
        "doc": lm.dispatch.get("sum").doc,
    }
    assert by_name["full"]["kernel_call"] == "full(ks, shape, fill_value, dtype)"  # no device
    assert by_name["add_"]["kind"] == "inplace" and not by_name["add_"]["public"]
    assert [r["name"] for r in lm.dispatch.operators(tag="view")][:2] == ["reshape", "permute_dims"]
    linalg = lm.dispatch.operators(category="linalg")
    text = str(linalg)
    assert text.splitlines()[0] == f"{len(linalg)} operators (docs/operators.md)"
    assert len(linalg) == len(
        [op for op in lm.dispatch.OPERATORS.values() if op.category == "linalg"]
    )
    assert text.splitlines()[1].split() == ["name", "kind", "kernel_call", "tags"]
    (matmul,) = [line for line in text.splitlines() if line.startswith("matmul ")]
    assert matmul.split()[1:] == ["linalg", "matmul(ks,", "x1,", "x2)", "differentiable"]
    with pytest.raises(ValueError, match="unknown category 'elementwize'"):
        lm.dispatch.operators(category="elementwize")


def test_the_fast_constructors_and_the_dtype_mapping():
    assert lm.backends.dtype_from_numpy(np.dtype(np.uint16)) is lm.uint16
    assert lm.backends.dtype_from_numpy(np.dtype(">f4")) is lm.float32
    assert lm.backends.dtype_from_numpy(np.dtype(complex)) is lm.complex128
    with pytest.raises(TypeError, match="unsupported dtype float16"):
        lm.backends.dtype_from_numpy(np.dtype(np.float16))
    t = lm.backends.from_flat(np.arange(6.0), (2, 3), lm.float64)
    assert t.shape == (2, 3) and t.is_contiguous() and t.tolist() == [[0, 1, 2], [3, 4, 5]]
    a = np.zeros((3, 2), np.int32)[::2]
    u = lm.backends.from_array(a)
    assert u.dtype is lm.int32 and u.shape == (2, 2) and not u.is_contiguous()
    assert np.shares_memory(u.numpy(), a)


def test_a_misused_from_flat_is_caught_at_the_first_call(register):
    def negative(ks, x):  # 5 elements for a shape of 3: kernels would read past the end
        return lm.backends.from_flat(np.zeros(5), x.shape, x.dtype)

    register(lambda r: r.register("negative", "cpu", negative, 1))
    with pytest.raises(
        lm.backends.KernelResultError,
        match=re.escape("shape (3,) whose storage is float64 of shape (5,) (made with from_flat?)"),
    ):
        lm.negative(x)


def test_an_entry_point_that_fails_to_import_is_reported_at_its_own_line(tmp_path):
    """The warning points at the plugin's module (the line that raised), not at lamina."""
    (tmp_path / "lamina_broken_ep").mkdir()
    module = tmp_path / "lamina_broken_ep" / "__init__.py"
    module.write_text("import math\nraise ImportError('the vendor driver is missing')\n")
    info = tmp_path / "lamina_broken_ep-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lamina-broken-ep\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[lamina.backends]\nbroken = lamina_broken_ep:plugin\n")
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import lamina\n"
        "(w,) = [w for w in caught if 'broken' in str(w.message)]\n"
        "print(w.category.__name__, w.filename, w.lineno)\n"
        "print(w.message)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    where, message = out.stdout.splitlines()
    assert where == f"PluginWarning {module} 2"
    assert message == (
        "lamina backend plugin 'broken' (lamina_broken_ep:plugin) failed to import and was "
        "skipped: ImportError: the vendor driver is missing"
    )


def test_the_arity_check_agrees_with_inspect_signature():
    """The registry reads a plain function's arity from its code object (it is faster:
    Note in backends/_registry.py); for every shape of signature it must answer as
    ``inspect.signature(fn).bind`` does."""
    import functools
    import inspect

    from lamina.backends._registry import _accepts

    def wrapped(ks, x):
        return x

    @functools.wraps(wrapped)
    def wrapper(*args):
        return wrapped(*args)

    class Kernel:
        def __call__(self, ks, x, y=None):
            return x

    candidates = [
        lambda ks, x: x,
        lambda ks, x, y=1: x,
        lambda ks, *args: args,
        lambda ks, x, /, y: x,
        lambda ks, x, *, out: x,
        lambda ks, x, *, out=None: x,
        lambda *args, **kwargs: args,
        lambda: None,
        wrapper,
        Kernel(),
        functools.partial(lambda a, ks, x: x, 1),
    ]
    for fn in candidates:
        signature = inspect.signature(fn)
        for n in range(5):
            try:
                signature.bind(*range(n))
                expected = True
            except TypeError:
                expected = False
            assert _accepts(fn, n) is expected, (signature, n)
    assert _accepts(max, 2) in (True, None)  # a built-in: readable or not, never refused
