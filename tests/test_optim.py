"""lm.optim.SGD: its update rule against a hand computation, and a small MLP trained
with it end to end (which fails if any gradient on the way is wrong)."""

import numpy as np
import pytest

import lamina as lm

F64 = lm.float64


def param(values):
    return lm.asarray(np.asarray(values, dtype=np.float64), requires_grad=True)


def set_grad(p, values):
    p.grad = lm.asarray(np.asarray(values, dtype=np.float64))


def test_plain_sgd_step():
    p = param([1.0, -2.0])
    opt = lm.optim.SGD([p], lr=0.1)
    set_grad(p, [0.5, 1.0])
    opt.step()
    assert np.allclose(p.numpy(), [0.95, -2.1])
    assert p.requires_grad and p.is_leaf and p.grad_fn is None  # not recorded


def test_sgd_momentum_and_weight_decay_by_hand():
    p = param([1.0, -2.0])
    opt = lm.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01)
    storage = p.numpy()
    set_grad(p, [0.5, 1.0])
    opt.step()
    # d = g + wd * p = [0.51, 0.98]; buf = d; p -= lr * buf
    assert np.allclose(p.numpy(), [0.949, -2.098])
    set_grad(p, [-1.0, 0.25])
    opt.step()
    # d = [-1 + 0.00949, 0.25 - 0.02098] = [-0.99051, 0.22902]
    # buf = 0.9 * [0.51, 0.98] + d = [-0.53151, 1.11102]; p -= 0.1 * buf
    assert np.allclose(p.numpy(), [0.949 + 0.053151, -2.098 - 0.111102])
    assert p.numpy() is storage or np.shares_memory(p.numpy(), storage)  # in place


def _reference(p, grads, lr, momentum, weight_decay, nesterov):
    p = np.array(p, dtype=np.float64)
    buf = None
    for g in grads:
        d = np.asarray(g) + weight_decay * p
        if momentum:
            buf = d if buf is None else momentum * buf + d
            d = d + momentum * buf if nesterov else buf
        p = p - lr * d
    return p


@pytest.mark.parametrize(
    "momentum, weight_decay, nesterov",
    [
        (0.0, 0.0, False),
        (0.0, 0.1, False),
        (0.9, 0.0, False),
        (0.5, 0.05, False),
        (0.9, 0.01, True),
    ],
)
def test_sgd_matches_the_reference_rule(momentum, weight_decay, nesterov):
    grads = [[0.5, 1.0, -0.25], [-1.0, 0.25, 0.0], [0.0, 2.0, 1.0], [0.3, -0.7, 0.1]]
    p = param([1.0, -2.0, 0.5])
    opt = lm.optim.SGD(
        [p], lr=0.05, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov
    )
    for g in grads:
        set_grad(p, g)
        opt.step()
    want = _reference([1.0, -2.0, 0.5], grads, 0.05, momentum, weight_decay, nesterov)
    assert np.allclose(p.numpy(), want, rtol=1e-12, atol=1e-14)


def test_sgd_skips_parameters_without_gradient_and_zero_grad():
    a, b = param([1.0]), param([2.0])
    opt = lm.optim.SGD([a, b], lr=0.5, momentum=0.9)
    set_grad(a, [1.0])
    opt.step()
    assert a.tolist() == [0.5] and b.tolist() == [2.0]
    opt.zero_grad()
    assert a.grad is None and b.grad is None


def test_sgd_argument_errors():
    p = param([1.0])
    for kwargs in (
        dict(lr=0.0),
        dict(lr=-0.1),
        dict(lr=0.1, momentum=-1.0),
        dict(lr=0.1, weight_decay=-1.0),
        dict(lr=0.1, nesterov=True),
    ):
        with pytest.raises(ValueError):
            lm.optim.SGD([p], **kwargs)
    with pytest.raises(ValueError, match="require grad"):
        lm.optim.SGD([lm.ones(2, dtype=F64)], lr=0.1)


def test_sgd_step_after_backward():
    w = param([1.0, 2.0])
    opt = lm.optim.SGD([w], lr=0.1)
    loss = lm.sum(w * w)
    loss.backward()
    opt.step()
    assert np.allclose(w.numpy(), [0.8, 1.6])
    opt.zero_grad()
    lm.sum(w * w).backward()
    assert np.allclose(w.grad.numpy(), [1.6, 3.2])


# ---------------------------------------------------------------- training


def _xor_blobs(n=64, seed=0):
    """Four Gaussian blobs at (+-1, +-1); the label is the sign of x1 * x2, so no linear
    model separates them: the hidden layer must learn."""
    rng = np.random.default_rng(seed)
    centers = rng.choice([-1.0, 1.0], (n, 2))
    x = centers + rng.normal(0.0, 0.2, (n, 2))
    y = centers[:, 0] * centers[:, 1]
    return lm.asarray(x), lm.asarray(y)


def _train(steps, negate_gradients=False, seed=0):
    x, y = _xor_blobs()
    rng = np.random.default_rng(seed)
    w1 = param(rng.normal(0.0, 0.7, (2, 16)))
    b1 = param(np.zeros(16))
    w2 = param(rng.normal(0.0, 0.7, (16, 1)))
    b2 = param(np.zeros(1))
    params = [w1, b1, w2, b2]
    if negate_gradients:  # a broken gradient: same code path, wrong sign
        for p in params:
            p.register_hook(lambda g: -g)
    opt = lm.optim.SGD(params, lr=0.2, momentum=0.9, weight_decay=1e-4)

    def loss_fn():
        f = lm.reshape(lm.tanh(x @ w1 + b1) @ w2 + b2, (-1,))
        return lm.mean(lm.logaddexp(0.0, -y * f)), f

    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss, _ = loss_fn()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with lm.no_grad():
        loss, f = loss_fn()
    accuracy = float(np.mean(np.sign(f.numpy()) == y.numpy()))
    return losses[0], loss.item(), accuracy


def test_mlp_learns_xor_blobs():
    first, final, accuracy = _train(150)
    assert 0.5 < first < 1.5  # near log(2) at initialization
    assert final < 0.05 and final < first / 10
    assert accuracy == 1.0


def test_mlp_with_a_broken_gradient_does_not_learn():
    first, final, accuracy = _train(150, negate_gradients=True)
    assert final > first and final > 0.5
    assert accuracy < 0.9


# ---------------------------------------------------------------- Adam, AdamW


def _adam_reference(p, grads, lr, betas, eps, weight_decay, decoupled, amsgrad):
    """Adam as written in the paper (and PyTorch's docs), in NumPy."""
    p = np.array(p, dtype=np.float64)
    m = v = v_max = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = np.asarray(g, dtype=np.float64)
        if weight_decay and decoupled:
            p = p * (1 - lr * weight_decay)
        elif weight_decay:
            g = g + weight_decay * p
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        v_max = np.maximum(v_max, v)
        m_hat = m / (1 - betas[0] ** t)
        v_hat = (v_max if amsgrad else v) / (1 - betas[1] ** t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (lm.optim.Adam, {}),
        (lm.optim.Adam, dict(lr=0.1, betas=(0.8, 0.9), weight_decay=0.05)),
        (lm.optim.Adam, dict(lr=0.05, amsgrad=True)),
        (lm.optim.AdamW, dict(lr=0.1)),
        (lm.optim.AdamW, dict(lr=0.1, weight_decay=0.3, amsgrad=True, eps=1e-3)),
    ],
    ids=["adam", "adam_l2", "amsgrad", "adamw", "adamw_amsgrad"],
)
def test_adam_update_rule(cls, kwargs):
    start = [1.0, -2.0, 0.5]
    grads = [[0.3, -1.0, 2.0], [0.1, 0.0, -2.0], [-0.5, 1.0, 0.25], [0.3, 0.3, 0.3]]
    p = param(start)
    opt = cls([p], **kwargs)
    for g in grads:
        set_grad(p, g)
        opt.step()
    full = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, amsgrad=False)
    full["weight_decay"] = 1e-2 if cls is lm.optim.AdamW else 0.0
    full.update(kwargs)
    want = _adam_reference(start, grads, decoupled=cls is lm.optim.AdamW, **full)
    np.testing.assert_allclose(p.numpy(), want, rtol=1e-12)
    assert p.is_leaf and p.grad_fn is None


def test_adam_skips_parameters_without_gradients_and_zero_grad():
    a, b = param([1.0]), param([2.0])
    opt = lm.optim.Adam([a, b], lr=0.5)
    set_grad(a, [1.0])
    opt.step()
    assert b.numpy().tolist() == [2.0] and a.numpy()[0] == pytest.approx(0.5)
    opt.zero_grad()
    assert a.grad is None


def test_adam_bad_arguments():
    p = param([1.0])
    with pytest.raises(ValueError, match="lr must be positive"):
        lm.optim.Adam([p], lr=0)
    with pytest.raises(ValueError, match=r"betas must be two numbers in \[0, 1\)"):
        lm.optim.AdamW([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="does not require grad"):
        lm.optim.Adam([lm.ones(2)])


def test_adam_matches_pytorch():
    torch = pytest.importorskip("torch")
    start = np.array([1.0, -2.0, 0.5])
    for cls, tcls, kwargs in [
        (lm.optim.Adam, torch.optim.Adam, dict(lr=0.1, weight_decay=0.01, amsgrad=True)),
        (lm.optim.AdamW, torch.optim.AdamW, dict(lr=0.1)),
    ]:
        p, tp = param(start), torch.tensor(start, requires_grad=True)
        opt, topt = cls([p], **kwargs), tcls([tp], **kwargs)
        for i in range(5):
            g = [0.3, -1.0 + i, 2.0 * (-1) ** i]
            set_grad(p, g)
            tp.grad = torch.tensor(g, dtype=torch.float64)
            opt.step()
            topt.step()
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-12)
