"""lamina.optim: every optimizer's update rule against PyTorch's (recorded in
data/optim_reference.json by data/record_optim_reference.py, so no PyTorch is needed)
and against hand computations; the Optimizer base as PyTorch's (parameter groups, state
dicts, zero_grad, closures, atomic steps, argument checks); lamina.nn.utils (gradient
clipping, parameters as one vector); a small MLP trained end to end (which fails if any
gradient on the way is wrong)."""

import copy
import json
import math
import pathlib
import types

import numpy as np
import pytest

import lamina as lm
from lamina.nn.utils import (
    clip_grad_norm_,
    clip_grad_value_,
    parameters_to_vector,
    vector_to_parameters,
)

F64 = lm.float64
REFERENCE = json.loads(
    (pathlib.Path(__file__).parent / "data" / "optim_reference.json").read_text()
)
CLASSES = ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta"]
# for each optimizer, options under which it keeps all of its kinds of state
FULL_STATE = [
    ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("Adam", dict(lr=0.1, amsgrad=True, weight_decay=0.01)),
    ("AdamW", dict(lr=0.1)),
    ("RMSprop", dict(momentum=0.5, centered=True)),
    ("Adagrad", dict(lr_decay=0.1, initial_accumulator_value=0.1)),
    ("Adadelta", dict(weight_decay=0.1)),
]


def param(values, dtype=np.float64):
    return lm.asarray(np.array(values, dtype=dtype), requires_grad=True)  # a copy: steps write


def set_grad(p, values):
    p.grad = lm.asarray(np.array(values, dtype=p.numpy().dtype))  # a copy: clipping writes


def _grads(steps, shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.normal(0.0, 1.0, s) for s in shapes] for _ in range(steps)]


def _take_steps(opt, params, grads):
    for step in grads:
        for p, g in zip(params, step):
            set_grad(p, g)
        opt.step()


def _snapshot(opt):
    """The optimizer's state as NumPy copies, by parameter number."""
    return {
        i: {k: np.array(v.numpy() if isinstance(v, lm.Tensor) else v) for k, v in s.items()}
        for i, s in opt.state_dict()["state"].items()
    }


def _assert_same_state(got, want):
    assert got.keys() == want.keys()
    for i in want:
        assert got[i].keys() == want[i].keys()
        for k in want[i]:
            np.testing.assert_array_equal(got[i][k], want[i][k], err_msg=f"{i} {k}")


# ---------------------------------------------------------------- PyTorch's rules


def _case_id(case):
    options = ",".join(f"{k}={v}" for k, v in case["kwargs"].items())
    groups = "" if case["second_group"] is None else "+group"
    return f"{case['optimizer']}({options}){groups}"


@pytest.mark.parametrize("case", REFERENCE["optimizers"], ids=_case_id)
def test_update_rules_match_pytorch(case):
    a, b = (param(v) for v in case["start"])
    if case["second_group"] is None:
        params = [a, b]
    else:
        params = [{"params": [a]}, {"params": [b], **case["second_group"]}]
    opt = getattr(lm.optim, case["optimizer"])(params, **case["kwargs"])
    for step, ((ga, gb), want) in enumerate(zip(case["grads"], case["params"]), start=1):
        set_grad(a, ga)
        b.grad = None if gb is None else lm.asarray(np.asarray(gb))
        opt.step()
        for p, w in zip((a, b), want):
            np.testing.assert_allclose(p.numpy(), w, rtol=1e-10, atol=1e-15, err_msg=f"step {step}")
    for p, want in zip((a, b), case["state"]):
        state = opt.state[p]
        assert sorted(state) == sorted(want)
        for key, value in want.items():
            np.testing.assert_allclose(state[key].numpy(), value, rtol=1e-10, atol=1e-15)
    packed = opt.state_dict()
    assert [sorted(packed["state"][i]) for i in (0, 1)] == case["state_keys"]
    assert sorted(packed["param_groups"][0]) == case["group_keys"]
    assert a.is_leaf and a.grad_fn is None and a.requires_grad  # the step is not recorded


@pytest.mark.parametrize("name", CLASSES)
def test_float32_parameters_stay_float32(name):
    case = next(c for c in REFERENCE["optimizers"] if c["optimizer"] == name)
    a, b = (param(v, np.float32) for v in case["start"])
    opt = getattr(lm.optim, name)([a, b], **case["kwargs"])
    for ga, gb in case["grads"]:
        set_grad(a, ga)
        b.grad = None if gb is None else lm.asarray(np.asarray(gb, dtype=np.float32))
        opt.step()
    for p, want in zip((a, b), case["params"][-1]):
        assert p.dtype == lm.float32
        np.testing.assert_allclose(p.numpy(), want, rtol=1e-4, atol=1e-6)
    assert all(v.dtype == lm.float32 for k, v in opt.state[a].items() if k != "step")


def test_a_zero_learning_rate_is_allowed():
    p = param([1.0, 2.0])
    opt = lm.optim.SGD([p], lr=0.0, momentum=0.9)  # as in PyTorch (a frozen group)
    set_grad(p, [1.0, 1.0])
    opt.step()
    assert p.tolist() == [1.0, 2.0]


def test_sgd_steps_complex_parameters():
    p = lm.asarray(np.array([1 + 2j, -1j]), requires_grad=True)
    opt = lm.optim.SGD([p], lr=0.5, momentum=0.5)
    g = np.array([2 + 2j, 4 + 0j])
    for _ in range(2):
        p.grad = lm.asarray(g)
        opt.step()
    # buf = g, then 0.5 g + g
    np.testing.assert_allclose(p.numpy(), np.array([1 + 2j, -1j]) - 0.5 * g - 0.5 * 1.5 * g)
    with pytest.raises(TypeError, match="complex parameters are not supported"):
        lm.optim.Adam([lm.asarray(np.array([1j]), requires_grad=True)])


# ---------------------------------------------------------------- hand computations


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


def _float32_reference(p, grads, lr, momentum, dampening, weight_decay, nesterov, maximize):
    """PyTorch's rule step by step in float32, each operation rounded as NumPy rounds it."""
    f = np.float32
    buf = None
    for g in grads:
        d = -g if maximize else g
        d = d + f(weight_decay) * p if weight_decay else d
        if momentum:
            buf = d if buf is None else f(momentum) * buf + f(1 - dampening) * d
            d = d + f(momentum) * buf if nesterov else buf
        p = p - f(lr) * d
    return p


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(maximize=True, weight_decay=0.1),
        dict(momentum=0.9, dampening=0.3),
        dict(momentum=0.8, weight_decay=0.05, nesterov=True, maximize=True),
    ],
)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_sgd_float32_step_is_the_rule_in_one_pass(options, layout):
    """The step p -= lr * d runs as one scaled add (add_scaled_) on contiguous and
    dense parameters, NumPy's passes on strided ones: the rule's values either way."""
    rng = np.random.default_rng(3)
    start = rng.normal(0.0, 1.0, (6, 5)).astype(np.float32)
    grads = [rng.normal(0.0, 1.0, (6, 5)).astype(np.float32) for _ in range(3)]
    base = lm.asarray(
        start.T.copy().T if layout == "transposed" else start.copy(), requires_grad=True
    )
    if layout == "strided":
        base = lm.asarray(np.repeat(start, 2, axis=1), requires_grad=True)
        with lm.no_grad():
            p = base[:, ::2]
    else:
        p = base
    full = dict(lr=0.05, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)
    full.update(options, maximize=options.get("maximize", False))
    opt = lm.optim.SGD([p], **full)
    for g in grads:
        p.grad = lm.asarray(g.copy())
        opt.step()
    want = _float32_reference(start, grads, **full)
    assert p.dtype == lm.float32
    np.testing.assert_allclose(p.numpy(), want, rtol=1e-6, atol=1e-6)


def test_sgd_skips_parameters_without_gradient_and_zero_grad():
    a, b = param([1.0]), param([2.0])
    opt = lm.optim.SGD([a, b], lr=0.5, momentum=0.9)
    set_grad(a, [1.0])
    opt.step()
    assert a.tolist() == [0.5] and b.tolist() == [2.0]
    opt.zero_grad()
    assert a.grad is None and b.grad is None


def test_sgd_argument_errors():
    # lr=0.0 is allowed, as in PyTorch (test_a_zero_learning_rate_is_allowed)
    p = param([1.0])
    for kwargs in (
        dict(lr=float("nan")),
        dict(lr=-0.1),
        dict(lr=0.1, momentum=-1.0),
        dict(lr=0.1, weight_decay=-1.0),
        dict(lr=0.1, nesterov=True),
    ):
        with pytest.raises(ValueError):
            lm.optim.SGD([p], **kwargs)


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


# ---------------------------------------------------------------- parameter groups


def test_param_groups_take_their_own_options():
    a, b = param([1.0, 2.0]), param([3.0])
    opt = lm.optim.SGD([{"params": a}, {"params": [b], "lr": 1e-3}], lr=1e-2, momentum=0.9)
    first, second = opt.param_groups
    assert len(first["params"]) == 1 and first["params"][0] is a
    assert first["lr"] == 1e-2 and second["lr"] == 1e-3
    assert first["momentum"] == second["momentum"] == 0.9
    assert set(first) == set(second) == {"params", *opt.defaults}
    assert opt.defaults["lr"] == 1e-2 and "params" not in opt.defaults
    set_grad(a, [1.0, 1.0])
    set_grad(b, [1.0])
    opt.step()
    np.testing.assert_allclose(a.numpy(), [1.0 - 1e-2, 2.0 - 1e-2])
    np.testing.assert_allclose(b.numpy(), [3.0 - 1e-3])
    assert "Parameter Group 1" in repr(opt) and "lr: 0.001" in repr(opt)


def test_add_param_group():
    a, b, c = param([1.0]), param([2.0]), param([3.0])
    opt = lm.optim.Adam([a], lr=0.1)
    opt.add_param_group({"params": b, "lr": 0.01})
    assert len(opt.param_groups) == 2
    assert opt.param_groups[1]["lr"] == 0.01 and opt.param_groups[1]["betas"] == (0.9, 0.999)
    for group, error, message in [
        ({"params": [a, c]}, ValueError, "more than one parameter group"),
        ({"params": [c, c]}, ValueError, "appears twice in one parameter group"),
        ({"params": {c}}, TypeError, "not a set"),
        ({"params": [c], "lr": -1.0}, ValueError, "Adam: lr must be a finite number >= 0"),
        ({"params": [c], "betas": (0.9, 2.0)}, ValueError, r"betas must be two numbers"),
        ({"lr": 0.1}, ValueError, "needs the key 'params'"),
        ([c], TypeError, "must be a dict"),
    ]:
        with pytest.raises(error, match=message):
            opt.add_param_group(group)
    assert len(opt.param_groups) == 2  # nothing refused was added
    set_grad(b, [1.0])
    opt.step()
    assert b.item() == pytest.approx(2.0 - 0.01) and a.item() == 1.0


def test_adagrad_makes_the_state_of_added_groups():
    a, b = param([1.0]), param([2.0])
    opt = lm.optim.Adagrad([a], initial_accumulator_value=0.5)
    opt.add_param_group({"params": [b], "initial_accumulator_value": 2.0})
    assert opt.state[a]["sum"].tolist() == [0.5] and opt.state[b]["sum"].tolist() == [2.0]
    assert float(opt.state[b]["step"]) == 0.0


def test_named_parameters_are_accepted():
    model = lm.nn.Linear(2, 1, dtype=F64)
    opt = lm.optim.SGD(model.named_parameters(), lr=0.1)
    assert opt.param_groups[0]["param_names"] == ["weight", "bias"]
    assert opt.param_groups[0]["params"][0] is model.weight
    assert opt.state_dict()["param_groups"][0]["param_names"] == ["weight", "bias"]
    with pytest.raises(ValueError, match="every parameter a name, or none"):
        lm.optim.SGD([("w", param([1.0])), param([2.0])], lr=0.1)


# ---------------------------------------------------------------- state dicts


@pytest.mark.parametrize("name, kwargs", FULL_STATE, ids=[n for n, _ in FULL_STATE])
def test_state_dict_round_trip_continues_exactly(name, kwargs):
    cls = getattr(lm.optim, name)
    grads = _grads(5, [(3,), (2, 2)])
    a, b = param([1.0, -2.0, 0.5]), param([[0.3, -0.7], [1.2, 0.05]])
    opt = cls([{"params": [a]}, {"params": [b], "lr": 0.05}], **kwargs)
    _take_steps(opt, [a, b], grads[:2])
    saved = opt.state_dict()
    assert set(saved) == {"state", "param_groups"}
    assert set(saved["state"]) == {0, 1}
    assert [g["params"] for g in saved["param_groups"]] == [[0], [1]]
    assert saved["param_groups"][1]["lr"] == 0.05
    before = _snapshot(opt)

    a2, b2 = param(a.numpy().copy()), param(b.numpy().copy())
    twin = cls([{"params": [a2]}, {"params": [b2]}], **kwargs)
    twin.load_state_dict(saved)
    assert twin.param_groups[1]["lr"] == 0.05 and twin.param_groups[1]["params"][0] is b2
    for p, p2 in ((a, a2), (b, b2)):
        for key, value in opt.state[p].items():
            assert twin.state[p2][key] is not value  # copied on load
            np.testing.assert_array_equal(twin.state[p2][key].numpy(), value.numpy())
    _take_steps(opt, [a, b], grads[2:])
    _take_steps(twin, [a2, b2], grads[2:])
    np.testing.assert_array_equal(a2.numpy(), a.numpy())
    np.testing.assert_array_equal(b2.numpy(), b.numpy())
    # a state dict is a snapshot: the steps after it did not change it
    _assert_same_state(
        {i: {k: np.array(v.numpy()) for k, v in s.items()} for i, s in saved["state"].items()},
        before,
    )


def test_load_state_dict_casts_to_the_parameters_dtype():
    a = param([1.0, 2.0])
    opt = lm.optim.Adam([a], lr=0.1)
    set_grad(a, [0.5, -0.5])
    opt.step()
    a32 = param([1.0, 2.0], np.float32)
    opt32 = lm.optim.Adam([a32], lr=0.1)
    opt32.load_state_dict(opt.state_dict())
    state = opt32.state[a32]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == lm.float32
    assert state["step"].dtype == opt.state[a]["step"].dtype  # step keeps its own, as PyTorch
    set_grad(a32, [0.5, -0.5])
    opt32.step()
    assert a32.dtype == lm.float32


def test_load_state_dict_refuses_another_layout():
    a, b = param([1.0]), param([2.0, 3.0])
    opt = lm.optim.SGD([a, b], lr=0.1, momentum=0.9)
    set_grad(a, [1.0])
    set_grad(b, [1.0, 1.0])
    opt.step()
    saved = opt.state_dict()
    with pytest.raises(ValueError, match="2 parameter groups in the state dict|has 1 parameter"):
        lm.optim.SGD([{"params": [a]}, {"params": [b]}], lr=0.1).load_state_dict(saved)
    with pytest.raises(ValueError, match="has 2 parameters in the state dict, 1 in the optimizer"):
        lm.optim.SGD([a], lr=0.1).load_state_dict(saved)
    c, d = param([1.0]), param([2.0, 3.0, 4.0])
    other = lm.optim.SGD([c, d], lr=0.1, momentum=0.9)
    with pytest.raises(
        ValueError, match=r"momentum_buffer of shape \(2,\) for a parameter of shape \(3,\)"
    ):
        other.load_state_dict(saved)
    assert other.state_dict()["state"] == {}  # a refused load changes nothing
    bad = copy.deepcopy(saved)
    bad["param_groups"][0]["lr"] = float("nan")
    with pytest.raises(ValueError, match="lr must be a finite number"):
        lm.optim.SGD([a, b], lr=0.1).load_state_dict(bad)


def test_adamw_stays_decoupled_after_loading_an_adam_state_dict():
    a = param([1.0])
    adam = lm.optim.Adam([a], weight_decay=0.1)
    adamw = lm.optim.AdamW([param([1.0])])
    adamw.load_state_dict(adam.state_dict())
    assert adamw.param_groups[0]["decoupled_weight_decay"] is True


# ---------------------------------------------------------------- zero_grad, closures


def test_zero_grad_sets_to_none_or_zeroes_in_place():
    a, b = param([1.0, 2.0]), param([3.0])
    opt = lm.optim.SGD([a, b], lr=0.1, momentum=0.9)
    set_grad(a, [3.0, 4.0])
    opt.step()
    grad = a.grad
    opt.zero_grad(set_to_none=False)
    assert a.grad is grad and grad.tolist() == [0.0, 0.0] and b.grad is None
    # the first momentum buffer is a copy of the gradient, not the gradient itself
    assert opt.state[a]["momentum_buffer"].tolist() == [3.0, 4.0]
    opt.zero_grad()
    assert a.grad is None


def test_step_with_a_closure_returns_its_loss():
    w = param([1.0, 2.0])
    opt = lm.optim.SGD([w], lr=0.1)
    modes = []

    def closure():
        opt.zero_grad()
        modes.append(lm.autograd.is_grad_enabled())
        loss = lm.sum(w * w)
        loss.backward()
        return loss

    with lm.no_grad():  # the closure runs with grad mode on all the same
        loss = opt.step(closure)
    assert modes == [True] and loss.item() == 5.0
    np.testing.assert_allclose(w.numpy(), [0.8, 1.6])
    assert opt.step() is None


# ---------------------------------------------------------------- atomic steps


@pytest.mark.parametrize("name, kwargs", FULL_STATE, ids=[n for n, _ in FULL_STATE])
def test_a_step_that_raises_changes_nothing(name, kwargs):
    cls = getattr(lm.optim, name)
    grads = _grads(2, [(3,), (2, 2)], seed=1)
    start = [np.array([1.0, -2.0, 0.5]), np.array([[0.3, -0.7], [1.2, 0.05]])]
    params = [param(v) for v in start]
    opt = cls([{"params": [params[0]]}, {"params": [params[1]]}], **kwargs)
    _take_steps(opt, params, grads[:1])
    values, state = [p.numpy().copy() for p in params], _snapshot(opt)
    lr = opt.param_groups[1]["lr"]
    opt.param_groups[1]["lr"] = "fast"  # the second group's update fails to compute
    for p, g in zip(params, grads[1]):
        set_grad(p, g)
    with pytest.raises(TypeError):
        opt.step()
    for p, v in zip(params, values):
        np.testing.assert_array_equal(p.numpy(), v)
    _assert_same_state(_snapshot(opt), state)
    opt.param_groups[1]["lr"] = lr
    opt.step()  # the same step again, now that it computes
    twins = [param(v) for v in start]
    twin = cls([{"params": [twins[0]]}, {"params": [twins[1]]}], **kwargs)
    _take_steps(twin, twins, grads)
    for p, t in zip(params, twins):
        np.testing.assert_array_equal(p.numpy(), t.numpy())
    _assert_same_state(_snapshot(opt), _snapshot(twin))


def test_a_gradient_of_the_wrong_shape_changes_nothing():
    a, b = param([1.0, 2.0]), param([3.0])
    opt = lm.optim.Adam([a, b], lr=0.1)
    set_grad(a, [1.0, 1.0])
    set_grad(b, [1.0])
    opt.step()
    values, state = [a.numpy().copy(), b.numpy().copy()], _snapshot(opt)
    set_grad(a, [1.0, 1.0])
    # the .grad setter refuses this; here the gradient goes wrong behind its back
    b.__dict__["grad"] = lm.asarray(np.ones(4))
    with pytest.raises(RuntimeError, match=r"shape \(1,\).*gradient of shape \(4,\)"):
        opt.step()
    np.testing.assert_array_equal(a.numpy(), values[0])
    np.testing.assert_array_equal(b.numpy(), values[1])
    _assert_same_state(_snapshot(opt), state)


# ---------------------------------------------------------------- argument checks

NAN, INF = float("nan"), float("inf")
BAD_OPTIONS = [
    ("SGD", dict(lr=-0.1), ValueError, "SGD: lr must be a finite number >= 0, got -0.1"),
    ("SGD", dict(lr=NAN), ValueError, "SGD: lr must be a finite number >= 0, got nan"),
    ("SGD", dict(lr=INF), ValueError, "SGD: lr must be a finite number >= 0, got inf"),
    ("SGD", dict(lr="0.1"), TypeError, "SGD: lr must be a real number, got str"),
    ("SGD", dict(momentum=-0.5), ValueError, "SGD: momentum must be a finite number >= 0"),
    ("SGD", dict(momentum=NAN), ValueError, "SGD: momentum must be a finite number >= 0"),
    ("SGD", dict(dampening=NAN), ValueError, "SGD: dampening must be a finite number, got nan"),
    ("SGD", dict(weight_decay=-1.0), ValueError, "SGD: weight_decay must be a finite number"),
    (
        "SGD",
        dict(nesterov=True),
        ValueError,
        "SGD: nesterov=True needs momentum > 0 and dampening 0",
    ),
    ("SGD", dict(momentum=0.9, dampening=0.1, nesterov=True), ValueError, "nesterov=True needs"),
    ("SGD", dict(nesterov="yes"), TypeError, "SGD: nesterov must be a bool, got str"),
    ("SGD", dict(maximize=None), TypeError, "SGD: maximize must be a bool, got NoneType"),
    ("SGD", dict(differentiable=True), ValueError, "differentiable=True is not supported"),
    ("Adam", dict(betas=(0.9, 1.0)), ValueError, r"Adam: betas must be two numbers in \[0, 1\)"),
    ("Adam", dict(betas=(NAN, 0.9)), ValueError, r"betas must be two numbers in \[0, 1\)"),
    ("Adam", dict(betas=0.9), TypeError, "Adam: betas must be a pair of numbers"),
    ("Adam", dict(betas=(0.9, "x")), TypeError, r"Adam: betas\[1\] must be a real number"),
    ("Adam", dict(eps=-1e-8), ValueError, "Adam: eps must be a finite number >= 0"),
    ("Adam", dict(amsgrad=1.5), TypeError, "Adam: amsgrad must be a bool, got float"),
    ("AdamW", dict(weight_decay=NAN), ValueError, "AdamW: weight_decay must be a finite number"),
    ("RMSprop", dict(alpha=-0.1), ValueError, "RMSprop: alpha must be a finite number >= 0"),
    ("RMSprop", dict(eps=NAN), ValueError, "RMSprop: eps must be a finite number >= 0"),
    ("RMSprop", dict(momentum=-0.5), ValueError, "RMSprop: momentum must be a finite number"),
    ("Adagrad", dict(lr_decay=-0.1), ValueError, "Adagrad: lr_decay must be a finite number"),
    (
        "Adagrad",
        dict(initial_accumulator_value=-1.0),
        ValueError,
        "Adagrad: initial_accumulator_value must be a finite number >= 0",
    ),
    ("Adagrad", dict(eps=INF), ValueError, "Adagrad: eps must be a finite number >= 0, got inf"),
    ("Adadelta", dict(rho=1.5), ValueError, r"Adadelta: rho must be a number in \[0, 1\], got 1.5"),
    ("Adadelta", dict(rho=NAN), ValueError, r"Adadelta: rho must be a number in \[0, 1\]"),
    ("Adadelta", dict(lr=-1.0), ValueError, "Adadelta: lr must be a finite number >= 0"),
]


@pytest.mark.parametrize(
    "name, kwargs, error, message", BAD_OPTIONS, ids=[f"{n}-{k}" for n, k, _, _ in BAD_OPTIONS]
)
def test_bad_options_are_refused_naming_them(name, kwargs, error, message):
    cls = getattr(lm.optim, name)
    with pytest.raises(error, match=message):
        cls([param([1.0])], **kwargs)
    # the same option in a parameter group is checked the same way
    with pytest.raises(error, match=message):
        cls([{"params": [param([1.0])]}, {"params": [param([2.0])], **kwargs}])


@pytest.mark.parametrize("name", CLASSES)
def test_frozen_parameters_are_kept_and_left_alone(name):
    """PyTorch's rule: a parameter that does not require grad (a frozen layer) may be
    passed; with no gradient it is skipped, while the others move."""
    frozen, trained = lm.ones(2, dtype=F64), param([1.0, 2.0])
    opt = getattr(lm.optim, name)([frozen, trained], lr=0.5)
    trained.grad = lm.asarray([1.0, -1.0], dtype=F64)
    opt.step()
    assert frozen.tolist() == [1.0, 1.0]
    # Adagrad, as PyTorch's, makes every parameter's state when it is built; none is used
    assert frozen not in opt.state or name == "Adagrad"
    assert trained.tolist() != [1.0, 2.0]


@pytest.mark.parametrize("name", CLASSES)
def test_bad_parameters_are_refused(name):
    cls = getattr(lm.optim, name)
    with pytest.raises(ValueError, match=f"{name}: optimizer got an empty parameter list"):
        cls([])
    leaf = param([1.0, 2.0])
    with pytest.raises(ValueError, match="can't optimize a non-leaf tensor"):
        cls([leaf * 2.0])
    with pytest.raises(TypeError, match="got one tensor; pass \\[tensor\\]"):
        cls(leaf)
    with pytest.raises(TypeError, match="parameter 1 is a float"):
        cls([leaf, 1.0])
    with pytest.raises(ValueError, match="lr must be a finite number"):  # defaults too
        cls([{"params": [leaf], "lr": 0.1}], lr=NAN)


def test_steps_check_the_types_of_options_not_their_ranges():
    # as in PyTorch, a schedule may take the rate below 0 (a linear OneCycleLR's end)
    p = param([1.0])
    opt = lm.optim.SGD([p], lr=0.1, momentum=0.5)
    opt.param_groups[0]["lr"] = -0.5
    set_grad(p, [1.0])
    opt.step()
    assert p.tolist() == [1.5]
    opt.param_groups[0]["momentum"] = "high"
    with pytest.raises(TypeError, match="SGD: momentum must be a real number, got str"):
        opt.step()
    assert p.tolist() == [1.5]


# ---------------------------------------------------------------- the namespace


def test_the_optim_namespace_holds_only_public_names_and_submodules():
    def submodule(name):
        value = getattr(lm.optim, name)
        return isinstance(value, types.ModuleType) and value.__name__ == f"lamina.optim.{name}"

    names = [n for n in dir(lm.optim) if not (n.startswith("__") and n.endswith("__"))]
    assert [n for n in names if n not in lm.optim.__all__ and not submodule(n)] == []
    assert set(lm.optim.__all__) <= set(names)
    assert {"math", "no_grad", "checked", "ops"}.isdisjoint(names)
    assert lm.optim.lr_scheduler.StepLR.__module__ == "lamina.optim.lr_scheduler"
    assert all(issubclass(getattr(lm.optim, n), lm.optim.Optimizer) for n in CLASSES)


def test_a_custom_optimizer_overriding_step():
    class Halve(lm.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.5})

        def step(self, closure=None):
            with lm.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p -= group["lr"] * p.grad
                            self.state[p]["count"] = self.state[p].get("count", 0) + 1

    p = param([2.0])
    opt = Halve([p])
    set_grad(p, [2.0])
    opt.step()
    assert p.tolist() == [1.0] and opt.state_dict()["state"] == {0: {"count": 1}}
    assert opt._opt_called  # seen by the schedulers


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
    with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
        lm.optim.Adam([p], lr=-1e-3)
    with pytest.raises(ValueError, match=r"betas must be two numbers in \[0, 1\)"):
        lm.optim.AdamW([p], betas=(0.9, 1.0))


# ---------------------------------------------------------------- nn.utils


def _with_grads(seed=0, shapes=((3,), (2, 2), (4,))):
    rng = np.random.default_rng(seed)
    params = [param(rng.normal(0.0, 1.0, s)) for s in shapes]
    grads = [rng.normal(0.0, 1.0, s) for s in shapes]
    for p, g in zip(params, grads):
        set_grad(p, g)
    return params, grads


@pytest.mark.parametrize("norm_type", [2.0, 1.0, INF, 3.0, 0.5])
def test_clip_grad_norm_against_numpy(norm_type):
    params, grads = _with_grads()
    flat = np.concatenate([g.ravel() for g in grads])
    want = (
        np.max(np.abs(flat))
        if norm_type == INF
        else np.sum(np.abs(flat) ** norm_type) ** (1 / norm_type)
    )
    max_norm = want / 3
    total = clip_grad_norm_(params, max_norm, norm_type=norm_type)
    assert isinstance(total, lm.Tensor) and total.shape == () and total.dtype == F64
    np.testing.assert_allclose(total.item(), want, rtol=1e-12)
    scale = max_norm / (want + 1e-6)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad.numpy(), g * scale, rtol=1e-12)


def test_clip_grad_norm_leaves_small_gradients_and_skips_missing_ones():
    params, grads = _with_grads()
    extra = param([5.0])  # no gradient: left out
    storage = params[0].grad
    total = clip_grad_norm_([*params, extra], max_norm=100.0)
    flat = np.concatenate([g.ravel() for g in grads])
    np.testing.assert_allclose(total.item(), np.linalg.norm(flat), rtol=1e-12)
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(p.grad.numpy(), g)  # scale 1
    assert params[0].grad is storage and extra.grad is None  # in place
    one = clip_grad_norm_(params[0], max_norm=0.5)  # one tensor
    np.testing.assert_allclose(one.item(), np.linalg.norm(grads[0]), rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(params[0].grad.numpy()), 0.5, rtol=1e-5)
    assert clip_grad_norm_([extra], 1.0).item() == 0.0


def test_clip_grad_norm_of_non_finite_gradients():
    a, b = param([1.0, 2.0]), param([3.0])
    set_grad(a, [INF, 2.0])
    set_grad(b, [1.0])
    with pytest.raises(RuntimeError, match="total norm of order 2.0 of the gradients is inf"):
        clip_grad_norm_([a, b], 1.0, error_if_nonfinite=True)
    assert a.grad.tolist() == [INF, 2.0] and b.grad.tolist() == [1.0]  # untouched
    total = clip_grad_norm_([a, b], 1.0)  # as PyTorch: scaled by 1 / inf = 0
    assert total.item() == INF
    assert math.isnan(a.grad.tolist()[0]) and a.grad.tolist()[1] == 0.0 and b.grad.tolist() == [0.0]
    set_grad(a, [NAN, 2.0])
    assert math.isnan(clip_grad_norm_([a], 1.0, norm_type=INF).item())
    with pytest.raises(RuntimeError, match="is nan"):
        clip_grad_norm_([a], 1.0, error_if_nonfinite=True)
    with pytest.raises(TypeError, match="clip_grad_norm_: max_norm must be a real number"):
        clip_grad_norm_([a], "1")


def test_clip_grad_value_():
    a, b = param([1.0, -2.0, 0.5]), param([3.0])
    set_grad(a, [0.2, -5.0, 3.0])
    grad = a.grad
    clip_grad_value_([a, b], 1.0)
    assert a.grad is grad and grad.tolist() == [0.2, -1.0, 1.0] and b.grad is None
    clip_grad_value_(a, 0.1)
    assert a.grad.tolist() == [0.1, -0.1, 0.1]


def test_parameters_to_vector_and_back():
    params = [param(np.arange(6.0).reshape(2, 3)), param([10.0, 11.0]), param(12.0)]
    vec = parameters_to_vector(params)
    assert vec.shape == (9,) and vec.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 11.0, 12.0]
    lm.sum(vec * vec).backward()  # differentiable, as PyTorch's
    np.testing.assert_array_equal(params[1].grad.numpy(), [20.0, 22.0])
    with lm.no_grad():
        vector_to_parameters(-vec, params)
    assert params[0].tolist() == [[-0.0, -1.0, -2.0], [-3.0, -4.0, -5.0]]
    assert params[1].tolist() == [-10.0, -11.0] and params[2].tolist() == -12.0
    assert all(p.is_leaf and p.requires_grad for p in params)
    vector_to_parameters(parameters_to_vector(params) * 1.0, params)  # round trip
    assert params[1].tolist() == [-10.0, -11.0]
    with pytest.raises(ValueError, match="at least the 9 values"):
        vector_to_parameters(lm.zeros(8, dtype=F64), params)
    assert params[1].tolist() == [-10.0, -11.0]  # refused before any copy
    with pytest.raises(TypeError, match="vec must be a tensor"):
        vector_to_parameters([1.0] * 9, params)


def test_nn_utils_namespace():
    assert lm.nn.utils.__all__ == [
        "clip_grad_norm_",
        "clip_grad_value_",
        "parameters_to_vector",
        "vector_to_parameters",
    ]
    assert "utils" in lm.nn.__all__
