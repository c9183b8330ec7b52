"""lamina.jit's symbolic sizes (Note [Symbolic sizes]): once a function is dynamic, one
graph serves every size of a kind without a trace, equal to eager at each; a call that
breaks a relation the graph relied on (a size 1, two sizes no longer equal) gets a
variant of its own, and a graph whose sizes are no products of symbols stays one
variant per size."""

import copy
import functools

import numpy as np

import lamina as lm
from lamina import jit
from lamina.jit import tracer

F = lm.nn.functional


def rand(*shape, seed=0):
    return lm.asarray(np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32))


def close(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)


def counting(fn):
    """``fn``, and a list that counts its runs under a trace."""
    traces = []

    @functools.wraps(fn)
    def counted(*args):
        if tracer.current() is not None:
            traces.append(1)
        return fn(*args)

    return counted, traces


def test_one_graph_serves_every_size_reductions_over_the_symbol_included():
    def f(x, y, b):  # sum, mean and softmax along the symbolic axis, fused loops over it
        rows = lm.arange(x.shape[0], dtype=lm.float32)[:, None]  # a creation of its size
        z = (x * y + b).exp() + rows  # b broadcast
        return z.sum(0) + x.mean(0) - F.softmax(x, 0)[-1] * y.sum()

    counted, traces = counting(f)
    compiled = jit.compile(counted)
    b = rand(4, seed=1)
    for n in (2, 3, 5, 7, 64):
        x, y = rand(n, 4), rand(n, 4, seed=n)
        before = len(traces)
        for _ in range(2):  # the general path, then the hot one (Note [Guard tokens])
            close(compiled(x, y, b), f(x, y, b))
        if n > 3:
            assert len(traces) == before  # no trace: the symbolic graph's
    (graph,) = [g for g in compiled.graphs if "s0" in str(g)]
    assert str(graph).startswith("graph(x0: float32[s0, 4], x1: float32[s0, 4], x2: float32[4]):")
    assert len(compiled.recompiles) == 1 and "x dimension 0 is s0" in compiled.recompiles[0]
    assert "symbolic: y dimension 0 is s0" in str(jit.explain(compiled, x, y, b))


def test_a_training_step_at_every_batch_size_equals_eager_step_by_step():
    lm.random.seed(0)
    eager = lm.nn.Sequential(lm.nn.Linear(6, 8), lm.nn.Tanh(), lm.nn.Linear(8, 3))
    model = copy.deepcopy(eager)
    counted, traces = counting(lambda x, y: F.cross_entropy(model(x), y))
    compiled = jit.compile(counted)
    optimizers = [lm.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    for step, n in enumerate((4, 5, 9, 2, 13, 4)):
        if step == 2:
            traced = len(traces)
        x, y = rand(n, 6, seed=n), lm.asarray(np.arange(n) % 3)
        losses = []
        for loss_of, optimizer in zip(
            (lambda x, y: F.cross_entropy(eager(x), y), compiled), optimizers
        ):
            optimizer.zero_grad()
            loss = loss_of(x, y)
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
        np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)
        for a, b in zip(eager.parameters(), model.parameters()):
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
    assert len(traces) == traced  # sizes 9, 2, 13: the symbolic graphs, forward and backward


def test_a_call_breaking_the_relations_of_the_trace_gets_a_variant_of_its_own():
    compiled = jit.compile(lambda x, y: x * y + x)
    for n in (3, 5, 7):
        x, y = rand(n, 2), rand(n, 2, seed=1)
        close(compiled(x, y), x * y + x)
    assert len(compiled.recompiles) == 1
    x, one = rand(7, 2), rand(1, 2, seed=1)  # broadcasting where the trace had n
    close(compiled(x, one), x * one + x)
    close(compiled(one, x), one * x + one)
    sums = jit.compile(lambda x, y: x.sum(0) + y.sum(0) * 2.0)
    for n in (3, 5):  # equal sizes: one symbol
        x, y = rand(n, 2), rand(n, 2, seed=1)
        close(sums(x, y), x.sum(0) + y.sum(0) * 2.0)
    x, y = rand(4, 2), rand(6, 2, seed=1)  # no longer equal
    close(sums(x, y), x.sum(0) + y.sum(0) * 2.0)
    assert len(sums.recompiles) == 2
    grid = jit.compile(lambda x: x.sum(1) * x.shape[0])
    for rows, columns in ((3, 4), (5, 7), (9, 11), (8, 8), (7, 3)):  # two symbols
        x = rand(rows, columns)
        close(grid(x), x.sum(1) * rows)


def test_a_bounded_slice_along_a_symbol_stays_specialized():
    # x[:16] has min(n, 16) elements: n at three traces below 16, and 16 after them
    def head_mean(x):
        head = x[:16]
        return head.sum() / head.shape[0]

    for f, sizes in (
        (head_mean, (5, 8, 20, 40)),
        (lambda x: x[:4] * 2.0 + 1.0, (5, 8, 3, 9)),  # 4 elements, then 3
        (lambda x: x[-3:] * 2.0, (5, 8, 2, 9)),
    ):
        compiled = jit.compile(f)
        for n in sizes:
            x = rand(n)
            close(compiled(x), f(x))
        assert "sizes stay specialized" in compiled.recompiles[0]
    columns = jit.compile(lambda x: x[:, :3].sum(1))  # a fixed bound on a fixed size
    for n in (5, 8, 3, 9):
        x = rand(n, 6)
        close(columns(x), x[:, :3].sum(1))
    assert "symbolic from now on" in columns.recompiles[0]


def test_sizes_no_symbol_explains_stay_specialized_and_breaks_still_work():
    differences = jit.compile(lambda x: x[1:] - x[:-1])  # n - 1: no product of symbols
    for n in (3, 5, 7):
        x = rand(n)
        close(differences(x), x[1:] - x[:-1])
    assert "sizes stay specialized" in differences.recompiles[0]
    # sizes that agree at the two traced sizes only: a third trace sees them
    for f in (lambda x: x[16:] * 2.0, lambda x: x[: x.shape[0] // 2] * 2.0):
        compiled = jit.compile(f)
        for n in (20, 23, 8, 40):
            x = rand(n)
            close(compiled(x), f(x))
        assert "sizes stay specialized" in compiled.recompiles[0]

    def breaking(x):
        y = x * 2.0
        if float(y.sum()) > 0:
            return y.exp()
        return -y

    compiled = jit.compile(breaking)
    for n in (3, 5, 7):
        x = rand(n, seed=n)
        close(compiled(x), breaking(x))
