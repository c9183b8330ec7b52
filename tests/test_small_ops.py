"""sort, argsort and nll_loss on the small tensors their fast paths serve, against
NumPy (stable order with ties and NaN, every axis, views) and float64 sums."""

import numpy as np
import pytest

import lamina as lm
import lamina.nn.functional as F
from lamina.backends import threads

_SHAPES = [(7,), (3, 0), (4, 5, 6)]


def _views(a):
    """The array, its transpose and a strided slice (both non-contiguous)."""
    return [a, a.T, a[..., ::2]]


@pytest.mark.parametrize("shape", _SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_sort_argsort_match_numpy_stable(shape, dtype):
    a = np.random.default_rng(0).integers(0, 3, shape).astype(dtype)  # many ties
    if a.size and dtype == np.float32:
        a.flat[::4] = np.nan  # NaN sorts last
    for view in _views(a):
        for axis in range(-view.ndim, view.ndim):
            t = lm.asarray(view)
            values = np.asarray(lm.sort(t, axis=axis))
            order = np.asarray(lm.argsort(t, axis=axis))
            assert order.dtype == np.int64
            np.testing.assert_array_equal(values, np.sort(view, axis=axis, kind="stable"))
            np.testing.assert_array_equal(order, np.argsort(view, axis=axis, kind="stable"))


def test_descending_stays_stable():
    a = np.array([[1.0, 3.0, 1.0, np.nan, 3.0]], np.float32)
    np.testing.assert_array_equal(
        np.asarray(lm.argsort(lm.asarray(a), descending=True)), [[3, 1, 4, 0, 2]]
    )
    np.testing.assert_array_equal(
        np.asarray(lm.sort(lm.asarray(a), descending=True)), [[np.nan, 3, 3, 1, 1]]
    )


def test_sort_argsort_rows_split_over_threads():
    """From the parallel threshold on, two threads sort blocks of rows (Note [Parallel
    sorts]); the result is the same stable order, NaN last."""
    a = np.random.default_rng(3).integers(0, 40, (301, 500)).astype(np.float32)
    a[::3, ::7] = np.nan
    before = lm.get_num_threads()
    lm.set_num_threads(2)
    try:
        assert a.size >= threads.PARALLEL_ELEMENTS
        t = lm.asarray(a)
        np.testing.assert_array_equal(np.asarray(lm.sort(t)), np.sort(a, kind="stable"))
        np.testing.assert_array_equal(np.asarray(lm.argsort(t)), np.argsort(a, kind="stable"))
    finally:
        lm.set_num_threads(before)


def _nll_reference(x, t, weight, ignore_index, reduction):
    """nll_loss in float64 NumPy: -x[n, t[n], ...] * weight[t[n]], ignored targets 0."""
    x64 = np.moveaxis(x.astype(np.float64), 1, -1).reshape(-1, x.shape[1])
    flat_t = t.reshape(-1)
    w = np.ones(x.shape[1]) if weight is None else weight.astype(np.float64)
    kept = flat_t != ignore_index
    safe = np.where(kept, flat_t, 0)
    wt = np.where(kept, w[safe], 0.0)
    losses = -x64[np.arange(flat_t.size), safe] * wt
    if reduction == "none":
        return losses.reshape(t.shape)
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / wt.sum() if wt.sum() else np.nan  # all ignored: NaN, as PyTorch


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(5, 4), (0, 3), (3, 4, 2)])
def test_nll_loss_matches_float64(shape, reduction):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    t = rng.integers(0, shape[1], shape[:1] + shape[2:])
    t.reshape(-1)[::3] = 2  # some ignored
    weight = rng.uniform(0.5, 1.5, shape[1]).astype(np.float32)
    for w in (None, weight):
        got = F.nll_loss(
            lm.asarray(x),
            lm.asarray(t),
            None if w is None else lm.asarray(w),
            ignore_index=2,
            reduction=reduction,
        )
        want = _nll_reference(x, t, w, 2, reduction)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)
        assert np.asarray(got).dtype == np.float32


def test_nll_loss_views_and_unbatched():
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    t = np.array([3, 0, 2, 1, 3, 0, 0, 1, 2, 2, 1, 3])
    got = F.nll_loss(lm.asarray(x).T, lm.asarray(t)[::2], reduction="none")  # views
    np.testing.assert_allclose(np.asarray(got), _nll_reference(x.T, t[::2], None, -100, "none"))
    one = F.nll_loss(lm.asarray(x[0]), lm.asarray(np.array(3)), reduction="none")
    assert np.asarray(one).shape == () and np.asarray(one) == -x[0, 3]


def test_nll_loss_bad_class_index_names_it():
    x = lm.asarray(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"class indices in \[0, 3\).*got 3"):
        F.nll_loss(x, lm.asarray(np.array([0, 3])))
    with pytest.raises(ValueError, match="got -1"):
        F.nll_loss(x, lm.asarray(np.array([-1, 0])))
    with pytest.raises(ValueError, match="target must have shape"):
        F.nll_loss(x, lm.asarray(np.array([0, 1, 2])))
