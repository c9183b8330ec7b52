"""Record PyTorch's values and gradients of the lamina.nn primitives on inputs that
hold NaN, +inf, -inf and -0.0 at fixed positions into nn_nan_reference.json beside
this file (run by hand with torch installed; tests/test_nn_nan.py reads the record and
needs no PyTorch):

    python tests/data/record_nn_nan_reference.py

Every case is float64: its inputs, a fixed upstream gradient, and PyTorch's output and
the gradients of every input that takes one. Floats are written as JSON numbers, the
non-finite ones as the strings "nan", "inf" and "-inf" (-0.0 is a JSON number).
lamina's fused batch norm + relu (the batch_norm_relu rewrite) is recorded as relu(batch_norm(...)),
lamina's min_pool2d (PyTorch has none) as -max_pool2d(-x).
"""

import json
import math
import pathlib

import numpy as np
import torch
import torch.nn.functional as F

SPECIALS = [math.nan, math.inf, -math.inf, -0.0]


def encode(a):
    a = np.asarray(a, dtype=np.float64)
    flat = [
        ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")) if not math.isfinite(v) else v
        for v in a.reshape(-1).tolist()
    ]
    return {"shape": list(a.shape), "data": flat}


def values(shape, seed, specials=(), lo=-1.0, hi=1.0):
    """Uniform values with specials[i] = (flat index, value) put in place."""
    a = np.random.default_rng(seed).uniform(lo, hi, shape)
    a = np.round(a, 6)  # short decimal JSON
    flat = a.reshape(-1)
    for i, v in specials:
        flat[i] = v
    return a


# the fixed positions of the specials in a tensor of n elements
def spread(n):
    return [(1, math.nan), (n // 3 + 1, math.inf), (2 * n // 3 + 1, -math.inf), (n - 2, -0.0)]


CASES = []


def case(name, op, inputs, grads, kwargs=None, layouts=("NCHW",), ints=None):
    """inputs: name -> float array (those named in ``grads`` take gradients);
    ints: name -> integer array (targets)."""
    CASES.append(
        {
            "name": name,
            "op": op,
            "kwargs": kwargs or {},
            "inputs": inputs,
            "ints": ints or {},
            "grads": list(grads),
            "layouts": list(layouts),
        }
    )


IMG = (2, 3, 2, 2)
N_IMG = 24
BOTH = ("NCHW", "NHWC")

# activations, elementwise: every special at once
x = values(IMG, 1, spread(N_IMG) + [(5, 0.0), (17, 40.0), (18, -40.0)])
for op, kw in [
    ("relu", {}),
    ("leaky_relu", {"negative_slope": 0.1}),
    ("gelu", {}),
    ("gelu", {"approximate": "tanh"}),
    ("sigmoid", {}),
]:
    tag = op + ("_tanh" if kw.get("approximate") else "")
    case(tag, op, {"input": x}, ["input"], kw, BOTH)
# softmax / log_softmax: a row with NaN, a row with +inf, a row with -inf, a row of -inf
sm = values((4, 5), 2, [(1, math.nan), (7, math.inf), (13, -math.inf), (19, -0.0)])
sm[3, :] = -math.inf
for op in ("softmax", "log_softmax"):
    case(op, op, {"input": sm}, ["input"], {"dim": 1})
    case(op + "_dim0", op, {"input": sm}, ["input"], {"dim": 0})
    case(op + "_4d", op, {"input": x}, ["input"], {"dim": 1}, BOTH)

# batch norm: one NaN; every special (one channel each)
bn_nan = values(IMG, 3, [(1, math.nan)])
bn_all = values(IMG, 3, [(1, math.nan), (6, math.inf), (9, -0.0), (22, -math.inf)])
bn_params = {
    "weight": values((3,), 4, lo=0.5, hi=1.5),
    "bias": values((3,), 5),
    "running_mean": values((3,), 6),
    "running_var": values((3,), 7, lo=0.5, hi=2.0),
}
for xname, xv in [("nan", bn_nan), ("special", bn_all)]:
    for training in (False, True):
        for relu in (False, True):
            for affine in (True, False):
                inputs = {
                    "input": xv,
                    "running_mean": bn_params["running_mean"],
                    "running_var": bn_params["running_var"],
                }
                grads = ["input"]
                if affine:
                    inputs["weight"], inputs["bias"] = bn_params["weight"], bn_params["bias"]
                    grads += ["weight", "bias"]
                name = (
                    f"batch_norm_{xname}_{'train' if training else 'eval'}"
                    f"{'_relu' if relu else ''}{'' if affine else '_noaffine'}"
                )
                case(
                    name,
                    "batch_norm",
                    inputs,
                    grads,
                    {"training": training, "relu": relu, "eps": 1e-5},
                    BOTH,
                )

# pooling
px = values((1, 2, 4, 4), 8, spread(32) + [(20, 0.0)])
case("max_pool2d", "max_pool2d", {"input": px}, ["input"], {"kernel_size": 2}, BOTH)
case(
    "max_pool2d_pad",
    "max_pool2d",
    {"input": px},
    ["input"],
    {"kernel_size": 3, "stride": 2, "padding": 1},
    BOTH,
)
case("avg_pool2d", "avg_pool2d", {"input": px}, ["input"], {"kernel_size": 2}, BOTH)
case(
    "avg_pool2d_pad",
    "avg_pool2d",
    {"input": px},
    ["input"],
    {"kernel_size": 3, "stride": 2, "padding": 1},
    BOTH,
)

# conv2d and linear: specials in the input, then in the weight
cx = values((1, 2, 4, 4), 9, spread(32))
cw = values((3, 2, 2, 2), 10)
cb = values((3,), 11)
case(
    "conv2d",
    "conv2d",
    {"input": cx, "weight": cw, "bias": cb},
    ["input", "weight", "bias"],
    {},
    BOTH,
)
case(
    "conv2d_pad",
    "conv2d",
    {"input": cx, "weight": cw, "bias": cb},
    ["input", "weight", "bias"],
    {"padding": 1},
    BOTH,
)
case(
    "conv2d_special_weight",
    "conv2d",
    {
        "input": values((1, 2, 4, 4), 9),
        "weight": values((3, 2, 2, 2), 10, [(3, math.nan), (12, math.inf)]),
        "bias": cb,
    },
    ["input", "weight", "bias"],
    {},
    BOTH,
)
lx = values((3, 4), 12, spread(12))
case(
    "linear",
    "linear",
    {"input": lx, "weight": values((2, 4), 13), "bias": values((2,), 14)},
    ["input", "weight", "bias"],
)
case(
    "linear_special_weight",
    "linear",
    {
        "input": values((3, 4), 12),
        "weight": values((2, 4), 13, [(2, math.inf), (5, math.nan)]),
        "bias": values((2,), 14, [(1, -math.inf)]),
    },
    ["input", "weight", "bias"],
)

# losses
mx = values((3, 4), 15, spread(12))
mt = values((3, 4), 16)
for reduction in ("mean", "sum", "none"):
    case(
        f"mse_loss_{reduction}",
        "mse_loss",
        {"input": mx, "target": mt},
        ["input", "target"],
        {"reduction": reduction},
    )

logits = values((4, 3), 17, [(1, math.nan), (5, math.inf), (7, -math.inf), (9, -0.0)])
clean = values((4, 3), 18)
target = np.array([0, 2, 1, 1])
ignored = np.array([-100, -100, -100, -100])
w3 = values((3,), 19, lo=0.5, hi=1.5)
zero_w = np.zeros(3)
part_w = np.array([0.0, 0.7, 0.0])
for op in ("nll_loss", "cross_entropy"):
    for reduction in ("mean", "sum", "none"):
        case(
            f"{op}_special_{reduction}",
            op,
            {"input": logits},
            ["input"],
            {"reduction": reduction},
            ints={"target": target},
        )
        case(
            f"{op}_all_ignored_{reduction}",
            op,
            {"input": clean},
            ["input"],
            {"reduction": reduction},
            ints={"target": ignored},
        )
        case(
            f"{op}_all_ignored_weighted_{reduction}",
            op,
            {"input": clean, "weight": w3},
            ["input"],
            {"reduction": reduction},
            ints={"target": ignored},
        )
        case(
            f"{op}_zero_weights_{reduction}",
            op,
            {"input": clean, "weight": zero_w},
            ["input"],
            {"reduction": reduction},
            ints={"target": target},
        )
        case(
            f"{op}_partly_zero_weights_{reduction}",
            op,
            {"input": clean, "weight": part_w},
            ["input"],
            {"reduction": reduction},
            ints={"target": np.array([0, 2, 0, 2])},
        )
    case(
        f"{op}_some_ignored",
        op,
        {"input": clean},
        ["input"],
        {"ignore_index": 1},
        ints={"target": target},
    )
for reduction in ("mean", "sum", "none"):
    for tname, t in [
        ("", target),
        ("_all_ignored", ignored),
        ("_some_ignored", np.array([0, -100, 1, -100])),
    ]:
        case(
            f"cross_entropy_smoothing{tname}_{reduction}",
            "cross_entropy",
            {"input": clean},
            ["input"],
            {"reduction": reduction, "label_smoothing": 0.1},
            ints={"target": t},
        )
        case(
            f"cross_entropy_smoothing_zero_weights{tname}_{reduction}",
            "cross_entropy",
            {"input": clean, "weight": zero_w},
            ["input"],
            {"reduction": reduction, "label_smoothing": 0.1},
            ints={"target": t},
        )
    case(
        f"cross_entropy_smoothing_special_{reduction}",
        "cross_entropy",
        {"input": logits},
        ["input"],
        {"reduction": reduction, "label_smoothing": 0.1},
        ints={"target": target},
    )

# the newer activations: every special, and each one's bend points (hardtanh's and
# relu6's bounds, hardswish's -3 and 3) exactly
xa = values(IMG, 20, spread(N_IMG) + [(5, 0.0), (3, 3.0), (4, -3.0), (6, 6.0), (7, -1.0),
                                       (8, 1.0), (11, 40.0), (12, -40.0)])  # fmt: skip
for op in ("silu", "hardtanh", "relu6"):
    case(op, op, {"input": xa}, ["input"], {}, BOTH)
# hardswish's gradient at NaN is left out: PyTorch's depends on the element's place,
# NaN from its CPU vector loop, the upstream gradient from its scalar loop (a tensor's
# last elements, tensors under 16 elements); lamina passes the gradient
# (tests/test_layers_activations_losses.py records it)
case("hardswish", "hardswish", {"input": np.where(np.isnan(xa), 0.5, xa)}, ["input"], {}, BOTH)

# layer and group norm: a slice (group) per special, others clean; specials in the
# affine parameters
ln_affine = {"weight": values((2, 2), 21, lo=0.5, hi=1.5), "bias": values((2, 2), 22)}
case(
    "layer_norm",
    "layer_norm",
    {"input": bn_all, **ln_affine},
    ["input", "weight", "bias"],
    {"normalized_shape": [2, 2]},
    BOTH,
)
case("layer_norm_noaffine", "layer_norm", {"input": sm}, ["input"], {"normalized_shape": [5]})
case(
    "layer_norm_special_weight",
    "layer_norm",
    {
        "input": values(IMG, 3),
        "weight": values((2, 2), 21, [(1, math.nan), (2, -0.0)]),
        "bias": values((2, 2), 22, [(3, math.inf)]),
    },
    ["input", "weight", "bias"],
    {"normalized_shape": [2, 2]},
)
gx = values((2, 4, 2, 2), 23, spread(32))
gn_affine = {"weight": values((4,), 24, lo=0.5, hi=1.5), "bias": values((4,), 25)}
case(
    "group_norm",
    "group_norm",
    {"input": gx, **gn_affine},
    ["input", "weight", "bias"],
    {"num_groups": 2},
    BOTH,
)
case(
    "group_norm_nan",
    "group_norm",
    {"input": values((2, 4, 2, 2), 23, [(1, math.nan)]), **gn_affine},
    ["input", "weight", "bias"],
    {"num_groups": 2},
    BOTH,
)
case("local_response_norm", "local_response_norm", {"input": bn_all}, ["input"], {"size": 2}, BOTH)

# embedding: specials in the weight; index 2 repeated (gradients add), then padding
ew = values((5, 3), 26, [(1, math.nan), (6, math.inf), (8, -math.inf), (13, -0.0)])
idx = np.array([[0, 2], [4, 2], [1, 3]])
case("embedding", "embedding", {"weight": ew}, ["weight"], ints={"input": idx})
case(
    "embedding_padding",
    "embedding",
    {"weight": ew},
    ["weight"],
    {"padding_idx": 2},
    ints={"input": idx},
)

# attention: a special in the query, the key and the value; an additive mask that
# masks one query's every key. Causal: only the first value, which every query sees, is
# special. PyTorch's CPU kernels add the mask's -inf to a hidden score, so a special
# anywhere in a row (an infinite key, a NaN query) turns NaN its hidden weights too, and
# through them the gradients of values and keys the row must not see; lamina leaves
# hidden positions out (a PyTorch bug: masking that lets hidden data through)
q = values((2, 3, 4), 27, [(1, math.nan)])
k = values((2, 5, 4), 28, [(21, math.inf), (30, -0.0)])
v = values((2, 5, 4), 29, [(3, -math.inf)])
qkv = {"query": q, "key": k, "value": v}
case("attention", "scaled_dot_product_attention", qkv, ["query", "key", "value"])
case(
    "attention_causal",
    "scaled_dot_product_attention",
    {"query": values((2, 3, 4), 27), "key": values((2, 5, 4), 28, [(30, -0.0)]), "value": v},
    ["query", "key", "value"],
    {"is_causal": True},
)
mask = np.zeros((3, 5))
mask[0, :] = -math.inf
mask[2, 1] = -math.inf
case(
    "attention_masked",
    "scaled_dot_product_attention",
    {"query": values((2, 3, 4), 27), "key": values((2, 5, 4), 28), "value": v, "attn_mask": mask},
    ["query", "key", "value"],
)

# the newer losses
bt = values((3, 4), 16, lo=0.0, hi=1.0)
for reduction in ("mean", "none"):
    case(
        f"bce_with_logits_{reduction}",
        "binary_cross_entropy_with_logits",
        {"input": mx, "target": bt},
        ["input", "target"],
        {"reduction": reduction},
    )
case(
    "bce_with_logits_weights",
    "binary_cross_entropy_with_logits",
    {
        "input": mx,
        "target": bt,
        "weight": values((4,), 30, lo=0.5, hi=1.5),
        "pos_weight": values((4,), 31, lo=0.5, hi=1.5),
    },
    ["input", "target"],
    {"reduction": "sum"},
)
# beta=0 is PyTorch's l1_loss, whose gradient at NaN is 0 (PyTorch's sign(NaN) = 0, a
# bug: beta > 0 gives NaN there); lamina's is NaN at any beta, so that case has no NaN
for reduction, beta in [("mean", 1.0), ("none", 0.5), ("sum", 0.0)]:
    case(
        f"smooth_l1_loss_{reduction}_beta{beta}",
        "smooth_l1_loss",
        {"input": mx if beta else np.where(np.isnan(mx), 0.5, mx), "target": mt},
        ["input", "target"],
        {"reduction": reduction, "beta": beta},
    )

# the newer pooling (PyTorch has no min pooling: recorded as -max_pool2d(-x))
for size in (2, 3):
    case(
        f"adaptive_avg_pool2d_{size}",
        "adaptive_avg_pool2d",
        {"input": px},
        ["input"],
        {"output_size": size},
        BOTH,
    )
case("min_pool2d", "min_pool2d", {"input": px}, ["input"], {"kernel_size": 2}, BOTH)
case(
    "min_pool2d_pad",
    "min_pool2d",
    {"input": px},
    ["input"],
    {"kernel_size": 3, "stride": 2, "padding": 1},
    BOTH,
)


def run_torch(c):
    ts = {
        k: torch.tensor(v, dtype=torch.float64, requires_grad=k in c["grads"])
        for k, v in c["inputs"].items()
    }
    ints = {k: torch.tensor(v, dtype=torch.int64) for k, v in c["ints"].items()}
    kw = dict(c["kwargs"])
    op = c["op"]
    if op == "batch_norm":
        relu = kw.pop("relu")
        rm, rv = ts["running_mean"].detach().clone(), ts["running_var"].detach().clone()
        out = F.batch_norm(ts["input"], rm, rv, ts.get("weight"), ts.get("bias"), **kw)
        if relu:
            out = torch.relu(out)
    elif op == "min_pool2d":
        out = -F.max_pool2d(-ts["input"], **kw)
    else:
        out = getattr(F, op)(**ts, **ints, **kw)
    upstream = values(tuple(out.shape), 99, lo=0.5, hi=1.5)
    out.backward(torch.tensor(upstream))
    c["upstream"] = encode(upstream)
    c["output"] = encode(out.detach().numpy())
    c["expected_grads"] = {k: encode(ts[k].grad.numpy()) for k in c["grads"]}
    c["inputs"] = {k: encode(v) for k, v in c["inputs"].items()}
    c["ints"] = {k: np.asarray(v).tolist() for k, v in c["ints"].items()}
    return c


def main():
    record = {"torch": torch.__version__, "cases": [run_torch(c) for c in CASES]}
    path = pathlib.Path(__file__).with_name("nn_nan_reference.json")
    path.write_text(json.dumps(record, indent=None, separators=(",", ":")) + "\n")
    print(f"{len(CASES)} cases -> {path}")


if __name__ == "__main__":
    main()
