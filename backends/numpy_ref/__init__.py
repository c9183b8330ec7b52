"""numpy_ref — plain NumPy kernels for every operator.

The oracle the tests compare numba_cpu against, and the fallback for operators that
numba_cpu has no kernel for (it registers at a lower priority). It shares operator
setup (promotion, dtype checks, broadcasting) with numba_cpu through
``lamina.backends.setup``, so the two can only differ in what they compute.
"""
import math

import numpy as np

from lamina import _dtypes as D
from lamina._tensor import from_array
from lamina.backends.hookspecs import hookimpl
from lamina.backends import setup as S
from lamina.dispatch import keys
from lamina.dispatch.table import OPERATORS

PRIORITY = -10  # below numba_cpu: a fallback, unless selected with lm.backends.use
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
        return from_array(np.asarray(out, res.np))
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
    out = x._data.copy()
    if lo is not None:
        out = np.where(np.isnan(lo) if x._dtype.kind == "f" else False, lo, np.maximum(out, lo))
    if hi is not None:
        out = np.where(np.isnan(hi) if x._dtype.kind == "f" else False, hi, np.minimum(out, hi))
    if out.shape != x._shape:
        raise ValueError(f"clip: the bounds must broadcast to x's shape {x._shape}, got a "
                         f"result shape {out.shape}")
    return from_array(np.ascontiguousarray(out, x._dtype.np))


def where(ks, condition, x1, x2):
    comp = S.promote(OPERATORS["where"], (x1, x2))
    S.broadcast_shapes("where", *(S.shape_of(a) for a in (condition, x1, x2)))
    return from_array(np.asarray(np.where(S.operand(condition, D.bool_),
                                          S.operand(x1, comp), S.operand(x2, comp))))


def astype(ks, x, dtype, copy):
    if not copy and dtype is x._dtype:
        return x
    return from_array(x._data.astype(dtype.np))


def copy(ks, x):
    return from_array(x._data.copy())


# sparse layout: these serve dense inputs; sparse ones go to the sparse layer


def to_dense(ks, x):
    return x  # already dense


def to_sparse(ks, x):
    from lamina.backends.sparse.storage import from_dense
    return from_dense(x._data, x._shape)


def coalesce(ks, x):
    raise TypeError("coalesce: expected a sparse tensor, got a dense one (make one with "
                    "to_sparse() or lamina.sparse_coo_tensor)")


# ---------------------------------------------------------------- reductions


def _reduce(fn, result):
    def kernel(ks, x, axis, keepdims, *extra):
        with np.errstate(all="ignore"):
            out = fn(x, axis, keepdims, *extra)
        return from_array(np.asarray(out, result(x).np))
    return kernel


def _sum(npfn, name):
    def kernel(ks, x, axis, dtype, keepdims):
        res = S.sum_dtype(OPERATORS[name], x, dtype)
        return from_array(np.asarray(npfn(x._data, axis=axis, keepdims=keepdims,
                                          dtype=res.np), res.np))
    return kernel


def _float_stat(npfn, name):
    def compute(x, axis, keepdims, correction=None):
        dtype = S.check_dtype(OPERATORS[name], x._dtype)
        extra = {} if correction is None else {"ddof": correction}
        n = math.prod([x._shape[d] for d in axis])
        if n == 0 or n - extra.get("ddof", 0) <= 0:
            return np.full(S.reduced_shape(x._shape, axis, keepdims), np.nan)
        return npfn(x._data.astype(dtype.np), axis=axis, keepdims=keepdims, **extra)
    return _reduce(compute, lambda x: S.check_dtype(OPERATORS[name], x._dtype))


def _extreme(npfn, name):
    def compute(x, axis, keepdims):
        if any(x._shape[d] == 0 for d in axis):
            raise ValueError(f"{name}: cannot reduce a zero-size axis (shape {x._shape}, "
                             f"axis {axis}): there is no identity")
        return npfn(x._data, axis=axis, keepdims=keepdims)
    return _reduce(compute, lambda x: x._dtype)


def _arg(npfn, name):
    def compute(x, axis, keepdims):
        if any(x._shape[d] == 0 for d in axis):  # axis holds every dim when it was None
            raise ValueError(f"{name}: cannot take the {name} of an empty sequence "
                             f"(shape {x._shape})")
        data = x._data
        if len(axis) != 1:  # several (or all) axes: flatten them last
            from lamina.backends.numba_cpu import rows_view
            kept = S.reduced_shape(x._shape, axis, keepdims)
            return npfn(rows_view(data, axis), axis=1).reshape(kept)
        return npfn(data, axis=axis[0], keepdims=keepdims)
    return _reduce(compute, lambda x: D.int64)


def _logical(npfn):
    return _reduce(lambda x, axis, keepdims: npfn(x._data, axis=axis, keepdims=keepdims),
                   lambda x: D.bool_)


# ---------------------------------------------------------------- views and joins


def reshape(ks, x, shape, copy):
    if copy:
        return from_array(x._data.reshape(shape).copy())
    data = x._data.reshape(shape)
    if copy is False and not np.shares_memory(data, x._data) and data.size:
        raise ValueError(f"reshape: cannot reshape a tensor of shape {x._shape} with "
                         f"strides {x._data.strides} to {shape} without copying (copy=False)")
    return from_array(data, x._ks & _NO_AUTOGRAD)


def _view(fn):
    def kernel(ks, x, *args):
        return from_array(fn(x._data, *args), x._ks & _NO_AUTOGRAD)
    kernel.__name__ = kernel.__qualname__ = fn.__name__
    return kernel


def permute_dims(data, axes):
    return data.transpose(axes)


def matrix_transpose(data):
    return np.swapaxes(data, -1, -2)


def expand_dims(data, axis):
    return np.expand_dims(data, axis)


def squeeze(data, axis):
    return np.squeeze(data, axis)


def flip(data, axis):
    return np.flip(data, axis)


def broadcast_to(data, shape):
    return np.broadcast_to(data, shape)


def getitem(ks, x, key):
    key = _unwrap_index(key)
    out = x._data[key]
    if not isinstance(out, np.ndarray):  # an integer per dim gives a NumPy scalar (a
        # copy); with a trailing Ellipsis NumPy gives a 0-d view instead, as PyTorch does
        out = x._data[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
    return from_array(out, x._ks & _NO_AUTOGRAD)


def _unwrap_index(key):
    if isinstance(key, tuple):
        return tuple(_unwrap_index(k) for k in key)
    data = getattr(key, "_data", None)
    return key if data is None else data


def setitem(ks, x, key, value):
    v = S.scalar_value(value)
    if v is None:
        if not hasattr(value, "_dtype"):
            raise TypeError(f"setitem: the value must be a tensor or a Python scalar, got "
                            f"{type(value).__name__}")
        src = value._dtype
    else:
        src = D.PROMOTE[x._dtype.index][S.promote(OPERATORS["add"], (x, v)).index] \
            if x._dtype.kind != "b" else S.promote(OPERATORS["equal"], (x, v))
    if not D.can_cast(src, x._dtype) and not (v is not None and src.kind == x._dtype.kind):
        raise TypeError(f"setitem: cannot store {src} values into a {x._dtype} tensor "
                        f"without changing their kind (cast them explicitly with astype)")
    if not x._data.flags.writeable:
        raise ValueError("setitem: the tensor is a read-only view (e.g. from broadcast_to)")
    try:
        x._data[_unwrap_index(key)] = S.operand(value, x._dtype)
    except ValueError as exc:  # shape mismatch: name the operator and both shapes
        raise ValueError(f"setitem: cannot store a value of shape {S.shape_of(value)} into "
                         f"a selection of a tensor of shape {x._shape}: {exc}") from None
    return x


def split(ks, x, sections, axis):
    n = x._shape[axis]
    if isinstance(sections, int):
        bounds = list(range(sections, n, sections))
    else:
        if sum(sections) != n:
            raise ValueError(f"split: sections {list(sections)} sum to {sum(sections)}, "
                             f"but axis {axis} has size {n}")
        bounds = list(np.cumsum(sections)[:-1])
    return tuple(from_array(p, x._ks & _NO_AUTOGRAD) for p in np.split(x._data, bounds, axis=axis))


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
        raise ValueError(f"matmul: operands must be at least 1-D, got shapes "
                         f"{x1._shape} and {x2._shape}")
    try:
        return from_array(np.asarray(np.matmul(S.operand(x1, comp), S.operand(x2, comp))))
    except ValueError:
        raise ValueError(f"matmul: shapes {x1._shape} and {x2._shape} do not match") from None


def tensordot(ks, x1, x2, axes):
    comp = S.promote(OPERATORS["tensordot"], (x1, x2))
    return from_array(np.asarray(np.tensordot(S.operand(x1, comp), S.operand(x2, comp),
                                              axes=axes)))


def vecdot(ks, x1, x2, axis):
    comp = S.promote(OPERATORS["vecdot"], (x1, x2))
    a, b = np.broadcast_arrays(S.operand(x1, comp), S.operand(x2, comp))
    return from_array(np.asarray(np.sum(a * b, axis=axis), comp.np))


# ---------------------------------------------------------------- creation


def full(ks, shape, fill_value, dtype):
    return from_array(np.full(shape, fill_value, dtype.np))


def empty(ks, shape, dtype):
    return from_array(np.empty(shape, dtype.np))


def arange(ks, start, stop, step, dtype):
    return from_array(np.arange(start, stop, step, dtype=dtype.np))


def linspace(ks, start, stop, num, dtype, endpoint):
    return from_array(np.linspace(start, stop, num, endpoint=endpoint, dtype=dtype.np))


def eye(ks, n_rows, n_cols, k, dtype):
    return from_array(np.eye(n_rows, n_cols, k, dtype=dtype.np))


def from_host(ks, data, dtype):
    return from_array(data)


def rand(ks, shape, dtype, generator):
    return from_array(generator.random(shape, dtype=dtype.np))


def randn(ks, shape, dtype, generator):
    return from_array(generator.standard_normal(shape, dtype=dtype.np))


@hookimpl
def lamina_register_kernels(registry):
    def register(name, fn):
        registry.register(name, "cpu", fn, PRIORITY)

    for op in OPERATORS.values():
        if op.kind in ("unary", "binary"):
            register(op.name, elementwise(op, S.numpy_ufunc(op.name)))
        elif op.inplace_of:
            register(op.name, inplace(op, S.numpy_ufunc(op.inplace_of)))
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
    for fn in (clip, where, astype, copy, reshape, getitem, setitem, split, concat, stack,
               matmul, tensordot, vecdot, full, empty, arange, linspace, eye, from_host,
               rand, randn, to_dense, to_sparse, coalesce):
        register(fn.__name__, fn)
