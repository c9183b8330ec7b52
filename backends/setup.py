"""Operator setup shared by the CPU backends: type promotion with Python scalars,
dtype checks, broadcasting and axis handling. Pure Python, no kernels.

Python scalars are *weak* (Array API, NEP 50; Note [Weak scalars] in dispatch/dtypes.py):
they take the tensor's dtype when their kind fits (``int8_tensor + 1`` is int8;
``float32_tensor + 1j`` complex64; ``int_tensor + 1.5`` is the default float) and an
integer that does not fit raises OverflowError instead of wrapping.
"""

import numpy as np

from lamina.dispatch import dtypes as D
from lamina.dispatch.meta import broadcast_shapes, reduced_shape  # noqa: F401 (re-exported)

_SCALARS = D.PY_SCALAR_TYPES


def scalar_value(x):
    """A Python scalar for ``x`` (NumPy scalars become Python ones), or None."""
    if isinstance(x, _SCALARS):
        return x
    if isinstance(x, np.generic) and x.ndim == 0:
        return x.item()
    return None


def promote(op, args):
    """The computation dtype of an elementwise call, checked against the operator."""
    dtype = None
    for a in args:
        d = getattr(a, "_dtype", None)
        if d is not None:
            dtype = d if dtype is None else D.PROMOTE[dtype.index][d.index]
    if dtype is None:  # where(cond, 1, 2.5): no tensor; the scalars' default dtype
        values = [scalar_value(a) for a in args]
        if not values or any(v is None for v in values):
            raise TypeError(
                f"{op.name}: expected at least one tensor operand to take the "
                f"dtype from, got {', '.join(type(a).__name__ for a in args)}"
            )
        dtype = D.bool_  # Array API 2024.12: only scalars give their kind's default
    for a in args:
        v = scalar_value(a)
        if v is not None:
            dtype = D.promote_weak(dtype, v)
    return check_dtype(op, dtype)


# the dtype kinds of each rule of dispatch/schema.py's DTYPE_RULES, and how errors name them
_ACCEPTS = {
    "any": "biufc",
    "real": "biuf",
    "numeric": "iufc",
    "real_numeric": "iuf",
    "float": "fc",
    "real_float": "f",
    "complex": "c",
    "int": "iu",
    "intbool": "biu",
}
_DESCRIBE = {
    "real": "real-valued (not complex)",
    "numeric": "numeric",
    "real_numeric": "real-valued numeric",
    "float": "floating-point",
    "real_float": "real-valued floating-point",
    "complex": "complex floating-point",
    "int": "integer",
    "intbool": "integer or boolean",
}
_TO_FLOAT = ("float", "real_float")  # rules that compute ints and bool in the default float


def check_dtype(op, dtype):
    """The computation dtype of ``op`` for inputs of ``dtype``, or a TypeError naming
    the operator, what it needs and the dtype it got."""
    rule = op.dtypes
    if dtype.kind in _ACCEPTS[rule]:
        return dtype
    if rule in _TO_FLOAT and dtype.kind in "biu":
        return D.default_float  # as NumPy: exp(int tensor) is float64
    raise TypeError(f"{op.name} needs {_DESCRIBE[rule]} inputs, got {dtype}")


def result_dtype(op, dtype):
    rule = op.result
    if rule == "bool":
        return D.bool_
    if rule == "index":
        return D.int64
    if rule == "sum":
        return _SUM_RESULTS.get(dtype.kind, dtype)
    if rule == "real":
        return D.real_of(dtype)
    if rule == "complex":
        return D.complex_of(dtype)
    return dtype


_SUM_RESULTS = {"b": D.int64, "i": D.int64, "u": D.uint64}


def operand(x, dtype):
    """The NumPy array for one operand in computation dtype (scalars become 0-d)."""
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


def mixed_sign_comparison(op, args):
    """Note [Mixed-sign comparisons]: promotion takes a signed integer and uint64 to
    float64, which rounds above 2**53 (2**63 - 1 == 2**63 would be True). NumPy 2
    compares such pairs exactly, so the CPU backends give these calls to NumPy's
    ufunc on the uncast arrays. True for such a call."""
    if op.name not in _COMPARISONS:
        return False
    dtypes = [a._dtype for a in args if hasattr(a, "_dtype")]  # scalars are weak
    return D.uint64 in dtypes and any(d.kind == "i" for d in dtypes)


def shape_of(x):
    return getattr(x, "_shape", ())


def inplace_check(op, target, dtype, shape):
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


def sum_dtype(op, x, dtype):
    """The accumulation/result dtype of sum and prod (Array API defaults); a complex
    tensor cannot be summed in a real dtype (the imaginary parts would be dropped)."""
    if dtype is not None:
        dtype = check_dtype(op, D.as_dtype(dtype))
        if x._dtype.kind == "c" and dtype.kind != "c":
            raise TypeError(
                f"{op.name}: a {x._dtype} tensor cannot be accumulated in {dtype} "
                "(the imaginary parts would be dropped); take real(x) first"
            )
        return dtype
    return result_dtype(op, check_dtype(op, x._dtype))


def clip_bound(bound, dtype):
    """A clip bound as an array of x's dtype. An integer tensor bound of a wider dtype
    is saturated to the dtype's range first: cast, it would wrap (an int64 bound of -1
    on uint8 data would clip at 255); saturated, it bounds exactly as it would in the
    wider dtype, since every element of x is inside that range."""
    data = getattr(bound, "_data", None)
    if isinstance(data, np.ndarray) and dtype.kind in "iu" and data.dtype != dtype.np:
        info = np.iinfo(dtype.np)
        return np.clip(data, info.min, info.max).astype(dtype.np)
    return operand(bound, dtype)


def check_clip_bounds(x, *bounds):
    """clip keeps x's dtype (Array API), so a bound of another kind would be cast and
    silently move (clip(int_tensor, 2.5) clipping at 2): refuse it instead."""
    for b in bounds:
        if b is None:
            continue
        v = scalar_value(b)
        kind = D.weak_kind(v) if v is not None else b._dtype.kind
        if kind == "c":
            raise TypeError("clip: complex bounds have no order; clip needs real-valued bounds")
        if (kind == "f" and x._dtype.kind != "f") or (kind == "b" and x._dtype.kind != "b"):
            raise TypeError(
                f"clip: a bound of kind {'float' if kind == 'f' else 'bool'} "
                f"cannot bound a {x._dtype} tensor without changing its dtype; "
                "cast x with astype first"
            )
