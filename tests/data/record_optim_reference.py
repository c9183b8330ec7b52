"""Record PyTorch's optimizer steps and learning-rate schedules into
optim_reference.json beside this file (run by hand with torch installed; the test suite
reads the record and needs no PyTorch):

    python tests/data/record_optim_reference.py

Optimizers: two float64 parameters (a vector and a matrix) from fixed values, five
steps with fixed gradients (the matrix has none at the third step, so it is skipped
there), PyTorch's single-tensor update (``foreach=False``); the record holds the
parameters after every step, the final state of each parameter and the keys of the
state dict. Schedulers: an optimizer with two parameter groups, the learning rates
(and, for OneCycleLR, the momentum or beta1) after construction and after each of 30
steps; ReduceLROnPlateau reads a fixed metric sequence.

A case's ``lr_lambda`` is Python source (``lambda epoch: ...``), evaluated by the
recorder and by the test alike.
"""

import json
import pathlib

import numpy as np
import torch

STEPS = 5
A = [1.0, -2.0, 0.5]
B = [[0.3, -0.7], [1.2, 0.05]]

OPTIMIZERS = [
    ("SGD", {}),
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.3}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    ("SGD", {"lr": 0.1, "weight_decay": 0.1}),
    ("SGD", {"lr": 0.1, "maximize": True}),
    (
        "SGD",
        {"lr": 0.05, "momentum": 0.8, "dampening": 0.1, "weight_decay": 0.05, "maximize": True},
    ),
    ("SGD", {"lr": 0.05, "momentum": 0.5, "nesterov": True, "weight_decay": 0.01}),
    ("Adam", {}),
    ("Adam", {"lr": 0.1, "betas": [0.8, 0.9], "weight_decay": 0.05}),
    ("Adam", {"lr": 0.05, "amsgrad": True}),
    ("Adam", {"lr": 0.1, "weight_decay": 0.01, "amsgrad": True}),
    ("Adam", {"lr": 0.1, "betas": [0.3, 0.6], "eps": 1e-3, "maximize": True}),
    ("Adam", {"lr": 0.1, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("Adam", {"lr": 0.02, "amsgrad": True, "weight_decay": 0.02, "maximize": True}),
    ("AdamW", {}),
    ("AdamW", {"lr": 0.1, "weight_decay": 0.3, "amsgrad": True, "eps": 1e-3}),
    ("AdamW", {"lr": 0.1, "betas": [0.5, 0.5], "maximize": True}),
    ("RMSprop", {}),
    ("RMSprop", {"lr": 0.05, "alpha": 0.9, "eps": 1e-6}),
    ("RMSprop", {"lr": 0.01, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9}),
    ("RMSprop", {"lr": 0.01, "centered": True}),
    ("RMSprop", {"lr": 0.01, "alpha": 0.3, "centered": True}),
    (
        "RMSprop",
        {"lr": 0.01, "momentum": 0.5, "centered": True, "weight_decay": 0.05, "maximize": True},
    ),
    ("Adagrad", {}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.1}),
    ("Adagrad", {"lr": 0.1, "weight_decay": 0.1}),
    ("Adagrad", {"lr": 0.1, "initial_accumulator_value": 0.5, "eps": 1e-3}),
    (
        "Adagrad",
        {
            "lr": 0.1,
            "lr_decay": 0.05,
            "weight_decay": 0.02,
            "initial_accumulator_value": 0.1,
            "maximize": True,
        },
    ),
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8}),
    ("Adadelta", {"eps": 1e-3, "weight_decay": 0.1}),
    ("Adadelta", {"lr": 2.0, "rho": 0.95, "weight_decay": 0.05, "maximize": True}),
]
# (optimizer, defaults, the second group's own options): the vector in the first group
GROUPED = [
    ("SGD", {"lr": 1e-2, "momentum": 0.9}, {"lr": 1e-3, "momentum": 0.5, "nesterov": True}),
    ("Adam", {"lr": 0.01}, {"betas": [0.5, 0.99], "amsgrad": True, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01}, {"centered": True, "momentum": 0.3}),
    # (PyTorch fills every group's sum with the constructor's initial_accumulator_value)
    ("Adagrad", {"lr": 0.1, "initial_accumulator_value": 0.3}, {"lr_decay": 0.2, "eps": 1e-3}),
    ("Adadelta", {"lr": 1.0}, {"rho": 0.5, "maximize": True}),
]

SGD_MOMENTUM = {"class": "SGD", "kwargs": {"lr": 0.1, "momentum": 0.9}}
ADAM = {"class": "Adam", "kwargs": {"lr": 0.1}}
SGD_PLAIN = {"class": "SGD", "kwargs": {"lr": 0.1}}


def _sched(cls, **kwargs):
    return {"class": cls, "kwargs": kwargs}


SCHEDULERS = [
    ("StepLR", SGD_PLAIN, _sched("StepLR", step_size=7, gamma=0.5)),
    ("StepLR default gamma", SGD_PLAIN, _sched("StepLR", step_size=3)),
    ("MultiStepLR", SGD_PLAIN, _sched("MultiStepLR", milestones=[5, 12, 12, 20], gamma=0.3)),
    ("ExponentialLR", SGD_PLAIN, _sched("ExponentialLR", gamma=0.9)),
    ("CosineAnnealingLR", SGD_PLAIN, _sched("CosineAnnealingLR", T_max=10, eta_min=0.001)),
    ("CosineAnnealingLR T_max=7", SGD_PLAIN, _sched("CosineAnnealingLR", T_max=7)),
    ("LinearLR warmup", SGD_PLAIN, _sched("LinearLR", start_factor=0.25, total_iters=8)),
    (
        "LinearLR decay",
        SGD_PLAIN,
        _sched("LinearLR", start_factor=1.0, end_factor=0.1, total_iters=10),
    ),
    ("LinearLR defaults", SGD_PLAIN, _sched("LinearLR")),
    ("LambdaLR", SGD_PLAIN, _sched("LambdaLR", lr_lambda="lambda epoch: 0.95 ** epoch")),
    (
        "LambdaLR per group",
        SGD_PLAIN,
        _sched(
            "LambdaLR",
            lr_lambda=[
                "lambda epoch: min(1.0, (epoch + 1) / 5)",
                "lambda epoch: 1.0 / (1.0 + 0.1 * epoch)",
            ],
        ),
    ),
    (
        "SequentialLR warmup then cosine",
        SGD_PLAIN,
        {
            "class": "SequentialLR",
            "schedulers": [
                _sched("LinearLR", start_factor=0.1, total_iters=5),
                _sched("CosineAnnealingLR", T_max=20),
            ],
            "milestones": [5],
        },
    ),
    (
        "SequentialLR three",
        SGD_PLAIN,
        {
            "class": "SequentialLR",
            "schedulers": [
                _sched("ExponentialLR", gamma=0.9),
                _sched("StepLR", step_size=4, gamma=0.5),
                _sched("LinearLR", start_factor=0.5, total_iters=4),
            ],
            "milestones": [6, 15],
        },
    ),
    (
        "SequentialLR linear then exponential",
        SGD_PLAIN,
        {
            "class": "SequentialLR",
            "schedulers": [
                _sched("LinearLR", start_factor=0.5, total_iters=4),
                _sched("ExponentialLR", gamma=0.9),
            ],
            "milestones": [4],
        },
    ),
    ("OneCycleLR cos", SGD_MOMENTUM, _sched("OneCycleLR", max_lr=1.0, total_steps=30)),
    (
        "OneCycleLR linear",
        SGD_MOMENTUM,
        _sched(
            "OneCycleLR",
            max_lr=[1.0, 0.2],
            total_steps=30,
            anneal_strategy="linear",
            pct_start=0.25,
        ),
    ),
    (
        "OneCycleLR three phase",
        SGD_MOMENTUM,
        _sched(
            "OneCycleLR",
            max_lr=0.5,
            epochs=3,
            steps_per_epoch=10,
            three_phase=True,
            div_factor=10.0,
            final_div_factor=100.0,
        ),
    ),
    (
        "OneCycleLR three phase linear",
        SGD_MOMENTUM,
        _sched(
            "OneCycleLR", max_lr=0.5, total_steps=30, three_phase=True, anneal_strategy="linear"
        ),
    ),
    (
        "OneCycleLR Adam betas",
        ADAM,
        _sched(
            "OneCycleLR", max_lr=[0.3, 0.1], total_steps=30, base_momentum=0.8, max_momentum=0.9
        ),
    ),
    (
        "OneCycleLR no momentum",
        SGD_PLAIN,
        _sched("OneCycleLR", max_lr=0.3, total_steps=30, cycle_momentum=False),
    ),
    (
        "ReduceLROnPlateau min rel",
        SGD_PLAIN,
        _sched("ReduceLROnPlateau", factor=0.5, patience=2),
    ),
    (
        "ReduceLROnPlateau max abs cooldown",
        SGD_PLAIN,
        _sched(
            "ReduceLROnPlateau",
            mode="max",
            threshold_mode="abs",
            threshold=0.1,
            patience=1,
            cooldown=2,
            min_lr=[0.01, 0.001],
        ),
    ),
    (
        "ReduceLROnPlateau min abs eps",
        SGD_PLAIN,
        _sched(
            "ReduceLROnPlateau",
            threshold_mode="abs",
            patience=0,
            cooldown=1,
            factor=0.3,
            min_lr=0.005,
            eps=1e-3,
        ),
    ),
    (
        "ReduceLROnPlateau max rel",
        SGD_PLAIN,
        _sched("ReduceLROnPlateau", mode="max", threshold=0.05, patience=3, factor=0.2),
    ),
]
GROUP_LRS = [0.1, 0.02]
SCHEDULER_STEPS = 30


def _gradients():
    rng = np.random.default_rng(20240611)
    grads = []
    for step in range(STEPS):
        ga = rng.normal(0.0, 1.0, 3).round(6).tolist()
        gb = None if step == 2 else rng.normal(0.0, 1.0, (2, 2)).round(6).tolist()
        grads.append([ga, gb])
    return grads


def _metrics():
    """A loss that falls, stalls, rises a little and falls again."""
    rng = np.random.default_rng(7)
    base = [1.0 / (1 + 0.3 * min(i, 8)) + 0.02 * max(0, i - 14) for i in range(SCHEDULER_STEPS)]
    return [round(b + float(rng.normal(0.0, 0.01)), 6) for b in base]


def _torch_kwargs(kwargs):
    return {k: tuple(v) if k == "betas" else v for k, v in kwargs.items()}


def record_optimizer(name, defaults, second_group=None):
    a = torch.tensor(A, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(B, dtype=torch.float64, requires_grad=True)
    cls = getattr(torch.optim, name)
    if second_group is None:
        params = [a, b]
    else:
        params = [{"params": [a]}, {"params": [b], **_torch_kwargs(second_group)}]
    opt = cls(params, foreach=False, **_torch_kwargs(defaults))
    grads = _gradients()
    after = []
    for ga, gb in grads:
        a.grad = torch.tensor(ga, dtype=torch.float64)
        b.grad = None if gb is None else torch.tensor(gb, dtype=torch.float64)
        opt.step()
        after.append([a.detach().tolist(), b.detach().tolist()])
    state = [
        {k: (v.item() if v.ndim == 0 else v.tolist()) for k, v in opt.state[p].items()}
        for p in (a, b)
    ]
    packed = opt.state_dict()
    return {
        "optimizer": name,
        "kwargs": defaults,
        "second_group": second_group,
        "start": [A, B],
        "grads": grads,
        "params": after,
        "state": state,
        "state_keys": [sorted(packed["state"][i]) for i in (0, 1)],
        "group_keys": sorted(packed["param_groups"][0]),
    }


def _build(spec, optimizer):
    cls = getattr(torch.optim.lr_scheduler, spec["class"])
    if spec["class"] == "SequentialLR":
        inner = [_build(s, optimizer) for s in spec["schedulers"]]
        return cls(optimizer, inner, milestones=spec["milestones"])
    kwargs = dict(spec["kwargs"])
    if "lr_lambda" in kwargs:
        source = kwargs["lr_lambda"]
        kwargs["lr_lambda"] = (
            [eval(s) for s in source] if isinstance(source, list) else eval(source)
        )
    return cls(optimizer, **kwargs)


def record_scheduler(name, optimizer_spec, spec):
    params = [torch.zeros(2, dtype=torch.float64, requires_grad=True) for _ in GROUP_LRS]
    groups = [{"params": [p], "lr": lr} for p, lr in zip(params, GROUP_LRS)]
    opt = getattr(torch.optim, optimizer_spec["class"])(groups, **optimizer_spec["kwargs"])
    sched = _build(spec, opt)
    plateau = spec["class"] == "ReduceLROnPlateau"
    metrics = _metrics() if plateau else None

    def momenta():
        if "betas" in opt.defaults:
            return [g["betas"][0] for g in opt.param_groups]
        return [g.get("momentum", 0.0) for g in opt.param_groups]

    lrs, moms = [list(sched.get_last_lr())], [momenta()]
    for i in range(SCHEDULER_STEPS):
        opt.step()
        sched.step(metrics[i]) if plateau else sched.step()
        lrs.append(list(sched.get_last_lr()))
        moms.append(momenta())
    return {
        "name": name,
        "optimizer": optimizer_spec,
        "group_lrs": GROUP_LRS,
        "scheduler": spec,
        "metrics": metrics,
        "lrs": lrs,
        "momenta": moms,
    }


def main():
    record = {
        "torch": torch.__version__,
        "optimizers": [record_optimizer(n, k) for n, k in OPTIMIZERS]
        + [record_optimizer(n, k, g) for n, k, g in GROUPED],
        "schedulers": [record_scheduler(*case) for case in SCHEDULERS],
    }
    out = pathlib.Path(__file__).with_name("optim_reference.json")
    out.write_text(json.dumps(record, indent=0) + "\n")
    print(
        f"recorded {len(record['optimizers'])} optimizer and {len(record['schedulers'])} "
        f"scheduler cases with torch {torch.__version__} into {out.name}"
    )


if __name__ == "__main__":
    main()
