"""Note [Fused epilogues]: conv2d_relu and linear_relu equal relu of conv2d and of linear
bit for bit -- values, signs of zeros, NaNs, layouts and gradients -- on every path a
convolution takes (Winograd, im2col, space-to-depth, depthwise, groups, small planes,
split by images), and agree with the oracle."""

import fused
import numpy as np
import pytest

import lamina as lm
from lamina.backends.numba_cpu.nn import conv, winograd
from lamina.dispatch import rewrites
from lamina.dispatch.rewrites import REWRITES

F = lm.nn.functional

# (id, input shape, weight shape, conv2d keywords, whether Winograd takes it in float64)
CASES = [
    ("winograd_3x3", (2, 8, 9, 10), (8, 8, 3, 3), dict(padding=1), True),
    ("winograd_groups", (1, 16, 8, 8), (16, 8, 3, 3), dict(padding=1, groups=2), True),
    ("space_to_depth", (2, 6, 19, 19), (8, 6, 7, 7), dict(stride=2, padding=3), True),
    ("direct_few_channels", (2, 3, 19, 19), (8, 3, 7, 7), dict(stride=2, padding=3), False),
    ("im2col_flat", (2, 6, 11, 12), (4, 6, 3, 3), dict(padding=1), False),
    ("im2col_strided_dilated", (2, 3, 13, 11), (5, 3, 3, 2), dict(stride=2, dilation=2), False),
    ("small_planes_groups", (3, 4, 6, 6), (6, 2, 3, 3), dict(groups=2), False),
    ("pointwise", (2, 5, 6, 7), (4, 5, 1, 1), {}, False),
    ("depthwise_multiplier", (2, 3, 7, 7), (6, 1, 3, 3), dict(padding=1, groups=3), False),
]


def _data(shape, dtype, seed, special=False):
    values = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    if special and values.size:
        values.flat[::7] = 0.0
        values.flat[5] = np.nan
    return values


def _run(fn, leaves, grad_seed=9):
    """fn's result and the gradients of all leaves for a fixed output gradient."""
    leaves = [None if t is None else t.detach().requires_grad_() for t in leaves]
    out = fn(*leaves)
    out.backward(lm.asarray(_data(out.shape, out.dtype.np, grad_seed)))
    return [out, *(t.grad for t in leaves if t is not None)]


def _assert_identical(got, want):
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.ndim == 4:
            assert F.layout_of(g) == F.layout_of(w)
        g, w = g.numpy(), w.numpy()
        np.testing.assert_array_equal(g, w)  # NaN where the other has NaN
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))


@pytest.fixture
def winograd_forwards(monkeypatch):
    calls, real = [], winograd.forward
    monkeypatch.setattr(winograd, "forward", lambda *a: calls.append(a[6]) or real(*a))
    return calls


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f4", "f8"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv2d_relu_is_relu_of_conv2d_bit_for_bit(case, layout, dtype, winograd_forwards):
    _, xshape, wshape, kwargs, by_winograd = case
    x = F.to_layout(lm.asarray(_data(xshape, dtype, 0)), layout)
    w, b = lm.asarray(_data(wshape, dtype, 1)), lm.asarray(_data(wshape[:1], dtype, 2))
    fused_conv = lambda x, w, b: fused.conv2d_relu(x, w, b, **kwargs)
    plain = lambda x, w, b: F.relu(F.conv2d(x, w, b, **kwargs))
    got = _run(fused_conv, [x, w, b])
    if by_winograd and dtype == np.float64:
        assert winograd_forwards[0] == 0.0  # relu's floor reached the output transform
    _assert_identical(got, _run(plain, [x, w, b]))
    assert 0 < (got[0].numpy() == 0).mean() < 1  # some outputs clipped, some kept
    with lm.backends.use("numpy_ref"):
        want = _run(fused_conv, [x, w, b])
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for g, r in zip(got, want):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=tol, atol=tol)


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES[:1] + CASES[3:5] + CASES[-1:], ids=lambda c: c[0])
def test_conv2d_relu_of_nans_without_a_bias(case, layout):
    """A NaN input makes NaN outputs where relu keeps them, on every path (Winograd's
    falls back to im2col: Note [Winograd and infinities])."""
    _, xshape, wshape, kwargs, _ = case
    x = F.to_layout(lm.asarray(_data(xshape, np.float64, 0, special=True)), layout)
    w = lm.asarray(_data(wshape, np.float64, 1))
    with lm.no_grad():
        got = fused.conv2d_relu(x, w, None, **kwargs)
        want = F.relu(F.conv2d(x, w, None, **kwargs))
    _assert_identical([got], [want])
    assert np.isnan(got.numpy()).any()


@pytest.mark.parametrize("layout", [conv.NCHW, conv.NHWC])
def test_the_epilogue_is_relu_of_the_sum_with_the_bias(layout):
    """Without a bias it adds -0.0, which changes nothing: -0.0 stays -0.0 as relu
    leaves it (+0.0 would not); NaN passes; the plain floor raises nothing."""
    values = np.array([-0.0, 0.0, -1.5, 2.0, np.nan, -np.inf, np.inf, -1e-300])
    out = values.reshape(1, 2, 2, 2)  # two channels, whichever axis holds them
    bias = np.array([0.5, -3.0])
    channel = (np.arange(8).reshape(1, 2, 2, 2) // 4) if layout == conv.NCHW else np.arange(8) % 2
    for b, floor in [(None, conv.RELU), (bias, conv.RELU), (bias, conv.NO_FLOOR)]:
        got = out.copy()
        conv._epilogue(got, b, layout, floor)
        summed = values if b is None else values + bias[channel.reshape(-1)]
        want = np.where(summed < floor, floor, summed).reshape(out.shape)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.core_independent  # Note [Core-independent tests]
def test_conv2d_relu_in_parts_equals_relu_of_conv2d(monkeypatch):
    """Two threads run a big convolution's images in two parts (Note [Split
    convolutions]), bias and relu added to each."""
    before = lm.get_num_threads()
    lm.set_num_threads(2)
    try:
        for layout in ("NCHW", "NHWC"):
            x = F.to_layout(lm.asarray(_data((4, 16, 24, 24), np.float32, 0)), layout)
            w, b = (
                lm.asarray(_data((16, 16, 3, 3), np.float32, 1)),
                lm.asarray(_data((16,), np.float32, 2)),
            )
            for stride in (1, 2):  # Winograd, then im2col
                with lm.no_grad():
                    got = fused.conv2d_relu(x, w, b, stride=stride, padding=1)
                    want = F.relu(F.conv2d(x, w, b, stride=stride, padding=1))
                _assert_identical([got], [want])
    finally:
        lm.set_num_threads(before)


def test_conv2d_relu_of_an_empty_batch_and_of_no_input_channels():
    w, b = lm.asarray(_data((4, 3, 3, 3), np.float64, 1)), lm.asarray(_data((4,), np.float64, 2))
    empty = fused.conv2d_relu(lm.zeros((0, 3, 5, 5), dtype="float64"), w, b, padding=1)
    assert empty.shape == (0, 4, 5, 5)
    nothing = lm.zeros((2, 0, 4, 4), dtype="float64")
    got = fused.conv2d_relu(nothing, lm.zeros((4, 0, 3, 3), dtype="float64"), b)
    np.testing.assert_array_equal(
        got.numpy(), np.maximum(b.numpy(), 0)[:, None, None] + np.zeros((2, 4, 2, 2))
    )


# (id, input, weight shape, bias): fewer rows than features (the transposed product),
# more rows, a vector, a non-contiguous input, an empty batch
LINEAR_CASES = [
    ("few_rows", lambda: _data((3, 6), np.float64, 0), (8, 6), True),
    ("many_rows", lambda: _data((2, 9, 5), np.float32, 0), (4, 5), True),
    ("vector_no_bias", lambda: _data((6,), np.float64, 0, special=True), (5, 6), False),
    ("transposed", lambda: _data((5, 7), np.float32, 0).T, (3, 5), True),
    ("empty", lambda: _data((0, 4), np.float64, 0), (3, 4), True),
]


@pytest.mark.parametrize("case", LINEAR_CASES, ids=[c[0] for c in LINEAR_CASES])
def test_linear_relu_is_relu_of_linear_bit_for_bit(case):
    _, make, wshape, with_bias = case
    x = lm.asarray(make())
    w = lm.asarray(_data(wshape, x.dtype.np, 1))
    b = lm.asarray(_data(wshape[:1], x.dtype.np, 2)) if with_bias else None
    got = _run(fused.linear_relu, [x, w, b])
    _assert_identical(got, _run(lambda x, w, b: F.relu(F.linear(x, w, b)), [x, w, b]))
    with lm.backends.use("numpy_ref"):
        want = _run(fused.linear_relu, [x, w, b])
    for g, r in zip(got, want):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-5, atol=1e-5, equal_nan=True)


def test_the_rewrites_are_declared_exact():
    for name, pattern in (("conv2d_relu", ("conv2d", "relu")), ("linear_relu", ("linear", "relu"))):
        assert REWRITES[name].exact and REWRITES[name].pattern == pattern
        assert rewrites.match([*pattern, "relu"]) is REWRITES[name]
