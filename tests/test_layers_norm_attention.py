"""Layer norm, group norm, embedding, attention and the Transformer encoder: values
against float64 NumPy references, the float32 statistics' accuracy, both memory layouts
of group norm, embedding's accumulated and padding gradients, attention's masks, the
modules' PyTorch semantics and their bad input; when PyTorch is importable, the
attention and encoder modules equal PyTorch's with copied weights.

The operators' samples (tests/samples.py) compare the CPU kernels with the oracle and
run on the meta device; their gradients are checked against finite differences in
tests/test_autograd.py (SAMPLES). Shapes here are small.
"""

import math

import numpy as np
import pytest

import lamina as lm
import lamina.nn as nn
from lamina.dispatch.schema import OPERATORS

# the layers' kernels and modules, the same under both per-call cores
pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]

F = nn.functional
RNG = np.random.default_rng(29)


def rand(*shape, dtype="float64", offset=0.0):
    return (RNG.standard_normal(shape) + offset).astype(dtype)


def ref_norm(x, axes, eps=1e-5):
    """(x - mean) / sqrt(var + eps) over ``axes``, in float64."""
    x = x.astype(np.float64)
    mean = x.mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)


# ---------------------------------------------------------------- layer norm


@pytest.mark.parametrize("dtype, tol", [("float32", 2e-6), ("float64", 1e-13)])
def test_layer_norm_matches_float64_even_far_from_zero(dtype, tol):
    """Values of mean 1000 and spread 1: one pass of shifted float64 sums loses nothing
    a float32 result can show (a naive float32 sum of squares would lose it all)."""
    x = rand(6, 3, 5, dtype=dtype, offset=1000.0)
    w, b = rand(3, 5, dtype=dtype), rand(3, 5, dtype=dtype)
    out = F.layer_norm(lm.asarray(x), (3, 5), lm.asarray(w), lm.asarray(b))
    want = ref_norm(x, (1, 2)) * w + b
    np.testing.assert_allclose(out.numpy(), want, rtol=0, atol=tol * 20)


def test_layer_norm_of_a_non_contiguous_input_and_the_module():
    base = rand(4, 6)
    x = lm.asarray(base).T  # (6, 4), transposed
    m = nn.LayerNorm(4, eps=1e-3).double()
    assert m.weight.shape == (4,) and m.bias.shape == (4,)
    np.testing.assert_allclose(m(x).numpy(), ref_norm(base.T, (1,), 1e-3), atol=1e-12)
    bare = nn.LayerNorm([2, 3], elementwise_affine=False)
    assert bare.weight is None and bare.bias is None and not list(bare.parameters())
    assert nn.LayerNorm(3, bias=False).bias is None
    five = np.int64(5)  # NumPy's integers name a size too, as in PyTorch
    assert nn.LayerNorm(five).normalized_shape == (5,)
    assert F.layer_norm(lm.ones((2, 5)), five).shape == (2, 5)


def test_layer_norm_bad_input():
    x = lm.asarray(rand(2, 3))
    with pytest.raises(ValueError, match="normalized_shape"):
        F.layer_norm(x, (2,))
    with pytest.raises(ValueError, match="weight must have shape"):
        F.layer_norm(x, 3, lm.asarray(rand(2)))
    with pytest.raises(TypeError, match="input"):
        F.layer_norm(lm.asarray(np.ones((2, 3), "int64")), 3)


# ---------------------------------------------------------------- group norm


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_group_norm_in_both_layouts(layout, dtype):
    """Values against float64; the result keeps the input's layout; the gradients of
    input, weight and bias are those of the NCHW input."""
    data, w, b = (
        rand(2, 6, 3, 5, dtype=dtype, offset=50.0),
        rand(6, dtype=dtype),
        rand(6, dtype=dtype),
    )
    g = rand(2, 6, 3, 5, dtype=dtype)

    def run(layout):
        x = F.to_layout(lm.asarray(data), layout).requires_grad_()
        wt, bt = lm.asarray(w).requires_grad_(), lm.asarray(b).requires_grad_()
        out = F.group_norm(x, 3, wt, bt)
        lm.sum(out * lm.asarray(g)).backward()
        return out, [t.grad.numpy() for t in (x, wt, bt)]

    out, grads = run(layout)
    assert F.layout_of(out) == layout
    grouped = ref_norm(data.reshape(2, 3, -1), (2,)).reshape(data.shape)
    want = grouped * w[:, None, None] + b[:, None, None]
    tol = 1e-4 if dtype == "float32" else 1e-11
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=tol, atol=tol)
    _, nchw_grads = run("NCHW")
    for got, expected in zip(grads, nchw_grads):
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


def test_group_norm_groups_must_divide_the_channels():
    x = lm.asarray(rand(2, 6, 2, 2))
    with pytest.raises(ValueError, match="num_groups=4 must be positive and divide"):
        F.group_norm(x, 4)
    with pytest.raises(ValueError, match="num_groups=4 must be positive and divide num_channels"):
        nn.GroupNorm(4, 6)
    m = nn.GroupNorm(3, 6).double()
    np.testing.assert_allclose(
        m(x).numpy(), ref_norm(x.numpy().reshape(2, 3, -1), (2,)).reshape(x.shape), atol=1e-12
    )


# ---------------------------------------------------------------- embedding


def test_embedding_gradients_accumulate_and_skip_the_padding_row():
    weight = lm.asarray(rand(5, 3)).requires_grad_()
    idx = lm.asarray(np.array([[1, 4, 1], [2, 1, 0]]))
    out = F.embedding(idx, weight, padding_idx=-3)  # row 2
    np.testing.assert_array_equal(out.detach().numpy(), weight.detach().numpy()[idx.numpy()])
    g = rand(2, 3, 3)
    lm.sum(out * lm.asarray(g)).backward()
    want = np.zeros((5, 3))
    np.add.at(want, idx.numpy().reshape(-1), g.reshape(-1, 3))
    want[2] = 0
    np.testing.assert_allclose(weight.grad.numpy(), want, atol=1e-15)


def test_embedding_module_init_and_bad_input():
    lm.random.seed(3)
    m = nn.Embedding(400, 8, padding_idx=7)
    w = m.weight.detach().numpy()
    assert not w[7].any() and w.dtype == np.float32
    assert abs(w.std() - 1.0) < 0.05 and abs(w.mean()) < 0.05  # N(0, 1)
    with pytest.raises(IndexError, match="index 400 is out of range for 400"):
        m(lm.asarray(np.array([0, 400, 2])))
    with pytest.raises(IndexError, match="index -1 is out of range"):
        m(lm.asarray(np.array([-1])))
    with pytest.raises(TypeError, match="integer indices"):
        m(lm.asarray(np.array([1.0])))
    with pytest.raises(NotImplementedError, match="max_norm"):
        F.embedding(lm.asarray(np.array([1])), m.weight, max_norm=1.0)
    with pytest.raises(ValueError, match="padding_idx"):
        nn.Embedding(4, 2, padding_idx=4)


def test_an_embedding_from_pretrained_rows():
    rows = np.arange(12.0).reshape(4, 3)
    frozen = nn.Embedding.from_pretrained(lm.asarray(rows), padding_idx=1)
    assert not frozen.weight.requires_grad and frozen.weight.dtype == lm.float64
    np.testing.assert_array_equal(frozen(lm.asarray([[3, 1]])).numpy(), rows[[[3, 1]]])
    assert frozen.weight.numpy()[1].tolist() == [3.0, 4.0, 5.0]  # kept, as PyTorch's
    trained = nn.Embedding.from_pretrained(lm.asarray(rows), freeze=False)
    lm.sum(trained(lm.asarray([2, 2]))).backward()
    assert trained.weight.grad.numpy()[2].tolist() == [2.0, 2.0, 2.0]
    rows[0, 0] = -1.0  # a copy
    assert trained.weight.numpy()[0, 0] == 0.0
    with pytest.raises(ValueError, match="embeddings must be 2-D"):
        nn.Embedding.from_pretrained(lm.ones(3))


# ---------------------------------------------------------------- attention


def ref_attention(q, k, v, mask=None, causal=False):
    """softmax(q k^T / sqrt(E) + mask) v in float64; a boolean mask keeps where True."""
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        mask = np.tril(np.ones(scores.shape[-2:], bool))
    if mask is not None and mask.dtype == bool:
        scores = np.where(mask, scores, -np.inf)
    elif mask is not None:
        scores = scores + mask
    with np.errstate(invalid="ignore"):  # a row of -inf only: NaN
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return (weights / weights.sum(axis=-1, keepdims=True)) @ v


def test_a_query_whose_every_key_is_masked_gets_zeros():
    """PyTorch's safe softmax, in the fused kernel and the composite (dropout_p=0 and
    need_weights take the two), with the gradients of the other rows unchanged."""
    q = lm.asarray(rand(2, 3, 4)).requires_grad_()
    keep = np.ones((3, 3), bool)
    keep[1] = False
    for fused in (True, False):
        x = q if fused else q[None]  # leading axes that broadcast: the composite
        out = F.scaled_dot_product_attention(x, q, q, lm.asarray(keep))
        out = out if fused else out[0]
        assert not out.detach().numpy()[:, 1].any()
        np.testing.assert_allclose(
            np.delete(out.detach().numpy(), 1, axis=1),
            np.delete(ref_attention(*(q.detach().numpy(),) * 3, keep), 1, axis=1),
            atol=1e-12,
        )
        (grad,) = lm.autograd.grad(lm.sum(out), q)
        assert np.isfinite(grad.numpy()).all()


def test_attention_over_no_keys_gives_zeros_with_a_mask_too():
    """softmax over no keys: zeros (PyTorch's result); the masked rows' zeroing took a
    max over the empty axis."""
    q, kv = lm.ones((2, 3, 4)), lm.ones((2, 0, 4))
    for mask in (None, lm.ones((3, 0), dtype=lm.bool), lm.zeros((3, 0))):
        out = F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
        assert out.shape == (2, 3, 4) and not out.numpy().any()
    attention = nn.MultiheadAttention(8, 2)
    padding = lm.zeros((2, 0), dtype=lm.bool)
    out, weights = attention(lm.ones((3, 2, 8)), lm.ones((0, 2, 8)), lm.ones((0, 2, 8)), padding)
    assert out.shape == (3, 2, 8) and weights.shape == (2, 3, 0)


@pytest.mark.parametrize(
    "shapes, message",
    [
        (((3, 2, 8), (5, 2, 8), (4, 2, 8)), "same sequence length"),
        (((3, 2, 8), (5, 3, 8), (5, 3, 8)), r"same batch size \(axis 1 of \(L, N, E\)\)"),
        (((2, 3, 2, 8), (3, 2, 8), (3, 2, 8)), "all be 3-D"),
        (((3, 2, 8), (3, 8), (3, 8)), "all be 3-D"),
        (((3, 2, 8), (3, 2, 6), (3, 2, 6)), "embed_dim = 8 features"),
    ],
)
def test_multihead_attention_names_shapes_that_do_not_fit(shapes, message):
    """They failed inside a reshape or a matmul, naming neither input."""
    with pytest.raises(ValueError, match=f"MultiheadAttention: .*{message}"):
        nn.MultiheadAttention(8, 2)(*(lm.ones(s) for s in shapes))


@pytest.mark.parametrize("mask", ["none", "bool-over-heads", "float-over-batch", "causal"])
def test_scaled_dot_product_attention(mask):
    q, k, v = rand(2, 3, 5, 4), rand(2, 3, 6, 4), rand(2, 3, 6, 2)
    m, causal = None, mask == "causal"
    if mask == "bool-over-heads":  # (N, 1, L, S): the same for every head
        m = RNG.random((2, 1, 5, 6)) < 0.6
        m[..., 0] = True  # every query keeps a key
    elif mask == "float-over-batch":  # (L, S)
        m = rand(5, 6)
    if causal:  # 40 queries: two blocks of rows (CAUSAL_ROWS), the second past the keys
        q, k, v = rand(2, 3, 40, 4), rand(2, 3, 37, 4), rand(2, 3, 37, 2)
    lm_mask = None if m is None else lm.asarray(m)
    out = F.scaled_dot_product_attention(
        *(lm.asarray(a) for a in (q, k, v)), attn_mask=lm_mask, is_causal=causal
    )
    np.testing.assert_allclose(out.numpy(), ref_attention(q, k, v, m, causal), atol=1e-12)


def test_scaled_dot_product_attention_gradients_and_scale():
    q, k, v = (lm.asarray(rand(1, 2, 3, 2)).requires_grad_() for _ in range(3))
    mask = lm.asarray(np.array([[True, False, True]] * 3))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask, scale=0.7)
    assert lm.autograd.gradcheck(fn, [q, k, v])
    scaled = F.scaled_dot_product_attention(q, k, v, scale=0.5).detach().numpy()
    args = [t.detach().numpy() for t in (q, k, v)]
    want = ref_attention(args[0] * 0.5 * math.sqrt(2), *args[1:])  # 1 / sqrt(E) undone
    np.testing.assert_allclose(scaled, want, atol=1e-12)


def test_attention_with_broadcast_leading_axes_or_dropout_takes_the_composite():
    q, k, v = rand(2, 3, 5, 4), rand(1, 3, 6, 4), rand(3, 6, 2)
    out = F.scaled_dot_product_attention(*(lm.asarray(a) for a in (q, k, v)))
    np.testing.assert_allclose(out.numpy(), ref_attention(q, k, v), atol=1e-12)
    dropped = F.scaled_dot_product_attention(*(lm.asarray(a) for a in (q, q, q)), dropout_p=1.0)
    assert not dropped.numpy().any()


def test_attention_bad_masks():
    q = lm.asarray(rand(2, 3, 5, 4))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(4, 6\) does not broadcast"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=lm.asarray(np.ones((4, 6), bool)))
    with pytest.raises(ValueError, match="attn_mask must be None when is_causal"):
        F.scaled_dot_product_attention(q, q, q, lm.asarray(np.ones((5, 5), bool)), is_causal=True)
    with pytest.raises(TypeError, match="attn_mask must be boolean or of the query's dtype"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=lm.asarray(np.ones((5, 5), "int64")))
    mha = nn.MultiheadAttention(4, 2)
    x = lm.randn((5, 3, 4))
    with pytest.raises(ValueError, match="attn_mask must have shape"):
        mha(x, x, x, attn_mask=lm.asarray(np.ones((5, 4), bool)))
    with pytest.raises(ValueError, match="key_padding_mask must have shape"):
        mha(x, x, x, key_padding_mask=lm.asarray(np.ones((5, 3), bool)))
    with pytest.raises(ValueError, match="embed_dim=6 must be divisible by num_heads=4"):
        nn.MultiheadAttention(6, 4)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("length", [5, 1])
def test_attention_reads_head_views_in_place_as_their_copies(dtype, length):
    """Heads as MultiheadAttention makes them, views (N, H, L, D) of one (N, L, 3, H,
    D) projection, which the kernels read in place (Note [Strided blocks]), give their
    contiguous copies' results and gradients; so does a key broadcast over the heads."""
    joined = rand(2, length, 3, 3, 4, dtype=dtype)
    views = [np.moveaxis(joined[:, :, i], 1, 2) for i in range(3)]
    views[1] = np.broadcast_to(views[1][:, :1], views[1].shape)  # stride 0 over heads
    results = []
    for arrays in (views, [np.ascontiguousarray(a) for a in views]):
        q, k, v = (lm.asarray(a).requires_grad_() for a in arrays)
        out = F.scaled_dot_product_attention(q, k, v)
        lm.sum(out * out).backward()
        results.append([out.detach().numpy()] + [t.grad.numpy() for t in (q, k, v)])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-13)


def test_attention_backward_bad_input():
    backward = OPERATORS["native_scaled_dot_product_attention_backward"]
    q, v, grad = lm.asarray(rand(2, 3, 2)), lm.asarray(rand(2, 3, 4)), lm.asarray(rand(2, 3, 4))
    weights = lm.asarray(rand(2, 3, 3))
    with pytest.raises(ValueError, match=r"weights must have shape \(2, 3, 3\), got \(2, 3, 4\)"):
        backward(grad, q, q, v, grad, 1.0)
    with pytest.raises(ValueError, match=r"grad must have shape \(2, 3, 4\), got \(2, 3, 2\)"):
        backward(q, q, q, v, weights, 1.0)
    with pytest.raises(TypeError, match="weights has dtype float32, but input has dtype float64"):
        backward(grad, q, q, v, lm.astype(weights, lm.float32), 1.0)
    with pytest.raises(ValueError, match="expected query"):
        backward(grad, q, v, v, weights, 1.0)


# ---------------------------------------------------------------- modules


def ref_layer(layer, x, padding=None):
    """TransformerEncoderLayer's forward in float64 NumPy from its parameters, (L, N, E)
    input, relu, no dropout; padding (N, S) True masks a key out."""
    p = {name: t.detach().numpy() for name, t in layer.state_dict().items()}
    e, h = x.shape[-1], layer.self_attn.num_heads

    def norm(y, i):
        return ref_norm(y, (-1,)) * p[f"norm{i}.weight"] + p[f"norm{i}.bias"]

    def attend(y):
        qkv = y @ p["self_attn.in_proj_weight"].T + p["self_attn.in_proj_bias"]
        heads = [qkv[..., i * e : (i + 1) * e].reshape(*y.shape[:2], h, -1) for i in range(3)]
        q, k, v = (a.transpose(1, 2, 0, 3) for a in heads)  # (N, H, L, D)
        mask = None if padding is None else ~padding[:, None, None, :]
        out = ref_attention(q, k, v, mask).transpose(2, 0, 1, 3).reshape(y.shape)
        return out @ p["self_attn.out_proj.weight"].T + p["self_attn.out_proj.bias"]

    def feed_forward(y):
        hidden = np.maximum(y @ p["linear1.weight"].T + p["linear1.bias"], 0)
        return hidden @ p["linear2.weight"].T + p["linear2.bias"]

    if layer.norm_first:
        x = x + attend(norm(x, 1))
        return x + feed_forward(norm(x, 2))
    x = norm(x + attend(x), 1)
    return norm(x + feed_forward(x), 2)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_and_encoder_against_numpy(norm_first):
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, norm_first=norm_first).double()
    for name, t in layer.named_parameters():  # norms away from ones and zeros
        if name.startswith("norm"):
            t.detach()[...] = lm.asarray(rand(8))
    x = rand(5, 3, 8)
    padding = np.zeros((3, 5), bool)
    padding[1, 3:] = True
    got = layer(lm.asarray(x), src_key_padding_mask=lm.asarray(padding))
    np.testing.assert_allclose(got.detach().numpy(), ref_layer(layer, x, padding), atol=1e-11)
    encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8).double())
    first, second = encoder.layers
    assert first is not layer and first.linear1.weight is not second.linear1.weight
    want = ref_norm(ref_layer(second, ref_layer(first, x)), (-1,))
    np.testing.assert_allclose(encoder(lm.asarray(x)).detach().numpy(), want, atol=1e-11)
    assert layer.training and lm.sum(layer(lm.asarray(x))).requires_grad


def test_multihead_attention_weights_batch_first_and_unbatched():
    mha = nn.MultiheadAttention(4, 2, batch_first=True).double()
    x, kv = rand(3, 5, 4), rand(3, 6, 4)
    out, weights = mha(lm.asarray(x), lm.asarray(kv), lm.asarray(kv), average_attn_weights=False)
    assert out.shape == (3, 5, 4) and weights.shape == (3, 2, 5, 6)
    np.testing.assert_allclose(weights.detach().numpy().sum(axis=-1), 1.0, atol=1e-12)
    single, avg = mha(lm.asarray(x[1]), lm.asarray(kv[1]), lm.asarray(kv[1]))
    np.testing.assert_allclose(single.detach().numpy(), out.detach().numpy()[1], atol=1e-12)
    np.testing.assert_allclose(
        avg.detach().numpy(), weights.detach().numpy()[1].mean(0), atol=1e-12
    )
    assert mha(lm.asarray(x), lm.asarray(x), lm.asarray(x), need_weights=False)[1] is None


def test_modules_equal_pytorchs_with_copied_weights():
    torch = pytest.importorskip("torch")
    tn = torch.nn

    def copy_into(ours, theirs):
        ours.load_state_dict(
            {k: lm.asarray(v.detach().numpy()) for k, v in theirs.state_dict().items()}
        )

    def close(ours, theirs, atol=2e-5):
        np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), atol=atol)

    torch.manual_seed(0)
    mha, theirs_mha = nn.MultiheadAttention(8, 2), tn.MultiheadAttention(8, 2)
    copy_into(mha, theirs_mha)
    q, kv = rand(5, 3, 8, dtype="float32"), rand(7, 3, 8, dtype="float32")
    attn_mask = RNG.random((5, 7)) < 0.3
    attn_mask[:, 0] = False
    padding = np.zeros((3, 7), bool)
    padding[2, 4:] = True
    masks = {"key_padding_mask": padding, "attn_mask": attn_mask}
    ours = mha(
        *(lm.asarray(a) for a in (q, kv, kv)), **{k: lm.asarray(m) for k, m in masks.items()}
    )
    theirs = theirs_mha(
        *(torch.tensor(a) for a in (q, kv, kv)), **{k: torch.tensor(m) for k, m in masks.items()}
    )
    close(ours[0], theirs[0])
    close(ours[1], theirs[1])
    for norm_first in (False, True):
        settings = dict(dim_feedforward=16, dropout=0.0, activation="gelu", norm_first=norm_first)
        layer = nn.TransformerEncoderLayer(8, 2, batch_first=True, **settings).eval()
        theirs_layer = tn.TransformerEncoderLayer(8, 2, batch_first=True, **settings).eval()
        copy_into(layer, theirs_layer)
        x = rand(3, 5, 8, dtype="float32")
        with torch.no_grad():
            close(layer(lm.asarray(x)), theirs_layer(torch.tensor(x)))


# ---------------------------------------------------------------- threads


@pytest.fixture
def two_threads():
    before = lm.get_num_threads()
    lm.set_num_threads(2)
    yield
    lm.set_num_threads(before)


PARALLEL = [  # inputs of 2**17 elements (Note [Parallel threshold]), float32
    ("layer_norm", (512, 256), lambda x: F.layer_norm(x, 256, x[0], x[1])),
    ("group_norm", (2, 16, 64, 64), lambda x: F.group_norm(x, 4)),
    ("group_norm_nhwc", (2, 16, 64, 64), lambda x: F.group_norm(F.to_layout(x, "NHWC"), 4)),
    ("attention", (2, 4, 128, 16), lambda x: F.scaled_dot_product_attention(x, x * 0.5, x)),
]


@pytest.mark.parametrize("shape, fn", [c[1:] for c in PARALLEL], ids=[c[0] for c in PARALLEL])
def test_parallel_kernels_equal_the_serial_ones(shape, fn, two_threads):
    """The prange variants (chunked partial sums, per-chunk scratch blocks) give the
    serial kernels' values and gradients, to float32 rounding of other sum orders."""
    data = rand(*shape, dtype="float32")
    results = []
    for threads in (2, 1):
        lm.set_num_threads(threads)
        x = lm.asarray(data).requires_grad_()
        out = fn(x)
        lm.sum(out * out).backward()
        with lm.no_grad():  # attention keeps no weights then: a scratch block per chunk
            plain = fn(x)
        results.append((out.detach().numpy(), x.grad.numpy(), plain.numpy()))
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
