"""lamina.backends.numba_cpu.blas (Note [GEMM in kernels]): the BLAS GEMM called from
Python and from inside a Numba kernel, against NumPy's matmul; gemm.product, which
runs it over the rows of a result in parallel (Note [Products in parallel]), a bias
first where there is one (Note [Bias first])."""

import numpy as np
import pytest

import lamina as lm
from lamina.backends import jit
from lamina.backends.numba_cpu import blas, gemm

RNG = np.random.default_rng(7)


def test_kernels_can_call_the_blas_of_numpys_wheels():
    """NumPy's PyPI wheels link scipy-openblas64, whose 64-bit-integer GEMM kernels call."""
    config = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    if config["name"] == "scipy-openblas":
        assert blas.available()


def _in_kernel(name):
    """blas.gemm or blas.gemms called from a nogil Numba kernel."""
    if not blas.available():
        pytest.fail("no 64-bit-integer BLAS GEMM for kernels (see the test above)")
    fn = getattr(blas, name)

    def call(a, b, c, trans_a, trans_b, beta):
        fn(a, b, c, trans_a, trans_b, beta)

    return jit.numba.njit(nogil=True)(call)


def _operands(shape_a, shape_b, dtype, strided):
    """a, b of the given shapes: C-contiguous, or views with longer rows (lda > columns)."""
    if not strided:
        return RNG.random(shape_a).astype(dtype), RNG.random(shape_b).astype(dtype)
    a = RNG.random((*shape_a[:-1], shape_a[-1] + 3)).astype(dtype)[..., 1 : 1 + shape_a[-1]]
    b = RNG.random((*shape_b[:-1], shape_b[-1] + 5)).astype(dtype)[..., 2 : 2 + shape_b[-1]]
    return a, b


CASES = [
    (trans_a, trans_b, dtype, strided)
    for trans_a in (False, True)
    for trans_b in (False, True)
    for dtype in (np.float32, np.float64)
    for strided in (False, True)
]


@pytest.mark.parametrize("where", ["python", "kernel"])
@pytest.mark.parametrize("trans_a, trans_b, dtype, strided", CASES)
def test_gemm_matches_numpy(where, trans_a, trans_b, dtype, strided):
    gemm = blas.gemm if where == "python" else _in_kernel("gemm")
    m, n, k = 5, 7, 4
    a, b = _operands((k, m) if trans_a else (m, k), (n, k) if trans_b else (k, n), dtype, strided)
    want = (a.T if trans_a else a) @ (b.T if trans_b else b)
    c = np.full((m, n), np.nan, dtype)  # beta 0 ignores c, NaNs too
    gemm(a, b, c, trans_a, trans_b, 0)
    np.testing.assert_allclose(c, want, rtol=1e-5 if dtype == np.float32 else 1e-12)
    start = RNG.random((m, n)).astype(dtype)
    c = start.copy()
    gemm(a, b, c, trans_a, trans_b, 1)
    np.testing.assert_allclose(c, start + want, rtol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("where", ["python", "kernel"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemms_multiplies_each_pair_of_a_batch(where, dtype):
    gemms = blas.gemms if where == "python" else _in_kernel("gemms")
    a, b = RNG.random((6, 9, 3)).astype(dtype), RNG.random((6, 9, 4)).astype(dtype)
    c = np.ones((6, 3, 4), dtype)
    gemms(a, b, c, True, False, 1)  # the Winograd weight gradient's accumulation
    np.testing.assert_allclose(c, 1 + a.transpose(0, 2, 1) @ b, rtol=1e-5)
    c = np.empty((6, 9, 9), dtype)
    gemms(a, a, c, False, True, 0)
    np.testing.assert_allclose(c, a @ a.transpose(0, 2, 1), rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("threads", [1, 2])
def test_product_starts_from_a_bias(dtype, threads):
    """Note [Bias first]: gemm.product with a bias gives bias + a @ b, with a strided a,
    a transposed view b (copied: its columns are not adjacent), a strided bias of
    another dtype, a bias that is a row of out itself and, on two threads, a product
    split by rows; a bias that does not fit out's columns is refused."""
    a, b = _operands((300, 70), (90, 70), dtype, strided=True)
    bias = RNG.random(180)[::2]  # float64, every second element
    want = bias + a.astype(np.float64) @ b.T.astype(np.float64)
    before = lm.get_num_threads()
    lm.set_num_threads(threads)
    try:
        gemm.ROWS_FLOPS, saved = 0, gemm.ROWS_FLOPS  # split even this small product
        out = np.full((300, 90), np.nan, dtype)
        gemm.product(a, b.T, out, bias=bias)
        gemm.product(a[:0], b.T, out[:0], bias=bias)  # no rows
        transposed = np.asfortranarray(b).T.T  # (90, 70) with column stride 90 items
        again = np.full((300, 90), np.nan, dtype)
        gemm.product(a, transposed.T, again, bias=bias)
        own = RNG.random((300, 90)).astype(dtype)
        row = own[7].astype(np.float64)
        gemm.product(a, b.T, own, bias=own[7])
        with pytest.raises(ValueError, match=r"bias \(89,\) does not fit out \(300, 90\)"):
            gemm.product(a, b.T, out, bias=bias[:89])
    finally:
        gemm.ROWS_FLOPS = saved
        lm.set_num_threads(before)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(out, want, rtol=rtol)
    np.testing.assert_allclose(again, want, rtol=rtol)
    np.testing.assert_allclose(own, row + a.astype(np.float64) @ b.T, rtol=rtol)


def _views(a, kind):
    """a (m, k) as the BLAS reads it in place (rows longer than their values), as the
    transpose of such an array, or with neither rows nor columns adjacent (copied)."""
    m, k = a.shape
    if kind == "rows":
        wide = np.zeros((m, k + 3), a.dtype)
        wide[:, 1 : k + 1] = a
        return wide[:, 1 : k + 1]
    if kind == "transposed":
        return np.ascontiguousarray(a.T).T
    sparse = np.zeros((2 * m, 2 * k), a.dtype)
    sparse[::2, ::2] = a
    return sparse[::2, ::2]


KINDS = [("rows", "rows"), ("transposed", "transposed"), ("rows", "apart"), ("apart", "transposed")]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kinds", KINDS)
@pytest.mark.parametrize("m", [1, 2, 7, 64])
def test_product_in_parallel_over_rows_equals_numpy(dtype, kinds, m, monkeypatch):
    """Note [Products in parallel]: out (a column slice of a wider array: rows longer
    than the result's) = a @ b, and + beta out, in two parts of rows however few there
    are, each operand read in place or copied; inside a split's part, one call."""
    monkeypatch.setattr(gemm, "ROWS_FLOPS", 0)
    a0, b0 = RNG.random((m, 11)).astype(dtype), RNG.random((11, 13)).astype(dtype)
    a, b = _views(a0, kinds[0]), _views(b0, kinds[1])
    want = a0.astype(np.float64) @ b0.astype(np.float64)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    before = lm.get_num_threads()
    lm.set_num_threads(2)
    try:
        wide = np.full((m, 20), 0.5, dtype)
        out = wide[:, 3:16]
        gemm.product(a, b, out)
        np.testing.assert_allclose(out, want, rtol=rtol)
        gemm.product(a, b, out, beta=1.0)
        np.testing.assert_allclose(out, 2 * want, rtol=rtol)
        assert (wide[:, :3] == 0.5).all() and (wide[:, 16:] == 0.5).all()
        parts = lm.backends.threads.split(lambda i0, i1: lm.backends.threads.parallel_parts(m), 2)
        assert lm.backends.threads.parallel_parts(m) == min(2, m) and parts == [1, 1]
    finally:
        lm.set_num_threads(before)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m, n", [(256, 40), (1, 7), (0, 5), (6, 0)])
def test_outer_products_are_one_rounded_multiplication_each(dtype, m, n):
    """Note [Outer products]: a product over one column and one row gives each output
    its correctly rounded product (for float32: the exact float64 product, rounded),
    read through strided and transposed views and written into a column slice; with
    beta or a bias it is the sum as before. NaN and infinities pass without warnings."""
    a = RNG.standard_normal((1, 2 * m)).astype(dtype)[:, ::2].T  # (m, 1), strided
    b = RNG.standard_normal((n, 1)).astype(dtype).T  # (1, n), a transpose
    if m and n:
        a[0, 0], b[0, -1] = np.inf, np.nan
    wide = np.full((m, n + 2), 0.5, dtype)
    with np.errstate(all="raise"):
        got = gemm.product(a, b, wide[:, 1 : n + 1])
    if dtype == "float32":
        want = (a.astype(np.float64) * b.astype(np.float64)).astype(dtype)
    else:
        want = np.multiply(a, b)  # one IEEE multiplication each: its own reference
    np.testing.assert_array_equal(got, want)
    assert (wide[:, 0] == 0.5).all() and (wide[:, -1] == 0.5).all()
    finite = np.ones((m, 1), dtype), np.arange(n, dtype=dtype)[None]
    out = np.full((m, n), 2.0, dtype)
    gemm.product(*finite, out, beta=1.0)
    np.testing.assert_array_equal(out, np.broadcast_to(2.0 + finite[1], (m, n)))
    biased = gemm.product(*finite, np.empty((m, n), dtype), bias=np.full(n, 3.0, dtype))
    np.testing.assert_array_equal(biased, np.broadcast_to(3.0 + finite[1], (m, n)))


@pytest.mark.parametrize("threads", [1, 2])
def test_product_reads_and_writes_any_strides_numpy_gives(threads, monkeypatch):
    """gemm.product on what the BLAS cannot take as it is: a one-row view x[None]
    (NumPy gives it row stride 0 and calls it C-contiguous: copied with C strides), an
    output with rows in reverse or overlapping an operand (NumPy's product instead);
    operands that do not fit the output are refused before any kernel."""
    monkeypatch.setattr(gemm, "ROWS_FLOPS", 0)
    before = lm.get_num_threads()
    lm.set_num_threads(threads)
    try:
        x = RNG.random(64).astype(np.float32)
        ones = np.ones((16, 1), np.float32)
        np.testing.assert_allclose(gemm.matmul(ones, x[None]), np.tile(x, (16, 1)), rtol=1e-6)
        out = RNG.random((1, 16)).astype(np.float32)
        want = out + x[None] @ np.ones((64, 16), np.float32)
        gemm.product(x[None], np.ones((64, 16), np.float32), out, beta=1.0)
        np.testing.assert_allclose(out, want, rtol=1e-5)
        a, b = RNG.random((40, 30)), RNG.random((30, 30))
        reversed_rows = np.zeros((40, 30))[::-1]
        np.testing.assert_allclose(gemm.product(a, b, reversed_rows), a @ b, rtol=1e-12)
        want = a @ b
        np.testing.assert_allclose(gemm.product(a, b, a), want, rtol=1e-12)  # in place
        with pytest.raises(ValueError, match=r"\(40, 30\) @ \(20, 30\) does not fit"):
            gemm.product(RNG.random((40, 30)), RNG.random((20, 30)), np.empty((40, 30)))
    finally:
        lm.set_num_threads(before)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kinds", KINDS)
@pytest.mark.parametrize("total", [1, 3, 8])
def test_batches_in_parallel_equal_numpy(dtype, kinds, total, monkeypatch):
    """Note [Batches in parallel]: out[i] = a[i] @ b[i] (out a channel slice of a
    wider array, as a 1x1 convolution's group writes it), and + out, with a's or b's
    one matrix shared, each operand read in place or copied, on two threads; summed,
    each part adds into its own matrix; an empty batch; operands that do not fit."""
    monkeypatch.setattr(gemm, "ROWS_FLOPS", 0)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    a0 = RNG.random((total, 7, 11)).astype(dtype)
    b0 = RNG.random((total, 11, 13)).astype(dtype)
    a = np.stack([_views(m, kinds[0]) for m in a0]) if kinds[0] != "transposed" else None
    a = np.ascontiguousarray(a0.transpose(0, 2, 1)).transpose(0, 2, 1) if a is None else a
    b = _views(b0[0], kinds[1])[None]  # shared
    before = lm.get_num_threads()
    lm.set_num_threads(2)
    try:
        wide = np.full((total, 20, 13), 0.5, dtype)
        out = wide[:, 3:10]
        gemm.batched(a, b, out)
        want = a0.astype(np.float64) @ b0[0].astype(np.float64)
        np.testing.assert_allclose(out, want, rtol=rtol)
        gemm.batched(a, b, out, beta=1.0)
        np.testing.assert_allclose(out, 2 * want, rtol=rtol)
        assert (wide[:, :3] == 0.5).all() and (wide[:, 10:] == 0.5).all()
        shared = gemm.batched(a0[:1], b0, np.empty((total, 7, 13), dtype))
        np.testing.assert_allclose(shared, a0[:1].astype(np.float64) @ b0, rtol=rtol)
        summed = gemm.summed(a0, b0, dtype)
        np.testing.assert_allclose(summed, (a0.astype(np.float64) @ b0).sum(0), rtol=rtol)
        empty = gemm.batched(a0[:0], b0[:1], np.empty((0, 7, 13), dtype))
        assert empty.shape == (0, 7, 13)
        assert gemm.summed(a0[:0], b0[:1], dtype).tolist() == np.zeros((7, 13)).tolist()
        with pytest.raises(ValueError, match=r"\(3, 7, 11\) @ \(3, 12, 13\) does not fit"):
            gemm.batched(a0[:1].repeat(3, 0), RNG.random((3, 12, 13)), np.empty((3, 7, 13)))
        with pytest.raises(ValueError, match=r"\(3, 7, 11\) @ \(2, 11, 13\) does not fit"):
            gemm.batched(a0[:1].repeat(3, 0), RNG.random((2, 11, 13)), np.empty((3, 7, 13)))
        with pytest.raises(ValueError, match="does not fit out \\(2, 7, 13\\)"):
            gemm.batched(a0[:1].repeat(3, 0), b0[:1], np.empty((2, 7, 13)))
    finally:
        lm.set_num_threads(before)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_parts_total_is_numpys_sum_over_the_parts_bit_for_bit(dtype, parts, monkeypatch):
    """gemm.parts_total: the parts' sums added in NumPy's order on two threads (so the
    same bits, but for the sign of a zero), one part given back as it is, other dtypes
    and strides by NumPy."""
    monkeypatch.setattr(lm.backends.threads, "_threshold", 0)
    sums = (RNG.standard_normal((parts, 5, 7, 3)) * 1e4).astype(dtype)
    before = lm.get_num_threads()
    lm.set_num_threads(2)
    try:
        total = gemm.parts_total(sums)
        strided = gemm.parts_total(sums[:, :, ::2])
        ints = gemm.parts_total(sums.astype(np.int64))
    finally:
        lm.set_num_threads(before)
    np.testing.assert_array_equal(total, sums.sum(axis=0))
    assert total.dtype == sums.dtype and total.shape == (5, 7, 3)
    assert np.shares_memory(total, sums) == (parts == 1)
    np.testing.assert_array_equal(strided, sums[:, :, ::2].sum(axis=0))
    np.testing.assert_array_equal(ints, sums.astype(np.int64).sum(axis=0))
