"""numba_cpu — the default backend of device "cpu": Numba-JIT kernels.

Operator setup follows the seed's 0.4.1 path: a short fast path (same shape, same
dtype, C-contiguous: one flat loop) and a general path that branches off it (type
promotion, broadcasting, strides). Kernels compile lazily, once per dtype, and load
from Numba's on-disk cache afterwards (Note [Kernel cache]).
"""
import math
import sys

import numba
import numpy as np
from numba import prange, types
from numpy.lib.stride_tricks import as_strided

from lamina import _dtypes as D
from lamina._tensor import PY_SCALARS, Tensor, from_array, from_flat
from lamina.backends.hookspecs import hookimpl
from lamina.backends import setup as S
from lamina.dispatch.keys import CPU
from lamina.dispatch.table import OPERATORS

from . import kernels as K

empty = np.empty
new_tensor = object.__new__

# ---------------------------------------------------------------- threads
# Note [Parallel threshold]: below PARALLEL_MIN elements a kernel runs serially: waking
# threads costs more than it saves. With one thread the threshold is infinite, so the
# choice is a single comparison either way.
PARALLEL_ELEMENTS = 1 << 17
_parallel_min = float("inf")


def set_num_threads(n):
    global _parallel_min
    n = int(n)
    if not 1 <= n <= numba.config.NUMBA_NUM_THREADS:
        raise ValueError(f"num_threads must be between 1 and "
                         f"{numba.config.NUMBA_NUM_THREADS} (the cores Numba can use), got {n}")
    numba.set_num_threads(n)
    _parallel_min = float("inf") if n == 1 else PARALLEL_ELEMENTS


def get_num_threads():
    return numba.get_num_threads() if _parallel_min != float("inf") else 1


# ---------------------------------------------------------------- lazy compilation


class _Stub:
    """Stands in a LazyEntries slot until first called; then compiles and steps aside."""

    __slots__ = ("entries", "key")

    def __init__(self, entries, key):
        self.entries, self.key = entries, key

    def __call__(self, *args):
        entry = self.entries.build(self.key)
        self.entries[self.key] = entry
        return entry(*args)


class LazyEntries(list):
    """Compiled entry points indexed by dtype index (a list: no dict lookup per call)."""

    def __init__(self, build, size=len(D.ALL)):
        super().__init__()
        self.build = build
        self.extend(_Stub(self, i) for i in range(size))


# ---------------------------------------------------------------- strided operands


def _buffer(a):
    """A flat view spanning the memory of a strided array, from its lowest address."""
    if a.ndim == 0:
        return a.reshape(1)
    item = a.itemsize
    low = a[tuple(slice(None, None, -1) if s < 0 else slice(None) for s in a.strides)]
    span = sum((n - 1) * s for n, s in zip(low.shape, low.strides)) // item + 1
    return as_strided(low, shape=(span,), strides=(item,))


def _operand_layout(a, shape):
    """(element offset into _buffer(a), element strides aligned to ``shape``): pure
    arithmetic on a's shape and strides."""
    item, lead = a.itemsize, len(shape) - a.ndim
    strides, offset = [0] * len(shape), 0
    for d, (n, s) in enumerate(zip(a.shape, a.strides)):
        if n != 1:  # a size-1 dim is broadcast or absent: its stride never matters
            strides[lead + d] = s // item
            offset += (n - 1) * (-s // item) if s < 0 else 0
    return offset, strides


def _merged_layout(shape, arrays):
    """Each operand's offset and contiguity, and one int64 array whose rows are every
    operand's strides and, last, the shape, with dims merged where possible: size-1
    dims are dropped and neighbours merged where every operand's strides allow it, so
    e.g. a contiguous tensor plus a broadcast row runs as a 2-D loop."""
    layouts = [_operand_layout(a, shape) for a in arrays]
    merged = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        st = [strides[d] for _, strides in layouts]
        if merged and all(p == s * n for p, s in zip(merged[-1][1], st)):
            merged[-1][0] *= n
            merged[-1][1] = st
        else:
            merged.append([n, st])
    if not merged:
        merged = [[1, [0] * len(arrays)]]
    meta = np.array([*zip(*(st for _, st in merged)), [n for n, _ in merged]], np.int64)
    return [(offset, a.flags.c_contiguous) for (offset, _), a in zip(layouts, arrays)], meta


# Note [Layout cache]: an operand's layout is a function of its shape, strides and
# itemsize only, and real programs repeat a few of them, so strided_args computes each
# combination once (about 6 us of Python) and afterwards only builds the buffers.
_layouts = {}


def strided_args(shape, arrays):
    """Kernel arguments for arrays broadcast to ``shape``: (buffer, offset, strides)
    per operand, then the shape (Note [Layout cache])."""
    key = (shape, *[(a.shape, a.strides, a.itemsize) for a in arrays])
    layout = _layouts.get(key)
    if layout is None:
        if len(_layouts) >= 4096:
            _layouts.clear()
        layout = _layouts[key] = _merged_layout(shape, arrays)
    operands, meta = layout
    args = []
    for a, (offset, contiguous), strides in zip(arrays, operands, meta):
        args += [a.reshape(-1) if contiguous else _buffer(a), offset, strides]
    return args + [meta[-1]]


# ---------------------------------------------------------------- elementwise

_FLAT = {1: K.unary_flat, 2: K.binary_flat, 3: K.ternary_flat}
_STRIDED = {1: K.unary_strided, 2: K.binary_strided, 3: K.ternary_strided}
_SCALAR = {2: K.binary_scalar}
_INT_BOUNDS = [(int(np.iinfo(d.np).min), int(np.iinfo(d.np).max)) if d.kind in "iu"
               else None for d in D.ALL]
_STRIDED_OPERAND = (types.int64, K.INDEX)


class Elementwise:
    """Kernels and setup of one elementwise operator (unary, binary or ternary).

    ``scalar(dtype)`` picks the scalar function for a computation dtype;
    ``in_dtypes(dtype)`` gives each input's dtype (``where`` takes a bool condition)."""

    def __init__(self, op, arity, scalar, in_dtypes=None, promote_from=0, validate=None,
                 simd=None):
        self.op, self.arity, self.scalar_fn = op, arity, scalar
        # NumPy's ufunc for SIMD_MIN float elements and more (Note [NumPy SIMD loops])
        self.simd, self.simd_min = simd, SIMD_MIN if simd is not None else sys.maxsize
        self.in_dtypes = in_dtypes or (lambda d: [d] * arity)
        self.promote_from = promote_from
        # (dtype kinds, fn(op, dtype, arrays)): a check of the values before the kernel
        # runs, for those kinds; they skip the fast paths
        self.validate_kinds, self.validate = validate or ("", None)
        self.flat = LazyEntries(lambda i: self._compile(_FLAT, i, range))
        self.flat_parallel = LazyEntries(lambda i: self._compile(_FLAT, i, prange))
        self.strided = LazyEntries(lambda i: self._compile(_STRIDED, i, range))
        self.strided_parallel = LazyEntries(lambda i: self._compile(_STRIDED, i, prange))
        self.scalar = LazyEntries(lambda i: self._compile(_SCALAR, i, range))
        self.scalar_parallel = LazyEntries(lambda i: self._compile(_SCALAR, i, prange))
        # Note [Fast path]: the result dtype of a call whose inputs all have dtype i and
        # need no promotion, or None where dtype i must go through the general path.
        self.fast_out = []
        for d in D.ALL:
            try:
                comp = S.check_dtype(op, d)
            except TypeError:
                comp = None
            fast = comp is d and arity != 3 and d.kind not in self.validate_kinds
            self.fast_out.append(S.result_dtype(op, d) if fast else None)

    def _compile(self, family, index, loop):
        comp = D.ALL[index]
        out = K.array(S.result_dtype(self.op, comp).np)
        ins = [K.array(d.np) for d in self.in_dtypes(comp)]
        if family is _FLAT:
            sig = types.void(*ins, out)
        elif family is _SCALAR:
            sig = types.void(ins[0], numba.from_dtype(comp.np), out, types.boolean)
        else:
            sig = types.void(out, *_STRIDED_OPERAND,
                             *[t for a in ins for t in (a, *_STRIDED_OPERAND)], K.INDEX)
        return K.compile_kernel(family[self.arity], (self.scalar_fn(comp), loop), sig)

    def with_scalar(self, a, b):
        """Note [Scalar fast path]: a contiguous tensor and a Python scalar whose weak
        promotion keeps the tensor's dtype (``x * 2.0`` on floats, ``i + 1`` on ints in
        range): one flat loop with the scalar passed as a kernel argument, converted to
        the dtype by the entry point. Anything else returns None: the general path."""
        first = type(a) in PY_SCALARS
        t, v = (b, a) if first else (a, b)
        if type(v) not in PY_SCALARS or t.__class__ is not Tensor or t._flat is None:
            return None
        dt = t._dtype
        if type(v) is int:
            # an int keeps an int dtype when in range (else OverflowError, from the
            # general path); with floats it is converted; with bool it promotes
            bounds = _INT_BOUNDS[dt.index]
            if dt.kind == "b" or bounds is not None and not bounds[0] <= v <= bounds[1]:
                return None
        elif type(v) is float and dt.kind != "f":
            return None  # promotion to the default float: the general path
        out_dt = self.fast_out[dt.index]
        if out_dt is None:
            return None
        f = t._flat
        out = empty(f.size, out_dt.np)
        (self.scalar if f.size < _parallel_min else self.scalar_parallel)[dt.index](
            f, v, out, first)
        return from_flat(out, t._shape, out_dt)

    def general(self, args, target=None, op=None):
        """Promotion, broadcasting, strides; ``target`` is the tensor of an in-place op
        and ``op`` that operator (``add_``), so that errors name what was called."""
        op = op or self.op
        comp = S.promote(op, args[self.promote_from:])
        res = S.result_dtype(op, comp)
        shape = S.broadcast_shapes(op.name, *(S.shape_of(a) for a in args))
        if S.mixed_sign_comparison(op, args):  # Note [Mixed-sign comparisons]
            return from_array(np.asarray(getattr(np, op.name)(*[a._data for a in args])))
        ins = self.in_dtypes(comp)
        arrays = [S.operand(a, d) for a, d in zip(args, ins)]
        if target is None:
            out = empty(shape, res.np)
        else:
            S.inplace_check(op, target, res, shape)
            out = target._data
            # the target itself is read and written at the same index: no copy needed
            # (copying it made every ``x += y`` allocate a temporary of x's size)
            arrays = [a.copy() if a is not out and np.may_share_memory(a, out) else a
                      for a in arrays]
        if comp.kind in self.validate_kinds and out.size:  # nothing computed, nothing to refuse
            self.validate(op, comp, arrays)
        self.run(comp, out, arrays)
        return target if target is not None else from_array(out)

    def run(self, comp, out, arrays):
        n = out.size
        if n == 0:
            return
        if n >= self.simd_min and comp.kind == "f":
            self.run_simd(out, *arrays)
            return
        i = comp.index
        if out.flags.c_contiguous and all(a.shape == out.shape and a.flags.c_contiguous
                                          for a in arrays):
            flat = self.flat if n < _parallel_min else self.flat_parallel
            flat[i](*[a.reshape(-1) for a in arrays], out.reshape(-1))
        else:
            strided = self.strided if n < _parallel_min else self.strided_parallel
            strided[i](*strided_args(out.shape, [out, *arrays]))

    def run_simd(self, out, *arrays):
        with np.errstate(all="ignore"):  # lamina never warns on inf/nan results
            self.simd(*arrays, out=out)


def unary_kernel(ew):
    flat, flat_parallel, fast_out, simd_min = ew.flat, ew.flat_parallel, ew.fast_out, ew.simd_min

    def kernel(ks, x):
        fx, dt = x._flat, x._dtype
        out_dt = fast_out[dt.index]
        if fx is not None and out_dt is not None:  # Note [Fast path]
            n = fx.size
            out = empty(n, out_dt.np)
            if n >= simd_min:  # only float dtypes reach here for a NumPy-loop operator
                ew.run_simd(out, fx)
            else:
                (flat if n < _parallel_min else flat_parallel)[dt.index](fx, out)
            return from_flat(out, x._shape, out_dt)
        return ew.general((x,))
    kernel.__qualname__ = kernel.__name__ = ew.op.name
    return kernel


def binary_kernel(ew):
    flat, flat_parallel, fast_out = ew.flat, ew.flat_parallel, ew.fast_out
    results = [S.result_dtype(ew.op, d) for d in D.ALL]  # for the unchecked path

    def with_scalar(ks, a, b):  # a Python scalar operand
        out = ew.with_scalar(a, b)
        return out if out is not None else ew.general((a, b))

    def kernel(ks, a, b):
        try:
            fa = a._flat
            fast = (fa is not None and a._dtype is b._dtype and a._shape == b._shape
                    and b._flat is not None)
        except AttributeError:  # a scalar; the bindings call with_scalar directly
            return with_scalar(ks, a, b)
        if fast:
            dt, shape = a._dtype, a._shape
            out_dt = fast_out[dt.index]  # Note [Fast path]
            if out_dt is not None:
                # from_flat, inlined: a call costs ~60 ns of the seed's ~850 ns budget
                out = empty(shape, out_dt.np)
                t = new_tensor(Tensor)
                if len(shape) == 1:
                    t._data = t._flat = out
                else:
                    t._data, t._flat = out, out.reshape(-1)
                (flat if fa.size < _parallel_min else flat_parallel)[dt.index](
                    fa, b._flat, t._flat)
                t._ks, t._dtype, t._shape = CPU, out_dt, shape
                return t
        return ew.general((a, b))

    def unchecked(ks, a, b):
        # Note [Unchecked fast path]: the "checks" layer switched off (lamina.layers):
        # no shape, contiguity or promotion decisions, only what keeps memory safe
        # (equal sizes and dtypes; the entry point rejects a non-array, i.e. None).
        try:
            fa, fb, dt = a._flat, b._flat, a._dtype
        except AttributeError:  # a scalar from a caller that does not use with_scalar
            return with_scalar(ks, a, b)
        if fa is None or fb is None or fa.size != fb.size or dt is not b._dtype:
            raise ValueError(f"{ew.op.name}: with the checks layer off, both inputs must "
                             "be contiguous tensors of one size and dtype")
        out_dt = results[dt.index]
        out = empty(a._shape, out_dt.np)
        t = new_tensor(Tensor)  # from_flat, inlined, as in the checked fast path
        t._data = out
        t._flat = out if out.ndim == 1 else out.reshape(-1)
        flat[dt.index](fa, fb, t._flat)
        t._ks, t._dtype, t._shape = CPU, out_dt, a._shape
        return t

    kernel.__qualname__ = kernel.__name__ = ew.op.name
    kernel.unchecked = unchecked
    kernel.with_scalar = unchecked.with_scalar = with_scalar  # Note [Kernel variants]
    kernel.elementwise = ew  # for the overhead tool's raw-kernel row
    return kernel


def inplace_kernel(ew, op):
    def kernel(ks, x1, x2):
        return ew.general((x1, x2), target=x1, op=op)
    kernel.__qualname__ = kernel.__name__ = op.name
    return kernel


def ternary_kernel(ew):
    def kernel(ks, *args):
        return ew.general(args)
    kernel.__qualname__ = kernel.__name__ = ew.op.name
    return kernel


def _by_kind(**fns):
    """A scalar-function chooser: keyword = dtype kinds ("f", "iu", "b", "biuf")."""
    def choose(dtype):
        return next(fn for kinds, fn in fns.items() if dtype.kind in kinds)
    return choose


def _same(fn):
    return lambda dtype: fn


ELEMENTWISE_SCALARS = {
    "abs": _by_kind(iuf=K.absolute), "negative": _same(K.negative),
    "positive": _same(K.identity), "square": _same(K.square),
    "sign": _by_kind(f=K.float_sign, iu=K.sign),
    "floor": _by_kind(f=K.float_floor, iu=K.identity),
    "ceil": _by_kind(f=K.float_ceil, iu=K.identity),
    "trunc": _by_kind(f=K.float_trunc, iu=K.identity),
    "round": _by_kind(f=K.round_half_even, iu=K.identity),
    "bitwise_invert": _by_kind(b=K.logical_not, iu=K.bitwise_invert),
    "logical_not": _same(K.logical_not),
    "isfinite": _by_kind(f=K.isfinite, biu=K.always_true),
    "isinf": _by_kind(f=K.isinf, biu=K.always_false),
    "isnan": _by_kind(f=K.isnan, biu=K.always_false),
    "signbit": _same(K.signbit),
    "pow": _by_kind(f=K.power, i=K.int_power, u=K.uint_power),
    "floor_divide": _by_kind(i=K.int_floor_divide, uf=K.floor_divide),
    **{name: _same(getattr(K, "float_" + name)) for name in
       "exp expm1 log log1p log2 log10 sqrt sin cos tan asin acos atan sinh cosh tanh "
       "asinh acosh atanh".split()},
    **{name: _same(getattr(K, name)) for name in
       "add subtract multiply divide remainder maximum minimum atan2 "
       "copysign hypot logaddexp equal not_equal greater greater_equal less less_equal "
       "logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor "
       "bitwise_left_shift bitwise_right_shift".split()},
}


def _clip_bounds(x, lo, hi):
    """clip's None bounds become the dtype's extremes; the result keeps x's dtype."""
    if x._dtype.kind == "f":
        lo = -np.inf if lo is None else lo
        hi = np.inf if hi is None else hi
    else:
        info = np.iinfo(x._dtype.np)
        lo = int(info.min) if lo is None else lo
        hi = int(info.max) if hi is None else hi
    return lo, hi


# Note [NumPy SIMD loops]: Numba has no vector math library here (Intel's SVML is not a
# dependency), so its loops call libm once per element for transcendental functions,
# where NumPy ships SIMD loops: on 1e5 float32 elements tanh took 1.26 ms against
# NumPy's 36 us, exp 233 against 45 (5-40x; float64 4-13x, except sin and cos). These
# operators run NumPy's ufunc, from SIMD_MIN elements on, on the operands lamina has
# set up as usual (promoted, broadcast, output allocated); below that NumPy's call and
# errstate overhead (~1.5 us) costs more than it saves, and the Numba loop runs.
SIMD_MIN = 256
SIMD_OPERATORS = ("exp expm1 log log1p log2 log10 sin cos tan sinh cosh tanh asin acos "
                  "atan asinh acosh atanh").split()


def refuse_negative_exponent(op, dtype, arrays):
    """Integers to negative integer powers raise, as in NumPy and PyTorch (a truncated
    1 / x**k would be a silently different answer from every other backend)."""
    exponent = arrays[1]
    if exponent.size and exponent.min() < 0:
        raise ValueError(f"{op.name}: integers to negative integer powers are not allowed "
                         f"(got a negative exponent for {dtype}); use a float base")


ELEMENTWISE_CHECKS = {"pow": ("i", refuse_negative_exponent)}


def _register_elementwise(registry):
    for op in OPERATORS.values():
        if op.kind in ("unary", "binary"):
            arity = 1 if op.kind == "unary" else 2
            ew = Elementwise(op, arity, ELEMENTWISE_SCALARS[op.name],
                             validate=ELEMENTWISE_CHECKS.get(op.name),
                             simd=S.numpy_ufunc(op.name) if op.name in SIMD_OPERATORS else None)
            registry.register(op.name, "cpu", (unary_kernel if arity == 1 else binary_kernel)(ew))
            if op.name + "_" in OPERATORS:
                inplace = OPERATORS[op.name + "_"]
                registry.register(inplace.name, "cpu", inplace_kernel(ew, inplace))
    where = Elementwise(OPERATORS["where"], 3, _same(K.where),
                        in_dtypes=lambda d: [D.bool_, d, d], promote_from=1)
    registry.register("where", "cpu", ternary_kernel(where))
    clip = Elementwise(OPERATORS["clip"], 3, _same(K.clip))

    def clip_kernel(ks, x, min=None, max=None):
        S.check_dtype(clip.op, x._dtype)
        S.check_clip_bounds(x, min, max)
        lo, hi = _clip_bounds(x, min, max)
        shape = S.broadcast_shapes("clip", x._shape, S.shape_of(lo), S.shape_of(hi))
        if shape != x._shape:
            raise ValueError(f"clip: the bounds must broadcast to x's shape {x._shape}, "
                             f"got a result shape {shape}")
        arrays = [x._data] + [S.clip_bound(b, x._dtype) for b in (lo, hi)]
        out = empty(shape, x._dtype.np)
        clip.run(x._dtype, out, arrays)
        return from_array(out)
    registry.register("clip", "cpu", clip_kernel)


# ---------------------------------------------------------------- reductions


def rows_view(data, axis):
    """A 2-D view (kept, reduced) of ``data`` with the ``axis`` dims last (may copy)."""
    shape = data.shape
    cols = math.prod([shape[d] for d in axis])  # math.prod: np.prod costs ~4 us
    rows = math.prod(shape) // cols if cols else math.prod(
        [n for d, n in enumerate(shape) if d not in axis])
    if axis == tuple(range(data.ndim - len(axis), data.ndim)):  # trailing (sorted) axes
        return data.reshape(rows, cols)  # no transpose to build
    kept = [d for d in range(data.ndim) if d not in axis]
    return data.transpose(kept + list(axis)).reshape(rows, cols)


def _filled(n, value, dtype):
    acc = empty(n, dtype)  # np.full is Python code: about 1.5 us more
    acc.fill(value)
    return acc


class Reduction:
    """One reduction family: ``step`` folded over each row into an accumulator.

    With a ``columns`` template, a column-major rows view (a reduction over leading
    axes, e.g. sum(x, axis=0)) runs it on the contiguous transpose instead of striding
    down each column."""

    def __init__(self, template, fn, columns=None):
        self.entries = {}
        self.template, self.fn, self.columns = template, fn, columns

    def __call__(self, rows, out):
        loop = range if rows.size < _parallel_min else prange
        template, flags = self.template, rows.flags
        layout = "C" if flags.c_contiguous else "A"
        if (self.columns is not None and loop is range and layout == "A"
                and flags.f_contiguous):
            template, rows, layout = self.columns, rows.T, "C"
        key = (template, rows.dtype, out.dtype, loop, layout)
        entry = self.entries.get(key)
        if entry is None:
            sig = types.void(K.array(rows.dtype, 2, layout), K.array(out.dtype))
            args = (loop,) if self.fn is None else (self.fn, loop)
            entry = self.entries[key] = K.compile_kernel(template, args, sig)
        entry(rows, out)


def _fold_family(step):
    return Reduction(K.reduce_rows, step, columns=K.reduce_columns)


_SUM = _fold_family(K.add)
_PROD = _fold_family(K.multiply)
_MAX = _fold_family(K.maximum)
_MIN = _fold_family(K.minimum)
_ALL = _fold_family(K.logical_and_reduce)
_ANY = _fold_family(K.logical_or_reduce)
_ARGMAX = Reduction(K.argreduce_rows, K.greater_than)
_ARGMIN = Reduction(K.argreduce_rows, K.less_than)


def _accumulator(dtype):
    return {"f": np.float64, "i": np.int64, "u": np.uint64, "b": np.bool_}[dtype.kind]


def _finish(acc, x, axis, keepdims, dtype):
    out = acc.reshape(S.reduced_shape(x._shape, axis, keepdims))
    return from_array(out if out.dtype == dtype.np else out.astype(dtype.np))


def _sum_like(reduction, start):
    def kernel(ks, x, axis, dtype, keepdims):
        res = S.sum_dtype(OPERATORS[kernel.__name__], x, dtype)
        kind = x._dtype.kind
        # Array API: the input is cast to ``dtype`` first (sum([1.7, 1.7], dtype=int64)
        # is 2, as in NumPy); bool inputs need no cast, their 0/1 fit every accumulator
        cast = res.kind == "b" or (res.kind != kind and kind != "b")
        data = x._data.astype(res.np) if cast else x._data
        rows = rows_view(data, axis)
        acc = _filled(rows.shape[0], start, _accumulator(res))
        if rows.size:
            reduction(rows, acc)
        return _finish(acc, x, axis, keepdims, res)
    return kernel


def _fold(reduction, start, result):
    """A reduction kernel: ``start(rows, x)`` gives the accumulator (one value per row,
    or raises for an identity-less reduction over nothing); ``reduction`` folds each
    row into it; ``result(x)`` is the result dtype."""
    def kernel(ks, x, axis, keepdims):
        rows = rows_view(x._data, axis)
        acc = start(rows, x)
        if rows.size:
            reduction(rows, acc)
        return _finish(acc, x, axis, keepdims, result(x))
    return kernel


def _first_value(what):
    """max/min start from each row's first value; no identity for an empty axis."""
    def start(rows, x):
        if rows.shape[1] == 0:
            raise ValueError(f"{what}: cannot reduce a zero-size axis (shape {x._shape}): "
                             "there is no identity")
        return rows[:, 0].copy()
    return start


def _first_index(what):
    """argmax/argmin start at index 0; an empty axis has no index to give."""
    def start(rows, x):
        if rows.shape[1] == 0:
            raise ValueError(f"{what}: cannot take the {what} of an empty sequence "
                             f"(shape {x._shape})")
        return np.zeros(rows.shape[0], np.int64)
    return start


def _constant(value):
    return lambda rows, x: _filled(rows.shape[0], value, np.bool_)


_MOMENTS = {}


def _moments(rows):
    key = rows.dtype
    if key not in _MOMENTS:
        a = K.array(np.float64)
        _MOMENTS[key] = K.compile_kernel(K.moments_rows, (range,), types.void(
            K.array(rows.dtype, 2, "A"), a, a))
    mean, m2 = np.empty(rows.shape[0]), np.empty(rows.shape[0])
    if rows.shape[1]:
        _MOMENTS[key](rows, mean, m2)
    else:
        mean[:], m2[:] = np.nan, np.nan
    return mean, m2


def _moment_kernel(which):
    def kernel(ks, x, axis, keepdims, correction=0.0):
        dtype = S.check_dtype(OPERATORS[which], x._dtype)
        rows = rows_view(x._data, axis)
        mean, m2 = _moments(rows)
        if which == "mean":
            acc = mean
        else:
            dof = rows.shape[1] - correction
            with np.errstate(divide="ignore", invalid="ignore"):
                acc = m2 / dof if dof > 0 else np.full_like(m2, np.nan)
            if which == "std":
                acc = np.sqrt(acc)
        return _finish(acc, x, axis, keepdims, dtype)
    return kernel


def _register_reductions(registry):
    kernels = {
        "sum": _sum_like(_SUM, 0), "prod": _sum_like(_PROD, 1),
        "max": _fold(_MAX, _first_value("max"), lambda x: x._dtype),
        "min": _fold(_MIN, _first_value("min"), lambda x: x._dtype),
        "all": _fold(_ALL, _constant(True), lambda x: D.bool_),
        "any": _fold(_ANY, _constant(False), lambda x: D.bool_),
        "argmax": _fold(_ARGMAX, _first_index("argmax"), lambda x: D.int64),
        "argmin": _fold(_ARGMIN, _first_index("argmin"), lambda x: D.int64),
        "mean": _moment_kernel("mean"), "var": _moment_kernel("var"),
        "std": _moment_kernel("std"),
    }
    for name, fn in kernels.items():
        fn.__name__ = fn.__qualname__ = name
        registry.register(name, "cpu", fn)


# ---------------------------------------------------------------- linear algebra, joins

_MATMUL_INT = {}


def matmul(ks, x1, x2):
    op = OPERATORS["matmul"]
    comp = S.promote(op, (x1, x2))
    a, b = S.operand(x1, comp), S.operand(x2, comp)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: operands must be at least 1-D, got shapes "
                         f"{x1._shape} and {x2._shape}")
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul: shapes {x1._shape} and {x2._shape} do not match "
                         f"(contracted dimensions {a2.shape[-1]} != {b2.shape[-2]})")
    try:
        batch = S.broadcast_shapes("matmul", a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: the batch dimensions of shapes {x1._shape} and "
                         f"{x2._shape} cannot be broadcast together") from None
    if comp.kind == "f":
        out = np.matmul(a2, b2)  # BLAS
    else:
        m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
        nb = math.prod(batch)  # explicit: reshape(-1, ...) is ambiguous at size 0
        a3 = np.broadcast_to(a2, batch + (m, k)).reshape(nb, m, k)
        b3 = np.broadcast_to(b2, batch + (k, n)).reshape(nb, k, n)
        out = np.zeros((nb, m, n), comp.np)
        if comp not in _MATMUL_INT:
            arr = K.array(comp.np, 3, "A")
            _MATMUL_INT[comp] = K.compile_kernel(K.matmul_int, (range,),
                                                 types.void(arr, arr, arr))
        if out.size:
            _MATMUL_INT[comp](a3, b3, out)
        out = out.reshape(batch + (m, n))
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    # not ascontiguousarray: it turns the 0-d result of 1-D @ 1-D into shape (1,)
    return from_array(out if out.flags.c_contiguous else out.copy())


def tensordot(ks, x1, x2, axes):
    a_axes, b_axes = axes
    free_a = [d for d in range(len(x1._shape)) if d not in a_axes]
    free_b = [d for d in range(len(x2._shape)) if d not in b_axes]
    op = OPERATORS["tensordot"]
    comp = S.promote(op, (x1, x2))
    a = S.operand(x1, comp).transpose(free_a + list(a_axes))
    b = S.operand(x2, comp).transpose(list(b_axes) + free_b)
    k = math.prod([x1._shape[d] for d in a_axes])
    a2 = a.reshape(math.prod([x1._shape[d] for d in free_a]), k)  # not -1: k may be 0
    b2 = b.reshape(k, math.prod([x2._shape[d] for d in free_b]))
    out = matmul(ks, from_array(np.ascontiguousarray(a2)), from_array(np.ascontiguousarray(b2)))
    shape = tuple(x1._shape[d] for d in free_a) + tuple(x2._shape[d] for d in free_b)
    return from_array(out._data.reshape(shape))


def concat(ks, arrays, axis):
    op = OPERATORS["concat"]
    comp = S.promote(op, arrays)
    first = arrays[0]._shape
    for t in arrays:
        if len(t._shape) != len(first) or any(
                s != f for d, (s, f) in enumerate(zip(t._shape, first)) if d != axis):
            raise ValueError(f"concat: all tensors must have the same shape except on "
                             f"axis {axis}; got {', '.join(str(a._shape) for a in arrays)}")
    shape = list(first)
    shape[axis] = sum(t._shape[axis] for t in arrays)
    out = empty(tuple(shape), comp.np)
    copy = _COPY
    start = 0
    for t in arrays:
        n = t._shape[axis]
        index = (slice(None),) * axis + (slice(start, start + n),)
        copy.run(comp, out[index], [S.operand(t, comp)])
        start += n
    return from_array(out)


_COPY = Elementwise(OPERATORS["positive"], 1, _same(K.identity))


def stack(ks, arrays, axis):
    first = arrays[0]._shape
    for t in arrays:
        if t._shape != first:
            raise ValueError(f"stack: all tensors must have the same shape; got "
                             f"{', '.join(str(a._shape) for a in arrays)}")
    expanded = [from_array(np.expand_dims(t._data, axis)) for t in arrays]
    return concat(ks, expanded, axis)


@hookimpl
def lamina_register_kernels(registry):
    _register_elementwise(registry)
    _register_reductions(registry)
    for fn in (matmul, tensordot, concat, stack):
        registry.register(fn.__name__, "cpu", fn)
