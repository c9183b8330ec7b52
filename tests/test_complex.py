"""Complex dtypes (issue 15) through everything the Array API allows them in, tested
differentially against array-api-strict and NumPy: dtypes, promotion (Python complex
scalars are weak), creation, astype, reductions, matmul and vecdot, linalg, the Tensor
API and DLPack; the refusals where the standard requires a real dtype, with type and
message. The elementwise operators' complex values and special cases (every pair of
signed zeros, infinities, NaN and finite parts) are in test_elementwise.py through the
sample database (tests/opinfo.py); the formulas' complex gradients in test_autograd.py.

Numba compiles complex128 kernels here (complex64 for a few), the dtype the elementwise
tests compile too."""

import math
import pickle
import re

import array_api_strict as xp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lamina as lm

LA = lm.linalg
RNG = np.random.default_rng(0)


def host(t):
    if isinstance(t, tuple):
        return tuple(host(v) for v in t)
    if isinstance(t, (np.ndarray, np.generic)):
        return np.asarray(t)
    return t.numpy() if isinstance(t, lm.Tensor) else np.from_dlpack(t)


def same(got, want, rtol=1e-12):
    """lamina's result equals the reference's in dtype, shape and values."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w, rtol)
        return
    g, w = host(got), np.asarray(host(want))
    assert g.dtype == w.dtype, (g.dtype, w.dtype)
    assert g.shape == w.shape, (g.shape, w.shape)
    np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-12)


def default_complex():
    """lamina's default complex dtype, read at call time (Note [Default dtype]): the
    complex dtype of lm.get_default_dtype()'s precision."""
    return {lm.float32: lm.complex64, lm.float64: lm.complex128}[lm.get_default_dtype()]


def default_complex_np():
    """NumPy's dtype of lamina's default complex dtype."""
    return np.dtype(default_complex().name)


def cdata(shape, seed=0, dtype=np.complex128):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def layouts(data):
    """Contiguous, transposed (of the reversed shape) and stepped views of data."""
    wide = np.zeros(data.shape[:-1] + (2 * data.shape[-1],), data.dtype)
    wide[..., ::2] = data
    return [data, np.ascontiguousarray(data.T).T, wide[..., ::2]]


# ---------------------------------------------------------------- dtypes


def xp_name(dtype):
    return str(dtype).rpartition(".")[2]  # array_api_strict.complex64 -> complex64


DTYPES = ["bool", "int8", "uint8", "int64", "uint64", "float32", "float64"]
COMPLEX = ["complex64", "complex128"]


@pytest.mark.parametrize("a", COMPLEX)
@pytest.mark.parametrize("b", DTYPES + COMPLEX)
def test_promotion_matches_array_api_strict_and_numpy(a, b):
    ours = lm.result_type(getattr(lm, a), getattr(lm, b))
    assert ours.name == str(np.promote_types(a, b))
    if b in COMPLEX or b.startswith("float"):  # the pairs the standard defines
        assert ours == getattr(lm, xp_name(xp.result_type(getattr(xp, a), getattr(xp, b))))
        assert lm.can_cast(getattr(lm, b), ours) and lm.can_cast(ours, ours)
    assert not lm.can_cast(getattr(lm, a), lm.float64)


@pytest.mark.parametrize(
    "dtype, scalar, want",
    [
        ("float32", 1j, "complex64"),
        ("float64", 1j, "complex128"),
        ("complex64", 2.5, "complex64"),
        ("complex64", 3, "complex64"),
        ("complex64", True, "complex64"),
        ("complex64", 1j, "complex64"),
        ("int16", 1j, "default complex"),  # integers with a Python complex: the default
    ],
)
def test_result_type_takes_weak_python_scalars(dtype, scalar, want):
    if want == "default complex":
        want = default_complex().name
    assert lm.result_type(getattr(lm, dtype), scalar).name == want
    assert lm.result_type(lm.ones(2, dtype=getattr(lm, dtype)), scalar, scalar).name == want
    if not dtype.startswith("int") and scalar is not True:  # array-api-strict refuses those
        assert xp_name(xp.result_type(getattr(xp, dtype), scalar)) == want
    with pytest.raises(ValueError, match="at least one tensor or dtype"):
        lm.result_type(1j)


def test_isdtype_finfo_and_namespace_info_know_complex():
    for name in COMPLEX:
        d, ref = getattr(lm, name), getattr(xp, name)
        for kind in ("complex floating", "numeric", "real floating", ("bool", "complex floating")):
            assert lm.isdtype(d, kind) == xp.isdtype(ref, kind), kind
        f, g = lm.finfo(d), xp.finfo(ref)
        assert (f.bits, f.eps, f.max, f.min, f.smallest_normal) == (
            g.bits,
            g.eps,
            g.max,
            g.min,
            g.smallest_normal,
        )
        assert f.dtype is lm.real(lm.ones(1, dtype=d)).dtype  # the real dtype of its parts
    defaults = lm.__array_namespace_info__().default_dtypes()
    assert defaults["complex floating"] is default_complex()
    assert defaults["real floating"] is lm.get_default_dtype()
    with pytest.raises(TypeError, match="iinfo needs an integer dtype, got lamina.complex64"):
        lm.iinfo(lm.complex64)
    assert pickle.loads(pickle.dumps(lm.complex64)) is lm.complex64


# ---------------------------------------------------------------- creation and conversion


def test_creation_of_complex_tensors_matches_array_api_strict():
    # Python complex scalars make lamina's default complex dtype; array-api-strict's
    # default is complex128, so it is told lamina's default explicitly
    dc = getattr(xp, default_complex().name)
    same(lm.asarray([1 + 2j, 3]), xp.asarray([1 + 2j, 3], dtype=dc))
    same(lm.asarray(2j), xp.asarray(2j, dtype=dc))
    same(lm.asarray([1 + 2j, 3], dtype=lm.complex128), xp.asarray([1 + 2j, 3]))
    same(lm.asarray([[1, 2]], dtype=lm.complex64), xp.asarray([[1, 2]], dtype=xp.complex64))
    same(lm.full((2, 2), 1 - 1j), xp.full((2, 2), 1 - 1j, dtype=dc))
    same(lm.full((2, 2), 1 - 1j, dtype=lm.complex128), xp.full((2, 2), 1 - 1j))
    same(lm.full((3,), 2, dtype=lm.complex64), xp.full((3,), 2, dtype=xp.complex64))
    for fn in ("zeros", "ones", "empty"):
        t = getattr(lm, fn)((2, 3), dtype=lm.complex64)
        assert t.dtype == lm.complex64 and t.shape == (2, 3)
    same(lm.zeros_like(lm.asarray([1j])), xp.zeros_like(xp.asarray([1j], dtype=dc)))
    same(lm.eye(3, k=1, dtype=lm.complex128), xp.eye(3, k=1, dtype=xp.complex128))
    same(lm.linspace(0, 1 + 2j, 5), xp.linspace(0, 1 + 2j, 5, dtype=dc))  # exact in both
    same(lm.linspace(0, 1 + 2j, 5, dtype=lm.complex128), xp.linspace(0, 1 + 2j, 5))
    same(
        lm.linspace(1j, 2, 4, endpoint=False, dtype=lm.complex64),
        xp.linspace(1j, 2, 4, endpoint=False, dtype=xp.complex64),
        rtol=1e-6,
    )
    a = np.array([1 + 1j, 2 - 3j], np.complex64)
    t = lm.asarray(a, copy=False)
    t[0] = 5j  # shared
    assert a[0] == 5j and t.dtype == lm.complex64
    same(lm.from_dlpack(a), a)
    same(lm.asarray(np.from_dlpack(lm.asarray(a))), a)


def test_astype_follows_the_standard():
    """complex -> complex and -> bool (0 + 0j is False) are allowed, complex -> real is
    refused: which part would it keep? real -> complex makes x + 0j."""
    z = np.array([0j, 1 + 2j, -0.5j], np.complex128)
    t = lm.asarray(z)
    same(lm.astype(t, lm.complex64), xp.astype(xp.asarray(z), xp.complex64), rtol=1e-7)
    assert lm.astype(t, lm.bool).tolist() == [False, True, True]
    same(lm.astype(lm.asarray([True, False]), lm.complex64), np.array([1, 0], np.complex64))
    same(
        lm.astype(lm.asarray([1.5, 2.0], dtype=lm.float32), lm.complex128),
        np.array([1.5, 2], np.complex128),
    )
    for dtype in (lm.float64, lm.float32, lm.int64, lm.uint8):
        with pytest.raises(TypeError, match=f"astype: casting lamina.complex128 to {dtype}"):
            lm.astype(t, dtype)
        with pytest.raises(TypeError, match="would drop the imaginary parts"):
            lm.asarray(t, dtype=dtype)
        with pytest.raises(xp_type_error()):
            xp.astype(xp.asarray(z), getattr(xp, dtype.name))
    with pytest.raises(TypeError, match="asarray: casting lamina.complex64 to lamina.float64"):
        lm.asarray(np.ones(2, np.complex64), dtype=lm.float64)


def xp_type_error():
    return TypeError


CREATION_ERRORS = [
    (lambda: lm.full(2, 1j, dtype=lm.float64), "full: a complex fill_value needs a complex"),
    (lambda: lm.arange(3, dtype=lm.complex64), "arange: dtype must be real-valued"),
    (lambda: lm.linspace(0, 1j, 3, dtype=lm.float32), "linspace: complex bounds need a complex"),
    (lambda: lm.rand(2, dtype=lm.complex64), "rand: needs a floating dtype"),
    (
        lambda: float(lm.asarray(1j, dtype=lm.complex128)),
        "complex128 tensor does not convert to float",
    ),
    (lambda: int(lm.asarray(1j)), "does not convert to int"),
    (lambda: lm.sparse_coo_tensor([[0]], [1j], (2,)), "values"),
]


@pytest.mark.parametrize("call, message", CREATION_ERRORS, ids=[m[:20] for _, m in CREATION_ERRORS])
def test_creation_and_conversion_errors(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_tensor_api_of_complex_tensors():
    t = lm.asarray([[1 + 2j, 3 - 3j]], dtype=lm.complex64)
    assert complex(t[0, 0]) == 1 + 2j and t[0, 1].item() == 3 - 3j
    assert t.tolist() == [[1 + 2j, 3 - 3j]]
    assert bool(lm.asarray(1j)) and not bool(lm.asarray(0j))
    assert repr(t) == "tensor([[1.+2.j, 3.-3.j]], dtype=lamina.complex64)"
    assert (abs(t)).dtype == lm.float32 and (-t).tolist() == [[-1 - 2j, -3 + 3j]]
    assert (t == 1 + 2j).tolist() == [[True, False]] and (t != 3 - 3j).tolist() == [[True, False]]
    t[0, 1] = 2.5  # a real value into a complex tensor
    assert t.tolist() == [[1 + 2j, 2.5]]
    x = lm.ones(2)
    with pytest.raises(TypeError, match=f"setitem: cannot store {default_complex()} values"):
        x[0] = 1j  # a Python complex is of the default complex dtype
    with pytest.raises(TypeError, match="setitem: cannot store lamina.complex128 values"):
        x[0] = lm.asarray(1j, dtype=lm.complex128)
    with pytest.raises(TypeError, match="less needs real-valued"):
        t < t  # noqa: B015
    with pytest.raises(TypeError, match="floor_divide needs real-valued numeric"):
        t // 2


# ---------------------------------------------------------------- the scalar paths


@pytest.mark.parametrize("dtype", COMPLEX)
def test_python_scalars_with_complex_tensors_on_both_sides(dtype):
    """A real Python scalar takes the C core's scalar loop (as a double, made v + 0j);
    a Python complex the general path: the same values either way, and NumPy's."""
    data = cdata((7,), dtype=dtype)
    t = lm.asarray(data)
    rtol = 1e-6 if dtype == "complex64" else 1e-12
    for s in (2.0, -3, True, 0.5j, complex(1.5, -2.0)):
        for got, want in (
            (t * s, data * s),
            (s * t, s * data),
            (t - s, data - s),
            (s - t, s - data),
            (t / s, data / s),
            (t + s, data + s),
        ):
            same(got, want, rtol)
    f = lm.asarray(np.arange(3, dtype=np.float32))
    same(f * 1j, np.arange(3, dtype=np.float32) * 1j)
    # an integer tensor (or none) with a Python complex gives the default complex dtype
    same(1j + lm.arange(3), (1j + np.arange(3)).astype(default_complex_np()))
    same(lm.where(lm.asarray([True, False]), 1j, 2.0), np.array([1j, 2.0], default_complex_np()))


# ---------------------------------------------------------------- reductions


@pytest.mark.parametrize("layout", range(3))
def test_reductions_match_array_api_strict_and_numpy(layout):
    data = layouts(cdata((3, 4)))[layout]
    t, s = lm.asarray(data), xp.asarray(np.ascontiguousarray(data))
    assert t.is_contiguous() == (layout == 0)
    for axis in (None, 0, 1, (0, 1)):
        for fn in ("sum", "prod", "mean"):
            same(getattr(lm, fn)(t, axis=axis), getattr(xp, fn)(s, axis=axis))
        for keepdims in (False, True):
            same(
                lm.var(t, axis=axis, keepdims=keepdims), np.var(data, axis=axis, keepdims=keepdims)
            )
        same(lm.std(t, axis=axis, correction=1), np.std(data, axis=axis, ddof=1))
        assert lm.any(t, axis=axis).tolist() == np.any(data, axis=axis).tolist()
        assert lm.all(t, axis=axis).tolist() == np.all(data, axis=axis).tolist()
        same(lm.count_nonzero(t, axis=axis), xp.count_nonzero(s, axis=axis))
    for axis in (0, 1):
        same(lm.cumulative_sum(t, axis=axis), xp.cumulative_sum(s, axis=axis))
        same(
            lm.cumulative_prod(t, axis=axis, include_initial=True),
            xp.cumulative_prod(s, axis=axis, include_initial=True),
        )
    with lm.backends.use("numpy_ref"):
        same(lm.var(t, axis=1), np.var(data, axis=1))
        same(lm.mean(t), np.mean(data))
        same(lm.sum(t, axis=0), np.sum(data, axis=0))


def test_reductions_of_complex64_empty_and_0d():
    data = cdata((2, 5), dtype=np.complex64)
    t = lm.asarray(data)
    same(lm.sum(t, axis=1), np.sum(data, axis=1), rtol=1e-6)
    same(lm.mean(t), np.mean(data).astype(np.complex64), rtol=1e-6)
    same(lm.var(t, axis=0), np.var(data, axis=0), rtol=1e-5)
    same(lm.sum(t, dtype=lm.complex128), np.sum(data, dtype=np.complex128))
    empty = lm.zeros((0, 3), dtype=lm.complex128)
    same(lm.sum(empty, axis=0), np.zeros(3, np.complex128))
    same(lm.prod(empty, axis=0), np.ones(3, np.complex128))
    assert lm.sum(lm.asarray(2j)).item() == 2j
    with np.errstate(all="ignore"):
        assert math.isnan(lm.real(lm.mean(empty)).item()) and lm.var(empty).dtype == lm.float64


REFUSED = [
    (lambda z: lm.max(z), "max needs real-valued (not complex) inputs, got lamina.complex128"),
    (lambda z: lm.min(z, axis=0), "min needs real-valued"),
    (lambda z: lm.argmax(z), "argmax needs real-valued"),
    (lambda z: lm.argmin(z), "argmin needs real-valued"),
    (lambda z: lm.sort(z), "sort needs real-valued"),
    (lambda z: lm.argsort(z), "argsort needs real-valued"),
    (lambda z: lm.searchsorted(z[0], z), "searchsorted needs real-valued"),
    (lambda z: lm.clip(z, 0, 1), "clip needs real-valued numeric inputs, got lamina.complex128"),
    (lambda z: lm.clip(lm.ones(2), 1j), "clip: complex bounds have no order"),
    (lambda z: lm.floor(z), "floor needs real-valued numeric inputs, got lamina.complex128"),
    (lambda z: lm.less(z, z), "less needs real-valued (not complex) inputs"),
    (lambda z: lm.maximum(z, 1.0), "maximum needs real-valued numeric"),
    (lambda z: lm.atan2(z, z), "atan2 needs real-valued floating-point"),
    (lambda z: lm.signbit(z), "signbit needs real-valued floating-point"),
    (
        lambda z: lm.imag(lm.ones(2, dtype=lm.float64)),
        "imag needs complex floating-point inputs, got lamina.float64",
    ),
    (lambda z: lm.bitwise_and(z, z), "bitwise_and needs integer or boolean"),
    (lambda z: lm.sum(z, dtype=lm.float64), "sum: a lamina.complex128 tensor cannot be accum"),
    (
        lambda z: lm.cumulative_sum(z, axis=1, dtype=lm.float64),
        "cumulative_sum: a lamina.complex128",
    ),
    (lambda z: lm.fft.rfft(z), "rfft needs real-valued floating-point inputs, got lamina.comp"),
]


@pytest.mark.parametrize("call, message", REFUSED, ids=[m[:24] for _, m in REFUSED])
def test_complex_where_real_is_required_is_a_type_error(call, message):
    z = lm.asarray(cdata((2, 2)))
    with pytest.raises(TypeError, match=re.escape(message)):
        call(z)
    with lm.backends.use("numpy_ref"), pytest.raises(TypeError, match=re.escape(message)):
        call(z)


# ---------------------------------------------------------------- linear algebra


@pytest.mark.parametrize("layout", range(3))
def test_matmul_vecdot_tensordot_match_array_api_strict(layout):
    a = layouts(cdata((3, 4)))[layout]
    b = cdata((4, 2), seed=1)
    ta, tb = lm.asarray(a), lm.asarray(b)
    sa, sb = xp.asarray(np.ascontiguousarray(a)), xp.asarray(b)
    same(ta @ tb, sa @ sb)
    same(lm.tensordot(ta, tb, axes=1), xp.tensordot(sa, sb, axes=1))
    v = cdata((3, 4), seed=2)
    same(lm.vecdot(ta, lm.asarray(v)), xp.vecdot(sa, xp.asarray(v)))  # conj(x1) * x2
    same(lm.vecdot(ta, lm.asarray(v), axis=0), np.vecdot(a, v, axis=0))
    same(lm.vecdot(lm.asarray(v.real), ta), np.vecdot(v.real, a))
    same(ta @ lm.asarray(b.real), a @ b.real)  # mixed kinds promote
    with lm.backends.use("numpy_ref"):
        same(lm.vecdot(ta, lm.asarray(v)), np.vecdot(a, v))
        same(ta @ tb, a @ b)


def _hermitian(n, seed=0):
    a = cdata((n, n), seed)
    return a @ a.conj().T + n * np.eye(n)


LINALG = [
    ("det", {}, cdata((2, 3, 3))),
    ("inv", {}, cdata((3, 3)) + 3 * np.eye(3)),
    ("slogdet", {}, cdata((2, 3, 3))),
    ("cholesky", {}, _hermitian(3)),
    ("cholesky", {"upper": True}, _hermitian(3)),
    ("eigvalsh", {}, _hermitian(4)),
    ("svdvals", {}, cdata((2, 4, 3))),
    ("matrix_norm", {}, cdata((3, 4))),
    ("matrix_norm", {"ord": "nuc"}, cdata((3, 4))),
    ("matrix_norm", {"ord": 1}, cdata((3, 4))),
    ("vector_norm", {"ord": 3, "axis": 1}, cdata((3, 4))),
    ("vector_norm", {"ord": math.inf}, cdata((3, 4))),
    ("matrix_rank", {}, cdata((2, 3, 3))),
    ("pinv", {}, cdata((4, 3))),
    ("trace", {"offset": 1}, cdata((3, 4))),
    ("diagonal", {}, cdata((2, 3, 3))),
    ("matrix_power", {"n": 3}, cdata((3, 3))),
]


@pytest.mark.parametrize("name, kwargs, data", LINALG, ids=[c[0] for c in LINALG])
def test_linalg_of_complex_matrices_matches_array_api_strict(name, kwargs, data):
    kwargs = dict(kwargs)
    args = (kwargs.pop("n"),) if "n" in kwargs else ()
    got = getattr(LA, name)(lm.asarray(data), *args, **kwargs)
    want = getattr(xp.linalg, name)(xp.asarray(data), *args, **kwargs)
    same(
        tuple(got) if isinstance(got, tuple) else got,
        tuple(want) if isinstance(want, tuple) else want,
        1e-10,
    )
    if lm.dispatch.OPERATORS.get(name) is not None:
        with lm.backends.use("numpy_ref"):
            again = getattr(LA, name)(lm.asarray(data), *args, **kwargs)
        same(
            tuple(again) if isinstance(again, tuple) else again,
            tuple(got) if isinstance(got, tuple) else got,
            1e-10,
        )


def test_complex_factorizations_reconstruct_their_input():
    a = cdata((4, 3))
    t = lm.asarray(a)
    q, r = LA.qr(t)
    np.testing.assert_allclose((q @ r).numpy(), a, atol=1e-12)
    u, s, vh = LA.svd(t, full_matrices=False)
    assert s.dtype == lm.float64 and u.dtype == lm.complex128
    np.testing.assert_allclose((u * lm.expand_dims(s, -2) @ vh).numpy(), a, atol=1e-12)
    h = _hermitian(3)
    w, v = LA.eigh(lm.asarray(h))
    assert w.dtype == lm.float64
    vh_ = lm.conj(LA.matrix_transpose(v))
    np.testing.assert_allclose((v * lm.expand_dims(w, -2) @ vh_).numpy(), h, atol=1e-12)
    x = LA.solve(lm.asarray(h), lm.asarray(a[:3]))
    np.testing.assert_allclose(h @ x.numpy(), a[:3], atol=1e-12)
    c = LA.cholesky(lm.asarray(h, dtype=lm.complex64))
    assert c.dtype == lm.complex64
    same(
        LA.outer(lm.asarray(a[0]), lm.asarray(a[1])),
        xp.linalg.outer(xp.asarray(a[0]), xp.asarray(a[1])),
    )
    same(LA.cross(lm.asarray(a[:, :3]), lm.asarray(a[1:, :3][:1])), np.cross(a[:, :3], a[1:2, :3]))


# ---------------------------------------------------------------- manipulation


def test_manipulation_and_indexing_of_complex_tensors():
    data = cdata((3, 4))
    t, s = lm.asarray(data), xp.asarray(data)
    same(lm.concat([t, t], axis=1), xp.concat([s, s], axis=1))
    same(lm.stack([t[0], t[1]]), xp.stack([s[0, ...], s[1, ...]]))
    same(lm.reshape(t, (2, 6)), xp.reshape(s, (2, 6)))
    same(lm.flip(t, axis=0), xp.flip(s, axis=0))
    same(t[1:, ::-2], data[1:, ::-2])
    same(t[lm.asarray([2, 0])], data[[2, 0]])
    same(t[t == t[0, 0]], data[data == data[0, 0]])
    same(lm.where(lm.real(t) > 0, t, lm.conj(t)), np.where(data.real > 0, data, data.conj()))
    same(lm.roll(t, 1, axis=1), xp.roll(s, 1, axis=1))
    same(lm.tril(t), xp.tril(s))
    same(lm.take(t, lm.asarray([1, 1]), axis=1), xp.take(s, xp.asarray([1, 1]), axis=1))
    same(lm.diff(t, axis=0), xp.diff(s, axis=0))
    same(  # sorted; a list with Python complex values is of the default complex dtype
        lm.unique_values(lm.asarray([2, 1j, 1j])),
        np.unique(np.array([2, 1j, 1j], default_complex_np())),
    )
    same(lm.nonzero(lm.asarray([0j, 1j, 0])), xp.nonzero(xp.asarray([0j, 1j, 0])))


# ---------------------------------------------------------------- hypothesis

# moderate parts and the special ones (products of huge parts may round differently
# with and without fused multiply-adds, which NumPy's SIMD loops use on some CPUs)
PARTS = st.one_of(st.floats(-1e3, 1e3), st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan]))


@settings(max_examples=30, deadline=None)
@given(
    hnp.arrays(
        np.complex128,
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
        elements=st.builds(complex, PARTS, PARTS),
    ),
    st.sampled_from(["add", "multiply", "divide", "equal", "exp", "sqrt", "abs", "sign"]),
)
def test_complex_arithmetic_agrees_with_numpy_and_the_oracle(data, name):
    t = lm.asarray(data)
    fn, ref = getattr(lm, name), getattr(np, {"abs": "absolute"}.get(name, name))
    args = (t,) if name in ("exp", "sqrt", "abs", "sign") else (t, t[::-1] if t.ndim else t)
    np_args = [a.numpy() for a in args]
    got = fn(*args)
    with np.errstate(all="ignore"):
        want = ref(*np_args)
    with lm.backends.use("numpy_ref"):
        oracle = fn(*args)
    for other in (want, oracle.numpy()):
        assert got.numpy().dtype == other.dtype
        np.testing.assert_allclose(got.numpy(), other, rtol=1e-12, atol=1e-300, equal_nan=True)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_tanh_and_expm1_keep_the_array_apis_signed_zeros(dtype):
    """The standard's special cases at the four signed zeros: tanh is odd and
    conjugate-symmetric (tanh(±0 ± 0j) = ±0 ± 0j); expm1(±0 + 0j) = +0 + 0j and
    expm1(conj(z)) = conj(expm1(z)). NumPy gives expm1(-0 + 0j) a -0 real part."""
    zeros = [complex(a, b) for a in (0.0, -0.0) for b in (0.0, -0.0)]
    x = lm.asarray(np.array(zeros, dtype=dtype))
    signs = lambda z: (np.signbit(z.real).tolist(), np.signbit(z.imag).tolist())
    assert signs(lm.tanh(x).numpy()) == ([False, False, True, True], [False, True, False, True])
    assert signs(lm.expm1(x).numpy()) == ([False] * 4, [False, True, False, True])
    assert (lm.tanh(x).numpy() == 0).all() and (lm.expm1(x).numpy() == 0).all()
