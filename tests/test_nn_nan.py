"""NaN, infinities and -0.0 through the lamina.nn primitives against PyTorch's record
(tests/data/nn_nan_reference.json, written by record_nn_nan_reference.py; no PyTorch
needed here): every case's output and gradients, float64, in NCHW and, where the
operator has it, channels-last. Equal where finite (rtol 1e-10), NaN at the same
positions, infinities of the same sign, and zeros of the same sign where PyTorch's
sign is a defined one (outputs of the elementwise primitives; see _SIGNED)."""

import json
import math
import pathlib

import fused
import numpy as np
import pytest

import lamina as lm

F = lm.nn.functional
RECORD = json.loads((pathlib.Path(__file__).parent / "data" / "nn_nan_reference.json").read_text())
_DECODE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def decode(entry):
    data = [_DECODE[v] if isinstance(v, str) else v for v in entry["data"]]
    return np.array(data, dtype=np.float64).reshape(entry["shape"])


# outputs whose zeros' signs are defined by the operator (not by summation order)
_SIGNED = {
    "relu", "leaky_relu", "max_pool2d", "min_pool2d", "silu", "hardtanh", "relu6", "hardswish",
    "embedding",
}  # fmt: skip


def check(actual, expected, what, signed=False):
    actual = np.asarray(actual, dtype=np.float64)
    assert actual.shape == expected.shape, what
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(actual), nan, err_msg=f"{what}: NaN positions")
    inf = np.isinf(expected)
    np.testing.assert_array_equal(np.isinf(actual), inf, err_msg=f"{what}: infinite positions")
    np.testing.assert_array_equal(actual[inf], expected[inf], err_msg=f"{what}: infinities")
    finite = ~nan & ~inf
    np.testing.assert_allclose(
        actual[finite], expected[finite], rtol=1e-10, atol=1e-14, err_msg=what
    )
    if signed:
        zero = finite & (expected == 0)
        np.testing.assert_array_equal(
            np.signbit(actual[zero]), np.signbit(expected[zero]), err_msg=f"{what}: zero signs"
        )


def run(case, layout):
    grads = set(case["grads"])
    ts = {}
    for name, entry in case["inputs"].items():
        t = lm.asarray(decode(entry))
        if layout == "NHWC" and t.ndim == 4:
            t = F.to_layout(t, "NHWC")
            assert F.layout_of(t) == "NHWC"
        if name in grads:
            t = t.detach().requires_grad_() if not t.requires_grad else t
        ts[name] = t
    ints = {k: lm.asarray(np.array(v, dtype=np.int64)) for k, v in case["ints"].items()}
    kw = dict(case["kwargs"])
    op = case["op"]
    if op == "batch_norm":
        rm = lm.asarray(ts["running_mean"].numpy().copy())
        rv = lm.asarray(ts["running_var"].numpy().copy())
        bn = fused.batch_norm_relu if kw.pop("relu", False) else F.batch_norm
        out = bn(ts["input"], rm, rv, ts.get("weight"), ts.get("bias"), **kw)
    else:
        out = getattr(F, op)(**ts, **ints, **kw)
    out.backward(lm.asarray(decode(case["upstream"])))
    return out, {k: ts[k].grad for k in case["grads"]}, ts


PARAMS = [
    pytest.param(c, layout, id=f"{c['name']}-{layout}")
    for c in RECORD["cases"]
    for layout in c["layouts"]
]


def test_record_enumerates_the_cases():
    ops = {c["op"] for c in RECORD["cases"]}
    assert ops == {
        "relu", "leaky_relu", "gelu", "sigmoid", "softmax", "log_softmax", "batch_norm",
        "max_pool2d", "avg_pool2d", "conv2d", "linear", "mse_loss", "nll_loss", "cross_entropy",
        "silu", "hardtanh", "relu6", "hardswish", "layer_norm", "group_norm",
        "local_response_norm", "embedding", "scaled_dot_product_attention",
        "binary_cross_entropy_with_logits", "smooth_l1_loss", "adaptive_avg_pool2d", "min_pool2d",
    }  # fmt: skip
    assert len(RECORD["cases"]) == 117


@pytest.mark.parametrize("case, layout", PARAMS)
def test_matches_pytorch(case, layout):
    out, grads, _ = run(case, layout)
    if layout == "NHWC" and out.ndim == 4 and case["op"] != "layer_norm":
        assert F.layout_of(out) == "NHWC"  # (PyTorch's layer_norm result is contiguous)
    check(out.numpy(), decode(case["output"]), "output", signed=case["op"] in _SIGNED)
    for name, g in grads.items():
        assert g is not None, name
        check(g.numpy(), decode(case["expected_grads"][name]), f"grad of {name}")
