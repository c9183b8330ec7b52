"""numpy_ref -- plain NumPy kernels for every operator: the test oracle.

The tests compare the production backend (numba_cpu) against it, so it serves no call
in production: it registers below numba_cpu (PRIORITY) and runs only when selected
(``with lm.backends.use("numpy_ref"):``); tests/test_dispatch.py checks that numba_cpu
covers every operator, tests/test_samples.py compares the two on every operator's
samples. Its kernels are written independently of numba_cpu's, in the
most obvious NumPy (it imports no other backend). It shares operator setup (promotion,
dtype checks) with numba_cpu through ``lamina.backends.setup``, so the two can only
differ in what they compute. Sparse conversions belong to the sparse plugin.
"""

import math

import numpy as np

from lamina.backends import setup as S
from lamina.backends.hookspecs import hookimpl
from lamina.dispatch import dtypes as D
from lamina.dispatch import keys
from lamina.dispatch.devices import move
from lamina.dispatch.meta import reduced_shape
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array

from . import fft, linalg, nn, sorting

PRIORITY = -10  # below numba_cpu: it serves only when selected with lm.backends.use
# A view keeps its base's device (and sparse) keys but not AUTOGRAD: only the autograd
# layer marks results as requiring grad (Note [Autograd fields]).
_NO_AUTOGRAD = ~keys.AUTOGRAD


def elementwise(op, ufunc):
    def kernel(ks, *args):
        comp = S.promote(op, args)
        S.broadcast_shapes(op.name, *(S.shape_of(a) for a in args))
        if S.mixed_sign_comparison(op, args):  # Note [Mixed-sign comparisons]
            return from_array(np.asarray(ufunc(*[a._data for a in args])))
        res = S.result_dtype(op, comp)
        with np.errstate(all="ignore"):
            out = ufunc(*[S.operand(a, comp) for a in args])
        return from_array(np.array(out, res.np))  # a copy: np.real(x) of a real x is x

    kernel.__name__ = kernel.__qualname__ = op.name
    return kernel


def inplace(op, ufunc):
    def kernel(ks, x1, x2):
        comp = S.promote(op, (x1, x2))
        shape = S.broadcast_shapes(op.name, x1._shape, S.shape_of(x2))
        S.inplace_check(op, x1, S.result_dtype(op, comp), shape)
        with np.errstate(all="ignore"):
            x1._data[...] = ufunc(S.operand(x1, comp), S.operand(x2, comp))
        return x1

    kernel.__name__ = kernel.__qualname__ = op.name
    return kernel


def clip(ks, x, min=None, max=None):
    S.check_dtype(OPERATORS["clip"], x._dtype)
    S.check_clip_bounds(x, min, max)
    lo = None if min is None else S.clip_bound(min, x._dtype)
    hi = None if max is None else S.clip_bound(max, x._dtype)
    # the result has the broadcast shape of x and the bounds (Array API); x's dtype
    shape = S.broadcast_shapes("clip", x._shape, *(S.shape_of(b) for b in (min, max)))
    out = np.broadcast_to(x._data, shape).copy()
    if lo is not None:
        out = np.where(np.isnan(lo) if x._dtype.kind == "f" else False, lo, np.maximum(out, lo))
    if hi is not None:
        out = np.where(np.isnan(hi) if x._dtype.kind == "f" else False, hi, np.minimum(out, hi))
    # asarray, not ascontiguousarray: that makes a 0-d result 1-d
    return from_array(np.asarray(out, x._dtype.np, order="C"))


def where(ks, condition, x1, x2):
    comp = S.promote(OPERATORS["where"], (x1, x2))
    S.broadcast_shapes("where", *(S.shape_of(a) for a in (condition, x1, x2)))
    return from_array(
        np.asarray(
            np.where(S.operand(condition, D.bool_), S.operand(x1, comp), S.operand(x2, comp))
        )
    )


def astype(ks, x, dtype, copy):
    if not copy and dtype is x._dtype:  # the Array API: copy=False may return x itself
        return x
    S.check_cast("astype", x._data, dtype)
    return from_array(np.array(x._data, dtype=dtype.np, copy=True))


def copy(ks, x):
    return from_array(np.array(x._data, copy=True))  # the values; the layout is numba_cpu's


def to_device(ks, x, device):
    return move(x, device)  # a move is the devices' converters: nothing else to compare


# ---------------------------------------------------------------- reductions


def _reduce(fn, result):
    def kernel(ks, x, axis, *rest):
        with np.errstate(all="ignore"):
            out = fn(x, axis, *rest)
        return from_array(np.asarray(out, result(x).np))

    return kernel


def _sum(npfn, name):
    def kernel(ks, x, axis, dtype, keepdims):
        res = S.sum_dtype(OPERATORS[name], x, dtype)
        S.check_cast(name, x._data, res)
        return from_array(
            np.asarray(npfn(x._data, axis=axis, keepdims=keepdims, dtype=res.np), res.np)
        )

    return kernel


def _float_stat(npfn, name):
    op = OPERATORS[name]

    def compute(x, axis, correction, keepdims):
        dtype = S.check_dtype(op, x._dtype)
        extra = {} if name == "mean" else {"ddof": correction}
        n = math.prod([x._shape[d] for d in axis])
        if n == 0 or n - extra.get("ddof", 0) <= 0:
            return np.full(S.reduced_shape(x._shape, axis, keepdims), np.nan)
        return npfn(x._data.astype(dtype.np), axis=axis, keepdims=keepdims, **extra)

    kernel = _reduce(compute, lambda x: S.result_dtype(op, S.check_dtype(op, x._dtype)))
    if name == "mean":
        return lambda ks, x, axis, keepdims: kernel(ks, x, axis, 0.0, keepdims)
    return kernel


def _extreme(npfn, name):
    def compute(x, axis, keepdims):
        S.check_dtype(OPERATORS[name], x._dtype)
        if any(x._shape[d] == 0 for d in axis):
            raise ValueError(
                f"{name}: cannot reduce a zero-size axis (shape {x._shape}, "
                f"axis {axis}): there is no identity"
            )
        return npfn(x._data, axis=axis, keepdims=keepdims)

    return _reduce(compute, lambda x: x._dtype)


def _arg(npfn, name):
    def compute(x, axis, keepdims):
        S.check_dtype(OPERATORS[name], x._dtype)
        if any(x._shape[d] == 0 for d in axis):  # axis holds every dim when it was None
            raise ValueError(
                f"{name}: cannot take the {name} of an empty sequence (shape {x._shape})"
            )
        data = x._data
        if len(axis) != 1:  # several (or all) axes: move them last and flatten them
            kept = reduced_shape(x._shape, axis, keepdims)
            last = np.moveaxis(data, axis, range(-len(axis), 0))
            return npfn(last.reshape(last.shape[: data.ndim - len(axis)] + (-1,)), axis=-1).reshape(
                kept
            )
        return npfn(data, axis=axis[0], keepdims=keepdims)

    return _reduce(compute, lambda x: D.int64)


def _logical(npfn):
    return _reduce(
        lambda x, axis, keepdims: npfn(x._data, axis=axis, keepdims=keepdims), lambda x: D.bool_
    )


# ---------------------------------------------------------------- views and joins


def _view(data_of):
    """A view kernel: ``data_of(array, *args)`` is the view's array."""

    def kernel(ks, x, *args):
        return from_array(data_of(x._data, *args), x._ks & _NO_AUTOGRAD)

    kernel.__name__ = kernel.__qualname__ = data_of.__name__
    return kernel


def reshape(ks, x, shape, copy):
    if copy:
        return from_array(np.array(np.reshape(x._data, shape)))
    data = np.reshape(x._data, shape)
    if copy is False and data.size and data.base is None:
        raise ValueError(
            f"reshape: cannot reshape a tensor of shape {x._shape} without copying (copy=False)"
        )
    return from_array(data, x._ks & _NO_AUTOGRAD)


def permute_dims(data, axes):
    return np.transpose(data, axes)


def matrix_transpose(data):
    return np.moveaxis(data, -1, -2)


def expand_dims(data, axis):
    return data[(slice(None),) * axis + (None,)]


def squeeze(data, axis):
    return data[tuple(0 if d in axis else slice(None) for d in range(data.ndim))]


def flip(data, axis):
    return data[
        tuple(slice(None, None, -1) if d in axis else slice(None) for d in range(data.ndim))
    ]


def broadcast_to(data, shape):
    return np.broadcast_to(data, shape)


def split(data, sections, axis):
    n = data.shape[axis]
    sizes = (
        [min(sections, n - i) for i in range(0, n, sections)]
        if isinstance(sections, int)
        else list(sections)
    )
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return tuple(data[(slice(None),) * axis + (slice(s, s + k),)] for s, k in zip(starts, sizes))


def _split(ks, x, sections, axis):
    return tuple(from_array(p, x._ks & _NO_AUTOGRAD) for p in split(x._data, sections, axis))


def _unwrap_index(key):
    if isinstance(key, tuple):
        return tuple(_unwrap_index(k) for k in key)
    data = getattr(key, "_data", None)
    return key if data is None else data


def getitem(ks, x, key):
    key = _unwrap_index(key)
    full_key = (key if isinstance(key, tuple) else (key,)) + (Ellipsis,)
    if any(k is Ellipsis for k in full_key[:-1]):
        full_key = full_key[:-1]  # the user's own Ellipsis
    return from_array(x._data[full_key], x._ks & _NO_AUTOGRAD)  # 0-d results are views


def setitem(ks, x, key, value):
    if not isinstance(value, (bool, int, float)) and not hasattr(value, "_dtype"):
        raise TypeError(
            f"setitem: the value must be a tensor or a Python scalar, got {type(value).__name__}"
        )
    kind = {bool: "b", int: "i", float: "f"}.get(type(value)) or value._dtype.kind
    order = "biufc"
    if (
        kind != x._dtype.kind
        and not (kind in "iu" and x._dtype.kind in "iu")
        and (order.index(kind) > order.index(x._dtype.kind))
    ):
        raise TypeError(f"setitem: cannot store {kind!r}-kind values into a {x._dtype} tensor")
    if hasattr(value, "_dtype") and not D.can_cast(value._dtype, x._dtype):
        raise TypeError(f"setitem: cannot store {value._dtype} values into a {x._dtype} tensor")
    if not x._data.flags.writeable:
        raise ValueError("setitem: the tensor is a read-only view")
    try:
        x._data[_unwrap_index(key)] = S.operand(value, x._dtype)
    except ValueError as exc:
        raise ValueError(f"setitem: {exc}") from None
    return x


def index_add(ks, x, key, values):
    """One element at a time: the flat position of every selected element, in order."""
    comp = S.promote(OPERATORS["index_add"], (x, values))
    out = np.array(x._data, comp.np, order="C")  # so that out.reshape(-1) is a view
    positions = np.arange(out.size).reshape(out.shape)[_unwrap_index(key)]
    added = np.broadcast_to(S.operand(values, comp), positions.shape)
    flat = out.reshape(-1)
    for p, v in zip(positions.reshape(-1), added.reshape(-1)):
        flat[p] += v
    return from_array(out)


def _join(npfn, name):
    def kernel(ks, arrays, axis):
        comp = S.promote(OPERATORS[name], arrays)
        try:
            return from_array(npfn([S.operand(a, comp) for a in arrays], axis=axis))
        except ValueError as exc:
            shapes = ", ".join(str(a._shape) for a in arrays)
            raise ValueError(f"{name}: {exc}; shapes {shapes}") from None

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


concat = _join(np.concatenate, "concat")
stack = _join(np.stack, "stack")


def matmul(ks, x1, x2):
    comp = S.promote(OPERATORS["matmul"], (x1, x2))
    if not x1._shape or not x2._shape:
        raise ValueError(
            f"matmul: operands must be at least 1-D, got shapes {x1._shape} and {x2._shape}"
        )
    try:
        return from_array(np.asarray(np.matmul(S.operand(x1, comp), S.operand(x2, comp))))
    except ValueError:
        raise ValueError(f"matmul: shapes {x1._shape} and {x2._shape} do not match") from None


def tensordot(ks, x1, x2, axes):
    comp = S.promote(OPERATORS["tensordot"], (x1, x2))
    return from_array(np.asarray(np.tensordot(S.operand(x1, comp), S.operand(x2, comp), axes=axes)))


def vecdot(ks, x1, x2, axis):
    comp = S.promote(OPERATORS["vecdot"], (x1, x2))
    a, b = np.broadcast_arrays(S.operand(x1, comp), S.operand(x2, comp))
    return from_array(np.asarray(np.sum(np.conj(a) * b, axis=axis), comp.np))


# ---------------------------------------------------------------- creation


# Each creation kernel states the Array API's definition of
# its values (arange's start + i * step for i < ceil((stop - start) / step), eye's
# ones where column - row == k, ...) in Python numbers, then stores them in the dtype;
# numba_cpu lets NumPy's creation functions compute them.


def full(ks, shape, fill_value, dtype):
    out = np.zeros(shape, dtype.np)
    out[...] = fill_value  # a value the dtype cannot hold raises, as the cast does
    return from_array(out)


def empty(ks, shape, dtype):
    return from_array(np.zeros(shape, dtype.np))  # any values will do: zeros


def arange(ks, start, stop, step, dtype):
    if all(isinstance(v, int) for v in (start, stop, step)):
        values = list(range(start, stop, step))  # exact in Python integers
    else:
        n = max(math.ceil((stop - start) / step), 0)
        values = [start + i * step for i in range(n)]
    return from_array(np.array(values, dtype.np).reshape(len(values)))


def linspace(ks, start, stop, num, dtype, endpoint):
    divisions = num - 1 if endpoint else num
    step = (stop - start) / divisions if divisions > 0 else 0
    values = [start + i * step for i in range(num)]
    if endpoint and num > 1:
        values[-1] = stop  # exactly stop, not the sum's rounding of it
    values = np.array(values, np.complex128 if dtype.kind == "c" else np.float64)
    if dtype.kind in "iu":
        values = np.floor(values)  # rounded down, as NumPy's linspace does
    return from_array(values.astype(dtype.np).reshape(num))


def eye(ks, n_rows, n_cols, k, dtype):
    rows, cols = np.indices((n_rows, n_cols))
    return from_array((cols - rows == k).astype(dtype.np))


def from_host(ks, data, dtype):
    return from_array(np.array(data, dtype=dtype.np, copy=True))


# The random numbers come from the caller's NumPy generator (an explicit input): the
# oracle can only draw the same numbers from it.
def rand(ks, shape, dtype, generator):
    return from_array(np.asarray(generator.random(shape, dtype=dtype.np)))


def randn(ks, shape, dtype, generator):
    return from_array(np.asarray(generator.standard_normal(shape, dtype=dtype.np)))


def _expm1(x, **kwargs):
    """np.expm1, but an exact zero real part of a complex result is +0: the Array API's
    expm1(-0 + 0j) = 0 + 0j, where NumPy keeps expm1(-0)'s sign."""
    out = np.array(np.expm1(x, **kwargs))
    if out.dtype.kind == "c":
        out.real += 0.0
    return out


# NumPy's function for an operator, where the standard and NumPy differ: the standard's
STANDARD = {"expm1": _expm1}


@hookimpl
def lamina_register_kernels(registry):
    def register(name, fn):
        registry.register(name, "cpu", fn, PRIORITY)

    def numpy_function(op):
        return STANDARD.get(op.name) or getattr(np, op.numpy)

    for op in OPERATORS.values():
        if op.kind in ("unary", "binary"):
            register(op.name, elementwise(op, numpy_function(op)))
        elif op.inplace_of is not None:
            register(op.name, inplace(op, numpy_function(op.inplace_of)))
    for name in ("sum", "prod"):
        register(name, _sum(getattr(np, name), name))
    for name in ("mean", "var", "std"):
        register(name, _float_stat(getattr(np, name), name))
    register("max", _extreme(np.max, "max"))
    register("min", _extreme(np.min, "min"))
    register("argmax", _arg(np.argmax, "argmax"))
    register("argmin", _arg(np.argmin, "argmin"))
    register("all", _logical(np.all))
    register("any", _logical(np.any))
    for fn in (permute_dims, matrix_transpose, expand_dims, squeeze, flip, broadcast_to):
        register(fn.__name__, _view(fn))
    register("split", _split)
    for fn in (
        clip,
        where,
        astype,
        copy,
        to_device,
        reshape,
        getitem,
        setitem,
        index_add,
        concat,
        stack,
        matmul,
        tensordot,
        vecdot,
        full,
        empty,
        arange,
        linspace,
        eye,
        from_host,
        rand,
        randn,
    ):
        register(fn.__name__, fn)
    for module in (sorting, linalg, fft):
        for name, fn in module.KERNELS.items():
            register(name, fn)
    nn.register(register)
