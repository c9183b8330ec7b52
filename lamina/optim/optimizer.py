"""``Optimizer``, the base of lamina's optimizers, as PyTorch's ``torch.optim.Optimizer``:
parameter groups whose options override the defaults, per-parameter state, state dicts
in PyTorch's structure, ``zero_grad`` and ``step(closure)``.

Every option of every optimizer is checked here, by one table (``OPTIONS``), when the
optimizer is made, when a group is added and when a state dict is loaded: a wrong type
is a TypeError and a value out of range (NaN included) a ValueError, each naming the
optimizer and the option. Each step checks the types again (a scheduler or a user may
have changed a group's options since), not the ranges: as in PyTorch, a schedule may
take the learning rate where no one would start it (below 0, at the end of a linear
OneCycleLR).

Note [Atomic steps]: ``step`` works in two passes. The first changes nothing: for every
parameter with a gradient it checks the gradient (the parameter's shape and dtype), the
types of the group's options, and computes the new state, which is checked to have the
parameter's shape and dtype too.
The second applies each parameter's update and stores its new state. So an error in the
first pass (a gradient that does not fit, an option that is not a number) leaves the
parameters and the state as they were, and the same step can be taken again once the
cause is fixed. The second pass cannot fail: an update is computed from checked numbers
and from tensors of its parameter's shape and dtype. It is computed there, one
parameter at a time, rather than in the first pass: until they are stored, the new
states are all a step holds beyond what PyTorch's in-place update does.
"""

from __future__ import annotations

import copy
import functools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from lamina.autograd import enable_grad, no_grad
from lamina.dispatch import dtypes, ops
from lamina.dispatch.arguments import boolean, real
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import Tensor, bump_version, from_array
from lamina.jit import tracer

_ADD_SCALED = OPERATORS["add_scaled_"]
ParamsT = Iterable[Tensor] | Iterable[dict[str, Any]] | Iterable[tuple[str, Tensor]]


class Update(NamedTuple):
    """One parameter's step, checked but not applied (Note [Atomic steps]): the
    parameter becomes ``p * decay - scale * delta()`` (``decay`` None: no
    multiplication; the scaled subtraction is one pass, as PyTorch's ``add_`` with
    ``alpha``) and its state is updated with ``state``. ``delta`` must not read the
    parameter (whose value may have been multiplied by then)."""

    delta: Callable[[], Tensor]
    state: dict[str, Any]
    decay: float | None = None
    scale: float = 1.0


# ---------------------------------------------------------------- the option table
# a check: (value, optimizer name, option name, whether to check the range) -> the
# value normalized (a float, a bool, betas as a tuple of floats)
Check = Callable[[Any, str, str, bool], Any]


def _number(low: float = -math.inf, high: float = math.inf, high_open: bool = False) -> Check:
    """A real, finite number in [low, high] (or [low, high)), returned as a float."""
    if low == -math.inf:
        what = "a finite number"
    elif high == math.inf:
        what = f"a finite number >= {low:g}"
    else:
        what = f"a number in [{low:g}, {high:g}{')' if high_open else ']'}"

    def check(value: Any, fn: str, name: str, ranges: bool) -> float:
        v = value if type(value) is float else real(value, fn, name)
        if not ranges:
            return v
        inside = low <= v < high if high_open else low <= v <= high
        if not (inside and math.isfinite(v)):
            raise ValueError(f"{fn}: {name} must be {what}, got {v!r}")
        return v

    return check


def _betas(value: Any, fn: str, name: str, ranges: bool) -> tuple[float, float]:
    if type(value) is tuple and len(value) == 2 and type(value[0]) is type(value[1]) is float:
        betas = value  # the common case, at every step
    elif not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{fn}: {name} must be a pair of numbers, got {value!r}")
    else:
        betas = (real(value[0], fn, f"{name}[0]"), real(value[1], fn, f"{name}[1]"))
    if ranges and not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"{fn}: {name} must be two numbers in [0, 1), got {value!r}")
    return betas


def _flag(value: Any, fn: str, name: str, ranges: bool) -> bool:
    return value if value is True or value is False else boolean(value, fn, name)


def _flag_or_none(value: Any, fn: str, name: str, ranges: bool) -> bool | None:
    return None if value is None else _flag(value, fn, name, ranges)


def _not_differentiable(value: Any, fn: str, name: str, ranges: bool) -> bool:
    if _flag(value, fn, name, ranges):
        raise ValueError(
            f"{fn}: differentiable=True is not supported: lamina's optimizers update the "
            "parameters in place, outside the autograd graph"
        )
    return False


_AT_LEAST_0 = _number(0.0)

# option -> its check, for every optimizer; a group's other keys are the user's own
OPTIONS: dict[str, Check] = {
    "lr": _AT_LEAST_0,
    "momentum": _AT_LEAST_0,
    "dampening": _number(),
    "weight_decay": _AT_LEAST_0,
    "eps": _AT_LEAST_0,
    "alpha": _AT_LEAST_0,
    "rho": _number(0.0, 1.0),
    "lr_decay": _AT_LEAST_0,
    "initial_accumulator_value": _AT_LEAST_0,
    "betas": _betas,
    "nesterov": _flag,
    "maximize": _flag,
    "amsgrad": _flag,
    "centered": _flag,
    "decoupled_weight_decay": _flag,
    "capturable": _flag,
    "foreach": _flag_or_none,
    "fused": _flag_or_none,
    "differentiable": _not_differentiable,
}

# (the options it reads, whether a group satisfies it, what it needs)
RULES: list[tuple[tuple[str, ...], Callable[[dict], bool], str]] = [
    (
        ("nesterov", "momentum", "dampening"),
        lambda g: not g["nesterov"] or (g["momentum"] > 0 and g["dampening"] == 0),
        "nesterov=True needs momentum > 0 and dampening 0",
    ),
]


def check_options(options: dict[str, Any], fn: str, ranges: bool = True) -> dict[str, Any]:
    """``options`` with every known option checked and normalized (floats, bools,
    betas as a tuple); raises a TypeError (or, checking ``ranges`` and ``RULES``, a
    ValueError) naming ``fn`` and the option."""
    out = dict(options)
    for name, value in options.items():
        check = OPTIONS.get(name)
        if check is not None:
            out[name] = check(value, fn, name, ranges)
    for names, holds, needs in RULES if ranges else ():
        if all(n in out for n in names) and not holds(out):
            raise ValueError(f"{fn}: {needs}")
    return out


# ---------------------------------------------------------------- the base class
class Optimizer:
    """The base of the optimizers: ``Optimizer(params, defaults)``.

    ``params`` is an iterable of tensors, of ``(name, tensor)`` pairs (as
    ``named_parameters()`` yields) or of dicts (parameter groups: ``{"params": [...],
    "lr": ...}``, each option a group leaves out taken from ``defaults``). Each
    parameter must be a leaf tensor, in one group only; a frozen one (that does not
    require grad) is kept and skipped while it has no gradient, as in PyTorch.

    Attributes, as PyTorch's: ``defaults``, ``param_groups`` (a list of dicts holding
    ``params`` and every option), ``state`` (a dict from parameter to its state dict).
    A subclass either computes one parameter's step in ``_update`` (lamina's optimizers
    do; ``step`` then applies them all, or none if one fails) or overrides ``step``, as
    in PyTorch.
    """

    supports_complex = False  # whether the update rule is right for complex parameters

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        name = type(self).__name__
        self.defaults = check_options(defaults, name)
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        self._opt_called = False  # read by the learning-rate schedulers
        if isinstance(params, Tensor):
            raise TypeError(
                f"{name}: params must be an iterable of tensors or of parameter groups "
                "(dicts), got one tensor; pass [tensor]"
            )
        groups = list(params)
        if not groups:
            raise ValueError(f"{name}: optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's own ``step`` also records that a step was taken (the
        schedulers warn when they step before the optimizer ever did)."""
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if step is None or getattr(step, "_records_steps", False):
            return

        @functools.wraps(step)
        def recorded(self: Optimizer, *args: Any, **kw: Any) -> Any:
            self._opt_called = True
            return step(self, *args, **kw)

        recorded._records_steps = True  # type: ignore[attr-defined]
        cls.step = recorded  # type: ignore[method-assign]

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {group[k]}" for k in sorted(group) if k != "params"]
        return "\n".join(lines) + "\n)"

    # ---------------------------------------------------------- groups
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters with its own options (the defaults fill in the
        rest): for layers unfrozen during training, as in PyTorch."""
        name = type(self).__name__
        if not isinstance(param_group, dict):
            raise TypeError(f"{name}: a parameter group must be a dict, got {type(param_group)}")
        if "params" not in param_group:
            raise ValueError(f"{name}: a parameter group needs the key 'params'")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(
                f"{name}: parameters must be in an ordered collection (a list), not a set, "
                "whose order changes between runs"
            )
        params = list(params)
        names = [p[0] for p in params if isinstance(p, tuple)]
        if names and len(names) != len(params):
            raise ValueError(f"{name}: give every parameter a name, or none")
        tensors = [p[1] for p in params] if names else params
        for i, p in enumerate(tensors):
            _check_parameter(p, i, name, self.supports_complex)
        seen = {id(p) for p in tensors}
        if len(seen) != len(tensors):
            raise ValueError(f"{name}: a parameter appears twice in one parameter group")
        for group in self.param_groups:
            if any(id(p) in seen for p in group["params"]):
                raise ValueError(f"{name}: some parameters appear in more than one parameter group")
            if ("param_names" in group) != bool(names):
                raise ValueError(
                    f"{name}: all parameter groups must be with names or all without names"
                )
        group = {**param_group, "params": tensors}
        if names:
            group["param_names"] = names
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        group = check_options(group, name)
        param_group.clear()  # as PyTorch: the dict given is the group
        param_group.update(group)
        self.param_groups.append(param_group)

    # ---------------------------------------------------------- gradients
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the parameters' gradients: set them to None (the default), or, with
        ``set_to_none=False``, fill them with zeros in place (views of a gradient
        see the zeros)."""
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if set_to_none:
                    p.grad = None
                elif g.requires_grad:  # recorded with create_graph: zeros outside the graph
                    p.grad = ops.zeros_like(g)
                else:
                    g[...] = 0

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient, and return what ``closure``
        returned (it is called first, with grad mode on, to recompute the loss and
        the gradients; None without one). All or nothing: a gradient that does not fit
        its parameter, or an option that is not a number, raises before any parameter
        or state changes."""
        if tracer.current() is not None:  # Note [Eager calls in a trace] in lamina.jit
            reason = f"{type(self).__name__}.step() runs eagerly: it updates its state"
            return tracer.eagerly(reason, lambda real: self.step(closure))
        self._opt_called = True
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        name = type(self).__name__
        with no_grad():
            updates = []
            for group in self.param_groups:
                options = None
                for p in group["params"]:
                    grad = p.grad
                    if grad is None:
                        continue
                    if options is None:
                        options = check_options(group, name, ranges=False)
                    _check_like(p, grad, "gradient", name)
                    update = self._update(options, p, grad, self.state.get(p))
                    for key, value in update.state.items():
                        if key != "step" and isinstance(value, Tensor):
                            _check_like(p, value, f"new {key}", name)
                    updates.append((p, update))
            for p, update in updates:
                if update.decay is not None:
                    p *= update.decay
                # the delta is freed at once: the next update's temporaries reuse it
                _subtract_scaled(p, update.delta(), update.scale)
                if update.state:
                    self.state[p].update(update.state)
        return loss

    step._records_steps = True  # type: ignore[attr-defined]

    def _update(
        self, group: dict[str, Any], p: Tensor, grad: Tensor, state: dict[str, Any] | None
    ) -> Update:
        """The step of parameter ``p`` with gradient ``grad``, under ``group``'s
        checked options; ``state`` is its state (None before its first step), which
        must not be changed."""
        raise NotImplementedError(f"{type(self).__name__} defines neither _update nor step")

    # ---------------------------------------------------------- state dicts
    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {...}}, "param_groups": [{..., "params": [index, ...]}]}``,
        as PyTorch's: parameters are numbered in group order. The state tensors are
        the optimizer's own, which steps replace rather than change."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append(packed)
        state = {
            (index[id(p)] if isinstance(p, Tensor) else p): dict(s) for p, s in self.state.items()
        }
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the state and the group options of ``state_dict`` (from ``state_dict()``
        of an optimizer of the same parameter layout). The state's tensors are copied,
        cast to their parameter's dtype (floating parameters; ``step`` keeps its own)
        and moved to its device."""
        name = type(self).__name__
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"{name}: the state dict has {len(saved_groups)} parameter groups, the "
                f"optimizer {len(self.param_groups)}"
            )
        for i, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(group["params"]) != len(saved["params"]):
                raise ValueError(
                    f"{name}: parameter group {i} has {len(saved['params'])} parameters in "
                    f"the state dict, {len(group['params'])} in the optimizer"
                )
        by_index = dict(
            zip(
                chain.from_iterable(g["params"] for g in saved_groups),
                chain.from_iterable(g["params"] for g in self.param_groups),
            )
        )
        state: defaultdict[Any, dict[str, Any]] = defaultdict(dict)
        for key, value in state_dict["state"].items():
            p = by_index.get(key)
            state[key if p is None else p] = value if p is None else _cast(p, value, name)
        groups = []
        for group, saved in zip(self.param_groups, saved_groups):
            saved = {**self.defaults, **saved, "params": group["params"]}
            if "param_names" in group and "param_names" not in saved:
                saved["param_names"] = group["param_names"]
            groups.append(check_options(saved, name))
        self.state, self.param_groups = state, groups


def _subtract_scaled(p: Tensor, delta: Tensor, scale: float) -> None:
    """p -= scale * delta: one pass over a real float parameter (add_scaled_), the
    general in-place subtraction otherwise (complex parameters, a delta of another
    dtype or shape)."""
    if p.dtype.kind == "f" and delta.dtype is p.dtype and delta.shape == p.shape:
        _ADD_SCALED(p, delta, -scale)
        bump_version(p)  # Note [Version counters]
    else:
        p -= delta if scale == 1.0 else scale * delta


def _check_parameter(p: Any, i: int, fn: str, complex_ok: bool) -> None:
    if not isinstance(p, Tensor):
        raise TypeError(
            f"{fn}: optimizers update tensors, but parameter {i} is a {type(p).__name__}"
        )
    if p.dtype.kind == "c" and not complex_ok:
        raise TypeError(f"{fn}: complex parameters are not supported (parameter {i} is {p.dtype})")
    if p.grad_fn is not None:
        raise ValueError(
            f"{fn}: can't optimize a non-leaf tensor (parameter {i} is the output of "
            f"{p.grad_fn.name}); optimize the leaf tensors it is computed from"
        )


def _check_like(p: Tensor, t: Tensor, what: str, fn: str) -> None:
    if t.shape != p.shape or t.dtype != p.dtype or t.is_sparse:
        raise RuntimeError(
            f"{fn}: a parameter of shape {p.shape} and dtype {p.dtype} has a "
            f"{'sparse ' if t.is_sparse else ''}{what} of shape {t.shape} and dtype {t.dtype}"
        )


def _cast(p: Tensor, value: Any, fn: str, key: str | None = None) -> Any:
    """A copy of one loaded state value for parameter ``p``: tensors cast to ``p``'s
    dtype (but ``step``) and moved to its device, containers copied through."""
    if isinstance(value, Tensor):
        if key != "step" and value.ndim and value.shape != p.shape:
            raise ValueError(
                f"{fn}: the state dict has a {key} of shape {value.shape} for a parameter "
                f"of shape {p.shape}"
            )
        floating = key != "step" and p.dtype.kind == "f"
        out = ops.astype(value, p.dtype if floating else value.dtype, copy=True)
        return out.to_device(p.device)
    if isinstance(value, dict):
        return {k: _cast(p, v, fn, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(p, v, fn) for v in value)
    return value


def step_count(state: dict[str, Any] | None) -> float:
    """The number of the step about to be taken (1 for the first), read from the
    ``step`` entry of a parameter's state."""
    return float(state["step"]) + 1.0 if state else 1.0


def step_tensor(step: float) -> Tensor:
    """The ``step`` entry of a parameter's state: a 0-d tensor of the default float
    dtype, as PyTorch keeps it."""
    return from_array(np.array(step, dtype=dtypes.default_float.np))


def lerp(start: Tensor, end: Tensor, weight: float) -> Tensor:
    """``start + weight * (end - start)`` computed as PyTorch's ``lerp`` does (from
    the nearer end, for accuracy)."""
    if abs(weight) < 0.5:
        return start + weight * (end - start)
    return end - (end - start) * (1.0 - weight)
