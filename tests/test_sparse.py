"""Sparse COO tensors and the sparse-check layer (backends/sparse).

Every sparse kernel is checked against the dense result: ``to_dense()`` of the inputs,
then the dense operator. Sparsity patterns come from hypothesis: random entries (with
duplicates), no entries (nnz = 0) and every entry (fully dense), coalesced or not.
Values are small multiples of 0.5, so sums and products are exact in every order and
results can be compared exactly. Numba compiles each kernel once per dtype (cold CI),
so the dtypes are float64 and int64, plus float32 and int32 where promotion or BLAS
are the point.
"""

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lamina as lm
from lamina.backends import sparse as SP
from lamina.dispatch import keys, registry

CPU, SPARSE = keys.CPU, keys.SPARSE
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- strategies


def build(idx, vals, shape, coalesce=False):
    t = lm.sparse_coo_tensor(idx, vals, shape)
    return t.coalesce() if coalesce else t


@st.composite
def shapes(draw, ndim=None):
    nd = ndim or draw(st.sampled_from([1, 2]))
    return tuple(draw(st.integers(0, 5)) for _ in range(nd))


@st.composite
def cases(draw, shape=None, dtype="float64", ndim=None):
    """(sparse tensor, the same as a dense NumPy array built independently)."""
    shape = draw(shapes(ndim)) if shape is None else shape
    size = int(np.prod(shape))
    pattern = draw(st.sampled_from(["random", "empty", "full"])) if size else "empty"
    if pattern == "empty":
        flat = []
    elif pattern == "full":
        flat = draw(st.permutations(range(size)))
    else:  # draws with replacement: duplicates are common
        flat = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=2 * size + 2))
    idx = np.array(np.unravel_index(np.array(flat, np.int64), shape), np.int64).reshape(
        len(shape), -1
    )
    scale = 0.5 if np.dtype(dtype).kind == "f" else 1
    vals = (
        np.array(
            draw(st.lists(st.integers(-6, 6), min_size=len(flat), max_size=len(flat))), np.int64
        )
        * scale
    ).astype(dtype)
    ref = np.zeros(shape, dtype)
    np.add.at(ref, tuple(idx), vals)
    return build(idx, vals, shape, draw(st.booleans())), ref


@st.composite
def pairs(draw, dtype="float64", dtype2=None):
    shape = draw(shapes())
    return (draw(cases(shape, dtype)), draw(cases(shape, dtype2 or dtype)))


def dense_array(shape, dtype="float64", seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(-6, 7, size=shape) * (0.5 if np.dtype(dtype).kind == "f" else 1)).astype(
        dtype
    )


def default_np():
    """The NumPy dtype of lamina's default floating dtype (Note [Default dtype])."""
    return np.dtype(lm.get_default_dtype().name)


def as_dense(t):
    assert isinstance(t, lm.Tensor)
    return t.to_dense().numpy() if t.is_sparse else t.numpy()


def same(result, expected):
    """Exact equality, dtype and shape included (the values here make it exact)."""
    got = as_dense(result)
    expected = np.asarray(expected)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_array_equal(got, expected)


def check_structure(t):
    """A sparse tensor's storage obeys Note [Sparse tensors]."""
    c = t._data
    assert t._ks == CPU | SPARSE and t._flat is None
    assert c.indices.dtype == np.int64 and c.indices.flags.c_contiguous
    assert c.indices.shape == (len(t.shape), c.values.size) and c.values.ndim == 1
    assert t.dtype.name == c.values.dtype.name
    if c.values.size:
        assert (c.indices >= 0).all()
        assert (c.indices < np.array(t.shape)[:, None]).all()
    if c.coalesced:
        keys_ = np.ravel_multi_index(tuple(c.indices), t.shape) if c.values.size else []
        assert list(keys_) == sorted(set(keys_)), "coalesced but not sorted and unique"


# ---------------------------------------------------------------- conversion, coalesce


@SETTINGS
@given(cases())
def test_to_dense_sums_duplicates(case):
    s, ref = case
    check_structure(s)
    assert s.is_sparse and s.shape == ref.shape and s.dtype == lm.float64
    same(s.to_dense(), ref)
    assert not s.to_dense().is_sparse


@SETTINGS
@given(cases(dtype="int64"))
def test_coalesce_sorts_merges_and_is_idempotent(case):
    s, ref = case
    c = s.coalesce()
    check_structure(c)
    assert c.is_coalesced() and c.nnz <= s.nnz
    assert c.nnz == len({tuple(col) for col in s.indices().numpy().T})
    same(c, ref)
    assert c.coalesce() is c  # idempotent: a coalesced tensor is returned as it is
    again = lm.sparse_coo_tensor(c.indices(), c.values(), c.shape).coalesce()
    np.testing.assert_array_equal(again.indices().numpy(), c.indices().numpy())
    np.testing.assert_array_equal(again.values().numpy(), c.values().numpy())


@SETTINGS
@given(cases())
def test_to_sparse_round_trip(case):
    _, ref = case
    s = lm.asarray(ref).to_sparse()
    check_structure(s)
    assert s.is_coalesced() and s.nnz == np.count_nonzero(ref)
    same(s, ref)
    assert s.to_sparse() is s and lm.asarray(ref).to_dense().is_sparse is False


def test_coalesce_sums_duplicates_in_order_and_keeps_explicit_zeros():
    s = lm.sparse_coo_tensor([[1, 0, 1, 1], [2, 0, 2, 0]], [1.0, 2.0, -1.0, 0.0], (2, 3))
    assert not s.is_coalesced() and s.nnz == 4
    c = s.coalesce()
    assert c.indices().tolist() == [[0, 1, 1], [0, 0, 2]]
    assert c.values().tolist() == [2.0, 0.0, 0.0]  # cancelled and explicit zeros stay
    assert c.nnz == 3 and c.is_coalesced()


# ---------------------------------------------------------------- elementwise


@SETTINGS
@given(pairs(), st.sampled_from(["add", "subtract"]))
def test_sparse_plus_minus_sparse_is_sparse(pair, name):
    (a, ra), (b, rb) = pair
    fn = getattr(lm, name)
    out = fn(a, b)
    assert out.is_sparse
    check_structure(out)
    assert out.is_coalesced() == (a.is_coalesced() and b.is_coalesced()) or out.nnz <= 1
    same(out, getattr(np, name)(ra, rb))
    same(out, fn(a.to_dense(), b.to_dense()))


@SETTINGS
@given(cases(), st.sampled_from(["add", "subtract"]), st.booleans())
def test_sparse_plus_minus_dense_is_dense(case, name, sparse_first):
    s, ref = case
    d = dense_array(ref.shape)
    fn = getattr(lm, name)
    a, b = (s, lm.asarray(d)) if sparse_first else (lm.asarray(d), s)
    out = fn(a, b)
    assert not out.is_sparse
    expected = getattr(np, name)(*((ref, d) if sparse_first else (d, ref)))
    same(out, expected)
    same(out, fn(*(x.to_dense() for x in (a, b))))
    # a broadcast dense operand and a Python scalar
    if ref.ndim == 2:
        same(fn(s, lm.asarray(d[:1])), getattr(np, name)(ref, d[:1]))
    same(
        fn(s, 2) if sparse_first else fn(2, s),
        getattr(np, name)(ref, 2.0) if sparse_first else getattr(np, name)(2.0, ref),
    )


@SETTINGS
@given(cases(), st.sampled_from([2, -1.5, 0]), st.booleans())
def test_sparse_times_scalar_is_sparse(case, k, scalar_first):
    s, ref = case
    out = k * s if scalar_first else s * k
    assert out.is_sparse and out.nnz == s.nnz and out.is_coalesced() == s.is_coalesced()
    check_structure(out)
    same(out, ref * k)
    same(out, s.to_dense() * k)


@SETTINGS
@given(cases(), st.booleans())
def test_sparse_times_dense_is_sparse(case, dense_first):
    s, ref = case
    d = dense_array(ref.shape, seed=1)
    out = lm.asarray(d) * s if dense_first else s * lm.asarray(d)
    assert out.is_sparse and out.nnz == s.nnz
    check_structure(out)
    same(out, ref * d)
    same(out, s.to_dense() * lm.asarray(d))
    if ref.ndim == 2 and ref.shape[0]:  # the dense operand may broadcast
        same(s * lm.asarray(d[:1]), ref * d[:1])


@SETTINGS
@given(pairs())
def test_sparse_times_sparse_is_the_intersection(pair):
    (a, ra), (b, rb) = pair
    out = a * b
    assert out.is_sparse and out.is_coalesced()
    check_structure(out)
    same(out, ra * rb)
    assert out.nnz <= min(a.coalesce().nnz, b.coalesce().nnz)


@SETTINGS
@given(pairs("int32", "float32"))
def test_promotion_follows_the_dense_rules(pair):
    (a, ra), (b, rb) = pair
    assert a.dtype == lm.int32 and b.dtype == lm.float32
    # int32 with float32 is float64 (NumPy 2); a Python float makes ints the default float
    for out, expected in (
        (a + b, ra + rb),
        (a * b, ra * rb),
        (a + lm.asarray(rb), ra + rb),
        (a * 1.5, (ra * 1.5).astype(default_np())),  # exact: small multiples of 0.75
        (a * 2, ra * 2),
        (-a, -ra),
    ):
        same(out, expected)


UNARY = SP.PATTERN_UNARY


@settings(max_examples=10, deadline=None)
@given(cases())
def test_pattern_keeping_unary_operators(case):
    s, ref = case
    with np.errstate(all="ignore"):
        for name in UNARY:
            try:
                getattr(lm, name)(lm.asarray(ref))
            except TypeError:  # imag of real values: the sparse tensor is refused alike
                with pytest.raises(TypeError, match=name):
                    getattr(lm, name)(s)
                continue
            out = getattr(lm, name)(s)
            assert out.is_sparse, name
            expected = getattr(lm, name)(lm.asarray(ref)).numpy()
            np.testing.assert_array_equal(as_dense(out), expected, err_msg=name)
            assert out.dtype == getattr(lm, name)(lm.asarray(ref)).dtype
    same(-s, -ref)
    same(abs(s), np.abs(ref))


def test_unary_on_int_values():
    s = lm.sparse_coo_tensor([[0, 2, 0]], [-3, 4, 1], (4,))
    same(abs(s), np.array([2, 0, 4, 0]))
    same(-s, np.array([2, 0, -4, 0]))
    same(lm.sign(s), np.array([-1, 0, 1, 0]))
    # an int tensor promoted to floating gives the default float
    same(lm.sqrt(abs(s)), np.sqrt(np.array([2.0, 0, 4, 0], default_np())))


# ---------------------------------------------------------------- sum, transpose


@SETTINGS
@given(cases(), st.booleans())
def test_sum_over_all_and_each_axis(case, keepdims):
    s, ref = case
    axes = [None, *range(ref.ndim), tuple(range(ref.ndim)), ()]
    for axis in axes:
        out = lm.sum(s, axis=axis, keepdims=keepdims)
        assert not out.is_sparse
        same(out, np.sum(ref, axis=axis, keepdims=keepdims))
        same(out, lm.sum(s.to_dense(), axis=axis, keepdims=keepdims))


def test_sum_dtypes_see_the_dense_values():
    # the tensor is its dense form: duplicates add up before a cast or a wider sum
    s = lm.sparse_coo_tensor([[0, 1, 1]], [1.75, 2.5, 1.75], (3,))  # [1.75, 4.25, 0]
    same(lm.sum(s, dtype=lm.int64), np.int64(5))  # cast first, as for dense tensors
    same(lm.sum(s, dtype=lm.float32), np.float32(6.0))
    i = lm.sparse_coo_tensor([[0, 0, 1]], np.array([100, 100, 7], np.int8), (2,))
    same(i.to_dense(), np.array([-56, 7], np.int8))  # duplicates add in the dtype
    same(lm.sum(i), np.int64(-49))
    same(lm.sum(i.coalesce()), np.int64(-49))


@SETTINGS
@given(cases(ndim=2))
def test_transpose(case):
    s, ref = case
    for out in (s.T, s.mT, lm.matrix_transpose(s), lm.permute_dims(s, (1, 0))):
        assert out.is_sparse and out.shape == ref.T.shape
        check_structure(out)
        same(out, ref.T)
    assert lm.permute_dims(s, (0, 1)) is s
    same(lm.sum(s.T, axis=0), ref.sum(axis=1))


# ---------------------------------------------------------------- matrix products


@SETTINGS
@given(cases(ndim=2, dtype="float64"), st.integers(0, 3))
def test_sparse_at_dense(case, n):
    s, ref = case
    d = dense_array((ref.shape[1], n), seed=2)
    out = s @ lm.asarray(d)
    assert not out.is_sparse
    same(out, ref @ d)
    same(out, s.to_dense() @ lm.asarray(d))
    v = dense_array((ref.shape[1],), seed=3)
    same(s @ lm.asarray(v), ref @ v)


@SETTINGS
@given(cases(ndim=2, dtype="int64"), st.integers(0, 7))
def test_dense_at_sparse(case, m):  # up to 4 rows row by row, more transposed
    s, ref = case
    d = dense_array((m, ref.shape[0]), "int64", seed=4)
    same(lm.asarray(d) @ s, d @ ref)
    same(lm.matmul(lm.asarray(d), s), lm.asarray(d) @ s.to_dense())
    v = dense_array((ref.shape[0],), "int64", seed=5)
    same(lm.asarray(v) @ s, v @ ref)


@SETTINGS
@given(cases(ndim=1))
def test_one_dimensional_sparse_in_matmul(case):
    s, ref = case
    k = ref.shape[0]
    m = dense_array((k, 3), seed=6)
    v = dense_array((k,), seed=7)
    same(s @ lm.asarray(m), ref @ m)
    same(lm.asarray(m.T) @ s, m.T @ ref)
    same(s @ lm.asarray(v), ref @ v)  # 0-d
    same(lm.asarray(v) @ s, v @ ref)


def test_spmm_float32_and_parallel_paths_agree_with_blas():
    rng = np.random.default_rng(8)
    m, k, n, nnz = 300, 200, 64, 2400  # nnz * n >= 2**17: the parallel threshold
    idx = np.stack([rng.integers(0, m, nnz), rng.integers(0, k, nnz)])
    vals = rng.standard_normal(nnz).astype(np.float32)
    s = lm.sparse_coo_tensor(idx, vals, (m, k))
    c = s.coalesce()
    dense = s.to_dense().numpy()
    b = rng.standard_normal((k, n)).astype(np.float32)
    left = rng.standard_normal((n, m)).astype(np.float32)
    threads = lm.get_num_threads()
    try:
        for t in {1, min(2, numba.config.NUMBA_NUM_THREADS)}:
            lm.set_num_threads(t)
            for x in (s, c):
                out = x @ lm.asarray(b)
                assert out.dtype == lm.float32
                np.testing.assert_allclose(out.numpy(), dense @ b, rtol=1e-4, atol=1e-4)
                out = lm.asarray(left) @ x
                np.testing.assert_allclose(out.numpy(), left @ dense, rtol=1e-4, atol=1e-4)
    finally:
        lm.set_num_threads(threads)


def test_matmul_errors():
    s = lm.sparse_coo_tensor([[0, 1], [1, 2]], [1.0, 2.0], (2, 3))
    with pytest.raises(ValueError, match=r"shapes \(2, 3\) and \(2, 2\) do not match"):
        s @ lm.ones((2, 2))
    with pytest.raises(ValueError, match="do not match"):
        lm.ones((3, 3)) @ s
    with pytest.raises(ValueError, match="1-D or 2-D dense operand"):
        s @ lm.ones((2, 3, 2))
    with pytest.raises(NotImplementedError, match="sparse @ sparse"):
        s @ s.T


def test_elementwise_shape_errors():
    a = lm.sparse_coo_tensor([[0], [1]], [1.0], (2, 3))
    b = lm.sparse_coo_tensor([[0], [1]], [1.0], (3, 3))
    for fn in (lm.add, lm.subtract, lm.multiply):
        with pytest.raises(ValueError, match="same shape"):
            fn(a, b)
    with pytest.raises(ValueError, match="only the dense operand may broadcast"):
        a + lm.ones((4, 2, 3))
    with pytest.raises(ValueError, match="only the dense operand may broadcast"):
        a * lm.ones((4, 2, 3))
    with pytest.raises(ValueError, match="cannot be broadcast"):
        a + lm.ones((2, 4))


def test_dense_plus_equals_sparse_and_sparse_is_not_updated_in_place():
    s = lm.sparse_coo_tensor([[0, 1, 1], [2, 0, 0]], [1.0, 2.0, 3.0], (2, 3))
    # the dense targets take s's dtype: the subject is the in-place update, not promotion
    x = lm.zeros((2, 3), dtype=s.dtype)
    x += s
    same(x, s.to_dense().numpy())
    x -= s
    same(x, np.zeros((2, 3), s.to_dense().numpy().dtype))
    big = lm.zeros((3, 2), dtype=s.dtype)
    view = big.T  # a strided target
    view += s
    same(big, s.to_dense().numpy().T)
    with pytest.raises(TypeError, match="cannot be stored in place"):
        y = lm.zeros((2, 3), dtype=lm.int64)
        y += s
    with pytest.raises(NotImplementedError, match="not updated in place"):
        s += s


# ---------------------------------------------------------------- the API


def test_accessors_and_repr():
    s = lm.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3, 4, 5], (2, 3))
    assert s.is_sparse and s.nnz == 3 and s.shape == (2, 3) and s.ndim == 2
    assert s.dtype == lm.int64 and s.device == "cpu" and s.size == 6
    assert s.indices().tolist() == [[0, 1, 1], [2, 0, 2]]
    assert s.values().tolist() == [3, 4, 5]
    with pytest.raises(ValueError, match="read-only"):
        s.indices()[0, 0] = 7  # indices are checked once: they must not change after
    s.values()[0] = 9  # values may: a view, as in PyTorch
    assert s.to_dense().tolist() == [[0, 0, 9], [4, 0, 5]]
    assert repr(s) == (
        "tensor(indices=tensor([[0, 1, 1],\n"
        "                       [2, 0, 2]]),\n"
        "       values=tensor([9, 4, 5]),\n"
        "       size=(2, 3), nnz=3, layout=sparse_coo)"
    )
    other = lm.float64 if lm.get_default_dtype() is lm.float32 else lm.float32
    f = lm.sparse_coo_tensor([[1]], [0.5], (3,), dtype=other)
    assert f"dtype={other!r}" in repr(f) and "size=(3,), nnz=1" in repr(f)
    assert "dtype" not in repr(lm.sparse_coo_tensor([[1]], [0.5], (3,)))  # the default
    assert "nnz=0" in repr(lm.sparse_coo_tensor([[], []], [], (2, 2)))
    dense = lm.ones((2,))
    assert not dense.is_sparse
    for call in (dense.indices, dense.values, dense.is_coalesced, lambda: dense.nnz):
        with pytest.raises(TypeError, match="needs a sparse tensor"):
            call()
    with pytest.raises(TypeError, match="expected a sparse tensor"):
        dense.coalesce()
    with pytest.raises(TypeError, match="sparse"):
        s.numpy()
    with pytest.raises(TypeError, match="sparse"):
        np.asarray(s)


def test_construction_infers_shape_and_copies_its_inputs():
    idx = np.array([[0, 3], [1, 1]])
    vals = np.array([1.0, 2.0])
    s = lm.sparse_coo_tensor(idx, vals)
    assert s.shape == (4, 2)
    idx[0, 0], vals[0] = 9, 5.0  # the tensor owns copies
    assert s.indices().tolist() == [[0, 3], [1, 1]] and s.values().tolist() == [1.0, 2.0]
    t = lm.sparse_coo_tensor(lm.asarray([[0, 2]], dtype=lm.int32), lm.asarray([1, 2]), (3,))
    assert t.indices().dtype == lm.int64 and t.to_dense().tolist() == [1, 0, 2]
    assert lm.sparse_coo_tensor([[0]], [1], (2,), dtype=lm.float32).dtype == lm.float32


@pytest.mark.parametrize(
    "indices, values, shape, error, match",
    [
        (
            [[0, 3]],
            [1.0, 2.0],
            (3,),
            IndexError,
            r"index 3 is out of range for dimension 0 "
            r"of size 3 \(entry 1",
        ),
        (
            [[0, 1], [0, 5]],
            [1.0, 2.0],
            (2, 5),
            IndexError,
            "index 5 is out of range for dimension 1",
        ),
        ([[0, -1]], [1.0, 2.0], (3,), IndexError, "negative index -1 in dimension 0"),
        ([[0, 1], [2, -2]], [1.0, 2.0], None, IndexError, "negative index -2 in dimension 1"),
        ([[0, 1]], [1.0, 2.0, 3.0], (3,), ValueError, "indices hold 2 entries .* values holds 3"),
        ([[0, 1]], [1.0], (3,), ValueError, "indices hold 2 entries"),
        ([[0.0, 1.0]], [1.0, 2.0], (3,), ValueError, "indices must be integers"),
        (np.array([[True, False]]), [1.0, 2.0], (3,), ValueError, "indices must be integers"),
        ([0, 1], [1.0, 2.0], (3,), ValueError, r"indices must be 2-D, shape \(ndim, nnz\)"),
        (np.zeros((1, 1, 2), np.int64), [1.0, 2.0], (3,), ValueError, "indices must be 2-D"),
        ([[0, 1]], [[1.0, 2.0]], (3,), ValueError, "values must be 1-D"),
        ([[0, 1]], [1.0, 2.0], (3, 3), ValueError, "indices have 1 rows .* 2 dimensions"),
        ([[0], [0], [0]], [1.0], (2, 2, 2), ValueError, "only 1-D and 2-D"),
        ([[0, 1]], [True, False], (3,), TypeError, "int or float dtype"),
        ([[0, 1]], ["a", "b"], (3,), TypeError, "int or float dtype"),
        ([[0]], [1.0], (-3,), ValueError, "negative size"),
        ([[], []], [], None, ValueError, "give a shape"),
        ([[0]], [1.0], "x", TypeError, "shape must be a tuple of ints"),
    ],
)
def test_bad_input_is_refused_at_construction(indices, values, shape, error, match):
    with pytest.raises(error, match=match):
        lm.sparse_coo_tensor(indices, values, shape)


def test_bad_to_sparse_inputs():
    with pytest.raises(ValueError, match="only 1-D and 2-D"):
        lm.ones((2, 2, 2)).to_sparse()
    with pytest.raises(ValueError, match="only 1-D and 2-D"):
        lm.asarray(1.0).to_sparse()
    with pytest.raises(TypeError, match="int or float values"):
        lm.asarray([True, False]).to_sparse()
    with pytest.raises(TypeError, match="dense tensor, got a sparse one"):
        s = lm.sparse_coo_tensor([[0]], [1], (2,))
        lm.sparse_coo_tensor(s, [1], (2,))


# ---------------------------------------------------------------- the layer


def sparse_row(name):
    return next(r for r in lm.dispatch.dump_table(name) if r[0] == "Sparse")


def test_operators_without_a_sparse_kernel_raise_naming_the_operator():
    s = lm.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,))
    for call, name in (
        (lambda: lm.exp(s), "exp"),
        (lambda: s == s, "equal"),
        (lambda: lm.reshape(s, (3, 1)), "reshape"),
        (lambda: s[0], "getitem"),
        (lambda: lm.max(s), "max"),
        (lambda: s / 2, "divide"),
        (lambda: lm.exp(s) + lm.ones(3), "exp"),
    ):
        with pytest.raises(
            NotImplementedError,
            match=f"'{name}' has no kernel for key Sparse: {name} has no sparse kernel",
        ):
            call()
    assert sparse_row("exp")[1] == "[missing: NotImplementedError]"
    assert sparse_row("add")[1:3] == ("lamina.backends.sparse.add", "sparse")


def test_dense_calls_never_enter_the_layer():
    seen = []

    def spy(shape):
        def kernel(ks, *args, **kwargs):
            seen.append(ks)
            out = lm.backends.new_tensor(np.zeros(shape))
            out.tag = "spy"
            return out

        return kernel

    class Spy:
        @lm.backends.hookimpl
        def lamina_register_kernels(self, registry):
            for name, shape in (("add", (2, 2)), ("sum", ()), ("matmul", (2, 2))):
                registry.register(name, "sparse", spy(shape), priority=100)

    lm.backends.register(Spy(), "sparse_spy")
    try:
        x = lm.ones((2, 2), dtype=lm.float64)  # the spy's results are float64
        x + x, x + 1, 1 + x, lm.sum(x), x @ x
        assert seen == []
        s = x.to_sparse()
        assert [t.tag for t in (s + x, lm.sum(s), x @ s)] == ["spy"] * 3
        assert seen == [CPU | SPARSE] * 3
    finally:
        lm.backends.unregister("sparse_spy")
    for name in ("add", "sum", "matmul", "negative"):  # the slot a dense call indexes
        op = lm.dispatch.get(name)
        assert (CPU & op.mask).bit_length() == 1
        assert op.table[(CPU & op.mask).bit_length()] is op.winners[CPU].fn


def test_with_the_layer_off_a_sparse_input_is_an_error():
    s = lm.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,))
    x = lm.ones(3)
    add = lm.dispatch.get("add")
    dense_slot = add.table[CPU.bit_length()]
    try:
        lm.layers.disable("sparse")
        for call in (
            lambda: s + x,
            lambda: x + s,
            lambda: lm.exp(s),
            lambda: lm.sum(s),
            lambda: s.to_dense(),
            lambda: s @ lm.ones((3, 2)),
        ):
            with pytest.raises(RuntimeError, match="sparse input, but the sparse layer is off"):
                call()
        assert (x + x).tolist() == [2.0] * 3  # dense calls: the same slot as before
        assert add.table[CPU.bit_length()] is dense_slot and add.mask & SPARSE
        assert sparse_row("add")[1] == "[off: RuntimeError]"
    finally:
        lm.layers.enable("sparse")
    assert (s + x).tolist() == [2.0, 3.0, 1.0]


def test_a_sparse_tensor_in_a_dense_kernel_is_an_error_not_garbage():
    # only possible by calling a kernel directly (Note [Sparse storage guard])
    s = lm.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,))
    x = lm.ones(3)
    numpy_ref = {
        name: k.fn
        for (name, key), ks in registry.kernels.items()
        if key == CPU
        for k in ks
        if k.plugin == "numpy_ref"
    }
    for fn, args in (
        (lm.dispatch.get("add").winners[CPU].fn, (s, x)),
        (numpy_ref["add"], (x, s)),
        (numpy_ref["reshape"], (s, (3, 1), None)),
        (lm.dispatch.get("sum").winners[CPU].fn, (s, (0,), None, False)),
        (lm.dispatch.get("matmul").winners[CPU].fn, (s, x)),
    ):
        with pytest.raises(TypeError, match="a sparse tensor reached code for dense tensors"):
            fn(CPU, *args)


def test_plugin_is_listed_and_every_kernel_sits_at_the_sparse_key():
    """The layer's kernels sit at the SPARSE key; at the CPU key it has only the
    conversions of dense tensors (it owns the COO layout)."""
    row = next(r for r in lm.backends.list() if r["name"] == "sparse")
    assert row["source"] == "built-in" and row["devices"] == ["cpu", "sparse"]
    entries = registry.kernels_of("sparse")
    assert {op for op, key, _ in entries if key == CPU} == {
        "to_dense",
        "to_sparse",
        "coalesce",
        "sparse_mask",
    }
    assert {key for _, key, _ in entries} == {CPU, SPARSE}
    assert {op for op, key, _ in entries if key == SPARSE} >= {
        "add",
        "subtract",
        "multiply",
        "negative",
        "abs",
        "sum",
        "matmul",
        "matrix_transpose",
        "permute_dims",
        "to_dense",
        "to_sparse",
        "coalesce",
        "sparse_mask",
    }


def test_gradients_with_respect_to_sparse_values_keep_the_pattern():
    """sum(s) and s @ dense are differentiable with respect to the stored values: the
    gradient is sparse, on s's pattern (duplicates included)."""
    indices = lm.asarray([[0, 1, 1, 1], [2, 0, 2, 2]])
    s = lm.sparse_coo_tensor(indices, lm.asarray([1.0, 2.0, 3.0, 0.5]), (2, 3))
    s.requires_grad_()
    lm.sum(s).backward()
    assert s.grad.is_sparse
    np.testing.assert_array_equal(s.grad.indices().numpy(), indices.numpy())
    np.testing.assert_array_equal(s.grad.values().numpy(), [1.0, 1.0, 1.0, 1.0])
    s.grad = None
    d = lm.asarray(np.arange(6.0).reshape(3, 2), requires_grad=True)
    lm.sum(s @ d).backward()
    rows = np.arange(6.0).reshape(3, 2).sum(axis=1)  # d(sum(s @ d)) / d s[i, j]
    np.testing.assert_allclose(s.grad.values().numpy(), rows[[2, 0, 2, 2]])
    np.testing.assert_allclose(
        d.grad.numpy(), np.repeat(s.to_dense().numpy().sum(axis=0)[:, None], 2, axis=1)
    )


def test_spmm_gradcheck_with_respect_to_the_dense_operand():
    s = lm.sparse_coo_tensor(
        lm.asarray([[0, 1, 2], [1, 0, 2]]), lm.asarray([1.5, -2.0, 0.5]), (3, 3)
    )
    d = lm.asarray(np.random.default_rng(0).standard_normal((3, 2)), requires_grad=True)
    assert lm.autograd.gradcheck(lambda d: s @ d, [d])
