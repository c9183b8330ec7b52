"""lamina.optim.lr_scheduler: every scheduler's learning rates (and OneCycleLR's
momentum) step by step against PyTorch's, recorded in data/optim_reference.json by
data/record_optim_reference.py (so no PyTorch is needed); schedules resumed from state
dicts; the warnings and argument errors PyTorch users know."""

import copy
import json
import pathlib
import warnings

import numpy as np
import pytest

import lamina as lm
from lamina.optim import lr_scheduler

F64 = lm.float64
CASES = json.loads((pathlib.Path(__file__).parent / "data" / "optim_reference.json").read_text())[
    "schedulers"
]
BY_NAME = {case["name"]: case for case in CASES}


def _optimizer(spec, group_lrs):
    groups = [
        {"params": [lm.asarray(np.zeros(2), requires_grad=True)], "lr": lr} for lr in group_lrs
    ]
    return getattr(lm.optim, spec["class"])(groups, **spec["kwargs"])


def _build(spec, optimizer):
    cls = getattr(lr_scheduler, spec["class"])
    if spec["class"] == "SequentialLR":
        inner = [_build(s, optimizer) for s in spec["schedulers"]]
        return cls(optimizer, inner, milestones=spec["milestones"])
    kwargs = dict(spec["kwargs"])
    if "lr_lambda" in kwargs:  # Python source in the record
        source = kwargs["lr_lambda"]
        kwargs["lr_lambda"] = (
            [eval(s) for s in source] if isinstance(source, list) else eval(source)
        )
    return cls(optimizer, **kwargs)


def _momenta(optimizer):
    if "betas" in optimizer.defaults:
        return [g["betas"][0] for g in optimizer.param_groups]
    return [g.get("momentum", 0.0) for g in optimizer.param_groups]


def _steps(case, optimizer, scheduler, first, last):
    """Learning rates and momenta after steps first..last-1 of the case."""
    lrs, momenta = [], []
    for i in range(first, last):
        optimizer.step()
        if case["metrics"] is None:
            scheduler.step()
        else:
            scheduler.step(case["metrics"][i])
        lrs.append(scheduler.get_last_lr())
        momenta.append(_momenta(optimizer))
    return lrs, momenta


def _setup(case):
    optimizer = _optimizer(case["optimizer"], case["group_lrs"])
    return optimizer, _build(case["scheduler"], optimizer)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_learning_rates_match_pytorch(case):
    optimizer, scheduler = _setup(case)
    first = [scheduler.get_last_lr()], [_momenta(optimizer)]  # after the scheduler is made
    lrs, momenta = _steps(case, optimizer, scheduler, 0, len(case["lrs"]) - 1)
    np.testing.assert_allclose(first[0] + lrs, case["lrs"], rtol=1e-12, atol=0)
    np.testing.assert_allclose(first[1] + momenta, case["momenta"], rtol=1e-12, atol=0)
    assert scheduler.get_last_lr() == [g["lr"] for g in optimizer.param_groups]


RESUMED = [
    "StepLR",
    "MultiStepLR",
    "ExponentialLR",
    "CosineAnnealingLR",
    "LinearLR warmup",
    "LambdaLR per group",
    "SequentialLR warmup then cosine",
    "SequentialLR three",
    "OneCycleLR cos",
    "OneCycleLR Adam betas",
    "ReduceLROnPlateau max abs cooldown",
]


@pytest.mark.parametrize("name", RESUMED)
def test_a_schedule_resumes_from_state_dicts(name):
    case = BY_NAME[name]
    optimizer, scheduler = _setup(case)
    _steps(case, optimizer, scheduler, 0, 12)
    saved = copy.deepcopy(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    )
    assert "optimizer" not in saved["scheduler"]
    resumed, fresh = _setup(case)  # PyTorch's order: make the scheduler, then load both
    resumed.load_state_dict(saved["optimizer"])
    fresh.load_state_dict(saved["scheduler"])
    assert fresh.last_epoch == scheduler.last_epoch
    rest = len(case["lrs"]) - 1
    want, _ = _steps(case, optimizer, scheduler, 12, rest)
    got, momenta = _steps(case, resumed, fresh, 12, rest)
    assert got == want
    np.testing.assert_allclose(got, case["lrs"][13:], rtol=1e-12, atol=0)
    np.testing.assert_allclose(momenta, case["momenta"][13:], rtol=1e-12, atol=0)


def test_the_scheduler_sets_the_optimizers_learning_rate():
    w = lm.asarray(np.array([1.0]), requires_grad=True)
    opt = lm.optim.SGD([w], lr=1.0)
    sched = lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    assert opt.param_groups[0]["initial_lr"] == 1.0 and sched.base_lrs == [1.0]
    assert sched.last_epoch == 0
    for want in (0.0, -0.5, -0.75):  # steps of lr 1, 0.5, 0.25 with gradient 1
        w.grad = lm.asarray(np.array([1.0]))
        opt.step()
        sched.step()
        assert w.item() == want
    assert sched.last_epoch == 3 and sched.get_last_lr() == [0.125]
    lr_scheduler.ExponentialLR(opt, gamma=0.9)  # a second scheduler keeps initial_lr
    assert opt.param_groups[0]["initial_lr"] == 1.0


def test_reduce_on_plateau_reads_a_tensor_metric():
    opt = lm.optim.SGD([lm.asarray(np.zeros(1), requires_grad=True)], lr=1.0)
    sched = lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    sched.step(lm.asarray(1.0, dtype=F64))
    sched.step(lm.asarray(2.0, dtype=F64))
    assert sched.get_last_lr() == [0.5] and sched.best == 1.0


def test_warnings_as_in_pytorch():
    opt = lm.optim.SGD([lm.asarray(np.zeros(1), requires_grad=True)], lr=1.0)
    sched = lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    with pytest.warns(UserWarning, match=r"before `optimizer.step\(\)`"):
        sched.step()
    with pytest.warns(UserWarning, match=r"get_last_lr\(\)"):
        sched.get_lr()
    with pytest.warns(UserWarning, match="deprecated"):
        sched.step(5)  # an epoch: the closed form
    assert sched.get_last_lr() == [0.25] and sched.last_epoch == 5
    opt2 = lm.optim.SGD([lm.asarray(np.zeros(1), requires_grad=True)], lr=1.0)
    sched2 = lr_scheduler.StepLR(opt2, step_size=2)
    opt2.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sched2.step()  # in the right order: no warning


def _sgd(lr=0.1, momentum=0.0, groups=1):
    params = [{"params": [lm.asarray(np.zeros(1), requires_grad=True)]} for _ in range(groups)]
    return lm.optim.SGD(params, lr=lr, momentum=momentum)


BAD = [
    (lambda: lr_scheduler.StepLR("sgd", 3), TypeError, "str is not an Optimizer"),
    (lambda: lr_scheduler.StepLR(_sgd(), 3, last_epoch=4), KeyError, "initial_lr"),
    (lambda: lr_scheduler.StepLR(_sgd(), 0), ValueError, "StepLR: step_size must be >= 1"),
    (lambda: lr_scheduler.StepLR(_sgd(), 2.5), TypeError, "StepLR: step_size must be an int"),
    (lambda: lr_scheduler.ExponentialLR(_sgd(), "x"), TypeError, "gamma must be a real number"),
    (lambda: lr_scheduler.CosineAnnealingLR(_sgd(), 0), ValueError, "T_max must be >= 1"),
    (lambda: lr_scheduler.LinearLR(_sgd(), start_factor=0.0), ValueError, "start_factor"),
    (lambda: lr_scheduler.LinearLR(_sgd(), end_factor=1.5), ValueError, "end_factor"),
    (
        lambda: lr_scheduler.LambdaLR(_sgd(groups=2), [lambda e: 1.0]),
        ValueError,
        "expected 2 lr_lambdas",
    ),
    (lambda: lr_scheduler.LambdaLR(_sgd(), 0.5), TypeError, "lr_lambda must be callable"),
    (lambda: lr_scheduler.ReduceLROnPlateau(_sgd(), factor=1.0), ValueError, "factor must be < 1"),
    (lambda: lr_scheduler.ReduceLROnPlateau(_sgd(), mode="avg"), ValueError, "mode must be"),
    (
        lambda: lr_scheduler.ReduceLROnPlateau(_sgd(), threshold_mode="x"),
        ValueError,
        "threshold_mode must be",
    ),
    (
        lambda: lr_scheduler.ReduceLROnPlateau(_sgd(), min_lr=[0.1, 0.2]),
        ValueError,
        "min_lr must have one value per parameter group",
    ),
    (lambda: lr_scheduler.OneCycleLR(_sgd(), 1.0), ValueError, "give total_steps"),
    (lambda: lr_scheduler.OneCycleLR(_sgd(), 1.0, total_steps=0), ValueError, "total_steps"),
    (
        lambda: lr_scheduler.OneCycleLR(_sgd(), [1.0, 2.0], total_steps=5),
        ValueError,
        "max_lr must have one value per parameter group",
    ),
    (
        lambda: lr_scheduler.OneCycleLR(_sgd(), 1.0, total_steps=5, anneal_strategy="exp"),
        ValueError,
        "anneal_strategy",
    ),
    (
        lambda: lr_scheduler.OneCycleLR(
            lm.optim.Adagrad([lm.asarray(np.zeros(1), requires_grad=True)]), 1.0, total_steps=5
        ),
        ValueError,
        "cycle_momentum needs an optimizer with momentum or betas",
    ),
]


@pytest.mark.parametrize("make, error, message", BAD, ids=[m for _, _, m in BAD])
def test_bad_arguments(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_sequential_lr_checks_its_schedulers():
    opt, other = _sgd(), _sgd()
    first = lr_scheduler.LinearLR(opt)
    with pytest.raises(ValueError, match="one milestone fewer than schedulers"):
        lr_scheduler.SequentialLR(opt, [first, lr_scheduler.ExponentialLR(opt, 0.9)], [2, 4])
    with pytest.raises(ValueError, match="belongs to another optimizer"):
        lr_scheduler.SequentialLR(opt, [first, lr_scheduler.ExponentialLR(other, 0.9)], [2])
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        lr_scheduler.SequentialLR(opt, [first, lr_scheduler.ReduceLROnPlateau(opt)], [2])


def test_one_cycle_refuses_to_step_past_its_end():
    opt = _sgd(momentum=0.9)
    sched = lr_scheduler.OneCycleLR(opt, 1.0, total_steps=3)
    for _ in range(3):
        opt.step()
        sched.step()
    with pytest.raises(ValueError, match="tried to step 4 times"):
        sched.step()


def test_the_namespace():
    assert sorted(lr_scheduler.__all__) == sorted(
        n for n in lr_scheduler.__all__ if isinstance(getattr(lr_scheduler, n), type)
    )
    for name in lr_scheduler.__all__:
        cls = getattr(lr_scheduler, name)
        assert issubclass(cls, lr_scheduler.LRScheduler) and cls.__doc__
