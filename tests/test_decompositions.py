"""Decompositions (dispatch/decompositions.py) against the CPU kernels of their operators.

Each sample is a call that reaches the operator; a spy on the operator's CPU table slot
catches the arguments its kernel gets (canonical, as a decomposition gets them), and the
decomposition must then give the kernel's result: the same dtype and shape, equal
integers and bools, floats within the tolerance of its documented accuracy. Every
decomposition is run twice: on the CPU kernels, and with only the core set's kernels in
place (every other operator served by its decomposition, as on a new device), which
also records which operators each decomposition calls: that graph must be acyclic and
bottom out in the core set.
"""

import contextlib
import math

import numpy as np
import pytest

import lamina as lm
from lamina.dispatch import decompositions, keys
from lamina.dispatch.decompositions import DECOMPOSITIONS, core_operators
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import Tensor

pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]

CPU = keys.CPU.bit_length()
COPY = OPERATORS["copy"].winners[keys.CPU].fn  # the kernel: spies copy arguments with it
CORE = core_operators()
RNG = np.random.default_rng(7)


def T(shape, dtype="float64", low=-2.0, high=2.0):
    """A tensor of uniform values in [low, high) (integers: rounded)."""
    data = RNG.uniform(low, high, shape)
    if np.dtype(dtype).kind == "c":
        data = data + 1j * RNG.uniform(low, high, shape)
    return lm.asarray(np.asarray(np.round(data) if np.dtype(dtype).kind in "iub" else data, dtype))


def A(values, dtype="float64"):
    return lm.asarray(np.asarray(values, dtype))


def nc(shape, dtype="float64", **kw):
    """A non-contiguous tensor of ``shape`` (every other column of a wider one)."""
    wide = T((*shape[:-1], 2 * shape[-1]), dtype, **kw)
    return wide[..., ::2]


F = lm.nn.functional

# name -> calls that reach it. Domains: values where the operator is finite; specials
# (signed zeros, infinities, NaN, tiny values) where a decomposition guards them.
SPECIALS = [
    0.0,
    -0.0,
    1e-300,
    -1e-12,
    1e-8,
    0.25,
    0.5,
    2.5,
    -3.5,
    40.0,
    math.inf,
    -math.inf,
    math.nan,
]
DOMAINS = {
    "log1p": (-0.9, 3.0),
    "log2": (0.1, 8.0),
    "log10": (0.1, 8.0),
    "asin": (-0.99, 0.99),
    "acos": (-0.99, 0.99),
    "atanh": (-0.99, 0.99),
    "acosh": (1.0, 9.0),
    "reciprocal": (0.5, 3.0),
}
FLOAT_UNARY = [
    "expm1", "log1p", "log2", "log10", "tan", "atan", "asin", "acos", "sinh", "cosh",
    "tanh", "asinh", "acosh", "atanh", "reciprocal",
]  # fmt: skip


def _float_unary(name):
    low, high = DOMAINS.get(name, (-2.0, 2.0))
    fn = getattr(lm, name)
    return [
        lambda: fn(T((7,), "float32", low, high)),
        lambda: fn(nc((3, 4), "float64", low=low, high=high).mT),
        lambda: fn(A(SPECIALS)),
        lambda: fn(T((5,), "int32", max(low, 1.0), high + 2)),
        lambda: fn(T((0, 3), "float64")),
        lambda: fn(A(0.5 * (low + high))),
        lambda: fn(T((4,), "complex128", -0.9, 0.9)),
    ]


SAMPLES = {name: _float_unary(name) for name in FLOAT_UNARY}


def _bound(samples, fn):
    """Samples written for any function (``lambda fn: fn(...)``) bound to ``fn``."""
    return [lambda s=s: s(fn) for s in samples]


ANY_NUMBERS = [
    lambda fn: fn(T((6,), "float32")),
    lambda fn: fn(nc((2, 3), "float64").mT),
    lambda fn: fn(A(SPECIALS)),
    lambda fn: fn(T((5,), "int16", -50, 50)),
    lambda fn: fn(T((5,), "uint8", 0, 250)),
    lambda fn: fn(T((0,), "float64")),
    lambda fn: fn(A(-1.5)),
    lambda fn: fn(T((4,), "complex128")),
]
for name, samples in {
    "positive": ANY_NUMBERS,
    "square": ANY_NUMBERS,
    "abs": ANY_NUMBERS,
    "sign": ANY_NUMBERS,
    "round": ANY_NUMBERS + [lambda fn: fn(A([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999999999999994]))],
    "ceil": ANY_NUMBERS[:6],
    "trunc": ANY_NUMBERS[:6],
    "signbit": ANY_NUMBERS[:4],
    "isnan": ANY_NUMBERS,
    "isinf": ANY_NUMBERS
    + [lambda fn: fn(A([complex(math.inf, math.nan), complex(math.nan, 1), 1j], "complex128"))],
    "isfinite": ANY_NUMBERS + [lambda fn: fn(A([True, False], "bool"))],
    "logical_not": ANY_NUMBERS + [lambda fn: fn(A([True, False], "bool"))],
    "bitwise_invert": [
        lambda fn: fn(T((5,), "int16", -50, 50)),
        lambda fn: fn(A([0, 1, 255], "uint8")),
        lambda fn: fn(A([True, False], "bool")),
        lambda fn: fn(A([-(2**63), 2**63 - 1], "int64")),
    ],
}.items():
    SAMPLES[name] = _bound(samples, getattr(lm, name))

BINARY_NUMBERS = [
    lambda fn: fn(T((2, 3), "float32"), T((3,), "float32")),
    lambda fn: fn(nc((3, 2), "float64"), T((3, 1), "float64")),
    lambda fn: fn(T((4,), "int32", -9, 9), T((4,), "int32", 1, 5)),
    lambda fn: fn(A([3, 200, 7], "uint8"), A([5, 100, 7], "uint8")),
    lambda fn: fn(T((4,), "float64"), 2),
    lambda fn: fn(1.5, T((4,), "int16", -5, 5)),
    lambda fn: fn(A([3, 200], "uint8"), 7),
    lambda fn: fn(T((0, 2), "float64"), T((2,), "float64")),
    lambda fn: fn(A(2.0), A([1.0, -0.0, math.inf, math.nan])),
]
BINARY_REAL_FLOAT = [
    lambda fn: fn(T((2, 3), "float32"), T((3,), "float32")),
    lambda fn: fn(nc((3, 2), "float64"), T((3, 1), "float64")),
    lambda fn: fn(A(SPECIALS), A(SPECIALS[::-1])),
    lambda fn: fn(T((4,), "int32", -9, 9), 2.5),
    lambda fn: fn(-0.0, T((4,), "float64")),
    lambda fn: fn(T((0,), "float64"), 1.0),
]
BITWISE = [
    lambda fn: fn(T((5,), "int16", -300, 300), T((5,), "int16", -300, 300)),
    lambda fn: fn(A([3, 200, 255], "uint8"), A([5, 100, 1], "uint8")),
    lambda fn: fn(A([True, False, True], "bool"), A([True, True, False], "bool")),
    lambda fn: fn(T((2, 3), "int64", -(10**12), 10**12), 12345),
    lambda fn: fn(T((4,), "int8", -100, 100), A([2**62, -1], "int64")[:, None]),
]
SHIFTS = [
    lambda fn: fn(T((5,), "int16", -300, 300), A([0, 1, 3, 15, 16], "int16")),
    lambda fn: fn(A([3, 200, 255, 1], "uint8"), A([0, 1, 7, 9], "uint8")),
    lambda fn: fn(A([-(2**63), 5, -7], "int64"), A([1, 62, 63], "int64")),
    lambda fn: fn(T((2, 3), "int32", -99, 99), 2),
    lambda fn: fn(A([5, -5, 7], "int32"), A([-1, -3, 40], "int32")),
]
COMPARE = BINARY_NUMBERS + [
    lambda fn: fn(A([True, False], "bool"), A([False, False], "bool")),
    lambda fn: fn(A(SPECIALS), A(SPECIALS[::-1])),
]
for names, samples in {
    ("subtract", "maximum", "minimum"): BINARY_NUMBERS[:8],
    ("remainder",): BINARY_NUMBERS[:7]
    + [
        lambda fn: fn(A([5, -5, 7], "int32"), A([0, 3, -2], "int32")),
        lambda fn: fn(
            A([3.0, -3.0, 0.0, 3.0, math.inf]), A([math.inf, math.inf, -math.inf, -math.inf, 2.0])
        ),
    ],
    ("copysign", "hypot", "logaddexp"): BINARY_REAL_FLOAT,
    ("bitwise_or", "bitwise_xor"): BITWISE,
    ("bitwise_left_shift", "bitwise_right_shift"): SHIFTS,
    ("not_equal", "greater", "greater_equal", "less_equal"): COMPARE,
    ("logical_and", "logical_or", "logical_xor"): COMPARE + [lambda fn: fn(T((3,), "float64"), 0)],
}.items():
    for name in names:
        SAMPLES[name] = _bound(samples, getattr(lm, name))
SAMPLES["subtract"].append(lambda: lm.subtract(T((3,), "complex128"), 1j))
SAMPLES["clip"] = [
    lambda: lm.clip(T((5,), "float32"), -0.5, 0.5),
    lambda: lm.clip(nc((2, 3)), min=T((3,))),
    lambda: lm.clip(A([1.0, math.nan, -3.0]), max=0.0),
    lambda: lm.clip(T((4,), "int32", -9, 9), -3, 4),
    lambda: lm.clip(T((4,), "int32", -9, 9)),
]

# in-place variants: a fresh x1 each time (the spy's copy), broadcasting x2
for name in [n for n, op in OPERATORS.items() if op.inplace_of is not None]:
    base = name.removesuffix("_")
    dtype = {"divide": "float64", "atan2": "float64", "copysign": "float64", "hypot": "float32",
             "logaddexp": "float64", "pow": "float64"}.get(base, "int32")  # fmt: skip
    if base in ("add", "subtract", "multiply", "maximum", "minimum"):
        dtype = "float32"
    low = 1 if "shift" in base or base in ("floor_divide", "remainder") else -5
    SAMPLES[name] = [
        lambda op=OPERATORS[name], d=dtype, lo=low: op(T((2, 3), d, lo, 5), T((3,), d, lo, 5)),
        lambda op=OPERATORS[name], d=dtype, lo=low: op(nc((2, 2), d, low=lo, high=5), 2),
    ]

REDUCED = [
    lambda fn: fn(T((3, 4), "float32")),
    lambda fn: fn(nc((2, 3, 4), "float64"), axis=(0, 2), keepdims=True),
    lambda fn: fn(T((4, 5), "int32", -9, 9), axis=1),
    lambda fn: fn(A(SPECIALS[:10])),
    lambda fn: fn(A(2.5)),
]
for name in ("mean", "var", "std", "min", "argmin", "any", "all"):
    fn = getattr(lm, name)
    samples = REDUCED + [lambda fn: fn(A([[True, False], [False, False]], "bool"), axis=0)]
    if name in ("any", "all"):
        samples = samples + [
            lambda fn: fn(T((0, 3), "float64"), axis=0),
            lambda fn: fn(T((3, 4), "complex128")),
        ]
    if name in ("mean", "var", "std"):
        samples = samples[:4] + [
            lambda fn: fn(T((3, 2), "complex128"), axis=0),
            lambda fn: fn(T((0, 3)), axis=0),
        ]
    if name in ("argmin",):
        samples = [
            samples[0],
            samples[3],
            lambda fn: fn(T((4, 5), "int32", -9, 9), axis=1, keepdims=True),
            lambda fn: fn(A([[True, False], [False, True]], "bool"), axis=0),
            lambda fn: fn(A([3, 1, 1, 255], "uint8")),
            lambda fn: fn(A([1.0, math.nan, -2.0])),
        ]
    SAMPLES[name] = [lambda s=s, fn=fn: s(fn) for s in samples]
SAMPLES["var"].append(lambda: lm.var(T((4, 3)), axis=0, correction=1))
SAMPLES["std"].append(lambda: lm.std(T((1, 3)), axis=0, correction=1))
SAMPLES["vector_norm"] = [
    lambda: lm.linalg.vector_norm(T((3, 4), "float32")),
    lambda: lm.linalg.vector_norm(nc((2, 3)), axis=1, ord=1),
    lambda: lm.linalg.vector_norm(T((2, 3)), axis=0, ord=math.inf, keepdims=True),
    lambda: lm.linalg.vector_norm(T((2, 3)), ord=-math.inf),
    lambda: lm.linalg.vector_norm(A([0.0, 2.0, -1.0]), ord=0),
    lambda: lm.linalg.vector_norm(T((5,), "complex128"), ord=3),
    lambda: lm.linalg.vector_norm(T((4,), "int32", -5, 5)),
]
for name in ("cumulative_sum", "cumulative_prod"):
    fn = getattr(lm, name)
    SAMPLES[name] = [
        lambda fn=fn: fn(T((7,), "float32", 0.5, 1.5)),
        lambda fn=fn: fn(nc((3, 5), "float64"), axis=1, include_initial=True),
        lambda fn=fn: fn(T((5, 2), "int32", -9, 9), axis=0),
        lambda fn=fn: fn(A([True, True, False, True], "bool")),
        lambda fn=fn: fn(T((0, 3)), axis=0, include_initial=True),
        lambda fn=fn: fn(T((4,), "uint8", 0, 9), dtype=lm.float64),
    ]

X4 = (2, 3, 4, 5)
SAMPLES.update(
    matrix_transpose=[lambda: lm.matrix_transpose(nc((2, 3, 4))), lambda: T((2, 3), "int32").mT],
    expand_dims=[
        lambda: lm.expand_dims(T((2, 3)), axis=-1),
        lambda: lm.expand_dims(A(1.0), axis=0),
    ],
    squeeze=[
        lambda: lm.squeeze(T((2, 1, 3, 1)), axis=(1, 3)),
        lambda: lm.squeeze(nc((1, 4)), axis=0),
    ],
    flip=[lambda: lm.flip(T((2, 3))), lambda: lm.flip(nc((2, 3, 2), "int32"), axis=(0, 2))],
    split=[
        lambda: lm.split(T((5, 2)), 2),
        lambda: lm.split(nc((2, 6), "int32"), [1, 3, 2], axis=1),
        lambda: lm.split(T((0, 2)), 3),
    ],
    diagonal=[
        lambda: lm.linalg.diagonal(T((3, 4))),
        lambda: lm.linalg.diagonal(nc((2, 4, 3)), offset=1),
        lambda: lm.linalg.diagonal(T((3, 4), "int32"), offset=-2),
        lambda: lm.linalg.diagonal(T((2, 3)), offset=5),
    ],
    to_layout=[
        lambda: F.to_layout(T(X4, "float32"), "NHWC"),
        lambda: F.to_layout(F.to_layout(T(X4), "NHWC"), "NCHW"),
        lambda: F.to_layout(nc(X4), "NCHW"),
    ],
    stack=[
        lambda: lm.stack([T((2, 3)), nc((2, 3))], axis=1),
        lambda: lm.stack([T((0,), "int32")] * 2),
    ],
    tensordot=[
        lambda: lm.tensordot(T((2, 3, 4)), T((4, 3, 5)), axes=([1, 2], [1, 0])),
        lambda: lm.tensordot(nc((3, 2), "float32"), T((2, 4), "float32"), axes=1),
        lambda: lm.tensordot(T((2, 3), "int32", -5, 5), T((3,), "int32", -5, 5), axes=1),
    ],
    vecdot=[
        lambda: lm.vecdot(T((2, 3)), T((3,))),
        lambda: lm.vecdot(T((3, 2), "complex128"), T((3, 2), "complex128"), axis=0),
        lambda: lm.vecdot(T((2, 4), "int32", -5, 5), nc((1, 4), "int32", low=-5, high=5)),
    ],
    det=[
        lambda: lm.linalg.det(T((3, 3))),
        lambda: lm.linalg.det(T((2, 4, 4), "float32")),
        lambda: lm.linalg.det(A([[1.0, 2.0], [2.0, 4.0]])),
    ],
    inv=[
        lambda: lm.linalg.inv(T((3, 3)) + lm.eye(3) * 4),
        lambda: lm.linalg.inv(nc((2, 3, 3), "float32") + lm.eye(3) * 4),
    ],
    eigvalsh=[lambda: lm.linalg.eigvalsh(T((3, 3)) + T((3, 3)).mT)],
    svdvals=[
        lambda: lm.linalg.svdvals(T((2, 4, 3))),
        lambda: lm.linalg.svdvals(T((3, 2), "float32")),
    ],
    copy=[lambda: OPERATORS["copy"](nc((2, 3))), lambda: OPERATORS["copy"](T((3,), "int8"))],
    to_dense=[lambda: T((2, 3)).to_dense()],
    empty=[lambda: lm.empty((2, 3)), lambda: lm.empty((0,), dtype=lm.int32)],
    eye=[
        lambda: lm.eye(3),
        lambda: lm.eye(2, 4, k=1, dtype=lm.int32),
        lambda: lm.eye(4, 3, k=-2, dtype=lm.bool),
    ],
    linspace=[
        lambda: lm.linspace(0, 1, 7),
        lambda: lm.linspace(-2.5, 3, 5, endpoint=False, dtype=lm.float64),
        lambda: lm.linspace(0, 10, 4, dtype=lm.int32),
        lambda: lm.linspace(1, 1, 1),
        lambda: lm.linspace(2, 5, 0),
    ],
    sort=[
        lambda: lm.sort(T((3, 5))),
        lambda: lm.sort(nc((4, 3), "int32", low=-3, high=3), axis=0, descending=True),
        lambda: lm.sort(A([2.0, math.nan, -1.0, 2.0])),
    ],
    searchsorted=[
        lambda: lm.searchsorted(
            A([1.0, 2.0, 2.0, 5.0, math.nan]), A([[0.0, 2.0], [5.0, math.nan]])
        ),
        lambda: lm.searchsorted(A([1, 3, 3, 9], "int32"), A([3, 4], "int32"), side="right"),
        lambda: lm.searchsorted(A([5.0, 1.0, 3.0]), 3.0, sorter=A([1, 2, 0], "int64")),
    ],
    nonzero=[
        lambda: lm.nonzero(A([[0, 1, 0], [2, 0, 3]], "int32")),
        lambda: lm.nonzero(A([0.0, 0.0])),
    ],
    unique_all=[
        lambda: lm.unique_all(A([3.0, 1.0, math.nan, 3.0, 1.0, math.nan])),
        lambda: lm.unique_all(T((3, 4), "int32", 0, 3)),
        lambda: lm.unique_all(T((0,))),
    ],
    unique_counts=[lambda: lm.unique_counts(A([2, 2, 1], "uint8"))],
    unique_inverse=[lambda: lm.unique_inverse(T((2, 3), "int32", 0, 2))],
    unique_values=[lambda: lm.unique_values(A([True, False, True], "bool"))],
)
for name in ("ifft", "rfft", "irfft", "hfft", "ihfft"):
    fn = getattr(lm.fft, name)
    real = name in ("rfft", "ihfft")
    SAMPLES[name] = [
        lambda fn=fn, r=real: fn(T((2, 8), "float64" if r else "complex128")),
        lambda fn=fn, r=real: fn(
            T((5, 3), "float32" if r else "complex64"), n=7, axis=0, norm="ortho"
        ),
        lambda fn=fn: fn(T((6,)), n=4, norm="forward"),
    ]
for name in ("fftn", "ifftn", "rfftn", "irfftn"):
    fn = getattr(lm.fft, name)
    SAMPLES[name] = [
        lambda fn=fn: fn(T((3, 4, 5))),
        lambda fn=fn: fn(
            T((4, 6), "complex128" if "r" not in name else "float64"),
            s=(3, 7),
            axes=(0, 1),
            norm="ortho",
        ),
        lambda fn=fn: fn(T((2, 3, 4)), axes=(0, 2), norm="forward"),
    ]

IMAGES = [
    lambda: T((2, 3, 6, 5), "float32"),
    lambda: T((1, 2, 5, 7)),
    lambda: F.to_layout(T((2, 4, 5, 6), "float32"), "NHWC"),
    lambda: T((3, 4, 4)),
]
POOL_WINDOWS = [
    dict(kernel_size=2),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=2, stride=1, dilation=(1, 2)),
]
AVG_WINDOWS = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(2, 3), padding=(1, 0), divisor_override=4),
]


def _pool_grad(name, image, window):
    x = image.requires_grad_()
    out = getattr(F, name)(x, **window)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(lm.ones_like(out) * T(out.shape, out.dtype.name))


SAMPLES.update(
    linear=[
        lambda: F.linear(T((4, 3)), T((5, 3)), T((5,))),
        lambda: F.linear(nc((2, 3, 3), "float32"), T((2, 3), "float32"), None),
    ],
    relu=[lambda: F.relu(A(SPECIALS)), lambda: F.relu(nc((2, 3), "float32"))],
    relu_backward=[
        lambda: OPERATORS["relu_backward"](T((5,)), A([1.0, -0.0, 0.0, math.nan, -2.0]))
    ],
    leaky_relu=[
        lambda: F.leaky_relu(A(SPECIALS), 0.1),
        lambda: F.leaky_relu(nc((2, 3), "float32"), 0.2),
    ],
    leaky_relu_backward=[lambda: OPERATORS["leaky_relu_backward"](T((5,)), T((5,)), 0.01)],
    gelu_backward=[
        lambda: OPERATORS["gelu_backward"](T((13,)), A(SPECIALS[:10] + [-9.0, 0.1, -0.1]), "none"),
        lambda: OPERATORS["gelu_backward"](T((4,), "float32"), T((4,), "float32", -5, 5), "tanh"),
        lambda: OPERATORS["gelu_backward"](T((6,), "float32"), T((6,), "float32", -30, 30), "none"),
    ],
    sigmoid=[lambda: F.sigmoid(A(SPECIALS)), lambda: F.sigmoid(nc((2, 3), "float32"))],
    silu=[lambda: F.silu(A(SPECIALS)), lambda: F.silu(nc((2, 3), "float32"))],
    silu_backward=[lambda: OPERATORS["silu_backward"](T((13,)), A(SPECIALS[:10] + [-9.0, 3, -3]))],
    tanh_backward=[lambda: OPERATORS["tanh_backward"](T((13,)), A(SPECIALS[:10] + [0.5, 1, -1]))],
    sigmoid_backward=[
        lambda: OPERATORS["sigmoid_backward"](T((13,)), A(SPECIALS[:10] + [0.5, 1, 0])),
        lambda: OPERATORS["sigmoid_backward"](nc((2, 3), "float32"), nc((2, 3), "float32")),
    ],
    hardtanh=[
        lambda: F.hardtanh(A(SPECIALS)),
        lambda: F.relu6(nc((2, 3), "float32", low=-2, high=8)),
    ],
    hardtanh_backward=[
        lambda: OPERATORS["hardtanh_backward"](T((13,)), A(SPECIALS[:10] + [6.0, 0.5, 7]), 0, 6)
    ],
    hardswish=[lambda: F.hardswish(A(SPECIALS + [-3.0, 3.0, 4.0]))],
    hardswish_backward=[
        lambda: OPERATORS["hardswish_backward"](T((13,)), A(SPECIALS[:10] + [-3.0, 3.0, 2.0]))
    ],
    softmax=[
        lambda: F.softmax(T((3, 4), "float32"), 1),
        lambda: F.softmax(nc((2, 3, 2)), 0),
        lambda: F.softmax(T((0, 3)), 1),
    ],
    log_softmax=[
        lambda: F.log_softmax(T((3, 4), "float32"), -1),
        lambda: F.log_softmax(A([[1.0, -math.inf, 2.0]]), 1),
    ],
    softmax_backward=[
        lambda: F.softmax(T((3, 4), "float32").requires_grad_(), 1).backward(T((3, 4), "float32")),
        lambda: OPERATORS["softmax_backward"](nc((2, 3)), F.softmax(T((2, 3)), 0), 0),
    ],
    log_softmax_backward=[
        lambda: F.log_softmax(T((3, 4), "float32").requires_grad_(), 1).backward(
            T((3, 4), "float32")
        ),
        lambda: OPERATORS["log_softmax_backward"](nc((2, 3)), F.log_softmax(T((2, 3)), 0), 0),
    ],
    mse_loss=[
        lambda: F.mse_loss(T((3, 4), "float32"), T((3, 4), "float32")),
        lambda: F.mse_loss(nc((2, 3)), T((2, 3)), reduction="sum"),
        lambda: F.mse_loss(T((2, 3)), T((2, 3)), reduction="none"),
    ],
    smooth_l1_loss=[
        lambda: F.smooth_l1_loss(T((3, 4), "float32"), T((3, 4), "float32")),
        lambda: F.smooth_l1_loss(nc((2, 3)), T((2, 3)), "none", beta=0.0),
        lambda: F.smooth_l1_loss(A(SPECIALS), A(SPECIALS[::-1]), "none", beta=0.5),
    ],
    smooth_l1_loss_backward=[
        lambda: OPERATORS["smooth_l1_loss_backward"](
            A(0.5), A(SPECIALS), A(SPECIALS[::-1]), "mean", 0.5
        ),
        lambda: OPERATORS["smooth_l1_loss_backward"](
            T((2, 3), "float32"), nc((2, 3), "float32"), T((2, 3), "float32"), "none", 0.0
        ),
    ],
    binary_cross_entropy_with_logits=[
        lambda: F.binary_cross_entropy_with_logits(
            T((3, 4), "float32"), T((3, 4), "float32", 0, 1)
        ),
        lambda: F.binary_cross_entropy_with_logits(
            nc((2, 3), low=-40, high=40), T((2, 3), low=0, high=1), T((3,)), "sum", T((3,), low=0.5)
        ),
        lambda: F.binary_cross_entropy_with_logits(A(SPECIALS), A([0.5] * 13), reduction="none"),
    ],
    add_scaled_=[
        lambda: OPERATORS["add_scaled_"](T((3, 4), "float32"), T((3, 4), "float32"), -0.5),
        lambda: OPERATORS["add_scaled_"](nc((2, 3)), T((2, 3)), 2.0),
    ],
    cross_entropy_loss=[
        lambda: F.cross_entropy(T((4, 3)), A([0, 2, 1, 2], "int64")),
        lambda: F.cross_entropy(nc((3, 5)), A([4, -1, 0], "int64"), ignore_index=-1),
    ],
    cross_entropy_loss_backward=[
        lambda: OPERATORS["cross_entropy_loss_backward"](
            A(0.5), T((4, 3)), A([0, 2, 1, 2], "int64"), -100
        ),
        lambda: OPERATORS["cross_entropy_loss_backward"](
            A(1.0, "float32"), nc((3, 5), "float32"), A([4, -1, 0], "int64"), -1
        ),
    ],
    nll_loss=[
        lambda: F.nll_loss(F.log_softmax(T((4, 3)), 1), A([0, 2, 1, 2], "int64")),
        lambda: F.nll_loss(
            T((2, 3, 4), "float32"), A([[0, 1, 2, 1], [2, 2, 0, -100]], "int64"), reduction="sum"
        ),
        lambda: F.nll_loss(
            T((3, 4)), A([1, 3, 0], "int64"), weight=T((4,), low=0.5), reduction="none"
        ),
        lambda: F.nll_loss(T((3,)), A(2, "int64")),
        lambda: F.nll_loss(T((2, 3)), A([1, 1], "int64"), ignore_index=1),
    ],
    nll_loss_backward=[
        lambda: OPERATORS["nll_loss_backward"](
            A(0.5), T((4, 3)), A([0, 2, 1, 2], "int64"), None, -100, "mean"
        ),
        lambda: OPERATORS["nll_loss_backward"](
            T((2, 4), "float32"),
            T((2, 3, 4), "float32"),
            A([[0, 1, 2, 1], [2, 2, 0, -100]], "int64"),
            None,
            -100,
            "none",
        ),
        lambda: OPERATORS["nll_loss_backward"](
            A(1.5), T((3, 4)), A([1, 3, 0], "int64"), T((4,), low=0.5), 1, "sum"
        ),
        lambda: OPERATORS["nll_loss_backward"](A(1.0), T((3,)), A(2, "int64"), None, -100, "mean"),
    ],
    max_pool2d=[lambda x=x, w=w: F.max_pool2d(x(), **w) for x, w in zip(IMAGES, POOL_WINDOWS)],
    min_pool2d_with_indices=[
        lambda x=x, w=w: F.min_pool2d_with_indices(x(), **w) for x, w in zip(IMAGES, POOL_WINDOWS)
    ],
    min_pool2d=[
        lambda: OPERATORS["min_pool2d"](T((2, 3, 5, 5)), (2, 2), (2, 2), (1, 1), (1, 1), True)
    ],
    pool2d_gather=[
        lambda x=x, w=w: _pool_grad("max_pool2d_with_indices", x(), w)
        for x, w in zip(IMAGES, POOL_WINDOWS)
    ],
    avg_pool2d=[lambda x=x, w=w: F.avg_pool2d(x(), **w) for x, w in zip(IMAGES, AVG_WINDOWS)],
    adaptive_avg_pool2d=[
        lambda: F.adaptive_avg_pool2d(T((2, 3, 7, 5)), (3, 2)),
        lambda: F.adaptive_avg_pool2d(IMAGES[2](), 1),
        lambda: F.adaptive_avg_pool2d(T((2, 5, 4)), (5, 3)),
    ],
    native_local_response_norm=[
        lambda: F.local_response_norm(T((2, 5, 3, 4)), 3),
        lambda: F.local_response_norm(IMAGES[2](), 2, alpha=0.01, beta=0.5, k=2.0),
    ],
    resample2d=[
        lambda: F.interpolate(T((2, 3, 5, 4)), scale_factor=2, mode="bilinear"),
        lambda: F.pad(IMAGES[2](), (1, 2, 2, 1), "reflect"),
    ],
    conv2d_backward_input=[
        lambda: (
            F.conv2d(
                T((2, 3, 7, 6)).requires_grad_(), T((4, 3, 3, 2)), T((4,)), stride=2, padding=1
            )
            .sum()
            .backward()
        ),
        lambda: (
            F.conv2d(
                T((1, 4, 9, 9), "float32").requires_grad_(),
                T((6, 2, 3, 3), "float32"),
                None,
                stride=(2, 3),
                padding=(2, 1),
                dilation=2,
                groups=2,
            )
            .sum()
            .backward()
        ),
        lambda: F.conv2d(T((3, 5, 5)).requires_grad_(), T((2, 3, 1, 1)), None).sum().backward(),
    ],
)
SAMPLES["pool2d_scatter"] = SAMPLES["pool2d_gather"]
SAMPLES["pool2d_gather"] = [
    lambda x=x, w=w: OPERATORS["pool2d_gather"](x, F.max_pool2d_with_indices(x, **w)[1])
    for x, w in zip(
        (T((2, 3, 6, 5)), F.to_layout(T((2, 4, 5, 6), "float32"), "NHWC")), POOL_WINDOWS[1:]
    )
]
SAMPLES["max_pool2d_with_indices"] = SAMPLES["max_pool2d"]
SAMPLES["avg_pool2d_backward"] = [
    lambda x=x, w=w: _pool_grad("avg_pool2d", x(), w) for x, w in zip(IMAGES, AVG_WINDOWS)
]
SAMPLES["adaptive_avg_pool2d_backward"] = [
    lambda s=s: (lambda out: out.backward(T(out.shape, out.dtype.name)))(
        F.adaptive_avg_pool2d(s[0]().requires_grad_(), s[1])
    )
    for s in ((IMAGES[1], (3, 2)), (IMAGES[2], 1), (IMAGES[3], (4, 3)))
]
SAMPLES["resample2d_backward"] = [
    lambda: (
        F.interpolate(T((2, 3, 5, 4)).requires_grad_(), size=(7, 3), mode="bilinear")
        .sum()
        .backward()
    ),
    lambda: F.pad(IMAGES[2]().requires_grad_(), (1, 2, 2, 1), "circular").sum().backward(),
]
SAMPLES["local_response_norm_backward"] = [
    lambda: F.local_response_norm(T((2, 5, 3, 4)).requires_grad_(), 3).sum().backward(),
    lambda: F.local_response_norm(IMAGES[2]().requires_grad_(), 4, beta=0.6).sum().backward(),
]
SAMPLES["conv2d_backward_weight"] = [
    lambda: (
        F.conv2d(T((2, 3, 7, 6)), T((4, 3, 3, 2)).requires_grad_(), T((4,)), stride=2, padding=1)
        .sum()
        .backward()
    ),
    lambda: (
        F.conv2d(
            T((1, 4, 9, 9), "float32"),
            T((6, 2, 3, 3), "float32").requires_grad_(),
            None,
            stride=(2, 3),
            padding=(2, 1),
            dilation=2,
            groups=2,
        )
        .sum()
        .backward()
    ),
    lambda: (
        F.conv2d(IMAGES[2](), T((3, 4, 2, 2), "float32").requires_grad_(), None).sum().backward()
    ),
]


def _bn(training, relu=False, dtype="float64", shape=(4, 3, 2, 5)):
    x = T(shape, dtype)
    stats = (T((3,), dtype), T((3,), dtype, 0.5, 2.0))
    return OPERATORS["native_batch_norm"](
        x, T((3,), dtype), T((3,), dtype), *stats, training, 0.1, 1e-5, relu
    )


SAMPLES["conv2d_relu"] = [
    lambda: OPERATORS["conv2d_relu"](
        *OPERATORS["conv2d"].check(T((2, 3, 7, 6)), T((4, 3, 3, 2)), T((4,)), (2, 2), 1, (1, 1), 1)
    ),
    lambda: OPERATORS["conv2d_relu"](  # depthwise, channels-last, no bias
        *OPERATORS["conv2d"].check(
            IMAGES[2](), T((4, 1, 3, 3), "float32"), None, (1, 1), 1, (1, 1), 4
        )
    ),
]
SAMPLES["linear_relu"] = [
    lambda: OPERATORS["linear_relu"](T((4, 3)), T((5, 3)), T((5,))),
    lambda: OPERATORS["linear_relu"](nc((2, 3, 3), "float32"), T((2, 3), "float32"), None),
]
SAMPLES["native_batch_norm"] = [
    lambda: _bn(True),
    lambda: _bn(False),
    lambda: _bn(True, True, "float32"),
    lambda: OPERATORS["native_batch_norm"](
        T((5, 3)), None, None, None, None, True, 0.1, 1e-5, False
    ),
]


def _bn_backward(training, relu=False, dtype="float64"):
    x, g = T((4, 3, 2, 5), dtype), T((4, 3, 2, 5), dtype)
    out, mean, invstd = _bn(training, relu, dtype)
    return OPERATORS["native_batch_norm_backward"](
        g, x, T((3,), dtype), mean, invstd, training, out if relu else None
    )


SAMPLES["native_batch_norm_backward"] = [
    lambda: _bn_backward(True),
    lambda: _bn_backward(False),
    lambda: _bn_backward(True, True, "float32"),
]


def _norm_backward(name, forward):
    """The backward operator ``name`` at the statistics of ``forward()``'s call."""
    args, (_, mean, rstd) = forward()
    x = args[0]
    g = T(x.shape, x.dtype.name)
    if name == "native_layer_norm_backward":
        return OPERATORS[name](g, x, args[1], mean, rstd, args[2])
    return OPERATORS[name](g, x, mean, rstd, args[1], args[3])


def _ln(shape, normalized, dtype="float64", affine=True):
    params = (T(normalized, dtype), T(normalized, dtype)) if affine else (None, None)
    args = (T(shape, dtype), normalized, *params, 1e-5)
    return args, OPERATORS["native_layer_norm"](*args)


def _gn(x, groups, affine=True):
    c, dtype = x.shape[1], x.dtype.name
    params = (T((c,), dtype), T((c,), dtype)) if affine else (None, None)
    args = (x, *params, groups, 1e-5)
    return args, OPERATORS["native_group_norm"](*args)


_LN_CASES = [
    lambda: _ln((4, 3, 6), (6,)),
    lambda: _ln((3, 2, 5), (2, 5), "float32", affine=False),
    lambda: _ln((2, 0), (0,)),  # empty slices: mean 0, rstd NaN
]


def _lstm(dtype="float64"):
    gates, c = T((4, 3, 5), dtype, -3, 3), T((3, 5), dtype)
    return (gates, c), OPERATORS["native_lstm_cell"](gates, c)


def _lstm_backward(grad_h, grad_c):
    (_, c), (_, c_next, activations) = _lstm()
    return OPERATORS["native_lstm_cell_backward"](grad_h, grad_c, c, c_next, activations)


SAMPLES["native_lstm_cell"] = [lambda: _lstm()[1], lambda: _lstm("float32")[1]]
SAMPLES["native_lstm_cell_backward"] = [
    lambda: _lstm_backward(T((3, 5)), T((3, 5))),
    lambda: _lstm_backward(None, T((3, 5))),
]


def _lstm_sequence(dtype="float64"):
    args = (T((8, 3, 2), dtype), T((2, 2), dtype), T((2, 2), dtype), T((8, 2), dtype))
    return args, OPERATORS["native_lstm_sequence"](*args)


def _lstm_sequence_backward(*grads):
    (_, h0, c0, w), (output, _, _, cs, activations) = _lstm_sequence()
    backward = OPERATORS["native_lstm_sequence_backward"]
    return backward(*grads, h0, c0, w, output, cs, activations)


SAMPLES["native_lstm_sequence"] = [
    lambda: _lstm_sequence()[1],
    lambda: _lstm_sequence("float32")[1],
]
SAMPLES["native_lstm_sequence_backward"] = [
    lambda: _lstm_sequence_backward(T((2, 3, 2)), T((2, 2)), T((2, 2))),
    lambda: _lstm_sequence_backward(None, None, T((2, 2))),
]


def _gru_sequence(dtype="float64", bias=True):
    args = (T((6, 3, 2), dtype), T((2, 2), dtype), T((6, 2), dtype))
    args += (T((6,), dtype) if bias else None,)
    return args, OPERATORS["native_gru_sequence"](*args)


def _gru_sequence_backward(*grads):
    (_, h0, w, _), (output, _, activations) = _gru_sequence()
    return OPERATORS["native_gru_sequence_backward"](*grads, h0, w, output, activations)


SAMPLES["native_gru_sequence"] = [
    lambda: _gru_sequence()[1],
    lambda: _gru_sequence("float32", bias=False)[1],
]
SAMPLES["native_gru_sequence_backward"] = [
    lambda: _gru_sequence_backward(T((2, 3, 2)), T((2, 2))),
    lambda: _gru_sequence_backward(None, T((2, 2))),
]
_GN_CASES = [
    lambda: _gn(T((2, 6, 3, 4)), 3),
    lambda: _gn(F.to_layout(T((2, 4, 3, 3), "float32"), "NHWC"), 2, affine=False),
    lambda: _gn(T((3, 4)), 2),
]
SAMPLES["native_layer_norm"] = [lambda c=c: c()[1] for c in _LN_CASES]
SAMPLES["native_layer_norm_backward"] = [
    lambda c=c: _norm_backward("native_layer_norm_backward", c) for c in _LN_CASES[:2]
]
SAMPLES["native_group_norm"] = [lambda c=c: c()[1] for c in _GN_CASES]
SAMPLES["native_group_norm_backward"] = [
    lambda c=c: _norm_backward("native_group_norm_backward", c) for c in _GN_CASES
]
_INDICES = A([[0, 3, 3], [4, 1, 3]], "int64")
SAMPLES["embedding"] = [
    lambda: F.embedding(_INDICES, T((5, 3))),
    lambda: F.embedding(A(2, "int64"), T((4, 2), "float32")),
]
SAMPLES["embedding_dense_backward"] = [
    lambda: OPERATORS["embedding_dense_backward"](T((2, 3, 4)), _INDICES, 6, 3),
    lambda: OPERATORS["embedding_dense_backward"](T((2, 3, 4), "float32"), _INDICES, 5, None),
]
_KEEP = A([[True, False, True, True], [False] * 4, [True] * 4], "bool")  # a row masked
SAMPLES["native_scaled_dot_product_attention"] = [
    lambda: F.scaled_dot_product_attention(T((2, 3, 2)), T((2, 4, 2)), T((2, 4, 3)), _KEEP),
    lambda: F.scaled_dot_product_attention(
        T((1, 4, 2), "float32"), T((1, 4, 2), "float32"), T((1, 4, 2), "float32"), is_causal=True
    ),
    lambda: F.scaled_dot_product_attention(T((3, 2)), T((4, 2)), T((4, 1)), T((3, 4)), scale=0.3),
]


def _attention_backward(q, k, v, is_causal=False):
    weights = OPERATORS["native_scaled_dot_product_attention"](q, k, v, None, is_causal, 0.5, True)[
        1
    ]
    grad = T((*q.shape[:-1], v.shape[-1]), q.dtype.name)
    return OPERATORS["native_scaled_dot_product_attention_backward"](grad, q, k, v, weights, 0.5)


SAMPLES["native_scaled_dot_product_attention_backward"] = [
    lambda: _attention_backward(T((2, 3, 2)), T((2, 4, 2)), T((2, 4, 3))),
    lambda: _attention_backward(*(T((1, 4, 2), "float32") for _ in range(3)), is_causal=True),
]
SAMPLES["coalesce"] = SAMPLES["sparse_mask"] = []  # errors on dense tensors: test_dense_errors

UNDEFINED_VALUES = {"empty"}
# How far a decomposition may be from its kernel, where the sums run in another order
# or another precision (the docstrings say which), as (rtol, atol) per float dtype.
LOOSE = {"float32": (2e-5, 1e-6), "float64": (1e-11, 1e-13)}
TOLERANCE = {"native_batch_norm": {"float32": (1e-4, 1e-5)}, "nll_loss": {"float32": (1e-5, 1e-6)},
             "mse_loss": {"float32": (1e-5, 1e-6)}, "det": {"float32": (1e-4, 1e-5)},
             # 1 + tanh(u) near tanh = -1: both sides' absolute errors of ~eps
             "gelu_backward": {"float32": (1e-5, 1e-5)}}  # fmt: skip


def _copies(args):
    """Fresh copies of the tensors among args (a kernel may write its arguments)."""
    if isinstance(args, Tensor):
        return COPY(keys.CPU, args)
    if isinstance(args, (tuple, list)):
        return type(args)(_copies(a) for a in args)
    return args


@contextlib.contextmanager
def spying(name):
    """The first call of operator ``name``'s CPU kernel, as (ks, args) in a list."""
    op, calls = OPERATORS[name], []
    table, scalar = op.table[CPU], op.scalar_table[CPU]

    def spy(kernel):
        def call(ks, *args):
            if not calls:
                calls.append((ks, _copies(args)))
            return kernel(ks, *args)

        return call

    op.table[CPU], op.scalar_table[CPU] = spy(table), spy(scalar)
    try:
        yield calls
    finally:
        op.table[CPU], op.scalar_table[CPU] = table, scalar


@contextlib.contextmanager
def core_only(edges):
    """Every decomposed operator served on the CPU by its decomposition, the core ones
    by their kernels: a device implementing the core set. Records the operators each
    decomposition calls into ``edges`` and fails on a cycle."""
    stack, saved = [], {}

    def serve(name, kernel):
        def call(ks, *args):
            if stack:
                edges.setdefault(stack[-1], set()).add(name)
            if name in stack:
                raise AssertionError(
                    f"decompositions call each other: {' -> '.join(stack)} -> {name}"
                )
            if name in CORE:
                return kernel(ks, *args)
            stack.append(name)
            try:
                return DECOMPOSITIONS[name](ks, *args)
            finally:
                stack.pop()

        return call

    for name, op in OPERATORS.items():
        saved[name] = op.table[CPU], op.scalar_table[CPU]
        op.table[CPU], op.scalar_table[CPU] = (
            serve(name, saved[name][0]),
            serve(name, saved[name][1]),
        )
    try:
        yield lambda name: lambda ks, *args: serve(name, None)(ks, *args)
    finally:
        for name, op in OPERATORS.items():
            op.table[CPU], op.scalar_table[CPU] = saved[name]


def assert_same(got, want, name, where=""):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), f"{name}{where}: {got!r}"
        assert type(got) is type(want) or not hasattr(want, "_fields"), (
            f"{name}{where}: {type(got)}"
        )
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, name, f"{where}[{i}]")
        return
    assert isinstance(got, Tensor), f"{name}{where}: got {type(got).__name__}"
    assert got.dtype == want.dtype, f"{name}{where}: dtype {got.dtype}, the kernel's {want.dtype}"
    assert got.shape == want.shape, f"{name}{where}: shape {got.shape}, the kernel's {want.shape}"
    if name in UNDEFINED_VALUES:
        return
    g, w = got.numpy(), want.numpy()
    if w.dtype.kind in "biu":
        np.testing.assert_array_equal(g, w, err_msg=f"{name}{where}")
        return
    precision = "float32" if w.dtype in (np.float32, np.complex64) else "float64"
    rtol, atol = TOLERANCE.get(name, {}).get(precision, LOOSE[precision])
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"{name}{where}")


def _kernel_calls(name):
    """(ks, args, kernel result) of each sample of operator ``name``."""
    op = OPERATORS[name]
    found = []
    with np.errstate(all="ignore"):
        for sample in SAMPLES[name]:
            with spying(name) as calls:
                sample()
            assert calls, f"a sample of {name} never reached its kernel"
            ks, args = calls[0]
            found.append((ks, args, op.table[CPU](ks, *_copies(args))))
    return found


def check(name, edges):
    """Every sample of a decomposition, plain and core-only; the calls into ``edges``."""
    for i, (ks, args, want) in enumerate(_kernel_calls(name)):
        copies = _copies(args)
        got = DECOMPOSITIONS[name](ks, *copies)
        if "inplace" in OPERATORS[name].tags:
            assert got is copies[0]
        assert_same(got, want, name, f" (sample {i})")
        copies = _copies(args)
        with core_only(edges) as serve:
            got = serve(name)(ks, *copies)
        assert_same(got, want, name, f" (sample {i}, core only)")


EDGES = {}  # operator -> the operators its decomposition called, filled by the test below


@pytest.mark.parametrize("name", sorted(DECOMPOSITIONS))
def test_decomposition_computes_its_kernels_result(name):
    check(name, EDGES)


def test_every_decomposition_has_samples():
    untested = [
        n for n in DECOMPOSITIONS if not SAMPLES.get(n) and n not in ("coalesce", "sparse_mask")
    ]
    assert not untested, f"decompositions without samples: {untested}"


def test_the_call_graph_is_acyclic_and_bottoms_out_in_the_core_set():
    edges = EDGES
    for name in set(DECOMPOSITIONS) - set(EDGES):  # run alone: the samples first
        check(name, edges)
    # core_only fails on a cycle as it happens; here: every decomposition calls
    # something, and from every decomposition the core set is reached
    for name in DECOMPOSITIONS:
        if name in ("to_dense", "coalesce", "sparse_mask"):
            continue
        assert edges.get(name), f"{name}'s decomposition dispatched no operator"
    depth = {}

    def reaches_core(name, seen=()):
        assert name not in seen, f"cycle: {' -> '.join(seen)} -> {name}"
        if name in CORE:
            return 0
        if name not in depth:
            depth[name] = 1 + max(reaches_core(c, (*seen, name)) for c in edges[name])
        return depth[name]

    for name in edges:
        reaches_core(name)


def test_dense_errors():
    x = T((2, 3))
    for name, message in (
        ("coalesce", "expected a sparse tensor"),
        ("sparse_mask", "must be a sparse"),
    ):
        args = (x,) if name == "coalesce" else (x, x)
        for fn in (OPERATORS[name].table[CPU], DECOMPOSITIONS[name]):
            with pytest.raises(TypeError, match=message):
                fn(keys.CPU, *args)


def test_bad_input_raises_like_the_kernel():
    """Data-dependent checks the kernels make, which the decompositions repeat."""
    with pytest.raises(ValueError, match="class indices in"):
        DECOMPOSITIONS["nll_loss"](keys.CPU, T((2, 3)), A([0, 3], "int64"), None, -100, "mean")
    with pytest.raises(ValueError, match="out of range"):
        DECOMPOSITIONS["pool2d_gather"](keys.CPU, T((1, 1, 2, 2)), A([[[[4]]]], "int64"))


def test_the_core_set():
    """At most 60 operators, each with a CPU kernel; the list is derived (every operator
    without a decomposition), so the two cannot disagree."""
    assert len(CORE) <= 60, CORE
    assert set(CORE) == decompositions.CORE
    assert set(CORE) | set(DECOMPOSITIONS) == set(OPERATORS)
    assert not set(CORE) & set(DECOMPOSITIONS)
    assert all(OPERATORS[n].winners.get(keys.CPU) for n in CORE)
    for primitive in ("add", "multiply", "exp", "where", "sum", "matmul", "conv2d", "getitem"):
        assert primitive in CORE
