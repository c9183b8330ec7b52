"""Manipulation functions, views, indexing and setitem.

Views must share storage with their base: writing through a view (setitem on a slice,
a transposed, reshaped, flipped or split view) changes the base tensor. concat and
stack compile a Numba copy kernel per dtype, so only a few dtypes go through them.
"""

import functools

import numpy as np
import pytest

import lamina as lm


def ref(fn, *args, **kwargs):
    """``fn`` computed by the numpy_ref backend."""
    with lm.backends.use("numpy_ref"):
        return fn(*args, **kwargs)


def base(shape=(2, 3, 4), dtype=np.float64):
    return np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)


def assert_equal(got, want, dtype=None):
    assert isinstance(got, lm.Tensor)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if dtype is not None:
        assert got.dtype == dtype, (got.dtype, dtype)
    np.testing.assert_array_equal(got.numpy(), want)


def shares(a, b):
    return np.shares_memory(a.numpy(), b.numpy())


# ---------------------------------------------------------------- reshape


def test_reshape_values_and_shapes():
    n = base()
    x = lm.asarray(n)
    for shape in [(6, 4), (-1,), (4, -1), (2, -1, 3), 24, [3, 8], (1, 24, 1)]:
        got = lm.reshape(x, shape)
        assert_equal(got, n.reshape(shape), lm.float64)
    assert lm.reshape(lm.asarray(3.0), (1, 1)).shape == (1, 1)
    assert lm.reshape(lm.ones((1, 1)), ()).shape == ()
    assert lm.reshape(lm.zeros((0, 3)), (3, 0)).shape == (3, 0)
    assert lm.reshape(lm.zeros((0, 3)), (-1,)).shape == (0,)


def test_reshape_is_a_view_when_possible():
    x = lm.asarray(base())
    v = lm.reshape(x, (-1,))
    assert shares(v, x)
    v[5] = -1.0
    assert x.numpy()[0, 1, 1] == -1.0
    w = lm.reshape(x, (4, 6), copy=False)
    w[3, 5] = -2.0
    assert x.numpy()[1, 2, 3] == -2.0


def test_reshape_copy_semantics():
    x = lm.asarray(base((3, 4)))
    c = lm.reshape(x, (12,), copy=True)
    assert not shares(c, x)
    c[0] = 100.0
    assert x.numpy()[0, 0] == 0.0
    t = x.mT  # not contiguous: a flat reshape needs a copy
    assert_equal(lm.reshape(t, (12,)), base((3, 4)).T.reshape(12))
    assert not shares(lm.reshape(t, (12,)), x)
    with pytest.raises(
        ValueError,
        match=r"reshape: cannot reshape .*\(4, 3\).* without "
        r"copying \(copy=False\)",
    ):
        lm.reshape(t, (12,), copy=False)
    # a reshape that only splits a dim of the transposed view is still a view
    assert shares(lm.reshape(t, (2, 2, 3), copy=False), x)


def test_reshape_errors():
    x = lm.zeros((3, 4))
    with pytest.raises(
        ValueError,
        match=r"reshape: cannot reshape a tensor of shape \(3, 4\) "
        r"\(size 12\) to \(5,\) \(size 5\)",
    ):
        lm.reshape(x, (5,))
    with pytest.raises(ValueError, match=r"shape \(3, 4\).*to \(-1, 5\)"):
        lm.reshape(x, (-1, 5))
    with pytest.raises(ValueError, match="at most one -1"):
        lm.reshape(x, (-1, -1))
    with pytest.raises(ValueError, match="no other negatives"):
        lm.reshape(x, (-2, -6))
    with pytest.raises(TypeError, match=r"reshape: shape must be a tuple of ints, got \(2.0, 6\)"):
        lm.reshape(x, (2.0, 6))
    with pytest.raises(TypeError, match="reshape: x must be a tensor, got ndarray"):
        lm.reshape(np.zeros(4), (2, 2))


# ---------------------------------------------------------------- permute, transpose


def test_permute_dims():
    n = base()
    x = lm.asarray(n)
    for axes in [(2, 0, 1), (0, 1, 2), (-1, 0, 1), [1, 2, 0]]:
        got = lm.permute_dims(x, axes)
        assert_equal(got, np.transpose(n, axes))
        assert shares(got, x)
    p = lm.permute_dims(x, (2, 1, 0))
    p[3, 2, 1] = -5.0
    assert x.numpy()[1, 2, 3] == -5.0


def test_permute_dims_errors():
    x = lm.zeros((2, 3, 4))
    with pytest.raises(
        ValueError,
        match=r"permute_dims: axes \(0, 0, 1\) are not a "
        r"permutation of 0..2",
    ):
        lm.permute_dims(x, (0, 0, 1))
    with pytest.raises(ValueError, match="not a permutation"):
        lm.permute_dims(x, (0, 1))
    with pytest.raises(lm.AxisError, match="permute_dims: axis 3 is out of bounds"):
        lm.permute_dims(x, (0, 1, 3))
    with pytest.raises(TypeError, match="permute_dims: axes must be a tuple of ints"):
        lm.permute_dims(x, 1)
    with pytest.raises(TypeError, match="axis must be an int, got float"):
        lm.permute_dims(x, (0, 1, 2.0))


def test_matrix_transpose_mT_and_T():
    n = base()
    x = lm.asarray(n)
    for t in (lm.matrix_transpose(x), x.mT):
        assert_equal(t, np.swapaxes(n, -1, -2))
        assert shares(t, x)
    m = lm.asarray(base((3, 4)))
    assert_equal(m.T, base((3, 4)).T)
    assert_equal(m.mT, base((3, 4)).T)
    t = x.mT
    t[1, 3, 0] = 42.0  # writes through to x[1, 0, 3]
    assert x.numpy()[1, 0, 3] == 42.0
    with pytest.raises(ValueError, match=r"\.T needs a 2-D tensor, got 3-D"):
        _ = x.T
    with pytest.raises(ValueError, match=r"\.T needs a 2-D tensor, got 0-D"):
        _ = lm.asarray(1.0).T
    with pytest.raises(
        ValueError,
        match=r"matrix_transpose: needs at least 2 dimensions, "
        r"got shape \(4,\)",
    ):
        lm.matrix_transpose(lm.zeros(4))
    with pytest.raises(ValueError, match=r"\.mT needs at least 2 dimensions, got shape \(4,\)"):
        _ = lm.zeros(4).mT
    with pytest.raises(TypeError, match="matrix_transpose: x must be a tensor"):
        lm.matrix_transpose([[1, 2]])


# ---------------------------------------------------------------- expand, squeeze, flip


def test_expand_dims():
    n = base((3, 4))
    x = lm.asarray(n)
    for axis in (0, 1, 2, -1, -2, -3):
        got = lm.expand_dims(x, axis=axis)
        assert_equal(got, np.expand_dims(n, axis))
        assert shares(got, x)
    assert lm.expand_dims(lm.asarray(1.0), 0).shape == (1,)
    with pytest.raises(
        lm.AxisError, match="expand_dims: axis 3 is out of bounds for a tensor of dimension 3"
    ):
        lm.expand_dims(x, axis=3)
    with pytest.raises(lm.AxisError, match="axis -4"):
        lm.expand_dims(x, axis=-4)
    with pytest.raises(TypeError, match="expand_dims: axis must be an int, got tuple"):
        lm.expand_dims(x, axis=(0, 1))


def test_squeeze():
    n = base((1, 3, 1, 2))
    x = lm.asarray(n)
    for axis in (0, 2, -2, (0, 2), (2, -4)):
        got = lm.squeeze(x, axis)
        assert_equal(got, np.squeeze(n, axis))
        assert shares(got, x)
    assert lm.squeeze(lm.ones((1,)), 0).shape == ()
    with pytest.raises(
        ValueError,
        match=r"squeeze: axis 1 has size 3, not 1 \(shape "
        r"\(1, 3, 1, 2\)\)",
    ):
        lm.squeeze(x, 1)
    with pytest.raises(lm.AxisError, match="squeeze: axis 4 is out of bounds"):
        lm.squeeze(x, 4)
    with pytest.raises(TypeError, match="axis"):
        lm.squeeze(x)  # axis is required (Array API)


def test_flip():
    n = base()
    x = lm.asarray(n)
    for axis in (None, 0, -1, (0, 2), (1,)):
        got = lm.flip(x, axis=axis)
        assert_equal(got, np.flip(n, axis))
        assert shares(got, x)
    f = lm.flip(x, axis=2)
    f[0, 0, 0] = -9.0  # the last element of x's first row
    assert x.numpy()[0, 0, 3] == -9.0
    assert_equal(lm.flip(lm.flip(x)), n)
    with pytest.raises(lm.AxisError, match="flip: axis 3 is out of bounds"):
        lm.flip(x, axis=3)
    with pytest.raises(ValueError, match=r"flip: repeated axis"):
        lm.flip(x, axis=(0, -3))


# ---------------------------------------------------------------- broadcasting


def test_broadcast_to():
    n = np.array([1.0, 2.0, 3.0])
    x = lm.asarray(n)
    for shape in [(3,), (2, 3), (4, 1, 3), 3]:
        got = lm.broadcast_to(x, shape)
        assert_equal(got, np.broadcast_to(n, shape))
        assert shares(got, x)
    col = lm.asarray(np.array([[1], [2]]))
    assert_equal(lm.broadcast_to(col, (2, 5)), np.broadcast_to([[1], [2]], (2, 5)), lm.int64)
    assert lm.broadcast_to(lm.asarray(7), (2, 0)).shape == (2, 0)


def test_broadcast_to_errors():
    x = lm.asarray([1.0, 2.0, 3.0])
    with pytest.raises(
        ValueError,
        match=r"broadcast_to: cannot broadcast shape \(3,\) to "
        r"\(2, 4\)",
    ):
        lm.broadcast_to(x, (2, 4))
    with pytest.raises(ValueError, match=r"cannot broadcast shape \(2, 3\) to \(3,\)"):
        lm.broadcast_to(lm.zeros((2, 3)), (3,))
    with pytest.raises(TypeError, match="broadcast_to: shape must be a tuple of ints"):
        lm.broadcast_to(x, (2.5, 3))


def test_broadcast_to_views_are_read_only():
    x = lm.asarray([1.0, 2.0, 3.0])
    b = lm.broadcast_to(x, (2, 3))
    with pytest.raises(ValueError, match="setitem: the tensor is a read-only view"):
        b[0, 0] = 5.0
    with pytest.raises(ValueError, match="read-only view"):
        b[...] = lm.zeros((2, 3))
    with pytest.raises(ValueError, match=r"add_?: the target tensor is a read-only view"):
        b += 1.0
    assert x.tolist() == [1.0, 2.0, 3.0]  # nothing was written
    x[0] = 9.0  # the base stays writable, and the view sees the change
    assert b.numpy()[1, 0] == 9.0


def test_broadcast_arrays():
    a, b, c = lm.zeros((2, 1)), lm.ones((3,), dtype=lm.int8), lm.asarray(True)
    out = lm.broadcast_arrays(a, b, c)
    assert isinstance(out, list) and [t.shape for t in out] == [(2, 3)] * 3
    assert [t.dtype for t in out] == [lm.get_default_dtype(), lm.int8, lm.bool]  # unchanged
    assert shares(out[0], a) and shares(out[1], b)
    assert lm.broadcast_arrays() == []
    assert_equal(lm.broadcast_arrays(lm.asarray([1, 2]))[0], [1, 2])
    with pytest.raises(
        ValueError,
        match=r"broadcast_arrays: shapes \(2, 1\) and \(3,\) and "
        r"\(4, 1\) cannot be broadcast together",
    ):
        lm.broadcast_arrays(a, b, lm.zeros((4, 1)))
    with pytest.raises(
        TypeError, match=r"broadcast_arrays: arrays\[1\] must be a tensor, got list"
    ):
        lm.broadcast_arrays(a, [1, 2, 3])


# ---------------------------------------------------------------- concat and stack


def test_concat_axes():
    a, b = base((2, 3)), base((1, 3)) + 100
    x, y = lm.asarray(a), lm.asarray(b)
    assert_equal(lm.concat([x, y]), np.concatenate([a, b]), lm.float64)
    assert_equal(lm.concat((x, y), axis=-2), np.concatenate([a, b]))
    c = base((2, 2)) - 50
    assert_equal(lm.concat([x, lm.asarray(c)], axis=1), np.concatenate([a, c], axis=1))
    assert_equal(lm.concat([x, lm.asarray(c)], axis=-1), np.concatenate([a, c], axis=1))
    # axis=None flattens first, so the shapes need not agree
    assert_equal(
        lm.concat([x, lm.asarray(c), lm.asarray([7.0])], axis=None),
        np.concatenate([a.ravel(), c.ravel(), [7.0]]),
    )
    one = lm.concat([x])
    assert_equal(one, a)
    assert not shares(one, x)  # concat always makes a new tensor
    # empty pieces
    assert_equal(lm.concat([x, lm.zeros((0, 3)), y]), np.concatenate([a, b]))
    same = ref(lm.concat, [x, y])
    np.testing.assert_array_equal(same.numpy(), lm.concat([x, y]).numpy())


def test_concat_strided_inputs():
    n = base((3, 4))
    x = lm.asarray(n)
    pieces = [x.mT, lm.flip(x.mT, axis=0), x.mT[::-1, ::2], lm.broadcast_to(x[0:1, 0:1], (4, 2))]
    want = np.concatenate(
        [n.T, n.T[::-1], n.T[::-1, ::2], np.broadcast_to(n[0:1, 0:1], (4, 2))], axis=1
    )
    got = lm.concat(pieces, axis=1)
    assert_equal(got, want)
    np.testing.assert_array_equal(ref(lm.concat, pieces, axis=1).numpy(), want)


@pytest.mark.parametrize(
    "dtypes,result",
    [
        ((lm.int8, lm.uint8), lm.int16),
        ((lm.bool, lm.int64), lm.int64),
        ((lm.int8, lm.float64), lm.float64),
        ((lm.float64, lm.float64, lm.bool), lm.float64),
    ],
    ids=["int8+uint8", "bool+int64", "int8+float64", "f64+f64+bool"],
)
def test_concat_and_stack_promote_dtypes(dtypes, result):
    arrays = [np.array([1, 0, 3]).astype(d.np) for d in dtypes]
    tensors = [lm.asarray(a) for a in arrays]
    got = lm.concat(tensors)
    assert_equal(got, np.concatenate([a.astype(result.np) for a in arrays]), result)
    assert ref(lm.concat, tensors).dtype == result
    s = lm.stack(tensors, axis=1)
    assert_equal(s, np.stack([a.astype(result.np) for a in arrays], axis=1), result)
    assert ref(lm.stack, tensors, axis=1).dtype == result


def test_concat_errors():
    x = lm.zeros((2, 3))
    with pytest.raises(
        ValueError,
        match=r"concat: all tensors must have the same shape except "
        r"on axis 0; got \(2, 3\), \(1, 4\)",
    ):
        lm.concat([x, lm.zeros((1, 4))])
    with pytest.raises(ValueError, match=r"\(2, 3\), \(3,\)"):
        lm.concat([x, lm.zeros(3)])
    # the description checks the shapes, for every backend and device alike
    for other in (lm.zeros((1, 4)), lm.zeros((1, 4), device="meta")):
        for join in (lm.concat, functools.partial(ref, lm.concat)):
            with pytest.raises(ValueError, match=r"same shape except on axis 0; got \(2, 3\)"):
                join([x.to(other.device), other])
    with pytest.raises(ValueError, match="concat: zero-dimensional tensors cannot be concat"):
        lm.concat([lm.asarray(1.0), lm.asarray(2.0)])
    with pytest.raises(ValueError, match="concat: arrays needs at least one tensor"):
        lm.concat([])
    with pytest.raises(TypeError, match=r"concat: arrays\[1\] must be a tensor, got list"):
        lm.concat([x, [[1.0, 2.0, 3.0]]])
    with pytest.raises(lm.AxisError, match="concat: axis 2 is out of bounds"):
        lm.concat([x, x], axis=2)


def test_stack():
    a, b = base((2, 3)), base((2, 3)) * -1
    x, y = lm.asarray(a), lm.asarray(b)
    for axis in (0, 1, 2, -1, -3):
        assert_equal(lm.stack([x, y], axis=axis), np.stack([a, b], axis=axis))
        np.testing.assert_array_equal(
            ref(lm.stack, [x, y], axis=axis).numpy(), np.stack([a, b], axis=axis)
        )
    assert_equal(lm.stack([lm.asarray(1.0), lm.asarray(2.0)]), [1.0, 2.0])
    assert_equal(lm.stack((x.mT, lm.flip(y.mT))), np.stack([a.T, b.T[::-1, ::-1]]))
    with pytest.raises(
        ValueError,
        match=r"stack: all tensors must have the same shape; got "
        r"\(2, 3\), \(3, 2\)",
    ):
        lm.stack([x, x.mT])
    with pytest.raises(ValueError, match=r"stack: all tensors must have the same shape"):
        lm.stack([x.to("meta"), x.mT.to("meta")])
    with pytest.raises(lm.AxisError, match="stack: axis 3 is out of bounds"):
        lm.stack([x, y], axis=3)
    with pytest.raises(ValueError, match="stack: arrays needs at least one tensor"):
        lm.stack([])


# ---------------------------------------------------------------- split and unstack


def test_split_by_chunk_size():
    n = base((7, 2))
    x = lm.asarray(n)
    parts = lm.split(x, 3)
    assert isinstance(parts, tuple) and [p.shape for p in parts] == [(3, 2), (3, 2), (1, 2)]
    for p, want in zip(parts, (n[:3], n[3:6], n[6:])):
        assert_equal(p, want)
        assert shares(p, x)
    assert [p.shape for p in lm.split(x, 10)] == [(7, 2)]
    assert [p.shape for p in lm.split(x, 1, axis=-1)] == [(7, 1), (7, 1)]
    assert [p.shape for p in lm.split(lm.zeros((2, 7)), 4, axis=1)] == [(2, 4), (2, 3)]


def test_split_by_sections():
    n = base((2, 7))
    x = lm.asarray(n)
    parts = lm.split(x, [2, 0, 5], axis=1)
    assert [p.shape for p in parts] == [(2, 2), (2, 0), (2, 5)]
    assert_equal(parts[0], n[:, :2])
    assert_equal(parts[2], n[:, 2:])
    assert [p.shape for p in lm.split(x, (7,), axis=1)] == [(2, 7)]


def test_split_returns_writable_views():
    x = lm.asarray(base((6,)))
    a, b = lm.split(x, [2, 4])
    b[0] = -1.0
    a[...] = 0.0
    assert x.tolist() == [0.0, 0.0, -1.0, 3.0, 4.0, 5.0]


def test_split_errors():
    x = lm.zeros((7, 2))
    with pytest.raises(
        ValueError,
        match=r"split: sections \[2, 4\] sum to 6, but axis 0 has "
        r"size 7",
    ):
        lm.split(x, [2, 4])
    with pytest.raises(ValueError, match="split: split_size must be positive, got 0"):
        lm.split(x, 0)
    with pytest.raises(
        ValueError,
        match=r"split: section sizes must be non-negative, got "
        r"\[-1, 8\]",
    ):
        lm.split(x, [-1, 8])
    with pytest.raises(
        TypeError,
        match="split: split_size_or_sections must be an int or a sequence of ints, got 2.0",
    ):
        lm.split(x, 2.0)
    with pytest.raises(lm.AxisError, match="split: axis 2 is out of bounds"):
        lm.split(x, 1, axis=2)
    with pytest.raises(TypeError, match="split: x must be a tensor, got list"):
        lm.split([1, 2], 1)


def test_unstack():
    n = base((2, 3, 4))
    x = lm.asarray(n)
    for axis in (0, 1, 2, -1):
        parts = lm.unstack(x, axis=axis)
        assert isinstance(parts, tuple) and len(parts) == n.shape[axis]
        for i, p in enumerate(parts):
            assert_equal(p, np.take(n, i, axis=axis))
            assert shares(p, x)
    parts = lm.unstack(x, axis=1)
    parts[2][...] = -3.0
    assert (x.numpy()[:, 2] == -3.0).all()
    with pytest.raises(
        lm.AxisError, match="unstack: axis 0 is out of bounds for a tensor of dimension 0"
    ):
        lm.unstack(lm.asarray(1.0))
    with pytest.raises(TypeError, match="unstack: x must be a tensor, got list"):
        lm.unstack([1, 2])


# ---------------------------------------------------------------- getitem


KEYS = [
    1,
    -1,
    (1, 2),
    (1, 2, 3),
    (-1, -2, -3),
    slice(None),
    slice(1, None),
    slice(None, None, 2),
    (slice(None), slice(None, None, 2)),
    (slice(None), slice(1, None, 2), slice(None, 3, 2)),
    slice(None, None, -1),
    (slice(None), slice(None, None, -2)),
    (Ellipsis, slice(3, 0, -2)),
    (slice(5, None),),  # an empty slice
    Ellipsis,
    (Ellipsis, 1),
    (0, Ellipsis),
    (0, Ellipsis, 1),
    None,
    (None, 0),
    (Ellipsis, None),
    (None, slice(None), None, 1),
    (),
]


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_basic_indexing_gives_views(key):
    n = base()
    x = lm.asarray(n)
    got = x[key]
    assert isinstance(got, lm.Tensor)
    assert_equal(got, n[key], lm.float64)
    if got.size:
        assert shares(got, x)


def test_integer_indexing_gives_0d_tensors():
    x = lm.asarray(base())
    s = x[1, 2, 3]
    assert isinstance(s, lm.Tensor) and s.shape == () and s.item() == 23.0
    assert x[-1, -1, -1].item() == 23.0
    assert lm.asarray(3.0)[()].item() == 3.0
    assert lm.asarray(3.0)[...].shape == ()
    # the 0-d result is a view (as in PyTorch), not a detached scalar copy
    s[...] = -4.0
    assert x.numpy()[1, 2, 3] == -4.0
    r = x[0][1]
    r[2] = 8.0
    assert x.numpy()[0, 1, 2] == 8.0


def test_advanced_indexing():
    n = base()
    x = lm.asarray(n)
    mask = n > 10
    got = x[lm.asarray(mask)]
    assert_equal(got, n[mask])
    assert not shares(got, x)  # advanced indexing copies, as in NumPy
    assert_equal(x[x > 10], n[mask])  # a comparison result as the mask
    assert_equal(x[lm.asarray([True, False])], n[np.array([True, False])])
    assert_equal(x[:, lm.asarray([False, True, True])], n[:, [False, True, True]])
    idx = lm.asarray([1, 0, 1])
    assert_equal(x[idx], n[[1, 0, 1]])
    assert_equal(x[:, lm.asarray([2, -1])], n[:, [2, -1]])
    assert_equal(x[lm.asarray([0, 1]), lm.asarray([2, 1])], n[[0, 1], [2, 1]])
    assert_equal(x[lm.asarray(np.array([[0], [1]], np.int32)), 0], n[[[0], [1]], 0])
    assert_equal(x[lm.asarray(1)], n[1])  # a 0-d integer tensor is an integer
    assert_equal(x[[0, 1]], n[[0, 1]])  # lists work as in NumPy
    assert_equal(x[..., lm.asarray([3, 0])], n[..., [3, 0]])


def test_indexing_errors():
    x = lm.asarray(base())
    with pytest.raises(IndexError, match="index 2 is out of bounds for axis 0 with size 2"):
        x[2]
    with pytest.raises(IndexError, match="index -4 is out of bounds for axis 1"):
        x[0, -4]
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 0, 0, 0]
    with pytest.raises(IndexError, match="too many indices"):
        lm.asarray(1.0)[0]
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., ...]
    with pytest.raises(IndexError, match="integer"):
        x[lm.asarray([1.0])]  # float tensors are no index
    with pytest.raises(IndexError, match="only integers, slices"):
        x[1.0]
    with pytest.raises(IndexError, match="only integers, slices"):
        x["a"]
    with pytest.raises(
        IndexError,
        match=r"boolean index did not match .* size of axis is 2 "
        r"but size of corresponding boolean axis is 3",
    ):
        x[lm.asarray([True, False, True])]
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        x[lm.asarray([5])]


def test_len_and_iteration():
    n = base((3, 2))
    x = lm.asarray(n)
    assert len(x) == 3
    rows = list(x)
    assert len(rows) == 3 and all(shares(r, x) for r in rows)
    for r, want in zip(rows, n):
        assert_equal(r, want)
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(lm.asarray(1.0))
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        iter(lm.asarray(1.0))


# ---------------------------------------------------------------- setitem


def test_setitem_scalars():
    x = lm.zeros((2, 3))
    x[0, 1] = 5.0
    x[1] = 2  # an int into a float tensor
    x[:, 2] = True  # a bool too
    assert x.tolist() == [[0.0, 5.0, 1.0], [2.0, 2.0, 1.0]]
    x[...] = -1.5
    assert x.tolist() == [[-1.5] * 3] * 2
    i8 = lm.zeros(3, dtype=lm.int8)
    i8[0] = 127
    i8[1] = -128
    i8[2] = np.int64(7)  # NumPy scalars are scalars
    assert i8.tolist() == [127, -128, 7] and i8.dtype == lm.int8
    f32 = lm.zeros(2, dtype=lm.float32)
    f32[0] = 0.1
    assert f32.numpy()[0] == np.float32(0.1) and f32.dtype == lm.float32
    b = lm.zeros(2, dtype=lm.bool)
    b[1] = True
    assert b.tolist() == [False, True]


def test_setitem_tensors_with_broadcasting():
    n = base()
    x = lm.asarray(n.copy())
    x[:, 0] = lm.asarray([1.0, 2.0, 3.0, 4.0])
    n[:, 0] = [1.0, 2.0, 3.0, 4.0]
    x[1] = lm.asarray([[7.0], [8.0], [9.0]])
    n[1] = [[7.0], [8.0], [9.0]]
    x[..., ::-2] = lm.asarray(np.array([-1, -2], np.int32))  # int32 into float64: allowed
    n[..., ::-2] = [-1, -2]
    x[0, 0, 0] = lm.asarray(0.5)
    n[0, 0, 0] = 0.5
    np.testing.assert_array_equal(x.numpy(), n)
    u = lm.zeros(3, dtype=lm.int16)
    u[:2] = lm.asarray(np.array([200, 3], np.uint8))  # uint8 fits in int16
    assert u.tolist() == [200, 3, 0]


def test_setitem_with_masks_and_integer_tensors():
    x = lm.asarray([1.0, 2.0, 3.0, 4.0])
    x[lm.asarray([False, True, False, True])] = 0.0
    assert x.tolist() == [1.0, 0.0, 3.0, 0.0]
    x[lm.asarray([0, 2])] = lm.asarray([7.0, 8.0])
    assert x.tolist() == [7.0, 0.0, 8.0, 0.0]
    x[x > 5] = lm.asarray([-1.0, -2.0])
    assert x.tolist() == [-1.0, 0.0, -2.0, 0.0]


def test_setitem_overlapping_source():
    x = lm.asarray(np.arange(5.0))
    x[1:] = x[:-1]  # the source is a view of the target: NumPy semantics (no smearing)
    assert x.tolist() == [0.0, 0.0, 1.0, 2.0, 3.0]
    y = lm.asarray(np.arange(6.0))
    y[::-1] = y
    assert y.tolist() == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]


def test_setitem_through_views_changes_the_base():
    n = base()
    x = lm.asarray(n.copy())
    v = x[1]  # slice view
    v[...] = -1.0
    assert (x.numpy()[1] == -1.0).all() and (x.numpy()[0] == n[0]).all()
    x = lm.asarray(n.copy())
    t = lm.permute_dims(x, (2, 0, 1))
    t[3, 0, 2] = 99.0
    assert x.numpy()[0, 2, 3] == 99.0
    r = lm.reshape(x, (6, 4))
    r[5] = lm.asarray([1.0, 2.0, 3.0, 4.0])
    assert x.numpy()[1, 2].tolist() == [1.0, 2.0, 3.0, 4.0]
    s = x[:, ::2, ::-1]
    s[0, 1, 0] = 1234.0  # x[0, 2, 3]
    assert x.numpy()[0, 2, 3] == 1234.0
    e = lm.expand_dims(x, axis=0)
    e[0, 0, 0, 0] = -7.0
    assert x.numpy()[0, 0, 0] == -7.0
    # a view of a view of a view: w[0, b, c] is x.mT[0, b, c], which is x[0, c, b]
    w = lm.flip(x.mT, axis=0)[1:]
    w[0, 1, 2] = 55.0
    assert x.numpy()[0, 2, 1] == 55.0


def test_setitem_errors():
    i = lm.asarray([1, 2, 3])
    with pytest.raises(
        TypeError, match="setitem: cannot store lamina.float64 values into a lamina.int64 tensor"
    ):
        i[0] = 1.5
    with pytest.raises(
        TypeError, match=f"cannot store {lm.get_default_dtype()} values into a lamina.int64"
    ):
        i[:1] = lm.asarray([1.5])  # the default float
    with pytest.raises(TypeError, match="cannot store lamina.int64 values into a lamina.bool"):
        lm.zeros(2, dtype=lm.bool)[0] = lm.asarray(1)
    with pytest.raises(TypeError, match="cannot store lamina.int64 values into a lamina.int8"):
        lm.zeros(2, dtype=lm.int8)[0] = lm.asarray(3)  # int64 does not fit int8
    with pytest.raises(
        OverflowError,
        match=r"Python integer 300 is out of bounds for "
        r"lamina.int8 \[-128, 127\]",
    ):
        lm.zeros(2, dtype=lm.int8)[0] = 300
    with pytest.raises(OverflowError, match="-1 is out of bounds for lamina.uint8"):
        lm.zeros(2, dtype=lm.uint8)[0] = -1
    with pytest.raises(
        TypeError, match="setitem: the value must be a tensor or a Python scalar, got str"
    ):
        i[0] = "a"
    with pytest.raises(TypeError, match="got list"):
        i[0] = [1]
    x = lm.zeros((2, 3, 4))
    with pytest.raises(
        ValueError,
        match=r"setitem: cannot store a value of shape \(3,\) into "
        r"a selection of a tensor of shape \(2, 3, 4\)",
    ):
        x[:, 0] = lm.asarray([1.0, 2.0, 3.0])
    with pytest.raises(
        ValueError,
        match=r"setitem: .*shape \(3,\).*cannot assign 3 input "
        r"values to the 2 output values",
    ):
        lm.asarray([0.0, 0.0, 0.0])[lm.asarray([True, False, True])] = lm.asarray([5.0, 6.0, 7.0])
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        x[5] = 1.0
    assert (x.numpy() == 0).all()  # failed stores left no trace


def test_unstack_of_an_empty_axis_is_empty():
    assert lm.unstack(lm.zeros((0, 3)), axis=0) == ()
    assert len(lm.unstack(lm.zeros((2, 0)), axis=0)) == 2
