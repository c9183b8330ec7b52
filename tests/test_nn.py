"""lamina.nn.functional (issue 13): every primitive against numpy_ref's plain NumPy
oracle, forward and backward, in both memory layouts (NCHW and channels-last), over
stride / padding / dilation / groups / ceil_mode / count_include_pad and odd sizes;
layouts kept; bad input refused before any kernel runs; the parallel kernels equal the
serial ones; and, when PyTorch is importable, values and gradients equal PyTorch's.

Gradients against finite differences (gradcheck and gradgradcheck, float64) are
test_autograd.py's SAMPLES. Shapes are few and small and mostly float64, the dtype the
rest of the suite compiles kernels for; one sweep runs the production dtype, float32.
"""

import itertools

import fused
import numpy as np
import pytest

import lamina as lm
from lamina.backends.numba_cpu import blas, gemm
from lamina.backends.numba_cpu.nn import conv, filter_cache, pooling, winograd
from lamina.backends.numba_cpu.nn.layout import transpose_tiles
from lamina.backends.threads import PARALLEL_ELEMENTS
from lamina.dispatch import memory
from lamina.dispatch.decompositions import DECOMPOSITIONS
from lamina.dispatch.schema import OPERATORS

F = lm.nn.functional
RNG = np.random.default_rng(13)


def image(shape=(2, 4, 7, 6), layout="NCHW", dtype=np.float64, seed=0, requires_grad=False):
    data = np.random.default_rng(seed).uniform(-1.0, 1.0, shape).astype(dtype)
    x = lm.asarray(data)
    if layout == "NHWC":
        x = F.to_layout(x, "NHWC")
    assert F.layout_of(x) == layout
    return x.requires_grad_() if requires_grad else x


def param(shape, seed=1, dtype=np.float64, lo=-1.0, hi=1.0):
    data = np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)
    return lm.asarray(data, requires_grad=True)


def _outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _run(fn, inputs):
    """fn's outputs and the gradients of a weighted sum of them (weights fixed), with
    fresh leaves made from ``inputs`` (tensors or constants)."""
    leaves = [
        x.detach().requires_grad_() if isinstance(x, lm.Tensor) and x.requires_grad else x
        for x in inputs
    ]
    outs = _outputs(fn(*leaves))
    total = 0.0
    for k, o in enumerate(outs):
        if o.dtype.kind == "f" and o.requires_grad:
            w = np.linspace(0.5, 1.5, o.size).reshape(o.shape) * (k + 1)
            total = total + lm.sum(o * lm.asarray(w.astype(o.dtype.np)))
    needs = [x for x in leaves if isinstance(x, lm.Tensor) and x.requires_grad]
    grads = lm.autograd.grad(total, needs, allow_unused=True) if needs else []
    return outs, grads


def check_against_oracle(fn, inputs, rtol=1e-10, atol=1e-12):
    """numba_cpu and numpy_ref agree on fn's outputs (values, dtypes, layouts) and on the
    gradients of every input that requires grad."""
    outs, grads = _run(fn, inputs)
    with lm.backends.use("numpy_ref"):
        want_outs, want_grads = _run(fn, inputs)
    assert len(outs) == len(want_outs)
    for got, want in zip(outs, want_outs):
        assert got.shape == want.shape and got.dtype == want.dtype
        if got.ndim == 4:
            assert F.layout_of(got) == F.layout_of(want)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=rtol, atol=atol)
    for got, want in zip(grads, want_grads):
        assert (got is None) == (want is None)
        if got is not None:
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=rtol, atol=atol)
    return outs


def _kw(**kwargs):
    return kwargs


# (id, fn, inputs(layout)): each runs on both backends, in both layouts
# on 6 input channels: more than run direct (Note [Direct convolution of few channels])
CONV_CASES = [
    ("plain", _kw(padding=1), (4, 6, 3, 3)),
    ("stride2_odd", _kw(stride=2, padding=(2, 1)), (3, 6, 3, 2)),
    ("dilated_groups", _kw(padding=2, dilation=(2, 1), groups=2), (6, 3, 3, 3)),
    ("same_even_kernel", _kw(padding="same"), (3, 6, 2, 4)),
    ("valid_depthwise", _kw(padding="valid", groups=6), (6, 1, 3, 3)),
    ("pointwise", _kw(), (5, 6, 1, 1)),
    ("pointwise_groups", _kw(groups=2), (4, 3, 1, 1)),
    ("strided_1x1", _kw(stride=(2, 3)), (3, 6, 1, 1)),
    # kernel rows wider than the image, cut at both ends (Note [Kernel rows as runs])
    ("wide_kernel_rows", _kw(stride=(1, 2), padding=(1, 3)), (3, 6, 3, 7)),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv2d_forward_and_backward_match_the_oracle(case, layout):
    _, kwargs, wshape = case
    x = image((2, 6, 7, 6), layout, requires_grad=True)
    w, b = param(wshape), param((wshape[0],), seed=2)
    outs = check_against_oracle(lambda x, w, b: F.conv2d(x, w, b, **kwargs), [x, w, b])
    assert F.layout_of(outs[0]) == layout


# Note [Direct convolution of few channels]: (id, input shape, weight shape, conv2d's
# keywords): output channels short of a vector and more than four vectors, output rows
# that are no multiple of four pixels, strides, a dilation along the height, padding
# beyond the kernel's reach, an output row that reads only padding
DIRECT_CASES = [
    ("stem_7x7_s2", (2, 3, 13, 11), (5, 3, 7, 7), _kw(stride=2, padding=3)),
    ("vectors_3x3", (1, 4, 6, 9), (70, 4, 3, 3), _kw(padding=1)),
    (
        "dilated_rows",
        (2, 2, 9, 8),
        (40, 2, 3, 2),
        _kw(stride=(3, 1), padding=(2, 0), dilation=(2, 1)),
    ),
    ("padding_only", (1, 2, 1, 5), (3, 2, 1, 2), _kw(stride=(4, 1), padding=(5, 3))),
]


@pytest.fixture
def direct_calls(monkeypatch):
    """The direct kernels called ("forward", "weight_grad"), in order."""
    calls = []
    for name in ("forward", "weight_grad"):
        real = getattr(conv.direct, name)
        monkeypatch.setattr(
            conv.direct, name, lambda *a, _f=real, _n=name: calls.append(_n) or _f(*a)
        )
    return calls


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", DIRECT_CASES, ids=[c[0] for c in DIRECT_CASES])
def test_few_channels_run_direct_and_match_the_oracle(case, layout, dtype, direct_calls):
    """Forward (with a bias, without one, and relu'd) and weight gradient through the
    direct kernels, and the input gradient, against the oracle in both layouts; an
    infinite weight (forward) or gradient (weight gradient) gives the oracle's NaN
    where it meets the padding (both multiply its zeros)."""
    _, xs, ws, kwargs = case
    x, w, b = (
        image(xs, layout, dtype, requires_grad=True),
        param(ws, dtype=dtype),
        param(ws[:1], 2, dtype),
    )
    rtol = 1e-10 if dtype == np.float64 else 2e-5
    check_against_oracle(lambda x, w, b: F.conv2d(x, w, b, **kwargs), [x, w, b], rtol, rtol)
    check_against_oracle(lambda x, w: F.conv2d(x, w, **kwargs), [x, w], rtol, rtol)
    relu = check_against_oracle(
        lambda x, w: fused.conv2d_relu(x, w, b, **kwargs), [x, w], rtol, rtol
    )
    assert direct_calls == ["forward", "weight_grad"] * 3 and (relu[0].numpy() >= 0).all()
    infinite = param(ws, dtype=dtype)
    infinite.detach()[0, 0, 0, 0] = np.inf
    with np.errstate(invalid="ignore"):
        outs = check_against_oracle(
            lambda x, w: F.conv2d(x, w, **kwargs), [x, infinite], rtol, rtol
        )
    assert not np.isfinite(outs[0].numpy()).all()
    grads = []
    for backend in ("numba_cpu", "numpy_ref"):
        with lm.backends.use(backend), np.errstate(invalid="ignore"):
            w = param(ws, dtype=dtype)
            out = F.conv2d(x.detach(), w, **kwargs)
            g = np.ones(out.shape, dtype)
            g[0, 0, 0, 0] = np.inf
            out.backward(F.to_layout(lm.asarray(g), layout))
            grads.append(w.grad.numpy())
    assert not np.isfinite(grads[0]).all() and direct_calls[-1] == "weight_grad"
    np.testing.assert_array_equal(np.isnan(grads[0]), np.isnan(grads[1]))
    np.testing.assert_array_equal(np.isinf(grads[0]), np.isinf(grads[1]))


def test_conv2d_unbatched_and_empty_batch():
    x, w = image((4, 5, 6), requires_grad=True), param((3, 4, 3, 3))
    out = check_against_oracle(lambda x, w: F.conv2d(x, w, padding=1), [x, w])[0]
    assert out.shape == (3, 5, 6)
    empty = F.conv2d(lm.zeros((0, 4, 5, 6), dtype=w.dtype), w.detach(), padding=1)
    assert empty.shape == (0, 3, 5, 6) and empty.dtype == w.dtype


def test_conv2d_on_a_non_contiguous_input():
    base = image((2, 4, 9, 8))
    x = base[:, :, 1:8, ::2]  # neither layout: computed on an NCHW copy
    assert F.layout_of(x) is None
    w = param((3, 4, 3, 3))
    out = check_against_oracle(lambda w: F.conv2d(x, w, stride=2, padding=1), [w])[0]
    want = F.conv2d(lm.asarray(x.numpy().copy()), w.detach(), stride=2, padding=1)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-12)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_backward_operators_match_the_oracle(layout):
    x = image((2, 4, 7, 6), layout, requires_grad=True)
    w = param((6, 2, 3, 2))
    args = ((2, 1), (1, 2, 0, 1), (1, 2), 2)
    g = image((2, 6, 4, 5), layout, seed=3, requires_grad=True)
    check_against_oracle(lambda g, w: OPERATORS["conv2d_backward_input"](g, w, x, *args), [g, w])
    check_against_oracle(
        lambda g, x: OPERATORS["conv2d_backward_weight"](g, x, w.shape, *args, True), [g, x]
    )
    check_against_oracle(  # no grad_bias: an empty second result, no adjoint through it
        lambda g, x: OPERATORS["conv2d_backward_weight"](g, x, w.shape, *args, False)[0], [g, x]
    )


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_convolution_without_bias_sums_no_bias_gradient(layout, monkeypatch):
    """Its backward pass asks for the weight's gradient alone: grad is not summed into a
    bias gradient nobody reads (a pass over grad); with a bias it is, and equals grad's
    sum."""
    sums = []
    bias_grad = conv._bias_grad
    monkeypatch.setattr(conv, "_bias_grad", lambda *a: sums.append(a) or bias_grad(*a))
    x, w = image((2, 4, 7, 6), layout), param((6, 4, 3, 3))
    g = image((2, 6, 5, 4), layout, seed=3)
    w.requires_grad_()
    F.conv2d(x, w).backward(g)
    assert not sums
    alone = w.grad.numpy().copy()
    w.grad, b = None, param((6,), seed=2).requires_grad_()
    F.conv2d(x, w, b).backward(g)
    assert len(sums) == 1
    np.testing.assert_array_equal(w.grad.numpy(), alone)
    np.testing.assert_allclose(b.grad.numpy(), g.numpy().sum(axis=(0, 2, 3)), rtol=1e-12)
    geometry = ((1, 1), (0, 0, 0, 0), (1, 1), 1)
    gw, gb = OPERATORS["conv2d_backward_weight"](g, x, w.shape, *geometry, False)
    assert gb.shape == (0,) and gb.dtype == g.dtype
    np.testing.assert_array_equal(gw.numpy(), alone)


@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 5)], ids=["vector", "matrix", "batch"])
def test_linear_matches_the_oracle(shape):
    x, w, b = param(shape, seed=0), param((4, 5)), param((4,), seed=2)
    out = check_against_oracle(F.linear, [x, w, b])[0]
    assert out.shape == shape[:-1] + (4,)
    check_against_oracle(lambda x, w: F.linear(x, w), [x, w])


POOL_CASES = [
    ("plain", _kw(kernel_size=2)),
    ("overlapping_padded", _kw(kernel_size=3, stride=2, padding=1)),
    ("ceil_mode", _kw(kernel_size=3, stride=2, ceil_mode=True)),
    ("dilated_rect", _kw(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0), dilation=(2, 1))),
    ("ceil_padded", _kw(kernel_size=(3, 2), stride=2, padding=1, ceil_mode=True)),
    ("dilated_columns", _kw(kernel_size=3, padding=1, dilation=(1, 3))),
    ("gaps_padded", _kw(kernel_size=3, stride=3, padding=1)),  # a last column no window covers
]


@pytest.fixture(params=["transposed", "direct"])
def nchw_indices(request, monkeypatch):
    """Either NCHW kernel of pooling with indices (Note [NCHW indices]), whatever the
    windows and widths."""
    monkeypatch.setattr(pooling, "_direct_nchw", lambda plane_bytes: request.param == "direct")
    return request.param


POOL_KERNELS = [("NCHW", "transposed"), ("NCHW", "direct"), ("NHWC", "transposed")]


@pytest.mark.parametrize(
    "layout, nchw_kernel", POOL_KERNELS, ids=["-".join(k) for k in POOL_KERNELS]
)
@pytest.mark.parametrize("case", POOL_CASES, ids=[c[0] for c in POOL_CASES])
@pytest.mark.parametrize("fn", [F.max_pool2d, F.min_pool2d], ids=["max", "min"])
def test_max_and_min_pool_match_the_oracle(fn, case, layout, nchw_kernel, monkeypatch):
    monkeypatch.setattr(pooling, "_direct_nchw", lambda plane_bytes: nchw_kernel == "direct")
    x = image((2, 3, 7, 6), layout, requires_grad=True)
    out, indices = check_against_oracle(lambda x: fn(x, **case[1], return_indices=True), [x])
    assert F.layout_of(out) == F.layout_of(indices) == layout
    assert indices.dtype == lm.int64
    # the values are the input's at the indices
    planes = x.numpy().reshape(2, 3, -1)
    picked = np.take_along_axis(planes, indices.numpy().reshape(2, 3, -1), axis=2)
    np.testing.assert_array_equal(picked.reshape(out.shape), out.numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", POOL_CASES, ids=[c[0] for c in POOL_CASES])
@pytest.mark.parametrize("fn", [F.max_pool2d, F.min_pool2d], ids=["max", "min"])
def test_channels_last_pooling_matches_the_oracle_bit_for_bit(fn, case, dtype):
    """Note [Extremes in registers]: 19 channels (whole vectors and a tail in either
    dtype) with NaNs, infinities and zeros of both signs (ties keep the first, the
    last NaN is the index), with and without indices, against numpy_ref."""
    rng = np.random.default_rng(5)
    data = rng.uniform(-1.0, 1.0, (2, 19, 7, 6))
    special = rng.random(data.shape)
    data[special < 0.3] = 0.0
    data[special < 0.15] = -0.0
    data[special > 0.97] = np.nan
    data[(special > 0.93) & (special <= 0.95)] = np.inf
    data[(special > 0.95) & (special <= 0.97)] = -np.inf
    x = F.to_layout(lm.asarray(data.astype(dtype)), "NHWC")
    got = [fn(x, **case[1]), *fn(x, **case[1], return_indices=True)]
    with lm.backends.use("numpy_ref"):
        want = [fn(x, **case[1]), *fn(x, **case[1], return_indices=True)]
    bits = np.dtype(dtype.__name__.replace("float", "int"))
    for g, w in zip(got, want):  # NaNs alike (the input's), and the signs of zeros
        assert F.layout_of(g) == "NHWC" and g.dtype == w.dtype
        view = bits if g.dtype == x.dtype else np.int64
        np.testing.assert_array_equal(g.numpy().view(view), w.numpy().view(view))


def test_max_pool_ties_and_nans_follow_pytorch(nchw_indices):
    x = lm.asarray(np.array([[[[1.0, 1.0, 0.0], [1.0, 0.5, 2.0], [np.nan, 3.0, 3.0]]]]))
    out, idx = F.max_pool2d(x, 2, 1, return_indices=True)
    assert idx.tolist() == [[[[0, 5], [6, 7]]]]  # the first maximum wins ties; NaN wins
    assert np.isnan(out.numpy()[0, 0, 1, 0]) and out.numpy()[0, 0, 0, 0] == 1.0
    nans = lm.asarray(np.array([[[[np.nan, 1.0, np.nan, 0.0]]]]))
    assert F.max_pool2d(nans, (1, 4), return_indices=True)[1].item() == 2  # the last NaN
    rows = lm.asarray(np.array([[[[0.0, np.nan], [np.nan, 1.0]]]]))
    assert F.max_pool2d(rows, 2, return_indices=True)[1].item() == 2  # in the last row too
    all_inf = lm.full((1, 1, 2, 2), -np.inf)
    out, idx = F.max_pool2d(all_inf, 2, return_indices=True)
    assert out.item() == -np.inf and idx.item() == 0  # the window's first position


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pool_scatter_and_gather_match_the_oracle(layout):
    x = image((2, 3, 7, 6), layout)
    _, indices = F.max_pool2d(x, 3, 2, padding=1, return_indices=True)
    g = image((2, 3, 4, 3), layout, seed=5, requires_grad=True)
    check_against_oracle(lambda g: OPERATORS["pool2d_scatter"](g, indices, x.shape), [g])
    xs = image((2, 3, 7, 6), layout, seed=6, requires_grad=True)
    check_against_oracle(lambda x: OPERATORS["pool2d_gather"](x, indices), [xs])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pool_scatter_zeroes_its_result_and_refuses_indices_outside_the_input(
    layout, threads, two_threads
):
    """The scatter kernel zeroes each image of the result itself and counts the
    indices it skips (pooling.scatter); 4 x 16 x 48 x 48 runs its prange variant. With
    the pool allocator (the C core), the result gets a buffer left full of NaNs."""
    lm.set_num_threads(threads)
    x = image((4, 16, 96, 96), layout, dtype=np.float32)
    _, indices = F.max_pool2d(x, 2, return_indices=True)
    g = image((4, 16, 48, 48), layout, dtype=np.float32, seed=3)
    if memory.AVAILABLE:
        lm.layers.enable("allocator")
        np.full(x.shape, np.nan, np.float32)  # back in the pool at once
        hits = lm.memory.stats()["hits"]
    try:
        got = OPERATORS["pool2d_scatter"](g, indices, x.shape).numpy()
        if memory.AVAILABLE:
            assert lm.memory.stats()["hits"] > hits
    finally:
        if memory.AVAILABLE:
            lm.layers.disable("allocator")
    want = np.zeros((4 * 16, 96 * 96), np.float32)
    rows = np.arange(4 * 16)[:, None]
    np.add.at(want, (rows, indices.numpy().reshape(64, -1)), g.numpy().reshape(64, -1))
    np.testing.assert_array_equal(got, want.reshape(x.shape))
    for bad in (-1, 96 * 96):
        data = indices.numpy().copy()
        data[3, 15, 47, 47] = bad
        wrong = lm.asarray(data) if layout == "NCHW" else F.to_layout(lm.asarray(data), "NHWC")
        with pytest.raises(ValueError, match=r"indices must be in \[0, 9216\)"):
            OPERATORS["pool2d_scatter"](g, wrong, x.shape)


AVG_CASES = [
    ("plain", _kw(kernel_size=2)),
    ("padded_include", _kw(kernel_size=3, stride=2, padding=1)),
    (
        "padded_exclude_ceil",
        _kw(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    ),
    ("ceil_include", _kw(kernel_size=(3, 2), stride=(2, 3), padding=(1, 1), ceil_mode=True)),
    ("divisor", _kw(kernel_size=(2, 3), padding=(1, 1), divisor_override=4)),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", AVG_CASES, ids=[c[0] for c in AVG_CASES])
def test_avg_pool_matches_the_oracle(case, layout):
    x = image((2, 3, 7, 6), layout, requires_grad=True)
    out = check_against_oracle(lambda x: F.avg_pool2d(x, **case[1]), [x])[0]
    assert F.layout_of(out) == layout


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("size", [(3, 4), 1, (None, 2), (7, 6)], ids=str)
def test_adaptive_avg_pool_matches_the_oracle(size, layout):
    x = image((2, 3, 7, 6), layout, requires_grad=True)
    out = check_against_oracle(lambda x: F.adaptive_avg_pool2d(x, size), [x])[0]
    assert F.layout_of(out) == layout or out.shape[-2:] == (1, 1)


def test_adaptive_max_pool_divisible_sizes():
    x = image((1, 2, 6, 4))
    np.testing.assert_array_equal(
        F.adaptive_max_pool2d(x, (3, 2)).numpy(), F.max_pool2d(x, (2, 2)).numpy()
    )
    assert F.adaptive_max_pool2d(x, (4, 3)).shape == (1, 2, 4, 3)  # any size: test_layers_conv


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize(
    "size, alpha, beta, k", [(5, 1e-4, 0.75, 1.0), (2, 0.5, 0.6, 2.0), (1, 0.3, 1.0, 1.0)]
)
def test_local_response_norm_matches_the_oracle(size, alpha, beta, k, layout):
    x = image((2, 6, 4, 5), layout, requires_grad=True)
    out = check_against_oracle(lambda x: F.local_response_norm(x, size, alpha, beta, k), [x])[0]
    assert F.layout_of(out) == layout


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "shape, size",
    [((2, 6, 4, 5), 5), ((2, 3, 4, 5), 8), ((1, 48, 7, 9), 4), ((2, 64, 32, 33), 5)],
    ids=["blocks", "window wider than channels", "even window", "parts on two threads"],
)
def test_channels_last_local_response_norm_equals_channels_first(shape, size, dtype, two_threads):
    """The same sums in the same order (Note [Channels-last LRN]): equal bit for bit,
    forward and backward, whatever the blocks of pixel rows and the parts."""
    results = []
    for layout in ("NCHW", "NHWC"):
        x = image(shape, layout, dtype=dtype, requires_grad=True)
        y = F.local_response_norm(x, size, 0.05, 0.75, 1.0)
        y.backward(lm.asarray(np.cos(np.arange(y.size, dtype=dtype)).reshape(shape)))
        assert F.layout_of(y) == layout
        results.append((y.detach().numpy(), x.grad.numpy()))
    for got, want in zip(results[1], results[0]):
        np.testing.assert_array_equal(got, want)


def test_local_response_norm_on_3d_and_5d_inputs():
    for shape in ((2, 5, 7), (1, 4, 2, 3, 2)):
        x = param(shape)
        check_against_oracle(lambda x: F.local_response_norm(x, 3, 0.5, 0.75, 1.5), [x])


# channels-first, planes of 15 pixels run as (N, C S) rows, of 42 channel by channel
# (Note [Batch norm of small planes])
@pytest.mark.parametrize("shape", [(3, 4, 5, 3), (2, 4, 6, 7)], ids=["rows", "channels"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
def test_batch_norm_matches_the_oracle(training, layout, shape):
    x = image(shape, layout, requires_grad=True)
    w, b = param((4,)), param((4,), seed=2)
    stats = []

    def run(x, w, b):
        rm = lm.asarray(np.array([0.1, -0.2, 0.3, 0.0]))
        rv = lm.asarray(np.array([0.5, 1.0, 2.0, 1.5]))
        out = F.batch_norm(x, rm, rv, w, b, training=training, momentum=0.3, eps=1e-3)
        stats.append((rm.numpy(), rv.numpy()))
        return out

    out = check_against_oracle(run, [x, w, b])[0]
    assert F.layout_of(out) == layout
    (mean, var), (want_mean, want_var) = stats
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12)  # running statistics updated alike
    np.testing.assert_allclose(var, want_var, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
@pytest.mark.parametrize("size", [(16, 20), (4, 5)], ids=["channels", "rows"])
def test_batch_norm_with_relu_is_relu_of_batch_norm_bit_for_bit(training, layout, dtype, size):
    """Note [Fused batch norm and relu]: outputs, all three gradients and the running
    statistics equal the two calls', on both backends; a NaN propagates as relu's.
    Channels-first, planes of 320 pixels run channel by channel, of 20 as (N, C S) rows
    (Note [Batch norm of small planes]); both vectorize."""
    data = np.random.default_rng(0).standard_normal((3, 4, *size)).astype(dtype)
    data[1, 2, 3, 4] = np.nan
    x = F.to_layout(lm.asarray(data), layout)
    w, b = param((4,), dtype=dtype), param((4,), seed=2, dtype=dtype)
    g = np.random.default_rng(3).standard_normal(data.shape).astype(dtype)

    def run(fuse):
        leaves = [t.detach().requires_grad_() for t in (x, w, b)]
        rm, rv = lm.asarray(np.array([0.1, -0.2, 0.3, 0.0], dtype)), lm.asarray(np.ones(4, dtype))
        args = (leaves[0], rm, rv, *leaves[1:], training, 0.3, 1e-3)
        out = fused.batch_norm_relu(*args) if fuse else F.relu(F.batch_norm(*args))
        out.backward(lm.asarray(g))
        return [out, *(t.grad for t in leaves), rm, rv]

    for backend in ("numba_cpu", "numpy_ref"):
        with lm.backends.use(backend):
            got, want = run(True), run(False)
        assert F.layout_of(got[0]) == layout
        assert np.isnan(got[0].numpy()[1, 2, 3, 4])
        assert (got[0].numpy()[~np.isnan(got[0].numpy())] >= 0).all()
        for a, b_ in zip(got, want):
            np.testing.assert_array_equal(a.numpy(), b_.numpy())


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_batch_norm_with_relu_matches_the_oracle(layout):
    x = image((3, 4, 5, 3), layout, requires_grad=True)
    w, b = param((4,)), param((4,), seed=2)

    def fn(x, w, b):
        return fused.batch_norm_relu(x, None, None, w, b, training=True)

    out = check_against_oracle(fn, [x, w, b])[0]
    assert 0 < (out.numpy() == 0).mean() < 1  # some values clipped, some kept


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 2, 2, 2)], ids=["2d", "3d", "5d"])
def test_batch_norm_of_other_ranks_matches_the_oracle(shape):
    x, w = param(shape, seed=0), param((3,))
    check_against_oracle(lambda x, w: F.batch_norm(x, None, None, w, None, training=True), [x, w])


def test_batch_norm_running_statistics_by_hand():
    data = np.arange(8.0).reshape(2, 2, 2, 1)  # float64, kept by lm.asarray
    rm, rv = lm.zeros(2, dtype=lm.float64), lm.ones(2, dtype=lm.float64)
    F.batch_norm(lm.asarray(data), rm, rv, training=True, momentum=0.5)
    channel = data.transpose(1, 0, 2, 3).reshape(2, -1)
    np.testing.assert_allclose(rm.numpy(), 0.5 * channel.mean(axis=1))
    np.testing.assert_allclose(rv.numpy(), 0.5 + 0.5 * channel.var(axis=1, ddof=1))


ACTIVATIONS = [
    ("relu", F.relu),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.2)),
    ("gelu", F.gelu),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
    ("sigmoid", F.sigmoid),
    ("softmax", lambda x: F.softmax(x, 1)),
    ("log_softmax_last", lambda x: F.log_softmax(x, -1)),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("fn", [a[1] for a in ACTIVATIONS], ids=[a[0] for a in ACTIVATIONS])
def test_activations_match_the_oracle_and_keep_the_layout(fn, layout):
    x = image((2, 3, 4, 5), layout, requires_grad=True)
    out = check_against_oracle(fn, [x])[0]
    assert F.layout_of(out) == layout


def test_activations_of_special_values():
    x = lm.asarray(np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -1.0, 2.0]))
    np.testing.assert_array_equal(F.relu(x).numpy(), [np.nan, 0.0, np.inf, 0.0, 0.0, 0.0, 2.0])
    np.testing.assert_array_equal(F.sigmoid(x).numpy()[1:3], [0.0, 1.0])
    assert np.isnan(F.softmax(lm.asarray([[np.nan, 1.0], [-np.inf, -np.inf]]), 1).numpy()).all()
    big = F.softmax(lm.asarray([[1000.0, 1000.0, -1000.0]]), 1).numpy()
    np.testing.assert_allclose(big, [[0.5, 0.5, 0.0]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_rows_of_special_values(dtype):
    """A row's maximum is a vectorized fold (kernels.extreme): a NaN or +inf in the vector
    loop or in its remainder makes the whole row NaN, as does a row of -inf only; a
    row of signed zeros is uniform. Against NumPy in float64; cross_entropy, which
    finds the maximum the same way, on the finite rows and on all."""
    n = 75  # a vector loop and a remainder
    a = np.random.default_rng(7).standard_normal((7, n)) * 30
    a[1, 3] = a[2, n - 1] = np.nan
    a[3, 40] = np.inf
    a[4] = -np.inf
    a[5] = np.where(np.arange(n) % 2, -0.0, 0.0)
    a = a.astype(dtype)
    with np.errstate(invalid="ignore"):
        m = a.astype(np.float64).max(axis=1, keepdims=True)
        logp = a - m - np.log(np.exp(a - m).sum(axis=1, keepdims=True))
    x, rtol = lm.asarray(a), 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(F.log_softmax(x, -1).numpy(), logp, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(F.softmax(x, 1).numpy(), np.exp(logp), rtol=rtol, atol=rtol)
    target = np.arange(7) * 9
    finite = [0, 5, 6]
    loss = F.cross_entropy(lm.asarray(a[finite]), lm.asarray(target[finite])).item()
    assert loss == pytest.approx(-logp[finite, target[finite]].mean(), rel=rtol)
    assert np.isnan(F.cross_entropy(x, lm.asarray(target)).item())


def test_activations_on_non_contiguous_inputs():
    base = param((4, 6), seed=3).detach()
    x = base[:, ::2].T  # neither contiguous nor a permuted dense block
    out = F.relu(x)
    np.testing.assert_array_equal(out.numpy(), np.maximum(x.numpy(), 0))
    grad = base[:, 1::2].T
    g = OPERATORS["relu_backward"](grad, out)
    np.testing.assert_array_equal(g.numpy(), np.where(out.numpy() > 0, grad.numpy(), 0))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses_match_the_oracle(reduction):
    logits = param((5, 4), seed=0)
    target = lm.asarray([0, 3, -100, 1, 3])
    weight = lm.asarray(np.array([0.5, 1.0, 2.0, 1.5]))
    check_against_oracle(
        lambda x: F.nll_loss(F.log_softmax(x, 1), target, weight, reduction=reduction), [logits]
    )
    spatial, target2 = param((2, 3, 2, 2), seed=4), lm.asarray(RNG.integers(0, 3, (2, 2, 2)))
    check_against_oracle(lambda x: F.nll_loss(x, target2, reduction=reduction), [spatial])
    a, b = param((3, 4), seed=5), param((3, 4), seed=6)
    check_against_oracle(lambda a, b: F.mse_loss(a, b, reduction), [a, b])


def test_cross_entropy_by_hand():
    logits = np.array([[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]])
    target = np.array([0, 2])
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    loss = F.cross_entropy(lm.asarray(logits), lm.asarray(target))
    assert loss.item() == pytest.approx(-logp[[0, 1], target].mean(), rel=1e-12)
    smooth = F.cross_entropy(lm.asarray(logits), lm.asarray(target), label_smoothing=0.3)
    want = 0.7 * -logp[[0, 1], target] + 0.3 * -logp.mean(axis=1)
    assert smooth.item() == pytest.approx(want.mean(), rel=1e-12)
    probs = np.array([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])
    soft = F.cross_entropy(lm.asarray(logits), lm.asarray(probs), reduction="none")
    np.testing.assert_allclose(soft.numpy(), -(probs * logp).sum(axis=1))


# ---------------------------------------------------------------- cross entropy's gradient

CE_BACKWARD = OPERATORS["cross_entropy_loss_backward"]


def _logits_and_targets(shape, dtype, ignored=(), transposed=False):
    """Logits of spread N(0, 4) (log-sum-exps up to ~15) and class targets, some -100."""
    rows, classes = shape
    rng = np.random.default_rng(rows * 31 + classes)
    data = rng.normal(0.0, 4.0, (classes, rows) if transposed else shape).astype(dtype)
    target = rng.integers(0, max(classes, 1), rows)
    target[list(ignored)] = -100
    x = lm.asarray(data)
    return (x.T if transposed else x), lm.asarray(target)


def _float64_gradient(x, target, g):
    """(softmax - onehot(target)) * g / count in the counted rows, 0 in the others."""
    x, t = x.numpy().astype(np.float64), target.numpy()
    e = np.exp(x - x.max(axis=1, keepdims=True))
    out = e / e.sum(axis=1, keepdims=True)
    counted = t != -100
    out[np.flatnonzero(counted), t[counted]] -= 1.0
    return out * np.where(counted, g / max(counted.sum(), 1), 0.0)[:, None]


CE_CASES = [  # (shape, ignored rows, transposed)
    ((128, 10), (3, 50, 51), False),
    ((6, 4), (2,), True),  # a transposed view
    ((3, 1100), (), False),  # rows over one block of the sum (Note [Softmax kernels])
    ((5, 1), (0,), False),
    ((0, 3), (), False),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, ignored, transposed", CE_CASES, ids=str)
def test_cross_entropy_gradient_is_its_composite_bit_for_bit(dtype, shape, ignored, transposed):
    """Note [One-pass cross entropy]: the fused gradient equals log_softmax,
    nll_loss_backward and log_softmax_backward in turn (its decomposition, autograd's
    formula before it) on dense rows bit for bit; on a transposed view the composite's
    log_softmax sums columns in float64 instead, within 20 eps of the coefficient
    g / count (measured: 16). Both are within the rounding of the log-sum-exp (~15:
    8 eps of each element, measured 12) of float64's softmax - onehot."""
    x, target = _logits_and_targets(shape, dtype, ignored, transposed)
    g = lm.asarray(np.asarray(0.75, dtype))
    got = CE_BACKWARD(g, x, target, -100)
    assert got.shape == shape and got.dtype == x.dtype
    composite = DECOMPOSITIONS["cross_entropy_loss_backward"]
    dense = lm.asarray(x.numpy().copy())
    np.testing.assert_array_equal(got.numpy(), composite(None, g, dense, target, -100).numpy())
    eps, scale = np.finfo(dtype).eps, 0.75 / max(shape[0] - len(ignored), 1)
    want = composite(None, g, x, target, -100).numpy()
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=20 * eps * scale)
    reference = _float64_gradient(x, target, 0.75)
    np.testing.assert_allclose(got.numpy(), reference, rtol=0, atol=20 * eps * scale)
    leaf = x.detach().requires_grad_()
    (F.cross_entropy(leaf, target) * 0.75).backward()  # eager autograd runs the fused op
    np.testing.assert_array_equal(leaf.grad.numpy(), got.numpy())


def test_cross_entropy_gradient_with_every_target_ignored_or_nan_logits():
    """As the composite (and PyTorch): every target ignored gives a zero gradient (the
    loss is NaN); a row with a NaN logit is NaN, ignored or not."""
    x, target = _logits_and_targets((4, 3), np.float32, ignored=range(4))
    g = lm.asarray(np.float32(1.0))
    np.testing.assert_array_equal(CE_BACKWARD(g, x, target, -100).numpy(), np.zeros((4, 3)))
    data = x.numpy().copy()
    data[1, 2] = data[2, 0] = np.nan
    x, target = lm.asarray(data), lm.asarray(np.array([0, -100, 1, 2]))
    got = CE_BACKWARD(g, x, target, -100).numpy()
    want = DECOMPOSITIONS["cross_entropy_loss_backward"](None, g, x, target, -100).numpy()
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[1:3]).all() and np.isfinite(got[[0, 3]]).all()


def test_cross_entropy_gradient_refuses_bad_targets_and_grads():
    x, target = _logits_and_targets((3, 4), np.float64)
    g = lm.asarray(np.float64(1.0))
    for bad in (4, -1):
        for backend in ("numba_cpu", "numpy_ref"):
            with lm.backends.use(backend), pytest.raises(ValueError, match=f"got {bad}"):
                CE_BACKWARD(g, x, lm.asarray(np.array([0, bad, 1])), -100)
    with pytest.raises(ValueError, match=r"cross_entropy: target values .* \[0, 4\)"):
        F.cross_entropy(x, lm.asarray(np.array([0, 4, 1])))
    with pytest.raises(ValueError, match=r"grad must have shape \(\)"):
        CE_BACKWARD(lm.ones(3, dtype=lm.float64), x, target, -100)
    with pytest.raises(TypeError, match="grad has dtype float32"):
        CE_BACKWARD(lm.asarray(np.float32(1.0)), x, target, -100)
    with pytest.raises(ValueError, match=r"input must be \(N, C\) logits"):
        CE_BACKWARD(g, lm.ones((2, 3, 4), dtype=lm.float64), target, -100)


def test_mean_nll_loss_with_every_target_ignored_is_nan():
    loss = F.nll_loss(lm.zeros((2, 3)), lm.asarray([-100, -100]))
    assert np.isnan(loss.item())


@pytest.mark.parametrize("source", ["NCHW", "NHWC"])
def test_to_layout_converts_and_keeps_values(source):
    x = image((2, 3, 4, 5), source)
    for target in ("NCHW", "NHWC"):
        y = F.to_layout(x, target)
        assert F.layout_of(y) == target and y.shape == x.shape
        np.testing.assert_array_equal(y.numpy(), x.numpy())
        assert np.shares_memory(y.numpy(), x.numpy()) == (source == target)
    check_against_oracle(lambda x: F.to_layout(x, "NHWC"), [x.detach().requires_grad_()])


# x's gradient does not depend on the layout its output's gradient arrives in: one in
# the other layout is transposed into the kernel's (tiles and tails: Note [Transposes])
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: F.conv2d(x, lm.ones((5, 12, 3, 3)), padding=1),
        lambda x: F.batch_norm(x, None, None, training=True),
        lambda x: F.batch_norm(x[:, :, :3, :3], None, None, training=True),  # as rows
        lambda x: F.max_pool2d(x, 2),
        lambda x: F.adaptive_avg_pool2d(x, 3),
    ],
    ids=["conv2d", "batch_norm", "batch_norm_rows", "max_pool2d", "adaptive_avg_pool2d"],
)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_gradient_in_the_other_layout_gives_the_same_input_gradient(fn, layout):
    x = image((2, 12, 9, 10), layout, dtype=np.float32, requires_grad=True)
    y = fn(x)
    g = np.random.default_rng(3).standard_normal(y.shape).astype(np.float32)
    other = "NHWC" if layout == "NCHW" else "NCHW"
    grads = [
        lm.autograd.grad(y, x, F.to_layout(lm.asarray(g), order), retain_graph=True)[0]
        for order in (layout, other)
    ]
    np.testing.assert_array_equal(grads[1].numpy(), grads[0].numpy())


def test_layout_of():
    assert F.layout_of(lm.zeros((2, 3, 4, 5))) == "NCHW"
    assert F.layout_of(lm.zeros((2, 3))) == "NCHW"
    assert F.layout_of(F.to_layout(lm.zeros((2, 1, 4, 5)), "NHWC")) == "NCHW"  # both: NCHW
    assert F.layout_of(lm.zeros((2, 3, 4, 6))[..., ::2]) is None


def test_a_channels_last_network_never_converts():
    """conv, batch norm, relu, pooling and LRN keep channels-last, forward and backward."""
    lm.random.seed(0)
    x = image((2, 3, 8, 8), "NHWC", requires_grad=True)
    w = param((4, 3, 3, 3))
    y = F.conv2d(x, w, padding=1)
    for step in (
        lambda t: F.batch_norm(t, None, None, training=True),
        F.relu,
        lambda t: F.local_response_norm(t, 3),
        lambda t: F.max_pool2d(t, 2),
        lambda t: F.avg_pool2d(t, 2),
    ):
        y = step(y)
        assert F.layout_of(y) == "NHWC"
    seen = []
    x.register_hook(lambda g: seen.append(F.layout_of(g)))  # the gradient reaching x
    lm.sum(y * y).backward()
    assert seen == ["NHWC"]


def test_dropout_is_reproducible_and_scaled():
    x = lm.ones((200, 50))
    lm.random.seed(3)
    a = F.dropout(x, 0.3)
    lm.random.seed(3)
    b = F.dropout(x, 0.3)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    kept = a.numpy() != 0
    assert 0.65 < kept.mean() < 0.75
    np.testing.assert_allclose(a.numpy()[kept], 1 / 0.7)
    assert F.dropout(x, 0.3, training=False) is x
    assert not F.dropout(x, 1.0).numpy().any()
    with pytest.raises(ValueError, match="p must be in"):
        F.dropout(x, 1.5)


def test_flatten():
    x = image((2, 3, 4, 5), "NHWC")
    y = F.flatten(x)
    assert y.shape == (2, 60) and y.is_contiguous()
    np.testing.assert_array_equal(y.numpy(), x.numpy().reshape(2, 60))
    assert F.flatten(x, 0, 1).shape == (6, 4, 5)
    with pytest.raises(ValueError, match="comes after"):
        F.flatten(x, 2, 1)


# ---------------------------------------------------------------- float32 (production)

FLOAT32 = [
    ("conv", lambda x, w: F.conv2d(x, w, stride=2, padding=1)),
    ("max_pool", lambda x, w: F.max_pool2d(x, 3, 2, padding=1)),
    ("avg_pool", lambda x, w: F.avg_pool2d(x, 3, 2, padding=1)),
    ("adaptive", lambda x, w: F.adaptive_avg_pool2d(x, 2)),
    ("global_avg", lambda x, w: F.adaptive_avg_pool2d(x, 1)),
    ("lrn", lambda x, w: F.local_response_norm(x, 5)),
    ("batch_norm", lambda x, w: F.batch_norm(x, None, None, training=True)),
    ("batch_norm_relu", lambda x, w: fused.batch_norm_relu(x, None, None, training=True)),
    ("relu", lambda x, w: F.relu(x)),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("fn", [f[1] for f in FLOAT32], ids=[f[0] for f in FLOAT32])
def test_float32_matches_the_oracle(fn, layout):
    x = image((2, 4, 7, 6), layout, dtype=np.float32, requires_grad=True)
    w = param((3, 4, 3, 3), dtype=np.float32)
    check_against_oracle(fn, [x, w], rtol=2e-4, atol=2e-5)


# ---------------------------------------------------------------- threads


@pytest.fixture
def im2col_on_few_channels(monkeypatch):
    """The im2col and taps paths for images of few channels, which run direct by
    default (Note [Direct convolution of few channels]): small shapes test them."""
    monkeypatch.setattr(conv.direct, "DIRECT_CHANNELS", 0)
    monkeypatch.setattr(conv.direct, "DIRECT_CHANNELS_LAST", {"forward": 0, "weight": 0})


@pytest.fixture
def two_threads():
    """Two lamina threads (BLAS one) for the test, both restored after."""
    blas = lm.backends.threads.blas_num_threads()
    before = lm.get_num_threads()
    lm.set_num_threads(2)
    yield
    lm.set_num_threads(before)
    lm.backends.threads._blas_libraries().limit(limits=blas[0])


# (id, fn, tolerance): float32 sums of 8192 terms in another order differ by 1e-5 of
# the scale; Winograd's (Note [Winograd]: this convolution's) by up to 2e-5
PARALLEL = [
    ("conv", lambda x, w: F.conv2d(x, w, padding=1), 3e-5),
    ("max_pool", lambda x, w: F.max_pool2d(x, 3, 2), 1e-5),
    ("avg_pool", lambda x, w: F.avg_pool2d(x, 3, 2), 1e-5),
    ("lrn", lambda x, w: F.local_response_norm(x, 5), 1e-5),
    ("batch_norm", lambda x, w: F.batch_norm(x, None, None, training=True), 1e-5),
    (
        "batch_norm_relu",
        lambda x, w: fused.batch_norm_relu(x, None, None, training=True),
        1e-5,
    ),
    ("relu", lambda x, w: F.relu(x), 1e-5),
]


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("fn, tol", [f[1:] for f in PARALLEL], ids=[f[0] for f in PARALLEL])
def test_parallel_kernels_equal_the_serial_ones(fn, tol, layout, two_threads):
    """Inputs of 2**17 elements run the prange variants (Note [Parallel threshold])."""
    x = image((2, 16, 64, 64), layout, dtype=np.float32, requires_grad=True)
    w = param((8, 16, 3, 3), dtype=np.float32)
    outs, grads = _run(fn, [x, w])
    lm.set_num_threads(1)
    want_outs, want_grads = _run(fn, [x, w])
    lm.set_num_threads(2)
    for got, want in zip(outs + list(grads), want_outs + list(want_grads)):
        if got is not None:
            scale = max(1.0, float(np.abs(want.numpy()).max()))
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=tol, atol=tol * scale)


@pytest.mark.core_independent  # Note [Core-independent tests]
def test_parallel_cross_entropy_gradient_equals_the_serial_one(two_threads):
    """Rows are independent: the prange variant's are the serial one's, bit for bit."""
    x, target = _logits_and_targets((140, 1000), np.float32, ignored=(7, 99))
    assert x.size >= PARALLEL_ELEMENTS
    g = lm.asarray(np.float32(1.0))
    got = CE_BACKWARD(g, x, target, -100).numpy()
    lm.set_num_threads(1)
    want = CE_BACKWARD(g, x, target, -100).numpy()
    lm.set_num_threads(2)
    np.testing.assert_array_equal(got, want)


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("fn", [F.max_pool2d, F.avg_pool2d], ids=["max_pool values", "avg_pool"])
def test_parallel_nchw_pooling_without_autograd_equals_the_serial_one(fn, two_threads):
    """The values-only NCHW kernels (separable: pooling.py) in their prange variants;
    a NaN and padding included."""
    data = image((2, 16, 64, 64), "NCHW", dtype=np.float32).numpy()
    data[0, 3, 11, 11] = np.nan  # in 2 x 2 windows
    x = lm.asarray(data)
    with lm.no_grad():
        got = fn(x, 3, 2, padding=1).numpy()
        lm.set_num_threads(1)
        want = fn(x, 3, 2, padding=1).numpy()
        lm.set_num_threads(2)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[0, 3, 5, 5]) and np.isnan(got).sum() == 4


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("window", [(2, 2, 0), (2, 2, 1), (3, 3, 0), (3, 2, 1), (3, 1, 1)], ids=str)
def test_direct_nchw_pooling_with_indices_equals_the_nhwc_kernel(window, two_threads):
    """Note [NCHW indices]: pool_nchw, chosen by itself here (planes of more than 4
    KB), serial and in parallel, against the NHWC kernel on the same values: ties, a
    NaN, -inf windows, overlapping windows and padding included."""
    data = np.round(image((4, 8, 70, 66), "NCHW", dtype=np.float32).numpy() * 2) / 2
    data[0, 3, 11, 11], data[1, 5, :6, :6] = np.nan, -np.inf
    assert pooling._direct_nchw(70 * 66 * 4)
    assert data.size >= PARALLEL_ELEMENTS  # the prange variant on two threads
    with lm.no_grad():
        want = F.max_pool2d(F.to_layout(lm.asarray(data), "NHWC"), *window, return_indices=True)
        for threads in (2, 1):
            lm.set_num_threads(threads)
            for fn in (F.max_pool2d, F.min_pool2d):
                got = fn(lm.asarray(data), *window, return_indices=True)
                ref = fn(F.to_layout(lm.asarray(data), "NHWC"), *window, return_indices=True)
                assert F.layout_of(got[0]) == "NCHW"
                for g, r in zip(got, ref):
                    np.testing.assert_array_equal(g.numpy(), r.numpy())
    kernel, stride, padding = window
    covering = [o for o in range(want[0].shape[-1]) if 0 <= 11 + padding - o * stride < kernel]
    assert np.isnan(want[0].numpy()).sum() == len(covering) ** 2  # the windows around it
    assert want[1].numpy().max() < 70 * 66  # the -inf windows keep an input position


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv2d_in_parts_matches_the_oracle(case, layout, two_threads, monkeypatch):
    """Note [Split convolutions]: every convolution's kernels in 2 parts of the 3 images
    (the parallel threshold lowered to nothing)."""
    monkeypatch.setattr(lm.backends.threads, "_threshold", 0)
    _, kwargs, wshape = case
    x = image((3, 6, 7, 6), layout, requires_grad=True)
    w, b = param(wshape), param((wshape[0],), seed=2)
    check_against_oracle(lambda x, w, b: F.conv2d(x, w, b, **kwargs), [x, w, b])


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", DIRECT_CASES, ids=[c[0] for c in DIRECT_CASES])
def test_few_channels_in_parts_match_the_oracle(case, layout, two_threads, monkeypatch):
    """Note [Direct convolution of few channels]: the direct forward pass in 2 parts of
    the batch's output rows, cut inside an image (the parallel threshold lowered to
    nothing)."""
    monkeypatch.setattr(lm.backends.threads, "_threshold", 0)
    _, xs, ws, kwargs = case
    x, w, b = image(xs, layout), param(ws), param(ws[:1], seed=2)
    check_against_oracle(lambda x, w, b: F.conv2d(x, w, b, **kwargs), [x, w, b])


# Note [Up to 16]: (id, input shape, weight shape, conv2d's keywords, the direct kernels
# called: the forward pass, a stride-1 convolution's input gradient -- a forward pass
# -- and, up to 8 input channels, the weight gradient)
CHANNELS_LAST_DIRECT_CASES = [
    ("16_channels", (2, 16, 9, 10), (8, 16, 3, 3), _kw(padding=1), ["forward"] * 2),
    (
        "8_channels",
        (2, 8, 7, 9),
        (13, 8, 3, 2),
        _kw(padding=(1, 0)),
        ["forward"] * 2 + ["weight_grad"],
    ),
    (
        "5_channels_strided",
        (1, 5, 11, 7),
        (19, 5, 5, 3),
        _kw(stride=(2, 1), padding=(2, 1), dilation=(2, 1)),
        ["forward", "weight_grad"],
    ),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    "case", CHANNELS_LAST_DIRECT_CASES, ids=[c[0] for c in CHANNELS_LAST_DIRECT_CASES]
)
def test_channels_last_convolutions_of_up_to_16_channels_run_direct(
    case, dtype, direct_calls, monkeypatch
):
    """Note [Up to 16]: channels-last convolutions of kernels wider than 1 x 1 run their
    forward pass direct on up to 16 input channels and their weight gradient on up to
    8, and match the oracle (the conftest's narrower limits restored); 17 channels, 1 x
    1 kernels and channels-first images of big planes do not run direct."""
    monkeypatch.setattr(conv.direct, "DIRECT_CHANNELS_LAST", {"forward": 16, "weight": 8})
    _, xs, ws, kwargs, kernels = case
    x = image(xs, "NHWC", dtype, requires_grad=True)
    w, b = param(ws, dtype=dtype), param(ws[:1], 2, dtype)
    rtol = 1e-10 if dtype == np.float64 else 2e-5
    check_against_oracle(lambda x, w, b: F.conv2d(x, w, b, **kwargs), [x, w, b], rtol, rtol)
    assert sorted(direct_calls) == kernels
    direct_calls.clear()
    others = [((1, 17, 6, 5), (4, 17, 3, 3), "NHWC"), ((1, 16, 6, 5), (4, 16, 1, 1), "NHWC"),
              ((1, 16, 13, 13), (4, 16, 3, 3), "NCHW")]  # fmt: skip
    for xs, ws, layout in others:
        F.conv2d(image(xs, layout, dtype), param(ws, dtype=dtype)).sum().backward()
    assert direct_calls == []


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_gradients_keep_infinities_and_nans_where_they_reach(layout):
    """A NaN on the right edge and an infinity inside: NCHW's flat planes (Note [Flat
    planes]) read past a row's end, and the weight gradient multiplied those values by
    zero (NaN) in entries the NaN does not reach."""
    data = np.random.default_rng(4).uniform(-1, 1, (2, 4, 12, 12))
    data[0, 1, 3, 11], data[1, 2, 6, 5] = np.nan, np.inf
    x = F.to_layout(lm.asarray(data), layout).requires_grad_()
    with np.errstate(invalid="ignore"):  # the oracle's NumPy sums meet inf - inf
        outs = check_against_oracle(
            lambda x, w: F.conv2d(x, w, padding=1), [x, param((3, 4, 3, 3))]
        )
    assert np.isnan(outs[0].numpy()).any()


# Note [Winograd]: 3x3, 4x4 and 5x5 stride-1 convolutions with 8 or more channels each
# way. (id, input shape, output channels, kernel size, padding, dtypes, float32
# precision): partial tiles both ways (float32: F(2x2, 3x3) at "highest", F(4x4, 3x3)
# at "high"), one tile row and no padding, padding beyond the kernel's reach; F(3x3,
# 4x4) and F(2x2, 5x5) with partial tiles (float64 only for the 4x4, which no bench
# model has; float32 5x5 only at "high": Note [Float32 precision]).
WINOGRAD_CASES = [
    ("partial_tiles", (2, 16, 9, 11), 24, 3, 1, ("f8", "f4"), "highest"),
    ("partial_tiles_high", (2, 16, 9, 11), 24, 3, 1, ("f4",), "high"),
    ("valid", (3, 9, 6, 7), 8, 3, 0, ("f8", "f4"), "highest"),
    ("wide_pad", (1, 16, 6, 7), 16, 3, 2, ("f8", "f4"), "highest"),
    ("4x4", (2, 10, 9, 8), 8, 4, 1, ("f8",), "highest"),
    ("5x5", (2, 8, 9, 10), 12, 5, 2, ("f8", "f4"), "high"),
]
# measured |error| / max |output|: float64 ~5e-15; float32 4e-6 (3x3), 1e-5 (5x5)
WINOGRAD_TOLERANCE = {"f8": 1e-13, "f4": 4e-5}


@pytest.fixture
def float32_precision():
    """Sets lm.set_float32_matmul_precision for one test."""
    before = lm.get_float32_matmul_precision()
    yield lm.set_float32_matmul_precision
    lm.set_float32_matmul_precision(before)


@pytest.fixture
def winograd_calls(monkeypatch):
    """The names of the Winograd drivers conv2d called, in order."""
    calls = []
    for name in ("forward", "weight_grad"):
        real = getattr(winograd, name)
        monkeypatch.setattr(winograd, name, lambda *a, _f=real, _n=name: calls.append(_n) or _f(*a))
    return calls


def _close_to_max(got, want, tol):
    """|got - want| <= tol * max |want| everywhere (Winograd's error scales with the
    largest output, not with each one), NaN where want is NaN."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    scale = np.abs(want[finite]).max(initial=1.0)
    assert np.abs(got[finite] - want[finite]).max(initial=0.0) <= tol * scale


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize(
    "case, dtype",
    [(c[1:5] + c[6:], d) for c in WINOGRAD_CASES for d in c[5]],
    ids=[f"{c[0]}-{d}" for c in WINOGRAD_CASES for d in c[5]],
)
def test_winograd_convolution_matches_the_oracle(
    case, dtype, layout, winograd_calls, float32_precision
):
    shape, c_out, size, padding, precision = case
    float32_precision(precision)
    x = image(shape, layout, dtype, requires_grad=True)
    w = param((c_out, shape[1], size, size), dtype=dtype)
    b = param((c_out,), seed=2, dtype=dtype)
    fn = lambda x, w, b: F.conv2d(x, w, b, padding=padding)
    (out,), grads = _run(fn, [x, w, b])
    assert winograd_calls == ["forward", "forward", "weight_grad"]  # the input grad too
    assert F.layout_of(out) == layout
    with lm.backends.use("numpy_ref"):
        (want,), want_grads = _run(fn, [x, w, b])
    for got, ref in zip([out, *grads], [want, *want_grads]):
        _close_to_max(got.numpy(), ref.numpy(), WINOGRAD_TOLERANCE[dtype])


# Note [Strided convolutions]: (id, input shape, weight shape, stride, padding, float32
# precision); more input channels than run direct (Note [Direct convolution of few
# channels]), as the stems whose geometry they have would
STRIDED_CASES = [
    ("alexnet_11x11_s4", (2, 5, 23, 22), (8, 5, 11, 11), 4, 2, "highest"),  # a 3x3 on 80
    ("inception_7x7_s2", (2, 5, 16, 15), (8, 5, 7, 7), 2, 3, "high"),  # a 4x4 on 20
    ("uneven_5x7_s2x3", (1, 5, 13, 17), (9, 5, 5, 7), (2, 3), (1, 2), "highest"),  # 3x3 on 30
]


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["f8", "f4"])
@pytest.mark.parametrize("case", STRIDED_CASES, ids=[c[0] for c in STRIDED_CASES])
def test_strided_convolution_by_space_to_depth_matches_the_oracle(
    case, dtype, layout, winograd_calls, float32_precision
):
    _, shape, wshape, stride, padding, precision = case
    float32_precision(precision)
    x = image(shape, layout, dtype, requires_grad=True)
    w, b = param(wshape, dtype=dtype), param((wshape[0],), seed=2, dtype=dtype)
    fn = lambda x, w, b: F.conv2d(x, w, b, stride=stride, padding=padding)
    (out,), grads = _run(fn, [x, w, b])
    assert winograd_calls == ["forward", "forward", "weight_grad"]
    assert F.layout_of(out) == layout
    with lm.backends.use("numpy_ref"):
        (want,), want_grads = _run(fn, [x, w, b])
    for got, ref in zip([out, *grads], [want, *want_grads]):
        assert got.shape == ref.shape
        _close_to_max(got.numpy(), ref.numpy(), WINOGRAD_TOLERANCE[dtype])


@pytest.mark.parametrize("stride, size", [(1, 3), (2, 5)], ids=["winograd", "space_to_depth"])
def test_a_changed_weight_is_never_served_from_the_filter_cache(stride, size, monkeypatch):
    """Note [Filter cache]: served again only while the weight's bits are unchanged,
    whatever changed them (an in-place operation, a write through a NumPy view, even
    0.0 -> -0.0, in the first block compared or after it), and bounded in bytes."""
    monkeypatch.setattr(filter_cache, "_FIRST_BLOCK", 100)
    built = []
    real = winograd._transform_filters
    monkeypatch.setattr(winograd, "_transform_filters", lambda *a: built.append(1) or real(*a))
    x = image((1, 16, 16, 16), "NCHW", "f8")
    w = param((16, 16, size, size), dtype="f8")

    def check(weight=w):
        got = F.conv2d(x, weight, stride=stride, padding=size // 2)
        with lm.backends.use("numpy_ref"):
            want = F.conv2d(x, weight, stride=stride, padding=size // 2)
        _close_to_max(got.numpy(), want.numpy(), 1e-12)

    check()
    check()
    assert len(built) == 1
    with lm.no_grad():
        w.mul_(2.0)
    check()
    w.numpy()[0, 0, 0, 0] = 5.0  # a write lamina does not see
    check()
    w.numpy()[1, 1, 1, 1] = 0.0
    check()
    w.numpy()[1, 1, 1, 1] = -0.0
    check()
    w.numpy()[-1, -1, -1, -1] = 7.0  # past the first block
    check()
    assert len(built) == 6
    monkeypatch.setattr(filter_cache, "FILTER_CACHE_BYTES", 0)
    check(param((16, 16, size, size), seed=3, dtype="f8"))  # an entry more: evictions
    assert not filter_cache._prepared


def test_a_parameter_is_kept_by_its_stamp_and_every_change_is_seen(monkeypatch):
    """Note [Filter cache] on a module's weight (Note [Sealed storages]): never compared
    or copied while its storage is sealed, and made again after an in-place operation
    and an optimizer's step; once a NumPy view of it was handed out, compared by value,
    so a write through the view is seen too."""
    monkeypatch.setattr(filter_cache, "_prepared", {})
    compared, real = [], filter_cache._blocks_of
    monkeypatch.setattr(filter_cache, "_blocks_of", lambda c, w: compared.append(1) or real(c, w))
    conv = lm.nn.Conv2d(16, 16, 3, padding=1, dtype=lm.float64)  # by Winograd
    x = image((1, 16, 16, 16))

    def check():
        got = conv(x)
        with lm.backends.use("numpy_ref"):
            want = conv(x)
        _close_to_max(got.detach().numpy(), want.detach().numpy(), 1e-12)

    check()
    check()
    with lm.no_grad():
        conv.weight.mul_(2.0)
    check()
    optimizer = lm.optim.SGD(conv.parameters(), lr=0.5)
    lm.sum(conv(x) ** 2).backward()  # the input gradient's flipped weight too
    optimizer.step()
    check()
    assert not compared
    conv.weight.numpy()[0, 0, 0, 0] = 5.0  # a write lamina does not see
    check()
    conv.weight.numpy()[1, 1, 1, 1] = -3.0
    check()
    assert compared


def test_the_filter_cache_compares_a_strided_weight_whole(monkeypatch):
    """Note [Filter cache] on a weight that is not a C array (compared whole, not
    flattened): a change past the first block is seen, one in the memory between its
    elements is not."""
    monkeypatch.setattr(filter_cache, "_FIRST_BLOCK", 4)
    monkeypatch.setattr(filter_cache, "_prepared", {})
    base = np.arange(64.0).reshape(8, 8)
    w = base[:, ::2]
    built = []

    def served():
        return filter_cache.prepared(w, "sum", lambda w: built.append(1) or w.sum())

    assert served() == served() == base[:, ::2].sum()
    base[-1, -2] = 100.0  # w's last element
    assert served() == base[:, ::2].sum()
    base[-1, -1] = -5.0  # between w's elements
    assert served() == served() == base[:, ::2].sum()
    assert len(built) == 3  # the first call, the change, the call after it (kept then)


@pytest.mark.parametrize(
    "shape",
    [(2, 16, 8, 8), (3, 19, 5, 7), (2, 3, 9, 11), (2, 960, 2, 2), (1, 5, 1, 3), (0, 4, 2, 2)],
    ids=str,
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_conversions_equal_numpys_transpose(shape, dtype):
    """Note [Transposes]: images to channels-last and back through whole tiles, the last
    columns and the last rows (sizes off multiples of TILE, and below it), equal to
    NumPy's transpose; other dtypes take NumPy's copy."""
    a = (np.random.default_rng(0).standard_normal(shape) * 100).astype(dtype)
    nhwc = conv._reorder(a, "NCHW", "NHWC")
    back = conv._reorder(nhwc, "NHWC", "NCHW")
    assert nhwc.flags.c_contiguous and back.flags.c_contiguous
    np.testing.assert_array_equal(nhwc, a.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(back, a)
    x = lm.asarray(a)
    y = F.to_layout(x[:, :, ::2], "NHWC")  # strided: made NCHW first
    np.testing.assert_array_equal(y.numpy(), a[:, :, ::2])
    np.testing.assert_array_equal(F.to_layout(F.to_layout(x, "NHWC"), "NCHW").numpy(), a)


@pytest.mark.core_independent  # Note [Core-independent tests]
def test_conversions_of_many_elements_run_in_parallel(two_threads, monkeypatch):
    """From the parallel threshold the tiles' loop runs over the images in parallel on
    two threads, both ways, equal to NumPy's transpose; below it, serially."""
    from lamina.backends import jit

    kernels, real = [], jit.cached
    monkeypatch.setattr(jit, "cached", lambda key, build: kernels.append(key) or real(key, build))
    a = np.random.default_rng(0).standard_normal((4, 8, 64, 64)).astype(np.float32)
    nhwc = conv._reorder(a, "NCHW", "NHWC")
    np.testing.assert_array_equal(conv._reorder(nhwc, "NHWC", "NCHW"), a)
    np.testing.assert_array_equal(nhwc, a.transpose(0, 2, 3, 1))
    small = conv._reorder(a[:, :, :8], "NCHW", "NHWC")
    np.testing.assert_array_equal(small, a[:, :, :8].transpose(0, 2, 3, 1))
    parallel = [key[-1] for key in kernels if key[0] is transpose_tiles]
    assert parallel == [True, True, False]


@pytest.fixture
def batched_calls(monkeypatch):
    """The Note [Small planes] drivers conv2d called, in order."""
    calls = []
    for name in ("_forward_batched", "_input_grad_batched", "_weight_grad_batched"):
        real = getattr(conv, name)
        monkeypatch.setattr(conv, name, lambda *a, _f=real, _n=name: calls.append(_n) or _f(*a))
    return calls


# Note [Small planes]: (id, input shape, weight shape, stride, padding, dilation, groups)
SMALL_PLANE_CASES = [
    ("3x3_odd", (3, 5, 3, 4), (40, 5, 3, 3), 1, 1, 1, 1),
    ("3x3_stride_2_groups", (1, 6, 9, 7), (24, 3, 3, 3), 2, 1, 1, 2),
    ("1x1_stride_2", (2, 8, 7, 7), (32, 8, 1, 1), 2, 0, 1, 1),
    ("2x2_dilated", (1, 4, 5, 6), (32, 4, 2, 2), 1, 1, 2, 1),
]


@pytest.mark.parametrize("variant", ["a_view_in_one_block", "blocks"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["f8", "f4"])
@pytest.mark.parametrize("case", SMALL_PLANE_CASES, ids=[c[0] for c in SMALL_PLANE_CASES])
def test_small_planes_run_over_blocks_of_images_matching_the_oracle(
    case, dtype, layout, variant, batched_calls, monkeypatch
):
    """Forward and both gradients: of a non-contiguous view (no layout: NCHW) in one
    block of images, or of images in ``layout`` in blocks of one image (the weight
    gradient summed over them)."""
    _, shape, wshape, stride, padding, dilation, groups = case
    geo = conv.Geometry(shape, wshape, (stride,) * 2, (padding,) * 4, (dilation,) * 2, groups)
    if variant == "blocks":
        block = geo.k * geo.ho * geo.wo * np.dtype(dtype).itemsize
        monkeypatch.setattr(conv, "BLOCK_BYTES", block)
        x = image(shape, layout, dtype, requires_grad=True)
        view = lambda x: x
    else:
        x = image((*shape[:3], shape[3] + 1), layout, dtype, requires_grad=True)
        view = lambda x: x[..., 1:]
    w, b = param(wshape, dtype=dtype), param((wshape[0],), seed=2, dtype=dtype)
    fn = lambda x, w, b: F.conv2d(
        view(x), w, b, stride=stride, padding=padding, dilation=dilation, groups=groups
    )
    (out,), grads = _run(fn, [x, w, b])
    assert batched_calls == ["_forward_batched", "_input_grad_batched", "_weight_grad_batched"]
    assert F.layout_of(out) == (layout if variant == "blocks" else "NCHW")
    with lm.backends.use("numpy_ref"):
        (want,), want_grads = _run(fn, [x, w, b])
    for got, ref in zip([out, *grads], [want, *want_grads]):
        _close_to_max(got.numpy(), ref.numpy(), {"f8": 1e-13, "f4": 1e-5}[dtype])


def test_small_planes_on_two_threads_split_their_products_and_match_one_thread(
    two_threads, monkeypatch, batched_calls, im2col_on_few_channels
):
    """Note [Small planes]' products over whole images run their rows in parallel, the
    images in one part."""
    monkeypatch.setattr(gemm, "ROWS_FLOPS", 0)
    products = []
    real = gemm._rows_kernel
    monkeypatch.setattr(gemm, "_rows_kernel", lambda *key: products.append(key) or real(*key))
    x = image((3, 4, 5, 5), requires_grad=True)
    w = param((32, 4, 3, 3))
    fn = lambda x, w: F.conv2d(x, w, stride=2, padding=1)
    (out,), grads = _run(fn, [x, w])
    drivers = ["_forward_batched", "_input_grad_batched", "_weight_grad_batched"]
    assert sorted(batched_calls) == drivers  # each once: one part
    assert (np.float64, True) in products  # rows in parallel
    lm.set_num_threads(1)
    (want,), want_grads = _run(fn, [x, w])
    for got, ref in zip([out, *grads], [want, *want_grads]):
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-12, atol=1e-12)


def test_small_planes_gradients_against_finite_differences():
    x = image((2, 3, 4, 5), requires_grad=True)
    w, b = param((4, 3, 3, 3)), param((4,), seed=2)
    fn = lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1)
    assert lm.autograd.gradcheck(fn, [x, w, b])


@pytest.mark.parametrize(
    "channels, size, batch, parts, wins",
    [
        (128, 8, 2, 1, True),  # 32 tiles, U of 1 MB
        (128, 8, 2, 2, False),  # 16 tiles a part
        (128, 8, 4, 2, True),
        (256, 4, 8, 1, False),  # 32 tiles, U of 4 MB: 2 x 32 needed
        (256, 4, 16, 1, True),
        (256, 4, 16, 2, True),  # 32 tiles a part
        (512, 4, 16, 1, False),  # 64 tiles, U of 16 MB: 4 x 32 needed
        (512, 4, 16, 2, False),
        (512, 4, 32, 1, True),
        (512, 4, 32, 2, True),  # 64 tiles a part
    ],
)
def test_winograd_needs_enough_tiles(monkeypatch, channels, size, batch, parts, wins):
    """Note [Enough tiles]: MIN_TILES output tiles a thread's part, and sqrt(U's bytes /
    L2_BYTES) times MIN_TILES in all past the L2; fewer, im2col (in training) or steady
    filters only."""
    monkeypatch.setattr(winograd, "MIN_TILES", 32)
    monkeypatch.setattr(winograd.threads, "parts_for", lambda work, total: parts)
    geo = conv.Geometry(
        (batch, channels, size, size), (channels, channels, 3, 3), (1, 1), (1,) * 4, (1, 1), 1
    )
    assert (winograd.algorithm(geo, np.float32) is not None) == wins
    tiles = batch * (size // 2) ** 2
    steady = winograd.algorithm(geo, np.float32, steady=True)
    assert (steady is not None) == (tiles >= winograd.MIN_STEADY_TILES)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("alg", [winograd.F2x3, *winograd.FAST.values()], ids=lambda a: a.name)
def test_filter_transform_and_its_adjoint_match_float64_sums(alg, dtype):
    """Note [Filter transforms]: U = gg vec(k) per channel pair and the adjoint gg^T of
    the sum of three parts' sums, against NumPy's float64 sums rounded once; the weight
    a transposed view."""
    rng = np.random.default_rng(0)
    r, c_in, c_out = alg.r, 9, 20
    w = rng.standard_normal((c_in, c_out, r, r)).astype(dtype).transpose(1, 0, 2, 3)
    taps = w.reshape(c_out, c_in, r * r).astype(np.float64)
    want = np.einsum("pq,oiq->pio", alg.gg, taps).astype(dtype)
    tol = 4 * np.finfo(dtype).eps * np.abs(want).max()
    np.testing.assert_allclose(winograd._transform_filters(w, alg), want, rtol=0, atol=tol)
    parts = rng.standard_normal((3, alg.n * alg.n, c_in, c_out)).astype(dtype)
    gw = np.empty((c_out, c_in, r * r), dtype)
    winograd._filter_sums(gw, alg.gg_t, parts, False)
    want = np.einsum("pq,kpio->oiq", alg.gg, parts.astype(np.float64)).astype(dtype)
    np.testing.assert_allclose(gw, want, rtol=0, atol=4 * np.finfo(dtype).eps * np.abs(want).max())


def test_a_copy_kept_with_a_result_is_never_rewritten_in_place(monkeypatch):
    """Note [Filter cache]: a weight that changed gets a new copy where its entry kept
    a result (another thread comparing with the old copy must fail to serve that
    result), and its own copy rewritten in place once it has none (training)."""
    monkeypatch.setattr(filter_cache, "_prepared", {})
    w = np.random.default_rng(0).random((8, 8, 3, 3))

    def prepared():
        return filter_cache.prepared(w, "twice", lambda w: 2 * w)

    prepared()
    prepared()  # unchanged: its result kept
    ((first, kept),) = filter_cache._prepared.values()
    assert kept is not None
    w += 1
    np.testing.assert_array_equal(prepared(), 2 * w)
    ((second, kept),) = filter_cache._prepared.values()
    assert kept is None and second is not first and not np.array_equal(first, w)
    w += 1
    np.testing.assert_array_equal(prepared(), 2 * w)
    ((third, kept),) = filter_cache._prepared.values()
    assert third is second and np.array_equal(third, w)


@pytest.mark.parametrize("reused, builds", [(False, 5), (True, 3)])
def test_a_reused_result_is_kept_when_its_weight_changed(reused, builds, monkeypatch):
    """Note [Filter cache]: with ``reused`` (the tap-major weight, asked for by the
    forward and again by the input gradient of a training step), a result made from a
    weight that changed since the last call is kept and served until it changes again;
    without, it is made again by the second call."""
    monkeypatch.setattr(filter_cache, "_prepared", {})
    w, built = np.random.default_rng(0).random((8, 8, 3, 3)), []

    def prepared():
        return filter_cache.prepared(w, "twice", lambda w: built.append(1) or 2 * w, reused=reused)

    for _ in range(3):  # training steps
        w += 1
        np.testing.assert_array_equal(prepared(), 2 * w)  # the forward
        np.testing.assert_array_equal(prepared(), 2 * w)  # the input gradient
    assert len(built) == builds


def test_the_filter_cache_evicts_copies_without_results_first_then_the_least_served(
    monkeypatch,
):
    """Note [Filter cache]'s order of eviction: a trained weight's copy (no result)
    before any result, then the result served longest ago."""
    monkeypatch.setattr(filter_cache, "_prepared", {})
    monkeypatch.setattr(filter_cache, "FILTER_CACHE_BYTES", 4 * 128)
    a, b, c, d = (np.full(16, float(i)) for i in range(4))  # 128 bytes, a result 128 more

    def keep():  # the first values of the weights with entries
        kept = {key[0] for key in filter_cache._prepared}
        return [w[0] for w in (a, b, c, d) if w.ctypes.data in kept]

    def prepared(w):
        return filter_cache.prepared(w, "twice", lambda w: 2 * w)

    prepared(a)
    prepared(b)
    b[0] = 9.0  # changed, as in training: a copy alone
    np.testing.assert_array_equal(prepared(b), 2 * b)
    assert keep() == [0.0, 9.0] and filter_cache._cached_bytes() == 3 * 128
    prepared(c)  # 5 x 128 bytes: b's copy goes
    assert keep() == [0.0, 2.0]
    np.testing.assert_array_equal(prepared(a), np.zeros(16))  # served: now the last
    prepared(d)  # c was served longest ago
    assert keep() == [0.0, 3.0]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_inference_takes_winograd_from_fewer_tiles_once_the_weight_is_steady(
    layout, winograd_calls, monkeypatch
):
    """Note [Steady filters]: from MIN_STEADY_TILES output tiles, too few for Note
    [Enough tiles], Winograd from the second call with an unchanged weight on, never
    while the weight changes between calls (training), which keep only the weight's
    copy (Note [Filter cache])."""
    monkeypatch.setattr(winograd, "MIN_TILES", 256)
    monkeypatch.setattr(winograd, "MIN_STEADY_TILES", 64)
    monkeypatch.setattr(filter_cache, "_prepared", {})
    x = image((4, 16, 16, 16), layout)  # 4 images of 4 x 4 tiles (F(4x4, 3x3)): 64
    w, b = param((24, 16, 3, 3)), param((24,), seed=2)
    with lm.backends.use("numpy_ref"):
        want = F.conv2d(x, w, b, padding=1).numpy()

    def check(runs_winograd):
        before = len(winograd_calls)
        with lm.no_grad():
            got = F.conv2d(x, w, b, padding=1)
        assert winograd_calls[before:] == (["forward"] if runs_winograd else [])
        _close_to_max(got.numpy(), want, WINOGRAD_TOLERANCE["f8"])

    def filters():  # the Winograd entry (channels-last im2col keeps its weight too)
        ((copy, u),) = [v for k, v in filter_cache._prepared.items() if k[-1] == "F(4x4,3x3)"]
        return copy, u

    check(False)  # seen once
    check(True)  # unchanged: its filters made and kept
    check(True)
    copy, u = filters()
    np.testing.assert_array_equal(copy, w.numpy())
    assert u.shape == (36, 16, 24)
    for step in range(2):  # changed before every call, as in training
        w.numpy()[step] += 0.5
        with lm.backends.use("numpy_ref"):
            want = F.conv2d(x, w, b, padding=1).numpy()
        check(False)
        copy, u = filters()
        assert u is None
        np.testing.assert_array_equal(copy, w.numpy())
    check(True)
    fewer = image((3, 16, 16, 16), layout)  # 48 tiles: im2col even with a steady weight
    with lm.no_grad():
        F.conv2d(fewer, w, b, padding=1)
    assert winograd_calls.count("forward") == 3


def test_the_input_gradients_flipped_kernel_follows_the_weight(monkeypatch):
    """Note [Filter cache] for the input gradient's flipped kernel: made once while the
    weight is unchanged, again after a write through a NumPy view."""
    built = []
    real = conv._flipped
    monkeypatch.setattr(conv, "_flipped", lambda *a: built.append(1) or real(*a))
    x = image((1, 16, 8, 8), "NCHW", "f8", requires_grad=True)
    w = param((16, 16, 3, 3), dtype="f8")
    fn = lambda x, w: F.conv2d(x, w, padding=1)

    def check():
        (_,), got = _run(fn, [x, w])
        with lm.backends.use("numpy_ref"):
            (_,), want = _run(fn, [x, w])
        _close_to_max(got[0].numpy(), want[0].numpy(), 1e-12)

    check()
    check()
    assert len(built) == 1
    w.numpy()[0, 1, 2, 0] = 7.0
    check()
    assert len(built) == 2


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_winograd_in_parts_matches_one_part(layout, two_threads, monkeypatch, winograd_calls):
    """Note [Winograd parts]: each driver (the forward pass, the input gradient's
    transposed convolution, the weight gradient) runs once, its block loop in two parts
    of one image's 3 tile rows; the results are one thread's up to the order of the
    sums."""
    monkeypatch.setattr(lm.backends.threads, "_threshold", 0)
    made, real = [], winograd._Tiles
    monkeypatch.setattr(winograd, "_Tiles", lambda *a: made.append(real(*a)) or made[-1])
    x, w = image((1, 16, 10, 5), layout, requires_grad=True), param((16, 16, 3, 3))
    fn = lambda x, w: F.conv2d(x, w, padding=1)
    (out,), grads = _run(fn, [x, w])
    assert winograd_calls == ["forward", "forward", "weight_grad"]
    assert [(t.th, t.parts) for t in made] == [(3, 2)] * 3  # F(4x4, 3x3): 4-row tiles
    lm.set_num_threads(1)
    (want,), want_grads = _run(fn, [x, w])
    for got, ref in zip([out, *grads], [want, *want_grads]):
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["f8", "f4"])
def test_winograd_block_loops_in_python_equal_the_kernels(dtype, layout, monkeypatch):
    """Note [GEMM in kernels]: without a BLAS kernels can call, the same block loops run
    from Python; several blocks each (a small BLOCK_BYTES), the last one shorter."""
    monkeypatch.setattr(winograd, "BLOCK_BYTES", 40_000)  # 2 (f8) or 4 (f4) of 9 tile rows
    x = image((3, 8, 10, 9), layout, dtype, requires_grad=True)
    w, b = param((12, 8, 3, 3), dtype=dtype), param((12,), seed=2, dtype=dtype)
    fn = lambda x, w, b: F.conv2d(x, w, b, padding=1)
    (out,), grads = _run(fn, [x, w, b])
    monkeypatch.setattr(blas, "available", lambda: False)
    (want,), want_grads = _run(fn, [x, w, b])
    for got, ref in zip([out, *grads], [want, *want_grads]):
        _close_to_max(got.numpy(), ref.numpy(), WINOGRAD_TOLERANCE[dtype] / 10)


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("dtype", ["f8", "f4"])
def test_the_nchw_block_loop_as_a_kernel_equals_python_and_the_oracle(
    dtype, two_threads, monkeypatch
):
    """conv.nchw_blocks, the channels-first loop over images and blocks of output rows,
    with each of its steps (forward, input gradient's scatter, weight gradient): one
    kernel calling the BLAS, and the same loop from Python (no BLAS kernels can call),
    against numpy_ref: 2 groups, stride 2 with a kernel one column wide (which does
    not read every phase of the stride, so its rows are gathered: Note [Flat planes]),
    blocks of 3 of 11 output rows (the last shorter), the 3 images in two parts, cut
    inside the second but for the input gradient's (Note [Parts of images]), their
    blocks within BLOCK_BYTES together (Note [Block budget])."""
    parts, real = [], conv._nchw_parts
    spy = lambda *a, **k: parts.append(real(*a, **k)) or parts[-1]
    monkeypatch.setattr(conv, "_nchw_parts", spy)
    monkeypatch.setattr(lm.backends.threads, "_threshold", 0)
    x = image((3, 4, 22, 21), "NCHW", dtype, requires_grad=True)
    w, b = param((6, 2, 3, 1), dtype=dtype), param((6,), seed=2, dtype=dtype)
    geo = conv.Geometry(x.shape, w.shape, (2, 2), (1,) * 4, (1, 1), 2)
    monkeypatch.setattr(conv, "BLOCK_BYTES", 2 * 3 * geo.wo * geo.k * np.dtype(dtype).itemsize)
    fn = lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2)
    _kernels_match_oracle_and_python(fn, [x, w, b], dtype, monkeypatch)
    # the forward pass, the input gradient (whole images of 11 rows), the weight gradient
    assert [(len(p[0]), p[1], p[2]) for p in parts[:3]] == [(2, 3, 1), (2, 3, 11), (2, 3, 1)]
    assert all(p[0].nbytes <= conv.BLOCK_BYTES for p in parts[:3])


def test_parts_share_the_block_budget_down_to_a_floor():
    """Note [Block budget]: one part's block is BLOCK_BYTES, two parts' half each, and
    from SHARES parts on each gets BLOCK_BYTES / SHARES."""
    block, floor = conv.BLOCK_BYTES, conv.BLOCK_BYTES // conv.SHARES
    shares = [conv._part_bytes(parts) for parts in (1, 2, conv.SHARES, 4 * conv.SHARES)]
    assert shares == [block, block // 2, floor, floor]


def test_winograd_blocks_are_at_least_as_big_as_the_filters_they_read():
    """Note [Winograd blocks]: 512 channels' U (16 MB in float32) sizes the blocks, 64
    channels' (256 KB) leaves them at BLOCK_BYTES."""
    for channels, block in ((512, 16 * 512 * 512 * 4), (64, winograd.BLOCK_BYTES)):
        geo = conv.Geometry((32, channels, 8, 8), (channels, channels, 3, 3), (1, 1), (1,) * 4,
                            (1, 1), 1)  # fmt: skip
        tiles = winograd._Tiles(geo, winograd.F2x3, 4)
        per_row = 16 * tiles.tw * 2 * channels * 4
        assert tiles.rows == block // per_row, channels


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("dtype", ["f8", "f4"])
def test_winograd_blocks_sized_by_the_filters_match_the_oracle(dtype, monkeypatch):
    """Blocks as big as U (BLOCK_BYTES below it): 32 channels, 16 / (tile columns) tile
    rows a block -- 3 of 15 (f4), 5 of 9 (f8, the last block shorter)."""
    monkeypatch.setattr(winograd, "BLOCK_BYTES", 1)
    made, real = [], winograd._Tiles
    monkeypatch.setattr(winograd, "_Tiles", lambda *a: made.append(real(*a)) or made[-1])
    x = image((3, 32, 10, 9), "NCHW", dtype, requires_grad=True)
    w, b = param((32, 32, 3, 3), dtype=dtype), param((32,), seed=2, dtype=dtype)
    fn = lambda x, w, b: F.conv2d(x, w, b, padding=1)
    (out,), grads = _run(fn, [x, w, b])
    assert made and {t.rows for t in made} == {3 if dtype == "f4" else 5}
    with lm.backends.use("numpy_ref"):
        (want,), want_grads = _run(fn, [x, w, b])
    for got, ref in zip([out, *grads], [want, *want_grads]):
        _close_to_max(got.numpy(), ref.numpy(), WINOGRAD_TOLERANCE[dtype])


def _kernels_match_oracle_and_python(fn, leaves, dtype, monkeypatch):
    """fn and its gradients against the oracle, then run with loops in Python (no BLAS
    kernels can call) against the kernels' results; the kernels' output."""
    (out,), grads = _run(fn, leaves)
    with lm.backends.use("numpy_ref"):
        (want,), want_grads = _run(fn, leaves)
    tol = {"f8": 1e-13, "f4": 1e-5}[dtype]
    for got, ref in zip([out, *grads], [want, *want_grads]):
        _close_to_max(got.numpy(), ref.numpy(), tol)
    monkeypatch.setattr(blas, "available", lambda: False)
    (again,), again_grads = _run(fn, leaves)
    for got, ref in zip([again, *again_grads], [out, *grads]):
        _close_to_max(got.numpy(), ref.numpy(), tol / 10)
    return out


# (case, the images' height and width: output planes above SMALL_PLANE)
FLAT_CASES = [
    *((c, (11, 12)) for c in CONV_CASES if c[0] in ("plain", "dilated_groups", "same_even_kernel")),
    (("stride2_5x4", _kw(stride=2, padding=(2, 1)), (3, 4, 5, 4)), (31, 25)),
    (("stride3x2_7x5", _kw(stride=(3, 2), padding=(1, 2)), (3, 4, 7, 5)), (31, 25)),
]


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("dtype", ["f8", "f4"])
@pytest.mark.parametrize("case, size", FLAT_CASES, ids=[c[0][0] for c in FLAT_CASES])
def test_flat_block_loops_match_the_oracle_and_run_the_same_from_python(
    case, size, dtype, two_threads, monkeypatch, im2col_on_few_channels
):
    """Note [Flat block loops]: NCHW im2col from flat planes (split into the stride's
    phases where it is not 1: Note [Flat planes]) with several blocks per image (a small
    BLOCK_BYTES), the last one shorter, the 3 images in two parts cut inside the second
    (Note [Parts of images]); the kernels against the oracle, then the same loops run
    from Python (no BLAS kernels can call) against the kernels."""
    # a part's block (Note [Block budget]): 3 (f8) or 6 (f4) of 11 rows at stride 1
    monkeypatch.setattr(conv, "BLOCK_BYTES", 14000)
    monkeypatch.setattr(lm.backends.threads, "_threshold", 0)
    loops, real = [], conv._block_loop
    spy = lambda t, d, parallel: loops.append((t.__name__, parallel)) or real(t, d, parallel)
    monkeypatch.setattr(conv, "_block_loop", spy)
    _, kwargs, wshape = case
    channels = wshape[1] * kwargs.get("groups", 1)
    x = image((3, channels, *size), "NCHW", dtype, requires_grad=True)
    w, b = param(wshape, dtype=dtype), param((wshape[0],), seed=2, dtype=dtype)
    fn = lambda x, w, b: F.conv2d(x, w, b, **kwargs)
    _kernels_match_oracle_and_python(fn, [x, w, b], dtype, monkeypatch)
    # a strided input gradient scatters (nchw_blocks); a stride-1 one is a forward pass
    assert {t for t in loops if t[0].startswith("flat")} == {
        ("flat_forward_step", True),
        ("flat_weight_grad_step", True),
    }


def test_phase_planes_hold_the_padded_planes_strided_pixels():
    """Note [Flat planes]: each tap's run of the phase planes, read at an output row's
    offset, is the padded input that tap meets along the output row (and beyond it, in
    the extra columns, values no output keeps)."""
    x = np.arange(2 * 3 * 9 * 10, dtype=np.float64).reshape(2, 3, 9, 10) + 1
    w_shape, stride, padding = (5, 3, 4, 3), (3, 2), (2, 1, 1, 2)
    geo = conv.Geometry(x.shape, w_shape, stride, padding, (1, 1), 1)
    flat, taps, plane, wq = conv._flat_planes(x, geo)
    padded = np.pad(x, ((0, 0), (0, 0), (2, 1), (1, 2)))
    for n, c, t, oh in itertools.product(range(2), range(3), range(len(taps)), range(geo.ho)):
        i, j = divmod(t, 3)
        start = (n * 3 + c) * plane + taps[t] + oh * wq
        row = padded[n, c, oh * 3 + i, j::2][: geo.wo]
        assert np.array_equal(flat[start : start + geo.wo], row), (n, c, t, oh)


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("dtype", ["f8", "f4"])
@pytest.mark.parametrize(
    "kwargs",
    [dict(stride=2, padding=1, groups=2), dict(dilation=2), dict(stride=(2, 3), padding=1)],
)
def test_channels_last_block_loops_in_parts_match_the_oracle_and_python(
    kwargs, dtype, two_threads, monkeypatch, im2col_on_few_channels
):
    """Note [Channels-last block loops]: im2col (no Winograd: 2 channels a group,
    dilated, or strided; the last with each kernel row copied as one run, Note [Kernel
    rows as runs]) with several blocks of 7 pixels per image, 3 images in two parts, cut
    inside the second but for the input gradient's (Note [Parts of images]); forward
    and both gradients against the oracle, then the same loops run from Python (no
    BLAS kernels can call) against the kernels; the two parts' blocks within
    BLOCK_BYTES together (Note [Block budget])."""
    parts, real = [], conv._nhwc_parts
    spy = lambda *a, **k: parts.append(real(*a, **k)) or parts[-1]
    monkeypatch.setattr(conv, "_nhwc_parts", spy)
    groups = kwargs.get("groups", 1)
    x = image((3, 4, 42, 41), "NHWC", dtype, requires_grad=True)  # past the parallel threshold
    w, b = param((6, 4 // groups, 3, 3), dtype=dtype), param((6,), seed=2, dtype=dtype)
    monkeypatch.setattr(conv, "BLOCK_BYTES", 2 * 7 * w.shape[1] * 9 * np.dtype(dtype).itemsize)
    fn = lambda x, w, b: F.conv2d(x, w, b, **kwargs)
    out = _kernels_match_oracle_and_python(fn, [x, w, b], dtype, monkeypatch)
    # forward, both gradients: a strided input gradient scatters (whole images), a stride-1
    # one is the forward pass of the flipped kernel
    scatter = out.shape[2] * out.shape[3] if "stride" in kwargs else 1
    got = [(len(p[0]), p[2]) for p in parts[:3]]
    assert F.layout_of(out) == "NHWC" and got == [(2, 1), (2, scatter), (2, 1)]
    assert parts[0][1] == 7 and all(p[0].nbytes <= conv.BLOCK_BYTES for p in parts[:3])


# Note [Taps inside tiny planes]: (input, weight, padding)
TINY_PLANES = [
    ((3, 5, 2, 2), (4, 5, 3, 3), 1),  # a ResNet's last stage: 4 of 9 taps inside
    ((2, 4, 1, 2), (6, 4, 3, 3), 1),  # one row: a kernel row inside
    ((2, 3, 2, 1), (5, 3, 3, 3), 1),
    ((2, 3, 1, 2), (5, 3, 5, 5), 2),  # kernel rows cut at both ends
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", TINY_PLANES, ids=str)
def test_tiny_planes_multiply_only_the_taps_inside(
    case, layout, monkeypatch, im2col_on_few_channels
):
    """Forward and both gradients against the oracle, each through its taps kernel;
    with an infinite weight, the forward and the input gradient through the image-block
    path instead, whose NaN where the weight meets the padding is the oracle's (the
    weight gradient, which does not read the weight, still through its taps; with an
    infinite gradient, through the image blocks too)."""
    calls = []
    for name in ("_forward_taps", "_input_grad_taps", "_weight_grad_taps"):
        real = getattr(conv, name)
        monkeypatch.setattr(conv, name, lambda *a, _f=real, _n=name: calls.append(_n) or _f(*a))
    (xs, ws, padding), b = case, param((case[1][0],), seed=2)
    fn = lambda x, w, b: F.conv2d(x, w, b, padding=padding)
    check_against_oracle(fn, [image(xs, layout, requires_grad=True), param(ws), b])
    assert sorted(set(calls)) == ["_forward_taps", "_input_grad_taps", "_weight_grad_taps"]
    calls.clear()
    w = param(ws)
    w.detach()[0, 0, 0, 0] = np.inf
    with np.errstate(invalid="ignore"):
        outs = check_against_oracle(fn, [image(xs, layout, requires_grad=True), w, b])
    assert calls == ["_weight_grad_taps"] and np.isnan(outs[0].numpy()).any()
    calls.clear()
    grads = []
    for backend in ("numba_cpu", "numpy_ref"):
        with lm.backends.use(backend), np.errstate(invalid="ignore"):
            w = param(ws)
            out = F.conv2d(image(xs, layout), w, padding=padding)
            g = np.ones(out.shape)
            g[0, 0, 0, 0] = np.inf
            out.backward(F.to_layout(lm.asarray(g), layout))
            grads.append(w.grad.numpy())
    assert calls == ["_forward_taps"] and np.isnan(grads[0]).any()
    np.testing.assert_array_equal(np.isnan(grads[0]), np.isnan(grads[1]))


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_winograd_meets_infinities_and_nans_as_the_direct_sum_does(layout, monkeypatch):
    """Note [Winograd and infinities]: a non-finite value would spread over its tiles;
    the convolution is recomputed by im2col and equals it, finite outputs included."""
    data = np.random.default_rng(3).uniform(-1, 1, (2, 16, 9, 9))
    data[0, 2, 4, 4], data[1, 5, 0, 8] = np.inf, np.nan
    x = F.to_layout(lm.asarray(data), layout).requires_grad_()
    w = param((16, 16, 3, 3))
    fn = lambda x, w: F.conv2d(x, w, padding=1)
    (out,), grads = _run(fn, [x, w])
    monkeypatch.setattr(winograd, "ENABLED", False)
    (want,), want_grads = _run(fn, [x, w])
    got = out.numpy()
    # every output channel: the 3x3 outputs around the inf, the 2x2 at the NaN's corner
    assert np.isfinite(got).sum() == got.size - 16 * (9 + 4)
    for a, b in zip([out, *grads], [want, *want_grads]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "weight, stride, dilation, groups, dtype, suits",
    [
        ((16, 16, 3, 3), (1, 1), (1, 1), 1, np.float32, True),
        ((16, 16, 3, 3), (1, 1), (1, 1), 1, np.float64, True),
        ((8, 8, 3, 3), (1, 1), (1, 1), 1, np.float32, True),
        ((16, 7, 3, 3), (1, 1), (1, 1), 1, np.float32, False),  # too few input channels
        ((7, 16, 3, 3), (1, 1), (1, 1), 1, np.float32, False),  # too few output channels
        ((16, 16, 3, 3), (1, 2), (1, 1), 1, np.float32, False),
        ((16, 16, 3, 3), (1, 1), (2, 2), 1, np.float32, False),
        ((32, 16, 3, 3), (1, 1), (1, 1), 2, np.float32, False),
        ((16, 16, 5, 5), (1, 1), (1, 1), 1, np.float64, True),
        ((16, 16, 5, 5), (1, 1), (1, 1), 1, np.float32, False),  # "highest": im2col
        ((16, 16, 4, 4), (1, 1), (1, 1), 1, np.float64, True),
        ((16, 16, 7, 7), (1, 1), (1, 1), 1, np.float32, False),
        ((16, 16, 3, 5), (1, 1), (1, 1), 1, np.float32, False),
        ((16, 16, 3, 3), (1, 1), (1, 1), 1, np.float16, False),
    ],
)
def test_which_convolutions_winograd_takes(weight, stride, dilation, groups, dtype, suits):
    shape = (2, weight[1] * groups, 12, 12)
    geo = conv.Geometry(shape, weight, stride, (1, 1, 1, 1), dilation, groups)
    assert (winograd.algorithm(geo, dtype) is not None) is suits


def test_winograd_leaves_outputs_smaller_than_a_tile_to_im2col():
    def takes(h, w):
        return (
            winograd.algorithm(
                conv.Geometry((2, 16, h, w), (16, 16, 3, 3), (1, 1), (1,) * 4, (1, 1), 1), "f4"
            )
            is not None
        )

    assert takes(4, 9) and not takes(3, 9)


def test_set_num_threads_gives_blas_one_thread(two_threads):
    """Note [BLAS threads]: lamina's GEMMs split their work instead."""
    assert lm.get_num_threads() == 2
    assert set(lm.backends.threads.blas_num_threads()) == {1}
    lm.set_num_threads(1)
    assert set(lm.backends.threads.blas_num_threads()) == {1}
    lm.set_num_threads(2)


@pytest.mark.parametrize(
    "shapes",
    [((9, 40), (40, 7)), ((3, 5, 40), (40, 7)), ((3, 5, 40), (3, 40, 7)), ((1, 5, 40), (3, 40, 7))],
    ids=["rows", "batch_by_matrix", "batches", "broadcast_batch"],
)
def test_split_matmul_equals_numpy(shapes, two_threads, monkeypatch):
    """backends/numba_cpu/gemm.py: every product split on the result's first axis."""
    monkeypatch.setattr(gemm, "SPLIT_FLOPS", 0)
    monkeypatch.setattr(gemm, "ROWS_FLOPS", 0)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s) for s in shapes)
    np.testing.assert_allclose((lm.asarray(a) @ lm.asarray(b)).numpy(), a @ b, rtol=1e-12)
    w = rng.standard_normal((6, 40))
    got = F.linear(lm.asarray(a), lm.asarray(w)).numpy()
    np.testing.assert_allclose(got, a @ w.T, rtol=1e-12)


# ---------------------------------------------------------------- bad input


def _raises(exc, match, fn, *args, **kwargs):
    """The error comes from the operator's check (dispatch/meta.py) or a composite,
    before any kernel: numpy_ref raises the same."""
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kwargs)
    with lm.backends.use("numpy_ref"), pytest.raises(exc, match=match):
        fn(*args, **kwargs)
    return info


X = lm.zeros((2, 4, 6, 6))
W = lm.zeros((6, 4, 3, 3))

BAD_CONV = [
    ("2d", (lm.zeros((4, 6)), W), {}, ValueError, r"3-D \(C, H, W\) or 4-D .* got shape \(4, 6\)"),
    ("5d", (lm.zeros((1, 2, 4, 6, 6)), W), {}, ValueError, "got shape"),
    (
        "channels",
        (lm.zeros((2, 3, 6, 6)), W),
        {},
        ValueError,
        r"input has 3 channels, but weight \(6, 4, 3, 3\)",
    ),
    (
        "groups_divide",
        (X, lm.zeros((6, 1, 3, 3))),
        _kw(groups=3),
        ValueError,
        r"groups=3 must divide the input channels \(4\)",
    ),
    ("groups_zero", (X, W), _kw(groups=0), ValueError, "groups must be positive"),
    (
        "kernel_too_big",
        (X, lm.zeros((6, 4, 7, 7))),
        {},
        ValueError,
        r"kernel \(7 x 7.*larger than the padded input \(6 x 6",
    ),
    ("stride_zero", (X, W), _kw(stride=0), ValueError, r"stride must be positive, got \(0, 0\)"),
    ("stride_negative", (X, W), _kw(stride=(1, -1)), ValueError, "stride must be positive"),
    ("padding_negative", (X, W), _kw(padding=-1), ValueError, "padding must be non-negative"),
    ("padding_word", (X, W), _kw(padding="full"), ValueError, "'valid' or 'same'"),
    (
        "same_strided",
        (X, W),
        _kw(padding="same", stride=2),
        ValueError,
        "padding='same' needs stride 1",
    ),
    (
        "int_input",
        (lm.zeros((2, 4, 6, 6), dtype=lm.int64), W),
        {},
        TypeError,
        "input must be a real floating-point tensor, got int64",
    ),
    (
        "complex_input",
        (lm.zeros((2, 4, 6, 6), dtype=lm.complex64), W),
        {},
        TypeError,
        "input must be a real floating-point tensor, got complex64",
    ),
    ("bool_input", (lm.zeros((2, 4, 6, 6), dtype=lm.bool), W), {}, TypeError, "floating-point"),
    (
        "dtype_mix",  # explicit dtypes: X and W have the default dtype, whichever it is
        (lm.zeros((2, 4, 6, 6), dtype=lm.float32), lm.zeros((6, 4, 3, 3), dtype=lm.float64)),
        {},
        TypeError,
        "weight has dtype float64, but input has dtype float32",
    ),
    ("weight_rank", (X, lm.zeros((6, 4, 3))), {}, ValueError, "weight must be 4-D"),
    ("bias_shape", (X, W, lm.zeros(5)), {}, ValueError, r"bias must have shape \(6,\), got \(5,\)"),
    ("dilation_zero", (X, W), _kw(dilation=0), ValueError, "dilation must be positive"),
    ("stride_triple", (X, W), _kw(stride=(1, 1, 1)), ValueError, "stride must be an int or a pair"),
    ("stride_float", (X, W), _kw(stride=1.5), TypeError, "stride must be an int, got float"),
    (
        "not_a_tensor",
        (np.zeros((2, 4, 6, 6)), W),
        {},
        TypeError,
        "input must be a tensor, got ndarray",
    ),
]


@pytest.mark.parametrize("case", BAD_CONV, ids=[c[0] for c in BAD_CONV])
def test_conv2d_bad_input(case):
    _, args, kwargs, exc, match = case
    info = _raises(exc, match, F.conv2d, *args, **kwargs)
    assert info.value.args[0].startswith("conv2d:")


BAD_POOL = [
    ("kernel_too_big", (X, 7), {}, ValueError, r"output would be 0 x 0: the kernel \(7, 7\)"),
    (
        "padding_over_half",
        (X, 3),
        _kw(padding=2),
        ValueError,
        r"padding \(2, 2\) must be at most half of kernel_size \(3, 3\)",
    ),
    ("stride_zero", (X, 2), _kw(stride=0), ValueError, "stride must be positive"),
    ("kernel_zero", (X, 0), {}, ValueError, "kernel_size must be positive"),
    ("rank", (lm.zeros((6, 6)), 2), {}, ValueError, "3-D .* or 4-D"),
    ("int_input", (lm.zeros((1, 1, 4, 4), dtype=lm.int32), 2), {}, TypeError, "floating-point"),
]


@pytest.mark.parametrize(
    "fn", [F.max_pool2d, F.min_pool2d, F.avg_pool2d], ids=["max", "min", "avg"]
)
@pytest.mark.parametrize("case", BAD_POOL, ids=[c[0] for c in BAD_POOL])
def test_pooling_bad_input(fn, case):
    _, args, kwargs, exc, match = case
    _raises(exc, match, fn, *args, **kwargs)


def test_other_bad_input():
    c = lm.zeros(4)
    _raises(ValueError, "divisor_override must not be zero", F.avg_pool2d, X, 2, divisor_override=0)
    _raises(ValueError, "output_size must be positive", F.adaptive_avg_pool2d, X, 0)
    _raises(ValueError, "an int or a pair", F.adaptive_avg_pool2d, X, (1, 2, 3))
    _raises(
        ValueError,
        r"running_mean must have shape \(4,\), got \(3,\)",
        F.batch_norm,
        X,
        lm.zeros(3),
        c,
    )
    _raises(  # explicit dtypes: X and c have the default dtype, whichever it is
        TypeError,
        "running_var has dtype float64, but input has dtype float32",
        F.batch_norm,
        lm.zeros((2, 4, 6, 6), dtype=lm.float32),
        lm.zeros(4, dtype=lm.float32),
        lm.zeros(4, dtype=lm.float64),
    )
    _raises(ValueError, "needed when not training", F.batch_norm, X, None, None)
    _raises(
        ValueError,
        "more than one value per channel",
        F.batch_norm,
        lm.zeros((1, 4)),
        None,
        None,
        training=True,
    )
    _raises(
        ValueError, "2 or more dimensions", F.batch_norm, lm.zeros(4), None, None, training=True
    )
    _raises(TypeError, "running_mean must be a tensor", F.batch_norm, X, [0.0] * 4, c)
    _raises(ValueError, "3 or more dimensions", F.local_response_norm, lm.zeros((2, 4)), 3)
    _raises(ValueError, "size must be positive", F.local_response_norm, X, 0)
    _raises(TypeError, "size must be an int", F.local_response_norm, X, 2.5)
    _raises(
        ValueError,
        r"in_features=5 \(weight \(3, 5\)\), got input shape \(2, 4\)",
        F.linear,
        lm.zeros((2, 4)),
        lm.zeros((3, 5)),
    )
    _raises(
        ValueError, r"bias must have shape \(3,\)", F.linear, lm.zeros((2, 5)), lm.zeros((3, 5)), c
    )
    _raises(ValueError, "approximate must be 'none' or 'tanh'", F.gelu, X, "erf")
    _raises(TypeError, "floating-point", F.relu, lm.zeros(3, dtype=lm.int64))
    _raises(lm.AxisError, "softmax: dim 4 is out of bounds", F.softmax, X, 4)
    _raises(ValueError, "layout must be 'NCHW' or 'NHWC'", F.to_layout, X, "CHWN")
    _raises(ValueError, "needs a 4-D", F.to_layout, lm.zeros((4, 6, 6)), "NHWC")
    _raises(ValueError, "target shape .* differs", F.mse_loss, lm.zeros(3), lm.zeros(4))
    _raises(ValueError, "reduction must be 'mean', 'sum' or 'none'", F.mse_loss, c, c, "avg")


def test_loss_bad_input():
    logits = lm.zeros((3, 4))
    _raises(
        ValueError,
        r"target values must be class indices in \[0, 4\).*got 4",
        F.cross_entropy,
        logits,
        lm.asarray([0, 4, 1]),
    )
    _raises(ValueError, r"in \[0, 4\).*got -1", F.nll_loss, logits, lm.asarray([0, -1, 1]))
    # the gradient's kernel writes at each target's class: it checks them itself too
    backward = OPERATORS["nll_loss_backward"]
    for bad in ([0, 4, 1], [0, -1, 1]):
        _raises(
            ValueError,
            r"in \[0, 4\)",
            backward,
            lm.asarray(1.0),
            logits,
            lm.asarray(bad),
            None,
            -100,
            "mean",
        )
    float_target = lm.zeros(3)  # the default float dtype
    _raises(
        TypeError,
        f"target must hold integer class indices, got {float_target.dtype.name}",
        F.nll_loss,
        logits,
        float_target,
    )
    _raises(
        ValueError,
        r"target must have shape \(3,\) for input shape \(3, 4\), got \(2,\)",
        F.nll_loss,
        logits,
        lm.asarray([0, 1]),
    )
    _raises(
        ValueError,
        r"weight must have shape \(4,\)",
        F.nll_loss,
        logits,
        lm.asarray([0, 1, 2]),
        lm.zeros(3),
    )
    _raises(
        ValueError,
        "probability targets must have the input's shape",
        F.cross_entropy,
        logits,
        lm.zeros((3, 5)),
    )
    _raises(
        ValueError,
        "label_smoothing must be in",
        F.cross_entropy,
        logits,
        lm.asarray([0, 1, 2]),
        label_smoothing=2.0,
    )


# ---------------------------------------------------------------- PyTorch (optional)


def test_values_and_gradients_match_pytorch():
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    cases = [
        lambda f, x, w, b: f.conv2d(x, w, b, (2, 1), (1, 2), (1, 2), 2),
        lambda f, x, w, b: f.max_pool2d(x, 3, 2, padding=1, ceil_mode=True),
        lambda f, x, w, b: f.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        lambda f, x, w, b: f.adaptive_avg_pool2d(x, (3, 2)),
        lambda f, x, w, b: f.local_response_norm(x, 3, alpha=0.1, k=2.0),
        lambda f, x, w, b: f.batch_norm(x, None, None, b[:4] + 1.0, b[:4], training=True),
        lambda f, x, w, b: f.gelu(f.leaky_relu(x, 0.1), approximate="tanh"),
        lambda f, x, w, b: f.log_softmax(f.relu(x), 1),
    ]
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 7, 6), (6, 2, 3, 2), (6,))]
    for layout in ("NCHW", "NHWC"):
        for fn in cases:
            ours = [lm.asarray(d, requires_grad=True) for d in data]
            if layout == "NHWC":
                ours[0] = F.to_layout(ours[0].detach(), "NHWC").requires_grad_()
            theirs = [torch.tensor(d, requires_grad=True) for d in data]
            if layout == "NHWC":
                theirs[0] = theirs[0].detach().contiguous(memory_format=torch.channels_last)
                theirs[0].requires_grad_()
            out, want = fn(F, *ours), fn(tf, *theirs)
            np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
            weights = rng.standard_normal(want.shape).astype(np.float32)
            lm.sum(out * lm.asarray(weights)).backward()
            (want * torch.tensor(weights)).sum().backward()
            for a, b in zip(ours, theirs):
                if b.grad is None:
                    continue
                np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-3, atol=1e-4)
    logits, target = rng.standard_normal((6, 5)), rng.integers(0, 5, 6)
    target[2] = -100
    w = rng.random(5)
    for reduction in ("mean", "sum", "none"):
        ours = F.cross_entropy(
            lm.asarray(logits),
            lm.asarray(target),
            lm.asarray(w),
            reduction=reduction,
            label_smoothing=0.2,
        )
        theirs = tf.cross_entropy(
            torch.tensor(logits),
            torch.tensor(target),
            torch.tensor(w),
            reduction=reduction,
            label_smoothing=0.2,
        )
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-12)


def test_max_pool_computes_indices_only_for_gradients():
    x = image((1, 2, 5, 5), "NHWC", requires_grad=True)
    assert F.max_pool2d(x, 2).grad_fn.name == "max_pool2d_with_indices"
    assert F.min_pool2d(x, 2).grad_fn.name == "min_pool2d_with_indices"
    with lm.no_grad():
        values = F.max_pool2d(x, 3, 2, 1)
    np.testing.assert_array_equal(values.numpy(), F.max_pool2d(x, 3, 2, 1).detach().numpy())
    assert F.layout_of(values) == "NHWC"
