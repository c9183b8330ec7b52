"""Reduction kernels of the CPU backend: sum, prod, all, any (one fold template, over
the rows of a 2-D view), max and min (a fold of order keys), argmax and argmin (the
same fold, then a search), mean (the sum's fold), var and std (a second pass over the
deviations from the mean), vector_norm (the deviations from zero; folds of |x|). Every
loop vectorizes (Note [Vector reductions] in kernels.py)."""

import functools

import numpy as np

from lamina.backends import jit, threads
from lamina.backends import setup as S
from lamina.dispatch import core
from lamina.dispatch import dtypes as D
from lamina.dispatch.meta import reduced_shape
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array

from . import kernels as K
from .lapack import vector_norm as _any_vector_norm
from .layout import rows_view

empty = np.empty
FAST = []  # the C core's reduction kernels: their limits follow the thread count
_parallel_min = float("inf")  # Note [Parallel threshold] (lamina.backends.threads)
_parallel_min_narrow = float("inf")  # the same, for elements under 4 bytes
_SPLIT = 16 * K._BLOCK  # a fold of one long row runs in parts this long, in parallel


def _set_threshold(threshold):
    global _parallel_min, _parallel_min_narrow
    _parallel_min = threshold
    _parallel_min_narrow = threshold * threads.NARROW_FOLD_FACTOR
    for kernel in FAST:
        kernel.set_limit(threshold)


threads.on_change(_set_threshold)


def _filled(n, value, dtype):
    acc = empty(n, dtype)  # np.full is Python code: about 1.5 us more
    acc.fill(value)
    return acc


class Reduction:
    """One reduction family: ``step`` folded over each row into an accumulator (one
    value per row), reading further per-row arrays ``more`` (var's means, argmax's
    maxima) where the template takes them.

    With a ``columns`` template, a column-major rows view (a reduction over leading
    axes, e.g. sum(x, axis=0)) runs it on the contiguous transpose instead of striding
    down each column (serially: it reads memory in order, faster than threads that
    stride). A serial fold of a contiguous view runs the C core's loop of the template
    (``address``; Note [C loops by address] in backends/jit.py); other entry points are
    compiled per (template, dtypes, loop, layout). Both with reassociation (Note
    [Vector reductions] in kernels.py)."""

    def __init__(self, template, fn, columns=None, parts="itself"):
        self.template, self.fn, self.columns = template, fn, columns
        # what folds the parts of a split row (``_split``): the fold itself, another
        # (the sum of var's squared deviations), or None: the row is never split
        self.parts = self if parts == "itself" else parts

    def __call__(self, rows, out, *more):
        threshold = _parallel_min if rows.itemsize >= 4 else _parallel_min_narrow
        loop = range if rows.size < threshold else jit.prange
        template, flags = self.template, rows.flags
        layout = "C" if flags.c_contiguous else "A"
        if self.columns is not None and layout == "A" and flags.f_contiguous:
            template, rows, layout, loop = self.columns, rows.T, "C", range
        elif loop is not range and layout == "C" and self.parts and _one_long_row(rows):
            return self._split(rows, out, *more)
        outs = (out, *more)
        if loop is range and layout == "C":  # Note [C loops by address] in backends/jit.py
            dtypes = (rows.dtype, *[a.dtype for a in outs])
            key = (self, template, *dtypes)
            jit.cached(key, lambda: self._by_address(template, *dtypes))(rows, *outs)
            return
        entry = jit.cached(
            (template, self.fn, rows.dtype, *[a.dtype for a in outs], loop, layout),
            lambda: jit.compile_kernel(
                template(self.fn, loop),
                jit.types.void(
                    jit.array(rows.dtype, 2, layout), *[jit.array(a.dtype) for a in outs]
                ),
                parallel=loop is jit.prange,
                fastmath=jit.REASSOCIATE,
            ),
        )
        entry(rows, out, *more)

    def _by_address(self, template, d, acc, *beside):
        """``template``'s C loop for these NumPy dtypes, called by address: the entry
        point of the kernel that calls it, with the address bound."""
        kernel, t = _FOLD_AT[len(beside)], jit.types
        arrays = [jit.array(o) for o in (acc, *beside)]
        sig = t.void(t.int64, jit.array(d, 2), *arrays)
        entry = jit.cached((kernel, sig), lambda: jit.compile_kernel(kernel, sig))
        along_rows = template is self.template
        address = self.address(along_rows, *[D.from_numpy(a) for a in (d, acc, *beside)])
        return functools.partial(entry, address)

    def address(self, along_rows, d, acc, beside=None):
        """The C core's loop of this fold (Note [C loops] in kernels.py) along the rows
        of a contiguous (rows, cols) array of dtype ``d``, or down its columns, into an
        accumulator of dtype ``acc``, reading (argmax's best values, var's means) an
        array of dtype ``beside`` next to it."""
        template = self.template if along_rows else self.columns
        wrapper = (_FOLD_WRAPPERS if beside is None else _BESIDE_WRAPPERS)[not along_rows]
        ins = [d] if beside is None else [d, beside]

        def build(cache):
            # inlined into the loop, the kernel's status checks and raise paths go away:
            # the loop needs nothing of Numba's runtime (Note [Loop cache]); a jitable
            # function, not a dispatcher, so the loop is cached (Note [Closure cells]);
            # the loop is compiled with reassociation (Note [Vector reductions])
            kernel = jit.jitable(template(self.fn, range), inline="always")
            return K.c_loop(wrapper, kernel, d, acc, ins, cache)

        return jit.c_loop((wrapper, template, self.fn, *ins, acc), build)

    def _split(self, rows, out, *more):
        """One long row (a fold of everything) as rows of _SPLIT values, which the
        threads share, and the rest of the row; their results are then folded into
        ``out`` by ``self.parts``. Each part starts, as ``out`` does, from the start
        value, and reads the row's ``more`` (its mean).

        Note [Split folds]: a split regroups the fold at the parts' borders, so a sum
        of a long row on several threads may differ from one thread's in the last
        bits (max, min, all and any cannot: their folds have no rounding); argmax and
        argmin are never split (parts=None)."""
        count = rows.shape[1] // _SPLIT
        parts = _filled(count + 1, out[0], out.dtype)
        each = [_filled(count, m[0], m.dtype) for m in more]
        self(rows[:, : count * _SPLIT].reshape(count, _SPLIT), parts[:count], *each)
        self(rows[:, count * _SPLIT :], parts[count:], *more)
        self.parts(parts.reshape(1, -1), out)


def _one_long_row(rows):
    """Worth splitting among threads; the rest of the row, shorter, runs serially."""
    return rows.shape[0] == 1 and rows.shape[1] >= 2 * _SPLIT


def _fold_family(step):
    return Reduction(K.reduce_rows, step, columns=K.reduce_columns)


_SUM = _fold_family(K.add)
_PROD = _fold_family(K.multiply)
_MAX = Reduction(K.extreme_rows, K.fold_max, columns=K.reduce_columns)
_MIN = Reduction(K.extreme_rows, K.fold_min, columns=K.reduce_columns)
_ALL = _fold_family(K.logical_and_reduce)
_ANY = _fold_family(K.logical_or_reduce)
_ARGMAX = Reduction(K.arg_reduce_rows, K.fold_max, K.arg_reduce_columns, parts=None)
_ARGMIN = Reduction(K.arg_reduce_rows, K.fold_min, K.arg_reduce_columns, parts=None)
_DEVIATIONS = Reduction(K.deviations_rows, K.square, K.deviations_columns, parts=_SUM)
_DEVIATIONS_COMPLEX = Reduction(K.deviations_rows, K.abs_square, K.deviations_columns, parts=_SUM)
# vector_norm's ord 1, inf and -inf: folds of |x| from 0, 0 and inf (accumulator dtype;
# None: the input's)
_NORMS = {
    1.0: (_fold_family(K.add_absolute), 0.0, np.float64),
    np.inf: (_fold_family(K.max_absolute), 0.0, None),
    -np.inf: (_fold_family(K.min_absolute), np.inf, None),
}


def _accumulator(dtype):
    return {"f": np.float64, "c": np.complex128, "i": np.int64, "u": np.uint64, "b": np.bool_}[
        dtype.kind
    ]


def _finish(acc, x, axis, keepdims, dtype):
    out = acc.reshape(reduced_shape(x._shape, axis, keepdims))
    return from_array(out if out.dtype == dtype.np else out.astype(dtype.np))


def _sum_like(reduction, start):
    def kernel(ks, x, axis, dtype, keepdims):
        res = S.sum_dtype(OPERATORS[kernel.__name__], x, dtype)
        kind = x._dtype.kind
        # Array API: the input is cast to ``dtype`` first (sum([1.7, 1.7], dtype=int64)
        # is 2, as in NumPy); bool inputs need no cast, their 0/1 fit every accumulator
        cast = res.kind == "b" or (res.kind != kind and kind != "b")
        if cast:
            S.check_cast(kernel.__name__, x._data, res)
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
        S.check_dtype(OPERATORS[kernel.__name__], x._dtype)  # max of complex: TypeError
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
            raise ValueError(
                f"{what}: cannot reduce a zero-size axis (shape {x._shape}): there is no identity"
            )
        return rows[:, 0].copy()

    return start


def _arg_fold(reduction, what):
    """argmax/argmin: the first index of each row's max (min), or of its first NaN,
    as in NumPy."""

    def kernel(ks, x, axis, keepdims):
        S.check_dtype(OPERATORS[what], x._dtype)
        rows = rows_view(x._data, axis)
        if rows.shape[1] == 0:
            raise ValueError(
                f"{what}: cannot take the {what} of an empty sequence (shape {x._shape})"
            )
        at = np.zeros(rows.shape[0], np.int64)
        if rows.size:
            reduction(rows, at, rows[:, 0].copy())
        return _finish(at, x, axis, keepdims, D.int64)

    return kernel


def _constant(value):
    return lambda rows, x: _filled(rows.shape[0], value, np.bool_)


def _mean(rows):
    """Each row's mean (float64, complex128 for complex rows), by the sum's fold; NaN
    for an empty row."""
    acc = np.zeros(rows.shape[0], np.complex128 if rows.dtype.kind == "c" else np.float64)
    if rows.shape[1] == 0:
        acc.fill(np.nan)
    elif rows.size:
        _SUM(rows, acc)
        acc /= rows.shape[1]
    return acc


def _moments_of(which, x, axis, correction, keepdims):
    op = OPERATORS[which]
    dtype = S.result_dtype(op, S.check_dtype(op, x._dtype))  # var of complex is real
    rows = rows_view(x._data, axis)
    acc = _mean(rows)
    if which != "mean":  # two passes: no cancellation on data with a large mean
        m2 = np.zeros(rows.shape[0])
        if rows.size:
            deviations = _DEVIATIONS_COMPLEX if rows.dtype.kind == "c" else _DEVIATIONS
            deviations(rows, m2, acc)
        dof = rows.shape[1] - correction
        acc = m2 / dof if dof > 0 and rows.shape[1] else np.full_like(m2, np.nan)
        if which == "std":
            acc = np.sqrt(acc)
    return _finish(acc, x, axis, keepdims, dtype)


def mean(ks, x, axis, keepdims):
    return _moments_of("mean", x, axis, 0.0, keepdims)


def var(ks, x, axis, correction, keepdims):
    return _moments_of("var", x, axis, correction, keepdims)


def std(ks, x, axis, correction, keepdims):
    return _moments_of("std", x, axis, correction, keepdims)


def vector_norm(ks, x, axis, keepdims, ord):
    """Of real floating tensors, the 2-norm: the root of the sum of the squared
    deviations from zero, in float64 (Note [C moments] in dispatch/csrc/fastpath.c);
    ord 1, inf and -inf: folds of |x| (_NORMS). Other ords and dtypes, no axes, and
    ord +-inf of an empty axis (an error) as NumPy computes them."""
    if x._dtype.kind != "f" or not axis or not (ord == 2 or ord in _NORMS):
        return _any_vector_norm(ks, x, axis, keepdims, ord)
    rows = rows_view(x._data, axis)
    if ord == 2:
        acc = np.zeros(rows.shape[0])
        if rows.size:
            _DEVIATIONS(rows, acc, np.zeros(rows.shape[0]))
        return _finish(np.sqrt(acc), x, axis, keepdims, x._dtype)
    fold, start, accumulator = _NORMS[ord]
    if rows.shape[1] == 0 and ord != 1:
        return _any_vector_norm(ks, x, axis, keepdims, ord)
    acc = _filled(rows.shape[0], start, accumulator or rows.dtype)
    if rows.size:
        fold(rows, acc)
    return _finish(acc, x, axis, keepdims, x._dtype)


class FoldSpec:
    """What the C core's reduction fast path needs of a fold (Note [C reductions] in
    dispatch/csrc/fastpath.c): per input dtype index, the accumulator and result dtypes (None
    where the dtype takes the Python kernel), the start value, and the loops' addresses
    -- the same templates the Python kernel runs, compiled as C functions."""

    def __init__(self, name, reduction, start, result, deviations=None):
        op = OPERATORS[name]
        self.name, self.reduction, self.start = name, reduction, start
        self.has_dtype = name in ("sum", "prod")
        # argmax, argmin: the indices into the accumulator (int64), each row's best
        # value beside it, starting from the row's first (``_arg_fold``)
        self.arg = name in ("argmax", "argmin")
        # mean: the sum's fold into float64, divided by the count (``_mean``), for
        # floating inputs; an empty axis (NaN) and complex ones take the Python kernel
        self.mean = mean = name == "mean"
        # var, std, vector_norm's 2-norm: the squared ``deviations`` from each row's
        # mean (``centered``) or from zero, float64, for floating inputs (Note [C
        # moments] in dispatch/csrc/fastpath.c); the mean is ``reduction``'s fold
        self.deviations, self.moments = deviations, deviations is not None
        self.centered, self.root = name in ("var", "std"), name in ("std", "vector_norm")
        float64_only = mean or self.moments
        self.results, self.accumulators = [], []
        for d in D.ALL:
            try:
                res = result(op, d)
            except TypeError:  # a dtype the operator refuses: the Python kernel raises
                res = None
            if float64_only and d.kind != "f":
                res = None
            self.results.append(res)
            self.accumulators.append(
                None
                if res is None
                else D.from_numpy(np.dtype(_accumulator(res)))
                if self.has_dtype or float64_only
                else res
            )
        self.limit = _parallel_min

    def address(self, form, index):
        d, acc = D.ALL[index], self.accumulators[index]
        along_rows = form in (core.LOOP_ROWS, core.LOOP_DEVIATION_ROWS)
        if form in (core.LOOP_DEVIATION_ROWS, core.LOOP_DEVIATION_COLUMNS):
            return self.deviations.address(along_rows, d, acc, D.float64)
        return self.reduction.address(along_rows, d, acc, d if self.arg else None)


_FOLD_WRAPPERS = (K.fold_rows_cloop, K.fold_columns_cloop)
# loops with a per-row array beside the accumulator: argmax's best values, var's means
_BESIDE_WRAPPERS = (K.arg_rows_cloop, K.arg_columns_cloop)
# those loops called by address, by the count of arrays beside the accumulator
_FOLD_AT = (K.fold_at, K.fold_beside_at)


def _fast(kernel, spec):
    """The kernel with the C core's fast path in front (the kernel itself in the
    pure-Python core)."""
    kernel.__name__ = kernel.__qualname__ = spec.name  # the Python kernel reads its name
    fast = core.ReductionKernel(kernel, spec)
    if fast is not kernel:
        FAST.append(fast)
    return fast


def _index_result(op, d):
    S.check_dtype(op, d)  # argmax of complex: TypeError
    return D.int64


def _sum_result(op, d):
    return S.result_dtype(op, S.check_dtype(op, d))


def register(registry):
    kernels = {
        "sum": _fast(_sum_like(_SUM, 0), FoldSpec("sum", _SUM, 0, _sum_result)),
        "prod": _fast(_sum_like(_PROD, 1), FoldSpec("prod", _PROD, 1, _sum_result)),
        "max": _fast(
            _fold(_MAX, _first_value("max"), lambda x: x._dtype),
            FoldSpec("max", _MAX, "first", S.check_dtype),
        ),
        "min": _fast(
            _fold(_MIN, _first_value("min"), lambda x: x._dtype),
            FoldSpec("min", _MIN, "first", S.check_dtype),
        ),
        "all": _fast(
            _fold(_ALL, _constant(True), lambda x: D.bool_),
            FoldSpec("all", _ALL, True, lambda op, d: D.bool_),
        ),
        "any": _fast(
            _fold(_ANY, _constant(False), lambda x: D.bool_),
            FoldSpec("any", _ANY, False, lambda op, d: D.bool_),
        ),
        "argmax": _fast(
            _arg_fold(_ARGMAX, "argmax"), FoldSpec("argmax", _ARGMAX, "first", _index_result)
        ),
        "argmin": _fast(
            _arg_fold(_ARGMIN, "argmin"), FoldSpec("argmin", _ARGMIN, "first", _index_result)
        ),
        "mean": _fast(mean, FoldSpec("mean", _SUM, 0, _sum_result)),
        "var": _fast(var, FoldSpec("var", _SUM, 0, _sum_result, _DEVIATIONS)),
        "std": _fast(std, FoldSpec("std", _SUM, 0, _sum_result, _DEVIATIONS)),
        "vector_norm": _fast(
            vector_norm, FoldSpec("vector_norm", None, 0, _sum_result, _DEVIATIONS)
        ),
    }
    for name, fn in kernels.items():
        fn.__name__ = fn.__qualname__ = name
        fn.__module__ = __name__
        registry.register(name, "cpu", fn)
