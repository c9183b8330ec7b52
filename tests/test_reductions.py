"""Reductions (sum, prod, mean, var, std, max, min, all, any, argmax, argmin).

Checked against NumPy and against the numpy_ref backend. Every (operator, dtype) pair
compiles a Numba kernel the first time it runs, so the dtype lists below are a few
representatives per reduction kind, not full sweeps.
"""

import math

import numpy as np
import pytest

import lamina as lm

RNG = np.random.default_rng(1234)

SHAPE = (2, 3, 4)
AXES = [None, 0, -1, 1, (0, 2), (-1, -3), (0, 1, 2), ()]


def ref(fn, *args, **kwargs):
    """``fn`` computed by the numpy_ref backend."""
    with lm.backends.use("numpy_ref"):
        return fn(*args, **kwargs)


def data(dtype, shape=SHAPE, low=-3, high=4):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return RNG.integers(0, 2, shape).astype(bool)
    if dt.kind == "u":
        low = 0
    if dt.kind == "f":
        return (RNG.standard_normal(shape) * 3).astype(dt)
    return RNG.integers(low, high, shape).astype(dt)


def assert_tensor(got, want, dtype, rtol=1e-12, atol=0.0):
    """``got`` is a lamina tensor of ``dtype`` equal (or close) to the array ``want``."""
    assert isinstance(got, lm.Tensor)
    want = np.asarray(want)
    assert got.dtype == dtype, (got.dtype, dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    g = got.numpy()
    assert g.dtype == dtype.np
    if dtype.kind == "f":
        np.testing.assert_allclose(g, want, rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(g, want)


def same(a, b, rtol=1e-12, atol=0.0):
    """Two lamina results (default backend and numpy_ref) agree exactly in dtype/shape."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    if a.dtype.kind == "f":
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# ---------------------------------------------------------------- sum and prod

# (input dtype, default result dtype): Array API rules for sum/prod
SUM_DTYPES = [
    (lm.float64, lm.float64),
    (lm.float32, lm.float32),
    (lm.int8, lm.int64),
    (lm.uint8, lm.uint64),
    (lm.bool, lm.int64),
    (lm.int32, lm.int64),
]


@pytest.mark.parametrize("name", ["sum", "prod"])
@pytest.mark.parametrize("dtype,result", SUM_DTYPES, ids=lambda d: getattr(d, "name", None))
def test_sum_prod_dtypes_and_axes(name, dtype, result):
    n = data(dtype.np, low=-2, high=3)
    x = lm.asarray(n)
    fn, npfn = getattr(lm, name), getattr(np, name)
    rtol = 1e-5 if dtype is lm.float32 else 1e-12
    for axis in AXES:
        for keepdims in (False, True):
            got = fn(x, axis=axis, keepdims=keepdims)
            want = npfn(n, axis=axis, keepdims=keepdims, dtype=result.np)
            assert_tensor(got, want, result, rtol=rtol)
            same(got, ref(fn, x, axis=axis, keepdims=keepdims), rtol=rtol)


@pytest.mark.parametrize("name", ["sum", "prod"])
def test_sum_prod_dtype_argument(name):
    fn, npfn = getattr(lm, name), getattr(np, name)
    i8 = np.array([[100, 100, 3], [-100, 2, 1]], np.int8)
    x = lm.asarray(i8)
    # the requested dtype is the result dtype (and wraps like NumPy's does)
    for dtype in (lm.int8, lm.int64, lm.float32, "float64", lm.int16):
        d = lm.__dict__[dtype] if isinstance(dtype, str) else dtype
        got = fn(x, axis=1, dtype=dtype)
        assert_tensor(got, npfn(i8, axis=1, dtype=d.np), d, rtol=1e-6)
        same(got, ref(fn, x, axis=1, dtype=dtype), rtol=1e-6)
    f = lm.asarray(np.array([1.5, 2.5, 4.0]))
    assert_tensor(fn(f, dtype=lm.float32), npfn(np.float32([1.5, 2.5, 4.0])), lm.float32)
    u = lm.asarray(np.array([1, 2, 3], np.uint32))
    assert_tensor(fn(u, dtype=lm.int64), npfn(np.int64([1, 2, 3])), lm.int64)


def test_sum_prod_cast_to_dtype_before_reducing():
    # Array API and NumPy: the input is cast to dtype first, element by element
    f = lm.asarray([1.7, 1.7, -0.5])
    for fn, want in [(lm.sum, 2), (lm.prod, 0)]:
        assert_tensor(fn(f, dtype=lm.int64), np.int64(want), lm.int64)
        same(fn(f, dtype=lm.int64), ref(fn, f, dtype=lm.int64))
    assert lm.prod(lm.asarray([1.7, 2.5]), dtype=lm.int32).item() == 2
    i8 = lm.asarray(np.array([-1, 3], np.int8))
    assert_tensor(lm.sum(i8, dtype=lm.uint8), np.uint8(2), lm.uint8)  # 255 + 3 wraps
    assert_tensor(lm.prod(i8, dtype=lm.uint16), np.uint16(65533), lm.uint16)
    same(lm.prod(i8, dtype=lm.uint16), ref(lm.prod, i8, dtype=lm.uint16))


def test_sum_int8_does_not_wrap_by_default():
    x = lm.asarray(np.array([100, 100, 100], np.int8))
    assert lm.sum(x).item() == 300 and lm.sum(x).dtype == lm.int64
    u = lm.asarray(np.array([200, 200], np.uint8))
    assert lm.prod(u).item() == 40000 and lm.prod(u).dtype == lm.uint64
    b = lm.asarray(np.array([True, True, False, True]))
    assert lm.sum(b).item() == 3 and lm.sum(b).dtype == lm.int64
    assert lm.prod(b).item() == 0 and lm.prod(b).dtype == lm.int64


def test_float32_sum_accumulates_in_float64():
    # 1e8 + 1 rounds back to 1e8 in float32: a float32 accumulator loses every 1
    n = np.concatenate([[1e8], np.ones(1000)]).astype(np.float32)
    got = lm.sum(lm.asarray(n))
    assert got.dtype == lm.float32
    assert got.item() == 100001000.0  # exact in float32, but only reachable via float64
    assert lm.mean(lm.asarray(n)).item() == pytest.approx(100001000.0 / 1001, rel=1e-7)
    # prod too: 3e-30 * 1e-20 underflows float32 midway, 1e20 brings it back
    p = np.array([3e-30, 1e-20, 1e20, 1e20], np.float32)
    assert lm.prod(lm.asarray(p)).item() == pytest.approx(3e-10, rel=1e-6)


def test_sum_large_uint64_and_int64_exact():
    big = np.array([2**63, 2**62, 5], np.uint64)
    assert lm.sum(lm.asarray(big)).item() == 2**63 + 2**62 + 5
    i = np.array([2**62, 2**61, -7], np.int64)
    assert lm.sum(lm.asarray(i)).item() == 2**62 + 2**61 - 7


# ---------------------------------------------------------------- empty and 0-d


def test_empty_sum_prod_identities():
    for dtype, result in [(lm.float64, lm.float64), (lm.int8, lm.int64), (lm.bool, lm.int64)]:
        e = lm.zeros((0, 3), dtype=dtype)
        assert_tensor(lm.sum(e), np.zeros((), result.np), result)
        assert_tensor(lm.prod(e), np.ones((), result.np), result)
        assert_tensor(lm.sum(e, axis=0), np.zeros(3, result.np), result)
        assert_tensor(lm.prod(e, axis=0, keepdims=True), np.ones((1, 3), result.np), result)
        assert_tensor(lm.sum(e, axis=1), np.zeros(0, result.np), result)
        same(lm.prod(e, axis=0), ref(lm.prod, e, axis=0))
        same(lm.sum(e), ref(lm.sum, e))


def test_empty_mean_var_std_are_nan():
    e = lm.zeros((0, 3))  # the default float (Note [Default dtype])
    d = lm.get_default_dtype()
    for fn in (lm.mean, lm.var, lm.std):
        assert_tensor(fn(e), np.float64("nan").astype(d.np), d)
        assert_tensor(fn(e, axis=0), np.full(3, np.nan, d.np), d)
        assert_tensor(fn(e, axis=1), np.zeros(0, d.np), d)
        same(fn(e, axis=0), ref(fn, e, axis=0))


@pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin"])
def test_empty_axis_without_identity_raises(name):
    fn = getattr(lm, name)
    e = lm.zeros((0, 3))
    msg = "zero-size axis" if name in ("max", "min") else "empty sequence"
    for backend_call in (fn, lambda *a, **k: ref(fn, *a, **k)):
        with pytest.raises(ValueError, match=msg):
            backend_call(e)
        with pytest.raises(ValueError, match=rf"{name}:.*\(0, 3\)"):
            backend_call(e, axis=0)
    # reducing a non-empty axis of an empty tensor is fine: an empty result, of e's
    # dtype (the default float) for max and min
    dtype = lm.int64 if name.startswith("arg") else lm.get_default_dtype()
    want = getattr(np, name)(np.zeros((3, 0)), axis=0).astype(dtype.np)
    for t, axis in [(e, 1), (lm.zeros((3, 0)), 0)]:
        assert_tensor(fn(t, axis=axis), want, dtype)
        assert_tensor(ref(fn, t, axis=axis), want, dtype)


def test_empty_all_any():
    e = lm.zeros((0,))
    assert_tensor(lm.all(e), np.True_, lm.bool)
    assert_tensor(lm.any(e), np.False_, lm.bool)
    same(lm.all(e), ref(lm.all, e))
    same(lm.any(e), ref(lm.any, e))


def test_zero_dimensional_reductions():
    x = lm.asarray(5.0)  # a Python float: the default float (Note [Default dtype])
    for fn, want in [
        (lm.sum, 5.0),
        (lm.prod, 5.0),
        (lm.max, 5.0),
        (lm.min, 5.0),
        (lm.mean, 5.0),
        (lm.var, 0.0),
        (lm.std, 0.0),
    ]:
        got = fn(x)
        assert got.shape == () and got.dtype == lm.get_default_dtype() and got.item() == want
        assert fn(x, axis=(), keepdims=True).shape == ()
    for fn in (lm.sum, lm.prod, lm.max, lm.mean, lm.var, lm.argmax, lm.argmin, lm.all):
        same(fn(x), ref(fn, x))
    assert lm.argmax(x).shape == () and lm.argmax(x).item() == 0
    assert lm.argmin(x, keepdims=True).item() == 0
    assert lm.all(x).item() is True and lm.any(lm.asarray(0.0)).item() is False
    i = lm.asarray(7)
    assert lm.sum(i).dtype == lm.int64 and lm.sum(i).item() == 7


# ---------------------------------------------------------------- max and min


@pytest.mark.parametrize("dtype", [lm.float64, lm.int16, lm.uint64, lm.bool], ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min(name, dtype):
    n = data(dtype.np)
    if dtype is lm.uint64:
        n[0, 0, 0] = 2**64 - 1  # beyond int64: must not go through a signed type
    x = lm.asarray(n)
    fn, npfn = getattr(lm, name), getattr(np, name)
    for axis in AXES:
        for keepdims in (False, True):
            got = fn(x, axis=axis, keepdims=keepdims)
            assert_tensor(got, npfn(n, axis=axis, keepdims=keepdims), dtype)
            same(got, ref(fn, x, axis=axis, keepdims=keepdims))


def test_max_min_propagate_nan():
    n = np.array([[1.0, np.nan, 3.0], [np.nan, -1.0, 2.0], [4.0, 5.0, -np.inf]])
    x = lm.asarray(n)
    for fn, npfn in [(lm.max, np.max), (lm.min, np.min)]:
        assert np.isnan(fn(x).item())
        assert_tensor(fn(x, axis=1), npfn(n, axis=1), lm.float64)
        assert_tensor(fn(x, axis=0), npfn(n, axis=0), lm.float64)
        same(fn(x, axis=1), ref(fn, x, axis=1))
    # NaN first in a row, then ordinary values: still NaN
    assert np.isnan(lm.max(lm.asarray([np.nan, 1.0, 2.0])).item())
    assert np.isnan(lm.min(lm.asarray([np.nan, 1.0, 2.0])).item())
    assert lm.min(x, axis=1).numpy()[2] == -np.inf


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "uint8", "bool"])
def test_long_rows_and_columns(dtype):
    """Rows long enough for every accumulator of reduce_rows (and a remainder), and
    leading-axis reductions that take the column kernel (mean and argmax too, which
    the C core runs as folds), on contiguous, transposed and stepped inputs, with a NaN
    in one column and one row."""
    n = data(dtype, shape=(37, 203))
    if dtype.startswith("float"):
        n[5, 7] = np.nan
    rtol = 1e-5 if dtype == "float32" else 1e-12
    for view in (n, n.T, n[::3, ::-2]):
        x = lm.asarray(view)
        # (float products of hundreds of values overflow: prod is checked on integers)
        floats = dtype.startswith("float")
        names = ("sum", "max", "min", "all", "any", "argmax", "argmin")
        for name in (*names, *(("mean",) if floats else ("prod",))):
            if name in ("sum", "prod"):
                want = getattr(np, name)(view, axis=0, dtype=lm.sum(x[:1, :1]).dtype.np)
            else:
                want = getattr(np, name)(view, axis=0)
            got = getattr(lm, name)(x, axis=0)
            # float32 sums round differently in another order: allow the cancellation
            atol = 1e-4 if dtype == "float32" else 0.0
            assert_tensor(got, want, got.dtype, rtol=rtol, atol=atol)
            for axis in (1, None):
                same(
                    getattr(lm, name)(x, axis=axis),
                    ref(getattr(lm, name), x, axis=axis),
                    rtol=rtol,
                    atol=atol,
                )


def _relative_error(got, values):
    exact = math.fsum(values.astype(np.float64))
    return abs(float(got) - exact) / abs(exact)


@pytest.mark.parametrize("shape,axis", [((10**6,), None), ((3, 150_000), 1), ((90_001, 3), 0)])
def test_float32_sum_error_is_one_rounding(shape, axis):
    """Float32 sums accumulate in float64 (Note [Vector reductions]): whatever the
    order the vectorized loops add in, and over rows longer than a block or columns
    with a remainder, the result is the exact sum rounded once to float32 (NumPy's
    pairwise float32 sum is off by 1.1e-7 on the 0.1s, 1.1e-2 on the alternating
    values). The inputs defeat naive float32 accumulation."""
    size = math.prod(shape)
    inputs = {
        "tenths": np.full(size, 0.1),
        "large mean, small spread": 1e4 + RNG.standard_normal(size),
        "alternating signs": np.where(np.arange(size) % 2, -1e4, 1e4) + 0.1,
    }
    for label, values in inputs.items():
        n = values.astype(np.float32).reshape(shape)
        x = lm.asarray(n)
        exact = np.sum(n.astype(np.float64), axis=axis)  # 1e-16 off: exact enough
        half_ulp = 2.0**-24 * 1.001  # rounding to float32, plus the reference's error
        np.testing.assert_allclose(lm.sum(x, axis=axis).numpy(), exact, half_ulp, 0, label)
        mean = lm.mean(x, axis=axis).numpy()
        np.testing.assert_allclose(mean, exact / (n.size // exact.size), half_ulp, 0, label)


def test_float64_sum_error_grows_with_blocks_not_length():
    # 10**6 tenths added one by one drift by ~1e-11; blocked (and vectorized) by <1e-13
    values = np.full(10**6, 0.1)
    assert _relative_error(lm.sum(lm.asarray(values)).item(), values) < 1e-13
    rows = np.full((2, 10**5), 0.1)
    for got in lm.sum(lm.asarray(rows), axis=1).tolist():
        assert _relative_error(got, rows[0]) < 1e-13


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_var_std_of_data_with_a_large_mean(dtype):
    """Two passes (the mean, then the squared deviations), both accumulated in float64:
    no cancellation even where the mean is 1e4 times the spread, along rows, along
    columns (the column kernel) and over everything."""
    n = (1e4 + RNG.standard_normal((300, 70))).astype(dtype)
    if dtype == np.complex64:
        n = n + 1j * (5e3 + RNG.standard_normal(n.shape)).astype(np.float32)
    x = lm.asarray(n)
    wide = n.astype(np.complex128 if dtype == np.complex64 else np.float64)
    for axis in (None, 0, 1):
        for fn, npfn in [(lm.var, np.var), (lm.std, np.std)]:
            got = fn(x, axis=axis, correction=1).numpy()
            np.testing.assert_allclose(got, npfn(wide, axis=axis, ddof=1), rtol=1e-6)
        want_mean = np.mean(wide, axis=axis)
        np.testing.assert_allclose(lm.mean(x, axis=axis).numpy(), want_mean, rtol=1e-7)


def test_parallel_reductions():
    """Above the parallel threshold: rows shared among threads, leading axes by the
    column kernel, and a fold of everything split into parts that the threads share
    (a part's start value must be the fold's, not another part's result)."""
    before = lm.get_num_threads()
    lm.set_num_threads(2)
    try:
        n = RNG.integers(-100, 100, (3, 100_003)).astype(np.int64)
        n[0, 0] = 1000  # max's start value (each row's first) is the max
        b = np.zeros(n.shape, bool)
        b[2, -1] = True  # in the rest of the split row
        f = (n + 0.25).astype(np.float32)
        x, bx, fx = lm.asarray(n), lm.asarray(b), lm.asarray(f)
        for axis in (None, 0, 1):
            for name in ("sum", "max", "min", "argmax", "argmin"):
                got = getattr(lm, name)(x, axis=axis).numpy()
                np.testing.assert_array_equal(got, getattr(np, name)(n, axis=axis), name)
            for name in ("any", "all", "sum"):
                got = getattr(lm, name)(bx, axis=axis).numpy()
                np.testing.assert_array_equal(got, getattr(np, name)(b, axis=axis), name)
            for name in ("mean", "var"):
                want = getattr(np, name)(f.astype(np.float64), axis=axis)
                np.testing.assert_allclose(getattr(lm, name)(fx, axis=axis).numpy(), want, 1e-6)
            for ord in (2, 1, np.inf):
                want = np.linalg.vector_norm(f.astype(np.float64), axis=axis, ord=ord)
                got = lm.linalg.vector_norm(fx, axis=axis, ord=ord).numpy()
                np.testing.assert_allclose(got, want, 1e-6)
    finally:
        lm.set_num_threads(before)


# ---------------------------------------------------------------- argmax and argmin


@pytest.mark.parametrize("dtype", [lm.float64, lm.int32, lm.bool], ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin(name, dtype):
    n = data(dtype.np)  # small ints: ties, where the first index must win
    x = lm.asarray(n)
    fn, npfn = getattr(lm, name), getattr(np, name)
    for axis in (None, 0, 1, -1):
        for keepdims in (False, True):
            got = fn(x, axis=axis, keepdims=keepdims)
            assert_tensor(got, npfn(n, axis=axis, keepdims=keepdims), lm.int64)
            same(got, ref(fn, x, axis=axis, keepdims=keepdims))


def test_argmax_first_nan_wins():
    n = np.array(
        [[1.0, 5.0, np.nan, 9.0, np.nan], [np.nan, 0.0, 1.0, 2.0, 3.0], [3.0, 1.0, 3.0, 0.0, 1.0]]
    )
    x = lm.asarray(n)
    for fn, npfn in [(lm.argmax, np.argmax), (lm.argmin, np.argmin)]:
        assert_tensor(fn(x, axis=1), npfn(n, axis=1), lm.int64)
        assert fn(x).item() == npfn(n) == 2
        same(fn(x, axis=1), ref(fn, x, axis=1))
    assert lm.argmax(x, axis=1).tolist() == [2, 0, 0]  # ties: first index
    assert lm.argmin(x, axis=1).tolist() == [2, 0, 3]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_order_keys_of_special_values(dtype):
    """max, min, argmax and argmin fold the values' order keys (Note [Order keys]):
    -0.0 ties 0.0 for argmax (and stays -0.0 as a max), infinities and
    subnormals order as values, and a NaN of either sign (or a payload) wins, the
    first one, in short rows and in rows of several blocks."""
    tiny = np.finfo(dtype).smallest_subnormal
    special = np.array([-0.0, 0.0, tiny, -tiny, np.inf, -np.inf, 1.0, -1.0], dtype)
    negative_nan = -np.abs(np.array(np.nan, dtype))
    rows = np.zeros((4, 700), dtype)
    rows[:, :8] = special
    rows[1, 600] = negative_nan
    rows[2, 3], rows[2, 650] = np.nan, negative_nan
    rows[3, :8] = [-0.0, 0.0, -0.0, 0.0, -1.0, 1.0, -1.0, 1.0]
    for view in (rows, rows[:, :8], rows[:, 1::3]):
        x = lm.asarray(view)
        for name in ("argmax", "argmin"):
            got = getattr(lm, name)(x, axis=1).numpy()
            np.testing.assert_array_equal(got, getattr(np, name)(view, axis=1), name)
            assert getattr(lm, name)(x).item() == getattr(np, name)(view)
        for name in ("max", "min"):
            got, want = getattr(lm, name)(x, axis=1).numpy(), getattr(np, name)(view, axis=1)
            np.testing.assert_array_equal(got, want, name)
            signed = ~np.isnan(want)  # (a NaN's sign is not specified)
            np.testing.assert_array_equal(np.signbit(got[signed]), np.signbit(want[signed]))
    zeros = lm.asarray(np.array([[-0.0, -0.0], [-0.0, 0.0]], dtype))
    assert np.signbit(lm.max(zeros, axis=1).numpy()).tolist() == [True, False]
    # a row's largest order key is 0.0's, smallest -0.0's: the first zero still wins
    assert lm.argmax(zeros, axis=1).tolist() == lm.argmin(zeros[:, ::-1], axis=1).tolist() == [0, 0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16])
def test_argmax_argmin_long_rows_and_columns(dtype):
    """Rows of several blocks (the block holding the extreme is searched), ties in
    later blocks (the first index wins), a NaN past the first extreme (it wins), and
    leading-axis reductions (the column kernel), against NumPy."""
    n = RNG.integers(-1000, 1000, (5, 1300)).astype(dtype)
    n[0, 700] = n[0, 1200] = 5000  # a tie in a later block
    n[1, 3] = n[1, 1299] = -5000
    n[2, :] = 7  # every element a tie
    floats = np.dtype(dtype).kind == "f"
    if floats:
        n[3, 900], n[3, 1000] = np.nan, np.nan  # first NaN wins, over a bigger block max
        n[3, 100] = 1e6
        n[4] = -np.abs(n[4]) - 1
        n[4, 10], n[4, 600] = -0.0, 0.0  # the maximum, in two blocks: the first wins
    for view in (n, n.T, n[:, ::-3], -n):
        x = lm.asarray(view)
        for fn, npfn in [(lm.argmax, np.argmax), (lm.argmin, np.argmin)]:
            for axis in (None, 0, 1):
                assert_tensor(fn(x, axis=axis), npfn(view, axis=axis), lm.int64)


def test_argmax_extreme_values():
    assert lm.argmin(lm.asarray(np.array([5, -128, -128], np.int8))).item() == 1
    assert lm.argmax(lm.asarray(np.array([1, 2**64 - 1, 3], np.uint64))).item() == 1
    assert lm.argmax(lm.asarray([-np.inf, -np.inf])).item() == 0


# ---------------------------------------------------------------- mean, var, std


@pytest.mark.parametrize("dtype", [lm.float64, lm.float32, lm.int64], ids=lambda d: d.name)
def test_mean_var_std(dtype):
    n = data(dtype.np, low=-50, high=50)
    x = lm.asarray(n)
    # a float keeps its dtype; integers become the default float (Note [Default dtype])
    result = dtype if dtype.kind == "f" else lm.get_default_dtype()
    nf = n.astype(np.float64)  # the references in float64, cast to the result dtype
    # float32 data carries its own rounding; integers are exact, and a float32 default
    # only rounds their result (std: var rounded, then its sqrt), a few ulps of 1.2e-7
    rtol = 1e-5 if dtype is lm.float32 else 1e-6 if result is lm.float32 else 1e-12
    # a mean's rounding error scales with its terms, not with the mean, which the random
    # data's cancellation can bring near zero (float32: 1.2e-5 of a mean of 0.0012)
    atol = rtol * float(np.abs(nf).mean())
    for axis in AXES:
        for keepdims in (False, True):
            got = lm.mean(x, axis=axis, keepdims=keepdims)
            want = np.mean(nf, axis=axis, keepdims=keepdims).astype(result.np)
            assert_tensor(got, want, result, rtol, atol)
            same(got, ref(lm.mean, x, axis=axis, keepdims=keepdims), rtol, atol)
            for fn, npfn in [(lm.var, np.var), (lm.std, np.std)]:
                for correction in (0, 1, 0.5):
                    if axis == ():  # n == 1: var is 0, or NaN when correction >= 1
                        continue
                    got = fn(x, axis=axis, keepdims=keepdims, correction=correction)
                    want = npfn(nf, axis=axis, keepdims=keepdims, ddof=correction)
                    want = want.astype(result.np)
                    assert_tensor(got, want, result, rtol, atol=1e-12)
                    same(got, ref(fn, x, axis=axis, keepdims=keepdims, correction=correction), rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_var_std_vector_norm_layouts(dtype):
    """var, std and the 2-norm over leading, trailing and all axes (the C core's two
    passes, Note [C moments]) and over other axes (the Python kernel), of contiguous,
    transposed and stepped inputs, against float64 NumPy; a NaN spreads to its row."""
    n = (RNG.standard_normal((5, 6, 7)) * 3 + 100).astype(dtype)
    n[1, 2, 3] = np.nan
    rtol = 1e-5 if dtype == np.float32 else 1e-11
    norm = lm.linalg.vector_norm
    for view in (n, n.transpose(2, 1, 0), n[::2, :, ::-3]):
        x, nf = lm.asarray(view), view.astype(np.float64)
        for axis in (None, 0, -1, (0, 1), (1, 2), (0, 2)):
            for keepdims in (False, True):
                for correction in (0, 1.5):
                    got = lm.var(x, axis=axis, correction=correction, keepdims=keepdims)
                    want = np.var(nf, axis=axis, ddof=correction, keepdims=keepdims)
                    assert_tensor(got, want.astype(dtype), x.dtype, rtol)
                    got = lm.std(x, axis=axis, correction=correction, keepdims=keepdims)
                    assert_tensor(got, np.sqrt(want).astype(dtype), got.dtype, rtol)
                got = norm(x, axis=axis, keepdims=keepdims)
                want = np.linalg.vector_norm(nf, axis=axis, keepdims=keepdims)
                assert_tensor(got, want.astype(dtype), got.dtype, rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_norm_ords(dtype):
    """Every ord over leading, trailing, all and middle axes, of contiguous,
    transposed and stepped inputs, against float64 NumPy; a NaN spreads to its row."""
    n = RNG.standard_normal((4, 5, 6)).astype(dtype)
    n[0, 0, 0], n[1, 2, 3] = 0.0, np.nan
    rtol = 1e-5 if dtype == np.float32 else 1e-11
    for view in (n, n.transpose(2, 1, 0), n[::2, :, ::-3]):
        x, nf = lm.asarray(view), view.astype(np.float64)
        for ord in (1, np.inf, -np.inf, 0, 3, 0.5):
            for axis in (None, 0, -1, 1):
                got = lm.linalg.vector_norm(x, axis=axis, ord=ord)
                want = np.linalg.vector_norm(nf, axis=axis, ord=ord)
                assert_tensor(got, want.astype(dtype), x.dtype, rtol)


def test_vector_norm_edge_values():
    """The 2-norm sums float32 squares in float64: no overflow or underflow where
    float32 squares would (NumPy's float32 norm gives inf and 0 here); float64
    squares overflow as NumPy's do. Empty axes give 0; NaN wins over inf."""
    norm = lm.linalg.vector_norm
    assert norm(lm.asarray(np.array([3e30, 4e30], np.float32))).item() == pytest.approx(5e30)
    assert norm(lm.asarray(np.array([3e-30, 4e-30], np.float32))).item() == pytest.approx(5e-30)
    assert norm(lm.asarray(np.array([3e200, 4e200]))).item() == np.inf
    assert norm(lm.asarray(np.array([1.0, np.inf]))).item() == np.inf
    assert np.isnan(norm(lm.asarray(np.array([np.inf, np.nan]))).item())
    for shape, axis, want in [((0, 3), 0, np.zeros(3)), ((3, 0), 1, np.zeros(3))]:
        assert_tensor(norm(lm.zeros(shape), axis=axis), want, lm.float32)
    assert norm(lm.zeros((0,))).item() == 0.0


def test_var_correction_edge_cases():
    x = lm.asarray([1.0, 2.0, 4.0])
    assert lm.var(x).item() == pytest.approx(np.var([1.0, 2.0, 4.0]))
    assert lm.var(x, correction=1).item() == pytest.approx(7 / 3)
    assert lm.std(x, correction=1).item() == pytest.approx(np.sqrt(7 / 3))
    # correction >= n: no degrees of freedom left, NaN (not inf, not an error)
    for corr in (3, 4.5):
        assert np.isnan(lm.var(x, correction=corr).item())
        assert np.isnan(ref(lm.var, x, correction=corr).item())
    assert np.isnan(lm.std(lm.asarray([1.0]), correction=1).item())
    # a constant row has (almost) zero variance: two passes, no E[x^2] - E[x]^2
    # cancellation (which would leave an error of order 1 at this magnitude)
    c = lm.asarray(np.full(1000, 1e8 + 0.1))
    assert abs(lm.var(c).item()) < 1e-6


def test_mean_of_bool_and_ints_is_the_default_float():
    """Bool and integer tensors promoted to floating give the default float, under
    either default (Note [Default dtype])."""
    before = lm.get_default_dtype()
    try:
        for d in (lm.float32, lm.float64):
            lm.set_default_dtype(d)
            b = lm.asarray([True, False, True, True])
            assert_tensor(lm.mean(b), np.float64(0.75).astype(d.np), d)
            i = lm.asarray([1, 2, 4])
            assert_tensor(lm.mean(i), np.float64(7 / 3).astype(d.np), d)
    finally:
        lm.set_default_dtype(before)


# ---------------------------------------------------------------- all and any


@pytest.mark.parametrize("dtype", [lm.bool, lm.float64, lm.int64], ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["all", "any"])
def test_all_any(name, dtype):
    n = RNG.integers(0, 3, SHAPE).astype(dtype.np)  # some zeros: both answers occur
    n[1, :, 1:] = 1  # and some all-true lines
    x = lm.asarray(n)
    fn, npfn = getattr(lm, name), getattr(np, name)
    for axis in AXES:
        for keepdims in (False, True):
            got = fn(x, axis=axis, keepdims=keepdims)
            assert_tensor(got, npfn(n, axis=axis, keepdims=keepdims), lm.bool)
            same(got, ref(fn, x, axis=axis, keepdims=keepdims))


def test_all_any_truthiness_of_floats():
    assert lm.all(lm.asarray([np.nan, 1.0])).item() is True  # NaN is truthy
    assert lm.any(lm.asarray([-0.0, 0.0])).item() is False  # -0.0 is falsy


# ---------------------------------------------------------------- strided inputs


def _strided_views():
    base = np.arange(60, dtype=np.float64).reshape(3, 4, 5) * 0.5 - 7
    t = lm.asarray(base.copy())
    yield "transposed", lm.permute_dims(t, (2, 0, 1)), base.transpose(2, 0, 1)
    yield "mT", t.mT, np.swapaxes(base, -1, -2)
    yield "flipped", lm.flip(t, axis=(0, 2)), base[::-1, :, ::-1]
    yield "negstep", t[::-1, 1::2, ::-2], base[::-1, 1::2, ::-2]
    yield "numpy-strided", lm.asarray(base[:, ::-2, 1:]), base[:, ::-2, 1:]
    yield (
        "broadcast",
        lm.broadcast_to(lm.asarray(base[0, 0]), (3, 5)),
        np.broadcast_to(base[0, 0], (3, 5)),
    )


@pytest.mark.parametrize(
    "name", ["sum", "prod", "max", "min", "mean", "var", "argmax", "argmin", "any"]
)
def test_reductions_of_strided_views(name):
    fn, npfn = getattr(lm, name), getattr(np, name)
    for label, view, n in _strided_views():
        assert np.array_equal(view.numpy(), n), label
        axes = [None, 0, -1] if name.startswith("arg") else [None, 0, -1, (0, 1)]
        for axis in axes:
            got = fn(view, axis=axis)
            want = npfn(n, axis=axis)
            if name.startswith("arg"):
                assert_tensor(got, want, lm.int64)
            else:
                assert_tensor(
                    got, want, lm.bool if name == "any" else lm.float64, rtol=1e-9, atol=1e-9
                )
            same(got, ref(fn, view, axis=axis), rtol=1e-9)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "name", ["sum", "prod", "mean", "var", "std", "max", "min", "all", "any", "argmax", "argmin"]
)
def test_axis_errors(name):
    fn = getattr(lm, name)
    x = lm.zeros((2, 3))
    with pytest.raises(lm.AxisError, match=rf"{name}: axis 2 is out of bounds .* dimension 2"):
        fn(x, axis=2)
    with pytest.raises(IndexError, match="out of bounds"):
        fn(x, axis=-3)
    with pytest.raises(ValueError, match="out of bounds"):
        fn(x, axis=5)
    with pytest.raises(TypeError, match=rf"{name}: axis must be an int, got float"):
        fn(x, axis=1.0)
    with pytest.raises(TypeError, match=rf"{name}: x must be a tensor, got list"):
        fn([[1.0, 2.0]])
    if name in ("max", "min"):  # PyTorch's positional dim (Note [Two spellings])
        assert fn(x, 0).indices.shape == (3,)
    else:
        with pytest.raises(TypeError, match="positional"):
            fn(x, 0)  # axis is keyword-only
    if name.startswith("arg"):
        with pytest.raises(TypeError, match=rf"{name}: axis must be an int or None"):
            fn(x, axis=(0, 1))
    else:
        with pytest.raises(ValueError, match=rf"{name}: repeated axis"):
            fn(x, axis=(1, -1))


def test_axis_error_is_value_and_index_error():
    assert issubclass(lm.AxisError, ValueError) and issubclass(lm.AxisError, IndexError)
    with pytest.raises(lm.AxisError):
        lm.sum(lm.asarray(1.0), axis=0)  # a 0-d tensor has no axis 0


def test_unknown_keyword_arguments():
    x = lm.ones(3)
    with pytest.raises(
        TypeError, match="mean\\(\\) got an unexpected keyword argument 'correction'"
    ):
        lm.mean(x, correction=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dtype'"):
        lm.max(x, dtype=lm.float32)
    with pytest.raises(TypeError, match="unexpected keyword argument 'ddof'"):
        lm.var(x, ddof=1)


def test_sum_bad_dtype_argument():
    x = lm.ones(3)
    with pytest.raises(TypeError, match="unsupported dtype 'float16'"):
        lm.sum(x, dtype="float16")
    with pytest.raises(TypeError, match="unsupported dtype"):
        lm.prod(x, dtype=np.float16)
