"""One sample table for every operator of the schema (an OpInfo database).

``samples(name, dtype=None, smooth=False)`` gives the sample calls of operator
``name`` (a key of ``lamina.dispatch.schema.OPERATORS``): a list of ``Sample``, each
holding the function to call, its positional arguments and keyword arguments (fresh
lamina tensors on every call of ``samples``, so an operator that writes its arguments
cannot spoil another test's inputs), and a label naming its layout. ``sample.call()``
runs it. Standalone use, e.g. for a device test::

    import samples as S  # tests/ on sys.path
    for name in S.OPERATORS:
        for s in S.samples(name):
            out = s.call()

What the table covers, per operator:

* **dtypes** -- ``dtypes(name)``: the dtypes the tests run it on. Every kernel numba_cpu
  compiles costs ~0.1-0.3 s cold, so an operator gets one dtype per kind it accepts,
  rotated between operators (elementwise operators take their rotation from
  ``opinfo.OPS``); ``samples(name, dtype)`` gives one dtype's samples;
* **shapes and layouts** -- where an operator takes tensors: 0-d, empty, broadcasting
  and views that are not contiguous (transposed, stepped, reversed: negative strides);
* **values** -- elementwise operators get opinfo's special values (extremes, signed
  zeros, infinities, NaN); the others small values on a grid of 1/8 (sums of them are
  exact, so only a kernel's rounding differs). With ``smooth=True`` every floating
  tensor holds values where the operator is differentiable (no ties, no kinks, inside
  its domain) and shapes stay small: the samples for gradcheck.

Where an operator is internal (``namespace=None`` in the schema), its samples call the
operator object itself (``OPERATORS[name](*args)``) with the canonical arguments its
kernels receive, or the public function that reaches it (``x[key]``, ``lm.full``, ...).
``Sample.grad_args`` names the arguments gradcheck differentiates (by default every
floating tensor argument).
"""

import operator
import os
import sys
import zlib
from dataclasses import dataclass, field

import numpy as np

import lamina as lm
import lamina.nn.functional as F
from lamina.dispatch.schema import OPERATORS

sys.path.insert(0, os.path.dirname(__file__))
import opinfo as I


@dataclass
class Sample:
    fn: object  # the function to call
    args: tuple
    kwargs: dict = field(default_factory=dict)
    label: str = ""
    values: bool = True  # False: only dtype and shape are defined (empty())
    grad_args: tuple | None = None  # argument indices gradcheck checks (None: floats)

    def call(self):
        return self.fn(*self.args, **self.kwargs)

    def __repr__(self):
        return f"<sample {self.label}>"


def function(name):
    """The public function of operator ``name``, or the operator itself when it is
    internal (called with canonical arguments)."""
    op = OPERATORS[name]
    if op.namespace is None:
        return op
    module = lm
    for part in filter(None, op.namespace.split(".")):
        module = getattr(module, part)
    return getattr(module, name)


# ---------------------------------------------------------------- tensors


class Maker:
    """Makes the tensors of one (operator, dtype) sample list: ``t(shape)``, with a
    layout ("c" contiguous, "T" the reversed-axes view of a contiguous base, "flip"
    axis 0 reversed, "step" every other row of a base twice as tall) and a value
    range for smooth samples."""

    def __init__(self, name, dtype, smooth):
        self.dtype, self.smooth = dtype, smooth
        self.rng = np.random.default_rng(zlib.crc32(repr((name, dtype, smooth)).encode()))

    def values(self, shape, dtype, lo, hi):
        rng, dt = self.rng, np.dtype(dtype)
        if dt.kind == "b":
            return rng.random(shape) < 0.5
        if dt.kind in "iu":
            low = 0 if dt.kind == "u" else max(int(lo), -5)
            return rng.integers(low, max(int(hi), low + 1), shape, endpoint=True).astype(dt)
        if self.smooth:
            v = rng.uniform(lo, hi, shape)
        else:
            v = np.round(rng.uniform(lo, hi, shape) * 8) / 8
        if dt.kind == "c":
            v = v + 1j * (rng.uniform(lo, hi, shape) if self.smooth else np.round(v * 3) / 8)
        return v.astype(dt)

    def __call__(self, shape, layout="c", dtype=None, lo=-2.0, hi=2.0):
        dtype = dtype or self.dtype
        shape = tuple(shape)
        if layout == "T":
            base = lm.asarray(self.values(shape[::-1], dtype, lo, hi))
            return lm.permute_dims(base, tuple(range(len(shape)))[::-1])
        if layout == "flip":
            return lm.asarray(self.values(shape, dtype, lo, hi))[::-1]
        if layout == "step":
            base = lm.asarray(self.values((2 * shape[0], *shape[1:]), dtype, lo, hi))
            return base[::2]
        return lm.asarray(self.values(shape, dtype, lo, hi))

    def ints(self, shape, lo, hi):
        return lm.asarray(self.rng.integers(lo, hi, shape).astype(np.int64))


# ---------------------------------------------------------------- elementwise


UNARY_LAYOUTS = ("1d", "0d", "empty", "permuted-flipped")
BINARY_LAYOUTS = ("pairs", "0d-1d", "empty-bcast", "stepped-bcast")
INPLACE_LAYOUTS = ("pairs", "0d", "empty-bcast", "stepped-bcast")  # x1 keeps its shape


def _smooth_range(name):
    """Where a unary or binary elementwise operator is differentiable."""
    return {"acosh": (1.2, 2.0), "atanh": (-0.8, 0.8), "asin": (-0.8, 0.8)}.get(name, (0.2, 0.9))


def _elementwise(name):
    op = OPERATORS[name]
    info = I.OPS[(op.inplace_of or op).name]
    fn = function(name)

    def build(dtype, t):
        if t.smooth:
            lo, hi = _smooth_range(info.name)
            x1 = t((3, 2), "T", lo=lo, hi=hi)
            if info.arity == 1:
                return [Sample(fn, (x1,), label="smooth")]
            x2 = t((2,), "flip", lo=lo, hi=hi) if op.inplace_of is None else t((3, 2), lo=lo, hi=hi)
            return [Sample(fn, (x1, x2), label="smooth")]
        if info.arity == 1:
            return [
                Sample(fn, (I.unary_sample(info, dtype, layout)[0],), label=layout)
                for layout in UNARY_LAYOUTS
            ]
        layouts = BINARY_LAYOUTS if op.inplace_of is None else INPLACE_LAYOUTS
        return [
            Sample(fn, I.binary_sample(info, dtype, dtype, layout)[0], label=layout)
            for layout in layouts
        ]

    dtypes = info.dtypes
    if op.inplace_of is not None:  # x1 keeps its dtype; the last three of the rotation
        keeps = I.FLOATS + I.COMPLEX if info.rule in I.PROMOTES_TO_FLOAT else I.ALL_DTYPES
        dtypes = tuple(d for d in dtypes if d in keeps)[-3:]
    return dtypes, build


# ---------------------------------------------------------------- the table

TABLE = {}  # name -> (dtypes, build(dtype, maker) -> [Sample])


def sample_of(*names, dtypes):
    """Register ``build`` as the samples of operators ``names`` (each called with the
    operator's function as its first argument)."""

    def register(build):
        for name in names:
            fn = function(name)
            TABLE[name] = (tuple(dtypes.split()), lambda d, t, fn=fn, b=build: b(fn, d, t))
        return build

    return register


def S(fn, *args, label="", **kwargs):
    return Sample(fn, args, kwargs, label=label)


@sample_of("clip", dtypes="int16 uint8 float32 float64")
def _clip(fn, d, t):
    return [
        S(fn, t((3, 4)), 0 if d[0] == "u" else -1, 1, label="scalars"),
        S(fn, t((3, 4), "T"), t((4,)), None, label="tensor-min"),
        S(fn, t((4,), "flip"), None, t((3, 1)), label="bcast-max"),
        S(fn, t(()), 0, 1, label="0d"),
        S(fn, t((0, 3)), t((3,)), t((1, 3)), label="empty"),
    ]


@sample_of("where", dtypes="bool int32 float64 complex128")
def _where(fn, d, t):
    cond = lambda *s: t(s, dtype="bool")
    return [
        S(fn, cond(3, 4), t((3, 4), "T"), t((3, 4)), label="same"),
        S(fn, cond(3, 1), t((4,), "flip"), 1, label="bcast-scalar"),
        S(fn, cond(), t(()), t((2,)), label="0d"),
        S(fn, cond(0, 2), t((2,)), t((0, 1)), label="empty"),
    ]


@sample_of("sum", "prod", dtypes="int8 float32 complex128")
def _sum(fn, d, t):
    out = [
        S(fn, t((3, 4)), label="all"),
        S(fn, t((3, 4), "T"), axis=0, keepdims=True, label="T-axis0-keepdims"),
        S(fn, t((2, 3, 4), "flip"), axis=(0, 2), label="flip-axes"),
        S(fn, t(()), label="0d"),
        S(fn, t((0, 3)), axis=0, label="empty"),
    ]
    if d in ("int8", "bool"):
        out.append(S(fn, t((3, 2)), axis=1, dtype=lm.float64, label="dtype"))
    return out


@sample_of("mean", "var", "std", dtypes="float32 complex128")
def _stat(fn, d, t):
    extra = {} if fn.__name__ == "mean" else {"correction": 1.0}
    return [
        S(fn, t((3, 4)), label="all"),
        S(fn, t((3, 4), "T"), axis=1, keepdims=True, **extra, label="T-axis1"),
        S(fn, t((2, 3, 4), "step"), axis=(0, 2), label="step-axes"),
        S(fn, t(()), label="0d"),
        S(fn, t((0, 3)), axis=1, label="empty"),
    ]


@sample_of("max", "min", dtypes="uint32 float32")
def _extreme(fn, d, t):
    return [
        S(fn, t((3, 4)), label="all"),
        S(fn, t((3, 4), "T"), axis=0, keepdims=True, label="T-axis0"),
        S(fn, t((2, 3, 4), "flip"), axis=(1, 2), label="flip-axes"),
        S(fn, t(()), label="0d"),
        S(fn, t((0, 3)), axis=1, label="empty-rows"),
    ]


@sample_of("all", "any", dtypes="bool float64")
def _logical(fn, d, t):
    return [
        S(fn, t((3, 4)), label="all"),
        S(fn, t((3, 4), "T"), axis=1, keepdims=True, label="T-axis1"),
        S(fn, t(()), label="0d"),
        S(fn, t((0, 3)), axis=0, label="empty"),
    ]


@sample_of("argmax", "argmin", dtypes="int64 float32")
def _arg(fn, d, t):
    return [
        S(fn, t((3, 4)), label="all"),
        S(fn, t((3, 4), "T"), axis=0, label="T-axis0"),
        S(fn, t((2, 3, 4), "flip"), axis=-1, keepdims=True, label="flip-keepdims"),
        S(fn, t(()), label="0d"),
        S(fn, t((0, 3)), axis=1, label="empty-rows"),
    ]


@sample_of("vector_norm", dtypes="float32 float64 complex128")
def _norm(fn, d, t):
    return [
        S(fn, t((3, 4)), label="2"),
        S(fn, t((3, 4), "T"), axis=0, ord=1, label="T-1"),
        S(fn, t((2, 3, 4), "flip"), axis=(0, 2), ord=float("inf"), keepdims=True, label="inf"),
        S(fn, t((5,)), ord=3, label="3"),
        S(fn, t(()), label="0d"),
        S(fn, t((0, 3)), axis=1, label="empty"),
    ]


VIEW_DTYPES = "bool uint8 float64 complex128"


@sample_of("reshape", dtypes=VIEW_DTYPES)
def _reshape(fn, d, t):
    return [
        S(fn, t((3, 4)), (2, 6), label="c"),
        S(fn, t((3, 4), "T"), (-1,), label="T-copies"),
        S(fn, t(()), (1, 1), label="0d"),
        S(fn, t((0, 3)), (3, 0), label="empty"),
        S(fn, t((4,), "flip"), (2, 2), copy=True, label="copy"),
    ]


@sample_of("permute_dims", dtypes=VIEW_DTYPES)
def _permute(fn, d, t):
    return [
        S(fn, t((2, 3, 4)), (2, 0, 1), label="c"),
        S(fn, t((2, 3, 4), "flip"), (1, 2, 0), label="flip"),
        S(fn, t(()), (), label="0d"),
        S(fn, t((0, 3)), (1, 0), label="empty"),
    ]


@sample_of("matrix_transpose", dtypes=VIEW_DTYPES)
def _mt(fn, d, t):
    return [
        S(fn, t((2, 3, 4)), label="3d"),
        S(fn, t((3, 4), "T"), label="T"),
        S(fn, t((0, 3)), label="empty"),
    ]


@sample_of("expand_dims", dtypes=VIEW_DTYPES)
def _expand(fn, d, t):
    return [
        S(fn, t((3, 4)), 1, label="c"),
        S(fn, t((3, 4), "T"), -1, label="T-last"),
        S(fn, t(()), 0, label="0d"),
        S(fn, t((0,)), 0, label="empty"),
    ]


@sample_of("squeeze", dtypes=VIEW_DTYPES)
def _squeeze(fn, d, t):
    return [
        S(fn, t((3, 1, 4)), 1, label="c"),
        S(fn, t((1, 3, 1), "T"), (0, 2), label="T-both"),
        S(fn, t((1,)), 0, label="to-0d"),
        S(fn, t((0, 1)), -1, label="empty"),
    ]


@sample_of("flip", dtypes=VIEW_DTYPES)
def _flip(fn, d, t):
    return [
        S(fn, t((3, 4)), label="all"),
        S(fn, t((2, 3, 4), "T"), axis=(0, 2), label="T-axes"),
        S(fn, t((5,), "flip"), axis=0, label="twice"),
        S(fn, t(()), label="0d"),
        S(fn, t((0, 3)), axis=1, label="empty"),
    ]


@sample_of("broadcast_to", dtypes=VIEW_DTYPES)
def _broadcast_to(fn, d, t):
    return [
        S(fn, t((3, 1)), (2, 3, 4), label="c"),
        S(fn, t((4,), "flip"), (3, 4), label="flip"),
        S(fn, t(()), (2, 2), label="0d"),
        S(fn, t((1, 3)), (0, 3), label="empty"),
    ]


@sample_of("split", dtypes=VIEW_DTYPES)
def _split(fn, d, t):
    return [
        S(fn, t((6, 4)), 4, label="size"),
        S(fn, t((6, 4), "T"), [1, 2, 3], label="T-sections"),
        S(fn, t((3, 5), "flip"), 2, axis=1, label="flip-axis1"),
        S(fn, t((0, 3)), 1, axis=1, label="empty"),
    ]


@sample_of("diagonal", dtypes=VIEW_DTYPES)
def _diagonal(fn, d, t):
    return [
        S(fn, t((3, 4)), label="c"),
        S(fn, t((2, 3, 3), "T"), offset=1, label="T-above"),
        S(fn, t((4, 3), "flip"), offset=-2, label="flip-below"),
        S(fn, t((0, 2, 2)), label="empty"),
    ]


@sample_of("to_layout", dtypes="float32 float64")
def _to_layout(fn, d, t):
    return [
        S(fn, t((2, 3, 4, 5)), "NHWC", label="to-NHWC"),
        S(fn, F.to_layout(t((2, 3, 4, 5)), "NHWC"), "NCHW", label="to-NCHW"),
        S(fn, t((2, 3, 4, 5), "flip"), "NHWC", label="flip"),
        S(fn, t((0, 3, 2, 2)), "NHWC", label="empty"),
    ]


def _setitem(x, key, value):
    x[key] = value
    return x


def _indexing_keys(t, repeats=True):
    """Keys of a (3, 4) tensor; ``repeats``: an integer key that selects a row twice
    (setitem would write it twice: the last write wins, and it has no gradient)."""
    return [
        (1, "int"),
        ((slice(None, None, -2), 1), "negative-step"),
        ((Ellipsis, None, 0), "ellipsis-newaxis"),
        (lm.asarray([2, 0, 2] if repeats else [2, 0]), "int-tensor"),
        ((lm.asarray([True, False, True]), slice(1, 3)), "bool-mask"),
        ((slice(2, 2),), "empty"),
    ]


@sample_of("getitem", dtypes="bool int16 float64 complex64")
def _getitem(fn, d, t):
    return [S(operator.getitem, t((3, 4), "T"), key, label=k) for key, k in _indexing_keys(t)]


TABLE["setitem"] = (
    ("bool", "int16", "float64", "complex64"),
    lambda d, t: (
        [
            Sample(_setitem, (t((3, 4)), key, t((4,))[:1] if k == "int" else t(())), label=k)
            for key, k in _indexing_keys(t, repeats=False)
        ]
        + [Sample(_setitem, (t((3, 4), "T"), (slice(None), 0), t((3,), "flip")), label="T-tensor")]
    ),
)


@sample_of("add_scaled_", dtypes="float32 float64")
def _add_scaled(fn, d, t):
    return [
        S(fn, t((3, 4)), t((3, 4)), -0.5, label="contiguous"),
        S(fn, t((2, 3, 4), "T"), t((2, 3, 4)), 2.0, label="T-dense"),
        S(fn, t((4, 6))[:, ::2], t((4, 3), "flip"), 0.25, label="strided"),
        S(fn, t((0, 3)), t((0, 3)), 1.0, label="empty"),
    ]


@sample_of("index_add", dtypes="int32 float64 complex128")
def _index_add(fn, d, t):
    rows = lm.asarray([0, 2, 0])
    return [
        S(fn, t((3, 4)), rows, t((3, 4)), label="duplicates"),
        S(fn, t((3, 4), "T"), (Ellipsis, rows, lm.asarray([1, 1, 3])), t(()), label="pairs"),
        S(fn, t((4,), "flip"), (slice(None, None, 2),), t((2,)), label="slice"),
        S(fn, t((3, 0)), rows, t((3, 0)), label="empty"),
    ]


@sample_of("concat", "stack", dtypes="bool int8 float32 complex128")
def _join(fn, d, t):
    concat = fn.__name__ == "concat"
    out = [
        S(fn, [t((2, 3)), t((2, 3), "flip")], label="axis0"),
        S(fn, [t((2, 3)), t((2, 3), "T")], axis=-1, label="T-last"),
        S(fn, [t(() if not concat else (1,)), t(() if not concat else (1,))], label="small"),
        S(fn, [t((0, 3)), t((0, 3))], axis=1, label="empty"),
    ]
    if concat:
        out.append(S(fn, [t((2, 2)), t((3,), dtype="int8")], axis=None, label="flat-promote"))
    return out


@sample_of("matmul", dtypes="int32 float32 float64 complex128")
def _matmul(fn, d, t):
    return [
        S(fn, t((3, 4)), t((4, 2)), label="2d"),
        S(fn, t((3, 4), "T"), t((4, 2), "T"), label="T"),
        S(fn, t((2, 1, 3, 4)), t((5, 4, 2)), label="batch-bcast"),
        S(fn, t((4,)), t((4,), "flip"), label="1d-1d"),
        S(fn, t((2, 3, 4)), t((4,)), label="3d-1d"),
        S(fn, t((0, 4)), t((4, 2)), label="empty"),
        S(fn, t((3, 0)), t((0, 2)), label="k0"),
    ]


@sample_of("tensordot", dtypes="int16 float32 float64 complex128")
def _tensordot(fn, d, t):
    return [
        S(fn, t((2, 3, 4)), t((3, 4, 2)), label="axes2"),
        S(fn, t((3, 4), "T"), t((4, 2)), axes=1, label="T-axes1"),
        S(fn, t((2, 3)), t((2, 4), "flip"), axes=([0], [0]), label="lists"),
        S(fn, t((2,)), t((3,)), axes=0, label="outer"),
        S(fn, t((0, 3)), t((3, 2)), axes=1, label="empty"),
    ]


@sample_of("vecdot", dtypes="int8 float32 float64 complex128")
def _vecdot(fn, d, t):
    return [
        S(fn, t((3, 4)), t((4,)), label="bcast"),
        S(fn, t((3, 4), "T"), t((3, 4)), axis=0, label="T-axis0"),
        S(fn, t((5,), "flip"), t((5,)), label="flip"),
        S(fn, t((0, 3)), t((0, 3)), label="empty"),
    ]


def _spd(t, n, batch=()):
    """Symmetric (Hermitian) positive-definite matrices, well conditioned."""
    a = t((*batch, n, n), lo=-1, hi=1)
    return a @ lm.conj(lm.matrix_transpose(a)) + 2 * n * lm.eye(n, dtype=a.dtype)


LINALG_DTYPES = "float32 float64 complex128"


@sample_of("cholesky", "eigh", "eigvalsh", dtypes=LINALG_DTYPES)
def _hermitian(fn, d, t):
    extra = {"upper": True} if fn.__name__ == "cholesky" else {}
    return [
        S(fn, _spd(t, 3), label="3x3"),
        S(fn, lm.matrix_transpose(_spd(t, 2, (2,))), **extra, label="T-batch"),
        S(fn, _spd(t, 1, (0,)), label="empty-batch"),
    ]


def _square(t, n, batch=(), layout="c"):
    return t((*batch, n, n), layout) + 3 * lm.eye(n, dtype=t.dtype)  # well conditioned


@sample_of("det", "slogdet", "inv", dtypes=LINALG_DTYPES)
def _square_samples(fn, d, t):
    return [
        S(fn, _square(t, 3), label="3x3"),
        S(fn, t((2, 2, 2), "T") + 3 * lm.eye(2, dtype=d), label="T-batch"),
        S(fn, _square(t, 1), label="1x1"),
        S(fn, t((0, 2, 2)), label="empty-batch"),
    ]


@sample_of("solve", dtypes=LINALG_DTYPES)
def _solve(fn, d, t):
    return [
        S(fn, _square(t, 3), t((3, 2)), label="matrix"),
        S(fn, t((2, 3, 3), "T") + 3 * lm.eye(3, dtype=d), t((3, 1), "flip"), label="T-bcast"),
        S(fn, t((0, 2, 2)), t((0, 2, 1)), label="empty-batch"),
    ]


@sample_of("qr", "svd", "svdvals", dtypes=LINALG_DTYPES)
def _decompose(fn, d, t):
    extra = {"qr": {"mode": "complete"}, "svd": {"full_matrices": False}}.get(fn.__name__, {})
    # svd with full_matrices has no gradient for a non-square x (its extra columns of U
    # are any basis): differentiated with full_matrices=False
    first = extra if t.smooth and fn.__name__ == "svd" else {}
    return [
        S(fn, t((4, 3)), **first, label="tall"),
        S(fn, t((3, 2, 4), "T"), **extra, label="T-batch"),
        S(fn, t((0, 3, 2)), label="empty-batch"),
    ]


FFT_DTYPES = {"float": "float32 float64 complex128 int16", "real_float": "float32 float64"}


def _fft1(fn, d, t):
    return [
        S(fn, t((8,)), label="1d"),
        S(fn, t((4, 3), "T"), n=6, axis=0, label="T-n6-axis0"),
        S(fn, t((5,), "flip"), norm="ortho", label="flip-ortho"),
        S(fn, t((0, 4)), n=3, norm="forward", label="empty-batch"),
    ]


def _fftn(fn, d, t):
    return [
        S(fn, t((3, 4)), label="2d"),
        S(fn, t((2, 3, 4), "T"), axes=(0, 2), norm="ortho", label="T-axes"),
        S(fn, t((4, 4), "flip"), s=(3, 6), axes=(0, 1), label="flip-s"),
        S(fn, t((0, 4, 4)), axes=(1, 2), label="empty-batch"),
    ]


for _name in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft"):
    sample_of(_name, dtypes=FFT_DTYPES.get(OPERATORS[_name].dtypes, "float64"))(_fft1)
for _name in ("fftn", "ifftn", "rfftn", "irfftn"):
    sample_of(_name, dtypes=FFT_DTYPES.get(OPERATORS[_name].dtypes, "float64"))(_fftn)


@sample_of("cumulative_sum", "cumulative_prod", dtypes="int8 float64 complex128")
def _scan(fn, d, t):
    return [
        S(fn, t((6,)), label="1d"),
        S(fn, t((3, 4), "T"), axis=0, include_initial=True, label="T-initial"),
        S(
            fn,
            t((2, 3), "flip"),
            axis=1,
            dtype="complex128" if d[0] == "c" else "float64",
            label="flip-dtype",
        ),
        S(fn, t((0, 3)), axis=1, label="empty"),
    ]


@sample_of("sort", "argsort", dtypes="bool int16 uint32 float32 float64")
def _sort(fn, d, t):
    x = t((7,), lo=-1, hi=1)
    if d in I.FLOATS and not t.smooth:  # NaN, signed zeros and ties
        x = lm.asarray(np.array([0.5, np.nan, -0.0, 0.0, -1.0, 0.5, np.nan, -np.inf], d))
    return [
        S(fn, x, label="1d"),
        S(fn, x, descending=True, label="descending"),
        S(fn, t((3, 4), "T", lo=-1, hi=1), axis=0, label="T-axis0"),
        S(fn, t((2, 5), "flip", lo=-1, hi=1), descending=True, label="flip-desc"),
        S(fn, t((0, 3)), label="empty"),
    ]


@sample_of("searchsorted", dtypes="int32 float32 float64")
def _searchsorted(fn, d, t):
    sorted_ = lm.sort(t((6,), lo=-2, hi=2))
    order = lm.argsort(lm.flip(sorted_))
    return [
        S(fn, sorted_, t((3, 2), "T"), label="left"),
        S(fn, sorted_, t((4,), "flip"), side="right", label="right"),
        S(fn, lm.flip(sorted_), t(()), sorter=order, label="sorter"),
        S(fn, sorted_, 1, label="scalar"),
        S(fn, sorted_[:0], t((2,)), label="empty"),
    ]


@sample_of("nonzero", dtypes="bool int8 float32 complex128")
def _nonzero(fn, d, t):
    return [
        S(fn, t((3, 4), lo=-1, hi=1), label="2d"),
        S(fn, t((2, 3), "T", lo=-1, hi=1), label="T"),
        S(fn, t((5,), "flip", lo=-1, hi=1), label="flip"),
        S(fn, t((0, 3)), label="empty"),
    ]


@sample_of(
    "unique_all", "unique_counts", "unique_inverse", "unique_values", dtypes="bool int16 float64"
)
def _unique(fn, d, t):
    out = [
        S(fn, t((3, 4), "T", lo=-1, hi=1), label="T"),
        S(fn, t((6,), "flip", lo=-1, hi=1), label="flip"),
        S(fn, t(()), label="0d"),
        S(fn, t((0,)), label="empty"),
    ]
    if d == "float64":  # every NaN is distinct; -0.0 equals 0.0
        out.append(S(fn, lm.asarray([np.nan, 1.0, -0.0, np.nan, 0.0, 1.0]), label="nan"))
    return out


# ---------------------------------------------------------------- creation


CREATION = {
    "full": (
        "bool int8 uint16 float32 complex128",
        lambda d, t: [
            S(lm.full, (2, 3), 1, dtype=d, label="2d"),
            S(lm.full, (), 0, dtype=d, label="0d"),
            S(lm.full, (0, 2), 1, dtype=d, label="empty"),
        ],
    ),
    "empty": (
        "bool int64 float32 complex64",
        lambda d, t: [
            Sample(lm.empty, ((2, 3),), {"dtype": d}, "2d", values=False),
            Sample(lm.empty, ((0,),), {"dtype": d}, "empty", values=False),
        ],
    ),
    "arange": (
        "uint8 int64 float32 float64",
        lambda d, t: (
            [
                S(lm.arange, 5, dtype=d, label="stop"),
                S(lm.arange, 1, 9, 3, dtype=d, label="step"),
                S(lm.arange, 4, 0, dtype=d, label="empty"),
            ]
            + ([S(lm.arange, 9, 1, -2, dtype=d, label="negative")] if d[0] != "u" else [])
            + ([S(lm.arange, 0.5, 2.0, 0.25, dtype=d, label="fraction")] if d[0] == "f" else [])
        ),
    ),
    "linspace": (
        "int32 float32 float64 complex128",
        lambda d, t: [
            S(lm.linspace, 0, 10, 5, dtype=d, label="5"),
            S(lm.linspace, -1, 1, 4, dtype=d, endpoint=False, label="no-endpoint"),
            S(lm.linspace, 2, 3, 1, dtype=d, label="1"),
            S(lm.linspace, 2, 3, 0, dtype=d, label="empty"),
        ],
    ),
    "eye": (
        "bool int8 float64 complex64",
        lambda d, t: [
            S(lm.eye, 3, dtype=d, label="square"),
            S(lm.eye, 2, 4, k=1, dtype=d, label="wide-above"),
            S(lm.eye, 4, 2, k=-3, dtype=d, label="tall-below"),
            S(lm.eye, 0, dtype=d, label="empty"),
        ],
    ),
    "from_host": (
        "bool int16 float32 complex128",
        lambda d, t: [
            S(lm.asarray, np.arange(6).reshape(2, 3)[:, ::-1], dtype=d, label="reversed"),
            S(lm.asarray, [[1, 0], [2, 3]], dtype=d, label="list"),
            S(lm.asarray, 1, dtype=d, label="0d"),
            S(lm.asarray, np.zeros((0, 2)), dtype=d, label="empty"),
        ],
    ),
}


def _random(name):
    fn = getattr(lm, name)
    return lambda d, t: [
        S(fn, 2, 3, generator=lm.Generator().manual_seed(7), dtype=d, label="2d"),
        S(fn, (), generator=lm.Generator().manual_seed(8), dtype=d, label="0d"),
        S(fn, 0, 2, generator=lm.Generator().manual_seed(9), dtype=d, label="empty"),
    ]


CREATION.update({name: ("float32 float64", _random(name)) for name in ("rand", "randn")})
for _name, (_dtypes, _build) in CREATION.items():
    TABLE[_name] = (tuple(_dtypes.split()), _build)


# ---------------------------------------------------------------- conversion


@sample_of("astype", dtypes="bool int8 uint32 float32 float64 complex64")
def _astype(fn, d, t):
    # complex to real discards the imaginary part with a warning (NumPy's): not sampled
    names = ("complex64", "complex128") if d[0] == "c" else ("float64", "int16", "uint8", "bool")
    targets = [getattr(lm, n) for n in (*names, "complex128")]
    out = [S(fn, t((3, 4), "T", lo=0, hi=4), to, True, label=f"to-{to}") for to in targets]
    return out + [
        S(fn, t((), lo=0, hi=4), targets[0], True, label="0d"),
        S(fn, t((0, 2)), targets[1], True, label="empty"),
        S(fn, t((3,), "flip"), getattr(lm, d), False, label="no-copy"),
    ]


@sample_of("copy", "to_dense", dtypes="bool int32 float64 complex128")
def _copy(fn, d, t):
    return [
        S(fn, t((3, 4), "T"), label="T-keeps-layout"),
        S(fn, t((5,), "flip"), label="flip"),
        S(fn, t(()), label="0d"),
        S(fn, t((0, 3)), label="empty"),
    ]


@sample_of("to_device", dtypes="int32 float64")
def _to_device(fn, d, t):
    x = t((3, 4), "T")
    return [S(fn, x, x.device, label="cpu"), S(fn, t((0,)), x.device, label="empty")]


def _sparse(t, shape, layout="c"):
    return t(shape, layout, lo=-1, hi=1).to_sparse()


@sample_of("to_sparse", dtypes="int32 float64")
def _to_sparse(fn, d, t):
    return [
        S(fn, t((3, 4), lo=-1, hi=1), label="2d"),
        S(fn, t((5,), "flip", lo=-1, hi=1), label="1d"),
        S(fn, t((0, 3)), label="empty"),
    ]


TABLE["to_dense"] = (
    ("int32", "float64"),
    lambda d, t: [
        Sample(OPERATORS["to_dense"], (_sparse(t, (3, 4)),), label="sparse"),
        Sample(OPERATORS["to_dense"], (t((3, 4), "T"),), label="dense"),
    ],
)


@sample_of("coalesce", dtypes="int32 float64")
def _coalesce(fn, d, t):
    return [S(fn, _sparse(t, (3, 4)), label="2d"), S(fn, _sparse(t, (6,), "flip"), label="1d")]


@sample_of("sparse_mask", dtypes="int32 float64")
def _sparse_mask(fn, d, t):
    return [S(fn, t((3, 4), "T"), _sparse(t, (3, 4)), label="2d")]


# ---------------------------------------------------------------- nn


NN_DTYPES = "float32 float64"
_CONV = OPERATORS["conv2d"]


def _conv_output(x, w, stride, padding4, dilation):
    from lamina.dispatch.meta import conv_output_size

    return tuple(
        conv_output_size(n, padding4[2 * i] + padding4[2 * i + 1], w.shape[2 + i], stride[i], dil)
        for i, (n, dil) in enumerate(zip(x.shape[2:], dilation))
    )


def _conv_cases(t):
    """(input, weight, bias, stride, canonical padding, dilation, groups, public padding)"""
    return [
        (t((2, 3, 5, 6)), t((4, 3, 3, 3)), t((4,)), (1, 1), (0, 0, 0, 0), (1, 1), 1, 0, "plain"),
        (t((1, 4, 7, 6), "T"), t((2, 4, 3, 2)), None, (2, 1), (1, 1, 1, 1), (1, 1), 1, 1, "T"),
        (t((2, 6, 6, 5), "flip"), t((3, 2, 2, 2)), t((3,)), (1, 1), (1, 2, 1, 2), (2, 3), 3,
         "same", "groups-same"),
        (t((0, 3, 4, 4)), t((2, 3, 2, 2)), None, (1, 1), (0, 0, 0, 0), (1, 1), 1, 0, "empty"),
        (t((2, 3, 7, 6)), t((6, 1, 3, 3)), t((6,)), (2, 2), (1, 1, 1, 1), (1, 1), 3, 1,
         "depthwise-multiplier"),
    ]  # fmt: skip


@sample_of("conv2d", dtypes=NN_DTYPES)
def _conv2d(fn, d, t):
    return [
        S(fn, x, w, b, stride=s, padding=pub, dilation=dil, groups=g, label=label)
        for x, w, b, s, _, dil, g, pub, label in _conv_cases(t)
    ]


@sample_of("conv2d_relu", dtypes=NN_DTYPES)
def _conv2d_relu(fn, d, t):
    return [
        S(fn, x, w, b, s, pad, dil, g, label=label)
        for x, w, b, s, pad, dil, g, _, label in _conv_cases(t)
        if label in ("plain", "T", "empty", "depthwise-multiplier")
    ]


@sample_of("conv2d_backward_input", "conv2d_backward_weight", dtypes=NN_DTYPES)
def _conv2d_backward(fn, d, t):
    out = []
    for x, w, _, s, pad, dil, g, _, label in _conv_cases(t):
        grad = t((x.shape[0], w.shape[0], *_conv_output(x, w, s, pad, dil)), "flip")
        if fn.name == "conv2d_backward_input":
            out.append(S(fn, grad, w, x, s, pad, dil, g, label=label))
        else:
            out.append(S(fn, grad, x, w.shape, s, pad, dil, g, True, label=label))
            if label in ("plain", "T"):  # a convolution without bias: no grad_bias
                out.append(S(fn, grad, x, w.shape, s, pad, dil, g, False, label=label + "-no-bias"))
    return out


def _resample_cases(t):
    """(input, rows, cols, row weights, col weights, label): an NHWC view and bilinear
    weights, bicubic's four taps and three in either layout, a transposed view with one
    tap (a gather), an empty batch"""
    nhwc = F.to_layout(t((2, 3, 4, 5)), "NHWC")
    return [
        (nhwc, t.ints((7, 2), 0, 4), t.ints((3, 2), 0, 5), t((7, 2), lo=0, hi=1),
         t((3, 2), lo=0, hi=1), "nhwc-weights"),
        (nhwc, t.ints((6, 3), 0, 4), t.ints((2, 3), 0, 5), t((6, 3)), t((2, 3)), "nhwc-3-taps"),
        (t((2, 3, 5, 4)), t.ints((8, 4), 0, 5), t.ints((3, 4), 0, 4), t((8, 4)), t((3, 4)),
         "4-taps"),
        (t((1, 2, 5, 4), "T"), t.ints((6, 1), 0, 5), t.ints((9, 1), 0, 4), None, None,
         "T-gather"),
        (t((0, 2, 3, 3)), t.ints((4, 1), 0, 3), t.ints((2, 1), 0, 3), None, None, "empty"),
    ]  # fmt: skip


@sample_of("resample2d", "resample2d_backward", dtypes=NN_DTYPES)
def _resample2d(fn, d, t):
    out = []
    for x, rows, cols, rw, cw, label in _resample_cases(t):
        if fn.name == "resample2d":
            args = (x, rows, cols, rw, cw)
        else:
            args = (t((*x.shape[:-2], rows.shape[0], cols.shape[0]), "flip"), rows, cols, rw, cw, x)
        # the tables and their weights are constants (interpolate's, pad's): no gradient
        out.append(Sample(fn, args, label=label, grad_args=(0,)))
    return out


@sample_of("linear", dtypes=NN_DTYPES)
def _linear(fn, d, t):
    return [
        S(fn, t((2, 3, 4)), t((5, 4)), t((5,)), label="3d"),
        S(fn, t((4,), "flip"), t((2, 4), "T"), label="1d-T"),
        S(fn, t((0, 4)), t((3, 4)), t((3,)), label="empty"),
    ]


@sample_of("linear_relu", dtypes=NN_DTYPES)
def _linear_relu(fn, d, t):
    return [
        S(fn, t((2, 3, 4)), t((5, 4)), t((5,)), label="3d"),
        S(fn, t((4,), "flip"), t((2, 4), "T"), None, label="1d-T-no-bias"),
        S(fn, t((0, 4)), t((3, 4)), t((3,)), label="empty"),
    ]


def _pool_cases(t):
    """(input, kernel, stride, padding, dilation, ceil_mode, label), canonical pairs"""
    return [
        (t((2, 3, 6, 5)), (2, 2), (2, 2), (0, 0), (1, 1), False, "plain"),
        (t((1, 2, 5, 7), "T"), (3, 2), (1, 2), (1, 1), (1, 1), True, "T-ceil"),
        (t((2, 2, 7, 7), "flip"), (2, 3), (2, 1), (1, 0), (2, 2), False, "flip-dilated"),
        (t((0, 2, 4, 4)), (2, 2), (2, 2), (0, 0), (1, 1), False, "empty"),
    ]


POOLS = ("max_pool2d", "min_pool2d", "max_pool2d_with_indices", "min_pool2d_with_indices")


@sample_of(*POOLS, dtypes=NN_DTYPES)
def _pool(fn, d, t):
    return [S(fn, *case[:-1], label=case[-1]) for case in _pool_cases(t)]


@sample_of("pool2d_scatter", "pool2d_gather", dtypes=NN_DTYPES)
def _pool_indices(fn, d, t):
    out = []
    for x, k, s, p, dil, ceil, label in _pool_cases(t):
        values, indices = F.max_pool2d_with_indices(x, k, s, p, dil, ceil)
        if fn.name == "pool2d_scatter":
            out.append(S(fn, t(values.shape, "flip"), indices, x.shape, label=label))
        else:
            out.append(S(fn, t(x.shape, "flip"), indices, label=label))
    return out


def _avg_cases(t):
    """(input, kernel, stride, padding, ceil_mode, count_include_pad, divisor, label)"""
    return [
        (t((2, 3, 6, 5)), (2, 2), (2, 2), (0, 0), False, True, None, "plain"),
        (t((1, 2, 5, 7), "T"), (3, 2), (1, 2), (1, 1), True, False, None, "T-ceil-nopad"),
        (t((2, 2, 5, 5), "flip"), (2, 3), (2, 1), (1, 1), False, True, 4, "flip-divisor"),
        (t((0, 2, 4, 4)), (2, 2), (2, 2), (0, 0), False, True, None, "empty"),
    ]


@sample_of("avg_pool2d", dtypes=NN_DTYPES)
def _avg_pool(fn, d, t):
    return [S(fn, *case[:-1], label=case[-1]) for case in _avg_cases(t)]


@sample_of("avg_pool2d_backward", dtypes=NN_DTYPES)
def _avg_pool_backward(fn, d, t):
    out = []
    for case in _avg_cases(t):
        shape = F.avg_pool2d(*case[:-1]).shape
        out.append(S(fn, t(shape, "flip"), *case[:-1], label=case[-1]))
    return out


@sample_of("adaptive_avg_pool2d", dtypes=NN_DTYPES)
def _adaptive(fn, d, t):
    return [
        S(fn, t((2, 3, 7, 5)), 3, label="3"),
        S(fn, t((1, 2, 6, 4), "T"), (4, None), label="T-keep-width"),
        S(fn, t((2, 2, 5, 5), "flip"), (5, 2), label="flip"),
        S(fn, t((0, 2, 4, 4)), 2, label="empty"),
    ]


@sample_of("adaptive_avg_pool2d_backward", dtypes=NN_DTYPES)
def _adaptive_backward(fn, d, t):
    return [
        S(fn, t((2, 3, 3, 3)), t((2, 3, 7, 5)), label="3"),
        S(fn, t((1, 2, 4, 4), "flip"), t((1, 2, 6, 4), "T"), label="T"),
        S(fn, t((0, 2, 2, 2)), t((0, 2, 4, 4)), label="empty"),
    ]


def _lrn_cases(t):
    return [
        (t((2, 5, 3, 2)), 3, 1e-2, 0.75, 1.0, "4d"),
        (t((2, 4, 3), "T"), 2, 0.5, 0.5, 2.0, "T-3d"),
        (t((0, 3, 2, 2)), 5, 1e-4, 0.75, 1.0, "empty"),
    ]


@sample_of("native_local_response_norm", dtypes=NN_DTYPES)
def _lrn(fn, d, t):
    return [S(fn, *case[:-1], label=case[-1]) for case in _lrn_cases(t)]


@sample_of("local_response_norm_backward", dtypes=NN_DTYPES)
def _lrn_backward(fn, d, t):
    out = []
    for x, *rest, label in _lrn_cases(t):
        result, scale = OPERATORS["native_local_response_norm"](x, *rest)
        out.append(S(fn, t(x.shape, "flip"), x, result, scale, *rest, label=label))
    return out


def _bn_cases(t):
    """(input, weight, bias, running_mean, running_var, training, label)"""
    stats = lambda c: (t((c,)), t((c,), lo=0.5, hi=2))
    return [
        (t((4, 3, 2, 2)), t((3,)), t((3,)), *stats(3), True, "train"),
        (t((3, 2, 5), "T"), None, None, None, None, True, "T-no-affine"),
        (t((4, 3), "flip"), t((3,)), t((3,)), *stats(3), False, "eval"),
        (t((0, 2, 3)), t((2,)), t((2,)), *stats(2), False, "empty"),
    ]


@sample_of("native_batch_norm", dtypes=NN_DTYPES)
def _batch_norm(fn, d, t):
    out = [
        Sample(fn, (*case[:-1], 0.1, 1e-5, False), label=case[-1], grad_args=(0, 1, 2))
        for case in _bn_cases(t)
    ]
    out.append(Sample(fn, (*_bn_cases(t)[0][:-1], 0.1, 1e-5, True), label="relu"))
    out[-1].grad_args = (0, 1, 2)
    return out


@sample_of("native_batch_norm_backward", dtypes=NN_DTYPES)
def _batch_norm_backward(fn, d, t):
    out = []
    for x, w, b, rm, rv, training, label in _bn_cases(t):
        forward = OPERATORS["native_batch_norm"](x, w, b, rm, rv, training, 0.1, 1e-5, False)
        args = (t(x.shape, "flip"), x, w, *forward[1:], training)
        out.append(S(fn, *args, None, label=label))
        if label == "train":  # the fused batch norm + relu's backward gets its result
            out.append(S(fn, *args, F.relu(forward[0]), label="relu"))
    return out


def _ln_cases(t):
    """(input, normalized_shape, weight, bias, label)"""
    return [
        (t((3, 4, 5)), (5,), t((5,)), t((5,)), "last-axis"),
        (t((2, 3, 4), "T"), (3, 4), t((3, 4)), None, "T-two-axes"),
        (t((4, 6), "flip"), (6,), None, None, "flip-no-affine"),
        (t((0, 5)), (5,), t((5,)), t((5,)), "empty"),
    ]


@sample_of("native_layer_norm", dtypes=NN_DTYPES)
def _layer_norm(fn, d, t):
    return [S(fn, *case[:-1], 1e-5, label=case[-1]) for case in _ln_cases(t)]


@sample_of("native_layer_norm_backward", dtypes=NN_DTYPES)
def _layer_norm_backward(fn, d, t):
    out = []
    for x, shape, w, b, label in _ln_cases(t):
        _, mean, rstd = OPERATORS["native_layer_norm"](x, shape, w, b, 1e-5)
        out.append(S(fn, t(x.shape, "flip"), x, shape, mean, rstd, w, label=label))
    return out


def _lstm_cases(t):
    """(gates, c, label): a layer's states in columns, a cell's in rows (gates a strided
    view), one row, none."""
    return [
        (t((4, 5, 3), lo=-3, hi=3), t((5, 3)), "columns"),
        (lm.moveaxis(lm.reshape(t((3, 20)), (3, 4, 5)), 1, 0), t((3, 5)), "rows"),
        (t((4, 1, 2)), t((1, 2), "T"), "T-state"),
        (t((4, 0, 3)), t((0, 3)), "empty"),
    ]


@sample_of("native_lstm_cell", dtypes=NN_DTYPES)
def _lstm_cell(fn, d, t):
    return [S(fn, gates, c, label=label) for gates, c, label in _lstm_cases(t)]


@sample_of("native_lstm_cell_backward", dtypes=NN_DTYPES)
def _lstm_cell_backward(fn, d, t):
    out = []
    for k, (gates, c, label) in enumerate(_lstm_cases(t)):
        _, c_next, activations = OPERATORS["native_lstm_cell"](gates, c)
        grads = [(t(c.shape), t(c.shape, "T")), (None, t(c.shape)), (t(c.shape), None)][k % 3]
        out.append(S(fn, *grads, c, c_next, activations, label=label))
    return out


def _lstm_sequence_cases(t):
    """(projections, h0, c0, weight_hh, label): H 3, L 4, N 2 with states as a layer's
    (transposed views) and projections a strided view; N 1, L 1, H 1; L 0; N 0."""
    return [
        (t((12, 8, 2), lo=-1, hi=1)[:, ::2], t((3, 2), "T"), t((3, 2), "T"), t((12, 3)), "views"),
        (t((4, 1, 1)), t((1, 1)), t((1, 1)), t((4, 1), "T"), "one"),
        (t((8, 0, 3)), t((2, 3)), t((2, 3)), t((8, 2)), "no-steps"),
        (t((8, 3, 0)), t((2, 0)), t((2, 0)), t((8, 2)), "no-batch"),
    ]


@sample_of("native_lstm_sequence", dtypes=NN_DTYPES)
def _lstm_sequence(fn, d, t):
    return [S(fn, *case[:4], label=case[4]) for case in _lstm_sequence_cases(t)]


@sample_of("native_lstm_sequence_backward", dtypes=NN_DTYPES)
def _lstm_sequence_backward(fn, d, t):
    out = []
    for k, (xw, h0, c0, w, label) in enumerate(_lstm_sequence_cases(t)):
        output, _, _, cs, activations = OPERATORS["native_lstm_sequence"](xw, h0, c0, w)
        given = [
            (t(output.shape), t(h0.shape), t(h0.shape, "T")),
            (t(output.shape, "T"), None, None),
        ]
        grads = given[k % 2] if k != 1 else (None, None, t(h0.shape))
        out.append(S(fn, *grads, h0, c0, w, output, cs, activations, label=label))
    return out


def _gru_sequence_cases(t):
    """(projections, h0, weight_hh, bias_hh, label): H 3, L 4, N 2 with h0 as a
    layer's (a transposed view) and projections a strided view; N 1, L 1, H 1 without
    bias_hh; L 0; N 0."""
    return [
        (t((9, 8, 2), lo=-1, hi=1)[:, ::2], t((3, 2), "T"), t((9, 3)), t((9,)), "views"),
        (t((3, 1, 1)), t((1, 1)), t((3, 1), "T"), None, "one"),
        (t((6, 0, 3)), t((2, 3)), t((6, 2)), t((6,)), "no-steps"),
        (t((6, 3, 0)), t((2, 0)), t((6, 2)), None, "no-batch"),
    ]


@sample_of("native_gru_sequence", dtypes=NN_DTYPES)
def _gru_sequence(fn, d, t):
    return [S(fn, *case[:4], label=case[4]) for case in _gru_sequence_cases(t)]


@sample_of("native_gru_sequence_backward", dtypes=NN_DTYPES)
def _gru_sequence_backward(fn, d, t):
    out = []
    for k, (xw, h0, w, b, label) in enumerate(_gru_sequence_cases(t)):
        output, _, activations = OPERATORS["native_gru_sequence"](xw, h0, w, b)
        grads = [(t(output.shape), t(h0.shape, "T")), (t(output.shape, "T"), None)][k % 2]
        if k == 1:
            grads = (None, t(h0.shape))
        out.append(S(fn, *grads, h0, w, output, activations, label=label))
    return out


def _gn_cases(t):
    """(input, weight, bias, num_groups, label)"""
    return [
        (t((2, 4, 3, 2)), t((4,)), t((4,)), 2, "nchw"),
        (F.to_layout(t((2, 6, 3, 3)), "NHWC"), t((6,)), None, 3, "nhwc"),
        (t((3, 4, 5), "T"), None, None, 4, "T-3d"),
        (t((2, 6)), t((6,)), t((6,)), 1, "2d"),
        (t((0, 4, 2, 2)), None, None, 2, "empty"),
    ]


@sample_of("native_group_norm", dtypes=NN_DTYPES)
def _group_norm(fn, d, t):
    return [S(fn, *case[:-1], 1e-5, label=case[-1]) for case in _gn_cases(t)]


@sample_of("native_group_norm_backward", dtypes=NN_DTYPES)
def _group_norm_backward(fn, d, t):
    out = []
    for x, w, b, groups, label in _gn_cases(t):
        _, mean, rstd = OPERATORS["native_group_norm"](x, w, b, groups, 1e-5)
        grad = t(x.shape)
        grad = F.to_layout(grad, "NHWC") if label == "nhwc" else grad
        out.append(S(fn, grad, x, mean, rstd, w, groups, label=label))
    return out


def _embedding_indices(t):
    """(indices, num_embeddings, padding_idx, label): repeated indices and a padding row
    (not in smooth samples: its gradient is zero by definition, not by differences)."""
    padding = None if t.smooth else 1
    return [
        (t.ints((3, 5), 0, 10), 10, None, "2d"),
        (lm.asarray(np.array([[1, 1, 5], [0, 1, 1]])), 6, padding, "repeats-padding"),
        (lm.asarray(np.int64(3)), 4, None, "0d"),
        (t.ints((0,), 0, 5), 5, None, "empty"),
    ]


@sample_of("embedding", dtypes=NN_DTYPES)
def _embedding(fn, d, t):
    out = []
    for indices, rows, padding, label in _embedding_indices(t):
        weight = t((rows, 3), "flip" if label == "repeats-padding" else "c")
        out.append(S(fn, weight, indices, padding, label=label))
    return out


@sample_of("embedding_dense_backward", dtypes=NN_DTYPES)
def _embedding_backward(fn, d, t):
    return [
        S(fn, t((*indices.shape, 3)), indices, rows, padding, label=label)
        for indices, rows, padding, label in _embedding_indices(t)
    ]


@sample_of("native_scaled_dot_product_attention", dtypes=NN_DTYPES)
def _attention(fn, d, t):
    q, k, v = t((2, 3, 4, 2)), t((2, 3, 5, 2)), t((2, 3, 5, 3))
    keep = lm.asarray(np.array([[True, False, True, True, False]] * 3 + [[False] * 5]))
    keep = keep if not t.smooth else None  # -inf scores: no finite differences
    return [
        S(fn, q, k, v, None, False, 0.7, True, label="plain"),
        S(
            fn,
            t((3, 2), "T"),
            t((4, 2), "flip"),
            t((4, 3)),
            t((3, 4)),
            False,
            0.5,
            True,
            label="views-float-mask-unbatched",
        ),
        S(fn, q, k, v, keep, False, 1.0, False, label="bool-mask-no-weights"),
        S(fn, t((1, 4, 2)), t((1, 4, 2)), t((1, 4, 2)), None, True, 0.5, True, label="causal"),
        S(fn, t((0, 4, 2)), t((0, 5, 2)), t((0, 5, 3)), None, False, 1.0, True, label="empty"),
    ]


@sample_of("native_scaled_dot_product_attention_backward", dtypes=NN_DTYPES)
def _attention_backward(fn, d, t):
    def case(q, k, v, is_causal, label):  # the weights the forward saves
        forward = OPERATORS["native_scaled_dot_product_attention"]
        weights = forward(q, k, v, None, is_causal, 0.5, True)[1]
        grad = t((*q.shape[:-1], v.shape[-1]), "flip")
        return S(fn, grad, q, k, v, weights, 0.5, label=label)

    return [
        case(t((2, 3, 4, 2)), t((2, 3, 5, 2)), t((2, 3, 5, 3)), False, "plain"),
        case(t((3, 2), "T"), t((4, 2), "flip"), t((4, 3)), False, "views-unbatched"),
        case(t((1, 4, 2)), t((1, 4, 2)), t((1, 4, 2)), True, "causal"),
        case(t((0, 4, 2)), t((0, 5, 2)), t((0, 5, 3)), False, "empty"),
    ]


@sample_of("relu", "sigmoid", dtypes=NN_DTYPES)
def _activation(fn, d, t):
    return [
        S(fn, t((3, 4)), label="2d"),
        S(fn, t((2, 3, 4), "T"), label="T"),
        S(fn, t(()), label="0d"),
        S(fn, t((0, 3)), label="empty"),
    ]


@sample_of("leaky_relu", "gelu", dtypes=NN_DTYPES)
def _param_activation(fn, d, t):
    option = (0.2,) if fn.__name__ == "leaky_relu" else ("tanh",)
    return [
        S(fn, t((3, 4)), label="default"),
        S(fn, t((2, 3, 4), "T"), *option, label="T-option"),
        S(fn, t(()), *option, label="0d"),
        S(fn, t((0, 3)), label="empty"),
    ]


@sample_of("silu", "hardswish", "hardtanh", dtypes=NN_DTYPES)
def _more_activations(fn, d, t):
    bounds = (-0.5, 0.25) if fn.__name__ == "hardtanh" else ()
    return [
        S(fn, t((2, 3, 4), "T", lo=-4, hi=4), *bounds, label="T"),
        S(fn, t(()), label="0d"),
        S(fn, t((0, 3)), label="empty"),
    ]


@sample_of(
    "silu_backward",
    "tanh_backward",
    "sigmoid_backward",
    "hardswish_backward",
    "hardtanh_backward",
    dtypes=NN_DTYPES,
)
def _more_activations_backward(fn, d, t):
    bounds = (-0.5, 0.25) if fn.name == "hardtanh_backward" else ()
    return [
        S(fn, t((2, 3, 4)), t((2, 3, 4), "T", lo=-4, hi=4), *bounds, label="T"),
        S(fn, t(()), t(()), *bounds, label="0d"),
        S(fn, t((0, 3)), t((0, 3)), *bounds, label="empty"),
    ]


@sample_of("relu_backward", "leaky_relu_backward", "gelu_backward", dtypes=NN_DTYPES)
def _activation_backward(fn, d, t):
    option = {"relu_backward": (), "leaky_relu_backward": (0.2,)}.get(fn.name)
    cases = [((3, 4), "c", "2d"), ((2, 3, 4), "T", "T"), ((), "c", "0d"), ((0, 3), "c", "empty")]
    out = []
    for i, (shape, layout, label) in enumerate(cases):
        extra = option if option is not None else (("none", "tanh")[i % 2],)
        x = t(shape, layout)
        if fn.name == "relu_backward":  # a result of relu: smooth ones have no zeros
            x = t(shape, layout, lo=0.1) if t.smooth else F.relu(x)
        out.append(S(fn, t(shape, "c"), x, *extra, label=label))
    return out


@sample_of("softmax", "log_softmax", dtypes=NN_DTYPES)
def _softmax(fn, d, t):
    return [
        S(fn, t((3, 4)), 1, label="rows"),
        S(fn, t((2, 3, 4), "T"), 0, label="T-axis0"),
        S(fn, t((5,), "flip"), -1, label="flip"),
        S(fn, t((0, 3)), 1, label="empty"),
    ]


@sample_of("softmax_backward", "log_softmax_backward", dtypes=NN_DTYPES)
def _softmax_backward(fn, d, t):
    forward = F.softmax if fn.name == "softmax_backward" else F.log_softmax
    return [
        S(fn, t((3, 4)), forward(t((3, 4)), 1), 1, label="rows"),
        S(fn, t((2, 3, 4)), forward(t((2, 3, 4), "T"), 0), 0, label="T-axis0"),
        S(fn, t((0, 3)), forward(t((0, 3)), 1), 1, label="empty"),
    ]


@sample_of("nll_loss", dtypes=NN_DTYPES)
def _nll(fn, d, t):
    return [
        S(fn, F.log_softmax(t((4, 3)), 1), t.ints((4,), 0, 3), label="mean"),
        Sample(fn, (t((2, 3, 4), "T"), t.ints((2, 4), 0, 3), t((3,), lo=0.5, hi=2), 1, "sum"),
               label="T-weight-ignore", grad_args=(0,)),  # no gradient for the weights
        S(fn, t((3,), "flip"), lm.asarray(2), None, -100, "none", label="1d"),
        S(fn, t((2, 3, 4)), t.ints((4, 2), 0, 3).T, None, -100, "none", label="T-target"),
        S(fn, t((0, 3)), t.ints((0,), 0, 3), None, -100, "none", label="empty"),
    ]  # fmt: skip


@sample_of("cross_entropy_loss", dtypes=NN_DTYPES)
def _cross_entropy(fn, d, t):
    return [
        S(fn, t((4, 3)), t.ints((4,), 0, 3), -100, label="mean"),
        S(fn, t((3, 5), "T"), lm.asarray([4, -1, 0]), -1, label="T-ignore"),
        S(fn, t((0, 3)), t.ints((0,), 0, 3), -100, label="empty"),
    ]


@sample_of("cross_entropy_loss_backward", dtypes=NN_DTYPES)
def _cross_entropy_backward(fn, d, t):
    return [
        S(fn, t(()), t((4, 3)), t.ints((4,), 0, 3), -100, label="mean"),
        S(fn, t(()), t((3, 5), "T"), lm.asarray([4, -1, 0]), -1, label="T-ignore"),
        S(fn, t(()), t((0, 3)), t.ints((0,), 0, 3), -100, label="empty"),
    ]


@sample_of("nll_loss_backward", dtypes=NN_DTYPES)
def _nll_backward(fn, d, t):
    ints = t.ints
    return [
        S(fn, t(()), t((4, 3)), ints((4,), 0, 3), None, -100, "mean", label="mean"),
        Sample(fn, (t(()), t((2, 3, 4), "T"), ints((4, 2), 0, 3).T, t((3,), lo=0.5, hi=2), 1,
                    "sum"), label="T-weight-ignore", grad_args=(0,)),  # none for the weights
        S(fn, t((3,)), t((3, 4)), ints((3, 2), 0, 4)[:, 0], None, -100, "none", label="none"),
        S(fn, t(()), t((3,), "flip"), lm.asarray(2), None, -100, "mean", label="1d"),
        S(fn, t((0,)), t((0, 3)), ints((0,), 0, 3), None, -100, "none", label="empty"),
    ]  # fmt: skip


@sample_of("mse_loss", dtypes=NN_DTYPES)
def _mse(fn, d, t):
    return [
        S(fn, t((3, 4)), t((3, 4), "T"), label="mean"),
        S(fn, t((5,), "flip"), t((5,)), "sum", label="sum"),
        S(fn, t(()), t(()), "none", label="0d"),
        S(fn, t((0, 3)), t((0, 3)), "none", label="empty"),
    ]


@sample_of("smooth_l1_loss", dtypes=NN_DTYPES)
def _smooth_l1(fn, d, t):
    return [
        S(fn, t((3, 4)), t((3, 4), "T"), label="mean"),
        S(fn, t((5,), "flip"), t((5,)), "sum", 0.5, label="sum-beta"),
        S(fn, t((2, 3)), t((2, 3)), "none", 0.0, label="none-l1"),
        S(fn, t((0, 3)), t((0, 3)), "none", label="empty"),
    ]


@sample_of("smooth_l1_loss_backward", dtypes=NN_DTYPES)
def _smooth_l1_backward(fn, d, t):
    return [
        S(fn, t(()), t((3, 4)), t((3, 4), "T"), "mean", 1.0, label="mean"),
        S(fn, t(()), t((5,), "flip"), t((5,)), "sum", 0.0, label="sum-l1"),
        S(fn, t((2, 3)), t((2, 3)), t((2, 3)), "none", 0.5, label="none"),
        S(fn, t(()), t((0, 3)), t((0, 3)), "mean", 1.0, label="empty"),
    ]


@sample_of("binary_cross_entropy_with_logits", dtypes=NN_DTYPES)
def _bce_with_logits(fn, d, t):
    weights = (t((3,), lo=0.5, hi=2), "sum", t((3,), lo=0.5, hi=3))
    return [
        S(fn, t((3, 4), lo=-4, hi=4), t((3, 4), "T", lo=0, hi=1), label="mean"),
        Sample(fn, (t((2, 3), "flip"), t((2, 3), lo=0, hi=1), *weights),
               label="weights", grad_args=(0, 1)),  # no gradient for the weights
        S(fn, t(()), t((), lo=0, hi=1), None, "none", label="0d"),
        S(fn, t((0, 3)), t((0, 3), lo=0, hi=1), None, "none", label="empty"),
    ]  # fmt: skip


for _op in OPERATORS.values():
    if _op.category == "elementwise" and _op.name not in TABLE:
        TABLE[_op.name] = _elementwise(_op.name)


# ---------------------------------------------------------------- the public API


def dtypes(name):
    """The dtypes operator ``name``'s samples are made in."""
    return TABLE[name][0]


def samples(name, dtype=None, smooth=False):
    """Fresh sample calls of operator ``name``: every dtype of ``dtypes(name)``, or
    just ``dtype``; with ``smooth``, values where it is differentiable (module doc)."""
    table_dtypes, build = TABLE[name]
    out = []
    for d in table_dtypes if dtype is None else (dtype,):
        for s in build(d, Maker(name, d, smooth)):
            s.label = f"{name}-{d}-{s.label}"
            out.append(s)
    return out
