"""Convolution variants, padding and resizing: depthwise and grouped conv2d against the
NumPy oracle in both layouts, conv1d and conv_transpose2d against float64 references,
pad against np.pad, interpolate against PyTorch's sampling rules written out in
NumPy, their gradients by finite differences, and their bad input. PyTorch, where
importable, is an extra comparison."""

import platform

import numpy as np
import pytest

import lamina as lm
import lamina.nn.functional as F
from lamina import nn
from lamina.autograd import gradcheck
from lamina.backends.numpy_ref import nn as ref
from lamina.dispatch.schema import OPERATORS

# the layers' kernels and modules, the same under both per-call cores
pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]

RNG = np.random.default_rng(0)


def _torch():
    try:
        import torch as t
    except ImportError:
        pytest.skip("PyTorch is not importable")
    return t


def _tensor(a, layout="NCHW", grad=False):
    if layout == "NHWC":
        t = lm.asarray(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).permute(0, 3, 1, 2)
    else:
        t = lm.asarray(a)
    return t.requires_grad_() if grad else t


def _checked_conv(x, w, b, stride, padding, dilation, groups):
    """conv2d's canonical arguments (what its kernels, and the oracle's, take)."""
    pads = padding if isinstance(padding, str) else (padding, padding)
    args = (lm.asarray(x), lm.asarray(w), None if b is None else lm.asarray(b))
    return OPERATORS["conv2d"].check(*args, (stride,) * 2, pads, (dilation,) * 2, groups)


def _close(a, b, dtype):
    tol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol * 10)


# (batch, channels, H, W, kernel, stride, padding, dilation, channel multiplier)
DEPTHWISE = [
    (2, 5, 9, 7, 3, 1, 1, 1, 1),  # MobileNet's 3x3 stride 1 (odd sizes)
    (2, 4, 10, 9, 3, 2, 1, 1, 1),  # 3x3 stride 2
    (1, 3, 6, 11, 3, 2, 1, 1, 2),  # with a channel multiplier
    (2, 3, 12, 13, 5, 3, 2, 2, 1),  # dilated, wider kernel
    (2, 3, 6, 7, 2, 1, "same", 1, 3),  # even kernel, 'same'
    (0, 4, 5, 5, 3, 1, 1, 1, 1),  # empty batch
    # planes NCHW runs channels-first (Note [Depthwise order]), all kernels:
    (2, 3, 13, 11, 3, 1, 1, 1, 1),  # inner rows as one run of the plane
    (1, 2, 14, 13, 3, 1, 2, 2, 1),  # the same, dilated
    (1, 2, 23, 21, 3, 2, 1, 1, 1),  # stride 2: row by row
    (1, 2, 13, 14, 3, 1, 0, 1, 2),  # no padding (output narrower than the input), multiplier
    # 37 channels: whole vectors and a tail at every vector width (Note [Channels-last
    # depthwise forward]); at stride 1 copied zero-padded, rows of 4-pixel steps and a
    # shorter one (the image read in place: test_depthwise_padded_or_in_place_...)
    (1, 37, 21, 23, 3, 1, 1, 1, 1),
    (2, 37, 23, 21, 3, 2, 0, 1, 1),  # stride 2, no padding: read in place, 8-pixel runs
    (1, 37, 9, 7, 3, 1, 1, 1, 1),  # a small image
    (1, 37, 15, 14, 3, 1, 2, 2, 1),  # dilated: the weight gradient's nine sums per vector
    # NCHW plane by plane (Note [Channels-first depthwise forward]): output rows of 37
    # and 21 columns, whole vectors and a masked one at every vector width
    (1, 3, 9, 37, 3, 1, 1, 1, 1),
    (2, 2, 9, 41, 3, 2, 1, 1, 1),  # stride 2: even lanes of two vectors
    (1, 2, 10, 17, 3, 1, 3, 1, 1),  # padding past the kernel: the input gradient's is < 0
    (1, 3, 11, 20, 5, 1, 2, 1, 1),  # 5 x 5: weights reloaded per tap
    (1, 2, 13, 33, 3, 2, 2, 2, 2),  # dilated, strided, with a multiplier
    (1, 2, 20, 50, 3, 3, 1, 1, 1),  # stride 3, which NCHW runs channels-last
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", DEPTHWISE, ids=str)
def test_depthwise_matches_oracle(case, dtype, layout):
    n, c, h, w, k, s, p, d, m = case
    x = RNG.standard_normal((n, c, h, w)).astype(dtype)
    wt = RNG.standard_normal((c * m, 1, k, k)).astype(dtype)
    b = RNG.standard_normal(c * m).astype(dtype)
    lx, lw, lb = _tensor(x, layout, True), lm.asarray(wt).requires_grad_(), lm.asarray(b)
    lb.requires_grad_()
    out = F.conv2d(lx, lw, lb, s, p, d, c)
    g = RNG.standard_normal(out.shape).astype(dtype)
    out.backward(_tensor(g, layout))
    args = _checked_conv(x, wt, b, s, p, d, c)
    geometry = args[3:]
    _close(out.numpy(), ref.conv2d(None, *args).numpy(), dtype)
    gx = ref.conv2d_backward_input(None, lm.asarray(g), args[1], args[0], *geometry)
    gw, gb = ref.conv2d_backward_weight(None, lm.asarray(g), args[0], wt.shape, *geometry, True)
    _close(lx.grad.numpy(), gx.numpy(), dtype)
    _close(lw.grad.numpy(), gw.numpy(), dtype)
    _close(lb.grad.numpy(), gb.numpy(), dtype)
    if n and min(out.shape[2:]) > 1 and c * m > 1:  # layouts kept (both count as NCHW else)
        assert F.layout_of(out) == F.layout_of(lx.grad) == layout


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_depthwise_padded_or_in_place_sums_alike(dtype, monkeypatch):
    """Note [Channels-last depthwise forward]: an image copied zero-padded (SHARED
    pixels a step sharing their loads) and one read in place (runs of RUN pixels,
    prefetching; the border pixels one by one) sum each output's taps in the same order,
    in the same operations: bit for bit, through forward and input gradient (stride 1:
    the forward pass of the flipped kernel)."""
    from lamina.backends.numba_cpu.nn import depthwise

    x = RNG.standard_normal((2, 37, 21, 23)).astype(dtype)
    wt, b = RNG.standard_normal((37, 1, 3, 3)).astype(dtype), RNG.standard_normal(37).astype(dtype)
    g = _tensor(RNG.standard_normal((2, 37, 21, 23)).astype(dtype), "NHWC")
    found = []
    for padded in (depthwise.PADDED_BYTES, 0):
        monkeypatch.setattr(depthwise, "PADDED_BYTES", padded)
        lx = _tensor(x, "NHWC", True)
        out = F.conv2d(lx, lm.asarray(wt), lm.asarray(b), 1, 1, 1, 37)
        out.backward(g)
        found.append((out.numpy(), lx.grad.numpy()))
    for a, b in zip(*found):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("groups", [1, 2, 4, 16])
def test_every_groups_value_matches_oracle(groups, layout):
    """16 channels: 2 groups of 8 run group by group (Winograd's), 4 and 16
    (depthwise) not."""
    x, wt = RNG.standard_normal((2, 16, 7, 6)), RNG.standard_normal((16, 16 // groups, 3, 3))
    args = _checked_conv(x, wt, None, 1, 1, 1, groups)
    lx, lw = _tensor(x, layout, True), lm.asarray(wt).requires_grad_()
    out = F.conv2d(lx, lw, None, 1, 1, 1, groups)
    g = RNG.standard_normal(out.shape)
    out.backward(_tensor(g, layout))
    geometry = args[3:]
    _close(out.numpy(), ref.conv2d(None, *args).numpy(), np.float64)
    gx = ref.conv2d_backward_input(None, lm.asarray(g), args[1], args[0], *geometry)
    _close(lx.grad.numpy(), gx.numpy(), np.float64)
    gw, _ = ref.conv2d_backward_weight(None, lm.asarray(g), args[0], wt.shape, *geometry, False)
    _close(lw.grad.numpy(), gw.numpy(), np.float64)
    assert F.layout_of(out) == F.layout_of(lx.grad) == layout


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", [DEPTHWISE[i] for i in (2, 6, 8)], ids=str)  # each path
def test_depthwise_input_grad_writes_every_pixel(case, layout, monkeypatch):
    """The input gradient's images start uninitialized (a pooled buffer holds old
    values): given NaN-filled ones, every path writes or zeroes each pixel itself."""
    from lamina.backends.numba_cpu.nn import conv

    def poisoned(n, c, h, w, dtype, order):
        return np.full((n, h, w, c) if order == "NHWC" else (n, c, h, w), np.nan, dtype)

    monkeypatch.setattr(conv, "empty_image", poisoned)
    n, c, h, w, k, s, p, d, m = case
    x, wt = RNG.standard_normal((n, c, h, w)), RNG.standard_normal((c * m, 1, k, k))
    lx = _tensor(x, layout, True)
    out = F.conv2d(lx, lm.asarray(wt), None, s, p, d, c)
    g = RNG.standard_normal(out.shape)
    out.backward(_tensor(g, layout))
    args = _checked_conv(x, wt, None, s, p, d, c)
    gx = ref.conv2d_backward_input(None, lm.asarray(g), args[1], args[0], *args[3:])
    _close(lx.grad.numpy(), gx.numpy(), np.float64)


def test_depthwise_on_two_threads_runs_parts_and_matches_one_thread(monkeypatch):
    """Note [Depthwise parts]: every kernel (both layouts, forward and both gradients,
    stride 1 and 2) runs in two parts on two threads, with results one thread's up to
    the order of the weight gradient's sums."""
    from lamina.backends.numba_cpu.nn import depthwise

    parts, real = [], depthwise._kernel
    monkeypatch.setattr(
        depthwise, "_kernel", lambda *args: parts.append(args[3].shape[0]) or real(*args)
    )
    x = RNG.standard_normal((4, 8, 48, 47))  # past PARALLEL_ELEMENTS multiply-adds
    wt, b = RNG.standard_normal((8, 1, 3, 3)), RNG.standard_normal(8)
    results = {}
    before = lm.get_num_threads()
    try:
        for threads in (2, 1):
            lm.set_num_threads(threads)
            for layout in ("NCHW", "NHWC"):
                for stride in (1, 2):
                    lx, lw = _tensor(x, layout, True), lm.asarray(wt).requires_grad_()
                    out = F.conv2d(lx, lw, lm.asarray(b), stride, 1, 1, 8)
                    out.backward(_tensor(np.ones(out.shape), layout))
                    got = [out.numpy(), lx.grad.numpy(), lw.grad.numpy()]
                    results.setdefault((layout, stride), []).append(got)
            if threads == 2:
                assert parts == [2] * 12, parts
    finally:
        lm.set_num_threads(before)
    for two, one in results.values():
        for a, b_ in zip(two, one):
            np.testing.assert_allclose(a, b_, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "size, stride, expected",
    [
        # 4 x 4 images: every kernel channels-last (rows of 4 columns, 16-pixel planes)
        ((4, 4), 1, {"forward": "NHWC", "input": "NHWC", "weight": "NHWC"}),
        # 16 x 16, stride 2: rows of 16 columns run plane by plane; the gradients'
        # 256-pixel planes channels-last
        ((16, 16), 2, {"forward": "NCHW", "input": "NHWC", "weight": "NHWC"}),
        # 17 x 16: every kernel channels-first
        ((17, 16), 1, {"forward": "NCHW", "input": "NCHW", "weight": "NCHW"}),
        ((17, 16), 2, {"forward": "NCHW", "input": "NCHW", "weight": "NCHW"}),
    ],
)
def test_depthwise_nchw_kernels_run_in_the_order_of_their_plane_size(
    size, stride, expected, monkeypatch
):
    """Note [Depthwise order]: an NCHW depthwise convolution's forward pass runs plane
    by plane from rows of PLANE_COLUMNS input columns, its gradients from planes of more
    than GRAD_PLANE pixels, each kernel channels-last with transposes below; the results
    stay NCHW and match the oracle."""
    from lamina.backends.numba_cpu.nn import depthwise

    ran, real = set(), depthwise._kernel
    monkeypatch.setattr(
        depthwise, "_kernel", lambda *args: ran.add((args[1], args[0])) or real(*args)
    )
    x, wt = RNG.standard_normal((2, 5, *size)), RNG.standard_normal((5, 1, 3, 3))
    lx, lw = _tensor(x, "NCHW", True), lm.asarray(wt).requires_grad_()
    out = F.conv2d(lx, lw, None, stride, 1, 1, 5)
    g = RNG.standard_normal(out.shape)
    out.backward(_tensor(g, "NCHW"))
    # a stride-1 input gradient runs the forward kernel (of grad, the kernel flipped)
    modes = ("forward", "weight") if stride == 1 else ("forward", "input", "weight")
    assert ran == {(mode, expected[mode]) for mode in modes}
    args = _checked_conv(x, wt, None, stride, 1, 1, 5)
    _close(out.numpy(), ref.conv2d(None, *args).numpy(), np.float64)
    gx = ref.conv2d_backward_input(None, lm.asarray(g), args[1], args[0], *args[3:])
    gw, _ = ref.conv2d_backward_weight(None, lm.asarray(g), args[0], wt.shape, *args[3:], False)
    _close(lx.grad.numpy(), gx.numpy(), np.float64)
    _close(lw.grad.numpy(), gw.numpy(), np.float64)
    assert F.layout_of(out) == F.layout_of(lx.grad) == "NCHW"


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_strided_bias_is_read_by_its_strides(layout):
    """The kernels read a bias as a C array: a view with a stride is copied first
    (dense convolutions, conv1d and linear read bias.base's first values instead)."""
    x = RNG.standard_normal((2, 6, 9, 10))
    bias = RNG.standard_normal(12)
    for weight, groups in [((6, 1, 3, 3), 6), ((6, 6, 3, 3), 1), ((6, 3, 1, 1), 2)]:
        wt = lm.asarray(RNG.standard_normal(weight))
        got = F.conv2d(_tensor(x, layout), wt, lm.asarray(bias)[::2], 1, 1, 1, groups)
        want = F.conv2d(_tensor(x, layout), wt, lm.asarray(bias[::2].copy()), 1, 1, 1, groups)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    x1, w1 = lm.asarray(x[:, :, 0]), lm.asarray(RNG.standard_normal((6, 6, 3)))
    got = F.conv1d(x1, w1, lm.asarray(bias)[::2]).numpy()
    np.testing.assert_array_equal(got, F.conv1d(x1, w1, lm.asarray(bias[::2].copy())).numpy())
    for rows in (1, 100):  # linear's two products (Note [Bias first] with many rows)
        a, w = lm.asarray(RNG.standard_normal((rows, 5))), lm.asarray(RNG.standard_normal((6, 5)))
        got = F.linear(a, w, lm.asarray(bias)[::2]).numpy()
        np.testing.assert_allclose(got, a.numpy() @ w.numpy().T + bias[::2], rtol=1e-12)


@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_depthwise_infinite_weight_reaches_no_padding(value):
    """The NCHW forward pass reads zero padding (Note [Channels-first depthwise
    forward]); an infinite or NaN weight would turn it into NaN, so such a weight runs
    channels-last, which reads none: both layouts give the same, with the border's
    outputs that the tap does not reach finite."""
    x = RNG.standard_normal((2, 3, 9, 40))
    wt = RNG.standard_normal((3, 1, 3, 3))
    wt[1, 0, 0, 0] = value  # tap (0, 0) reads the padding in row 0 and column 0
    outs = [F.conv2d(_tensor(x, layout), lm.asarray(wt), None, 1, 1, 1, 3).numpy()
            for layout in ("NCHW", "NHWC")]  # fmt: skip
    np.testing.assert_array_equal(outs[0], outs[1])
    assert np.isfinite(outs[0][:, 1, 0, :]).all() and np.isfinite(outs[0][:, 1, :, 0]).all()
    assert not np.isfinite(outs[0][:, 1, 1:, 1:]).any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_explicit_vectors_of_the_plane_kernel(dtype):
    """vectors.splat, load_even and store_first (Note [Explicit vectors]) against
    NumPy: a masked store leaves the elements after its lanes alone; and the count of
    vector registers (Note [Registers]): 32 with AVX-512 or on 64-bit Arm, else 16."""
    from lamina.backends import jit
    from lamina.backends.numba_cpu import vectors as v

    def kernel(a, out, count):
        v.store_first(out, 1, v.load_even(a, 3), count)
        v.store_first(out, 40, v.splat(a, 5), count + 1)
        out[79] = v.registers()

    t, a1 = jit.types, jit.array(dtype, 1)
    run = jit.compile_kernel(kernel, t.void(a1, a1, t.int64))
    lanes = v.lanes_of(dtype)
    a, out = np.arange(100, dtype=dtype), np.full(80, -1, dtype)
    run(a, out, lanes - 3)
    expected = np.full(80, -1, dtype)
    expected[1 : lanes - 2] = np.arange(3, 3 + 2 * (lanes - 3), 2)
    expected[40 : 40 + lanes - 2] = 5
    wide = v.lanes_of(np.float32) == 16 or platform.machine() in ("aarch64", "arm64")
    expected[79] = 32 if wide else 16
    np.testing.assert_array_equal(out, expected)


def test_depthwise_gradcheck_both_layouts():
    for layout in ("NCHW", "NHWC"):
        x = _tensor(RNG.uniform(-1, 1, (2, 3, 5, 6)), layout, True)
        w = lm.asarray(RNG.uniform(-1, 1, (6, 1, 3, 3))).requires_grad_()
        assert gradcheck(lambda x, w: F.conv2d(x, w, None, 2, 1, 1, 3), [x, w])


def test_conv1d_matches_float64_reference():
    x, w, b = (
        RNG.standard_normal((2, 4, 11)),
        RNG.standard_normal((6, 2, 3)),
        RNG.standard_normal(6),
    )
    out = F.conv1d(lm.asarray(x), lm.asarray(w), lm.asarray(b), stride=2, padding=1, groups=2)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    expected = np.empty((2, 6, 6))
    for o in range(6):
        g = o // 3
        for t in range(6):
            expected[:, o, t] = (
                np.einsum("nck,ck->n", xp[:, 2 * g : 2 * g + 2, 2 * t : 2 * t + 3], w[o]) + b[o]
            )
    _close(out.numpy(), expected, np.float64)
    same = F.conv1d(lm.asarray(x[0]), lm.asarray(w), None, padding="same", dilation=2, groups=2)
    assert same.shape == (6, 11)
    assert gradcheck(lambda x, w: F.conv1d(x, w, None, 1, "same", 2, 2), [
        lm.asarray(x[:1]).requires_grad_(), lm.asarray(w).requires_grad_()])  # fmt: skip


@pytest.mark.parametrize(
    "wshape, kwargs",
    [
        ((4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1)),
        ((4, 2, 2, 2), dict(stride=2, groups=2)),
        ((4, 1, 3, 3), dict(groups=4, dilation=2, padding=2)),
        ((4, 3, 1, 1), dict(dilation=2, padding=1, output_padding=1)),
        ((4, 3, 3, 3), dict(stride=2, dilation=3, output_padding=2)),
    ],
    ids=["s2-outpad", "k2s2-groups", "depthwise-dilated", "outpad-stride", "outpad-over-stride"],
)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_transpose2d_is_conv2d_adjoint(wshape, kwargs, layout):
    """<conv_transpose2d(x), y> == <x, conv2d(y)>, with conv2d checked against the
    oracle above; the output size is PyTorch's formula. An output_padding of a stride
    or more (below the dilation) adds rows that conv2d reads past x's (read garbage)."""
    x, wt = RNG.standard_normal((2, 4, 5, 6)), RNG.standard_normal(wshape)
    out = F.conv_transpose2d(_tensor(x, layout), lm.asarray(wt), None, **kwargs)
    s, p, d = (kwargs.get(k, dflt) for k, dflt in (("stride", 1), ("padding", 0), ("dilation", 1)))
    size = [
        (n - 1) * s - 2 * p + d * (wshape[2] - 1) + kwargs.get("output_padding", 0) + 1
        for n in (5, 6)
    ]
    assert out.shape == (2, wshape[1] * kwargs.get("groups", 1), *size)
    assert F.layout_of(out) == layout
    y = RNG.standard_normal(out.shape)
    back = F.conv2d(lm.asarray(y), lm.asarray(wt), None, s, p, d, kwargs.get("groups", 1))
    extra = kwargs.get("output_padding", 0) // s  # rows and columns x has not
    assert back.shape == (*x.shape[:2], 5 + extra, 6 + extra)
    back = back.numpy()[:, :, :5, :6]
    np.testing.assert_allclose(np.sum(out.numpy() * y), np.sum(x * back), rtol=1e-10)
    b = RNG.standard_normal(out.shape[1])
    leaves = [lm.asarray(a[:1]).requires_grad_() for a in (x,)] + [
        lm.asarray(wt).requires_grad_(), lm.asarray(b).requires_grad_()]  # fmt: skip
    assert gradcheck(lambda x, w, b: F.conv_transpose2d(x, w, b, **kwargs), leaves)


@pytest.mark.parametrize(
    "wshape, kwargs",
    [
        ((4, 3, 3), dict(stride=2, padding=1, output_padding=1)),
        ((4, 2, 2), dict(groups=2, dilation=3)),
    ],
)
def test_conv_transpose1d_is_conv1d_adjoint(wshape, kwargs):
    """<conv_transpose1d(x), y> == <x, conv1d(y)> (conv1d checked against a loop above),
    its length PyTorch's formula; ConvTranspose1d and output_size pick output_padding."""
    x, wt = RNG.standard_normal((2, 4, 7)), RNG.standard_normal(wshape)
    out = F.conv_transpose1d(lm.asarray(x), lm.asarray(wt), None, **kwargs)
    defaults = {"stride": 1, "padding": 0, "dilation": 1, "output_padding": 0, "groups": 1}
    s, p, d, op, g = ({**defaults, **kwargs}[k] for k in defaults)
    length = (7 - 1) * s - 2 * p + d * (wshape[2] - 1) + op + 1
    assert out.shape == (2, wshape[1] * g, length)
    y = RNG.standard_normal(out.shape)
    back = F.conv1d(lm.asarray(y), lm.asarray(wt), None, s, p, d, g).numpy()[:, :, :7]
    np.testing.assert_allclose(np.sum(out.numpy() * y), np.sum(x * back), rtol=1e-10)
    leaves = [
        lm.asarray(a).requires_grad_()
        for a in (x[:1, :, :4], wt, RNG.standard_normal(out.shape[1]))
    ]
    assert gradcheck(lambda x, w, b: F.conv_transpose1d(x, w, b, **kwargs), leaves)
    m = nn.ConvTranspose1d(4, wshape[1] * g, wshape[2], s, p, 0, g, True, d).double()
    assert m.weight.shape == wshape
    unbatched = m(lm.asarray(x[0]), output_size=[length])  # the output_padding for it
    want = F.conv_transpose1d(lm.asarray(x[0]), m.weight, m.bias, s, p, op, g, d)
    np.testing.assert_array_equal(unbatched.numpy(), want.numpy())


def test_conv_transpose_output_size_picks_output_padding():
    """PyTorch's ``output_size``: spatial sizes or the whole shape, each from the least
    one (output_padding 0) to stride - 1 more; others are refused with the range."""
    m = nn.ConvTranspose2d(3, 4, 3, stride=(2, 3), padding=1).double()
    x = lm.asarray(RNG.standard_normal((1, 3, 5, 4)))
    for size, output_padding in [((9, 10), (0, 0)), ((10, 12), (1, 2)), ((1, 4, 10, 11), (1, 1))]:
        want = F.conv_transpose2d(x, m.weight, m.bias, (2, 3), 1, output_padding)
        np.testing.assert_array_equal(m(x, output_size=size).numpy(), want.numpy())
    for bad, message in [((11, 10), r"from \(9, 10\) to \(10, 12\)"), ((10,), "2 ints")]:
        with pytest.raises(ValueError, match=message):
            m(x, output_size=bad)


def test_conv_variants_match_pytorch():
    t = _torch()
    x, w = RNG.standard_normal((2, 4, 5, 6)), RNG.standard_normal((4, 3, 3, 3))
    ours = F.conv_transpose2d(lm.asarray(x), lm.asarray(w), None, 2, 1, 1).numpy()
    theirs = t.nn.functional.conv_transpose2d(t.from_numpy(x), t.from_numpy(w), None, 2, 1, 1)
    _close(ours, theirs.numpy(), np.float64)
    x1, w1 = RNG.standard_normal((2, 6, 9)), RNG.standard_normal((6, 1, 3))
    ours = F.conv1d(lm.asarray(x1), lm.asarray(w1), None, 2, 1, 1, 6).numpy()
    theirs = t.nn.functional.conv1d(t.from_numpy(x1), t.from_numpy(w1), None, 2, 1, 1, 6)
    _close(ours, theirs.numpy(), np.float64)
    w2 = RNG.standard_normal((6, 2, 4))
    ours = F.conv_transpose1d(lm.asarray(x1), lm.asarray(w2), None, 3, 2, 1, 2, 2).numpy()
    theirs = t.nn.functional.conv_transpose1d(
        t.from_numpy(x1), t.from_numpy(w2), None, 3, 2, 1, 2, 2
    )
    _close(ours, theirs.numpy(), np.float64)


PADS = [
    ((1, 2, 0, 3), "constant", "constant"),
    ((2, 1, 3, 0), "reflect", "reflect"),
    ((3, 3, 1, 0), "replicate", "edge"),
    ((2, 1, 3, 4), "circular", "wrap"),
]


@pytest.mark.parametrize("pad, mode, numpy_mode", PADS, ids=[p[1] for p in PADS])
def test_pad_matches_numpy(pad, mode, numpy_mode):
    x = RNG.standard_normal((2, 3, 5, 4))
    out = F.pad(_tensor(x, "NHWC"), pad, mode)
    widths = ((0, 0), (0, 0), (pad[2], pad[3]), (pad[0], pad[1]))
    np.testing.assert_array_equal(out.numpy(), np.pad(x, widths, numpy_mode))
    leaf = lm.asarray(x[:1, :2]).requires_grad_()
    assert gradcheck(lambda x: F.pad(x, pad, mode), [leaf])


def test_pad_any_axes_value_and_cropping():
    x = RNG.standard_normal((2, 3, 4, 5))
    out = F.pad(lm.asarray(x), (1, -2, -1, 2, 0, 1, 1, 0), value=1.5)
    expected = np.pad(x[:, :, 1:, : 5 - 2], ((1, 0), (0, 1), (0, 2), (1, 0)), constant_values=1.5)
    np.testing.assert_array_equal(out.numpy(), expected)
    x5 = RNG.standard_normal((1, 2, 3, 4, 5))
    out = F.pad(lm.asarray(x5), (1, 1, 2, 0, 0, 2), "reflect")
    np.testing.assert_array_equal(
        out.numpy(), np.pad(x5, ((0, 0), (0, 0), (0, 2), (2, 0), (1, 1)), "reflect")
    )
    assert gradcheck(lambda x: F.pad(x, (1, -2, 2, 0)), [lm.asarray(x[:1]).requires_grad_()])


@pytest.mark.parametrize("mode, numpy_mode", [("reflect", "reflect"), ("replicate", "edge"),
                                               ("circular", "wrap")])  # fmt: skip
def test_negative_pads_crop_in_every_mode(mode, numpy_mode):
    """Note [Negative pads]: reflect and replicate pad from the whole axis, then crop;
    circular crops, then wraps around what is left (PyTorch's two orders, recorded:
    [0, 1] reflect (-1, 1) -> [1, 0], circular (-1, 1) -> [1, 1]); an axis cropped to
    nothing gives an empty result."""
    x = RNG.standard_normal((2, 3, 5, 6))
    for pad in [(-1, 2, 1, -2), (2, -3, -1, 0), (-2, -1, 0, 1), (-4, -2, 1, -1)]:
        out = F.pad(lm.asarray(x), pad, mode)
        (left, right), (top, bottom) = pad[:2], pad[2:]
        widths = ((0, 0), (0, 0), (max(top, 0), max(bottom, 0)), (max(left, 0), max(right, 0)))

        def crop(a):
            h, w = a.shape[2:]
            return a[:, :, max(-top, 0) : h - max(-bottom, 0), max(-left, 0) : w - max(-right, 0)]

        if mode == "circular":
            expected = np.pad(crop(x), widths, numpy_mode)
        else:
            expected = crop(np.pad(x, widths, numpy_mode))
        assert out.shape == expected.shape, pad
        np.testing.assert_array_equal(out.numpy(), expected)
    assert gradcheck(
        lambda x: F.pad(x, (-1, 2, 1, -2), mode), [lm.asarray(x[:1, :2]).requires_grad_()]
    )
    row = lm.asarray(np.array([[[0.0, 1.0]]]))
    recorded = {"reflect": [1.0, 0.0], "replicate": [1.0, 1.0], "circular": [1.0, 1.0]}
    assert F.pad(row, (-1, 1), mode).numpy().ravel().tolist() == recorded[mode]
    with pytest.raises(ValueError, match="below 0"):
        F.pad(row, (-2, -1), mode)


def test_pad_modules():
    x = lm.asarray(RNG.standard_normal((1, 2, 3, 3)))
    assert nn.ZeroPad2d(1)(x).shape == (1, 2, 5, 5)
    assert float(nn.ConstantPad2d((1, 0, 0, 0), 2.0)(x).numpy()[0, 0, 0, 0]) == 2.0
    np.testing.assert_array_equal(
        nn.ReflectionPad2d(2)(x).numpy(),
        np.pad(x.numpy(), ((0, 0), (0, 0), (2, 2), (2, 2)), "reflect"),
    )
    np.testing.assert_array_equal(
        nn.ReplicationPad2d((0, 1, 2, 0))(x).numpy(),
        np.pad(x.numpy(), ((0, 0), (0, 0), (2, 0), (0, 1)), "edge"),
    )


def _nearest_index(n_in, n_out, scale):
    if n_out in (n_in, 2 * n_in):  # PyTorch's exact cases
        return np.arange(n_out) * n_in // n_out
    return np.minimum(
        np.floor(np.arange(n_out, dtype=np.float32) * np.float32(scale)).astype(int), n_in - 1
    )


def _bilinear_matrix(n_in, n_out, scale, align_corners):
    """(n_out, n_in): each output position's weights on the input positions."""
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        if align_corners:
            src = o * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
        else:
            src = max((o + 0.5) * scale - 0.5, 0.0)
        lo = min(int(np.floor(src)), n_in - 1)
        hi = min(lo + 1, n_in - 1)
        m[o, lo] += 1 - (src - lo)
        m[o, hi] += src - lo
    return m


def _bicubic_matrix(n_in, n_out, scale, align_corners, a=-0.75):
    """(n_out, n_in): Keys' cubic convolution weights of the four input positions
    around each output's source position (not clamped), taps past an edge on the edge."""

    def kernel(d):
        d = abs(d)
        if d <= 1:
            return ((a + 2) * d - (a + 3)) * d * d + 1
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a if d < 2 else 0.0

    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        if align_corners:
            src = o * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
        else:
            src = (o + 0.5) * scale - 0.5
        first = int(np.floor(src))
        for tap in range(first - 1, first + 3):
            m[o, min(max(tap, 0), n_in - 1)] += kernel(src - tap)
    return m


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(scale_factor=2, mode="nearest"),
        dict(size=(5, 11), mode="nearest"),
        dict(size=(5, 11), mode="nearest-exact"),
        dict(scale_factor=2, mode="bilinear", align_corners=False),
        dict(size=(4, 13), mode="bilinear", align_corners=False),
        dict(size=(9, 3), mode="bilinear", align_corners=True),
        dict(size=(4, 13), mode="bicubic", align_corners=False),
        dict(size=(9, 3), mode="bicubic", align_corners=True),
        dict(scale_factor=1.5, mode="bicubic", recompute_scale_factor=True),
    ],
    ids=str,
)
def test_interpolate_matches_pytorchs_rules(kwargs):
    x = RNG.standard_normal((2, 3, 6, 7))
    out = F.interpolate(_tensor(x, "NHWC"), **kwargs)
    if "size" in kwargs or kwargs.get("recompute_scale_factor"):
        size = kwargs.get("size") or (
            int(6 * kwargs["scale_factor"]),
            int(7 * kwargs["scale_factor"]),
        )
        scales = (6 / size[0], 7 / size[1])
    else:
        f = kwargs["scale_factor"]
        size, scales = (6 * f, 7 * f), (1 / f, 1 / f)
    if kwargs["mode"] == "nearest":
        rows, cols = (_nearest_index(n, o, s) for n, o, s in zip((6, 7), size, scales))
        expected = x[:, :, rows][:, :, :, cols]
    elif kwargs["mode"] == "nearest-exact":
        rows, cols = (np.minimum(((np.arange(o) + 0.5) * s).astype(int), n - 1)
                      for n, o, s in zip((6, 7), size, scales))  # fmt: skip
        expected = x[:, :, rows][:, :, :, cols]
    else:
        corners = kwargs.get("align_corners")
        matrix = _bicubic_matrix if kwargs["mode"] == "bicubic" else _bilinear_matrix
        mh, mw = (matrix(n, o, s, corners) for n, o, s in zip((6, 7), size, scales))
        expected = np.einsum("oh,nchw,pw->ncop", mh, x, mw)
    _close(out.numpy(), expected, np.float64)
    leaf = lm.asarray(x[:1, :2]).requires_grad_()
    assert gradcheck(lambda x: F.interpolate(x, **kwargs), [leaf])
    assert nn.Upsample(**kwargs)(lm.asarray(x)).shape == out.shape


def test_nearest_resizing_by_a_factor_matches_recorded_pytorch_values():
    """At the input's size or twice it PyTorch reads row o (o // 2), whatever the
    factor: 3 columns by 1.3 read columns 0, 0, 1 before."""
    recorded = {  # (width, factor): the columns read, from torch 2.13
        (3, 1.3): [0, 1, 2],
        (2, 2.3): [0, 0, 1, 1],
        (5, 1.5): [0, 0, 1, 2, 2, 3, 4],
        (4, 0.6): [0, 1],
        (3, 2.0): [0, 0, 1, 1, 2, 2],
    }
    for (width, factor), columns in recorded.items():
        x = lm.asarray(np.arange(float(width)).reshape(1, 1, 1, width))
        got = F.interpolate(x, scale_factor=(1.0, factor)).numpy()
        assert got.ravel().tolist() == columns


def test_an_empty_batch_with_a_channel_multiplier():
    """The depthwise input gradient summed its repeated channels by a reshape to -1,
    which an empty batch cannot infer."""
    for layout in ("NCHW", "NHWC"):
        x = _tensor(np.ones((0, 4, 5, 5)), layout).requires_grad_()
        w = lm.asarray(np.ones((8, 1, 3, 3))).requires_grad_()
        lm.sum(F.conv2d(x, w, groups=4)).backward()
        assert x.grad.shape == (0, 4, 5, 5) and not w.grad.numpy().any()
        out = F.conv_transpose2d(_tensor(np.ones((0, 4, 3, 3)), layout), w[:4], groups=2)
        assert out.shape == (0, 2, 5, 5)


def test_resizing_matches_pytorch():
    t = _torch()
    x = RNG.standard_normal((2, 3, 7, 5))
    for kwargs in (
        dict(scale_factor=1.7), dict(size=(10, 3), mode="bilinear"),
        dict(size=(16, 4), mode="bicubic"),
        dict(scale_factor=1.7, mode="bicubic", align_corners=True),
        dict(scale_factor=0.6, mode="nearest-exact", recompute_scale_factor=True),
    ):  # fmt: skip
        theirs = t.nn.functional.interpolate(t.from_numpy(x), **kwargs).numpy()
        _close(F.interpolate(lm.asarray(x), **kwargs).numpy(), theirs, np.float64)
    theirs = t.nn.functional.pad(t.from_numpy(x), (2, 1, 3, 3), mode="reflect").numpy()
    np.testing.assert_array_equal(F.pad(lm.asarray(x), (2, 1, 3, 3), "reflect").numpy(), theirs)


def test_adaptive_avg_pool2d_any_output_size():
    x = RNG.standard_normal((2, 3, 7, 10))
    out = F.adaptive_avg_pool2d(_tensor(x, "NHWC"), (3, 4))
    expected = np.empty((2, 3, 3, 4))
    for i in range(3):
        for j in range(4):
            r0, r1 = i * 7 // 3, -(-(i + 1) * 7 // 3)
            c0, c1 = j * 10 // 4, -(-(j + 1) * 10 // 4)
            expected[:, :, i, j] = x[:, :, r0:r1, c0:c1].mean(axis=(2, 3))
    _close(out.numpy(), expected, np.float64)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_adaptive_max_pool2d_any_output_size(layout):
    x = RNG.standard_normal((2, 3, 7, 10))
    x[0, 0, 1, 1] = np.nan  # a NaN wins its windows
    out, indices = F.adaptive_max_pool2d(_tensor(x, layout), (3, 4), return_indices=True)
    for i in range(3):
        for j in range(4):
            r0, r1 = i * 7 // 3, -(-(i + 1) * 7 // 3)
            c0, c1 = j * 10 // 4, -(-(j + 1) * 10 // 4)
            window = x[:, :, r0:r1, c0:c1].reshape(2, 3, -1)
            first = np.argmax(np.where(np.isnan(window), np.inf, window), axis=-1)
            rows, cols = r0 + first // (c1 - c0), c0 + first % (c1 - c0)
            np.testing.assert_array_equal(indices.numpy()[:, :, i, j], rows * 10 + cols)
            np.testing.assert_array_equal(out.numpy()[:, :, i, j], np.nanmax(window, -1) * (
                1 + 0 * window.sum(-1)))  # fmt: skip
    assert F.layout_of(out) == layout
    leaf = lm.asarray(RNG.standard_normal((1, 2, 5, 7))).requires_grad_()
    assert gradcheck(lambda x: F.adaptive_max_pool2d(x, (3, 2)), [leaf])
    pooled, found = nn.AdaptiveMaxPool2d((3, 4), return_indices=True)(_tensor(x, layout))
    np.testing.assert_array_equal(found.numpy(), indices.numpy())  # the module: the function
    np.testing.assert_array_equal(pooled.numpy(), out.numpy())


@pytest.mark.parametrize("mode, numpy_mode", [("reflect", "reflect"), ("replicate", "edge"),
                                              ("circular", "wrap")])  # fmt: skip
@pytest.mark.parametrize("padding, kernel, dilation", [(1, 3, 1), ((2, 1), 3, 1), ("same", 4, 2)])
def test_padding_modes_pad_as_numpy_then_convolve(mode, numpy_mode, padding, kernel, dilation):
    """Conv2d's and Conv1d's padding_mode (refused before): the input padded as
    np.pad does in that mode ('same': the odd one after), then no padding."""
    x = RNG.standard_normal((2, 3, 6, 7))
    conv = nn.Conv2d(3, 4, kernel, padding=padding, dilation=dilation, padding_mode=mode).double()
    if padding == "same":
        total = dilation * (kernel - 1)
        pairs = [(total // 2, total - total // 2)] * 2
    else:
        ph, pw = (padding, padding) if isinstance(padding, int) else padding
        pairs = [(ph, ph), (pw, pw)]
    padded = np.pad(x, [(0, 0), (0, 0), *pairs], mode=numpy_mode)
    want = F.conv2d(lm.asarray(padded), conv.weight, conv.bias, 1, 0, dilation).detach().numpy()
    for layout in ("NCHW", "NHWC"):
        np.testing.assert_allclose(conv(_tensor(x, layout)).detach().numpy(), want, atol=1e-12)
    fused = nn.Sequential(conv, nn.ReLU())  # conv2d + relu in one call: the padding kept
    np.testing.assert_allclose(
        fused(lm.asarray(x)).detach().numpy(), np.maximum(want, 0), atol=1e-12
    )
    line = nn.Conv1d(3, 4, 3, padding=2, padding_mode=mode).double()
    want = F.conv1d(lm.asarray(np.pad(x[:, :, 0], [(0, 0), (0, 0), (2, 2)], mode=numpy_mode)),
                    line.weight, line.bias).detach().numpy()  # fmt: skip
    np.testing.assert_allclose(line(lm.asarray(x[:, :, 0])).detach().numpy(), want, atol=1e-12)
    assert f"padding_mode={mode}" in repr(conv)
    leaf = lm.asarray(x[:1, :, :4, :4]).requires_grad_()
    assert gradcheck(lambda t: conv(t), [leaf])


def test_modules_conv1d_and_transpose():
    m = nn.Conv1d(4, 6, 3, padding=1, groups=2)
    assert m.weight.shape == (6, 2, 3)
    assert m(lm.asarray(RNG.standard_normal((2, 4, 9)), dtype=lm.float32)).shape == (2, 6, 9)
    t = nn.ConvTranspose2d(4, 6, 2, stride=2, groups=2)
    assert t.weight.shape == (4, 3, 2, 2)
    assert t(lm.asarray(RNG.standard_normal((1, 4, 5, 5)), dtype=lm.float32)).shape == (
        1,
        6,
        10,
        10,
    )


def _ones(*shape):
    return lm.ones(shape)


BAD = [
    (lambda: F.conv2d(lm.zeros((1, 6, 5, 5)), lm.zeros((4, 3, 3, 3)), groups=4), "groups=4"),
    (lambda: F.conv_transpose2d(_ones(1, 4, 5, 5), _ones(4, 2, 3, 3), stride=2, output_padding=2),
     "output_padding"),
    (lambda: F.conv_transpose2d(_ones(1, 6, 5, 5), _ones(6, 2, 3, 3), groups=4), "groups=4"),
    (lambda: F.pad(lm.zeros((1, 2, 3)), (1, 2, 3)), "pad must hold an even number"),
    (lambda: F.conv1d(_ones(1, 4, 5), _ones(4, 3, 3), groups=3), "groups=3"),
    (lambda: F.pad(lm.zeros((1, 2, 3)), (3, 0), "reflect"), "smaller than the size 3"),
    (lambda: F.pad(lm.zeros((1, 2, 3, 4)), (1, 1), "replicate"), "2-D or 3-D input"),
    (lambda: F.pad(lm.zeros((1, 2, 3)), (1, 1), "wrap"), "mode must be"),
    (lambda: F.interpolate(lm.zeros((1, 2, 3, 3)), size=4, scale_factor=2), "exactly one"),
    (lambda: F.interpolate(lm.zeros((1, 2, 3)), size=4), "4-D"),
    (lambda: F.interpolate(lm.zeros((1, 2, 3, 3)), 4, recompute_scale_factor=True), "needs scale"),
    (lambda: F.interpolate(lm.zeros((1, 2, 3, 3)), size=4, mode="area"), "'bicubic'"),
]  # fmt: skip


@pytest.mark.parametrize("call, message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_refused_clearly(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_conv_transpose2d_refuses_mixed_dtypes():
    weight = lm.ones((4, 2, 3, 3), dtype=lm.float64)
    with pytest.raises(TypeError, match="weight has dtype"):
        F.conv_transpose2d(lm.ones((1, 4, 5, 5), dtype=lm.float32), weight)
