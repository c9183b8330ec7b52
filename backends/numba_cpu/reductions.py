"""Reduction kernels of the CPU backend: sum, prod, max, min, all, any, argmax,
argmin (one template each, folded over the rows of a 2-D view) and the moments behind
mean, var and std."""

import numpy as np

from lamina.backends import jit, threads
from lamina.backends import setup as S
from lamina.dispatch import core
from lamina.dispatch import dtypes as D
from lamina.dispatch.meta import reduced_shape
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array

from . import kernels as K
from .layout import rows_view

empty = np.empty
FAST = []  # the C core's reduction kernels: their limits follow the thread count
_parallel_min = float("inf")  # Note [Parallel threshold] (lamina.backends.threads)


def _set_threshold(threshold):
    global _parallel_min
    _parallel_min = threshold
    for kernel in FAST:
        kernel.set_limit(threshold)


threads.on_change(_set_threshold)


def _filled(n, value, dtype):
    acc = empty(n, dtype)  # np.full is Python code: about 1.5 us more
    acc.fill(value)
    return acc


class Reduction:
    """One reduction family: ``step`` folded over each row into an accumulator.

    With a ``columns`` template, a column-major rows view (a reduction over leading
    axes, e.g. sum(x, axis=0)) runs it on the contiguous transpose instead of striding
    down each column. Entry points are compiled per (template, dtypes, loop, layout)."""

    def __init__(self, template, fn, columns=None):
        self.template, self.fn, self.columns = template, fn, columns

    def __call__(self, rows, out):
        loop = range if rows.size < _parallel_min else jit.prange
        template, flags = self.template, rows.flags
        layout = "C" if flags.c_contiguous else "A"
        if self.columns is not None and loop is range and layout == "A" and flags.f_contiguous:
            template, rows, layout = self.columns, rows.T, "C"
        args = (loop,) if self.fn is None else (self.fn, loop)
        entry = jit.cached(
            (template, self.fn, rows.dtype, out.dtype, loop, layout),
            lambda: K.instantiate(
                template,
                args,
                jit.types.void(jit.array(rows.dtype, 2, layout), jit.array(out.dtype)),
            ),
        )
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


def _first_index(what):
    """argmax/argmin start at index 0; an empty axis has no index to give."""

    def start(rows, x):
        if rows.shape[1] == 0:
            raise ValueError(
                f"{what}: cannot take the {what} of an empty sequence (shape {x._shape})"
            )
        return np.zeros(rows.shape[0], np.int64)

    return start


def _constant(value):
    return lambda rows, x: _filled(rows.shape[0], value, np.bool_)


def _moments(rows):
    """Each row's mean (float64, complex128 for complex rows) and sum of squared moduli
    of the deviations (float64)."""
    complex_rows = rows.dtype.kind == "c"
    square = K.abs_square if complex_rows else K.square

    def build():
        return K.instantiate(
            K.moments_rows,
            (square, range),
            jit.types.void(
                jit.array(rows.dtype, 2, "A"), jit.array(mean.dtype), jit.array(np.float64)
            ),
        )

    mean = np.zeros(rows.shape[0], np.complex128 if complex_rows else np.float64)
    m2 = np.zeros(rows.shape[0])
    if rows.shape[1]:
        jit.cached((K.moments_rows, square, rows.dtype), build)(rows, mean, m2)
    else:
        mean[:], m2[:] = np.nan, np.nan
    return mean, m2


def _moments_of(which, x, axis, correction, keepdims):
    op = OPERATORS[which]
    dtype = S.result_dtype(op, S.check_dtype(op, x._dtype))  # var of complex is real
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


def mean(ks, x, axis, keepdims):
    return _moments_of("mean", x, axis, 0.0, keepdims)


def var(ks, x, axis, correction, keepdims):
    return _moments_of("var", x, axis, correction, keepdims)


def std(ks, x, axis, correction, keepdims):
    return _moments_of("std", x, axis, correction, keepdims)


class FoldSpec:
    """What the C core's reduction fast path needs of a fold (Note [C reductions] in
    dispatch/_core.c): per input dtype index, the accumulator and result dtypes (None
    where the dtype takes the Python kernel), the start value, and the loops' addresses
    -- the same templates the Python kernel runs, compiled as C functions."""

    def __init__(self, name, reduction, start, result):
        op = OPERATORS[name]
        self.name, self.reduction, self.start = name, reduction, start
        self.has_dtype = name in ("sum", "prod")
        self.results, self.accumulators = [], []
        for d in D.ALL:
            try:
                res = result(op, d)
            except TypeError:  # a dtype the operator refuses: the Python kernel raises
                res = None
            self.results.append(res)
            self.accumulators.append(
                None
                if res is None
                else D.from_numpy(np.dtype(_accumulator(res)))
                if self.has_dtype
                else res
            )
        self.limit = _parallel_min

    def address(self, form, index):
        template = self.reduction.template if form == core.LOOP_ROWS else self.reduction.columns
        wrapper = K.fold_rows_cloop if form == core.LOOP_ROWS else K.fold_columns_cloop
        d, acc = D.ALL[index], self.accumulators[index]

        def build(cache):
            # inlined into the loop, the kernel's status checks and raise paths go away:
            # the loop needs nothing of Numba's runtime (Note [Loop cache]); a jitable
            # function, not a dispatcher, so the loop is cached (Note [Closure cells])
            kernel = jit.jitable(template(self.reduction.fn, range), inline="always")
            return K.c_loop(wrapper, kernel, d, acc, [d], cache)

        return jit.c_loop((wrapper, template, self.reduction.fn, d, acc), build)


def _fast(kernel, spec):
    """The kernel with the C core's fast path in front (the kernel itself in the
    pure-Python core)."""
    kernel.__name__ = kernel.__qualname__ = spec.name  # the Python kernel reads its name
    fast = core.ReductionKernel(kernel, spec)
    if fast is not kernel:
        FAST.append(fast)
    return fast


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
        "argmax": _fold(_ARGMAX, _first_index("argmax"), lambda x: D.int64),
        "argmin": _fold(_ARGMIN, _first_index("argmin"), lambda x: D.int64),
        "mean": mean,
        "var": var,
        "std": std,
    }
    for name, fn in kernels.items():
        fn.__name__ = fn.__qualname__ = name
        fn.__module__ = __name__
        registry.register(name, "cpu", fn)
