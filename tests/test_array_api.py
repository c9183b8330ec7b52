"""The Array API functions of issue 15 (2024.12 top level, lamina.linalg), tested
differentially against array-api-strict (the standard's strict reference) and NumPy:
over dtypes, shapes, 0-d, empty and non-contiguous inputs, with hypothesis for the
sorts, scans and set functions; gradients of the composite functions by gradcheck
(the operators' formulas are sampled in test_autograd.py); bad input with the
exception type and message.

Numba compiles only the scans and two elementwise operators here (float64 and int64
mostly, the dtypes the rest of the suite compiles), so the module stays cheap cold.
"""

import math

import array_api_strict as xp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lamina as lm
from lamina.autograd import gradcheck

LA = lm.linalg
RNG = np.random.default_rng(0)


def host(t):
    """A lamina or array-api-strict array (or a tuple of them) as NumPy."""
    if isinstance(t, tuple):
        return tuple(host(v) for v in t)
    return np.from_dlpack(t) if not isinstance(t, lm.Tensor) else t.numpy()


def same(got, want, exact=True):
    """lamina's result equals the reference's: values (NaN where NaN), dtype, shape."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w, exact)
        return
    g, w = host(got), host(want)
    assert g.shape == w.shape, (g.shape, w.shape)
    assert g.dtype == w.dtype, (g.dtype, w.dtype)
    if exact:
        np.testing.assert_array_equal(g, w)
    else:
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def both(data):
    """(lamina tensor, array-api-strict array) of the same NumPy data."""
    return lm.asarray(data), xp.asarray(data)


def inputs(dtype=np.float64, shape=(3, 4)):
    """Contiguous, transposed and stepped inputs of ``shape`` (transposed: the
    transposed view of the reversed shape), with a NaN and repeated values."""
    base = RNG.integers(-3, 4, size=shape).astype(dtype)
    if dtype == np.float64 and base.size > 2:
        base.reshape(-1)[1] = np.nan
    transposed = np.ascontiguousarray(base.T).T
    wide = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
    wide[..., ::2] = base
    return [base, transposed, wide[..., ::2]]


def lamina_view(data):
    """A lamina tensor with data's strides (asarray keeps a NumPy view's layout)."""
    t = lm.asarray(data)
    assert t.is_contiguous() == data.flags.c_contiguous
    return t


# ---------------------------------------------------------------- inspection


def test_namespace_info_lists_every_device_and_the_default_dtypes_pytorchs():
    info = lm.__array_namespace_info__()
    assert info.default_device() == "cpu"
    assert [str(d) for d in info.devices()][:1] == ["cpu"]
    assert "counting" in [str(d) for d in info.devices()]  # the example plugin's device
    # the default floating dtype is lm.get_default_dtype() (float32 unless set, as
    # PyTorch's) and the default complex dtype is of its precision
    complex_of = {lm.float32: lm.complex64, lm.float64: lm.complex128}
    assert info.default_dtypes() == {
        "real floating": lm.get_default_dtype(),
        "complex floating": complex_of[lm.get_default_dtype()],
        "integral": lm.int64,
        "indexing": lm.int64,
    }
    assert info.dtypes(kind="complex floating") == {
        "complex64": lm.complex64,
        "complex128": lm.complex128,
    }
    assert list(info.dtypes(kind="signed integer")) == ["int8", "int16", "int32", "int64"]
    assert info.dtypes(kind=("bool", "real floating")) == {
        "bool": lm.bool,
        "float32": lm.float32,
        "float64": lm.float64,
    }
    assert info.capabilities()["boolean indexing"] is True
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        info.dtypes(device="tpu")


# ---------------------------------------------------------------- sorting and sets


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("layout", range(3))
def test_sort_and_argsort_match_array_api_strict(descending, axis, layout):
    data = inputs(np.int64)[layout]
    t, s = lamina_view(data), xp.asarray(np.ascontiguousarray(data))
    same(lm.sort(t, axis=axis, descending=descending), xp.sort(s, axis=axis, descending=descending))
    same(
        lm.argsort(t, axis=axis, descending=descending),
        xp.argsort(s, axis=axis, descending=descending),
    )


def test_sort_places_nans_last_and_first_when_descending():
    x = lm.asarray([2.0, np.nan, -1.0, 2.0])
    assert np.array_equal(lm.sort(x).numpy(), [-1.0, 2.0, 2.0, np.nan], equal_nan=True)
    assert np.array_equal(
        lm.sort(x, descending=True).numpy(), [np.nan, 2.0, 2.0, -1.0], equal_nan=True
    )
    assert lm.argsort(x, descending=True).tolist() == [1, 0, 3, 2]  # ties keep their order


@settings(max_examples=25, deadline=None)
@given(
    hnp.arrays(
        st.sampled_from([np.int64, np.float64, np.bool_]),
        hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5),
    ),
    st.booleans(),
)
def test_sorts_agree_with_the_oracle_and_numpy(data, descending):
    t = lm.asarray(data)
    got, order = lm.sort(t, descending=descending), lm.argsort(t, descending=descending)
    with lm.backends.use("numpy_ref"):
        same(got, lm.sort(t, descending=descending))
        same(order, lm.argsort(t, descending=descending))
    if not descending:
        np.testing.assert_array_equal(order.numpy(), np.argsort(data, axis=-1, kind="stable"))


@settings(max_examples=25, deadline=None)
@given(
    hnp.arrays(
        st.sampled_from([np.int64, np.float64]),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
        elements=st.integers(-3, 3),
    )
)
def test_unique_functions_match_array_api_strict(data):
    t, s = both(data)
    same(lm.unique_values(t), xp.unique_values(s))
    same(tuple(lm.unique_counts(t)), tuple(xp.unique_counts(s)))
    same(tuple(lm.unique_inverse(t)), tuple(xp.unique_inverse(s)))
    same(tuple(lm.unique_all(t)), tuple(xp.unique_all(s)))
    with lm.backends.use("numpy_ref"):
        same(tuple(lm.unique_all(t)), tuple(xp.unique_all(s)))


def test_unique_treats_every_nan_as_distinct_and_names_its_fields():
    r = lm.unique_all(lm.asarray([np.nan, 1.0, np.nan, 1.0]))
    assert r.values.shape == (3,) and r.counts.tolist() == [2, 1, 1]
    assert r.inverse_indices.tolist() == [1, 0, 2, 0] and r.indices.tolist() == [1, 0, 2]


@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted_matches_array_api_strict(side):
    x1 = np.array([3.0, 1.0, 2.0, 2.0, 5.0])
    sorter = np.argsort(x1, kind="stable")
    x2 = np.array([[2.0, 0.0], [5.0, 9.0]])
    t1, s1 = both(x1)
    t2, s2 = both(x2)
    same(
        lm.searchsorted(t1, t2, side=side, sorter=lm.asarray(sorter)),
        xp.searchsorted(s1, s2, side=side, sorter=xp.asarray(sorter)),
    )
    sorted_t = lm.sort(t1)
    assert lm.searchsorted(sorted_t, 2.0, side=side).item() == (1 if side == "left" else 3)
    with lm.backends.use("numpy_ref"):
        same(
            lm.searchsorted(t1, t2, side=side, sorter=lm.asarray(sorter)),
            xp.asarray(np.searchsorted(x1, x2, side=side, sorter=sorter)),
        )


def test_nonzero_matches_array_api_strict():
    for data in inputs(np.int64, (3, 4)) + [np.zeros((0, 2)), np.array([True, False, True])]:
        t = lamina_view(data)
        same(lm.nonzero(t), xp.nonzero(xp.asarray(np.ascontiguousarray(data))))
    with pytest.raises(ValueError, match="nonzero: needs at least 1 dimension"):
        lm.nonzero(lm.asarray(1))


# ---------------------------------------------------------------- scans


@pytest.mark.parametrize("fn", ["cumulative_sum", "cumulative_prod"])
@pytest.mark.parametrize("layout", range(3))
@pytest.mark.parametrize("include_initial", [False, True])
def test_scans_match_array_api_strict(fn, layout, include_initial):
    for dtype in (np.float64, np.int64):
        data = inputs(dtype)[layout]
        t, s = lamina_view(data), xp.asarray(np.ascontiguousarray(data))
        for axis in (0, 1, -1):
            got = getattr(lm, fn)(t, axis=axis, include_initial=include_initial)
            want = getattr(xp, fn)(s, axis=axis, include_initial=include_initial)
            same(got, want, exact=dtype != np.float64)
            with lm.backends.use("numpy_ref"):
                same(getattr(lm, fn)(t, axis=axis, include_initial=include_initial), want, False)


def test_scans_of_small_ints_accumulate_in_int64_and_take_a_dtype():
    x = lm.asarray([100, 100, 100], dtype=lm.int8)
    assert lm.cumulative_sum(x).dtype == lm.int64
    assert lm.cumulative_sum(x).tolist() == [100, 200, 300]
    assert lm.cumulative_sum(x, dtype=lm.float64).tolist() == [100.0, 200.0, 300.0]
    assert lm.cumulative_prod(lm.asarray([True, True])).dtype == lm.int64
    assert lm.cumulative_sum(lm.zeros((0,)), include_initial=True).tolist() == [0.0]


def test_scans_need_an_axis_above_1d():
    with pytest.raises(ValueError, match="cumulative_prod: axis is required for a 2-D"):
        lm.cumulative_prod(lm.ones((2, 2)))
    with pytest.raises(lm.AxisError, match="axis 2 is out of bounds"):
        lm.cumulative_sum(lm.ones((2, 2)), axis=2)


# ---------------------------------------------------------------- composites


CASES = [
    ("tril", lambda m: m.tril, {"k": 0}, (3, 4)),
    ("tril", lambda m: m.tril, {"k": -1}, (2, 3, 4)),
    ("triu", lambda m: m.triu, {"k": 1}, (4, 3)),
    ("roll", lambda m: m.roll, {"shift": 2}, (3, 4)),
    ("roll", lambda m: m.roll, {"shift": (1, -5), "axis": (0, 1)}, (3, 4)),
    ("roll", lambda m: m.roll, {"shift": 1, "axis": -1}, (0, 4)),
    ("tile", lambda m: lambda x: m.tile(x, (2, 1, 3)), {}, (3, 4)),
    ("tile", lambda m: lambda x: m.tile(x, (2,)), {}, (2, 3)),
    ("repeat", lambda m: lambda x: m.repeat(x, 2), {}, (3, 4)),
    ("repeat", lambda m: lambda x: m.repeat(x, 3, axis=1), {}, (2, 3)),
    ("moveaxis", lambda m: lambda x: m.moveaxis(x, 0, -1), {}, (2, 3, 4)),
    ("moveaxis", lambda m: lambda x: m.moveaxis(x, (0, 2), (2, 0)), {}, (2, 3, 4)),
    ("diff", lambda m: m.diff, {}, (3, 4)),
    ("diff", lambda m: m.diff, {"axis": 0, "n": 2}, (4, 3)),
    ("count_nonzero", lambda m: m.count_nonzero, {}, (3, 4)),
    ("count_nonzero", lambda m: m.count_nonzero, {"axis": 1, "keepdims": True}, (3, 4)),
]


@pytest.mark.parametrize("name, fn, kwargs, shape", CASES, ids=[c[0] for c in CASES])
def test_composites_match_array_api_strict(name, fn, kwargs, shape):
    for dtype in (np.float64, np.int64):
        for data in inputs(dtype, shape) if math.prod(shape) else [np.zeros(shape, dtype)]:
            got = fn(lm)(lamina_view(data), **kwargs)
            want = fn(xp)(xp.asarray(np.ascontiguousarray(data)), **kwargs)
            same(got, want)


def test_repeat_with_a_tensor_of_counts_and_take():
    data = np.arange(6.0).reshape(2, 3)
    t, s = both(data)
    counts = np.array([0, 2, 1])
    same(lm.repeat(t, lm.asarray(counts), axis=1), xp.repeat(s, xp.asarray(counts), axis=1))
    index = np.array([2, 0, 0])
    same(lm.take(t, lm.asarray(index), axis=1), xp.take(s, xp.asarray(index), axis=1))
    same(lm.take(lm.asarray([5, 6, 7]), lm.asarray([-1, 0])), xp.asarray([7, 5]))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_take_along_axis_matches_array_api_strict(axis):
    data = inputs(np.float64)[1]
    t, s = lamina_view(data), xp.asarray(np.ascontiguousarray(data))
    order = lm.argsort(t, axis=axis)
    same(
        lm.take_along_axis(t, order, axis=axis),
        xp.take_along_axis(s, xp.argsort(s, axis=axis), axis=axis),
    )
    single = lm.asarray(np.zeros((1, 1), np.int64) - 1)  # broadcast, negative
    assert lm.take_along_axis(t, single, axis=axis).shape == tuple(
        1 if d == axis % 2 else n for d, n in enumerate(data.shape)
    )


@pytest.mark.parametrize("indexing", ["xy", "ij"])
def test_meshgrid_matches_array_api_strict(indexing):
    arrays = [np.arange(3.0), np.arange(4.0) * 2, np.arange(2.0)]
    got = lm.meshgrid(*[lm.asarray(a) for a in arrays], indexing=indexing)
    want = xp.meshgrid(*[xp.asarray(a) for a in arrays], indexing=indexing)
    same(tuple(got), tuple(want))
    assert lm.meshgrid() == []


def test_diff_of_bool_prepend_and_append():
    t = lm.asarray([True, True, False])
    assert lm.diff(t).tolist() == [False, True]
    x, s = both(np.array([[1.0, 4.0], [2.0, 8.0]]))
    p, sp = both(np.array([[0.0], [1.0]]))
    same(lm.diff(x, prepend=p, append=p), xp.diff(s, prepend=sp, append=sp))


def test_reciprocal_and_nextafter_match_numpy_in_float32():
    data = np.array([0.5, -3.0, 0.0, np.inf], np.float32)
    t = lm.asarray(data)
    with np.errstate(divide="ignore"):
        same(lm.reciprocal(t), np.reciprocal(data))
    same(lm.nextafter(t, lm.asarray(np.full(4, 10, np.float32))), np.nextafter(data, 10))
    df = lm.get_default_dtype()  # Python floats and promoted ints: the default float
    one, two = np.array([1.0], df), df.np.type(2.0)
    same(lm.nextafter(lm.asarray([1.0]), 2.0), np.nextafter(one, two))
    same(lm.reciprocal(lm.asarray([2, 4])), np.array([0.5, 0.25], df))  # ints: default float


def test_where_and_clip_take_python_scalars_and_broadcast_bounds():
    x = lm.asarray([[1.0, 5.0], [-2.0, 3.0]])
    df = lm.get_default_dtype()  # x's dtype; Python float scalars keep it
    assert x.dtype == df
    same(lm.where(x > 2, 1.0, 0.0), np.where(x.numpy() > 2, df.np.type(1.0), df.np.type(0.0)))
    same(
        lm.clip(x, lm.asarray([0.0, 4.0]), 4.5),
        np.clip(x.numpy(), np.array([0.0, 4.0], df), df.np.type(4.5)),
    )


CLIP_BROADCASTS = [  # (x, min, max): the result has the broadcast shape, x's dtype
    ("0d_x_1d_min", np.float64(1.5), np.array([0.0, 1.0, 2.0]), 3.0),
    ("0d_x_1d_max", np.float32(1.5), None, np.array([0.0, 1.0, 2.0], np.float32)),
    ("0d_x_1d_both", np.int16(5), np.array([1, 6, 2], np.int16), np.array([[7], [9]], np.int16)),
    (
        "col_x_row_bounds",
        np.arange(3.0).reshape(3, 1),
        np.array([[0.5, 1.0, 1.5, 2.5]]),
        np.array([[1.0, 2.0, 2.0, 9.0]]),
    ),
    (
        "col_x_row_min_none",
        np.arange(-1, 2, dtype=np.int8).reshape(3, 1),
        np.array([[0, 1, -2, 3]], np.int8),
        None,
    ),
    ("col_x_none_row_max", np.arange(3.0).reshape(3, 1), None, np.array([[0.5, 1.0, 1.5, 2.5]])),
    ("col_x_scalar_and_row", np.arange(3.0).reshape(3, 1), 0.5, np.array([[0.5, 1.0, 1.5, 2.5]])),
    ("scalars", np.arange(-2.0, 3.0).reshape(5, 1), -1.0, 1.5),
    ("int_scalars", np.arange(-3, 4, dtype=np.int32), -1, 2),
    ("none_none", np.arange(3.0).reshape(3, 1), None, None),
    ("0d_none_none", np.float64(2.5), None, None),
]


@pytest.mark.parametrize("backend", ["numba_cpu", "numpy_ref"])
@pytest.mark.parametrize("name, x, lo, hi", CLIP_BROADCASTS, ids=[c[0] for c in CLIP_BROADCASTS])
def test_clip_broadcasts_bounds_like_array_api_strict(backend, name, x, lo, hi):
    """clip's result has the broadcast shape of x, min and max -- larger than x's when
    a bound is -- and x's dtype, as array-api-strict (conformance-suite bug: bounds
    broadcasting past x's shape were refused)."""

    def arg(b, mod):
        return mod.asarray(b) if isinstance(b, np.ndarray) else b

    want = xp.clip(xp.asarray(x), arg(lo, xp), arg(hi, xp))
    with lm.backends.use(backend):
        got = lm.clip(lm.asarray(x), arg(lo, lm), arg(hi, lm))
    same(got, want)


def test_clip_example_from_the_conformance_suite():
    got = lm.clip(lm.asarray(1.5), lm.asarray([0.0, 1.0, 2.0]), 3.0)
    assert got.shape == (3,) and got.dtype == lm.get_default_dtype()
    assert got.tolist() == [1.5, 1.5, 2.0]


CLIP_GRADS = [  # float64, values kept 0.05 or more from each bound (no kink in reach)
    (
        "0d_x_1d_bounds",
        np.array(0.4),
        np.array([0.0, 0.5, 1.0, 0.2]),
        np.array([0.9, 0.8, 1.5, 0.3]),
    ),
    (
        "col_x_row_bounds",
        np.array([[-0.8], [0.1], [0.9]]),
        np.array([[-0.5, 0.3, -1.0, 0.2]]),
        np.array([[0.6, 0.7, 0.0, 0.15]]),  # last column: max < min, max wins
    ),
    (
        "row_x_col_bounds",
        np.array([-0.8, 0.1, 0.9]),
        np.array([[-0.5], [0.3]]),
        np.array([[0.6], [0.7]]),
    ),
]


@pytest.mark.parametrize("name, x, lo, hi", CLIP_GRADS, ids=[c[0] for c in CLIP_GRADS])
def test_clip_gradients_when_bounds_broadcast_past_x(name, x, lo, hi):
    """The gradients of x and of tensor bounds are summed back to each one's shape."""
    t, tlo, thi = (lm.asarray(a, requires_grad=True) for a in (x, lo, hi))
    assert gradcheck(lm.clip, [t, tlo, thi])
    assert gradcheck(lambda a, b: lm.clip(a, b, None) * 2.0, [t, tlo])
    assert gradcheck(lambda a, b: lm.clip(a, None, b), [t, thi])
    assert gradcheck(lambda a: lm.clip(a, lm.asarray(lo), 0.95), [t])
    out = lm.clip(t, tlo, thi)
    lm.sum(out).backward()
    assert (t.grad.shape, tlo.grad.shape, thi.grad.shape) == (x.shape, lo.shape, hi.shape)
    # each output element's gradient goes to exactly one of x, min and max
    total = t.grad.numpy().sum() + tlo.grad.numpy().sum() + thi.grad.numpy().sum()
    assert total == out.size


GRADS = [
    ("tril", lambda x: lm.tril(x, k=-1)),
    ("triu", lambda x: lm.triu(x) * 2.0),
    ("roll", lambda x: lm.roll(x, (1, 2), axis=(0, 1))),
    ("tile", lambda x: lm.tile(x, (2, 2))),
    ("repeat", lambda x: lm.repeat(x, lm.asarray([2, 0, 1, 1]), axis=1)),
    ("take", lambda x: lm.take(x, lm.asarray([2, 2, 0]), axis=1)),
    ("take_along_axis", lambda x: lm.take_along_axis(x, lm.argsort(x, axis=0), axis=0)),
    ("diff", lambda x: lm.diff(x, n=2)),
    ("moveaxis", lambda x: lm.moveaxis(x, 0, 1) * lm.asarray([1.0, 2.0])),
    ("meshgrid", lambda x: lm.meshgrid(x[0], x[1])[0] * lm.meshgrid(x[0], x[1])[1]),
    ("cross", lambda x: LA.cross(x[:, :3], x[:, 1:])),
    ("outer", lambda x: LA.outer(x[0], x[1])),
    ("trace", lambda x: LA.trace(x, offset=-1)),
    ("matrix_power", lambda x: LA.matrix_power(x[:, :2] + lm.eye(2), -3)),
    ("pinv", lambda x: LA.pinv(x)),
    ("matrix_norm_fro", lambda x: LA.matrix_norm(x)),
    ("matrix_norm_nuc", lambda x: LA.matrix_norm(x, ord="nuc")),
    ("matrix_norm_2", lambda x: LA.matrix_norm(x, ord=2, keepdims=True)),
    ("matrix_norm_inf", lambda x: LA.matrix_norm(x, ord=float("inf"))),
    ("matrix_norm_1", lambda x: LA.matrix_norm(x, ord=-1)),
]


@pytest.mark.parametrize("name, fn", GRADS, ids=[g[0] for g in GRADS])
def test_composites_are_differentiable(name, fn):
    data = np.array([[0.9, -0.4, 0.3, 1.2], [0.2, 1.1, -0.7, 0.5]])
    x = lm.asarray(data, requires_grad=True)
    assert gradcheck(fn, [x])


def test_vector_norm_of_a_zero_vector_has_a_zero_gradient():
    x = lm.zeros((3,), requires_grad=True)
    LA.vector_norm(x).backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0]


# ---------------------------------------------------------------- lamina.linalg


def _matrices(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape) + 3 * np.eye(shape[-2], shape[-1])


def _spd(shape):
    a = _matrices(shape)
    return a @ np.swapaxes(a, -1, -2) + np.eye(shape[-1])


LINALG = [
    ("det", {}, _matrices((2, 3, 3))),
    ("inv", {}, _matrices((3, 3))),
    ("slogdet", {}, _matrices((2, 3, 3))),
    ("cholesky", {}, _spd((2, 3, 3))),
    ("cholesky", {"upper": True}, _spd((3, 3))),
    ("eigvalsh", {}, _spd((3, 3))),
    ("svdvals", {}, _matrices((2, 4, 3))),
    ("diagonal", {"offset": 1}, _matrices((2, 3, 4))),
    ("trace", {"offset": -1}, _matrices((2, 3, 4))),
    ("matrix_norm", {}, _matrices((2, 3, 4))),
    ("matrix_norm", {"ord": "nuc", "keepdims": True}, _matrices((3, 4))),
    ("matrix_norm", {"ord": -2}, _matrices((3, 4))),
    ("matrix_norm", {"ord": 1}, _matrices((3, 4))),
    ("matrix_norm", {"ord": -math.inf}, _matrices((3, 4))),
    ("vector_norm", {}, _matrices((3, 4))),
    ("vector_norm", {"axis": (0, 1), "ord": 3, "keepdims": True}, _matrices((2, 3, 4))),
    ("vector_norm", {"axis": 0, "ord": 0}, _matrices((3, 4))),
    ("vector_norm", {"axis": 1, "ord": -math.inf}, _matrices((3, 4))),
    ("matrix_rank", {}, np.array([[1.0, 2.0], [2.0, 4.0]])),
    ("matrix_rank", {"rtol": 0.5}, _matrices((2, 3, 3))),
    ("pinv", {}, _matrices((4, 3))),
    ("matrix_transpose", {}, _matrices((2, 3, 4))),
]


@pytest.mark.parametrize("name, kwargs, data", LINALG, ids=[c[0] for c in LINALG])
def test_linalg_matches_array_api_strict(name, kwargs, data):
    for values in (data, np.swapaxes(np.ascontiguousarray(np.swapaxes(data, -1, -2)), -1, -2)):
        got = getattr(LA, name)(lm.asarray(values), **kwargs)
        want = getattr(xp.linalg, name)(xp.asarray(np.ascontiguousarray(values)), **kwargs)
        same(
            tuple(got) if isinstance(got, tuple) else got,
            tuple(want) if isinstance(want, tuple) else want,
            exact=False,
        )
        if name in lm.dispatch.OPERATORS and lm.dispatch.OPERATORS[name].namespace == "linalg":
            with lm.backends.use("numpy_ref"):
                again = getattr(LA, name)(lm.asarray(values), **kwargs)
            same(again, got, exact=False)


def test_factorizations_reconstruct_their_input():
    a = _matrices((2, 4, 3))
    t = lm.asarray(a)
    q, r = LA.qr(t)
    np.testing.assert_allclose((q @ r).numpy(), a, atol=1e-12)
    assert LA.qr(t, mode="complete").Q.shape == (2, 4, 4)
    u, s, vh = LA.svd(t, full_matrices=False)
    np.testing.assert_allclose((u * lm.expand_dims(s, -2) @ vh).numpy(), a, atol=1e-12)
    assert LA.svd(t).U.shape == (2, 4, 4)
    w, v = LA.eigh(lm.asarray(_spd((3, 3))))
    np.testing.assert_allclose((v * lm.expand_dims(w, -2) @ v.mT).numpy(), _spd((3, 3)), atol=1e-12)
    sq = lm.asarray(_matrices((3, 3)))
    np.testing.assert_allclose((LA.inv(sq) @ sq).numpy(), np.eye(3), atol=1e-12)
    np.testing.assert_allclose(
        LA.matrix_power(sq, 3).numpy(), np.linalg.matrix_power(sq.numpy(), 3)
    )
    assert LA.matrix_power(sq, 0).tolist() == np.eye(3).tolist()


def test_solve_broadcasts_and_takes_a_vector():
    a = _matrices((2, 3, 3))
    b = np.arange(3.0)
    same(
        LA.solve(lm.asarray(a), lm.asarray(b)),
        xp.linalg.solve(xp.asarray(a), xp.asarray(b)),
        exact=False,
    )
    bm = np.arange(6.0).reshape(3, 2)
    same(
        LA.solve(lm.asarray(a), lm.asarray(bm)),
        xp.linalg.solve(xp.asarray(a), xp.asarray(bm)),
        exact=False,
    )
    with lm.backends.use("numpy_ref"):
        same(LA.solve(lm.asarray(a), lm.asarray(b)), np.linalg.solve(a, b), exact=False)


def test_cross_outer_vecdot_tensordot_match_array_api_strict():
    a, b = RNG.standard_normal((2, 3)), RNG.standard_normal((4, 1, 3))
    same(
        LA.cross(lm.asarray(a), lm.asarray(b)),
        xp.linalg.cross(xp.asarray(a), xp.asarray(b)),
        exact=False,
    )
    c, d = RNG.standard_normal((3, 2)), RNG.standard_normal((3, 1))
    same(
        LA.cross(lm.asarray(c), lm.asarray(d), axis=-2),
        xp.linalg.cross(xp.asarray(c), xp.asarray(np.broadcast_to(d, (3, 2)).copy()), axis=-2),
        exact=False,
    )
    same(LA.outer(lm.arange(3), lm.arange(2)), xp.linalg.outer(xp.arange(3), xp.arange(2)))
    for name in ("matmul", "vecdot", "tensordot", "matrix_transpose"):  # shared with the top
        assert getattr(LA, name).__signature__ == getattr(lm, name).__signature__
    same(LA.vecdot(lm.asarray(a), lm.asarray(b)), lm.vecdot(lm.asarray(a), lm.asarray(b)))


def test_float32_stays_float32_and_ints_become_the_default_float():
    a = lm.asarray(_matrices((3, 3)), dtype=lm.float32)
    assert LA.inv(a).dtype == lm.float32 and LA.svd(a).S.dtype == lm.float32
    assert LA.det(lm.asarray([[2, 0], [0, 3]])).dtype == lm.get_default_dtype()
    assert LA.det(lm.asarray([[2, 0], [0, 3]])).item() == pytest.approx(6.0)


# ---------------------------------------------------------------- bad input


BAD = [
    (lambda: LA.inv(lm.zeros((2, 2))), LA.LinAlgError, "linalg.inv: Singular matrix"),
    (lambda: LA.solve(lm.zeros((2, 2)), lm.ones(2)), LA.LinAlgError, "linalg.solve: Singular"),
    (
        lambda: LA.cholesky(-lm.eye(2)),
        LA.LinAlgError,
        "linalg.cholesky: Matrix is not positive definite",
    ),
    (lambda: LA.det(lm.ones((2, 3))), ValueError, r"det: needs a \(stack of\) square matrices"),
    (lambda: LA.eigh(lm.ones(3)), ValueError, r"eigh: needs a \(stack of\) square"),
    (lambda: LA.solve(lm.eye(2), lm.ones(3)), ValueError, r"solve: x2 of shape \(3,\) does not"),
    (lambda: LA.qr(lm.eye(2), mode="full"), ValueError, "qr: mode must be 'reduced' or"),
    (lambda: LA.svd(lm.ones(3)), ValueError, "svd: needs at least 2 dimensions"),
    (lambda: LA.matrix_norm(lm.eye(2), ord=3), ValueError, "matrix_norm: ord must be one of"),
    (lambda: LA.vector_norm(lm.eye(2), ord="fro"), TypeError, "vector_norm: ord must be a"),
    (lambda: LA.cross(lm.ones(3), lm.ones(3), axis=0), ValueError, "cross: axis must be neg"),
    (lambda: LA.cross(lm.ones(2), lm.ones(2)), ValueError, "axis -1 must have size 3"),
    (lambda: LA.outer(lm.eye(2), lm.ones(2)), ValueError, r"outer: x1 must be 1-D"),
    (lambda: LA.matrix_power(lm.ones((2, 3)), 2), ValueError, "matrix_power: needs square"),
    (lambda: LA.diagonal(lm.ones(3)), ValueError, "diagonal: needs at least 2 dimensions"),
    (lambda: lm.sort(lm.ones((2, 2)), axis=2), lm.AxisError, "sort: axis 2 is out of bounds"),
    (lambda: lm.take(lm.ones(3), lm.asarray([3])), IndexError, "take: index 3 is out of bounds"),
    (lambda: lm.take(lm.ones((2, 2)), lm.asarray([0])), ValueError, "take: axis is required"),
    (lambda: lm.take(lm.ones(3), lm.asarray([0.5])), TypeError, "take: indices must be a 1-D"),
    (
        lambda: lm.take_along_axis(lm.ones((2, 2)), lm.asarray([[2]]), axis=0),
        IndexError,
        "take_along_axis: index 2 is out of bounds for axis 0",
    ),
    (
        lambda: lm.take_along_axis(lm.ones((2, 2)), lm.asarray([1]), axis=0),
        ValueError,
        "must have x's 2 dimensions",
    ),
    (lambda: lm.repeat(lm.ones(3), -1), ValueError, "repeat: repeats must be non-negative"),
    (lambda: lm.repeat(lm.ones(3), lm.asarray([1, 2])), ValueError, "size 1 or 3"),
    (lambda: lm.roll(lm.ones((2, 2)), (1, 2), axis=0), ValueError, "roll: shift"),
    (lambda: lm.tile(lm.ones(2), (-1,)), ValueError, "tile: repetitions must be non-negative"),
    (lambda: lm.moveaxis(lm.ones((2, 2)), (0, 0), (0, 1)), ValueError, "repeated axis"),
    (lambda: lm.tril(lm.ones(3)), ValueError, "tril: needs at least 2 dimensions"),
    (lambda: lm.meshgrid(lm.ones((2, 2))), ValueError, r"meshgrid: arrays\[0\] must be 1-D"),
    (lambda: lm.meshgrid(lm.ones(2), indexing="yx"), ValueError, "indexing must be 'xy'"),
    (lambda: lm.diff(lm.ones(3), n=-1), ValueError, "diff: n must be non-negative"),
    (
        lambda: lm.searchsorted(lm.ones((2, 2)), 1.0),
        ValueError,
        r"searchsorted: x1 must be 1-D",
    ),
    (lambda: lm.searchsorted(lm.ones(2), 1.0, side="middle"), ValueError, "side must be 'left'"),
    (lambda: lm.expand_dims(lm.ones(2)), TypeError, "axis"),
]


@pytest.mark.parametrize("call, error, message", BAD, ids=[b[2][:30] for b in BAD])
def test_bad_input_raises_a_clear_exception(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_slogdet_of_a_singular_matrix_is_zero_and_minus_inf():
    sign, logabsdet = LA.slogdet(lm.zeros((2, 2)))
    assert sign.item() == 0.0 and logabsdet.item() == -math.inf


# ---------------------------------------------------------------- DLPack


def test_from_dlpack_shares_zero_size_arrays_and_honours_copy_and_device():
    empty = np.zeros((0, 3))
    assert lm.from_dlpack(empty, copy=False).shape == (0, 3)
    a = np.arange(4.0)
    lm.from_dlpack(a, copy=False)[0] = 9.0  # shared
    lm.from_dlpack(a, copy=True)[1] = 9.0  # copied
    assert a.tolist() == [9.0, 1.0, 2.0, 3.0]
    assert lm.from_dlpack(a, device="counting").device == "counting"
    with pytest.raises(ValueError, match="moving to counting needs a copy"):
        lm.from_dlpack(a, device="counting", copy=False)
    t = lm.asarray([1.0, 2.0])
    assert np.from_dlpack(t).tolist() == [1.0, 2.0]
    copied = np.from_dlpack(t, copy=True)
    copied[0] = 5.0
    assert t.tolist() == [1.0, 2.0]
    same(lm.from_dlpack(xp.asarray([1, 2])), np.array([1, 2]))


def test_a_tensor_on_another_device_exports_a_cpu_copy_when_asked_for_the_cpu():
    """DLPack 2023.12: dl_device=(kDLCPU, 0) lets the producer copy to the CPU (NumPy's
    from_dlpack(x, device="cpu"), which scikit-learn uses to bring results home); what
    cannot be exported is the protocol's BufferError (it was numpy()'s TypeError)."""
    values = np.arange(6.0).reshape(2, 3)
    t = lm.asarray(values, device="counting")
    same(np.from_dlpack(t, device="cpu"), values)
    same(np.from_dlpack(t[:, ::2], device="cpu", copy=True), values[:, ::2])
    same(lm.from_dlpack(t).numpy(), values)  # lamina asks for the CPU when it must
    moved = lm.from_dlpack(t, device="counting")
    assert moved.device == "counting" and moved.tolist() == values.tolist()
    with pytest.raises(BufferError, match="on counting exports only as a copy on the CPU"):
        np.from_dlpack(t)
    with pytest.raises(BufferError, match="on counting to the CPU needs a copy, but copy=False"):
        np.from_dlpack(t, device="cpu", copy=False)
    with pytest.raises(BufferError, match="from_dlpack: cannot import Tensor: __dlpack__"):
        lm.from_dlpack(t, copy=False)
    with pytest.raises(BufferError, match="a tensor on counting has no DLPack device"):
        t.__dlpack_device__()
    sparse = lm.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,))
    with pytest.raises(BufferError, match="a sparse tensor has no DLPack form; use to_dense"):
        np.from_dlpack(sparse)
    with pytest.raises(BufferError, match="a sparse tensor on cpu has no DLPack device"):
        sparse.__dlpack_device__()
    assert lm.asarray(values).__dlpack_device__() == (1, 0)


@pytest.mark.parametrize("dtype", [np.float16])
def test_from_dlpack_of_an_unsupported_dtype_lists_the_supported_ones(dtype):
    with pytest.raises(TypeError, match=r"from_dlpack: unsupported dtype .*lamina supports bool"):
        lm.from_dlpack(np.zeros(2, dtype))
    with pytest.raises(TypeError, match="expected an object with __dlpack__"):
        lm.from_dlpack([1, 2])


# ---------------------------------------------------------------- precompile


def test_precompile_lists_every_elementwise_kernel_and_fills_the_cache():
    from lamina.tools import precompile

    jobs = dict(precompile._elementwise_jobs([lm.float64, lm.bool], parallel=False))
    assert {"add float64 flat", "add float64 strided", "add float64 scalar"} <= set(jobs)
    assert "exp float64 strided" in jobs and "logical_not bool flat" in jobs
    assert "exp bool flat" not in jobs  # exp of bool computes in float64: no bool kernel
    with_parallel = dict(precompile._elementwise_jobs([lm.float64], parallel=True))
    assert "add float64 flat_parallel" in with_parallel
    jobs["add float64 flat"]()  # compiles (or loads) that entry point in place
    from lamina.backends.numba_cpu import elementwise

    assert not isinstance(elementwise.BY_NAME["add"].flat[lm.float64.index], elementwise.jit._Stub)
    from lamina.dispatch import core

    if core.IMPLEMENTATION == "c":  # the C core's loops too (Note [Loop cache])
        jobs["logical_not bool C loops"]()
        assert ("where bool C loops" in jobs) is False  # ternary: no C loops
    else:
        assert not any(label.endswith("C loops") for label in jobs)
    assert precompile._bar(1, 4, "add").startswith("\r[#######")
