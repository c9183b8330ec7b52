"""Operator setup shared by the CPU backends, and public for plugins (docs/backends.md,
"Helpers"): type promotion with Python scalars, dtype checks, broadcasting, reduced
shapes and NumPy operands. Pure Python, no kernels. The dtype and shape rules are the
schema's (``lamina.dispatch.meta``, re-exported here); the rest turns arguments into
NumPy arrays the way lamina's CPU kernels do.

Python scalars are *weak* (Array API, NEP 50; Note [Weak scalars] in dispatch/dtypes.py):
they take the tensor's dtype when their kind fits (``int8_tensor + 1`` is int8;
``float32_tensor + 1j`` complex64; ``int_tensor + 1.5`` is the default float) and an
integer that does not fit raises OverflowError instead of wrapping.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lamina.dispatch import dtypes as D
from lamina.dispatch import layouts
from lamina.dispatch.meta import (  # noqa: F401 (re-exported: the schema's dtype and shape rules)
    broadcast_shapes,
    check_cast,
    check_dtype,
    promote,
    reduced_shape,
    result_dtype,
    scalar_value,
    sum_dtype,
    weak_kind,
)


def operand(x: Any, dtype: D.DType) -> np.ndarray:
    """The NumPy array of one CPU operand (a tensor or a Python scalar) in computation
    dtype ``dtype``: a tensor's storage (cast if needed), a scalar as a 0-d array
    (OverflowError for an integer out of the dtype's range)."""
    v = scalar_value(x)
    if v is None:
        data = x._data
        return data if data.dtype == dtype.np else data.astype(dtype.np)
    if isinstance(v, int) and not isinstance(v, bool) and dtype.kind in "iu":
        info = np.iinfo(dtype.np)
        if not info.min <= v <= info.max:
            raise OverflowError(
                f"Python integer {v} is out of bounds for {dtype} [{info.min}, {info.max}]"
            )
    return np.asarray(v, dtype.np)


_COMPARISONS = frozenset("equal not_equal less less_equal greater greater_equal".split())


def mixed_sign_comparison(op: Any, args: Any) -> bool:
    """Note [Mixed-sign comparisons]: promotion takes a signed integer and uint64 to
    float64, which rounds above 2**53 (2**63 - 1 == 2**63 would be True). NumPy 2
    compares such pairs exactly, so the CPU backends give these calls to NumPy's
    ufunc on the uncast arrays. True for such a call."""
    if op.name not in _COMPARISONS:
        return False
    dtypes = [a._dtype for a in args if hasattr(a, "_dtype")]  # scalars are weak
    return D.uint64 in dtypes and any(d.kind == "i" for d in dtypes)


def shape_of(x: Any) -> tuple[int, ...]:
    """A tensor's shape, () for a Python scalar."""
    return getattr(x, "_shape", ())


def inplace_check(op: Any, target: Any, dtype: D.DType, shape: tuple[int, ...]) -> None:
    """``x1 op= x2`` must not change x1's dtype or shape (Array API)."""
    if dtype is not target._dtype:
        raise TypeError(
            f"{op.name}: the result dtype {dtype} cannot be stored in place "
            f"into a {target._dtype} tensor"
        )
    if shape != target._shape:
        raise ValueError(
            f"{op.name}: the result shape {shape} cannot be stored in place "
            f"into a tensor of shape {target._shape}"
        )
    if not target._data.flags.writeable:
        raise ValueError(
            f"{op.name}: the target tensor is a read-only view (e.g. from broadcast_to)"
        )


def clip_bound(bound: Any, dtype: D.DType) -> np.ndarray:
    """A clip bound as an array of x's dtype. An integer tensor bound of a wider dtype
    is saturated to the dtype's range first: cast, it would wrap (an int64 bound of -1
    on uint8 data would clip at 255); saturated, it bounds exactly as it would in the
    wider dtype, since every element of x is inside that range."""
    data = getattr(bound, "_data", None)
    if isinstance(data, np.ndarray) and dtype.kind in "iu" and data.dtype != dtype.np:
        info = np.iinfo(dtype.np)
        return np.clip(data, info.min, info.max).astype(dtype.np)
    return operand(bound, dtype)


def check_clip_bounds(x: Any, *bounds: Any) -> None:
    """clip keeps x's dtype (Array API), so a bound of another kind would be cast and
    silently move (clip(int_tensor, 2.5) clipping at 2): refuse it instead."""
    for b in bounds:
        if b is None:
            continue
        v = scalar_value(b)
        kind = weak_kind(v) if v is not None else b._dtype.kind
        if kind == "c":
            raise TypeError("clip: complex bounds have no order; clip needs real-valued bounds")
        if (kind == "f" and x._dtype.kind != "f") or (kind == "b" and x._dtype.kind != "b"):
            raise TypeError(
                f"clip: a bound of kind {'float' if kind == 'f' else 'bool'} "
                f"cannot bound a {x._dtype} tensor without changing its dtype; "
                "cast x with astype first"
            )


def copy_order(data: np.ndarray) -> str:
    """NumPy's ``order`` for a copy of ``data`` that Note [Result layouts] describes
    (dispatch/layouts.py): "K", its stride order, where data is dense; "C" where it is
    not (a broadcast view, stride 0: "K" put that axis innermost, and PyTorch's copy is
    C-contiguous too)."""
    dense = layouts.dense_order(data.shape, layouts.element_strides(data)) is not None
    return "K" if dense else "C"
