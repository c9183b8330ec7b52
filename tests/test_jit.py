"""lamina.jit: traces print as golden graphs, passes keep what they promise (one
fused kernel for an elementwise chain), and a compiled function equals eager -- on
every sample of every operator, on random elementwise programs, through graph breaks,
recompiles, mutation, training and two threads."""

import copy
import sys
import threading
import warnings

import numpy as np
import pytest
import samples as S
from hypothesis import given, settings
from hypothesis import strategies as st

import lamina as lm
from lamina import jit
from lamina.dispatch import layouts
from lamina.dispatch.schema import OPERATORS
from lamina.jit import compiler, passes

F = lm.nn.functional


def rand(*shape, dtype=np.float32, seed=0):
    return lm.asarray(np.random.default_rng(seed).uniform(-2, 2, shape).astype(dtype))


def equal(got, want):
    """Same structure, dtypes, shapes and values (NaN where NaN)."""
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            equal(g, w)
        return
    if not isinstance(want, lm.Tensor):
        assert got == want
        return
    assert isinstance(got, lm.Tensor) and got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.numpy(), want.numpy())


# ---------------------------------------------------------------- graphs


def test_a_trace_prints_as_a_golden_graph_and_lints():
    def f(x, w):
        h = F.relu(x @ w + 1.0)
        return lm.sum(h, axis=1), h.T

    graph = jit.trace(f, rand(4, 3), rand(3, 5))
    graph.lint()
    assert str(graph) == (
        "graph(x0: float32[4, 3], x1: float32[3, 5]):\n"
        "  %0: float32[4, 5] = matmul(x0, x1)\n"
        "  %1: float32[4, 5] = add(%0, 1.0)\n"
        "  %2: float32[4, 5] = relu(%1)\n"
        "  %3: float32[4] = sum(%2, (1,), None, False)\n"
        "  %4: float32[5, 4]{1,5} = matrix_transpose(%2)\n"
        "  return (%3, %4)"
    )


def test_lint_names_the_broken_invariant():
    graph = jit.trace(lambda x: lm.exp(x) + 1.0, rand(3))
    graph.nodes.reverse()
    with pytest.raises(jit.GraphError, match="uses %0 before it is defined"):
        graph.lint()


def test_creation_and_random_calls_are_captured_and_draw_anew_at_each_call():
    def f(x):
        return x + lm.zeros((3,)) + lm.rand((3,))

    graph = jit.trace(f, rand(3))
    assert [n.name for n in graph.nodes] == ["full", "add", "rand", "add"]
    compiled = jit.compile(f)
    x = rand(3)
    lm.random.seed(7)
    first, second = compiled(x), compiled(x)
    lm.random.seed(7)
    equal(first, f(x))
    equal(second, f(x))
    assert not np.array_equal(first.numpy(), second.numpy())  # never a frozen draw


def test_an_elementwise_chain_is_one_kernel_and_so_is_a_reduction_of_it_along_rows():
    a, b, c, d = (rand(5, 4, seed=i) for i in range(4))
    chain = passes.apply(jit.trace(lambda a, b, c, d: a + b * c - d, a, b, c, d))
    assert [n.name for n in chain.nodes] == ["fused[multiply, add, subtract]"]

    def kernels(f, *args):
        return [n.name for n in passes.apply(jit.trace(f, *args)).nodes]

    # Note [Fused reductions]: over the last axis or all of them, one kernel
    assert kernels(lambda a, b: lm.sum(lm.exp(a * b), axis=-1), a, b) == [
        "fused[multiply, exp, sum]"
    ]
    assert kernels(lambda a: lm.max(a * 2.0, keepdims=True), a) == ["fused[multiply, max]"]
    assert kernels(lambda a: lm.min(lm.tanh(a), axis=1), a) == ["fused[tanh, min]"]
    # another axis, a float64 sum, a value read elsewhere: the reduction's own kernel
    assert kernels(lambda a, b: lm.sum(lm.exp(a * b), axis=0), a, b) == [
        "fused[multiply, exp]",
        "sum",
    ]
    wide = rand(5, 4, dtype=np.float64)
    assert kernels(lambda w: lm.sum(lm.exp(w) * 2.0, axis=-1), wide)[-1] == "sum"
    assert kernels(lambda a: (lm.sum(lm.exp(a), axis=-1), lm.exp(a)), a) == ["exp", "sum"]


def test_a_write_is_never_crossed_and_any_number_fuses():
    """Note [Fusion groups]: a group that a write interrupts (setitem) closes, and never
    ends in a reduction past it; infinities, NaN and integers past 64 bits are numbers
    a fused loop computes with as eager does."""

    def write_then_reduce(x):
        y = x * 2.0 + 1.0
        x[0] = 100.0
        return lm.sum(y, axis=-1)

    def write_inside(x):
        y = x * 2.0
        x[0] = 100.0
        return y + 1.0

    for f in (write_then_reduce, write_inside):
        compiled = jit.compile(f)
        for _ in range(2):
            equal(compiled(rand(3, 4)), f(rand(3, 4)))
    x = rand(3, 4)
    for f in (
        lambda x: x * float("inf") + 1.0,
        lambda x: lm.sum(x * float("-inf") + float("nan"), axis=-1),
        lambda x: x * 2**70 + 1,
    ):
        with np.errstate(all="ignore"):
            equal(jit.compile(f)(x), f(x))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(5, 4), (3, 1), (7,), (), (2, 3, 33), (0, 3)])
def test_a_fused_reduction_equals_eager(shape, dtype):
    """Note [Fused reductions]: max and min exactly; a float32 sum, accumulated in
    float64 and rounded once as its kernel does, equal too."""
    a, b = rand(*shape, dtype=dtype), rand(*shape, dtype=dtype, seed=1)
    last = {"axis": -1} if shape else {}
    programs = [
        lambda a, b: lm.sum(lm.exp(a * b) - a, **last),
        lambda a, b: lm.sum(a * b + 1.0, keepdims=True),
        lambda a, b: lm.max(lm.abs(a - b), **last),
        lambda a, b: lm.min(a * b[..., :1] if shape else a * b, keepdims=True),
    ]
    for f in programs:
        try:
            want = f(a, b)
        except ValueError:  # max or min of rows of nothing
            with pytest.raises(ValueError, match="zero-size"):
                jit.compile(f)(a, b)
            continue
        compiled = jit.compile(f)
        for _ in range(2):  # the general path, then the hot one
            equal(compiled(a, b), want)
    common = passes.apply(jit.trace(lambda a, b: (a * b + 1.0) - (a * b + 1.0) * 0.0, a, b))
    assert len(common.nodes) == 1 and common.nodes[0].target.ops == [
        "multiply",
        "add",
        "multiply",
        "subtract",
    ]


def test_a_small_flat_group_is_one_call_of_its_c_loop_which_refuses_other_inputs():
    """Note [Fused loops]: both cores call the same C loop; a call its plan's guards
    would never make is refused, not read out of bounds."""
    a, b = rand(5, 4), rand(1, seed=1)  # b: one element, read at index 0

    def f(a, b):
        t = a * b
        return lm.exp(t), t - a  # two outputs

    call = passes.apply(jit.trace(f, a, b)).nodes[0].target
    assert call.c_loop and call.ops == ["multiply", "exp", "subtract"]
    equal(call.entry(a, b), f(a, b))
    for args, wrong in [
        ((a,), "1 inputs, expected 2"),
        ((a, a), "input 1 is not a contiguous tensor of 1 elements"),
        ((rand(4, 5).T, b), "input 0 is not"),  # strided
        ((lm.astype(a, lm.float64), b), "input 0 is not"),
        ((a, 2.0), "input 1 is not"),
    ]:
        with pytest.raises(TypeError, match=wrong):
            call.entry(*args)
    empty = rand(0, 3)
    equal(jit.compile(lambda x: lm.exp(x) * 2.0 - x)(empty), lm.exp(empty) * 2.0 - empty)


def test_the_passes_fold_constants_drop_dead_code_and_keep_random_calls():
    def f(x):
        dead = lm.exp(x)  # noqa: F841 (unused: dropped)
        lm.rand((2,))  # unused, but a draw: kept
        return x * (lm.ones((2,)) * 3.0)

    graph = passes.apply(jit.trace(f, rand(2)), ["cse", "fold", "dce"])
    assert [n.name for n in graph.nodes] == ["rand", "multiply"]
    assert sum(v.kind == "constant" for v in graph.inputs) == 1


def test_compiled_equals_eager_with_broadcasting_scalars_views_and_mixed_dtypes():
    def f(x, y, z):
        u = x * y.T + 2  # a transposed operand
        v = lm.maximum(u, z) - 0.5  # broadcast (5,) against (4, 5)
        return lm.where(v > 0, v, u), lm.astype(v, lm.float64) + z[1:3].sum()

    x, y = rand(4, 5), rand(5, 4, seed=1)
    z = rand(5, seed=2)
    compiled = jit.compile(f)
    for _ in range(2):
        equal(compiled(x, y, z), f(x, y, z))
    ints = lm.asarray(np.arange(20, dtype=np.int32).reshape(4, 5))
    equal(compiled(ints, y, z), f(ints, y, z))  # another dtype: a second variant
    assert len(compiled.variants) == 2


_UNARY = ["exp", "tanh", "negative", "abs", "square", "sin"]
_BINARY = ["add", "subtract", "multiply", "maximum", "minimum", "divide"]


@st.composite
def programs(draw):
    """A random elementwise program on three inputs: steps of unary and binary
    operators over earlier values, Python numbers and broadcast shapes, and maybe a
    reduction of the last value."""
    steps = []
    for i in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            steps.append(("u", draw(st.sampled_from(_UNARY)), draw(st.integers(0, i + 2))))
        else:
            other = draw(
                st.one_of(
                    st.tuples(st.just("value"), st.integers(0, i + 2)),
                    st.tuples(st.just("number"), st.sampled_from([0.5, -3, 2.0])),
                )
            )
            steps.append(("b", draw(st.sampled_from(_BINARY)), draw(st.integers(0, i + 2)), other))
    shapes = draw(st.sampled_from([((3, 4), (3, 4), (4,)), ((2, 1), (1, 5), ()), ((6,),) * 3]))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    reduction = draw(
        st.sampled_from([None, ("sum", -1), ("sum", None), ("max", -1), ("min", None)])
    )
    return steps, shapes, dtype, reduction


@settings(max_examples=25, deadline=None)
@given(programs())
def test_random_elementwise_programs_compiled_equal_eager(program):
    steps, shapes, dtype, reduction = program

    def f(a, b, c):
        values = [a, b, c]
        for step in steps:
            fn = getattr(lm, step[1])
            if step[0] == "u":
                values.append(fn(values[step[2]]))
            else:
                kind, other = step[3]
                values.append(fn(values[step[2]], values[other] if kind == "value" else other))
        if reduction is None:
            return values[-1]
        last = values[-1]
        return getattr(lm, reduction[0])(last, axis=reduction[1] if last.ndim else None)

    inputs = [rand(*s, dtype=dtype, seed=i) for i, s in enumerate(shapes)]
    compiled = jit.compile(f)
    with np.errstate(all="ignore"):
        want = f(*inputs)
        for _ in range(2):  # the general path, then the hot one
            got = compiled(*inputs)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(
                got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6, equal_nan=True
            )


# ---------------------------------------------------------------- every operator

# not compiled: moves between devices and sparse conversions (eager only)
NOT_COMPILED = {"to_device", "to_sparse", "to_dense", "coalesce", "sparse_mask"}


def _clone(a):
    if isinstance(a, lm.Generator):  # the same draws again
        return copy.deepcopy(a)
    if isinstance(a, lm.Tensor):
        return lm.asarray(a.numpy().copy()) if a.device == "cpu" and not a.is_sparse else a
    if type(a) in (list, tuple):
        return type(a)(_clone(b) for b in a)
    if type(a) is dict:
        return {k: _clone(v) for k, v in a.items()}
    return a


def _layout(t):
    """The strides of a non-empty dense tensor, those of size-1 axes left out."""
    if t.is_sparse or 0 in t.shape:
        return None
    return tuple(s for n, s in zip(t.shape, layouts.strides_of(t)) if n != 1)


def _tensors(out):
    if isinstance(out, lm.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("name", sorted(set(OPERATORS) - NOT_COMPILED))
def test_every_sample_compiled_equals_eager(name):
    for sample in S.samples(name):
        if any(a.is_sparse for a in _tensors((sample.args, list(sample.kwargs.values())))):
            continue
        args, kwargs = _clone(sample.args), _clone(sample.kwargs)
        lm.random.seed(3)
        try:
            want = sample.fn(*args, **kwargs)
        except Exception as error:  # bad input: the same error compiled
            with pytest.raises(type(error)):
                lm.random.seed(3)
                jit.compile(sample.fn)(*_clone(sample.args), **_clone(sample.kwargs))
            continue
        cargs, ckwargs = _clone(sample.args), _clone(sample.kwargs)
        lm.random.seed(3)
        got = jit.compile(sample.fn)(*cargs, **ckwargs)
        for g, w in zip(_tensors(got), _tensors(want), strict=True):
            assert (g.dtype, g.shape, _layout(g)) == (w.dtype, w.shape, _layout(w)), sample
            if name != "empty":  # uninitialized values
                np.testing.assert_array_equal(g.numpy(), w.numpy(), err_msg=repr(sample))
        # arguments written in place are written alike
        for g, w in zip(_tensors((cargs, ckwargs)), _tensors((args, kwargs))):
            np.testing.assert_array_equal(g.numpy(), w.numpy(), err_msg=repr(sample))


# ---------------------------------------------------------------- guards


def test_a_new_size_recompiles_and_past_the_limit_runs_eagerly_with_one_warning():
    compiled = jit.compile(lambda x: lm.exp(x) * 2.0, cache_limit=2, dynamic=False)
    for n in (3, 4):
        equal(compiled(rand(n)), lm.exp(rand(n)) * 2.0)
    assert compiled.recompiles == ["x: size 4 instead of 3 in dimension 0"]
    with pytest.warns(jit.RecompileWarning, match="size 5 instead of 4 in dimension 0"):
        equal(compiled(rand(5)), lm.exp(rand(5)) * 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        equal(compiled(rand(6)), lm.exp(rand(6)) * 2.0)  # eager, warned once


def test_a_sparse_argument_runs_eagerly_beside_the_compiled_dense_variant():
    compiled = jit.compile(lambda x: x * 2.0)
    dense = lm.asarray(np.eye(3))
    sparse = dense.to_sparse()
    for _ in range(2):  # the guard's fast path, then its general one
        result = compiled(sparse)
        assert result.is_sparse
        np.testing.assert_array_equal(result.to_dense().numpy(), 2 * np.eye(3))
    equal(compiled(dense), dense * 2.0)
    assert len(compiled.graphs) == 1  # the dense call's


def test_sizes_make_a_function_dynamic_whose_size_variants_share_a_loop_and_stay_few(
    monkeypatch,
):
    """Note [Dynamic sizes]: by default a second distinct size makes a function dynamic;
    then variants of one kind do not count against the limit, share their loop, and
    only the most recent SIZE_VARIANTS of a kind are kept."""
    monkeypatch.setattr(compiler, "SIZE_VARIANTS", 3)
    f = lambda x: lm.exp(x) * 2.0 + x
    compiled = jit.compile(f, cache_limit=2)
    assert compiled.dynamic is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (3, 4, 5, 6, 7, 3):
            for _ in range(2):  # the general path, then the hot one (Note [Guard tokens])
                equal(compiled(rand(n)), f(rand(n)))
        assert compiled.dynamic is True
        (graph,) = compiled.graphs  # one symbolic graph for every size (Note [Symbolic sizes])
        assert str(graph.inputs[0].shape[0]) == "s0" and len(compiled.runs) == 3
        wide = rand(4, dtype=np.float64)
        equal(compiled(wide), f(wide))  # a second kind: within the limit of 2
    ints = lm.asarray(np.arange(4, dtype=np.int32))
    with pytest.warns(jit.RecompileWarning, match="int32"):
        equal(compiled(ints), f(ints))


def test_the_same_tensor_twice_and_two_tensors_are_two_inputs():
    compiled = jit.compile(lambda x, y: lm.exp(x * y) + 1.0)
    x, y = rand(4), rand(4, seed=1)
    equal(compiled(x, x), lm.exp(x * x) + 1.0)
    equal(compiled(x, y), lm.exp(x * y) + 1.0)  # the same variant, not x twice


def test_layout_dtype_grad_mode_and_table_rebuilds_are_guarded():
    compiled = jit.compile(lambda x: x * 2.0 + 1.0)
    x = rand(3, 4)
    compiled(x)
    compiled(x.T)  # another layout
    compiled(lm.astype(x, lm.float64))
    lm.layers.disable("autograd")
    lm.layers.enable("autograd")
    compiled(x)
    assert compiled.recompiles == [
        "x: size 4 instead of 3 in dimension 0",
        "x: dtype float64 instead of float32",
        "the dispatch tables were rebuilt (a plugin or a layer switch)",
    ]


# ---------------------------------------------------------------- graph breaks


def test_a_graph_break_runs_the_parts_compiled_and_explain_names_the_line():
    def f(x):
        y = x * 2.0 + 1.0
        if float(y.sum()) > 0:  # the break
            return lm.exp(y) - 1.0
        return -y

    x = rand(6)
    compiled = jit.compile(f)
    for v in (x, -x - 5.0):
        equal(compiled(v), f(v))
    found = jit.explain(compiled, x)
    assert len(found.breaks) >= 1
    assert "reading the values of" in found.breaks[0].reason
    assert "if float(y.sum()) > 0:  # the break" in found.breaks[0].line
    assert "test_jit.py" in str(found)
    with pytest.raises(jit.GraphBreak, match=r"fullgraph=True.*test_jit.py:\d+: if float"):
        jit.compile(f, fullgraph=True)(x)


def test_value_dependent_shapes_and_printing_break_the_graph(capsys):
    def f(x):
        kept = lm.nonzero(x > 0)[0]
        print(kept)
        return kept * 2

    x = rand(8)
    equal(jit.compile(f)(x), f(x))
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == printed[1] and "meta" not in printed[0]  # the values, as eager


def test_in_place_writes_of_inputs_happen_as_in_eager():
    def f(x, y):
        x += y
        x[0] = 5.0
        return x * 2.0

    x, y = rand(4), rand(4, seed=1)
    x_eager, x_compiled = _clone(x), _clone(x)
    want = f(x_eager, y)
    equal(jit.compile(f)(x_compiled, y), want)
    equal(x_compiled, x_eager)


# ---------------------------------------------------------------- modules and training


def _mlp(seed):
    lm.random.seed(seed)
    return lm.nn.Sequential(lm.nn.Linear(6, 8), lm.nn.ReLU(), lm.nn.Linear(8, 3))


def test_a_compiled_module_trains_step_by_step_as_eager():
    eager, model = _mlp(0), _mlp(0)
    compiled = jit.compile(model)
    x, y = rand(5, 6), lm.asarray(np.array([0, 2, 1, 1, 0]))
    opts = [lm.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    for _ in range(3):
        losses = []
        for run, opt in ((eager, opts[0]), (compiled, opts[1])):
            opt.zero_grad()
            loss = F.cross_entropy(run(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        assert losses[0] == losses[1]
    for a, b in zip(eager.parameters(), model.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    model.eval()
    with lm.no_grad():
        equal(compiled(x), eager.eval()(x))  # eval and no-grad: new variants
    assert len(compiled._compiled.variants) == 2


def _grads_of(fn, x):
    """(fn(x)'s backward gradient of x, the result's requires_grad)."""
    x = lm.asarray(x.numpy()).requires_grad_()
    out = fn(x)
    lm.sum(out if isinstance(out, lm.Tensor) else out[0]).backward()
    return x.grad.numpy(), (out if isinstance(out, lm.Tensor) else out[-1]).requires_grad


def test_no_grad_inside_and_masks_at_a_break_keep_eager_gradients():
    """A call under no_grad inside the program recorded autograd in the compiled plan
    (its gradient counted twice); a boolean-mask selection, run at a graph break, lost
    its gradient; a derivative formula that reads values (sort's) failed to compile."""

    def inside(x):
        with lm.no_grad():
            z = x * 2
        return z * x, z

    programs = [
        inside,
        lambda x: lm.sum(x * 2) + lm.sum(x[x > 0]),
        lambda x: lm.sum(lm.sort(x, axis=0) * lm.asarray([1.0, 2.0, 3.0, 4.0])),
    ]
    x = lm.asarray(np.array([3.0, -1.0, 2.0, 0.5]))
    for fn in programs:
        compiled = jit.compile(fn)
        for _ in range(2):
            (ga, ra), (gb, rb) = _grads_of(fn, x), _grads_of(compiled, x)
            np.testing.assert_array_equal(gb, ga)
            assert ra == rb


def test_copies_of_a_broadcast_input_are_contiguous_as_traced():
    """clone, sort and astype of a broadcast view (stride 0) kept NumPy's "K" order,
    that axis innermost, where the trace described a C-contiguous result: a fused loop
    after them refused its input."""
    y = rand(3, 4)
    x = lm.asarray(np.arange(4.0, dtype=np.float32)).reshape(1, 4).expand(3, 4)
    for copy_of in (lm.clone, lambda t: lm.sort(t, axis=0), lambda t: lm.astype(t, lm.float64)):
        assert copy_of(x).numpy().flags.c_contiguous

        def fn(x, y):
            return lm.exp(copy_of(x)) + y

        np.testing.assert_allclose(jit.compile(fn)(x, y).numpy(), fn(x, y).numpy(), rtol=1e-6)


def test_a_result_returned_detached_stays_detached():
    """A detached tensor is an alias of its tensor in the trace (the same Value):
    returned, the compiled call gave the tensor itself, history and all (gradients
    through it counted twice), with or without a graph break."""

    def plain(x):
        return (x * 2).detach(), x * 3

    def broken(x):
        y = x * 2
        if float(lm.sum(y)) > -1e9:  # a graph break
            y = y + 1
        return y.detach(), y

    for fn in (plain, broken):
        compiled = jit.compile(fn)
        for run in (fn, compiled, compiled):
            x = lm.ones(3).requires_grad_()
            a, b = run(x)
            assert not a.requires_grad and b.requires_grad
            lm.sum(a * x + b).backward()
            np.testing.assert_array_equal(x.grad.numpy(), [5.0] * 3)  # a + 3, a + 2 (a = 3)


def test_compiled_writes_bump_versions_and_saved_tensors_are_checked():
    """Note [Version counters]: a compiled in-place write bumps its storage's version,
    so a tensor autograd saved and a program then changed is an error, as in eager
    mode (the backward used the new values); so is a program writing a tensor its own
    backward reads. Double backward through a compiled function is refused."""
    double = jit.compile(lambda x: x.mul_(2))
    w, x = lm.ones(3).requires_grad_(), lm.ones(3)
    y = lm.sum(w * x)  # saves x
    double(x)
    assert x._version == 1
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()

    def squares(x):
        y = x * 2 + 1
        y.mul_(y)
        return lm.sum(y)

    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        jit.compile(squares)(lm.ones(2).requires_grad_()).backward()
    x = lm.asarray([1.0, 2.0]).requires_grad_()
    with pytest.raises(NotImplementedError, match="create_graph"):
        lm.autograd.grad(jit.compile(lambda x: lm.sum(x**3))(x), [x], create_graph=True)


def test_reseeding_restarts_compiled_random_calls():
    """A compiled graph holds the stream's NumPy generator: manual_seed restarts it in
    place, where it made a new one the graph never saw."""
    noisy = jit.compile(lambda x: x + lm.rand(3))
    x = lm.zeros(3)
    draws = []
    for _ in range(3):
        lm.manual_seed(0)
        draws.append(noisy(x).numpy())
    lm.manual_seed(0)
    np.testing.assert_array_equal(draws[0], lm.rand(3).numpy())
    for d in draws[1:]:
        np.testing.assert_array_equal(d, draws[0])


def test_a_read_of_a_buffers_values_is_a_graph_break():
    """Note [Tracing]: float() of a real tensor in a trace baked its value into the
    graph: stale after the buffer changed, and stale at once after a traced write
    (BatchNorm with momentum=None divides by its count of batches: ZeroDivisionError on
    a fresh module, running statistics drifting after one eager step)."""

    class Scale(lm.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("s", lm.asarray(np.array(1.0)))

        def forward(self, x):
            return x * float(self.s)

    model, x = Scale(), rand(3)
    compiled = jit.compile(model)
    equal(compiled(x), x)
    model.s.fill_(5.0)
    equal(compiled(x), x * 5.0)
    assert [b.reason for b in jit.explain(model, x).breaks] == ["reading the values of a float64[]"]
    for momentum in (None, 0.1):
        eager, norm = (lm.nn.BatchNorm2d(3, momentum=momentum) for _ in range(2))
        compiled = jit.compile(norm)
        for seed in range(3):
            images = rand(4, 3, 5, 5, seed=seed)
            # within rounding: layout "auto" may run it channels-last (Note [Compiled layout])
            got, want = compiled(images).numpy(), eager(images).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        for a, b in zip(eager.buffers(), norm.buffers()):
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-7)


def test_unfreezing_a_parameter_after_compiling_gives_it_gradients():
    """Note [Grad flag changes]: the guard reads the parameters' requires_grad again
    when one flips; the variant traced with a frozen weight treated it as a constant."""
    model = lm.nn.Linear(3, 2)
    compiled, x = jit.compile(model), rand(4, 3).requires_grad_()
    model.weight.requires_grad_(False)
    lm.sum(compiled(x)).backward()
    assert model.weight.grad is None and model.bias.grad is not None
    model.weight.requires_grad = True
    lm.sum(compiled(x)).backward()
    np.testing.assert_allclose(model.weight.grad.numpy(), np.tile(x.numpy().sum(0), (2, 1)))
    assert "a parameter's requires_grad" in compiled.recompiles[-1]


def test_an_input_only_unread_outputs_depend_on_gets_no_gradient():
    """As in eager mode: a loss over the first of two branches leaves the second's
    parameters without a gradient (None, which optimizers skip), not zeros."""

    class Two(lm.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = lm.nn.Linear(3, 2), lm.nn.Linear(3, 2)

        def forward(self, x):
            return self.a(x), self.b(x)

    model = Two()
    compiled, x = jit.compile(model), rand(4, 3)
    for _ in range(2):
        model.zero_grad()
        lm.sum(compiled(x)[0]).backward()
        assert model.b.weight.grad is None and model.b.bias.grad is None
        assert model.a.weight.grad is not None
    first, second = compiled(x)
    lm.sum(first + second).backward()
    assert model.b.weight.grad is not None


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_modules_that_read_their_inputs_layout_compile(layout):
    """F.layout_of read a traced (meta) tensor's values: ZeroPad2d, ConvTranspose2d
    and AdaptiveMaxPool2d (sizes that do not divide) could not be compiled."""
    x = F.to_layout(rand(2, 3, 5, 5), layout).requires_grad_()
    for make in (
        lambda: lm.nn.ZeroPad2d((1, 2, 0, 1)),
        lambda: lm.nn.ConvTranspose2d(3, 4, 3, stride=2),
        lambda: lm.nn.AdaptiveMaxPool2d((3, 3)),
    ):
        eager = make()
        model = copy.deepcopy(eager)
        outs = []
        for run in (eager, jit.compile(model)):
            out = run(x)
            lm.sum(out * out).backward()
            outs.append((out, x.grad.numpy().copy()))
            x.grad = None
        (a, ga), (b, gb) = outs
        # within rounding: layout "auto" may run the compiled model channels-last, its
        # sums in another order than eager's
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
        assert F.layout_of(b) == F.layout_of(a)
        np.testing.assert_allclose(gb, ga, rtol=1e-5, atol=1e-6)
        for p, q in zip(eager.parameters(), model.parameters()):
            np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a_program_with_breaks_records_autograd_after_a_no_grad_call():
    """The plans of a program's pieces around a graph break were cached without grad
    mode: after a validation call under no_grad, training reused its plans, and the
    layers before the break got no gradient."""

    class Broken(lm.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = lm.nn.Linear(3, 3), lm.nn.Linear(3, 1)

        def forward(self, x):
            y = self.a(x)
            if float(y.sum()) > -1e9:  # a graph break
                y = y * 2.0
            return self.b(y)

    model = Broken()
    compiled, x = jit.compile(model), rand(2, 3)
    with lm.no_grad():
        compiled(x)
    compiled(x).sum().backward()
    got = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for g, p in zip(got, model.parameters()):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-6)


@pytest.mark.parametrize(
    "layer",
    [
        # returns (output, (h, c)): not a joint graph, autograd recording through the
        # plan; its two biases, added once, were hoisted and got no gradient
        lambda: lm.nn.LSTM(3, 4),
        # a joint graph whose h_n the loss does not read: that gradient never comes
        lambda: lm.nn.GRU(3, 4, bidirectional=True),
        lambda: lm.nn.RNN(3, 4, 2, bidirectional=True),
    ],
)
def test_compiled_recurrent_layers_give_eager_gradients(layer):
    eager = layer()
    model = copy.deepcopy(eager)
    compiled = jit.compile(model)
    x = rand(5, 2, 3)
    for _ in range(2):  # the second call runs the cached plans
        for run, m in ((eager, eager), (compiled, model)):
            m.zero_grad()
            lm.sum(run(x)[0] ** 2).backward()
        for (name, a), b in zip(eager.named_parameters(), model.parameters()):
            assert b.grad is not None, name
            np.testing.assert_allclose(b.grad.numpy(), a.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "optimizer", [lambda p: lm.optim.SGD(p, lr=0.1, momentum=0.9), lambda p: lm.optim.Adam(p)]
)
def test_a_whole_training_step_compiles_with_backward_and_step_as_breaks(optimizer):
    # Note [Eager calls in a trace]: backward() and step() run eagerly between graphs;
    # the optimizers' state (momentum, Adam's moments and step) stays real tensors
    x, y = rand(5, 6), lm.asarray(np.array([0, 2, 1, 1, 0]))
    results = []
    for compiled in (False, True):
        model = _mlp(0)
        opt = optimizer(model.parameters())

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        run = jit.compile(step) if compiled else step
        losses = [float(run(x, y)) for _ in range(3)]
        results.append((losses, [p.numpy().copy() for p in model.parameters()], run))
    (losses, params, _), (got_losses, got_params, compiled) = results
    assert got_losses == losses and losses[2] < losses[0]
    for a, b in zip(params, got_params):
        np.testing.assert_array_equal(b, a)
    found = jit.explain(compiled, x, y)
    assert [b.line.split(": ", 1)[1] for b in found.breaks] == ["loss.backward()", "opt.step()"]
    assert "backward() of %" in found.breaks[0].reason
    assert found.breaks[1].reason.endswith(".step() runs eagerly: it updates its state")
    with pytest.raises(jit.GraphBreak, match=r"fullgraph=True.*loss.backward\(\)"):
        jit.compile(compiled.fn, fullgraph=True)(x, y)


def test_training_compiles_the_backward_from_the_formulas():
    x = rand(4, 3).requires_grad_()
    w = rand(3, 5, seed=1).requires_grad_()
    seen = []
    w.register_hook(lambda g: seen.append(g.shape))

    def f(x, w):
        return lm.sum(lm.tanh(x @ w) * 2.0 + 1.0)

    compiled = jit.compile(f)
    grads = []
    for run in (f, compiled, compiled):
        x.grad = w.grad = None
        run(x, w).backward()
        grads.append((x.grad.numpy().copy(), w.grad.numpy().copy()))
    for got in grads[1:]:  # the fused tanh is within its ulps of eager's (NumPy's loop)
        np.testing.assert_allclose(got[0], grads[0][0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], grads[0][1], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(grads[2][0], grads[1][0])  # compiled: the same each time
    np.testing.assert_array_equal(grads[2][1], grads[1][1])
    assert seen == [(3, 5)] * 3  # a user's hook runs on the compiled backward too
    (variant,) = compiled.variants.values()
    assert str(variant.plan.forward.graph) == (
        "graph(x0: float32[4, 3], x1: float32[3, 5]):\n"
        "  %0: float32[4, 5] = matmul(x0, x1)\n"
        "  %1: float32[4, 5], %3: float32[4, 5] = fused[tanh, multiply, add](%0)\n"
        "  %4: float32[] = sum(%3, (0, 1), None, False)\n"
        "  return (%4, x1, x0, %1)"  # the loss, and what the backward reads: the
        # user's tensors, then the forward's own values (released as the backward goes)
    )
    backward = [n.name for n in variant.plan.backward.graph.nodes]
    assert "fused[multiply, multiply, subtract, multiply]" in backward  # tanh's, fused
    assert backward.count("matmul") == 2


def test_a_compiled_cross_entropy_backward_is_one_node():
    """Note [One-pass cross entropy]: the loss's gradient is the fused operator in the
    compiled backward, as in eager (not log_softmax, nll_loss_backward and
    log_softmax_backward), with eager's gradients."""
    eager, model = _mlp(0), _mlp(0)
    x, y = rand(5, 6), lm.asarray(np.array([0, 2, -100, 1, 0]))
    compiled = jit.compile(lambda x, y: F.cross_entropy(model(x), y))
    for run in (lambda x, y: F.cross_entropy(eager(x), y), compiled):
        run(x, y).backward()
    for a, b in zip(eager.parameters(), model.parameters()):
        np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())
    (variant,) = compiled.variants.values()
    backward = [n.name for n in variant.plan.backward.graph.nodes]
    assert backward.count("cross_entropy_loss_backward") == 1
    assert not {"log_softmax", "nll_loss_backward", "log_softmax_backward"} & set(backward)


def test_a_replaced_parameter_is_seen():
    model = lm.nn.Linear(3, 2)
    compiled = jit.compile(model)
    x = rand(4, 3)
    with lm.no_grad():
        compiled(x)
        model.weight = lm.nn.Parameter(lm.zeros((2, 3)))
        equal(compiled(x), model(x))


def test_two_threads_call_one_compiled_function_at_once():
    compiled = jit.compile(lambda x, y: lm.tanh(x * y + 1.0) - y)
    pairs = [(rand(64, seed=i), rand(64, seed=i + 10)) for i in range(4)]
    alone = [compiled(*pair).numpy() for pair in pairs]  # one thread's results
    for pair, want in zip(pairs, alone):  # the fused tanh: within its ulps of eager's
        eager = (lm.tanh(pair[0] * pair[1] + 1.0) - pair[1]).numpy()
        np.testing.assert_allclose(want, eager, rtol=1e-6, atol=1e-7)
    failures = []

    def work(pair, want):
        for _ in range(50):
            if not np.array_equal(compiled(*pair).numpy(), want):
                failures.append(pair)

    threads = [threading.Thread(target=work, args=(p, w)) for p, w in zip(pairs, alone)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


# ---------------------------------------------------------------- bad input


CALLS = 0


def _counting(x):
    global CALLS
    CALLS += 1  # would happen once compiled, at every call eagerly
    return x + 1.0


def test_bad_input_gets_clear_errors():
    with pytest.raises(TypeError, match="needs a function or a Module"):
        jit.compile(3)
    with pytest.raises(ValueError, match="unknown pass 'fusion'"):
        jit.compile(lambda x: x, passes=["fusion"])
    with pytest.raises(TypeError, match="returns a object"):
        jit.compile(lambda x: object())(rand(2))
    with pytest.raises(jit.SideEffectError, match="assigns the global 'CALLS'"):
        jit.compile(_counting)(rand(2))

    class Counting(lm.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", lm.zeros(()))

        def forward(self, x):
            self.count = self.count + 1  # in place (count.add_(1)) replays at each call
            return x + 1.0

    model = Counting()
    with pytest.raises(jit.SideEffectError, match="assigns the module's tensor count"):
        jit.compile(model)(rand(2))
    assert model.count.device.name == "cpu" and float(model.count) == 0  # restored
    with pytest.raises(RuntimeError, match="already running"):
        jit.trace(lambda x: jit.trace(lambda y: y + 1, x), rand(2))


def test_a_compiled_module_sees_every_change_of_its_tree():
    """Note [Module generation]: the guard rereads the module only when some module
    changed, and every path of change counts: a submodule's mode, a replaced buffer
    or child, a table written directly."""
    model = lm.nn.Sequential(lm.nn.Linear(3, 4), lm.nn.Dropout(0.5), lm.nn.Linear(4, 2))
    compiled = jit.compile(model)
    x = rand(5, 3)
    with lm.no_grad():
        model.eval()
        evaluated = model(x)
        equal(compiled(x), evaluated)
        model[1].train()  # a submodule only: dropout draws again
        assert not np.array_equal(compiled(x).numpy(), evaluated.numpy())
        assert len(compiled._compiled.variants) == 2
        model[1].eval()
        setattr(model, "2", lm.nn.Linear(4, 2))  # a new child
        equal(compiled(x), model(x))
        model[0]._parameters["bias"] = lm.nn.Parameter(lm.ones((4,)))
        equal(compiled(x), model(x))
        compiled(x)
        model.eval()  # the new child was training
        before = lm.nn.modules.generation
        model.eval()  # every module evaluating already: nothing to read again
        model[1].eval()
        assert lm.nn.modules.generation == before
        model[1].train()
        assert lm.nn.modules.generation > before
    assert len(compiled._compiled.variants) == 4


@pytest.mark.core_independent  # Note [Core-independent tests]
def test_a_convolution_node_keeps_its_plan_per_size_and_thread_count(monkeypatch):
    """Note [Kernels of plans]: a plan's convolution nodes call their kernel's
    ``for_plan()`` form, made once per node, which keeps its geometry between calls
    keyed by the sizes (here a symbolic batch) and the thread count (Note
    [Convolutions of a plan]): every call still equals eager."""
    conv = sys.modules["lamina.backends.numba_cpu.nn.conv"]
    made = []
    real = conv.conv2d_relu.for_plan
    monkeypatch.setattr(conv.conv2d_relu, "for_plan", lambda: made.append(1) or real())
    nn = lm.nn
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1), nn.ReLU())
    model.eval()
    compiled = lm.jit.compile(model, dynamic=True, layout=None)
    threads = lm.get_num_threads()
    try:
        for batch, count in ((2, 1), (5, 1), (3, 1), (4, 1), (4, 2), (6, 2)):
            lm.set_num_threads(count)
            x = np.random.default_rng(batch).standard_normal((batch, 3, 10, 10))
            x = lm.asarray(x.astype(np.float32))
            with lm.no_grad():
                np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), 1e-5, 1e-6)
    finally:
        lm.set_num_threads(threads)
    assert made and len(made) % 2 == 0  # both convolutions of each plan made
