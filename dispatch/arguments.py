"""Argument kinds of the operator schema: each checks one public argument and gives
its canonical form, or raises a TypeError/ValueError naming the function, the argument
and what it got.

The annotations in ``operators.py`` name these kinds (``x: Tensor``, ``axis: Axes``);
the generated bindings (``bindings.py``) call them, so every backend receives canonical
arguments: axes as non-negative ints, shapes as tuples of ints, dtypes as lamina dtypes.
A bool is never accepted where an int belongs (``sum(x, axis=True)`` is a TypeError,
as in NumPy).
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from . import keys
from .devices import Device
from .dtypes import DType, as_dtype


class AxisError(ValueError, IndexError):
    """An axis out of range for a tensor's number of dimensions."""


class LinAlgError(ValueError):
    """A linear algebra function cannot compute its result: a singular matrix, one
    that is not positive definite, an algorithm that did not converge (lamina.linalg;
    a ValueError, as NumPy's is)."""


def _kind_name(value: Any) -> str:
    return type(value).__name__


def tensor(value: Any, fn: str, name: str) -> Any:
    if getattr(value, "_ks", None) is None:
        raise TypeError(f"{fn}: {name} must be a tensor, got {_kind_name(value)}")
    return value


def tensor_or_scalar(value: Any, fn: str, name: str) -> Any:
    if getattr(value, "_ks", None) is None and not isinstance(value, (bool, int, float, complex)):
        raise TypeError(
            f"{fn}: {name} must be a tensor or a Python scalar, got {_kind_name(value)}"
        )
    return value


def tensors(value: Any, fn: str, name: str) -> list:
    if getattr(value, "_ks", None) is not None or not isinstance(value, (list, tuple)):
        raise TypeError(f"{fn}: {name} must be a list or tuple of tensors, got {_kind_name(value)}")
    value = list(value)
    if not value:
        raise ValueError(f"{fn}: {name} needs at least one tensor")
    for i, t in enumerate(value):
        if getattr(t, "_ks", None) is None:
            raise TypeError(f"{fn}: {name}[{i}] must be a tensor, got {_kind_name(t)}")
    return value


def integer(value: Any, fn: str, name: str) -> int:
    """An int (or anything with ``__index__``), never a bool or a float."""
    if type(value) is int:  # the common case, first
        return value
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{fn}: {name} must be an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: {name} must be an int, got {_kind_name(value)}") from None


def real(value: Any, fn: str, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{fn}: {name} must be a real number, got {_kind_name(value)}")
    return float(value)


def boolean(value: Any, fn: str, name: str) -> bool:
    if value is False or value is True:  # the common case, first
        return value
    if not isinstance(value, (bool, np.bool_, int)):
        raise TypeError(f"{fn}: {name} must be a bool, got {_kind_name(value)}")
    return bool(value)


def axis(value: Any, fn: str, name: str, ndim: int) -> int:
    """One axis in [-ndim, ndim), as a non-negative int."""
    a = value if type(value) is int else integer(value, fn, name)
    if not -ndim <= a < ndim:
        raise AxisError(f"{fn}: {name} {a} is out of bounds for a tensor of dimension {ndim}")
    return a % ndim


def new_axis(value: Any, fn: str, name: str, ndim: int) -> int:
    """A position for a new axis: in [-ndim - 1, ndim], as a non-negative int."""
    return axis(value, fn, name, ndim + 1)


def axes(value: Any, fn: str, name: str, ndim: int) -> tuple[int, ...]:
    """None (every axis), an int or a tuple of ints: a sorted tuple of distinct
    non-negative axes."""
    if type(value) is int and -ndim <= value < ndim:  # the common case, first: 0.15 us,
        return (value % ndim,)  # where the general path takes 0.8
    if value is None:
        return tuple(range(ndim))
    items = value if isinstance(value, (tuple, list)) else (value,)
    found = [axis(a, fn, name, ndim) for a in items]
    if len(set(found)) != len(found):
        raise ValueError(f"{fn}: repeated axis in {name}={value!r}")
    return tuple(sorted(found))


def one_axis_or_all(value: Any, fn: str, name: str, ndim: int) -> tuple[int, ...]:
    """None (every axis) or one int, given to kernels as ``axes`` gives them."""
    if isinstance(value, (tuple, list)):
        raise TypeError(f"{fn}: {name} must be an int or None, got {_kind_name(value)}")
    return axes(value, fn, name, ndim)


def shape(value: Any, fn: str, name: str) -> tuple[int, ...]:
    """An int or a sequence of ints, as a tuple of ints."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    try:
        return tuple(integer(s, fn, name) for s in items)
    except TypeError:
        raise TypeError(f"{fn}: {name} must be a tuple of ints, got {value!r}") from None


def sizes(value: Any, fn: str, name: str) -> tuple[int, ...]:
    """A shape of a new tensor: an int or a sequence of non-negative ints."""
    shape_ = shape(value, fn, name)
    if any(s < 0 for s in shape_):
        raise ValueError(f"{fn}: {name} must not have negative sizes, got {shape_}")
    return shape_


def dtype(value: Any, fn: str, name: str) -> DType:
    if value is None:  # np.dtype(None) would be float64
        raise TypeError(f"{fn}: {name} must be a dtype, got None")
    try:
        return as_dtype(value)
    except TypeError as exc:
        raise TypeError(f"{fn}: {name}: {exc}") from None


def device(value: Any, fn: str, name: str) -> str:
    """A Device or a device name, as the name of a registered device."""
    if not isinstance(value, (str, Device)):
        raise TypeError(f"{fn}: {name} must be a device or a device name, got {_kind_name(value)}")
    name = str(value)
    if not keys.is_device(name):
        raise ValueError(
            f"{fn}: unknown device {name!r}; known devices: {', '.join(keys.devices())}"
        )
    return name


def anything(value: Any, fn: str, name: str) -> Any:
    return value


def pair(value: Any, fn: str, name: str) -> tuple[int, int]:
    """An int or a pair of ints, as a pair (PyTorch's ``_pair``: ``3`` is ``(3, 3)``)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{fn}: {name} must be an int or a pair of ints, got {value!r}")
        return (integer(value[0], fn, name), integer(value[1], fn, name))
    v = integer(value, fn, name)
    return (v, v)


def string(value: Any, fn: str, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{fn}: {name} must be a str, got {_kind_name(value)}")
    return value


# Note [Argument kinds]: the annotation of a schema parameter -> (its check, whether it
# needs the tensor's ndim). ``X | None`` lets None through unchecked.
KINDS: dict[str, tuple[Callable, bool]] = {
    "Tensor": (tensor, False),
    "TensorOrScalar": (tensor_or_scalar, False),
    "Tensors": (tensors, False),
    "int": (integer, False),
    "float": (real, False),
    "bool": (boolean, False),
    "Axis": (axis, True),
    "NewAxis": (new_axis, True),
    "Axes": (axes, True),
    "OneAxisOrAll": (one_axis_or_all, True),
    "Shape": (shape, False),
    "Sizes": (sizes, False),
    "DType": (dtype, False),
    "Device": (device, False),
    "Any": (anything, False),
    "Pair": (pair, False),
    "str": (string, False),
}

DESCRIPTIONS = {
    "Tensor": "a tensor",
    "TensorOrScalar": "a tensor or a Python scalar (bool, int, float, complex)",
    "Tensors": "a non-empty list or tuple of tensors",
    "int": "an int (not a bool)",
    "float": "a real number",
    "bool": "a bool",
    "Axis": "an axis in [-ndim, ndim); kernels get it non-negative",
    "NewAxis": "a position in [-ndim - 1, ndim] for a new axis; kernels get it non-negative",
    "Axes": "None (every axis), an int or a tuple of ints; kernels get a sorted tuple of "
    "non-negative axes",
    "OneAxisOrAll": "None (every axis) or an int; kernels get it as Axes",
    "Shape": "an int or a tuple of ints",
    "Sizes": "an int or a tuple of non-negative ints",
    "DType": "a lamina dtype, a NumPy dtype, a name or bool/int/float",
    "Device": "a device or a device name",
    "Any": "anything (passed on as given)",
    "Pair": "an int or a pair of ints; kernels get a pair",
    "str": "a str",
}


# ---------------------------------------------------------------- checked functions
# Note [Checked functions]: public functions that are not operators (the composites,
# Tensor methods, the autograd and optimizer entry points) get the same checks as the
# generated bindings, generated the same way from their own signatures: ``checked``
# reads each parameter's annotation, and a parameter annotated with one of these (or
# ``X | None``, which lets None through) is checked and normalized by its kind before
# the function runs. Other annotations are the function's own business.
ANNOTATIONS = {
    "Tensor": "Tensor",
    "int": "int",
    "float": "float",
    "bool": "bool",
    "DTypeLike": "DType",
    "DeviceLike": "Device",
    "str | Device": "Device",
    "ShapeLike": "Sizes",
}


def checked(fn: Callable) -> Callable:
    """``fn`` with every argument whose annotation names a kind (``ANNOTATIONS``)
    checked by it first: a TypeError or ValueError naming the function and the
    argument, as for the operators (Note [Checked functions])."""
    name = fn.__name__ if fn.__name__ != "__init__" else fn.__qualname__.split(".")[0]
    signature = inspect.signature(fn)
    namespace: dict[str, Any] = {"_fn": fn}
    params, lines, call = [], [], []
    for i, p in enumerate(signature.parameters.values()):
        default = ""
        if p.default is not inspect.Parameter.empty:
            namespace[f"_d{i}"] = p.default
            default = f"=_d{i}"
        star = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        params.append((p.kind, f"{star}{p.name}{default}"))
        call.append(f"{p.name}={p.name}" if p.kind == p.KEYWORD_ONLY else f"{star}{p.name}")
        text = _annotation_text(p.annotation)
        optional = text.endswith(" | None") or p.default is None
        kind = ANNOTATIONS.get(text.removesuffix(" | None"))
        if kind is None or star:
            continue
        namespace[f"_{kind}"] = KINDS[kind][0]
        check = f"{p.name} = _{kind}({p.name}, {name!r}, {p.name!r})"
        lines += (
            [f"    if {p.name} is not None:", f"        {check}"] if optional else [f"    {check}"]
        )
    text = ", ".join(_with_markers(params))
    source = (
        f"def {fn.__name__}({text}):\n"
        + "\n".join(lines)
        + (f"\n    return _fn({', '.join(call)})\n")
    )
    exec(compile(source, f"<checked {fn.__qualname__}>", "exec"), namespace)
    wrapper = namespace[fn.__name__]
    wrapper.__wrapped__ = fn  # inspect.signature and docs see fn's signature
    for attr in ("__module__", "__qualname__", "__doc__", "__annotations__"):
        setattr(wrapper, attr, getattr(fn, attr))
    return wrapper


def _annotation_text(annotation: Any) -> str:
    """An annotation as written: a string (``from __future__ import annotations``), a
    class (``int``) or a union (``bool | None``)."""
    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, str):
        return annotation
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _with_markers(params: list) -> list[str]:
    """Parameter texts with ``/`` and ``*`` where the kinds change."""
    kinds, out = inspect.Parameter, []
    for i, (kind, text) in enumerate(params):
        before = params[i - 1][0] if i else None
        if before == kinds.POSITIONAL_ONLY and kind != kinds.POSITIONAL_ONLY:
            out.append("/")
        if kind == kinds.KEYWORD_ONLY and before not in (kinds.KEYWORD_ONLY, kinds.VAR_POSITIONAL):
            out.append("*")
        out.append(text)
    if params and params[-1][0] == kinds.POSITIONAL_ONLY:
        out.append("/")
    return out
