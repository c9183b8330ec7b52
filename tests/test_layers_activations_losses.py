"""silu, hardtanh, relu6, hardswish, one_hot, the binary cross entropies, l1,
smooth l1 and KL divergence losses, cross_entropy's label smoothing, and the recurrent
layers (LSTM, GRU and their cells).

The activations' parity with the oracle, gradients and layouts run on the sample
table (tests/samples.py, tests/test_autograd.py); here: PyTorch's values at NaN, inf
and the kinks (recorded from PyTorch 2.13), the losses against float64 NumPy formulas
and recorded PyTorch values, and the recurrent layers against a NumPy float64
reference written below (and PyTorch with copied weights, where importable).
"""

import math

import numpy as np
import pytest

import lamina as lm
import lamina.nn as nn
import lamina.nn.functional as F
from lamina.autograd import gradcheck
from lamina.dispatch.schema import OPERATORS

# the layers' kernels and modules, the same under both per-call cores
pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]

NAN, INF = math.nan, math.inf
SPECIALS = [NAN, INF, -INF, -3.0, 3.0, -1.0, 1.0, 0.0, 6.0, -0.0, -100.0, 100.0, 2.5]
# F(x) and dF/dx at SPECIALS, float64, recorded from PyTorch
RECORDED = {
    "silu": (
        [NAN, INF, NAN, -0.14227761953270035, 2.8577223804672998, -0.2689414213699951,
         0.7310585786300049, 0.0, 5.985164261060192, -0.0, -3.720075976020836e-42, 100.0,
         2.3103545499468914],
        [NAN, NAN, NAN, -0.08810410601516962, 1.0881041060151693, 0.07232948812851325,
         0.9276705118714869, 0.5, 1.0123264325915249, 0.5, -3.682875216260627e-42, 1.0,
         1.0994011113415267],
    ),
    "hardtanh": (
        [NAN, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0, 0.0, 1.0, -0.0, -1.0, 1.0, 1.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0],
    ),
    "relu6": (
        [NAN, 6.0, 0.0, 0.0, 3.0, 0.0, 1.0, 0.0, 6.0, -0.0, 0.0, 6.0, 2.5],
        [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
    ),
    "hardswish": (
        [NAN, INF, NAN, -0.0, 3.0, -1 / 3, 2 / 3, 0.0, 6.0, -0.0, -0.0, 100.0,
         2.2916666666666665],
        [1.0, 1.0, 0.0, 0.0, 1.0, 0.16666666666666669, 0.8333333333333333, 0.5, 1.0, 0.5,
         0.0, 1.0, 1.3333333333333335],
    ),
    "softplus": (
        [NAN, INF, 0.0, 0.04858735157374206, 3.048587351573742, 0.31326168751822286,
         1.3132616875182228, 0.6931471805599453, 6.00247568513773, 0.6931471805599453,
         3.720075976020836e-44, 100.0, 2.5788897342925496],
        [NAN, 1.0, 0.0, 0.04742587317756679, 0.9525741268224333, 0.2689414213699951,
         0.7310585786300049, 0.5, 0.9975273768433652, 0.5, 3.720075976020836e-44, 1.0,
         0.9241418199787564],
    ),
    # elu's gradient at -100 is PyTorch's exp(-100) = 3.7e-44; lamina's expm1 formula
    # (result + 1, as PyTorch's expm1) gives 0 below ~-37 (test_elu below)
    "elu": (
        [NAN, INF, -1.0, -0.950212931632136, 3.0, -0.6321205588285577, 1.0, 0.0, 6.0, -0.0,
         -1.0, 100.0, 2.5],
        [1.0, 1.0, 0.0, 0.049787068367863944, 1.0, 0.36787944117144233, 1.0, 1.0, 1.0, 1.0,
         0.0, 1.0, 1.0],
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RECORDED))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_activations_match_pytorch_at_special_values(name, dtype):
    x = lm.asarray(np.array(SPECIALS, dtype), requires_grad=True)
    y = getattr(F, name)(x)
    y.backward(lm.ones_like(y))
    values, grads = (np.array(v, dtype) for v in RECORDED[name])
    # float32: silu(-100) underflows (-0.0 in PyTorch's float32 too), the rest is exact
    tol = dict(rtol=1e-6, atol=1e-30) if dtype == "float32" else dict(rtol=1e-15, atol=0)
    np.testing.assert_allclose(y.numpy(), values, equal_nan=True, **tol)
    np.testing.assert_allclose(x.grad.numpy(), grads, equal_nan=True, **tol)
    exact = np.isfinite(values) & (values == 0)  # the signs of zero results too
    assert (np.signbit(y.numpy()) == np.signbit(values))[exact].all()


def test_activations_keep_channels_last_and_modules_match_functions():
    x = F.to_layout(lm.asarray(np.linspace(-8, 8, 2 * 3 * 4 * 5).reshape(2, 3, 4, 5)), "NHWC")
    for module, fn in [
        (nn.SiLU(), F.silu),
        (nn.Hardswish(), F.hardswish),
        (nn.ReLU6(), lambda t: F.hardtanh(t, 0.0, 6.0)),
        (nn.Hardtanh(-2.0, 0.5), lambda t: F.hardtanh(t, -2.0, 0.5)),
    ]:
        y = module(x)
        assert F.layout_of(y) == "NHWC"
        np.testing.assert_array_equal(y.numpy(), fn(lm.asarray(x.numpy().copy())).numpy())
    assert repr(nn.Hardtanh(-2.0, 0.5)) == "Hardtanh(min_val=-2.0, max_val=0.5)"
    with pytest.raises(ValueError, match="hardtanh: min_val must not exceed max_val"):
        F.hardtanh(x, 1.0, -1.0)
    with pytest.raises(ValueError, match="Hardtanh: min_val must not exceed max_val"):
        nn.Hardtanh(1.0, 0.0)
    with pytest.raises(TypeError, match="silu"):
        F.silu(lm.asarray([1, 2]))


INPLACE = {  # PyTorch's positional order: inplace comes last
    "relu": (),
    "leaky_relu": (0.2,),
    "hardtanh": (-0.5, 0.5),
    "relu6": (),
    "silu": (),
    "hardswish": (),
}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_activations_write_their_input_and_train(name):
    """Note [In-place activations]: ``F.relu(x, inplace=True)`` (a TypeError before)
    writes the result into x and returns x; under autograd the gradient is the
    out-of-place one, though the formula saved its input (run on a copy)."""
    fn, settings = getattr(F, name), INPLACE[name]
    a = np.array([-4.0, -1.0, -0.2, 0.3, 2.0, 7.0])
    x = lm.asarray(a.copy())
    assert fn(x, *settings, True) is x
    np.testing.assert_array_equal(x.numpy(), fn(lm.asarray(a), *settings).numpy())
    weights = lm.asarray(np.arange(6.0))
    grads = []
    for inplace in (False, True):
        w = lm.asarray(a.copy(), requires_grad=True)
        h = w * 2.0
        out = fn(h, *settings, inplace=inplace)
        assert (out is h) is inplace
        lm.sum(out * weights).backward()
        grads.append(w.grad.numpy())
    np.testing.assert_array_equal(grads[1], grads[0])
    leaf = lm.asarray(a.copy(), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        fn(leaf, *settings, inplace=True)


def test_elu_softplus_huber_and_pixel_shuffle_against_numpy():
    """PyTorch's other activations, loss and upscaling, as composites: float64 NumPy
    formulas, gradients by finite differences, and the modules."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 4)) * 3.0
    for alpha in (1.0, 0.3):
        want = np.where(a > 0, a, alpha * np.expm1(np.minimum(a, 0)))
        np.testing.assert_allclose(F.elu(lm.asarray(a), alpha).numpy(), want, rtol=1e-15)
        np.testing.assert_allclose(nn.ELU(alpha)(lm.asarray(a)).numpy(), want, rtol=1e-15)
    for beta, threshold in ((1.0, 20.0), (2.0, 3.0), (-1.0, 5.0)):
        b = a * beta
        want = np.where(b > threshold, a, np.log1p(np.exp(np.minimum(b, threshold))) / beta)
        got = nn.Softplus(beta, threshold)(lm.asarray(a)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-14)
    t = rng.standard_normal((3, 4))
    for delta in (0.5, 1.0, 2.5):
        d = np.abs(a - t)
        losses = np.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))
        for reduction, want in (("none", losses), ("sum", losses.sum()), ("mean", losses.mean())):
            got = nn.HuberLoss(reduction, delta)(lm.asarray(a), lm.asarray(t)).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-14)
    with pytest.raises(ValueError, match="huber_loss: delta must be positive"):
        F.huber_loss(lm.asarray(a), lm.asarray(t), delta=0.0)
    x = rng.standard_normal((2, 12, 3, 5))
    r = 2
    want = x.reshape(2, 3, r, r, 3, 5).transpose(0, 1, 4, 2, 5, 3).reshape(2, 3, 6, 10)
    for layout in ("NCHW", "NHWC"):
        shuffled = nn.PixelShuffle(r)(F.to_layout(lm.asarray(x), layout))
        np.testing.assert_array_equal(shuffled.numpy(), want)
        np.testing.assert_array_equal(nn.PixelUnshuffle(r)(shuffled).numpy(), x)
    assert F.pixel_shuffle(lm.asarray(x[0]), r).shape == (3, 6, 10)  # unbatched
    with pytest.raises(ValueError, match="pixel_shuffle: input must be .* a multiple of 4"):
        F.pixel_shuffle(lm.asarray(x[:, :6]), r)
    with pytest.raises(ValueError, match="pixel_unshuffle: the height and width"):
        F.pixel_unshuffle(lm.asarray(x), r)
    leaves = [lm.asarray(rng.standard_normal((2, 3)) * 2, requires_grad=True)]
    for fn in (F.elu, lambda v: F.softplus(v, 2.0, 1.0), lambda v: F.huber_loss(v, v * 0.5)):
        assert gradcheck(fn, leaves)
    assert gradcheck(
        lambda v: F.pixel_shuffle(v, 2), [lm.asarray(x[:1, :4, :2, :2], requires_grad=True)]
    )


# ---------------------------------------------------------------- one_hot


def test_one_hot():
    t = lm.asarray(np.array([[0, 3], [1, 1]]))
    out = F.one_hot(t)
    assert out.dtype == lm.int64 and out.shape == (2, 2, 4)
    np.testing.assert_array_equal(out.numpy(), np.eye(4, dtype=np.int64)[t.numpy()])
    assert F.one_hot(t, 6).shape == (2, 2, 6)
    assert F.one_hot(lm.asarray(np.zeros(0, np.int64)), 3).shape == (0, 3)
    np.testing.assert_array_equal(F.one_hot(lm.asarray(2), 3).numpy(), [0, 0, 1])
    for args, error, message in [
        ((lm.asarray([0, -1]),), ValueError, "class values must be non-negative, got -1"),
        ((lm.asarray([0, 3]), 3), ValueError, "smaller than num_classes=3, got 3"),
        ((lm.asarray(np.zeros(0, np.int64)),), ValueError, "cannot infer num_classes"),
        ((lm.asarray([0.0, 1.0]),), TypeError, "integer class indices"),
        ((lm.asarray([0, 1]), -2), ValueError, "num_classes must be -1 or non-negative"),
    ]:
        with pytest.raises(error, match=message):
            F.one_hot(*args)


# ---------------------------------------------------------------- losses

RNG = np.random.default_rng(7)
X = RNG.uniform(-3, 3, (3, 4))
P = RNG.uniform(0.02, 0.98, (3, 4))  # probabilities: targets, BCE's inputs
W = RNG.uniform(0.5, 2, (4,))
POS = RNG.uniform(0.5, 3, (4,))


def _log_sigmoid(x):
    return np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x)))


def _smooth_l1(d, beta):
    return np.where(np.abs(d) < beta, 0.5 * d * d / beta, np.abs(d) - 0.5 * beta)


# name -> (lamina call of (input, target, reduction), NumPy float64 losses, input, target)
LOSSES = {
    "bce": (
        lambda x, t, r: F.binary_cross_entropy(x, t, lm.asarray(W, dtype=x.dtype), reduction=r),
        lambda x, t: -W * (t * np.log(x) + (1 - t) * np.log1p(-x)),
        P[::-1],
        P,
    ),
    "bce_logits": (
        lambda x, t, r: F.binary_cross_entropy_with_logits(
            x,
            t,
            lm.asarray(W, dtype=x.dtype),
            reduction=r,
            pos_weight=lm.asarray(POS, dtype=x.dtype),
        ),
        lambda x, t: -W * (POS * t * _log_sigmoid(x) + (1 - t) * _log_sigmoid(-x)),
        X,
        P,
    ),
    "l1": (F.l1_loss, lambda x, t: np.abs(x - t), X, P),
    "smooth_l1": (
        lambda x, t, r: F.smooth_l1_loss(x, t, r, beta=0.7),
        lambda x, t: _smooth_l1(x - t, 0.7),
        X,
        P,
    ),
    "kl_div": (F.kl_div, lambda x, t: t * (np.log(t) - x), np.log(P[::-1]), P),
    "kl_div_log": (
        lambda x, t, r: F.kl_div(x, t, r, log_target=True),
        lambda x, t: np.exp(t) * (t - x),
        np.log(P[::-1]),
        np.log(P),
    ),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_losses_match_float64_formulas_and_gradients(name):
    call, formula, x, t = LOSSES[name]
    expected = formula(x, t)
    for reduction, value in [
        ("none", expected),
        ("sum", expected.sum()),
        ("mean", expected.mean()),
    ]:
        got = call(lm.asarray(x), lm.asarray(t), reduction)
        np.testing.assert_allclose(got.numpy(), value, rtol=1e-13, atol=1e-15)
    got32 = call(lm.asarray(x, dtype=lm.float32), lm.asarray(t, dtype=lm.float32), "mean")
    assert got32.dtype == lm.float32
    np.testing.assert_allclose(got32.numpy(), expected.mean(), rtol=1e-5)
    xg = lm.asarray(x, requires_grad=True)
    tg = lm.asarray(t, requires_grad=name != "bce")  # BCE's target gradient: PyTorch has none
    gradcheck(lambda a, b: call(a, b, "mean"), [xg, tg])
    empty = call(lm.zeros((0, 4), dtype=lm.float64), lm.zeros((0, 4), dtype=lm.float64), "mean")
    assert math.isnan(float(empty))  # PyTorch's mean of nothing


def test_losses_match_recorded_pytorch_values():
    x = np.linspace(-2, 2, 12).reshape(3, 4)
    t = np.linspace(0, 1, 12).reshape(3, 4)[::-1]
    w, pw = lm.asarray(np.array([0.5, 1.0, 1.5, 2.0])), lm.asarray(np.array([2.0, 1.0, 0.5, 3.0]))
    xl, tl = lm.asarray(x), lm.asarray(t)
    logp = F.log_softmax(xl, 1)
    recorded = [  # PyTorch's values of the same calls
        (F.binary_cross_entropy_with_logits(xl, tl, w, pos_weight=pw), 1.9729687815766745),
        (F.binary_cross_entropy(F.sigmoid(xl), tl, w, reduction="sum"), 17.735693148453116),
        (F.smooth_l1_loss(xl, tl, beta=0.5), 1.144283746556474),
        (F.l1_loss(xl, tl, reduction="sum"), 16.545454545454547),
        (F.kl_div(logp, F.softmax(xl[:, ::-1], 1), reduction="batchmean"), 0.31878794312812064),
        (F.kl_div(logp, F.log_softmax(xl[:, ::-1], 1), "sum", log_target=True), 0.956363829384362),
    ]
    for got, value in recorded:
        np.testing.assert_allclose(float(got), value, rtol=1e-13)


def test_cross_entropy_refuses_an_unknown_reduction_with_probability_targets_too():
    """Probability targets returned the sum for any reduction that was not 'mean'."""
    x, p = lm.zeros((2, 3)), lm.full((2, 3), 1 / 3)
    for target in (p, lm.asarray([0, 2])):
        with pytest.raises(ValueError, match="cross_entropy: reduction must be"):
            F.cross_entropy(x, target, reduction="avg")
    assert float(F.cross_entropy(x, p, reduction="sum")) == pytest.approx(2 * math.log(3))
    for target in (p, lm.asarray([0, 2])):  # a weight of the wrong size, named
        with pytest.raises(ValueError, match=r"cross_entropy: weight must .* shape \(3,\)"):
            F.cross_entropy(x, target, lm.ones(2))


def test_cross_entropy_label_smoothing_matches_recorded_pytorch_values():
    logits = lm.asarray(np.linspace(-1, 1, 15).reshape(5, 3))
    target = lm.asarray(np.array([0, 2, -100, 1, 2]))
    weight = lm.asarray(np.array([0.5, 2.0, 1.0]))
    ce = nn.CrossEntropyLoss(weight, label_smoothing=0.2)(logits, target)
    np.testing.assert_allclose(float(ce), 1.0712636060472793, rtol=1e-13)
    total = F.cross_entropy(logits, target, weight, reduction="sum", label_smoothing=0.3)
    np.testing.assert_allclose(float(total), 4.851014380359022, rtol=1e-13)
    each = F.cross_entropy(logits, target, reduction="none", label_smoothing=0.1)
    np.testing.assert_allclose(
        each.numpy(),
        [1.2339749030616376, 0.9768320459187804, 0.0, 1.1054034744902088, 0.9768320459187801],
        rtol=1e-13,
    )


def test_loss_edge_cases_and_modules():
    # BCE's logs clamp at -100: a certain wrong answer costs 100, never inf
    bce = F.binary_cross_entropy(lm.asarray([0.0, 1.0]), lm.asarray([1.0, 0.0]), reduction="none")
    np.testing.assert_array_equal(bce.numpy(), [100.0, 100.0])
    # the stable form at huge logits: no overflow, no NaN
    huge = F.binary_cross_entropy_with_logits(
        lm.asarray([-1000.0, 1000.0, 0.0]), lm.asarray([1.0, 0.0, 0.5]), reduction="none"
    )
    np.testing.assert_allclose(huge.numpy(), [1000.0, 1000.0, math.log(2)])
    kl = F.kl_div(lm.asarray([-1.0, -2.0]), lm.asarray([0.0, 0.5]), reduction="none")
    np.testing.assert_allclose(kl.numpy(), [0.0, 0.5 * (math.log(0.5) + 2.0)])  # 0 log 0 = 0
    assert float(F.kl_div(lm.zeros((0, 3)), lm.zeros((0, 3)), reduction="sum")) == 0.0
    x, t = lm.asarray(X), lm.asarray(P)
    for module, fn in [
        (nn.BCELoss(reduction="sum"), lambda: F.binary_cross_entropy(t, t, reduction="sum")),
        (nn.BCEWithLogitsLoss(pos_weight=lm.asarray(POS)), None),
        (nn.L1Loss(), lambda: F.l1_loss(x, t)),
        (nn.SmoothL1Loss(beta=0.0), lambda: F.l1_loss(x, t)),  # beta 0: l1
        (nn.KLDivLoss("batchmean"), lambda: F.kl_div(x, t, "sum") / 3),
    ]:
        args = (t, t) if isinstance(module, nn.BCELoss) else (x, t)
        expected = (
            fn() if fn else F.binary_cross_entropy_with_logits(x, t, pos_weight=module.pos_weight)
        )
        np.testing.assert_allclose(float(module(*args)), float(expected), rtol=1e-14)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda x, t: F.l1_loss(x, t[:2]), ValueError, "l1_loss: target shape"),
        (lambda x, t: F.smooth_l1_loss(x, t, beta=-1.0), ValueError, "beta must be non-negative"),
        (lambda x, t: F.kl_div(x, t, "average"), ValueError, "reduction must be"),
        (lambda x, t: F.binary_cross_entropy(x, t), ValueError, "elements of input must be in"),
        (lambda x, t: F.binary_cross_entropy(t, x), ValueError, "elements of target must be in"),
        (
            lambda x, t: F.binary_cross_entropy_with_logits(
                x, t, pos_weight=lm.ones(3, dtype=lm.float64)
            ),
            ValueError,
            "cannot be broadcast",
        ),
        (
            lambda x, t: F.binary_cross_entropy_with_logits(
                x, t, weight=lm.ones((2, 3, 4), dtype=lm.float64)
            ),
            ValueError,
            "weight of shape",
        ),
        (lambda x, t: F.l1_loss(lm.asarray([1, 2]), lm.asarray([1, 2])), TypeError, "floating"),
    ],
)
def test_losses_refuse_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call(lm.asarray(X), lm.asarray(P))


# ---------------------------------------------------------------- recurrent layers


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _lstm_step(x, h, c, w_ih, w_hh, b_ih, b_hh):
    i, f, g, o = np.split(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh, 4, axis=-1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    return _sigmoid(o) * np.tanh(c), c


def _gru_step(x, h, w_ih, w_hh, b_ih, b_hh):
    xr, xz, xn = np.split(x @ w_ih.T + b_ih, 3, axis=-1)
    hr, hz, hn = np.split(h @ w_hh.T + b_hh, 3, axis=-1)
    r, z = _sigmoid(xr + hr), _sigmoid(xz + hz)
    n = np.tanh(xn + r * hn)
    return (1 - z) * n + z * h


def _rnn_step(nonlinearity):
    def step(x, h, w_ih, w_hh, b_ih, b_hh):
        pre = x @ w_ih.T + b_ih + h @ w_hh.T + b_hh
        return np.tanh(pre) if nonlinearity == "tanh" else np.maximum(pre, 0)

    return step


def _reference(kind, module, x, h0, c0):
    """The float64 NumPy sequence loop: output (L, N, directions * H), h_n, c_n."""
    hs, cs = [], []
    directions = ("", "_reverse") if module.bidirectional else ("",)
    for layer in range(module.num_layers):
        outputs = []
        for d, suffix in enumerate(directions):
            names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if module.bias else [])
            w = [getattr(module, f"{n}_l{layer}{suffix}").numpy() for n in names] + [0.0] * (
                4 - len(names)
            )
            k = layer * len(directions) + d
            h, c, out = h0[k], c0[k], []
            for x_t in x[::-1] if d else x:
                if kind == "LSTM":
                    h, c = _lstm_step(x_t, h, c, *w)
                elif kind == "GRU":
                    h = _gru_step(x_t, h, *w)
                else:
                    h = _rnn_step(module.nonlinearity)(x_t, h, *w)
                out.append(h)
            outputs.append(np.stack(out[::-1] if d else out))
            hs.append(h)
            cs.append(c)
        x = np.concatenate(outputs, axis=-1)
    return x, np.stack(hs), np.stack(cs)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize(
    "batch_first, bias, bidirectional", [(False, True, False), (True, False, True)]
)
def test_recurrent_layers_match_numpy_reference(kind, batch_first, bias, bidirectional):
    m = getattr(nn, kind)(
        3, 4, num_layers=2, bias=bias, batch_first=batch_first, bidirectional=bidirectional,
        dtype=lm.float64,
    )  # fmt: skip
    names = [n for n, _ in m.named_parameters()]
    assert (
        names[: 4 if bias else 2]
        == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"][: 4 if bias else 2]
    )
    directions = 2 if bidirectional else 1
    assert len(names) == (4 if bias else 2) * 2 * directions
    assert bidirectional == ("weight_ih_l0_reverse" in names)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
    assert m.weight_ih_l1.shape == (gates * 4, 4 * directions)
    assert m.weight_hh_l0.shape == (gates * 4, 4)
    bound = 1 / math.sqrt(4)  # PyTorch's init: U(-1/sqrt(hidden), 1/sqrt(hidden))
    assert all(np.abs(p.numpy()).max() <= bound for p in m.parameters())
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 2, 3))  # (L, N, input)
    h0, c0 = (rng.standard_normal((2 * directions, 2, 4)) for _ in range(2))
    out_ref, h_ref, c_ref = _reference(kind, m, x, h0, c0)
    xin = x.transpose(1, 0, 2) if batch_first else x
    hx = (lm.asarray(h0), lm.asarray(c0)) if kind == "LSTM" else lm.asarray(h0)
    out, state = m(lm.asarray(xin), hx)
    h_n, c_n = state if kind == "LSTM" else (state, None)
    np.testing.assert_allclose(
        out.numpy(), out_ref.transpose(1, 0, 2) if batch_first else out_ref, rtol=1e-12, atol=1e-14
    )
    np.testing.assert_allclose(h_n.numpy(), h_ref, rtol=1e-12, atol=1e-14)
    if c_n is not None:
        np.testing.assert_allclose(c_n.numpy(), c_ref, rtol=1e-12, atol=1e-14)
    # unbatched, zero initial state
    out1, _ = m(lm.asarray(x[:, 0]))  # (L, input) whatever batch_first says
    zeros = np.zeros((2 * directions, 1, 4))
    np.testing.assert_allclose(
        out1.numpy(), _reference(kind, m, x[:, :1], zeros, zeros)[0][:, 0], rtol=1e-12, atol=1e-14
    )


def test_rnn_relu_and_cells_match_numpy_reference():
    """RNN's other nonlinearity, and RNNCell's two."""
    rng = np.random.default_rng(4)
    m = nn.RNN(3, 4, 1, "relu", False, dtype=lm.float64)  # PyTorch's positional order
    assert (m.nonlinearity, m.bias) == ("relu", False)
    x, h0 = rng.standard_normal((6, 2, 3)), rng.standard_normal((1, 2, 4))
    out, h_n = m(lm.asarray(x), lm.asarray(h0))
    out_ref, h_ref, _ = _reference("RNN", m, x, h0, h0)
    assert (out_ref == 0).any()  # some steps clipped
    np.testing.assert_allclose(out.numpy(), out_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(h_n.numpy(), h_ref, rtol=1e-12, atol=1e-14)
    for nonlinearity in ("tanh", "relu"):
        cell = nn.RNNCell(3, 4, nonlinearity=nonlinearity, dtype=lm.float64)
        w = [getattr(cell, n).numpy() for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        want = _rnn_step(nonlinearity)(x[0], h0[0], *w)
        got = cell(lm.asarray(x[0]), lm.asarray(h0[0])).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-12)
        assert cell(lm.asarray(x[0, 0])).shape == (4,)  # unbatched, zero state
    assert repr(cell) == "RNNCell(3, 4, nonlinearity=relu)"  # PyTorch's


def test_cells_match_numpy_reference():
    rng = np.random.default_rng(5)
    x, h, c = rng.standard_normal((2, 3)), rng.standard_normal((2, 4)), rng.standard_normal((2, 4))
    lstm, gru = nn.LSTMCell(3, 4, dtype=lm.float64), nn.GRUCell(3, 4, dtype=lm.float64)
    w = [getattr(lstm, n).numpy() for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    h1, c1 = lstm(lm.asarray(x), (lm.asarray(h), lm.asarray(c)))
    for got, want in zip((h1, c1), _lstm_step(x, h, c, *w)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    w = [getattr(gru, n).numpy() for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    np.testing.assert_allclose(
        gru(lm.asarray(x), lm.asarray(h)).numpy(), _gru_step(x, h, *w), rtol=1e-12
    )
    h1, c1 = lstm(lm.asarray(x[0]))  # unbatched, zero state
    assert h1.shape == c1.shape == (4,)
    zero = np.zeros(4)
    np.testing.assert_allclose(
        h1.numpy(),
        _lstm_step(
            x[0],
            zero,
            zero,
            *[getattr(lstm, n).numpy() for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")],
        )[0],
        rtol=1e-12,
    )


@pytest.mark.parametrize("kind, bidirectional", [("LSTM", False), ("GRU", True), ("RNN", True)])
def test_recurrent_gradients(kind, bidirectional):
    m = getattr(nn, kind)(2, 3, num_layers=2, bidirectional=bidirectional, dtype=lm.float64)
    directions = 2 if bidirectional else 1
    rng = np.random.default_rng(0)
    x = lm.asarray(rng.standard_normal((3, 2, 2)), requires_grad=True)
    h0 = lm.asarray(rng.standard_normal((2 * directions, 2, 3)), requires_grad=True)
    if kind == "LSTM":
        c0 = lm.asarray(rng.standard_normal((2, 2, 3)), requires_grad=True)
        gradcheck(lambda x, h, c: (lambda o, s: (o, *s))(*m(x, (h, c))), [x, h0, c0])
    else:
        gradcheck(lambda x, h: m(x, h), [x, h0])
    # the parameters' gradients against central differences of a weighted sum
    weights = lm.asarray(rng.standard_normal((3, 2, 3 * directions)))

    def loss():
        return float(lm.sum(m(x)[0] * weights))

    m.zero_grad()
    lm.sum(m(x)[0] * weights).backward()
    last = m.weight_hh_l1_reverse if bidirectional else m.weight_hh_l1
    for p in (m.weight_ih_l0, last, m.bias_hh_l0):
        data, eps = p.numpy(), 1e-6  # the parameter's own storage
        for index in [(0,) * p.ndim, tuple(s - 1 for s in p.shape)]:
            saved = data[index]
            data[index] = saved + eps
            up = loss()
            data[index] = saved - eps
            down = loss()
            data[index] = saved
            np.testing.assert_allclose(p.grad.numpy()[index], (up - down) / (2 * eps), rtol=1e-5)


def test_recurrent_layers_refuse_bad_input():
    lstm, gru = nn.LSTM(3, 4), nn.GRU(3, 4, batch_first=True)
    for call, error, message in [
        (lambda: lstm(lm.zeros((2, 3, 3, 1))), ValueError, "2-D or 3-D input"),
        (lambda: lstm(lm.zeros((2, 3, 5))), ValueError, "input of size 3 in its last axis"),
        (lambda: lstm(lm.zeros((0, 3, 3))), ValueError, "sequence of length 1 or more"),
        (
            lambda: gru(lm.zeros((2, 5, 3)), lm.zeros((1, 5, 4))),
            ValueError,
            r"h_0 of shape \(1, 2, 4\)",
        ),
        (lambda: lstm(lm.zeros((2, 3), dtype=lm.int64)), TypeError, "floating"),
        (
            lambda: nn.GRU(3, 4, bidirectional=True)(lm.zeros((2, 5, 3)), lm.zeros((1, 5, 4))),
            ValueError,
            r"h_0 of shape \(2, 5, 4\)",
        ),
        (lambda: nn.RNN(3, 4, nonlinearity="sigmoid"), ValueError, "'tanh' or 'relu'"),
        (lambda: nn.RNNCell(3, 4, nonlinearity="gelu"), ValueError, "'tanh' or 'relu'"),
        (lambda: nn.LSTM(3, 4, proj_size=2), NotImplementedError, "proj_size"),
        (lambda: nn.GRU(3, 0), ValueError, "must be positive"),
        (lambda: nn.GRUCell(3, 4)(lm.zeros((2, 5))), ValueError, r"shape \(N, 3\)"),
        (
            lambda: nn.LSTMCell(3, 4)(lm.zeros((2, 3)), (lm.zeros((2, 4)), lm.zeros((3, 4)))),
            ValueError,
            r"c of shape \(2, 4\)",
        ),
    ]:
        with pytest.raises(error, match=message):
            call()


def test_lstm_sequence_refuses_bad_arguments():
    """Its kernel indexes unchecked: its callers check every argument's shape and dtype
    first (the operator's check function, as LSTM does)."""
    seq = OPERATORS["native_lstm_sequence"]
    xw, state, w = lm.zeros((8, 3, 5)), lm.zeros((2, 5)), lm.zeros((8, 2))
    for args, error, message in [
        ((lm.zeros((7, 3, 5)), state, state, w), ValueError, r"projections must have shape"),
        ((xw, lm.zeros((2, 4)), state, w), ValueError, r"h0 of shape \(2, 5\)"),
        ((xw, state, state, lm.zeros((8, 3))), ValueError, r"weight_hh of shape \(8, 2\)"),
        ((xw, state, lm.zeros((2, 5), dtype=lm.float64), w), TypeError, "c0 must be float32"),
        ((lm.zeros((8, 3, 5), dtype=lm.int64), state, state, w), TypeError, "projections"),
    ]:
        with pytest.raises(error, match=message):
            seq.check(*args)
    output, _, _, cs, activations = seq(xw, state, state, w)
    with pytest.raises(ValueError, match=r"activations of shape \(3, 4, 2, 5\)"):
        OPERATORS["native_lstm_sequence_backward"].check(
            None, None, state, state, state, w, output, cs, activations[:2]
        )


def test_gru_sequence_refuses_bad_arguments():
    """As native_lstm_sequence's: its kernels index unchecked."""
    seq = OPERATORS["native_gru_sequence"]
    xw, h0, w, b = lm.zeros((6, 3, 5)), lm.zeros((2, 5)), lm.zeros((6, 2)), lm.zeros((6,))
    for args, error, message in [
        ((lm.zeros((7, 3, 5)), h0, w, b), ValueError, r"projections must have shape"),
        ((xw, lm.zeros((2, 4)), w, b), ValueError, r"h0 of shape \(2, 5\)"),
        ((xw, h0, lm.zeros((6, 3)), b), ValueError, r"weight_hh of shape \(6, 2\)"),
        ((xw, h0, w, lm.zeros((3,))), ValueError, r"bias_hh of shape \(6,\)"),
        ((xw, h0, w, lm.zeros((6,), dtype=lm.float64)), TypeError, "bias_hh must be float32"),
    ]:
        with pytest.raises(error, match=message):
            seq.check(*args)
    output, _, activations = seq(xw, h0, w, b)
    backward = OPERATORS["native_gru_sequence_backward"]
    with pytest.raises(ValueError, match=r"activations of shape \(3, 4, 2, 5\)"):
        backward.check(None, None, h0, w, output, activations[:2])
    with pytest.raises(ValueError, match=r"weight_hh of shape \(6, 2\)"):
        backward.check(None, h0, h0, lm.zeros((8, 2)), output, activations)


def test_recurrent_layers_match_pytorch_with_copied_weights():
    torch = pytest.importorskip("torch")
    for kind, options in [
        ("LSTM", {}), ("GRU", {}), ("LSTM", {"bidirectional": True}),
        ("RNN", {"bidirectional": True, "nonlinearity": "relu"}),
    ]:  # fmt: skip
        ours = getattr(nn, kind)(3, 5, 2, batch_first=True, dtype=lm.float64, **options)
        theirs = getattr(torch.nn, kind)(3, 5, 2, batch_first=True, dtype=torch.float64, **options)
        assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
        for name, p in theirs.named_parameters():
            getattr(ours, name).numpy()[...] = p.detach().numpy()
        x = np.random.default_rng(1).standard_normal((2, 4, 3))
        out, state = ours(lm.asarray(x, requires_grad=True))
        out_t, state_t = theirs(torch.tensor(x))
        np.testing.assert_allclose(out.numpy(), out_t.detach().numpy(), rtol=1e-12, atol=1e-14)
        h, h_t = (state[0], state_t[0]) if kind == "LSTM" else (state, state_t)
        np.testing.assert_allclose(h.numpy(), h_t.detach().numpy(), rtol=1e-12, atol=1e-14)
        out.sum().backward()
        out_t.sum().backward()
        np.testing.assert_allclose(
            ours.weight_hh_l0.grad.numpy(), theirs.weight_hh_l0.grad.numpy(), rtol=1e-10, atol=1e-13
        )
