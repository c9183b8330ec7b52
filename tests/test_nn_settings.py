"""Numeric settings checked at the boundary (Note [Numeric settings] in dispatch/meta.py)
and empty batches end to end in every nn operator.

``BAD_SETTINGS`` enumerates each class of bad setting -- reversed or non-finite bounds,
negative or non-finite scales, values out of range, out-of-range dims, integers too large
for the kernels' 64-bit integers or the pool's counters, zero sizes, target dtypes --
across lamina.nn.functional, lamina.nn's modules, lamina.nn.init, lamina.memory and
LAMINA_POOL_BYTES: each must raise its exception with a message naming the argument,
before any kernel runs.

``EMPTY_BATCH`` runs every nn operator forward and backward on a batch of 0 images (both
layouts where the operator has them; for attention 0 sequences, queries or keys, for
embedding 0 indices; the recurrent modules as well) and checks the shapes of the result
and of every gradient against PyTorch's (hand-computed here; compared with torch itself
when it is installed).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import fused
import numpy as np
import pytest

import lamina as lm
import lamina.nn.functional as F
from lamina.nn import init

BIG = 2**63  # one more than the largest 64-bit integer
NAN, INF = math.nan, math.inf


def t(*shape, dtype=np.float32):
    return lm.asarray(np.ones(shape, dtype))


def image(n=2, c=3, h=6, w=6):
    return t(n, c, h, w)


def weight(c_out=4, c_in=3, k=3):
    return t(c_out, c_in, k, k)


def bn(x, **kw):
    c = x.shape[1]
    args = dict(training=True, momentum=0.1, eps=1e-5)
    args.update(kw)
    return F.batch_norm(x, lm.zeros((c,)), lm.ones((c,)), **args)


def configure_limit(value):
    try:
        lm.memory.configure(limit=value)
    finally:  # a test must not leave a strange limit behind
        lm.memory.configure(limit=1 << 30)


def configure_threshold(value):
    try:
        lm.memory.configure(threshold=value)
    finally:
        lm.memory.configure(threshold=1 << 17)


W = weight
# (id, call, exception, message regex)
BAD_SETTINGS = [
    # ---- lamina.nn.init: bounds, scales and gains finite, ordered and non-negative
    (
        "uniform reversed",
        lambda: init.uniform_(t(3, 3), 1.0, 0.0),
        ValueError,
        r"uniform_: a must be at most b",
    ),
    (
        "uniform a nan",
        lambda: init.uniform_(t(3, 3), NAN, 1.0),
        ValueError,
        r"uniform_: a must be a finite",
    ),
    (
        "uniform b inf",
        lambda: init.uniform_(t(3, 3), 0.0, INF),
        ValueError,
        r"uniform_: b must be a finite",
    ),
    (
        "uniform b str",
        lambda: init.uniform_(t(3, 3), 0.0, "1"),
        TypeError,
        r"uniform_: b must be a real",
    ),
    (
        "normal std negative",
        lambda: init.normal_(t(3, 3), 0.0, -1.0),
        ValueError,
        r"normal_: std must be non-negative",
    ),
    (
        "normal std nan",
        lambda: init.normal_(t(3, 3), 0.0, NAN),
        ValueError,
        r"normal_: std must be a finite",
    ),
    (
        "normal std inf",
        lambda: init.normal_(t(3, 3), 0.0, INF),
        ValueError,
        r"normal_: std must be a finite",
    ),
    (
        "normal mean nan",
        lambda: init.normal_(t(3, 3), NAN, 1.0),
        ValueError,
        r"normal_: mean must be a finite",
    ),
    (
        "xavier_uniform gain negative",
        lambda: init.xavier_uniform_(t(3, 3), -1.0),
        ValueError,
        r"xavier_uniform_: gain must be non-negative",
    ),
    (
        "xavier_uniform gain nan",
        lambda: init.xavier_uniform_(t(3, 3), NAN),
        ValueError,
        r"xavier_uniform_: gain must be a finite",
    ),
    (
        "xavier_normal gain negative",
        lambda: init.xavier_normal_(t(3, 3), -2.0),
        ValueError,
        r"xavier_normal_: gain must be non-negative",
    ),
    (
        "xavier_normal gain inf",
        lambda: init.xavier_normal_(t(3, 3), INF),
        ValueError,
        r"xavier_normal_: gain must be a finite",
    ),
    (
        "kaiming_uniform a nan",
        lambda: init.kaiming_uniform_(t(3, 3), NAN),
        ValueError,
        r"kaiming_uniform_: a must be a finite",
    ),
    (
        "kaiming_normal a inf",
        lambda: init.kaiming_normal_(t(3, 3), INF),
        ValueError,
        r"kaiming_normal_: a must be a finite",
    ),
    (
        "calculate_gain param nan",
        lambda: init.calculate_gain("leaky_relu", NAN),
        ValueError,
        r"calculate_gain: param must be a finite",
    ),
    # ---- batch norm: eps positive and finite while training, momentum in [0, 1]
    (
        "bn eps 0 training",
        lambda: bn(image(), eps=0.0),
        ValueError,
        r"batch_norm: eps must be positive when training",
    ),
    (
        "bn eps negative",
        lambda: bn(image(), eps=-1e-5),
        ValueError,
        r"batch_norm: eps must be positive",
    ),
    (
        "bn eps negative eval",
        lambda: bn(image(), eps=-1e-5, training=False),
        ValueError,
        r"batch_norm: eps must be positive or zero",
    ),
    ("bn eps nan", lambda: bn(image(), eps=NAN), ValueError, r"batch_norm: eps must be a finite"),
    (
        "bn eps inf eval",
        lambda: bn(image(), eps=INF, training=False),
        ValueError,
        r"batch_norm: eps must be a finite",
    ),
    (
        "bn momentum 2",
        lambda: bn(image(), momentum=2.0),
        ValueError,
        r"batch_norm: momentum must be in \[0, 1\]",
    ),
    (
        "bn momentum negative",
        lambda: bn(image(), momentum=-0.1),
        ValueError,
        r"batch_norm: momentum must be in \[0, 1\]",
    ),
    (
        "bn momentum nan",
        lambda: bn(image(), momentum=NAN),
        ValueError,
        r"batch_norm: momentum must be a finite",
    ),
    (
        "bn one value per channel",
        lambda: bn(t(1, 3)),
        ValueError,
        r"expected more than 1 value per channel when training",
    ),
    # ---- the newer layers: layer and group norm's eps finite and non-negative (PyTorch
    # takes any; 0 as there), groups dividing the channels, padding_idx within the
    # table, heads dividing embed_dim, dropout probabilities in [0, 1]
    (
        "layer_norm eps negative",
        lambda: lm.nn.LayerNorm(3, eps=-1e-5)(t(2, 3)),
        ValueError,
        r"layer_norm: eps must not be negative",
    ),
    (
        "layer_norm eps nan",
        lambda: F.layer_norm(t(2, 3), 3, eps=NAN),
        ValueError,
        r"layer_norm: eps must be a finite",
    ),
    (
        "group_norm eps inf",
        lambda: lm.nn.GroupNorm(1, 3, eps=INF)(image()),
        ValueError,
        r"group_norm: eps must be a finite",
    ),
    (
        "group_norm groups 0",
        lambda: lm.nn.GroupNorm(0, 3),
        ValueError,
        r"GroupNorm: num_groups=0 must be positive and divide num_channels=3",
    ),
    (
        "group_norm groups not dividing",
        lambda: F.group_norm(image(), 2),
        ValueError,
        r"group_norm: num_groups=2 must be positive and divide the 3 channels",
    ),
    (
        "embedding padding_idx below",
        lambda: lm.nn.Embedding(5, 3, padding_idx=-6),
        ValueError,
        r"Embedding: padding_idx must be within num_embeddings \(5\), got -6",
    ),
    (
        "embedding padding_idx above",
        lambda: F.embedding(lm.zeros((2,), dtype=lm.int64), t(5, 3), padding_idx=5),
        ValueError,
        r"embedding: padding_idx must be within num_embeddings \(5\), got 5",
    ),
    (
        "attention heads not dividing",
        lambda: lm.nn.MultiheadAttention(5, 2),
        ValueError,
        r"MultiheadAttention: embed_dim=5 must be divisible by num_heads=2",
    ),
    (
        "attention heads 0",
        lambda: lm.nn.MultiheadAttention(4, 0),
        ValueError,
        r"MultiheadAttention: embed_dim and num_heads must be positive, got 4 and 0",
    ),
    (
        "attention dropout nan",
        lambda: lm.nn.MultiheadAttention(4, 2, dropout=NAN),
        ValueError,
        r"MultiheadAttention: dropout must be in \[0, 1\], got nan",
    ),
    (
        "lstm dropout 2",
        lambda: lm.nn.LSTM(3, 4, dropout=2.0),
        ValueError,
        r"LSTM: dropout must be in \[0, 1\]",
    ),
    (
        "smooth_l1 beta nan",
        lambda: F.smooth_l1_loss(t(2), t(2), beta=NAN),
        ValueError,
        r"smooth_l1_loss: beta must be a finite",
    ),
    # ---- the other real settings: finite, in range
    (
        "lrn alpha nan",
        lambda: F.local_response_norm(image(), 2, alpha=NAN),
        ValueError,
        r"local_response_norm: alpha must be a finite",
    ),
    (
        "lrn beta inf",
        lambda: F.local_response_norm(image(), 2, beta=INF),
        ValueError,
        r"local_response_norm: beta must be a finite",
    ),
    (
        "lrn k nan",
        lambda: F.local_response_norm(image(), 2, k=NAN),
        ValueError,
        r"local_response_norm: k must be a finite",
    ),
    (
        "leaky_relu slope nan",
        lambda: F.leaky_relu(t(2, 3), NAN),
        ValueError,
        r"leaky_relu: negative_slope must be a finite",
    ),
    (
        "dropout p nan",
        lambda: F.dropout(t(2, 3), NAN),
        ValueError,
        r"dropout: p must be in \[0, 1\]",
    ),
    ("dropout p 2", lambda: F.dropout(t(2, 3), 2.0), ValueError, r"dropout: p must be in \[0, 1\]"),
    (
        "label_smoothing nan",
        lambda: F.cross_entropy(t(2, 3), lm.zeros((2,), dtype=lm.int64), label_smoothing=NAN),
        ValueError,
        r"label_smoothing must be in \[0, 1\]",
    ),
    # ---- dims in range
    (
        "flatten start_dim 5",
        lambda: F.flatten(image(), 5),
        IndexError,
        r"flatten: start_dim 5 is out of bounds",
    ),
    (
        "flatten end_dim -5",
        lambda: F.flatten(image(), 1, -5),
        IndexError,
        r"flatten: end_dim -5 is out of bounds",
    ),
    (
        "flatten 0-d start_dim 1",
        lambda: F.flatten(lm.asarray(1.0), 1),
        IndexError,
        r"flatten: start_dim 1 is out of bounds",
    ),
    (
        "flatten reversed",
        lambda: F.flatten(image(), 2, 1),
        ValueError,
        r"flatten: start_dim 2 comes after end_dim 1",
    ),
    (
        "softmax dim 2",
        lambda: F.softmax(t(2, 3), 2),
        IndexError,
        r"softmax: dim 2 is out of bounds",
    ),
    # ---- integer settings: positive where a size, and fitting a 64-bit integer
    (
        "conv stride 0",
        lambda: F.conv2d(image(), W(), stride=0),
        ValueError,
        r"conv2d: stride must be positive",
    ),
    (
        "conv stride negative",
        lambda: F.conv2d(image(), W(), stride=(1, -1)),
        ValueError,
        r"conv2d: stride must be positive",
    ),
    (
        "conv stride 2**63",
        lambda: F.conv2d(image(), W(), stride=BIG),
        OverflowError,
        r"conv2d: stride=.*64-bit integer.*9223372036854775807",
    ),
    (
        "conv padding negative",
        lambda: F.conv2d(image(), W(), padding=-1),
        ValueError,
        r"conv2d: padding must be non-negative",
    ),
    (
        "conv padding 2**63",
        lambda: F.conv2d(image(), W(), padding=BIG),
        OverflowError,
        r"conv2d: padding=.*64-bit integer",
    ),
    (
        "conv padding 2**63-1",
        lambda: F.conv2d(image(), W(), padding=BIG - 1),
        OverflowError,
        r"conv2d: padding .*padded input",
    ),
    (
        "conv dilation 0",
        lambda: F.conv2d(image(), W(), dilation=0),
        ValueError,
        r"conv2d: dilation must be positive",
    ),
    (
        "conv dilation 2**63",
        lambda: F.conv2d(image(), W(), dilation=BIG),
        OverflowError,
        r"conv2d: dilation=.*64-bit integer",
    ),
    (
        "conv dilation 2**62",
        lambda: F.conv2d(image(), W(), dilation=2**62),
        OverflowError,
        r"conv2d: dilation 4611686018427387904 with kernel size 3",
    ),
    (
        "conv groups 0",
        lambda: F.conv2d(image(), W(), groups=0),
        ValueError,
        r"conv2d: groups must be positive",
    ),
    (
        "conv groups 2**63",
        lambda: F.conv2d(image(), W(), groups=BIG),
        OverflowError,
        r"conv2d: groups=.*64-bit integer",
    ),
    (
        "conv kernel 0 x 0",
        lambda: F.conv2d(image(), t(4, 3, 0, 0)),
        ValueError,
        r"conv2d: the kernel size must be positive, got 0 x 0",
    ),
    (
        "conv kernel 0 x 3",
        lambda: F.conv2d(image(), t(4, 3, 0, 3)),
        ValueError,
        r"conv2d: the kernel size must be positive, got 0 x 3",
    ),
    (
        "conv no output channels",
        lambda: F.conv2d(image(), t(0, 3, 3, 3)),
        ValueError,
        r"conv2d: weight must have at least one output channel",
    ),
    (
        "conv stride float",
        lambda: F.conv2d(image(), W(), stride=1.5),
        TypeError,
        r"conv2d: stride must be an int",
    ),
    (
        "max_pool kernel 0",
        lambda: F.max_pool2d(image(), 0),
        ValueError,
        r"max_pool2d: kernel_size must be positive",
    ),
    (
        "max_pool kernel 2**63",
        lambda: F.max_pool2d(image(), BIG),
        OverflowError,
        r"max_pool2d: kernel_size=.*64-bit integer",
    ),
    (
        "max_pool stride 0",
        lambda: F.max_pool2d(image(), 2, 0),
        ValueError,
        r"max_pool2d: stride must be positive",
    ),
    (
        "max_pool stride 2**63",
        lambda: F.max_pool2d(image(), 2, BIG),
        OverflowError,
        r"max_pool2d: stride=.*64-bit integer",
    ),
    (
        "max_pool padding negative",
        lambda: F.max_pool2d(image(), 2, padding=-1),
        ValueError,
        r"max_pool2d: padding must be non-negative",
    ),
    (
        "max_pool dilation 0",
        lambda: F.max_pool2d(image(), 2, dilation=0),
        ValueError,
        r"max_pool2d: dilation must be positive",
    ),
    (
        "max_pool dilation 2**63",
        lambda: F.max_pool2d(image(), 2, dilation=BIG),
        OverflowError,
        r"max_pool2d: dilation=.*64-bit integer",
    ),
    (
        "min_pool stride 2**63",
        lambda: F.min_pool2d(image(), 2, BIG),
        OverflowError,
        r"min_pool2d: stride=.*64-bit integer",
    ),
    (
        "avg_pool kernel 0",
        lambda: F.avg_pool2d(image(), 0),
        ValueError,
        r"avg_pool2d: kernel_size must be positive",
    ),
    (
        "avg_pool stride 2**63",
        lambda: F.avg_pool2d(image(), 2, BIG),
        OverflowError,
        r"avg_pool2d: stride=.*64-bit integer",
    ),
    (
        "avg_pool padding 2**63",
        lambda: F.avg_pool2d(image(), 2, padding=BIG),
        OverflowError,
        r"avg_pool2d: padding=.*64-bit integer",
    ),
    (
        "avg_pool divisor 0",
        lambda: F.avg_pool2d(image(), 2, divisor_override=0),
        ValueError,
        r"avg_pool2d: divisor_override must not be zero",
    ),
    (
        "avg_pool divisor 2**63",
        lambda: F.avg_pool2d(image(), 2, divisor_override=BIG),
        OverflowError,
        r"avg_pool2d: divisor_override=.*64-bit integer",
    ),
    (
        "adaptive_avg output 0",
        lambda: F.adaptive_avg_pool2d(image(), 0),
        ValueError,
        r"adaptive_avg_pool2d: output_size must be positive",
    ),
    (
        "adaptive_avg zero height",
        lambda: F.adaptive_avg_pool2d(image(h=0), 2),
        ValueError,
        r"adaptive_avg_pool2d: the input's height and width must be positive",
    ),
    (
        "adaptive_max output 0",
        lambda: F.adaptive_max_pool2d(image(), 0),
        ValueError,
        r"adaptive_max_pool2d: output_size must be positive, got \(0, 0\)",
    ),
    (
        "adaptive_max output float",
        lambda: F.adaptive_max_pool2d(image(), 1.5),
        TypeError,
        r"adaptive_max_pool2d: output_size must be an int",
    ),
    (
        "lrn size 0",
        lambda: F.local_response_norm(image(), 0),
        ValueError,
        r"local_response_norm: size must be positive",
    ),
    (
        "lrn size 2**63",
        lambda: F.local_response_norm(image(), BIG),
        OverflowError,
        r"local_response_norm: size=.*64-bit integer",
    ),
    (
        "nll ignore_index 2**63",
        lambda: F.nll_loss(t(2, 3), lm.zeros((2,), dtype=lm.int64), ignore_index=BIG),
        OverflowError,
        r"nll_loss: ignore_index=.*64-bit integer",
    ),
    (
        "ce ignore_index 2**63",
        lambda: F.cross_entropy(t(2, 3), lm.zeros((2,), dtype=lm.int64), ignore_index=BIG),
        OverflowError,
        r"nll_loss: ignore_index=.*64-bit integer",
    ),
    # ---- target dtypes: integer class indices (PyTorch: Long or Byte), floats refused
    (
        "nll float target",
        lambda: F.nll_loss(t(2, 3), t(2)),
        TypeError,
        r"nll_loss: target must hold integer class indices, got float32",
    ),
    (
        "nll bool target",
        lambda: F.nll_loss(t(2, 3), lm.zeros((2,), dtype=lm.bool)),
        TypeError,
        r"nll_loss: target must hold integer class indices, got bool",
    ),
    (
        "ce prob target shape",
        lambda: F.cross_entropy(t(2, 3), t(2, 4)),
        ValueError,
        r"cross_entropy: probability targets must have the input's shape",
    ),
    # ---- the pool's settings: fitting its 64-bit counters, the largest value named
    (
        "pool limit 2**64",
        lambda: configure_limit(2**64),
        OverflowError,
        r"configure: limit=18446744073709551616 is too large; "
        r"the largest accepted value is 9223372036854775807",
    ),
    (
        "pool limit 2**63",
        lambda: configure_limit(2**63),
        OverflowError,
        r"configure: limit=9223372036854775808 is too large; "
        r"the largest accepted value is 9223372036854775807",
    ),
    (
        "pool limit negative",
        lambda: configure_limit(-1),
        ValueError,
        r"configure: limit must be at least 0",
    ),
    (
        "pool limit float",
        lambda: configure_limit(1e9),
        TypeError,
        r"configure: limit must be an int",
    ),
    (
        "pool threshold 2**64",
        lambda: configure_threshold(2**64),
        OverflowError,
        r"configure: threshold=.* the largest accepted value is 9223372036854775807",
    ),
    (
        "pool threshold 0",
        lambda: configure_threshold(0),
        ValueError,
        r"configure: threshold must be at least 1",
    ),
]


@pytest.mark.parametrize(
    "call, exc, match", [c[1:] for c in BAD_SETTINGS], ids=[c[0] for c in BAD_SETTINGS]
)
def test_bad_setting(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_the_largest_settings_pass():
    """The bounds are exact: 2**63 - 1 is accepted where 2**63 is not."""
    try:
        lm.memory.configure(limit=BIG - 1)
        assert lm.memory.stats()["limit"] in (BIG - 1, 0)  # 0: the pure-Python core
    finally:
        lm.memory.configure(limit=1 << 30)
    assert F.conv2d(image(), W(), stride=BIG - 1).shape == (2, 4, 1, 1)
    assert F.conv2d(image(), W(k=1), dilation=(BIG - 1, 1)).shape == (2, 4, 6, 6)
    assert F.max_pool2d(image(), 2, BIG - 1).shape == (2, 3, 1, 1)
    assert F.avg_pool2d(image(), 2, BIG - 1).shape == (2, 3, 1, 1)
    assert F.local_response_norm(image(), BIG - 1).shape == (2, 3, 6, 6)
    assert float(F.nll_loss(t(2, 3), lm.zeros((2,), dtype=lm.int64), ignore_index=BIG - 1)) == -1


def test_settings_at_their_bounds_work():
    x = lm.asarray(np.random.default_rng(0).standard_normal((4, 3, 2, 2)).astype(np.float32))
    const = lm.ones((4, 3, 2, 2))
    for momentum in (0.0, 1.0):
        assert bn(x, momentum=momentum).shape == x.shape
    # a constant channel in training: eps keeps the result finite (0, not NaN)
    assert np.all(np.asarray(bn(const).numpy()) == 0)
    assert init.uniform_(t(3, 3), 2.0, 2.0).numpy().tolist() == [[2.0] * 3] * 3
    assert init.normal_(t(3, 3), 1.0, 0.0).numpy().tolist() == [[1.0] * 3] * 3
    assert init.kaiming_uniform_(t(0, 3)).shape == (0, 3)  # nothing to fill: a no-op
    assert init.xavier_normal_(t(3, 0)).shape == (3, 0)


@pytest.mark.parametrize("dtype", [lm.uint8, lm.int64])
def test_byte_and_long_targets_agree(dtype):
    """PyTorch takes Long and Byte targets; lamina takes uint8 as int64 class indices,
    in nll_loss and in every path of cross_entropy."""
    rng = np.random.default_rng(1)
    x = lm.asarray(rng.standard_normal((4, 3)).astype(np.float32))
    labels = np.array([0, 2, 1, 2])
    ref = lm.asarray(labels.astype(np.int64))
    tgt = lm.asarray(labels.astype(np.dtype(dtype.name)))
    for fn, kw in [
        (F.nll_loss, {}),
        (F.cross_entropy, {}),
        (F.cross_entropy, {"label_smoothing": 0.1}),
        (F.cross_entropy, {"ignore_index": 1}),
        (F.cross_entropy, {"reduction": "none"}),
    ]:
        np.testing.assert_allclose(fn(x, tgt, **kw).numpy(), fn(x, ref, **kw).numpy(), rtol=1e-6)


@pytest.mark.parametrize(
    "name, value, match",
    [
        (
            "LAMINA_POOL_BYTES",
            str(2**70),
            r"LAMINA_POOL_BYTES=1180591620717411303424 is too large; "
            r"the largest accepted value is 9223372036854775807",
        ),
        ("LAMINA_POOL_BYTES", str(2**63), r"LAMINA_POOL_BYTES=9223372036854775808 is too large"),
        ("LAMINA_POOL_BYTES", "-1", r"LAMINA_POOL_BYTES must not be negative"),
        ("LAMINA_POOL_BYTES", "1e9", r"LAMINA_POOL_BYTES must be a number of bytes"),
        (
            "LAMINA_POOL_THRESHOLD",
            str(2**64),
            r"LAMINA_POOL_THRESHOLD=18446744073709551616 is too large",
        ),
    ],
    ids=["bytes 2**70", "bytes 2**63", "bytes negative", "bytes float", "threshold 2**64"],
)
def test_pool_environment_is_checked_at_import(name, value, match):
    """A bad variable is a clear error at import (as LAMINA_NUM_THREADS), never a limit
    wrapped around to 0 or a negative one."""
    import re

    env = dict(os.environ, **{name: value})
    out = subprocess.run(
        [sys.executable, "-c", "import lamina"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert re.search(r"ValueError: " + match, out.stderr), out.stderr[-2000:]


# ---------------------------------------------------------------- empty batches


class Factory:
    """Leaves for one backend: ``x(shape, layout)``, ``p(shape)`` (parameters that take
    a gradient), ``c(shape)`` (constants), ``long(shape)`` (class indices)."""

    def __init__(self, torch=None):
        self.torch = torch
        self.leaves = []

    def _leaf(self, shape, layout=None, grad=True):
        data = np.random.default_rng(0).random(shape).astype(np.float32)
        if self.torch is not None:
            a = self.torch.tensor(data)
            if layout == "NHWC":
                a = a.contiguous(memory_format=self.torch.channels_last)
        else:
            a = lm.asarray(data)
            if layout == "NHWC":
                a = F.to_layout(a, "NHWC")
        if grad:
            a.requires_grad_(True)
            self.leaves.append(a)
        return a

    def x(self, *shape, layout=None):
        return self._leaf(shape, layout)

    def p(self, *shape):
        return self._leaf(shape)

    def c(self, *shape):
        return self._leaf(shape, grad=False)

    def long(self, *shape):
        if self.torch is not None:
            return self.torch.zeros(shape, dtype=self.torch.long)
        return lm.zeros(shape, dtype=lm.int64)

    def module(self, name, *args, **kwargs):
        """A module of this backend's nn (its parameters are not leaves)."""
        return getattr((self.torch or lm).nn, name)(*args, **kwargs)


def _bn(fn, f, x, training, relu=False):
    """batch norm, or the batch_norm_relu fusion (PyTorch: relu of batch norm)."""
    c = x.shape[1]
    args = (x, f.c(c), f.c(c) + 1, f.p(c), f.p(c))
    if not relu:
        return fn.batch_norm(*args, training=training)
    if fn is F:
        return fused.batch_norm_relu(*args, training=training)
    return fn.relu(fn.batch_norm(*args, training=training))


# (id, call(F, factory, layout), result shape, gradient shapes of the leaves in order,
#  layouts, runs under torch)
N4 = (None, "NHWC")
EMPTY_BATCH = [
    (
        "conv2d 3x3",
        lambda fn, f, lay: fn.conv2d(f.x(0, 3, 5, 5, layout=lay), f.p(4, 3, 3, 3), f.p(4)),
        (0, 4, 3, 3),
        [(0, 3, 5, 5), (4, 3, 3, 3), (4,)],
        N4,
        True,
    ),
    (
        "conv2d stride 2 pad 1",
        lambda fn, f, lay: fn.conv2d(
            f.x(0, 3, 5, 5, layout=lay), f.p(4, 3, 3, 3), f.p(4), stride=2, padding=1
        ),
        (0, 4, 3, 3),
        [(0, 3, 5, 5), (4, 3, 3, 3), (4,)],
        N4,
        True,
    ),
    (
        "conv2d 1x1",
        lambda fn, f, lay: fn.conv2d(f.x(0, 3, 5, 5, layout=lay), f.p(4, 3, 1, 1)),
        (0, 4, 5, 5),
        [(0, 3, 5, 5), (4, 3, 1, 1)],
        N4,
        True,
    ),
    (
        "conv2d groups dilation",
        lambda fn, f, lay: fn.conv2d(
            f.x(0, 4, 7, 7, layout=lay), f.p(6, 2, 3, 3), groups=2, dilation=2
        ),
        (0, 6, 3, 3),
        [(0, 4, 7, 7), (6, 2, 3, 3)],
        N4,
        True,
    ),
    (
        "conv2d same",
        lambda fn, f, lay: fn.conv2d(f.x(0, 3, 5, 5, layout=lay), f.p(4, 3, 4, 4), padding="same"),
        (0, 4, 5, 5),
        [(0, 3, 5, 5), (4, 3, 4, 4)],
        N4,
        True,
    ),
    (
        "conv2d no input channels",
        lambda fn, f, lay: fn.conv2d(f.x(2, 0, 5, 5, layout=lay), f.p(4, 0, 3, 3), f.p(4)),
        (2, 4, 3, 3),
        [(2, 0, 5, 5), (4, 0, 3, 3), (4,)],
        N4,
        False,
    ),
    (
        "max_pool2d",
        lambda fn, f, lay: fn.max_pool2d(f.x(0, 3, 6, 6, layout=lay), 2),
        (0, 3, 3, 3),
        [(0, 3, 6, 6)],
        N4,
        True,
    ),
    (
        "max_pool2d pad ceil",
        lambda fn, f, lay: fn.max_pool2d(f.x(0, 3, 7, 7, layout=lay), 3, 2, 1, ceil_mode=True),
        (0, 3, 4, 4),
        [(0, 3, 7, 7)],
        N4,
        True,
    ),
    (
        "max_pool2d indices",
        lambda fn, f, lay: fn.max_pool2d(f.x(0, 3, 6, 6, layout=lay), 2, return_indices=True)[0],
        (0, 3, 3, 3),
        [(0, 3, 6, 6)],
        N4,
        True,
    ),
    (
        "min_pool2d",
        lambda fn, f, lay: fn.min_pool2d(f.x(0, 3, 6, 6, layout=lay), 2),
        (0, 3, 3, 3),
        [(0, 3, 6, 6)],
        N4,
        False,
    ),
    (
        "avg_pool2d",
        lambda fn, f, lay: fn.avg_pool2d(f.x(0, 3, 6, 6, layout=lay), 3, 2, 1),
        (0, 3, 3, 3),
        [(0, 3, 6, 6)],
        N4,
        True,
    ),
    (
        "adaptive_avg_pool2d",
        lambda fn, f, lay: fn.adaptive_avg_pool2d(f.x(0, 3, 6, 6, layout=lay), (2, 3)),
        (0, 3, 2, 3),
        [(0, 3, 6, 6)],
        N4,
        True,
    ),
    (
        "adaptive_max_pool2d",
        lambda fn, f, lay: fn.adaptive_max_pool2d(f.x(0, 3, 6, 6, layout=lay), 2),
        (0, 3, 2, 2),
        [(0, 3, 6, 6)],
        N4,
        True,
    ),
    (
        "local_response_norm",
        lambda fn, f, lay: fn.local_response_norm(f.x(0, 3, 6, 6, layout=lay), 2),
        (0, 3, 6, 6),
        [(0, 3, 6, 6)],
        N4,
        True,
    ),
    (
        "batch_norm eval",
        lambda fn, f, lay: _bn(fn, f, f.x(0, 3, 6, 6, layout=lay), False),
        (0, 3, 6, 6),
        [(0, 3, 6, 6), (3,), (3,)],
        N4,
        True,
    ),
    (
        "batch_norm eval relu",
        lambda fn, f, lay: _bn(fn, f, f.x(0, 3, 6, 6, layout=lay), False, True),
        (0, 3, 6, 6),
        [(0, 3, 6, 6), (3,), (3,)],
        N4,
        False,
    ),
    (
        "batch_norm training",
        lambda fn, f, lay: _bn(fn, f, f.x(0, 3, 6, 6, layout=lay), True),
        (0, 3, 6, 6),
        [(0, 3, 6, 6), (3,), (3,)],
        N4,
        True,
    ),
    (
        "batch_norm training relu",
        lambda fn, f, lay: _bn(fn, f, f.x(0, 3, 6, 6, layout=lay), True, True),
        (0, 3, 6, 6),
        [(0, 3, 6, 6), (3,), (3,)],
        N4,
        False,
    ),
    (
        "batch_norm 2-D eval",
        lambda fn, f, lay: _bn(fn, f, f.x(0, 3), False),
        (0, 3),
        [(0, 3), (3,), (3,)],
        (None,),
        True,
    ),
    (
        "batch_norm 2-D training",
        lambda fn, f, lay: _bn(fn, f, f.x(0, 3), True),
        (0, 3),
        [(0, 3), (3,), (3,)],
        (None,),
        True,
    ),
    (
        "linear",
        lambda fn, f, lay: fn.linear(f.x(0, 3), f.p(4, 3), f.p(4)),
        (0, 4),
        [(0, 3), (4, 3), (4,)],
        (None,),
        True,
    ),
    (
        "linear 3-D",
        lambda fn, f, lay: fn.linear(f.x(2, 0, 3), f.p(4, 3)),
        (2, 0, 4),
        [(2, 0, 3), (4, 3)],
        (None,),
        True,
    ),
    (
        "relu",
        lambda fn, f, lay: fn.relu(f.x(0, 3, 4, 4, layout=lay)),
        (0, 3, 4, 4),
        [(0, 3, 4, 4)],
        N4,
        True,
    ),
    (
        "leaky_relu",
        lambda fn, f, lay: fn.leaky_relu(f.x(0, 3, 4, 4, layout=lay), 0.2),
        (0, 3, 4, 4),
        [(0, 3, 4, 4)],
        N4,
        True,
    ),
    ("gelu", lambda fn, f, lay: fn.gelu(f.x(0, 5)), (0, 5), [(0, 5)], (None,), True),
    (
        "gelu tanh",
        lambda fn, f, lay: fn.gelu(f.x(0, 5), approximate="tanh"),
        (0, 5),
        [(0, 5)],
        (None,),
        True,
    ),
    ("sigmoid", lambda fn, f, lay: fn.sigmoid(f.x(0, 5)), (0, 5), [(0, 5)], (None,), True),
    ("softmax", lambda fn, f, lay: fn.softmax(f.x(0, 5), 1), (0, 5), [(0, 5)], (None,), True),
    (
        "softmax over the batch",
        lambda fn, f, lay: fn.softmax(f.x(0, 5), 0),
        (0, 5),
        [(0, 5)],
        (None,),
        True,
    ),
    (
        "log_softmax",
        lambda fn, f, lay: fn.log_softmax(f.x(0, 3, 4, 4, layout=lay), 1),
        (0, 3, 4, 4),
        [(0, 3, 4, 4)],
        N4,
        True,
    ),
    ("dropout", lambda fn, f, lay: fn.dropout(f.x(0, 5), 0.5), (0, 5), [(0, 5)], (None,), True),
    (
        "flatten",
        lambda fn, f, lay: fn.flatten(f.x(0, 3, 2, 2, layout=lay), 1),
        (0, 12),
        [(0, 3, 2, 2)],
        N4,
        False,
    ),
    (
        "layer_norm",
        lambda fn, f, lay: fn.layer_norm(f.x(0, 3, 4, 4, layout=lay), (4, 4), f.p(4, 4), f.p(4, 4)),
        (0, 3, 4, 4),
        [(0, 3, 4, 4), (4, 4), (4, 4)],
        N4,
        True,
    ),
    (
        "group_norm",
        lambda fn, f, lay: fn.group_norm(f.x(0, 4, 3, 3, layout=lay), 2, f.p(4), f.p(4)),
        (0, 4, 3, 3),
        [(0, 4, 3, 3), (4,), (4,)],
        N4,
        True,
    ),
    (
        "embedding no indices",
        lambda fn, f, lay: fn.embedding(f.long(0, 3), f.p(5, 4)),
        (0, 3, 4),
        [(5, 4)],
        (None,),
        True,
    ),
    (
        "attention no sequences",
        lambda fn, f, lay: fn.scaled_dot_product_attention(
            f.x(0, 2, 3, 4), f.x(0, 2, 5, 4), f.x(0, 2, 5, 4)
        ),
        (0, 2, 3, 4),
        [(0, 2, 3, 4), (0, 2, 5, 4), (0, 2, 5, 4)],
        (None,),
        True,
    ),
    (
        "attention no queries",
        lambda fn, f, lay: fn.scaled_dot_product_attention(
            f.x(2, 0, 4), f.x(2, 5, 4), f.x(2, 5, 4), is_causal=True
        ),
        (2, 0, 4),
        [(2, 0, 4), (2, 5, 4), (2, 5, 4)],
        (None,),
        True,
    ),
    (
        "attention no keys",
        lambda fn, f, lay: fn.scaled_dot_product_attention(
            f.x(2, 3, 4), f.x(2, 0, 4), f.x(2, 0, 4)
        ),
        (2, 3, 4),
        [(2, 3, 4), (2, 0, 4), (2, 0, 4)],
        (None,),
        True,
    ),
    *[
        (
            op,
            lambda fn, f, lay, op=op: getattr(fn, op)(f.x(0, 3, 4, 4, layout=lay)),
            (0, 3, 4, 4),
            [(0, 3, 4, 4)],
            N4,
            True,
        )
        for op in ("silu", "hardtanh", "relu6", "hardswish")
    ],
    (
        "conv1d",
        lambda fn, f, lay: fn.conv1d(f.x(0, 3, 8), f.p(4, 3, 3), f.p(4), padding=1),
        (0, 4, 8),
        [(0, 3, 8), (4, 3, 3), (4,)],
        (None,),
        True,
    ),
    (
        "conv_transpose2d",
        lambda fn, f, lay: fn.conv_transpose2d(
            f.x(0, 3, 4, 4, layout=lay), f.p(3, 2, 3, 3), f.p(2), stride=2
        ),
        (0, 2, 9, 9),
        [(0, 3, 4, 4), (3, 2, 3, 3), (2,)],
        N4,
        True,
    ),
    (
        "interpolate bilinear",
        lambda fn, f, lay: fn.interpolate(
            f.x(0, 3, 4, 4, layout=lay), scale_factor=2, mode="bilinear"
        ),
        (0, 3, 8, 8),
        [(0, 3, 4, 4)],
        N4,
        True,
    ),
    (
        "pad reflect",
        lambda fn, f, lay: fn.pad(f.x(0, 3, 4, 4, layout=lay), (1, 2, 0, 1), mode="reflect"),
        (0, 3, 5, 7),
        [(0, 3, 4, 4)],
        N4,
        True,
    ),
    (
        "LSTM",
        lambda fn, f, lay: f.module("LSTM", 3, 4, batch_first=True)(f.x(0, 5, 3))[0],
        (0, 5, 4),
        [(0, 5, 3)],
        (None,),
        True,
    ),
    (
        "GRU",
        lambda fn, f, lay: f.module("GRU", 3, 4, batch_first=True)(f.x(0, 5, 3))[0],
        (0, 5, 4),
        [(0, 5, 3)],
        (None,),
        True,
    ),
    (
        "RNN bidirectional",
        lambda fn, f, lay: f.module("RNN", 3, 4, batch_first=True, bidirectional=True)(
            f.x(0, 5, 3)
        )[0],
        (0, 5, 8),
        [(0, 5, 3)],
        (None,),
        True,
    ),
]
LOSSES = [
    (
        "nll_loss",
        lambda fn, f, r: fn.nll_loss(fn.log_softmax(f.x(0, 5), 1), f.long(0), reduction=r),
        (0,),
    ),
    (
        "nll_loss weight",
        lambda fn, f, r: fn.nll_loss(f.x(0, 5), f.long(0), f.c(5), reduction=r),
        (0,),
    ),
    (
        "nll_loss 4-D",
        lambda fn, f, r: fn.nll_loss(f.x(0, 5, 2, 2), f.long(0, 2, 2), reduction=r),
        (0, 2, 2),
    ),
    ("cross_entropy", lambda fn, f, r: fn.cross_entropy(f.x(0, 5), f.long(0), reduction=r), (0,)),
    (
        "cross_entropy smoothing",
        lambda fn, f, r: fn.cross_entropy(f.x(0, 5), f.long(0), reduction=r, label_smoothing=0.1),
        (0,),
    ),
    (
        "cross_entropy probabilities",
        lambda fn, f, r: fn.cross_entropy(f.x(0, 5), f.c(0, 5), reduction=r),
        (0,),
    ),
    ("mse_loss", lambda fn, f, r: fn.mse_loss(f.x(0, 5), f.c(0, 5), reduction=r), (0, 5)),
    (
        "binary_cross_entropy_with_logits",
        lambda fn, f, r: fn.binary_cross_entropy_with_logits(f.x(0, 5), f.c(0, 5), reduction=r),
        (0, 5),
    ),
    (
        "smooth_l1_loss",
        lambda fn, f, r: fn.smooth_l1_loss(f.x(0, 5), f.c(0, 5), reduction=r, beta=0.5),
        (0, 5),
    ),
]
for _name, _call, _shape in LOSSES:
    for _r in ("mean", "sum", "none"):
        EMPTY_BATCH.append(
            (
                f"{_name} {_r}",
                lambda fn, f, lay, c=_call, r=_r: c(fn, f, r),
                _shape if _r == "none" else (),
                [(0, 5, 2, 2) if "4-D" in _name else (0, 5)],
                (None,),
                True,
            )
        )
EMPTY_CASES = [
    pytest.param(call, layout, shape, grads, id=f"{name}-{layout or 'NCHW'}")
    for name, call, shape, grads, layouts, _ in EMPTY_BATCH
    for layout in layouts
]


def _run(fn, f, call, layout, backward):
    out = call(fn, f, layout)
    if backward:
        (out.sum() if out.ndim else out).backward()
    return out


@pytest.mark.parametrize("call, layout, shape, grads", EMPTY_CASES)
def test_empty_batch(call, layout, shape, grads):
    f = Factory()
    out = _run(F, f, call, layout, backward=True)
    assert tuple(out.shape) == shape
    if not shape:  # a reduction over nothing: PyTorch's mean is NaN, its sum 0
        assert out.numpy().size == 1
    assert [tuple(a.grad.shape) for a in f.leaves] == grads
    if f.leaves[0].shape[0] == 0:  # a batch of 0 (not 0 channels): nothing to add up
        for a in f.leaves:
            assert np.all(np.asarray(a.grad.numpy()) == 0), "a gradient over nothing is 0"


@pytest.mark.parametrize("reduction, expected", [("mean", "nan"), ("sum", 0.0)])
def test_empty_batch_loss_values(reduction, expected):
    """PyTorch's mean over an empty batch is NaN, its sum 0."""
    for name, call, _ in LOSSES:
        v = float(call(F, Factory(), reduction))
        assert math.isnan(v) if expected == "nan" else v == expected, (name, reduction, v)


def test_empty_batch_training_leaves_running_statistics():
    """As PyTorch: an empty batch in training updates nothing."""
    mean, var = lm.zeros((3,)), lm.ones((3,))
    F.batch_norm(lm.zeros((0, 3, 2, 2)), mean, var, training=True)
    assert mean.numpy().tolist() == [0.0] * 3 and var.numpy().tolist() == [1.0] * 3


@pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")  # torch's own
def test_empty_batch_matches_torch():
    """Every case of EMPTY_BATCH that PyTorch has, run by torch: the same shapes of the
    result and of every gradient."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as TF

    for name, call, shape, grads, layouts, in_torch in EMPTY_BATCH:
        if not in_torch:
            continue
        for layout in layouts:
            f = Factory(torch)
            out = _run(TF, f, call, layout, backward=True)
            assert tuple(out.shape) == shape, name
            got = [tuple(a.grad.shape) if a.grad is not None else None for a in f.leaves]
            # torch leaves a gradient unset where nothing reached it; lamina's is zeros
            assert all(g in (None, e) for g, e in zip(got, grads)), (name, got, grads)
