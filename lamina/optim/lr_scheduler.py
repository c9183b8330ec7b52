"""Learning-rate schedulers, as PyTorch's ``torch.optim.lr_scheduler``: ``StepLR``,
``MultiStepLR``, ``ExponentialLR``, ``CosineAnnealingLR``, ``LinearLR``, ``LambdaLR``,
``SequentialLR``, ``OneCycleLR`` and ``ReduceLROnPlateau``.

A scheduler sets the ``lr`` of each of its optimizer's parameter groups at every
``step()`` (called after ``optimizer.step()``, once per epoch or per batch as the
schedule is meant). The rates are PyTorch's to the last bit: where PyTorch computes a
rate from the previous one (the chainable form of ``StepLR``, ``ExponentialLR``,
``CosineAnnealingLR``, ``LinearLR``...), so does lamina, in the same order of
operations. ``state_dict()`` holds every attribute but the optimizer, as PyTorch's.
"""

from __future__ import annotations

import math
import types
import warnings
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, SupportsFloat

from lamina.dispatch.arguments import checked

from .optimizer import Optimizer

__all__ = [
    "CosineAnnealingLR",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "OneCycleLR",
    "ReduceLROnPlateau",
    "SequentialLR",
    "StepLR",
]

_EPOCH_DEPRECATED = (
    "passing an epoch to scheduler.step() is deprecated (as in PyTorch): the closed form of "
    "the schedule is used for it where there is one; call scheduler.step() without it"
)


def _per_group(name: str, optimizer: Optimizer, value: Any) -> list:
    """One value per parameter group: ``value`` repeated, or a list of that length."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(
                f"{name} must have one value per parameter group: {len(value)} values, "
                f"{len(optimizer.param_groups)} groups"
            )
        return list(value)
    return [value] * len(optimizer.param_groups)


def _lrs(optimizer: Optimizer) -> list[float]:
    return [group["lr"] for group in optimizer.param_groups]


def _require(ok: bool, fn: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{fn}: {message}")


class LRScheduler:
    """The base of the schedulers: ``base_lrs`` (each group's ``initial_lr``, which a
    scheduler made with ``last_epoch=-1`` sets to the group's ``lr``), ``last_epoch``
    (the number of steps taken), ``step()``, ``get_last_lr()``. A subclass gives the
    rates of a step in ``get_lr`` (which reads ``last_epoch`` and may read the current
    rates), and, if it has one, the closed form in ``_get_closed_form_lr``."""

    _get_lr_called_within_step = False
    _is_initial = False

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(
                        f"param 'initial_lr' is not specified in param_groups[{i}] when "
                        "resuming a scheduler with last_epoch >= 0: load the optimizer's "
                        "state dict first, or make the scheduler with last_epoch=-1"
                    )
        self.base_lrs: list[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def state_dict(self) -> dict[str, Any]:
        """Every attribute of the scheduler but its optimizer."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the attributes of ``state_dict`` (from ``state_dict()``)."""
        self.__dict__.update(state_dict)

    def get_last_lr(self) -> list[float]:
        """The learning rates the last ``step()`` set, one per parameter group."""
        return self._last_lr

    def get_lr(self) -> list[float]:
        """The learning rates of the step being taken (called by ``step()``; outside
        it, use ``get_last_lr()``)."""
        raise NotImplementedError

    def _warn_outside_step(self) -> None:
        if not self._get_lr_called_within_step:
            warnings.warn(
                "To get the last learning rate computed by the scheduler, please use "
                "`get_last_lr()`.",
                UserWarning,
                stacklevel=3,
            )

    def step(self, epoch: int | None = None) -> None:
        """Advance the schedule by one step and set the groups' learning rates."""
        if self._step_count == 1 and not getattr(self.optimizer, "_opt_called", True):
            warnings.warn(
                "Detected call of `lr_scheduler.step()` before `optimizer.step()`: call "
                "optimizer.step() first, or the first value of the schedule is skipped",
                UserWarning,
                stacklevel=2,
            )
        self._step_count += 1
        if epoch is not None:
            warnings.warn(_EPOCH_DEPRECATED, UserWarning, stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch: int | None = None) -> None:
        self._get_lr_called_within_step = True
        try:
            if epoch is None:
                self.last_epoch += 1
                values = self.get_lr()
            else:
                self.last_epoch = epoch
                closed_form = getattr(self, "_get_closed_form_lr", None)
                values = closed_form() if closed_form is not None else self.get_lr()
        finally:
            self._get_lr_called_within_step = False
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr: list[float] = _lrs(self.optimizer)


class LambdaLR(LRScheduler):
    """``lr = initial_lr * lr_lambda(epoch)``, with one function for every group or
    a list of one per group."""

    @checked
    def __init__(
        self,
        optimizer: Optimizer,
        lr_lambda: Callable[[int], float] | list[Callable[[int], float]],
        last_epoch: int = -1,
    ) -> None:
        self.optimizer = optimizer
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != len(optimizer.param_groups):
                raise ValueError(
                    f"LambdaLR: expected {len(optimizer.param_groups)} lr_lambdas (one per "
                    f"parameter group), got {len(lr_lambda)}"
                )
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * len(optimizer.param_groups)
        for fn in self.lr_lambdas:
            if not callable(fn):
                raise TypeError(f"LambdaLR: lr_lambda must be callable, got {type(fn).__name__}")
        super().__init__(optimizer, last_epoch)

    def state_dict(self) -> dict[str, Any]:
        """As ``LRScheduler.state_dict``; of the functions, only the attributes of
        callable objects are kept (plain functions and lambdas are not saved)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [
            None if isinstance(fn, types.FunctionType) else fn.__dict__.copy()
            for fn in self.lr_lambdas
        ]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As ``LRScheduler.load_state_dict``; callable objects get their attributes."""
        state = dict(state_dict)
        saved = state.pop("lr_lambdas")
        self.__dict__.update(state)
        for fn, attributes in zip(self.lr_lambdas, saved):
            if attributes is not None:
                fn.__dict__.update(attributes)

    def get_lr(self) -> list[float]:
        self._warn_outside_step()
        return [
            base_lr * fn(self.last_epoch) for fn, base_lr in zip(self.lr_lambdas, self.base_lrs)
        ]


class StepLR(LRScheduler):
    """The learning rate times ``gamma`` every ``step_size`` steps."""

    @checked
    def __init__(
        self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1
    ) -> None:
        _require(step_size >= 1, "StepLR", f"step_size must be >= 1, got {step_size}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        self._warn_outside_step()
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return _lrs(self.optimizer)
        return [lr * self.gamma for lr in _lrs(self.optimizer)]

    def _get_closed_form_lr(self) -> list[float]:
        return [lr * self.gamma ** (self.last_epoch // self.step_size) for lr in self.base_lrs]


class MultiStepLR(LRScheduler):
    """The learning rate times ``gamma`` at each milestone (a milestone given twice
    multiplies by ``gamma`` twice)."""

    @checked
    def __init__(
        self,
        optimizer: Optimizer,
        milestones: Iterable[int],
        gamma: float = 0.1,
        last_epoch: int = -1,
    ) -> None:
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        self._warn_outside_step()
        if self.last_epoch not in self.milestones:
            return _lrs(self.optimizer)
        factor = self.gamma ** self.milestones[self.last_epoch]
        return [lr * factor for lr in _lrs(self.optimizer)]

    def _get_closed_form_lr(self) -> list[float]:
        milestones = sorted(self.milestones.elements())
        return [
            lr * self.gamma ** bisect_right(milestones, self.last_epoch) for lr in self.base_lrs
        ]


class LinearLR(LRScheduler):
    """The learning rate times a factor going linearly from ``start_factor`` to
    ``end_factor`` over ``total_iters`` steps, then constant."""

    @checked
    def __init__(
        self,
        optimizer: Optimizer,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
        last_epoch: int = -1,
    ) -> None:
        _require(
            0 < start_factor <= 1,
            "LinearLR",
            f"start_factor must be in (0, 1], got {start_factor}",
        )
        _require(
            0 <= end_factor <= 1, "LinearLR", f"end_factor must be in [0, 1], got {end_factor}"
        )
        _require(total_iters >= 1, "LinearLR", f"total_iters must be >= 1, got {total_iters}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        self._warn_outside_step()
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in _lrs(self.optimizer)]
        if self._is_initial or self.last_epoch > self.total_iters:
            return _lrs(self.optimizer)
        span = self.end_factor - self.start_factor
        factor = 1.0 + span / (self.total_iters * self.start_factor + (self.last_epoch - 1) * span)
        return [lr * factor for lr in _lrs(self.optimizer)]

    def _get_closed_form_lr(self) -> list[float]:
        span = self.end_factor - self.start_factor
        factor = (
            self.start_factor + span * min(self.total_iters, self.last_epoch) / self.total_iters
        )
        return [lr * factor for lr in self.base_lrs]


class ExponentialLR(LRScheduler):
    """The learning rate times ``gamma`` at every step."""

    @checked
    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        self._warn_outside_step()
        if self._is_initial:
            return _lrs(self.optimizer)
        return [lr * self.gamma for lr in _lrs(self.optimizer)]

    def _get_closed_form_lr(self) -> list[float]:
        return [lr * self.gamma**self.last_epoch for lr in self.base_lrs]


class SequentialLR(LRScheduler):
    """Schedulers one after another: ``schedulers[i + 1]`` takes over at step
    ``milestones[i]``, starting from its own step 0."""

    def __init__(
        self,
        optimizer: Optimizer,
        schedulers: Sequence[LRScheduler],
        milestones: Sequence[int],
        last_epoch: int = -1,
    ) -> None:
        if len(schedulers) < 1:
            raise ValueError("SequentialLR: expects at least one scheduler, got none")
        for i, scheduler in enumerate(schedulers):
            if isinstance(scheduler, ReduceLROnPlateau):
                raise ValueError(
                    f"SequentialLR: scheduler {i} is a ReduceLROnPlateau, whose step needs a "
                    "metric; it cannot be sequenced"
                )
            if getattr(scheduler, "optimizer", None) is not optimizer:
                raise ValueError(
                    f"SequentialLR: scheduler {i} ({type(scheduler).__name__}) belongs to "
                    "another optimizer; all must belong to the one given"
                )
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                "SequentialLR: expects one milestone fewer than schedulers, got "
                f"{len(schedulers)} schedulers and {len(milestones)} milestones"
            )
        self._schedulers = list(schedulers)
        self._milestones = list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        # the schedulers each took their initial step when made: undo those, restart
        # the first
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        self._undo_initial_steps(self)
        first = self._schedulers[bisect_right(self._milestones, 0)]
        first._initial_step()
        self._last_lr = first.get_last_lr()

    @classmethod
    def _undo_initial_steps(cls, scheduler: LRScheduler) -> None:
        for inner in getattr(scheduler, "_schedulers", ()):
            if hasattr(inner, "_schedulers"):
                cls._undo_initial_steps(inner)
            elif hasattr(inner, "last_epoch"):
                inner.last_epoch -= 1

    def step(self) -> None:  # type: ignore[override]
        """Advance the schedule: the scheduler in charge steps (one just taking over
        starts at its step 0)."""
        self.last_epoch += 1
        i = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[i]
        if i > 0 and self._milestones[i - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        """As ``LRScheduler.state_dict``, with each scheduler's state dict."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As ``LRScheduler.load_state_dict``, each scheduler loading its own."""
        state = dict(state_dict)
        inner = state.pop("_schedulers")
        self.__dict__.update(state)
        for scheduler, saved in zip(self._schedulers, inner):
            scheduler.load_state_dict(saved)


class CosineAnnealingLR(LRScheduler):
    """The learning rate along a cosine from ``initial_lr`` down to ``eta_min`` in
    ``T_max`` steps, and back up in the next ``T_max`` (SGDR without restarts)."""

    @checked
    def __init__(
        self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1
    ) -> None:
        _require(T_max >= 1, "CosineAnnealingLR", f"T_max must be >= 1, got {T_max}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        self._warn_outside_step()
        epoch, t_max, eta_min = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return _lrs(self.optimizer)
        if self._step_count == 1 and epoch > 0:  # resumed: no previous rate to go from
            return [
                eta_min + (base - eta_min) * (1 + math.cos(epoch * math.pi / t_max)) / 2
                for base in self.base_lrs
            ]
        if (epoch - 1 - t_max) % (2 * t_max) == 0:  # the bottom: the chain would divide by 0
            return [
                lr + (base - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
                for base, lr in zip(self.base_lrs, _lrs(self.optimizer))
            ]
        ratio = (1 + math.cos(math.pi * epoch / t_max)) / (
            1 + math.cos(math.pi * (epoch - 1) / t_max)
        )
        return [ratio * (lr - eta_min) + eta_min for lr in _lrs(self.optimizer)]

    def _get_closed_form_lr(self) -> list[float]:
        return [
            self.eta_min
            + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
            for base in self.base_lrs
        ]


class ReduceLROnPlateau(LRScheduler):
    """The learning rate times ``factor`` when a metric (``step(metric)``) has not
    improved for ``patience`` steps, then no change for ``cooldown`` steps; never below
    ``min_lr``, and a reduction smaller than ``eps`` is skipped. Improving means, in
    ``mode`` "min", falling below ``best * (1 - threshold)`` (``threshold_mode``
    "rel") or ``best - threshold`` ("abs"); in "max", rising above ``best * (1 +
    threshold)`` or ``best + threshold``."""

    @checked
    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: list[float] | float = 0,
        eps: float = 1e-8,
    ) -> None:
        fn = "ReduceLROnPlateau"
        _require(factor < 1.0, fn, f"factor must be < 1, got {factor}")
        _require(patience >= 0, fn, f"patience must be >= 0, got {patience}")
        _require(cooldown >= 0, fn, f"cooldown must be >= 0, got {cooldown}")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.factor = factor
        self.optimizer = optimizer
        if isinstance(min_lr, (list, tuple)):
            self.default_min_lr = None
            self.min_lrs = _per_group(f"{fn}: min_lr", optimizer, min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * len(optimizer.param_groups)
        self.patience, self.cooldown, self.eps = patience, cooldown, eps
        self.last_epoch = 0
        self._last_lr = _lrs(optimizer)
        self._init_is_better(mode, threshold, threshold_mode)
        self._reset()

    def _reset(self) -> None:
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def step(self, metrics: SupportsFloat, epoch: int | None = None) -> None:  # type: ignore[override]
        """Take the metric of this step (a number or a one-element tensor), and lower
        the learning rates if it has not improved for too long."""
        current = float(metrics)
        if epoch is None:
            epoch = self.last_epoch + 1
        else:
            warnings.warn(_EPOCH_DEPRECATED, UserWarning, stacklevel=2)
        self.last_epoch = epoch
        if self._is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad steps in the cooldown do not count
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = _lrs(self.optimizer)

    def _reduce_lr(self) -> None:
        if len(self.optimizer.param_groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(
                    f"ReduceLROnPlateau: the optimizer has {len(self.optimizer.param_groups)} "
                    f"parameter groups, but min_lr was given for {len(self.min_lrs)}: set "
                    "min_lrs to one value per group"
                )
            self.min_lrs = [self.default_min_lr] * len(self.optimizer.param_groups)
        for group, min_lr in zip(self.optimizer.param_groups, self.min_lrs):
            old = float(group["lr"])
            new = max(old * self.factor, min_lr)
            if old - new > self.eps:
                group["lr"] = new

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def _is_better(self, a: float, best: float) -> bool:
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min":
            return a < best - self.threshold
        if self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    def _init_is_better(self, mode: str, threshold: float, threshold_mode: str) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(
                f"ReduceLROnPlateau: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}"
            )
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As ``LRScheduler.load_state_dict``."""
        self.__dict__.update(state_dict)
        self._init_is_better(self.mode, self.threshold, self.threshold_mode)


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith and Topin), stepped once per batch: the learning rate
    rises from ``max_lr / div_factor`` to ``max_lr`` in the first ``pct_start`` of
    ``total_steps`` (or ``epochs * steps_per_epoch``), then falls to ``initial_lr /
    final_div_factor``, along a cosine or a line (``anneal_strategy``); with
    ``three_phase``, it comes back down to ``initial_lr`` symmetrically before the
    fall. With ``cycle_momentum``, SGD's momentum (Adam's beta1) moves the other way
    between ``max_momentum`` and ``base_momentum``."""

    @checked
    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float | list[float],
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float | list[float] = 0.85,
        max_momentum: float | list[float] = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ) -> None:
        fn = "OneCycleLR"
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if total_steps is not None:
            _require(total_steps > 0, fn, f"total_steps must be > 0, got {total_steps}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            _require(epochs > 0, fn, f"epochs must be > 0, got {epochs}")
            _require(steps_per_epoch > 0, fn, f"steps_per_epoch must be > 0, got {steps_per_epoch}")
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ValueError(f"{fn}: give total_steps, or epochs and steps_per_epoch")
        _require(0 <= pct_start <= 1, fn, f"pct_start must be in [0, 1], got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(
                f"{fn}: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}"
            )
        self._anneal_func_type = anneal_strategy
        up = float(pct_start * self.total_steps) - 1
        if three_phase:
            self._schedule_phases = [
                _phase(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                _phase(
                    float(2 * pct_start * self.total_steps) - 2,
                    "max_lr",
                    "initial_lr",
                    "base_momentum",
                    "max_momentum",
                ),
                _phase(
                    self.total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"
                ),
            ]
        else:
            self._schedule_phases = [
                _phase(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                _phase(self.total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"),
            ]
        max_lrs = _per_group(f"{fn}: max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for lr, group in zip(max_lrs, optimizer.param_groups):
                group["initial_lr"] = lr / div_factor
                group["max_lr"] = lr
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError(
                    f"{fn}: cycle_momentum needs an optimizer with momentum or betas; pass "
                    "cycle_momentum=False"
                )
            self.use_beta1 = "betas" in optimizer.defaults
            highs = _per_group(f"{fn}: max_momentum", optimizer, max_momentum)
            lows = _per_group(f"{fn}: base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                for high, low, group in zip(highs, lows, optimizer.param_groups):
                    self._set_momentum(group, high)
                    group["max_momentum"], group["base_momentum"] = high, low
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group: dict[str, Any], value: float) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        self._warn_outside_step()
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(
                f"OneCycleLR: tried to step {step} times; the specified number of total steps "
                f"is {self.total_steps}"
            )
        lrs = []
        last = len(self._schedule_phases) - 1
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or i == last:
                    pct = (step - start) / (end - start)
                    lrs.append(self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct))
                    if self.cycle_momentum:
                        momentum = self._anneal(
                            group[phase["start_momentum"]], group[phase["end_momentum"]], pct
                        )
                        self._set_momentum(group, momentum)
                    break
                start = end
        return lrs


def _phase(end_step: float, start_lr: str, end_lr: str, start_mom: str, end_mom: str) -> dict:
    """One phase of OneCycleLR: where it ends and the group keys it goes between."""
    return {
        "end_step": end_step,
        "start_lr": start_lr,
        "end_lr": end_lr,
        "start_momentum": start_mom,
        "end_momentum": end_mom,
    }
