"""The autograd layer (issue 3): derivative formulas, user API, error cases, engine.

The first part checks every formula of ``autograd/derivatives.py`` against central
finite differences (``lm.autograd.gradcheck``, float64, small shapes), on samples that
include broadcasting, non-contiguous (transposed, stepped) inputs and Python scalar
operands. ``SAMPLES`` is keyed by operator name, and ``test_every_formula_has_samples``
fails when a formula is added to ``DERIVATIVES`` without one; each sample must also
record a node of its operator, so a sample cannot silently miss the formula it names.

Everything runs in float64, the dtype the rest of the suite compiles kernels for, and
complex128 (``cleaf``) for the formulas of complex inputs (Note [Complex gradients]):
gradcheck perturbs real and imaginary parts; at the end of SAMPLES.
"""

import gc
import threading
import weakref

import fused
import numpy as np
import pytest

import lamina as lm
from lamina.autograd import DERIVATIVES, gradcheck
from lamina.dispatch import tensor
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import sole_storage

INDEX_ADD = OPERATORS["index_add"]  # getitem's backward (not a public function)

F64 = lm.float64


# the device samples make their constants on (test_every_sample_runs_on_a_plugin_device)
DEVICE = ["cpu"]


def leaf(shape, lo=-1.0, hi=1.0, seed=0):
    """A float64 leaf of ``shape`` requiring grad, uniform in [lo, hi) (made on the
    samples' device, DEVICE, when a sample makes it)."""
    rng = np.random.default_rng(seed)
    data = rng.uniform(lo, hi, shape)
    return lm.asarray(data, dtype=F64, device=DEVICE[0], requires_grad=True)


def strided(shape, lo=-1.0, hi=1.0, seed=0, kind="T"):
    """A non-contiguous float64 leaf: a transposed or stepped view of a larger array."""
    rng = np.random.default_rng(seed)
    if kind == "T":
        base = rng.uniform(lo, hi, shape[::-1])
        data = base.T
    else:  # every other element of the last axis
        base = rng.uniform(lo, hi, shape[:-1] + (2 * shape[-1],))
        data = base[..., ::2]
    t = lm.asarray(data, dtype=F64)
    assert not t.is_contiguous()
    return t.requires_grad_()


def const(data):
    """A float64 tensor that does not require grad (on the samples' device)."""
    return lm.asarray(np.asarray(data, dtype=np.float64), device=DEVICE[0])


def index(data):
    """An int64 index tensor (on the samples' device)."""
    return lm.asarray(data, dtype=lm.int64, device=DEVICE[0])


def cleaf(shape, seed=0, lo=-1.0, hi=1.0):
    """A complex128 leaf of ``shape`` requiring grad, both parts uniform in [lo, hi)."""
    rng = np.random.default_rng(seed + 100)
    data = rng.uniform(lo, hi, shape) + 1j * rng.uniform(lo, hi, shape)
    return lm.asarray(data, dtype=lm.complex128, device=DEVICE[0], requires_grad=True)


def pos(shape, seed=0):
    return leaf(shape, 0.5, 2.0, seed)


def unit(shape, seed=0):
    return leaf(shape, -0.8, 0.8, seed)


def away_from_zero(shape, seed=0):
    """Values with |x| in [0.3, 1.5): for abs, sign, copysign and friends."""
    rng = np.random.default_rng(seed)
    data = rng.uniform(0.3, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    return lm.asarray(data, dtype=F64, requires_grad=True)


def inplace(name):
    """x op= y on a non-leaf copy of x (the in-place kernel of the layer)."""

    def fn(x, y):
        z = x * 1.0
        getattr(z, f"__i{name}__")(y)
        return z

    return fn


def setitem(key):
    """y[key] = v on a non-leaf copy y of x; ``key`` may be a function making it (a
    tensor key is made on the samples' device)."""

    def fn(x, v):
        y = x * 1.0
        y[key() if callable(key) else key] = v
        return y

    return fn


def _split_some(x):
    a, _, c = lm.split(x, 2, axis=1)  # sizes 2, 2, 1: the middle one is not used
    return a * 2.0, c


def _elsewhere(x):
    """A device other than x's, for samples that move there and back (on every device
    the samples run on, tests/test_plugin_devices.py)."""
    return "counting" if x.device == "cpu" else "cpu"


S = (2, 3)
# name -> [(sample id, fn, args[, gradcheck keywords])]; fn(*args) must record a node
# of the named operator
SAMPLES = {
    "add": [
        ("same", lm.add, [leaf(S), leaf(S, seed=1)]),
        ("broadcast", lm.add, [leaf((2, 1, 3)), leaf((4, 1), seed=1)]),
        ("scalar", lambda x: x + 2.5, [leaf(S)]),
        ("rscalar", lambda x: 2.5 + x, [leaf(S)]),
        ("transposed", lm.add, [strided(S), leaf(S, seed=1)]),
        ("inplace", inplace("add"), [leaf(S), leaf((3,), seed=1)]),
    ],
    "subtract": [
        ("broadcast", lm.subtract, [leaf((3, 1)), leaf((1, 4), seed=1)]),
        ("rscalar", lambda x: 1.5 - x, [leaf(S)]),
        ("stepped", lm.subtract, [leaf(S, seed=1), strided(S, kind="step")]),
        ("inplace", inplace("sub"), [leaf(S), leaf((2, 1), seed=1)]),
    ],
    "multiply": [
        ("broadcast", lm.multiply, [leaf((2, 1, 3)), leaf((4, 1), seed=1)]),
        ("scalar", lambda x: x * -3.0, [leaf(S)]),
        ("transposed", lm.multiply, [strided(S), strided(S, seed=1, kind="step")]),
        ("self", lambda x: x * x, [leaf(S)]),
        ("inplace", inplace("mul"), [leaf(S), leaf(S, seed=1)]),
    ],
    "divide": [
        ("broadcast", lm.divide, [leaf((2, 3)), pos((3,), seed=1)]),
        ("rscalar", lambda x: 2.0 / x, [pos(S)]),
        ("scalar", lambda x: x / 4.0, [leaf(S)]),
        ("inplace", inplace("truediv"), [leaf(S), pos((1, 3), seed=1)]),
    ],
    "pow": [
        ("tensors", lm.pow, [pos(S), leaf(S, seed=1)]),
        ("broadcast", lm.pow, [pos((2, 1)), leaf((3,), seed=1)]),
        ("scalar_exponent", lambda x: x**3.0, [leaf(S)]),
        ("scalar_base", lambda x: 2.0**x, [leaf(S)]),
        ("inplace", inplace("pow"), [pos(S), leaf(S, seed=1)]),
    ],
    "maximum": [
        ("tensors", lm.maximum, [leaf(S), leaf(S, seed=1)]),
        ("broadcast", lm.maximum, [leaf((2, 3)), leaf((3,), seed=1)]),
        ("scalar", lambda x: lm.maximum(x, 0.1), [leaf(S)]),
    ],
    "minimum": [
        ("tensors", lm.minimum, [leaf(S), leaf(S, seed=1)]),
        ("rscalar", lambda x: lm.minimum(0.1, x), [leaf(S)]),
    ],
    "floor_divide": [("tensors", lm.floor_divide, [leaf(S, -3, 3), pos(S, seed=1)])],
    "remainder": [
        ("tensors", lm.remainder, [leaf(S, -3, 3), pos(S, seed=1)]),
        ("scalar", lambda x: x % 0.7, [leaf(S, -3, 3)]),
        ("rscalar", lambda x: 2.5 % x, [pos(S)]),
    ],
    "atan2": [
        ("broadcast", lm.atan2, [leaf((2, 3)), leaf((3,), seed=1)]),
        ("scalar", lambda x: lm.atan2(x, -0.5), [leaf(S)]),
    ],
    "hypot": [
        ("broadcast", lm.hypot, [leaf((2, 3)), away_from_zero((2, 1), seed=1)]),
        ("scalar", lambda x: lm.hypot(x, 0.5), [leaf(S)]),
    ],
    "copysign": [
        ("tensors", lm.copysign, [away_from_zero(S), away_from_zero(S, seed=1)]),
        ("scalar", lambda x: lm.copysign(x, -1.0), [away_from_zero(S)]),
    ],
    "logaddexp": [
        ("broadcast", lm.logaddexp, [leaf((2, 3)), leaf((3,), seed=1)]),
        ("scalar", lambda x: lm.logaddexp(x, 0.3), [leaf(S)]),
    ],
    "abs": [("plain", lm.abs, [away_from_zero(S)])],
    "negative": [("plain", lambda x: -x, [strided(S)])],
    "positive": [("plain", lm.positive, [leaf(S)])],
    "square": [("plain", lm.square, [strided(S, kind="step")])],
    **{
        name: [("plain", getattr(lm, name), [leaf(S, -3, 3)])]
        for name in ("sign", "floor", "ceil", "round", "trunc")
    },
    "exp": [("plain", lm.exp, [leaf(S)]), ("transposed", lm.exp, [strided(S)])],
    "expm1": [("plain", lm.expm1, [leaf(S)])],
    "log": [("plain", lm.log, [pos(S)]), ("stepped", lm.log, [strided(S, 0.5, 2, kind="s")])],
    "log1p": [("plain", lm.log1p, [leaf(S, -0.5, 1)])],
    "log2": [("plain", lm.log2, [pos(S)])],
    "log10": [("plain", lm.log10, [pos(S)])],
    "sqrt": [("plain", lm.sqrt, [pos(S)]), ("transposed", lm.sqrt, [strided(S, 0.5, 2)])],
    "sin": [("plain", lm.sin, [leaf(S, -3, 3)])],
    "cos": [("plain", lm.cos, [leaf(S, -3, 3)])],
    "tan": [("plain", lm.tan, [leaf(S)])],
    "asin": [("plain", lm.asin, [unit(S)])],
    "acos": [("plain", lm.acos, [unit(S)])],
    "atan": [("plain", lm.atan, [leaf(S, -3, 3)])],
    "sinh": [("plain", lm.sinh, [leaf(S)])],
    "cosh": [("plain", lm.cosh, [leaf(S)])],
    "tanh": [("plain", lm.tanh, [leaf(S, -2, 2)])],
    "asinh": [("plain", lm.asinh, [leaf(S, -3, 3)])],
    "acosh": [("plain", lm.acosh, [leaf(S, 1.2, 3)])],
    "atanh": [("plain", lm.atanh, [unit(S)])],
    "clip": [
        ("scalars", lambda x: lm.clip(x, -0.5, 0.5), [leaf((4, 3), -1, 1)]),
        ("lower_only", lambda x: lm.clip(x, min=0.0), [away_from_zero(S)]),
        ("upper_only", lambda x: lm.clip(x, max=0.2), [leaf(S)]),
        (
            "tensor_bounds",
            lm.clip,
            [leaf((4, 3), -2, 2), leaf((3,), -1, -0.1, seed=1), leaf((4, 1), 0.1, 1, seed=2)],
        ),
    ],
    "where": [
        (
            "broadcast",
            lambda x, y: lm.where(const([True, False, True]), x, y),
            [leaf((2, 3)), leaf((2, 1), seed=1)],
        ),
        ("scalar", lambda x: lm.where(x > 0, x, 0.25), [away_from_zero(S)]),
    ],
    "astype": [
        ("same_dtype", lambda x: lm.astype(x, F64, copy=True) * 2.0, [leaf(S)]),
        # float32 rounding needs a wider finite-difference step
        (
            "float32_roundtrip",
            lambda x: lm.astype(lm.astype(x, lm.float32) * 2.0, F64),
            [leaf(S)],
            dict(eps=1e-3, atol=1e-3),
        ),
    ],
    "copy": [("asarray_copy", lambda x: lm.asarray(x, copy=True) * 3.0, [strided(S)])],
    "sum": [
        ("all", lm.sum, [leaf((2, 3, 4))]),
        ("axis", lambda x: lm.sum(x, axis=1), [leaf((2, 3, 4))]),
        ("axes_keepdims", lambda x: lm.sum(x, axis=(0, 2), keepdims=True), [strided((2, 3, 4))]),
    ],
    "mean": [
        ("all", lm.mean, [leaf((2, 3, 4))]),
        ("axis_keepdims", lambda x: lm.mean(x, axis=-1, keepdims=True), [leaf((2, 3, 4))]),
        ("axes", lambda x: lm.mean(x, axis=(0, 1)), [strided((2, 3, 4), kind="s")]),
    ],
    "prod": [
        ("all", lm.prod, [leaf((2, 3), 0.5, 1.5)]),
        ("axis", lambda x: lm.prod(x, axis=0), [leaf((3, 4), -2, 2)]),
        (
            "one_zero",
            lambda x: lm.prod(x, axis=1, keepdims=True),
            [const([[1.5, 0.0, -2.0, 0.5], [0.7, 1.2, 0.0, 3.0]]).requires_grad_()],
        ),
        (
            "two_zeros",
            lambda x: lm.prod(x, axis=1),
            [const([[1.5, 0.0, -2.0, 0.0], [0.7, 1.2, 0.4, 3.0]]).requires_grad_()],
        ),
        ("zeros_all", lm.prod, [const([1.5, 0.0, -2.0, 0.5]).requires_grad_()]),
    ],
    "var": [
        ("all", lm.var, [leaf((3, 4))]),
        ("axis_correction", lambda x: lm.var(x, axis=1, correction=1), [leaf((3, 4))]),
        (
            "keepdims",
            lambda x: lm.var(x, axis=(0, 2), keepdims=True, correction=0.5),
            [strided((2, 3, 4))],
        ),
    ],
    "std": [
        ("all", lm.std, [leaf((3, 4))]),
        ("axis_correction", lambda x: lm.std(x, axis=0, correction=1), [leaf((3, 4))]),
        ("keepdims", lambda x: lm.std(x, axis=-1, keepdims=True), [strided((3, 4))]),
    ],
    "max": [
        ("all", lm.max, [leaf((3, 4))]),
        ("axis", lambda x: lm.max(x, axis=1), [leaf((3, 4))]),
        ("keepdims", lambda x: lm.max(x, axis=0, keepdims=True), [strided((3, 4))]),
    ],
    "min": [
        ("all", lm.min, [leaf((3, 4))]),
        ("axes", lambda x: lm.min(x, axis=(0, 2)), [leaf((2, 3, 4))]),
    ],
    "matmul": [
        ("2d", lm.matmul, [leaf((2, 3)), leaf((3, 4), seed=1)]),
        ("vec_vec", lm.matmul, [leaf((3,)), leaf((3,), seed=1)]),
        ("vec_mat", lm.matmul, [leaf((3,)), leaf((3, 2), seed=1)]),
        ("mat_vec", lm.matmul, [leaf((2, 3)), leaf((3,), seed=1)]),
        ("batched_broadcast", lm.matmul, [leaf((2, 1, 2, 3)), leaf((3, 3, 2), seed=1)]),
        ("batched_vec", lm.matmul, [leaf((2, 2, 3)), leaf((3,), seed=1)]),
        ("transposed", lambda a, b: a @ b, [strided((3, 2)), strided((2, 3), seed=1)]),
    ],
    "tensordot": [
        ("axes1", lambda a, b: lm.tensordot(a, b, axes=1), [leaf((2, 3)), leaf((3, 2), seed=1)]),
        ("axes2", lm.tensordot, [leaf((2, 3, 2)), leaf((3, 2, 2), seed=1)]),
        (
            "explicit",
            lambda a, b: lm.tensordot(a, b, axes=([0, 2], [2, 0])),
            [leaf((2, 3, 4)), leaf((4, 2, 2), seed=1)],
        ),
        ("axes0", lambda a, b: lm.tensordot(a, b, axes=0), [leaf((2,)), leaf((3,), seed=1)]),
    ],
    "vecdot": [
        ("last", lm.vecdot, [leaf((2, 3)), leaf((2, 3), seed=1)]),
        ("broadcast", lambda a, b: lm.vecdot(a, b, axis=0), [leaf((3, 2)), leaf((3, 1), seed=1)]),
        ("batch_broadcast", lm.vecdot, [leaf((2, 1, 3)), leaf((4, 3), seed=1)]),
    ],
    "reshape": [
        ("plain", lambda x: lm.reshape(x, (3, 2)) * const([[1, 2], [3, 4], [5, 6]]), [leaf(S)]),
        ("noncontiguous", lambda x: lm.reshape(x, (-1,)), [strided(S)]),
    ],
    "permute_dims": [("plain", lambda x: lm.permute_dims(x, (2, 0, 1)) * 1.5, [leaf((2, 3, 4))])],
    "matrix_transpose": [("plain", lambda x: lm.matmul(x.mT, x), [leaf((3, 2))])],
    "expand_dims": [
        ("plain", lambda x: lm.expand_dims(x, axis=1) * const([[1.0], [2.0], [3.0]]), [leaf((3,))])
    ],
    "squeeze": [("plain", lambda x: lm.squeeze(x, axis=(0, 2)), [leaf((1, 3, 1))])],
    "flip": [
        ("all", lm.flip, [leaf(S)]),
        ("axis", lambda x: lm.flip(x, axis=1) * const([1, 2, 3]), [leaf(S)]),
    ],
    "broadcast_to": [
        ("plain", lambda x: lm.broadcast_to(x, (2, 4, 3)) * leaf((4, 3), seed=5), [leaf((1, 3))])
    ],
    "getitem": [
        ("slices", lambda x: x[1:, ::2], [leaf((3, 4))]),
        ("int", lambda x: x[1] * x[-1], [leaf((3, 4))]),
        ("negative_step", lambda x: x[::-2], [leaf((5,))]),
        ("bool_mask", lambda x: x[const([True, False, True, True]) > 0.5], [leaf((4, 2))]),
        (
            "int_tensor_repeated",
            lambda x: x[index([0, 2, 0, 0])] * const([1, 2, 3, 4]),
            [leaf((3,))],
        ),
        ("mixed", lambda x: x[index([1, 1]), 1:], [leaf((3, 3))]),
        ("view_of_strided", lambda x: x[:, 1], [strided((3, 4))]),
    ],
    "index_add": [
        (
            "slices",
            lambda x, v: INDEX_ADD(x, (slice(1, None), slice(None, None, 2)), v),
            [leaf((3, 4)), leaf((2, 2), seed=1)],
        ),
        (
            "repeated",
            lambda x, v: INDEX_ADD(x, index([0, 2, 0]), v) * const([1, 2, 3]),
            [leaf((3,)), leaf((3,), seed=1)],
        ),
    ],
    "setitem": [
        ("slice", setitem((slice(None), 1)), [leaf((3, 4)), leaf((3,), seed=1)]),
        ("broadcast_value", setitem(slice(0, 2)), [leaf((3, 4)), leaf((4,), seed=1)]),
        (
            "bool_mask",
            setitem(lambda: const([True, False, True]) > 0.5),
            [leaf((3, 2)), leaf((2,), seed=1)],
        ),
        ("whole", setitem(Ellipsis), [leaf((3, 4)), leaf((3, 4), seed=1)]),
        ("column_of_one", setitem((slice(None), 2)), [leaf((3, 4)), leaf((1,), seed=1)]),
    ],
    "to_device": [
        ("round_trip", lambda x: (x.to(_elsewhere(x)) * 2.0).to(x.device), [leaf(S)]),
        (
            "asarray_astype",
            lambda x: lm.astype(lm.asarray(x, device=_elsewhere(x)) ** 2, F64, device=x.device),
            [leaf(S)],
        ),
    ],
    "split": [
        ("some_outputs", _split_some, [leaf((2, 5))]),
        ("sections", lambda x: lm.split(x, [1, 3], axis=0)[1], [leaf((4, 2))]),
    ],
    "concat": [
        ("axis0", lambda a, b: lm.concat([a, b]), [leaf((2, 3)), leaf((1, 3), seed=1)]),
        (
            "axis1_const",
            lambda a: lm.concat([a, const([[1.0], [2.0]]), a], axis=1),
            [strided((2, 2))],
        ),
    ],
    "stack": [
        ("axis0", lambda a, b: lm.stack([a, b]), [leaf(S), leaf(S, seed=1)]),
        ("axis_last", lambda a: lm.stack([a, a * 2.0], axis=-1), [leaf(S)]),
    ],
}

# ---------------------------------------------------------------- neural-network primitives
# lamina.nn.functional's operators and their backward operators (Note [nn formulas]),
# on small images in both memory layouts (nhwc: channels-last strides).
NNF = lm.nn.functional
CONV_INPUT = OPERATORS["conv2d_backward_input"]
CONV_WEIGHT = OPERATORS["conv2d_backward_weight"]
CONV, CONV_RELU = OPERATORS["conv2d"], OPERATORS["conv2d_relu"]
LINEAR_RELU = OPERATORS["linear_relu"]
RESAMPLE_BACKWARD = OPERATORS["resample2d_backward"]
SCATTER, GATHER = OPERATORS["pool2d_scatter"], OPERATORS["pool2d_gather"]
AVG_BACKWARD = OPERATORS["avg_pool2d_backward"]
ADAPTIVE_BACKWARD = OPERATORS["adaptive_avg_pool2d_backward"]
IMAGE = (1, 2, 5, 5)


def nhwc(shape, lo=-1.0, hi=1.0, seed=0):
    """A channels-last float64 leaf (made on the samples' device)."""
    x = NNF.to_layout(leaf(shape, lo, hi, seed).detach(), "NHWC")
    return x.requires_grad_()


def _image(*shape, nhwc=False):
    """A constant image of ``shape`` (made on the samples' device), for the backward
    operators that read only an input's shape and layout."""
    x = const(np.zeros(shape))
    return NNF.to_layout(x, "NHWC") if nhwc else x


def _bilinear_tables():
    """resample2d's tables of a 3 x 4 image resized bilinearly to 5 x 7 (made on the
    samples' device)."""
    rows = index([[0, 1], [0, 1], [1, 2], [1, 2], [2, 2]])
    cols = index([[0, 1], [0, 1], [1, 2], [1, 2], [2, 3], [2, 3], [3, 3]])
    weights = (const(np.random.default_rng(3).uniform(0, 1, (n, 2))) for n in (5, 7))
    return (rows, cols, *weights)


def _pool_indices():
    """Max-pooling indices of a fixed image (3x3 windows, stride 2, padding 1)."""
    x = const(np.random.default_rng(7).uniform(-1, 1, IMAGE))
    return NNF.max_pool2d(x, 3, 2, padding=1, return_indices=True)[1]


SAMPLES.update(
    {
        "conv2d": [
            (
                "groups_stride_bias",
                lambda x, w, b: NNF.conv2d(x, w, b, stride=(2, 1), padding=1, groups=2),
                [leaf((1, 4, 4, 5)), leaf((2, 2, 3, 2), seed=1), leaf((2,), seed=2)],
            ),
            (
                "nhwc_same_dilated",
                lambda x, w: NNF.conv2d(x, w, padding="same", dilation=(1, 2)),
                [nhwc((1, 2, 4, 5)), leaf((2, 2, 2, 2), seed=1)],
            ),
            ("unbatched_1x1", NNF.conv2d, [leaf((3, 2, 3)), leaf((2, 3, 1, 1), seed=1)]),
            (
                "depthwise_nhwc_stride2",
                lambda x, w, b: NNF.conv2d(x, w, b, stride=2, padding=1, groups=3),
                [nhwc((2, 3, 5, 6)), leaf((6, 1, 3, 3), seed=1), leaf((6,), seed=2)],
            ),
            (
                "depthwise_3x3",
                lambda x, w: NNF.conv2d(x, w, padding=1, groups=4),
                [leaf((1, 4, 5, 5)), leaf((4, 1, 3, 3), seed=1)],
            ),
        ],
        "conv2d_relu": [
            (
                "stride_bias",
                lambda x, w, b: CONV_RELU(*CONV.check(x, w, b, (2, 1), 1, (1, 1), 1)),
                [leaf((1, 2, 4, 5)), leaf((3, 2, 3, 2), seed=1), leaf((3,), seed=2)],
            ),
            (
                "depthwise_nhwc",
                lambda x, w: CONV_RELU(*CONV.check(x, w, None, (1, 1), 1, (1, 1), 3)),
                [nhwc((1, 3, 4, 4)), leaf((3, 1, 3, 3), seed=1)],
            ),
        ],
        "resample2d": [
            (
                "bilinear_nhwc",
                lambda x: NNF.interpolate(x, size=(5, 7), mode="bilinear"),
                [nhwc((1, 2, 3, 4))],
            ),
            ("reflect", lambda x: NNF.pad(x, (2, 1, 1, 2), "reflect"), [leaf((2, 3, 4))]),
        ],
        "resample2d_backward": [
            (
                "bilinear",
                lambda g: RESAMPLE_BACKWARD(g, *_bilinear_tables(), _image(1, 2, 3, 4)),
                [leaf((1, 2, 5, 7))],
            )
        ],
        "conv2d_backward_input": [
            (
                "stride2",
                lambda g, w: CONV_INPUT(g, w, _image(1, 2, 5, 4), (2, 2), (1, 1, 1, 1), (1, 1), 1),
                [leaf((1, 2, 3, 2)), leaf((2, 2, 3, 3), seed=1)],
            )
        ],
        "conv2d_backward_weight": [
            (
                "nhwc",
                lambda g, x: CONV_WEIGHT(g, x, (3, 2, 2, 2), (1, 1), (0, 1, 1, 0), (1, 1), 1, True),
                [nhwc((1, 3, 5, 4)), nhwc((1, 2, 5, 4), seed=1)],
            )
        ],
        "linear": [
            ("batched", NNF.linear, [leaf((2, 3, 4)), leaf((5, 4), seed=1), leaf((5,), seed=2)]),
            ("vector", NNF.linear, [leaf((4,)), leaf((3, 4), seed=1)]),
            (  # a batch of rows, stored column by column
                "matrix_transposed",
                lambda x, w, b: NNF.linear(x.mT, w, b),
                [leaf((4, 3)), leaf((5, 4), seed=1), leaf((5,), seed=2)],
            ),
        ],
        "linear_relu": [
            ("batched", LINEAR_RELU, [leaf((2, 3, 4)), leaf((5, 4), seed=1), leaf((5,), seed=2)]),
        ],
        "max_pool2d_with_indices": [
            ("padded", lambda x: NNF.max_pool2d(x, 3, 2, padding=1), [leaf(IMAGE)]),
            (
                "nhwc_dilated_ceil",
                lambda x: NNF.max_pool2d(x, (2, 3), (2, 1), dilation=(2, 1), ceil_mode=True),
                [nhwc(IMAGE)],
            ),
        ],
        "max_pool2d": [
            (
                "nhwc",
                lambda x: OPERATORS["max_pool2d"](x, (3, 3), (2, 2), (1, 1), (1, 1), False),
                [nhwc(IMAGE)],
            ),
        ],
        "min_pool2d": [
            (
                "plain",
                lambda x: OPERATORS["min_pool2d"](x, (2, 2), (1, 1), (0, 0), (1, 1), True),
                [leaf(IMAGE)],
            ),
        ],
        "min_pool2d_with_indices": [
            ("nhwc", lambda x: NNF.min_pool2d(x, 2, 1, padding=1), [nhwc(IMAGE)]),
        ],
        "pool2d_scatter": [
            ("plain", lambda g: SCATTER(g, _pool_indices(), IMAGE), [leaf((1, 2, 3, 3))])
        ],
        "pool2d_gather": [("plain", lambda x: GATHER(x, _pool_indices()), [leaf(IMAGE)])],
        "avg_pool2d": [
            (
                "ceil_exclude_pad",
                lambda x: NNF.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                [leaf(IMAGE)],
            ),
            (
                "nhwc_divisor",
                lambda x: NNF.avg_pool2d(x, (2, 3), padding=(1, 1), divisor_override=4),
                [nhwc(IMAGE)],
            ),
        ],
        "avg_pool2d_backward": [
            (
                "plain",
                lambda g: AVG_BACKWARD(
                    g, _image(*IMAGE), (3, 3), (2, 2), (1, 1), True, False, None
                ),
                [leaf((1, 2, 3, 3))],
            )
        ],
        "adaptive_avg_pool2d": [
            ("uneven", lambda x: NNF.adaptive_avg_pool2d(x, (2, 3)), [leaf((1, 2, 5, 7))]),
            ("nhwc", lambda x: NNF.adaptive_avg_pool2d(x, 2), [nhwc(IMAGE)]),
        ],
        "adaptive_avg_pool2d_backward": [
            (
                "nhwc",
                lambda g: ADAPTIVE_BACKWARD(g, _image(1, 2, 5, 7, nhwc=True)),
                [leaf((1, 2, 2, 3))],
            )
        ],
        "native_batch_norm": [
            (
                "training",
                lambda x, w, b: NNF.batch_norm(x, None, None, w, b, training=True),
                [leaf((2, 3, 2, 2)), leaf((3,), seed=1), leaf((3,), seed=2)],
            ),
            (
                "nhwc_training",
                lambda x, w: NNF.batch_norm(x, None, None, w, training=True),
                [nhwc((2, 3, 2, 2)), leaf((3,), seed=1)],
            ),
            (
                "eval_2d",
                lambda x, w, b: NNF.batch_norm(
                    x, const([0.1, -0.2, 0.3]), const([0.5, 1.0, 2.0]), w, b
                ),
                [leaf((4, 3)), leaf((3,), seed=1), leaf((3,), seed=2)],
            ),
            (
                "relu_training",
                lambda x, w, b: fused.batch_norm_relu(x, None, None, w, b, training=True),
                [leaf((2, 3, 2, 2)), leaf((3,), seed=1), leaf((3,), seed=2)],
            ),
            (
                "relu_nhwc_eval",
                lambda x, w: fused.batch_norm_relu(
                    x, const([0.1, -0.2, 0.3]), const([0.5, 1.0, 2.0]), w
                ),
                [nhwc((2, 3, 2, 2)), leaf((3,), seed=1)],
            ),
        ],
        "native_lstm_cell": [
            (
                "columns",
                lambda g, c: OPERATORS["native_lstm_cell"](g, c)[:2],
                [leaf((4, 3, 2), -2, 2), leaf((3, 2), seed=1)],
            ),
            (
                "h_only",
                lambda g, c: OPERATORS["native_lstm_cell"](g, c)[0],
                [leaf((4, 2)), leaf((2,))],
            ),
        ],
        "native_lstm_sequence": [
            (
                "every_output",
                lambda xw, h, c, w: OPERATORS["native_lstm_sequence"](xw, h, c, w)[:3],
                [
                    leaf((8, 3, 2), -2, 2),
                    leaf((2, 2), seed=1),
                    leaf((2, 2), seed=2),
                    leaf((8, 2), seed=3),
                ],
            ),
            (
                "c_n_one_step",
                lambda xw, h, c, w: OPERATORS["native_lstm_sequence"](xw, h, c, w)[2],
                [
                    leaf((12, 1, 1)),
                    leaf((3, 1), seed=1),
                    leaf((3, 1), seed=2),
                    leaf((12, 3), seed=3),
                ],
            ),
        ],
        "native_gru_sequence": [
            (
                "every_output",
                lambda xw, h, w, b: OPERATORS["native_gru_sequence"](xw, h, w, b)[:2],
                [
                    leaf((6, 3, 2), -2, 2),
                    leaf((2, 2), seed=1),
                    leaf((6, 2), seed=2),
                    leaf((6,), seed=3),
                ],
            ),
            (
                "h_n_one_step_no_bias",
                lambda xw, h, w: OPERATORS["native_gru_sequence"](xw, h, w, None)[1],
                [leaf((9, 1, 1)), leaf((3, 1), seed=1), leaf((9, 3), seed=2)],
            ),
        ],
        "native_layer_norm": [
            (
                "two_axes_affine",
                lambda x, w, b: NNF.layer_norm(x, (3, 2), w, b),
                [leaf((2, 3, 2)), leaf((3, 2), seed=1), leaf((3, 2), seed=2)],
            ),
            ("strided", lambda x: NNF.layer_norm(x, 3), [strided((4, 3))]),
        ],
        "native_group_norm": [
            (
                "affine",
                lambda x, w, b: NNF.group_norm(x, 2, w, b),
                [leaf((2, 4, 2, 3)), leaf((4,), seed=1), leaf((4,), seed=2)],
            ),
            (
                "nhwc",
                lambda x, w: NNF.group_norm(x, 3, w),
                [nhwc((2, 6, 2, 2)), leaf((6,), seed=1)],
            ),
        ],
        "embedding": [
            (
                "repeats",  # (padding_idx's zero gradient differs from differences)
                lambda w: NNF.embedding(index([[1, 4, 1], [0, 2, 1]]), w),
                [leaf((5, 3))],
            ),
        ],
        "native_scaled_dot_product_attention": [
            (
                "float_mask",
                lambda q, k, v, m: NNF.scaled_dot_product_attention(q, k, v, m),
                [
                    leaf((2, 3, 2)),
                    leaf((2, 4, 2), seed=1),
                    leaf((2, 4, 3), seed=2),
                    leaf((3, 4), seed=3),
                ],
            ),
            (
                "causal_views",
                lambda q, k, v: NNF.scaled_dot_product_attention(q, k, v, is_causal=True),
                [strided((3, 2)), strided((3, 2), seed=1, kind="step"), leaf((3, 2), seed=2)],
            ),
        ],
        "native_local_response_norm": [
            ("plain", lambda x: NNF.local_response_norm(x, 3, alpha=0.5, k=1.5), [leaf(IMAGE)]),
            (
                "nhwc_even_size",
                lambda x: NNF.local_response_norm(x, 4, alpha=0.5, beta=0.6, k=1.5),
                [nhwc((1, 5, 2, 2))],
            ),
        ],
        "relu": [("nhwc", NNF.relu, [nhwc(IMAGE)]), ("plain", NNF.relu, [away_from_zero(S)])],
        "relu_backward": [
            (
                "plain",
                lambda g: OPERATORS["relu_backward"](g, const([[0.5, 0.0, 2.0]])),
                [leaf((1, 3))],
            )
        ],
        "leaky_relu": [("plain", lambda x: NNF.leaky_relu(x, 0.2), [away_from_zero(S)])],
        "leaky_relu_backward": [
            (
                "plain",
                lambda g, x: OPERATORS["leaky_relu_backward"](g, x, 0.2),
                [leaf(S), away_from_zero(S, seed=1)],
            )
        ],
        "gelu": [
            ("erf", NNF.gelu, [leaf(S, -3, 3)]),
            ("tanh_nhwc", lambda x: NNF.gelu(x, approximate="tanh"), [nhwc((1, 2, 2, 2))]),
        ],
        "gelu_backward": [
            (
                "erf",
                lambda g, x: OPERATORS["gelu_backward"](g, x, "none"),
                [leaf(S), leaf(S, seed=1)],
            ),
            (
                "tanh",
                lambda g, x: OPERATORS["gelu_backward"](g, x, "tanh"),
                [leaf(S), leaf(S, seed=1)],
            ),
        ],
        "sigmoid": [("plain", NNF.sigmoid, [leaf(S, -3, 3)])],
        "silu": [("nhwc", NNF.silu, [nhwc((1, 2, 2, 2), -4, 4)])],
        "silu_backward": [
            ("plain", lambda g, x: OPERATORS["silu_backward"](g, x), [leaf(S), leaf(S, -4, 4, 1)])
        ],
        "tanh_backward": [
            ("plain", lambda g, y: OPERATORS["tanh_backward"](g, y), [leaf(S), leaf(S, -1, 1, 1)])
        ],
        "sigmoid_backward": [
            ("plain", lambda g, y: OPERATORS["sigmoid_backward"](g, y), [leaf(S), leaf(S, 0, 1, 1)])
        ],
        "hardtanh": [
            ("plain", lambda x: NNF.hardtanh(x, -0.5, 0.25), [leaf(S)]),
            ("relu6", NNF.relu6, [nhwc((1, 2, 2, 2), -2, 8)]),
        ],
        "hardtanh_backward": [
            (
                "plain",
                lambda g, x: OPERATORS["hardtanh_backward"](g, x, -0.5, 0.25),
                [leaf(S), leaf(S, seed=1)],
            )
        ],
        "hardswish": [("plain", NNF.hardswish, [leaf(S, -5, 5)])],
        "hardswish_backward": [
            (
                "plain",
                lambda g, x: OPERATORS["hardswish_backward"](g, x),
                [leaf(S), leaf(S, -5, 5, 1)],
            )
        ],
        "softmax": [
            ("last", lambda x: NNF.softmax(x, -1), [leaf(S, -2, 2)]),
            ("channels", lambda x: NNF.softmax(x, 1), [nhwc((1, 3, 2, 2))]),
        ],
        "log_softmax": [("first", lambda x: NNF.log_softmax(x, 0), [leaf(S, -2, 2)])],
        "softmax_backward": [
            (
                "last",
                lambda g, x: OPERATORS["softmax_backward"](g, NNF.softmax(x, -1), -1),
                [leaf(S), leaf(S, seed=1)],
            )
        ],
        "log_softmax_backward": [
            (
                "first",
                lambda g, x: OPERATORS["log_softmax_backward"](g, NNF.log_softmax(x, 0), 0),
                [leaf(S), leaf(S, seed=1)],
            )
        ],
        "nll_loss": [
            (
                "weighted_mean_ignore",
                lambda x: NNF.nll_loss(x, index([2, -100, 0, 1]), const([0.5, 1.0, 2.0])),
                [leaf((4, 3))],
            ),
            (
                "spatial_none",
                lambda x: NNF.nll_loss(x, index([[0, 2], [1, 1]]), reduction="none"),
                [leaf((2, 3, 2))],
            ),
            ("unbatched_sum", lambda x: NNF.nll_loss(x, index(1), reduction="sum"), [leaf((3,))]),
        ],
        "cross_entropy_loss": [
            (
                "ignore",
                lambda x: OPERATORS["cross_entropy_loss"](x, index([2, -100, 0, 1]), -100),
                [leaf((4, 3))],
            ),
        ],
        "mse_loss": [
            ("mean", NNF.mse_loss, [leaf(S), leaf(S, seed=1)]),
            ("none", lambda a, b: NNF.mse_loss(a, b, "none"), [leaf(S), leaf(S, seed=1)]),
        ],
        "smooth_l1_loss": [
            ("mean", NNF.smooth_l1_loss, [leaf(S, -2, 2), leaf(S, seed=1)]),
            (
                "none_beta",
                lambda a, b: NNF.smooth_l1_loss(a, b, "none", beta=0.3),
                [leaf(S, -2, 2), leaf(S, seed=1)],
            ),
        ],
        "nll_loss_backward": [  # the input gives only its shape: a constant
            (
                "mean-weight",
                lambda g: OPERATORS["nll_loss_backward"](
                    g,
                    const(np.zeros((4, 3))),
                    index([2, -100, 0, 1]),
                    const([0.5, 1.0, 2.0]),
                    -100,
                    "mean",
                ),
                [leaf(())],
            ),
            (
                "none",
                lambda g: OPERATORS["nll_loss_backward"](
                    g, const(np.zeros((2, 3, 2))), index([[0, 2], [1, 1]]), None, -100, "none"
                ),
                [leaf((2, 2), seed=2)],
            ),
        ],
        "smooth_l1_loss_backward": [
            (
                "mean",
                lambda g, x, t: OPERATORS["smooth_l1_loss_backward"](g, x, t, "mean", 0.5),
                [leaf(()), leaf(S, -2, 2), leaf(S, seed=1)],
            ),
            (
                "none",
                lambda g, x, t: OPERATORS["smooth_l1_loss_backward"](g, x, t, "none", 1.0),
                [leaf(S, seed=2), leaf(S, -2, 2), leaf(S, seed=1)],
            ),
        ],
        "binary_cross_entropy_with_logits": [
            ("mean", NNF.binary_cross_entropy_with_logits, [leaf(S, -4, 4), leaf(S, 0, 1, 1)]),
            (
                "weights_none",
                lambda a, b: NNF.binary_cross_entropy_with_logits(
                    a, b, const([0.5, 1.0, 2.0, 1.5]), "none", const([2.0, 0.5, 1.0, 3.0])
                ),
                [leaf((3, 4), -4, 4), leaf((3, 4), 0, 1, 1)],
            ),
        ],
        "to_layout": [
            ("nhwc", lambda x: NNF.to_layout(x, "NHWC") * 2.0, [leaf((1, 2, 2, 3))]),
            ("nchw", lambda x: NNF.to_layout(x, "NCHW") * 2.0, [nhwc((1, 2, 2, 3))]),
        ],
    }
)


def well_conditioned(shape, seed=0):
    """A float64 leaf whose matrices are the identity plus small noise: invertible,
    with distinct singular values."""
    rng = np.random.default_rng(seed)
    m, n = shape[-2:]
    data = np.eye(m, n) * (1.0 + np.arange(n)) + 0.3 * rng.uniform(-1, 1, shape)
    return lm.asarray(data, dtype=F64, device=DEVICE[0], requires_grad=True)


def symmetric(fn):
    """fn of the symmetric part of x (eigh and cholesky read one triangle)."""
    return lambda x: fn((x + x.mT) * 0.5)


def spd(fn):
    """fn of x @ x.mT + 1: symmetric positive definite."""
    return lambda x: fn(x @ x.mT + lm.eye(x.shape[-1], dtype=F64, device=DEVICE[0]))


LA = lm.linalg

# Array API 2024.12 (issue 15)
SAMPLES.update(
    {
        "reciprocal": [("plain", lm.reciprocal, [pos(S)])],
        "cumulative_sum": [
            ("axis", lambda x: lm.cumulative_sum(x, axis=1), [leaf((3, 4))]),
            (
                "initial",
                lambda x: lm.cumulative_sum(x, include_initial=True) * const([1, 2, 3, 4, 5]),
                [strided((4,), kind="s")],
            ),
        ],
        "cumulative_prod": [
            ("no_zero", lambda x: lm.cumulative_prod(x, axis=0), [leaf((3, 2), 0.5, 1.5)]),
            (
                "zeros",
                lambda x: lm.cumulative_prod(x, axis=1, include_initial=True),
                [const([[1.5, 0.0, -2.0, 0.0], [0.7, 1.2, 0.4, 3.0]]).requires_grad_()],
            ),
        ],
        "sort": [
            ("axis", lambda x: lm.sort(x, axis=0) * const([[1.0], [2.0], [3.0]]), [leaf((3, 2))]),
            (
                "descending",
                lambda x: lm.sort(x, descending=True) * const([1, 2, 3, 4]),
                [strided((4,), kind="s")],
            ),
        ],
        # lamina.linalg (issue 15)
        "inv": [
            ("plain", LA.inv, [well_conditioned((3, 3))]),
            ("batched", LA.inv, [well_conditioned((2, 2, 2))]),
        ],
        "det": [("batched", LA.det, [well_conditioned((2, 3, 3))])],
        "slogdet": [("logabsdet", lambda x: LA.slogdet(x).logabsdet, [well_conditioned((3, 3))])],
        "solve": [
            ("matrix", LA.solve, [well_conditioned((3, 3)), leaf((3, 2), seed=1)]),
            ("vector_batched", LA.solve, [well_conditioned((2, 3, 3)), leaf((3,), seed=1)]),
        ],
        "cholesky": [
            ("lower", spd(LA.cholesky), [leaf((3, 3))]),
            ("upper", spd(lambda a: LA.cholesky(a, upper=True)), [leaf((2, 3, 3))]),
        ],
        "qr": [
            ("tall", lambda x: LA.qr(x).Q * 1.0 + 0.0, [well_conditioned((4, 3))]),
            ("square_r", lambda x: LA.qr(x).R, [well_conditioned((3, 3))]),
            ("wide", lambda x: tuple(LA.qr(x)), [well_conditioned((2, 3, 4))]),
        ],
        "eigh": [
            ("values", symmetric(lambda a: LA.eigh(a).eigenvalues), [well_conditioned((3, 3))]),
            # eigenvectors up to sign: v * v does not depend on it
            (
                "vectors",
                symmetric(lambda a: LA.eigh(a).eigenvectors ** 2),
                [well_conditioned((3, 3))],
            ),
        ],
        "eigvalsh": [("plain", symmetric(LA.eigvalsh), [well_conditioned((2, 3, 3))])],
        "svd": [
            ("values", lambda x: LA.svd(x).S, [well_conditioned((4, 3))]),
            # U diag(S) Vh and U @ Vh do not depend on the signs of singular vectors
            (
                "vectors_tall",
                lambda x: (lambda u, s, vh: u @ vh)(*LA.svd(x, full_matrices=False)),
                [well_conditioned((4, 3))],
            ),
            (
                "vectors_wide",
                lambda x: (lambda u, s, vh: u @ vh)(*LA.svd(x, full_matrices=False)),
                [well_conditioned((3, 4))],
            ),
        ],
        "svdvals": [("plain", LA.svdvals, [well_conditioned((2, 3, 2))])],
        "diagonal": [
            ("offset", lambda x: LA.diagonal(x, offset=1) * const([1, 2]), [leaf((3, 3))]),
            ("negative", lambda x: LA.diagonal(x, offset=-1), [leaf((2, 3, 4))]),
        ],
        "vector_norm": [
            ("two", LA.vector_norm, [leaf((2, 3))]),
            ("axis_keepdims", lambda x: LA.vector_norm(x, axis=1, keepdims=True), [leaf((2, 3))]),
            ("ord3", lambda x: LA.vector_norm(x, axis=0, ord=3), [away_from_zero((3, 2))]),
            ("ord1", lambda x: LA.vector_norm(x, ord=1), [away_from_zero((4,))]),
            ("inf", lambda x: LA.vector_norm(x, axis=-1, ord=float("inf")), [leaf((2, 3))]),
        ],
    }
)


def _node_names(outputs):
    """Names of all nodes reachable from ``outputs``' grad_fns."""
    names, stack, seen = (
        set(),
        [o.grad_fn for o in outputs if isinstance(o, lm.Tensor) and o.grad_fn],
        set(),
    )
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        names.add(node.name)
        stack.extend(n for n, _ in filter(None, node.next_functions))
    return names


def _eye(n):
    return lm.eye(n, dtype=F64, device=DEVICE[0])  # gradcheck's float64, not the default


def _hermitian(fn):
    """fn of the Hermitian part of a complex leaf a, eigenvalues spread apart (eigh reads
    one triangle; close eigenvalues make its eigenvectors ill-conditioned)."""
    spread = np.diag([0.0, 1.5, 3.0])
    return lambda a: fn((a + LA.matrix_transpose(lm.conj(a))) * 0.5 + const(spread))


def _mH(a):
    return LA.matrix_transpose(lm.conj(a))


def _hermitian_pd(fn):
    """fn of a x a^H + 3 I (Hermitian positive definite) for a complex leaf a."""
    return lambda a: fn(a @ LA.matrix_transpose(lm.conj(a)) + 3.0 * _eye(a.shape[-1]))


FFT = lm.fft
# Complex inputs (Note [Complex gradients]), and the operators made for them: conj,
# real, imag and lamina.fft. Each formula of a complex-capable operator gets one.
COMPLEX_SAMPLES = {
    "add": [("complex", lm.add, [cleaf(S), cleaf((3,), seed=1)])],
    "subtract": [("real-complex", lm.subtract, [leaf(S), cleaf(S, seed=1)])],
    "multiply": [
        ("complex", lm.multiply, [cleaf(S), cleaf(S, seed=1)]),
        ("real-complex", lm.multiply, [leaf((3,)), cleaf(S, seed=1)]),
        ("scalar", lambda z: z * (2 - 1j), [cleaf(S)]),
    ],
    "divide": [("complex", lm.divide, [cleaf(S), cleaf(S, seed=1, lo=0.5, hi=1.5)])],
    "pow": [
        ("complex", lm.pow, [cleaf(S, lo=0.5, hi=1.5), cleaf(S, seed=1)]),
        ("real-base", lambda x, z: x**z, [leaf(S), cleaf(S, seed=1)]),
        ("integer", lambda z: z**3, [cleaf(S)]),
    ],
    "abs": [("complex", lm.abs, [cleaf(S)])],
    "sign": [("complex", lm.sign, [cleaf(S)])],
    "square": [("complex", lm.square, [cleaf(S)])],
    "conj": [("plain", lm.conj, [cleaf(S)]), ("real", lambda x: lm.conj(x) * 2.0, [leaf(S)])],
    "real": [("plain", lm.real, [cleaf(S)]), ("real", lambda x: lm.real(x) * 2.0, [leaf(S)])],
    "imag": [("plain", lm.imag, [cleaf(S)])],
    **{
        name: [("complex", getattr(lm, name), [cleaf(S, lo=-0.8, hi=0.8)])]
        for name in (
            "exp expm1 log log1p log2 log10 sqrt sin cos tan asin acos atan sinh cosh tanh "
            "asinh acosh atanh reciprocal"
        ).split()
    },
    "sum": [("complex", lambda z: lm.sum(z, axis=1), [cleaf(S)])],
    "mean": [("complex", lambda z: lm.mean(z, axis=0), [cleaf(S)])],
    "prod": [("complex", lambda z: lm.prod(z, axis=1), [cleaf(S)])],
    "var": [("complex", lambda z: lm.var(z, axis=1, correction=1.0), [cleaf(S)])],
    "std": [("complex", lm.std, [cleaf(S)])],
    "cumulative_sum": [("complex", lambda z: lm.cumulative_sum(z, axis=1), [cleaf(S)])],
    "cumulative_prod": [("complex", lambda z: lm.cumulative_prod(z, axis=1), [cleaf(S)])],
    "matmul": [("complex", lm.matmul, [cleaf((2, 3)), cleaf((3, 2), seed=1)])],
    "tensordot": [
        ("complex", lambda a, b: lm.tensordot(a, b, axes=1), [cleaf((2, 3)), cleaf((3,), seed=1)])
    ],
    "vecdot": [("complex", lm.vecdot, [cleaf(S), cleaf(S, seed=1)])],
    "inv": [("complex", lambda a: LA.inv(a + 3.0 * _eye(3)), [cleaf((3, 3))])],
    "det": [("complex", lambda a: LA.det(a + 3.0 * _eye(3)), [cleaf((3, 3))])],
    "slogdet": [("complex", lambda a: LA.slogdet(a + 3.0 * _eye(2)), [cleaf((2, 2))])],
    "solve": [("complex", lambda a, b: LA.solve(a + 3.0 * _eye(3), b), [cleaf((3, 3)), cleaf(3)])],
    "cholesky": [("complex", _hermitian_pd(LA.cholesky), [cleaf((3, 3))])],
    "eigvalsh": [("complex", _hermitian_pd(LA.eigvalsh), [cleaf((3, 3))])],
    "svdvals": [("complex", LA.svdvals, [cleaf((3, 2))])],
    # eigenvectors and singular vectors up to a phase each: the samples' functions do
    # not depend on it (Note [Gauge invariance] in autograd/derivatives.py)
    "eigh": [
        (
            "vectors_values",
            _hermitian(lambda h: (lambda w, v: (w, lm.abs(v) ** 2))(*LA.eigh(h))),
            [cleaf((3, 3))],
        ),
        (  # sin(H) = V diag(sin(w)) V^H
            "matrix_function",
            _hermitian(
                lambda h: (lambda w, v: (v * lm.sin(w)[..., None, :]) @ _mH(v))(*LA.eigh(h))
            ),
            [cleaf((2, 3, 3))],
        ),
    ],
    "svd": [
        (
            "tall",
            lambda x: (lambda u, s, vh: (lm.abs(u) ** 2, s, lm.abs(vh) ** 2))(
                *LA.svd(x, full_matrices=False)
            ),
            [cleaf((4, 3))],
        ),
        (  # U diag(S**2) Vh: U's and V's phases cancel
            "wide",
            lambda x: (lambda u, s, vh: (u * (s**2)[..., None, :]) @ vh)(
                *LA.svd(x, full_matrices=False)
            ),
            [cleaf((2, 3, 4))],
        ),
        ("full_square", lambda x: (lambda u, s, vh: u @ vh)(*LA.svd(x)), [cleaf((3, 3))]),
        (  # the reduced part of full U: the rest's gradient is 0
            "full_tall",
            lambda x: (lambda u, s, vh: lm.abs(u[:, :2]) ** 2 * s)(*LA.svd(x)),
            [cleaf((3, 2))],
        ),
        ("pinv", LA.pinv, [cleaf((3, 2))]),
    ],
    "qr": [
        ("tall", lambda x: tuple(LA.qr(x)), [cleaf((4, 3))]),
        ("wide", lambda x: tuple(LA.qr(x)), [cleaf((2, 3))]),
        ("square_complete", lambda x: tuple(LA.qr(x, mode="complete")), [cleaf((2, 3, 3))]),
        ("wide_complete", lambda x: LA.qr(x, mode="complete").Q, [cleaf((2, 4))]),
    ],
    "vector_norm": [("complex", lambda z: LA.vector_norm(z, axis=1, ord=3), [cleaf(S)])],
    "fft": [
        ("plain", FFT.fft, [cleaf(S)]),
        ("real-padded", lambda x: FFT.fft(x, n=5, axis=0, norm="ortho"), [leaf(S)]),
    ],
    "ifft": [("trimmed", lambda z: FFT.ifft(z, n=2, norm="forward"), [cleaf(S)])],
    "fftn": [("s", lambda z: FFT.fftn(z, s=(3, 2), axes=(0, 1)), [cleaf(S)])],
    "ifftn": [("ortho", lambda z: FFT.ifftn(z, norm="ortho"), [cleaf(S)])],
    "rfft": [("plain", FFT.rfft, [leaf((2, 5))]), ("n", lambda x: FFT.rfft(x, n=4), [leaf(S)])],
    "rfftn": [("s", lambda x: FFT.rfftn(x, s=(2, 4), axes=(0, 1), norm="forward"), [leaf(S)])],
    "irfft": [
        ("plain", FFT.irfft, [cleaf(S)]),
        ("odd", lambda z: FFT.irfft(z, n=5, axis=0, norm="ortho"), [cleaf(S)]),
    ],
    "irfftn": [("plain", FFT.irfftn, [cleaf(S)])],
    "hfft": [("plain", lambda z: FFT.hfft(z, n=5), [cleaf(S)])],
    "ihfft": [("plain", lambda x: FFT.ihfft(x, norm="ortho"), [leaf((2, 5))])],
}
for _name, _samples in COMPLEX_SAMPLES.items():
    SAMPLES.setdefault(_name, []).extend(_samples)


CASES = [
    pytest.param(name, *sample[1:3], sample[3] if len(sample) > 3 else {}, id=f"{name}-{sample[0]}")
    for name, samples in SAMPLES.items()
    for sample in samples
]


@pytest.mark.parametrize("name, fn, args, kwargs", CASES)
def test_gradcheck(name, fn, args, kwargs):
    out = fn(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    assert name in _node_names(outs), f"sample does not exercise {name}"
    assert gradcheck(fn, args, **kwargs)


def _outputs_and_gradients(fn, args):
    leaves = [a for a in args if isinstance(a, lm.Tensor) and a.requires_grad]
    out = fn(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    total = 0.0
    for o in outs:
        if o.dtype.kind == "c":  # a real loss of a complex output
            o = lm.real(o) + 0.5 * lm.imag(o)
        total = total + lm.sum(o * const(np.linspace(0.5, 1.5, o.size).reshape(o.shape)))
    grads = lm.autograd.grad(total, leaves, allow_unused=True)
    return [o.to("cpu").numpy() for o in outs], [
        None if g is None else g.to("cpu").numpy() for g in grads
    ]


def _on_device(a, device):
    if not isinstance(a, lm.Tensor):
        return a
    moved = a.detach().to(device)
    return moved.requires_grad_() if a.requires_grad else moved


# every device a plugin added: the example's "counting" here; tests/test_plugin_devices.py
# runs this test again with three more third-party plugins installed
PLUGIN_DEVICES = [
    d for d in lm.dispatch.keys.devices() if d not in ("cpu", "meta")
]  # meta: no values


@pytest.mark.parametrize("device", PLUGIN_DEVICES)
@pytest.mark.parametrize("name, fn, args, kwargs", CASES)
def test_every_sample_runs_on_a_plugin_device(name, fn, args, kwargs, device):
    """Formulas use dispatched operators only, so a sample gives the CPU's values and
    gradients on a plugin's device (its kernels and the CPU fallback of
    lamina.backends); every tensor of the computation stays there."""
    want_outs, want_grads = _outputs_and_gradients(fn, args)
    DEVICE[0] = device
    try:
        dev_args = [_on_device(a, device) for a in args]
        out = fn(*dev_args)
        for o in out if isinstance(out, (tuple, list)) else (out,):
            assert o.device == device, name
        got_outs, got_grads = _outputs_and_gradients(fn, dev_args)
    finally:
        DEVICE[0] = "cpu"
    for got, want in zip(got_outs + got_grads, want_outs + want_grads):
        assert (got is None) == (want is None), name
        if want is not None:
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("device", PLUGIN_DEVICES)
@pytest.mark.parametrize(
    "name, fn, args, kwargs",
    [
        pytest.param(name, *first[1:3], first[3] if len(first) > 3 else {}, id=f"{name}-{first[0]}")
        for name, (first, *_) in SAMPLES.items()
    ],
)
def test_gradcheck_on_a_plugin_device(name, fn, args, kwargs, device):
    """gradcheck is device-generic: the first sample of each formula, checked against
    finite differences computed on the plugin's device."""
    DEVICE[0] = device
    try:
        assert gradcheck(fn, [_on_device(a, device) for a in args], **kwargs)
    finally:
        DEVICE[0] = "cpu"


def test_every_formula_has_samples():
    missing = sorted(set(DERIVATIVES) - set(SAMPLES))
    assert not missing, f"derivative formulas without gradcheck samples: {missing}"
    assert not set(SAMPLES) - set(DERIVATIVES)


def test_every_differentiable_operator_has_a_formula():
    for op in OPERATORS.values():
        name = op.inplace_of.name if op.inplace_of else op.name
        if op.differentiable:
            assert name in DERIVATIVES, op.name
        else:
            assert name not in DERIVATIVES, op.name


def test_gradcheck_catches_a_wrong_formula(monkeypatch):
    d = DERIVATIVES["sin"]
    monkeypatch.setattr(d, "formula", lambda g, r, n, x: (g * lm.cos(x) * 1.01,))
    x = leaf(S)
    with pytest.raises(AssertionError, match="finite differences"):
        gradcheck(lm.sin, [x])
    assert gradcheck(lm.sin, [x], raise_exception=False) is False


def test_gradcheck_refuses_to_check_nothing():
    x = leaf(S)
    with pytest.raises(ValueError, match="no input"):
        gradcheck(lm.sin, [x.detach()])
    with pytest.raises(ValueError, match="no output"):
        gradcheck(lambda t: lm.sin(t.detach()), [x])
    with pytest.raises(TypeError, match="float64"):
        gradcheck(lm.sin, [lm.ones(3, requires_grad=True, dtype=lm.float32)])


# ---------------------------------------------------------------- ties and zeros


def test_max_min_ties_share_the_gradient_evenly():
    x = const([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]]).requires_grad_()
    lm.max(x).backward()
    assert x.grad.tolist() == [[0.0, 0.5, 0.5], [0.0, 0.0, 0.0]]
    x.grad = None
    lm.sum(lm.max(x, axis=1) * const([1.0, 3.0])).backward()
    assert np.allclose(x.grad.numpy(), [[0, 0.5, 0.5], [1, 1, 1]])
    x.grad = None
    lm.sum(lm.min(x, axis=0, keepdims=True)).backward()
    assert x.grad.tolist() == [[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]
    x.grad = None
    lm.min(x * -1.0).backward()  # the two 3.0s tie for the minimum of -x
    assert x.grad.tolist() == [[0.0, -0.5, -0.5], [0.0, 0.0, 0.0]]
    x.grad = None
    lm.min(lm.reshape(x, (-1,))[3:]).backward()  # three-way tie
    assert np.allclose(x.grad.numpy(), [[0, 0, 0], [1 / 3, 1 / 3, 1 / 3]])


def test_maximum_minimum_ties_split_the_gradient():
    a = const([1.0, 2.0, 3.0]).requires_grad_()
    b = const([2.0, 2.0, 1.0]).requires_grad_()
    lm.sum(lm.maximum(a, b)).backward()
    assert a.grad.tolist() == [0.0, 0.5, 1.0]
    assert b.grad.tolist() == [1.0, 0.5, 0.0]
    a.grad = b.grad = None
    lm.sum(lm.minimum(a, b)).backward()
    assert a.grad.tolist() == [1.0, 0.5, 0.0]
    assert b.grad.tolist() == [0.0, 0.5, 1.0]
    a.grad = None
    lm.sum(lm.maximum(a, 2.0)).backward()  # a scalar operand tying with an element
    assert a.grad.tolist() == [0.0, 0.5, 1.0]


def test_prod_with_zeros():
    x = const([2.0, 0.0, 3.0, 4.0]).requires_grad_()
    lm.prod(x).backward()
    assert x.grad.tolist() == [0.0, 24.0, 0.0, 0.0]  # only the zero gets a gradient
    y = const([2.0, 0.0, 3.0, 0.0]).requires_grad_()
    lm.prod(y).backward()
    assert y.grad.tolist() == [0.0, 0.0, 0.0, 0.0]  # two zeros: all vanish
    z = const([[2.0, 0.5], [0.0, 3.0]]).requires_grad_()
    lm.sum(lm.prod(z, axis=1)).backward()
    assert z.grad.tolist() == [[0.5, 2.0], [3.0, 0.0]]


def test_broadcast_gradients_are_summed_to_the_input_shape():
    a = leaf((2, 1, 3))
    b = leaf((4, 1), seed=1)
    c = leaf((), seed=2)
    lm.sum(a * b + c).backward()
    assert a.grad.shape == (2, 1, 3) and b.grad.shape == (4, 1) and c.grad.shape == ()
    assert np.allclose(a.grad.numpy(), np.broadcast_to(b.numpy().sum(), (2, 1, 3)))
    assert np.allclose(b.grad.numpy(), np.full((4, 1), a.numpy().sum()))
    assert c.grad.item() == 24.0


def test_non_contiguous_leaf_gets_a_gradient_of_its_shape():
    x = strided((3, 4))
    lm.sum(x * const(np.arange(12.0).reshape(3, 4))).backward()
    assert x.grad.shape == (3, 4)
    assert x.grad.tolist() == np.arange(12.0).reshape(3, 4).tolist()


def test_astype_gradient_returns_to_the_input_dtype():
    x = leaf((3,))
    y = lm.astype(x, lm.float32)
    assert y.requires_grad and y.dtype == lm.float32
    lm.sum(y * 2.0).backward()
    assert x.grad.dtype == F64 and x.grad.tolist() == [2.0, 2.0, 2.0]
    w = lm.ones(3, dtype=lm.float32, requires_grad=True)
    lm.sum(w * x).backward()  # promoted to float64; w's gradient comes back as float32
    assert w.grad.dtype == lm.float32
    assert np.allclose(w.grad.numpy(), x.numpy())


def test_integer_and_bool_operands_do_not_need_gradients():
    x = leaf((3,))
    i = lm.asarray([1, 2, 3], dtype=lm.int64)
    lm.sum(x * i + lm.where(i > 1, x, 0.0)).backward()
    assert x.grad.tolist() == [1.0, 3.0, 4.0]


# ---------------------------------------------------------------- user API


@pytest.mark.parametrize(
    "make",
    [
        lambda: lm.zeros((2, 3), dtype=F64, requires_grad=True),
        lambda: lm.ones(3, requires_grad=True),
        lambda: lm.full((2,), 1.5, requires_grad=True),
        lambda: lm.empty((2,), dtype=F64, requires_grad=True),
        lambda: lm.arange(0.0, 3.0, requires_grad=True),
        lambda: lm.linspace(0.0, 1.0, 5, requires_grad=True),
        lambda: lm.eye(3, dtype=F64, requires_grad=True),
        lambda: lm.asarray([1.0, 2.0], requires_grad=True),
        lambda: lm.zeros_like(lm.ones(3, dtype=F64), requires_grad=True),
        lambda: lm.ones_like(lm.ones(3, dtype=F64), requires_grad=True),
        lambda: lm.full_like(lm.ones(3, dtype=F64), 2.0, requires_grad=True),
        lambda: lm.empty_like(lm.ones(3, dtype=F64), requires_grad=True),
        lambda: lm.rand(2, 2, dtype=F64, requires_grad=True),
        lambda: lm.randn(2, dtype=F64, requires_grad=True),
    ],
)
def test_creation_functions_take_requires_grad(make):
    t = make()
    assert t.requires_grad and t.is_leaf and t.grad_fn is None and t.grad is None
    lm.sum(t * 2.0).backward()
    assert t.grad.shape == t.shape and np.all(t.grad.numpy() == 2.0)


def test_creation_functions_default_to_no_grad():
    assert not lm.ones(3, dtype=F64).requires_grad
    assert not lm.asarray([1.0]).requires_grad
    assert not lm.zeros(2, dtype=F64, requires_grad=False).requires_grad


def test_asarray_of_a_tensor_with_requires_grad_does_not_flag_the_input():
    base = lm.ones(3, dtype=F64)
    t = lm.asarray(base, requires_grad=True)
    assert t.requires_grad and not base.requires_grad
    assert np.shares_memory(t.numpy(), base.numpy())


def test_requires_grad_underscore_and_setter():
    t = lm.ones(3, dtype=F64)
    assert t.requires_grad_() is t and t.requires_grad and t.is_leaf
    t.requires_grad_(False)
    assert not t.requires_grad
    t.requires_grad = True
    assert t.requires_grad
    y = t * 2.0
    with pytest.raises(RuntimeError, match="leaf"):
        y.requires_grad_(False)


@pytest.mark.parametrize("dtype", [lm.int64, lm.int32, lm.uint8, lm.bool])
def test_non_float_dtypes_cannot_require_grad(dtype):
    with pytest.raises(TypeError, match="floating-point"):
        lm.zeros(3, dtype=dtype, requires_grad=True)
    t = lm.zeros(3, dtype=dtype)
    with pytest.raises(TypeError, match="floating-point"):
        t.requires_grad_()
    with pytest.raises(TypeError, match="floating-point"):
        t.requires_grad = True
    assert not t.requires_grad


def test_integer_arange_cannot_require_grad():
    with pytest.raises(TypeError):
        lm.arange(3, requires_grad=True)
    with pytest.raises(TypeError):
        lm.asarray([1, 2], requires_grad=True)


def test_grad_accumulates_over_backward_calls():
    x = leaf((3,))
    lm.sum(x * 2.0).backward()
    first = x.grad.tolist()
    lm.sum(x * x).backward()
    assert np.allclose(x.grad.numpy(), np.array(first) + 2 * x.numpy())
    x.grad = None
    lm.sum(x).backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0]


def test_grad_owns_its_storage():
    a = leaf((3,))
    b = leaf((3,), seed=1)
    v = const([1.0, 2.0, 3.0])
    (a + b).backward(v)
    assert a.grad.tolist() == [1.0, 2.0, 3.0] == b.grad.tolist()
    a.grad += 1.0  # must change neither b's gradient nor the caller's tensor
    assert b.grad.tolist() == [1.0, 2.0, 3.0] and v.tolist() == [1.0, 2.0, 3.0]
    x = leaf((3,))
    lm.sum(x).backward()  # the formula's gradient is a broadcast view
    x.grad *= 2.0
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def _copies(monkeypatch):
    """Counts the copies the engine makes of first gradients (it calls the copy
    operator through OPERATORS at each use)."""
    made = []
    copy = OPERATORS["copy"]

    def counted(x):
        made.append(x.shape)
        return copy(x)

    monkeypatch.setitem(OPERATORS, "copy", counted)
    return made


def test_sole_storage_sees_every_other_holder():
    """dispatch.tensor.sole_storage, which the engine relies on: a view, a detached
    tensor or the caller's array sharing the storage makes it not sole."""
    fresh = [lm.ones((3, 4)), lm.ones(5), lm.ones((0, 3)), lm.asarray(2.0), lm.ones((2, 3)).T]
    for t in fresh:
        assert sole_storage(t)
    t = fresh[0]
    for other in (lambda: lm.reshape(t, (12,)), t.detach, lambda: t[1:], lambda: t.numpy()):
        held = other()
        assert not sole_storage(t)
        del held
        assert sole_storage(t)
    arr = np.ones(3)
    assert not sole_storage(lm.asarray(arr))  # arr is the storage
    assert not sole_storage(lm.broadcast_to(lm.ones(1), (4,)))  # a part-view of one value
    assert tensor._counts_as_expected()  # the import-time check, on this interpreter


def test_sole_storage_says_false_where_references_count_otherwise(monkeypatch):
    monkeypatch.setattr(tensor, "_COUNTS_AS_EXPECTED", False)
    assert not sole_storage(lm.ones(3))
    x = leaf((3,))
    lm.exp(x).backward(const(np.ones(3)))  # copied, still right
    assert np.allclose(x.grad.numpy(), np.exp(x.numpy()))


def test_a_fresh_first_gradient_is_taken_over_not_copied(monkeypatch):
    """Note [Taking gradients over]: exp's gradient is a new tensor nothing else holds."""
    made = _copies(monkeypatch)
    x = leaf((4, 3))
    lm.exp(x).backward(const(np.ones((4, 3))))
    assert made == []
    assert np.allclose(x.grad.numpy(), np.exp(x.numpy()))
    x.grad += 1.0  # the next step's accumulation: no one else sees it
    assert np.allclose(x.grad.numpy(), np.exp(x.numpy()) + 1.0)


def test_a_first_gradient_others_can_see_is_copied(monkeypatch):
    made = _copies(monkeypatch)
    # the caller's gradient, passed through unchanged by add
    x = leaf((3,))
    v = const([1.0, 2.0, 3.0])
    (x + 1.0).backward(v)
    # a view of it (reshape's backward)
    y = leaf((6,))
    w = const(np.arange(6.0).reshape(2, 3))
    lm.reshape(y, (2, 3)).backward(w)
    # a fresh gradient that a hook keeps
    z, kept = leaf((3,)), []
    z.register_hook(lambda g: kept.append(g))
    lm.exp(z).backward(const(np.ones(3)))
    # a fresh gradient (multiply's) that add passes on to two leaves: the first to
    # arrive is copied, the second, then alone, is taken over
    a, b = leaf((3,)), leaf((3,), seed=1)
    ((a + b) * 2.0).backward(const(np.ones(3)))
    assert len(made) == 4
    for grad, other in ((x.grad, v), (y.grad, w), (z.grad, kept[0]), (a.grad, b.grad)):
        assert not np.shares_memory(grad.numpy(), other.numpy())


def test_a_read_only_gradient_is_copied_writable():
    """sum's gradient is a broadcast view, read-only; over size-1 axes it is as big as
    its storage, but must not become .grad (found by review)."""
    for shape in ((), (1,), (1, 3)):
        x = leaf(shape)
        lm.sum(lm.sum(x, axis=0) * 2.0 if shape == (1, 3) else x * 2.0).backward()
        x.grad += 1.0
        assert np.allclose(x.grad.numpy(), 3.0)


def test_a_taken_or_copied_gradient_keeps_the_leafs_layout():
    x = lm.nn.functional.to_layout(const(np.ones((2, 3, 4, 5))), "NHWC").requires_grad_()
    g = lm.nn.functional.to_layout(const(np.ones((2, 3, 4, 5))), "NHWC")
    lm.nn.functional.relu(x).backward(g)  # a fresh gradient, taken over
    assert lm.nn.functional.layout_of(x.grad) == "NHWC"
    x.grad = None
    (x + 0.0).backward(g)  # g itself reaches the leaf: copied
    assert lm.nn.functional.layout_of(x.grad) == "NHWC"
    assert not np.shares_memory(x.grad.numpy(), g.numpy())


def test_grad_fn_and_is_leaf():
    x = leaf((3,))
    c = const([1.0, 2.0, 3.0])
    assert x.is_leaf and x.grad_fn is None
    assert c.is_leaf and c.grad_fn is None and not c.requires_grad
    y = x * c
    assert not y.is_leaf and y.requires_grad and y.grad_fn.name == "multiply"
    (edge_x, edge_c) = y.grad_fn.next_functions
    assert edge_c is None
    assert edge_x[0].name == "AccumulateGrad" and edge_x[0].variable is x
    assert edge_x[0].next_functions == ()
    z = lm.exp(c)  # no input requires grad: nothing recorded
    assert not z.requires_grad and z.grad_fn is None and z.is_leaf
    a, b = lm.split(x, [1, 2])
    assert a.grad_fn is b.grad_fn and a.grad_fn.name == "split"


def test_detach():
    x = leaf((3,))
    d = x.detach()
    assert not d.requires_grad and d.is_leaf and d.grad_fn is None
    assert np.shares_memory(d.numpy(), x.numpy())
    lm.sum(x.detach() * x).backward()  # the detached factor is a constant
    assert np.allclose(x.grad.numpy(), x.numpy())
    y = lm.exp(x)
    assert not y.detach().requires_grad and y.requires_grad


def test_backward_with_gradient_for_non_scalar_outputs():
    x = leaf((2, 3))
    y = x * 3.0
    y.backward(const(np.arange(6.0).reshape(2, 3)))
    assert x.grad.tolist() == (3.0 * np.arange(6.0).reshape(2, 3)).tolist()
    x.grad = None
    (x * 3.0).backward(np.ones((2, 3)))  # array-likes are accepted too
    assert np.all(x.grad.numpy() == 3.0)


def test_backward_errors():
    x = leaf((2, 3))
    with pytest.raises(RuntimeError, match="implicitly"):
        (x * 2.0).backward()
    with pytest.raises(ValueError, match="shape"):
        (x * 2.0).backward(lm.ones(3, dtype=F64))
    with pytest.raises(RuntimeError, match="does not require grad"):
        lm.sum(const([1.0, 2.0])).backward()
    with lm.no_grad():
        y = lm.sum(x * 2.0)
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.backward()
    assert x.grad is None


def test_autograd_backward_function():
    x = leaf((2,))
    lm.autograd.backward([lm.sum(x * 2.0), x * 3.0], [None, const([1.0, 2.0])])
    assert x.grad.tolist() == [5.0, 8.0]


def test_autograd_grad():
    x = leaf((3,))
    w = leaf((3,), seed=1)
    y = x * w
    gx, gw = lm.autograd.grad(y, [x, w], grad_outputs=const([1.0, 2.0, 3.0]))
    assert np.allclose(gx.numpy(), w.numpy() * [1, 2, 3])
    assert np.allclose(gw.numpy(), x.numpy() * [1, 2, 3])
    assert x.grad is None and w.grad is None  # returned, not accumulated
    assert not gx.requires_grad
    (g,) = lm.autograd.grad(lm.sum(x * x), x)
    assert np.allclose(g.numpy(), 2 * x.numpy())


def test_autograd_grad_allow_unused():
    x, u = leaf((3,)), leaf((2,), seed=1)
    y = lm.sum(x * 2.0)
    with pytest.raises(RuntimeError, match="allow_unused"):
        lm.autograd.grad(y, [x, u], retain_graph=True)
    gx, gu = lm.autograd.grad(y, [x, u], allow_unused=True)
    assert gu is None and gx.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(RuntimeError, match="does not require grad"):
        lm.autograd.grad(lm.sum(x * 2.0), [const([1.0])])


def test_autograd_grad_of_an_intermediate():
    x = leaf((3,))
    h = x * 2.0
    y = lm.sum(h * h)
    (gh,) = lm.autograd.grad(y, h)
    assert np.allclose(gh.numpy(), 2 * h.detach().numpy())
    assert x.grad is None


def test_autograd_grad_create_graph():
    x = leaf((4,))
    (g,) = lm.autograd.grad(lm.sum(x**3.0), x, create_graph=True)
    assert g.requires_grad and g.grad_fn is not None
    assert np.allclose(g.numpy(), 3 * x.numpy() ** 2)
    (gg,) = lm.autograd.grad(lm.sum(g), x)
    assert np.allclose(gg.numpy(), 6 * x.numpy())


def test_register_hook_on_a_leaf():
    x = leaf((3,))
    seen = []
    handle = x.register_hook(lambda g: seen.append(g.tolist()))
    lm.sum(x * 2.0).backward()
    assert seen == [[2.0, 2.0, 2.0]] and x.grad.tolist() == [2.0, 2.0, 2.0]
    handle.remove()
    lm.sum(x * 2.0).backward()
    assert len(seen) == 1
    x.grad = None
    x.register_hook(lambda g: g * 10.0)  # a returned tensor replaces the gradient
    lm.sum(x * 2.0).backward()
    assert x.grad.tolist() == [20.0, 20.0, 20.0]


def test_register_hook_on_a_non_leaf():
    x = leaf((3,))
    h = x * 2.0
    seen = []
    h.register_hook(lambda g: seen.append(g.tolist()))
    h.register_hook(lambda g: g * const([1.0, 0.0, -1.0]))
    lm.sum(h * const([1.0, 2.0, 3.0])).backward()
    assert seen == [[1.0, 2.0, 3.0]]
    assert x.grad.tolist() == [2.0, 0.0, -6.0]
    with pytest.raises(RuntimeError):
        const([1.0]).register_hook(lambda g: g)


def test_register_hook_on_one_output_of_split():
    x = leaf((4,))
    a, b = lm.split(x, 2)
    b.register_hook(lambda g: g * 0.0)
    lm.sum(a * 3.0 + b * 5.0).backward()
    assert x.grad.tolist() == [3.0, 3.0, 0.0, 0.0]


def test_split_into_one_piece():
    """A split of one piece is a one-output node, whose gradient comes alone."""
    x = leaf((2, 1, 3))
    (piece,) = lm.split(x, 1, axis=1)
    (g,) = lm.autograd.grad(lm.sum(piece[1] * 3.0), [x])
    np.testing.assert_array_equal(g.numpy(), [[[0.0] * 3], [[3.0] * 3]])


def test_no_grad_and_enable_grad():
    x = leaf((3,))
    assert lm.autograd.is_grad_enabled()
    with lm.no_grad():
        assert not lm.autograd.is_grad_enabled()
        y = x * 2.0
        with lm.enable_grad():
            z = x * 2.0
        assert not lm.autograd.is_grad_enabled()
    assert lm.autograd.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad and z.grad_fn is not None


def test_grad_mode_decorators():
    x = leaf((3,))

    @lm.no_grad()
    def f():
        return x * 2.0

    @lm.enable_grad()
    def g():
        return x * 2.0

    @lm.set_grad_enabled(False)
    def h():
        return x * 2.0

    assert lm.autograd.is_grad_enabled()  # decorating changed nothing
    assert not f().requires_grad and not h().requires_grad
    with lm.no_grad():
        assert g().requires_grad
        assert not lm.autograd.is_grad_enabled()
    assert lm.autograd.is_grad_enabled()

    @lm.no_grad()
    def fails():
        raise KeyError

    with pytest.raises(KeyError):
        fails()
    assert lm.autograd.is_grad_enabled()  # restored on error


def test_set_grad_enabled():
    x = leaf((3,))
    with lm.set_grad_enabled(False):
        assert not (x * 2.0).requires_grad
        with lm.set_grad_enabled(True):
            assert (x * 2.0).requires_grad
    assert (x * 2.0).requires_grad
    try:
        lm.set_grad_enabled(False)  # a plain call takes effect at once
        assert not lm.autograd.is_grad_enabled() and not (x * 2.0).requires_grad
    finally:
        lm.set_grad_enabled(True)
    assert lm.autograd.is_grad_enabled()


def test_autograd_layer_switched_off_records_nothing():
    from lamina import layers

    x = leaf((3,))
    with layers.off("autograd"):
        with lm.enable_grad():
            y = x * 2.0
    assert not y.requires_grad and y.grad_fn is None
    assert (x * 2.0).requires_grad


def test_grad_mode_is_thread_local():
    x = leaf((3,))
    entered, recorded = threading.Event(), threading.Event()
    results = {}

    def quiet():
        with lm.no_grad():
            entered.set()
            recorded.wait(10)
            results["quiet"] = (x * 2.0).requires_grad

    def busy():
        entered.wait(10)
        results["busy_mode"] = lm.autograd.is_grad_enabled()
        results["busy"] = (x * 2.0).requires_grad
        recorded.set()

    threads = [threading.Thread(target=quiet), threading.Thread(target=busy)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == {"quiet": False, "busy_mode": True, "busy": True}
    assert lm.autograd.is_grad_enabled()


# ---------------------------------------------------------------- error cases


def test_inplace_on_a_leaf_requiring_grad_raises():
    x = leaf((3,))
    before = x.tolist()
    with pytest.raises(RuntimeError, match="leaf"):
        x += 1.0
    with pytest.raises(RuntimeError, match="leaf"):
        x *= const([1.0, 2.0, 3.0])
    with pytest.raises(RuntimeError, match="leaf"):
        x[0] = 5.0
    with pytest.raises(RuntimeError, match="view of a leaf"):
        view = x[1:]
        view += 1.0
    with pytest.raises(RuntimeError, match="view of a leaf"):
        lm.flip(lm.reshape(x, (3, 1)), axis=0)[0] = 5.0
    assert x.tolist() == before
    copy = x[lm.asarray([0, 1], dtype=lm.int64)]  # advanced indexing copies: allowed
    copy += 1.0
    assert x.tolist() == before
    with lm.no_grad():  # allowed where nothing is recorded (optimizer updates)
        x -= 1.0
        x[0] = 5.0
    assert x.tolist() == [5.0] + [v - 1.0 for v in before[1:]]
    assert x.requires_grad and x.is_leaf


def test_inplace_on_a_saved_input_that_does_not_require_grad():
    x = leaf((3,))
    a = lm.ones(3, dtype=F64)
    y = lm.sum(a * x)
    a += 1.0
    with pytest.raises(RuntimeError, match="in-place.*version"):
        y.backward()


def test_inplace_on_a_saved_non_leaf():
    x = leaf((3,))
    h = x * 2.0
    y = lm.sum(h * h)
    h += 1.0  # allowed on a non-leaf: h becomes the output of add
    assert h.grad_fn.name == "add"
    with pytest.raises(RuntimeError, match="in-place.*version"):
        y.backward()


def test_inplace_on_a_saved_result():
    x = leaf((3,))
    y = lm.exp(x)  # exp's formula uses its result
    y *= 2.0
    with pytest.raises(RuntimeError, match="in-place.*version"):
        lm.sum(y).backward()


@pytest.mark.parametrize("history", ["nothing modified yet", "storage modified before"])
def test_saved_tensor_versions_in_both_recording_modes(history):
    """Nodes record versions only once some storage has been written in place (else
    every version is 0 and nothing is stored): both modes must catch a later write, and
    neither may raise without one. Saved arguments, a saved list (stack) and a saved
    result (exp) are covered."""
    from lamina.dispatch import tensor as _tensor

    kept = dict(_tensor.versions)
    _tensor.versions.clear()
    try:
        if history == "storage modified before":
            other = lm.ones(2)
            other += 1.0
        for modify in (False, True):
            x = leaf((3,))
            a = lm.ones(3, dtype=F64)
            h = x * 2.0
            e = lm.exp(x)
            outputs = [
                lm.sum(a * x),
                lm.sum(lm.stack([h, a])),
                lm.sum(e),
                lm.sum(h * 3.0),
                lm.sum(0.5 / h),
            ]
            if modify:
                a += 1.0
                h += 1.0
                e *= 2.0  # exp's formula uses its result
            for y in outputs:
                if modify:
                    with pytest.raises(RuntimeError, match="in-place.*version"):
                        y.backward(retain_graph=True)
                else:
                    y.backward(retain_graph=True)
    finally:
        _tensor.versions.clear()
        _tensor.versions.update(kept)


def test_inplace_through_a_view_of_a_saved_tensor():
    x = leaf((2, 3))
    h = x * 1.0
    y = lm.sum(lm.sin(h))
    row = h[0]
    with pytest.raises(RuntimeError, match="view with autograd is not supported"):
        row += 1.0  # refused with grad on: h's graph would not learn of the write
    with lm.no_grad():
        row += 1.0  # writes h's storage
    with pytest.raises(RuntimeError, match="in-place.*version"):
        y.backward()


def test_inplace_through_a_view_with_grad_is_refused_not_wrong():
    x = leaf((3,))
    h = x * 1.0
    with pytest.raises(RuntimeError, match="view with autograd"):
        v = h[0:2]
        v *= 3.0
    base = lm.ones(3)  # a constant, written through a view with a value that needs grad
    with pytest.raises(RuntimeError, match="view with autograd"):
        view = base[0:2]
        view += x[0:2]
    assert base.tolist() == [1.0, 1.0, 1.0]


def test_inplace_on_a_non_leaf_is_differentiated():
    x = leaf((3,))
    w = leaf((3,), seed=1)
    h = x * 1.0
    h *= w
    h += x
    h[1] = 0.0
    lm.sum(h * const([1.0, 2.0, 3.0])).backward()
    assert np.allclose(x.grad.numpy(), (w.numpy() + 1) * [1, 0, 3])
    assert np.allclose(w.grad.numpy(), x.numpy() * [1, 0, 3])


def test_modification_after_backward_is_fine():
    x = leaf((3,))
    a = lm.ones(3, dtype=F64)
    lm.sum(a * x).backward()
    a += 1.0
    assert x.grad.tolist() == [1.0, 1.0, 1.0]


def test_second_backward_needs_retain_graph():
    x = leaf((3,))
    y = lm.sum(lm.exp(x))
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward()
    x.grad = None
    y = lm.sum(x + 1.0)  # a graph that saves no tensor can run again, as in PyTorch
    y.backward()
    y.backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
    x.grad = None
    y = lm.sum(lm.exp(x))
    y.backward(retain_graph=True)
    y.backward()
    assert np.allclose(x.grad.numpy(), 2 * np.exp(x.numpy()))


# ---------------------------------------------------------------- engine


def test_long_chain_has_no_recursion_limit():
    x = lm.ones(100, dtype=F64, requires_grad=True)
    c = lm.full(100, 1.00001, dtype=F64)  # tensor operands: the scalar path is slower
    y = x
    for i in range(100_000):
        y = y + c if i % 2 else y * c
    assert y.grad_fn.name == "add"
    lm.sum(y).backward()
    assert np.allclose(x.grad.numpy(), 1.00001**50_000)  # every multiply was visited
    ref = weakref.ref(y.grad_fn)
    del y  # freeing the chain must not overflow either
    assert ref() is None


def test_graph_is_freed_after_backward_without_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        x = leaf((3,))
        h = lm.exp(x)
        y = lm.sum(h * h)
        h_ref, node_ref = weakref.ref(h), weakref.ref(y.grad_fn)
        del h
        assert h_ref() is not None  # saved for backward
        y.backward()
        assert h_ref() is None  # saved tensors are released by backward
        assert node_ref() is not None
        del y
        assert node_ref() is None
        # without backward, dropping the output frees everything
        h = lm.tanh(x)
        y = lm.sum(h * h)
        h_ref, node_ref = weakref.ref(h), weakref.ref(h.grad_fn)
        del h, y
        assert h_ref() is None and node_ref() is None
        # a leaf with a hook does not keep a graph alive either
        x.register_hook(lambda g: g)
        h = x * 2.0
        h_ref = weakref.ref(h)
        del h
        assert h_ref() is None
        x_ref = weakref.ref(x)
        del x
        assert x_ref() is None
    finally:
        if enabled:
            gc.enable()


def _hessian_vector(f, x, v):
    (g,) = lm.autograd.grad(f(x), x, create_graph=True)
    (hv,) = lm.autograd.grad(lm.sum(g * v), x)
    return g, hv


def test_second_derivative_through_a_result_nobody_holds():
    """tanh and exp use their results; exp's output is held by nothing after the
    forward pass (tanh saves no input), so under create_graph the engine must rebuild
    it with its node as grad_fn, or the Hessian silently loses the path through it."""
    xs = np.array([0.1, 0.2, -0.3])
    x = lm.asarray(xs, requires_grad=True)
    (g,) = lm.autograd.grad(lm.sum(lm.tanh(lm.exp(x))), x, create_graph=True)
    (h,) = lm.autograd.grad(lm.sum(g), x)
    e, t = np.exp(xs), np.tanh(np.exp(xs))
    np.testing.assert_allclose(g.numpy(), (1 - t**2) * e)
    np.testing.assert_allclose(h.numpy(), e * (1 - t**2) * (1 - 2 * t * e))
    (g,) = lm.autograd.grad(lm.sum(lm.sqrt(lm.exp(x))), x, create_graph=True)
    (h,) = lm.autograd.grad(lm.sum(g), x)
    np.testing.assert_allclose(h.numpy(), np.exp(xs / 2) / 4)


def test_shape_only_saves_and_views_of_a_changed_base():
    """sum and mean read only their input's shape (graph.Sizes): changing the input in
    place afterwards is no error, as in PyTorch. A view taken before its base changed
    in place must not keep its old graph silently (lamina does not regenerate a view's
    graph as PyTorch does): backward raises."""
    x = leaf((2, 3))
    h = x * 2.0
    s = lm.sum(h) + lm.sum(lm.mean(h, axis=0))
    h += 1.0
    s.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full((2, 3), 3.0))
    for view in (lambda y: y[1:], lambda y: lm.reshape(y, (2, 2)), lambda y: y[::2]):
        x = leaf((4,))
        y = x * 2.0
        v = view(y)
        y *= 3.0
        with pytest.raises(RuntimeError, match="in-place.*version"):
            lm.sum(v).backward()


def test_edge_gradients_match_pytorch():
    """Edge cases found by differential testing against PyTorch 2.13 (its values)."""
    # an integer result never requires grad (astype to int cuts the graph)
    x = leaf((2,))
    assert not lm.astype(x * 1.0, lm.int64).requires_grad
    # d(a ** 0)/da is 0 at a == 0 (not 0 * inf), at every order
    x = lm.asarray([0.0, 1.0], requires_grad=True)
    lm.sum(x**0.0).backward()
    assert x.grad.tolist() == [0.0, 0.0]
    (g,) = lm.autograd.grad(lm.sum(x**2), x, create_graph=True)
    (h,) = lm.autograd.grad(lm.sum(g), x, create_graph=True)
    (k,) = lm.autograd.grad(lm.sum(h), x)
    assert k.tolist() == [0.0, 0.0]
    # the std of constant data has gradient 0, not 0 / 0
    c = lm.asarray([1.0, 1.0, 1.0], requires_grad=True)
    lm.std(c).backward()
    assert c.grad.tolist() == [0.0, 0.0, 0.0]
    # clip with min > max is max everywhere: the gradient goes to max only
    x, lo, hi = (
        lm.asarray(v, requires_grad=True) for v in ([-1.0, 0.0, 1.0], [0.5] * 3, [-0.5] * 3)
    )
    lm.sum(lm.clip(x, lo, hi)).backward()
    assert (x.grad.tolist(), lo.grad.tolist(), hi.grad.tolist()) == (
        [0.0] * 3,
        [0.0] * 3,
        [1.0] * 3,
    )
    # setitem with a value of more (leading 1) dims than the target
    x, w = leaf((4,)), lm.asarray([[1.0, 1.0]], requires_grad=True)
    y = x * 1.0
    y[1:3] = w
    lm.sum(y).backward()
    assert w.grad.tolist() == [[1.0, 1.0]] and x.grad.tolist() == [1.0, 0.0, 0.0, 1.0]


def test_phase_dependent_losses_of_complex_eigh_and_svd_raise():
    """Note [Gauge invariance]: a loss that depends on the phase of complex eigenvectors
    or singular vectors has no gradient; backward says so instead of a silently wrong
    value. U's phases cancel V's: U @ Vh is a function of the matrix."""
    h = _hermitian(lambda h: h)(cleaf((3, 3)))
    v = LA.eigh(h).eigenvectors
    with pytest.raises(RuntimeError, match=r"linalg.eigh backward: the eigenvectors .* phase"):
        lm.sum(lm.imag(v)).backward()
    x = cleaf((3, 2))
    u, _, vh = LA.svd(x, full_matrices=False)
    with pytest.raises(RuntimeError, match=r"linalg.svd backward: the singular vectors .* phase"):
        lm.sum(lm.imag(u[0])).backward()
    with pytest.raises(RuntimeError, match="linalg.svd backward"):
        lm.sum(lm.imag(vh)).backward()
    lm.sum(lm.real(u @ vh)).backward()
    assert x.grad is not None and np.all(np.isfinite(x.grad.numpy()))


def test_phase_check_passes_complex64_rounding():
    """The check's tolerance leaves complex64's rounding alone: a phase-invariant loss of
    complex64 eigenvectors gets complex128's gradient to complex64's precision."""
    grads = []
    for dtype in (lm.complex64, lm.complex128):
        a = lm.asarray(_hermitian(lambda h: h)(cleaf((3, 3))).detach(), dtype=dtype)
        a.requires_grad_()
        v = LA.eigh(a).eigenvectors
        weights = np.random.default_rng(3).uniform(0, 100, (3, 3))  # large: a large gradient
        lm.sum(lm.abs(v) ** 2 * const(weights)).backward()
        grads.append(a.grad.numpy())
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-3 * np.abs(grads[1]).max())


def test_factorization_parts_without_a_gradient_raise():
    """The last M - N columns of a tall matrix's complete Q, and of full_matrices U, are
    an arbitrary basis: a loss reading them has no gradient (a loss of the rest does)."""
    x = well_conditioned((4, 3))
    with pytest.raises(NotImplementedError, match=r"mode 'complete' needs M <= N.*\(4, 3\)"):
        lm.sum(LA.qr(x, mode="complete").Q).backward()
    u, s, vh = LA.svd(x)
    with pytest.raises(NotImplementedError, match="full_matrices=False"):
        lm.sum(u[:, 3]).backward()
    u, s, vh = LA.svd(LA.matrix_transpose(x))
    with pytest.raises(NotImplementedError, match="full_matrices=False"):
        lm.sum(vh[3]).backward()
    u, s, vh = LA.svd(x)
    lm.sum(u[:, :3] * s).backward()  # the reduced part: defined
    assert x.grad is not None and np.all(np.isfinite(x.grad.numpy()))


def test_complex_factorization_gradients_match_pytorch():
    """An optional comparison: the gradients of complex eigh, svd, qr and pinv against
    PyTorch's formulas (linalg_eig_backward, svd_backward, linalg_qr_backward)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)

    def cdata(shape):
        return rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)

    a = cdata((3, 3))
    hermitian = (a + a.conj().T) / 2 + np.diag([0.0, 1.5, 3.0])
    weights = cdata((4, 4))
    cases = [
        ("eigh", hermitian, lambda m, x: (lambda w, v: (w, m.abs(v) ** 2))(*m.linalg.eigh(x))),
        (
            "svd",
            cdata((4, 3)),
            lambda m, x: (lambda u, s, vh: (m.abs(u) ** 2, s, m.real(u @ vh)))(
                *m.linalg.svd(x, full_matrices=False)
            ),
        ),
        ("qr_tall", cdata((4, 3)), lambda m, x: tuple(m.linalg.qr(x))),
        ("qr_wide", cdata((3, 4)), lambda m, x: tuple(m.linalg.qr(x))),
        ("pinv", cdata((4, 3)), lambda m, x: (m.linalg.pinv(x),)),
    ]
    for name, data, fn in cases:
        got = []
        for m, asarray in (
            (lm, lambda d: lm.asarray(d, requires_grad=True)),
            (torch, lambda d: torch.tensor(d, requires_grad=True)),
        ):
            x = asarray(data)
            total = 0.0
            for out in fn(m, x):
                w = (
                    weights[0, : out.shape[0]]
                    if out.ndim == 1
                    else weights[: out.shape[0], : out.shape[1]]
                )
                w = m.asarray(w) if m is lm else torch.tensor(w)
                total = total + m.sum(m.real(out * w))
            total.backward()
            got.append(np.asarray(x.grad.detach().numpy() if m is torch else x.grad.numpy()))
        np.testing.assert_allclose(got[0], got[1], rtol=1e-10, atol=1e-10, err_msg=name)


def test_higher_order_elementwise():
    x = leaf((4,))
    xs = x.detach().numpy()
    (g,) = lm.autograd.grad(lm.sum(x**3.0), x, create_graph=True)
    (g2,) = lm.autograd.grad(lm.sum(g), x, create_graph=True)
    (g3,) = lm.autograd.grad(lm.sum(g2), x)
    assert np.allclose(g2.numpy(), 6 * xs) and np.allclose(g3.numpy(), 6.0)
    v = const([1.0, 2.0, 3.0, 4.0])
    _, hv = _hessian_vector(lambda t: lm.sum(lm.exp(t)), x, v)
    assert np.allclose(hv.numpy(), np.exp(xs) * v.numpy())
    _, hv = _hessian_vector(lambda t: lm.sum(lm.tanh(t)), x, v)
    t = np.tanh(xs)
    assert np.allclose(hv.numpy(), -2 * t * (1 - t**2) * v.numpy())


def test_higher_order_backward_create_graph():
    x = leaf((3,))
    lm.sum(lm.sin(x)).backward(create_graph=True)
    assert x.grad.requires_grad
    (gg,) = lm.autograd.grad(lm.sum(x.grad), x)
    assert np.allclose(gg.numpy(), -np.sin(x.detach().numpy()))


def test_higher_order_matmul():
    a = const(np.random.default_rng(3).uniform(-1, 1, (3, 4)))
    x = leaf((4,))
    v = leaf((4,), seed=9).detach()
    g, hv = _hessian_vector(lambda t: lm.sum((a @ t) ** 2.0), x, v)
    an = a.numpy()
    assert np.allclose(g.numpy(), 2 * an.T @ an @ x.detach().numpy())
    assert np.allclose(hv.numpy(), 2 * an.T @ an @ v.numpy())


def test_matmul_hands_a_transposed_weight_a_contiguous_gradient():
    """``x @ w.T`` (a linear layer written out): w's gradient is C-contiguous, as in
    PyTorch, so that the optimizer's update reads it in order (Note [Gradient layout]),
    and equals the float64 product; a batched x keeps the general formula."""
    rng = np.random.default_rng(4)
    x, g = rng.standard_normal((5, 3)), rng.standard_normal((5, 4))
    for dtype in ("float32", "float64"):
        w = lm.asarray(rng.standard_normal((4, 3)).astype(dtype), requires_grad=True)
        (lm.asarray(x.astype(dtype)) @ w.T).backward(lm.asarray(g.astype(dtype)))
        assert w.grad.numpy().flags.c_contiguous
        np.testing.assert_allclose(w.grad.numpy(), g.T @ x, rtol=1e-5)
    xb = rng.standard_normal((2, 5, 3))
    w = lm.asarray(rng.standard_normal((4, 3)), requires_grad=True)
    lm.sum(lm.asarray(xb) @ w.T).backward()
    np.testing.assert_allclose(w.grad.numpy(), np.tile(xb.sum(axis=(0, 1)), (4, 1)))


def test_higher_order_reductions():
    x = leaf((5,))
    v = const([1.0, -2.0, 0.5, 3.0, 0.0])
    _, hv = _hessian_vector(lambda t: lm.var(t), x, v)
    assert np.allclose(hv.numpy(), 2 / 5 * (v.numpy() - v.numpy().mean()))
    _, hv = _hessian_vector(lambda t: lm.mean(t) ** 2.0, x, v)
    assert np.allclose(hv.numpy(), np.full(5, 2 / 25 * v.numpy().sum()))


def _first_gradients(fn, args):
    """fn's samples as a function of the same inputs returning the gradients of a
    non-linear scalar of fn's outputs (sum of w * out**2, so that the gradients depend
    on the inputs even for linear operators), computed with create_graph=True."""
    checked = [i for i, a in enumerate(args) if isinstance(a, lm.Tensor) and a.requires_grad]

    def first(*xs):
        with lm.enable_grad():  # gradcheck probes under no_grad, with fresh tensors
            xs = [
                x.detach().requires_grad_() if i in checked and not x.requires_grad else x
                for i, x in enumerate(xs)
            ]
            out = fn(*xs)
            total = 0.0
            for o in out if isinstance(out, (tuple, list)) else (out,):
                w = const(np.linspace(0.5, 1.5, o.size).reshape(o.shape))
                # a real scalar of a complex output: |o|**2 and Re(o**2)
                square = o * o if o.dtype.kind != "c" else lm.real(o * lm.conj(o) + o * o)
                total = total + lm.sum(square * w)
            grads = lm.autograd.grad(total, [xs[i] for i in checked], create_graph=True)
        return grads

    return first


@pytest.mark.parametrize("name, fn, args, kwargs", CASES)
def test_gradgradcheck(name, fn, args, kwargs):
    """Second derivatives: finite differences of the first gradients, for every sample."""
    first = _first_gradients(fn, args)
    grads = first(*args)
    if not any(g.requires_grad for g in grads):
        # only where the formula's gradient is a constant zero (floor, sign, ...)
        assert all(np.all(g.numpy() == 0) for g in grads), name
        return
    assert gradcheck(first, args, **kwargs)


def test_higher_order_prod_with_two_zeros():
    x = const([2.0, 0.0, 3.0, 0.0]).requires_grad_()
    (g,) = lm.autograd.grad(lm.prod(x), x, create_graph=True)
    assert g.tolist() == [0.0, 0.0, 0.0, 0.0]
    (h,) = lm.autograd.grad(g[1], x)  # d/dx of the product of the others of x[1]
    assert h.tolist() == [0.0, 0.0, 0.0, 6.0]


def test_higher_order_through_repeated_indices():
    x = leaf((3,))
    i = lm.asarray([0, 2, 0], dtype=lm.int64)
    (g,) = lm.autograd.grad(lm.sum(x[i] ** 3.0) + lm.sum(x[0:2] ** 3.0), x, create_graph=True)
    (h,) = lm.autograd.grad(lm.sum(g), x)
    xs = x.detach().numpy()
    assert np.allclose(h.numpy(), 6 * xs * [3, 1, 1])


def test_two_threads_forward_and_backward():
    errors = []
    barrier = threading.Barrier(2)

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            barrier.wait(10)
            for _ in range(50):
                data = rng.uniform(-1, 1, (4, 3))
                w = lm.asarray(data, requires_grad=True)
                b = lm.asarray(rng.uniform(-1, 1, 3), requires_grad=True)
                y = lm.sum(lm.tanh(w * b + 0.5) ** 2.0)
                y.backward()
                t = np.tanh(data * b.numpy() + 0.5)
                dy = 2 * t * (1 - t**2)
                if not (
                    np.allclose(w.grad.numpy(), dy * b.numpy())
                    and np.allclose(b.grad.numpy(), (dy * data).sum(0))
                ):
                    errors.append(seed)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


@pytest.mark.parametrize("fn", [lm.concat, lm.stack])
def test_gradients_of_many_listed_inputs(fn):
    """concat/stack of more tensors than any fixed-size table in the engine: every
    one of them gets its gradient."""
    a = leaf((3,))
    parts = [a * float(i) for i in range(100)]
    lm.sum(fn(parts)).backward()
    np.testing.assert_allclose(a.grad.numpy(), np.full(3, sum(range(100))))


def test_version_counters_forget_freed_storage():
    from lamina.dispatch import tensor as _tensor

    before = len(_tensor.versions)
    for _ in range(50):
        a = lm.ones(3)
        a += 1.0
    del a
    assert len(_tensor.versions) <= before + 1


def test_sealed_storages_are_stamped_until_exposed():
    """Note [Sealed storages]: a parameter's storage is stamped (storage, version) from
    ``Parameter``; an in-place operation changes the stamp; reads leave it; handing the
    storage out (numpy, __array__, DLPack) or sharing a caller's memory leaves none, for
    good; the seal is forgotten with the storage."""
    from lamina.dispatch import tensor as _tensor

    p = lm.nn.Parameter(lm.zeros((2, 3)))
    first = _tensor.stamp_of(p._data)
    assert first is not None and _tensor.stamp_of(p._data[1:]) == first  # any view
    p.tolist(), float(p[0, 0]), repr(p), p.sum().item()  # reads
    assert _tensor.stamp_of(p._data) == first
    with lm.no_grad():
        p.add_(1.0)
    assert _tensor.stamp_of(p._data)[1] > first[1]
    exposures = [
        lambda t: t.numpy(),
        lambda t: np.asarray(t),
        lambda t: np.from_dlpack(t),
    ]
    for expose in exposures:
        q = lm.nn.Parameter(lm.zeros(3))
        expose(q)
        assert _tensor.stamp_of(q._data) is None
        assert _tensor.stamp_of(lm.nn.Parameter(q)._data) is None  # never sealed again
    shared = np.zeros(3)
    for t in (lm.asarray(shared), lm.from_dlpack(shared), lm.asarray(shared[::2])):
        assert _tensor.stamp_of(lm.nn.Parameter(t)._data) is None  # the caller's memory
    assert _tensor.stamp_of(lm.nn.Parameter(lm.asarray([1.0, 2.0]))._data) is not None
    assert _tensor.stamp_of(np.zeros(3)) is None  # an array lamina never sealed
    before = len(_tensor.sealed)
    for _ in range(50):
        lm.nn.Parameter(lm.ones(3))
    assert len(_tensor.sealed) <= before + 1


# Note [C recording]: the C core records the node of an operator of one tensor (and one
# setting) itself; the node must be the one graph.record makes (both cores run these)
ONE_ARGUMENT = {
    "exp": (),
    "tanh": (),
    "sin": (),
    "abs": (),
    "negative": (),
    "sigmoid": (),
    "relu": (),
    "softmax": (0,),
    "log_softmax": (0,),
    "leaky_relu": (0.2,),
    "gelu": ("tanh",),
}


def _unary_input(source):
    base = lm.asarray(np.linspace(-1.5, 1.5, 6), requires_grad=True)
    if source == "leaf":
        return base
    if source == "non-leaf":
        return base * 2.0
    return lm.split(base, 2)[1]  # a second output: its node's output 1


@pytest.mark.parametrize("source", ["leaf", "non-leaf", "second output"])
@pytest.mark.parametrize("name", ONE_ARGUMENT)
def test_one_argument_node_is_the_one_record_makes(name, source):
    from lamina.autograd import graph

    op, setting = OPERATORS[name], ONE_ARGUMENT[name]
    x = _unary_input(source)
    y = op(x, *setting)
    with lm.no_grad():
        plain = op(x, *setting)
    want = graph.record(DERIVATIVES[name], (x, *setting), (plain,))
    node = y.grad_fn
    assert type(node) is type(want) and node.derivative is want.derivative
    assert node.next_nodes == want.next_nodes and node.next_nrs == want.next_nrs
    assert len(node.saved) == len(want.saved)
    assert all(a is b or a == b for a, b in zip(node.saved, want.saved))
    assert node.versions == want.versions
    assert (node.result is None) == (want.result is None)
    if node.result is not None:
        ref, alias = node.result
        assert ref() is y and np.array_equal(alias.numpy(), y.detach().numpy())
        assert not alias.requires_grad
    assert y.requires_grad and y._output_nr == 0
    # the gradient through the node, against the one through record's (plain's)
    g = lm.asarray(np.arange(1.0, 1.0 + y.shape[0]))
    (got,) = lm.autograd.grad(y, x, g, retain_graph=True)
    (expected,) = lm.autograd.grad(plain, x, g)
    assert np.array_equal(got.numpy(), expected.numpy())


@pytest.mark.parametrize("name", ONE_ARGUMENT)
def test_one_argument_operators_record_nothing_without_grad(name):
    op, setting = OPERATORS[name], ONE_ARGUMENT[name]
    x = _unary_input("non-leaf")
    with lm.no_grad():
        y = op(x, *setting)
    assert y.grad_fn is None and not y.requires_grad
    z = op(lm.asarray(np.linspace(-1.0, 1.0, 4)), *setting)  # an input without grad
    assert z.grad_fn is None and not z.requires_grad


def test_one_argument_recording_catches_a_saved_input_modified():
    x = _unary_input("non-leaf")
    y = lm.sin(x)  # sin's formula reads its input
    x += 1.0
    with pytest.raises(RuntimeError, match="in-place.*version"):
        lm.sum(y).backward()
