"""Linear algebra (matmul, tensordot, vecdot), creation functions, dtype introspection
and the Tensor's conversion protocol (repr, device, numpy, __array__, DLPack, scalars).

Integer matmul compiles a Numba kernel per dtype (floats use BLAS), so only a few
integer dtypes are exercised.
"""

import pickle

import numpy as np
import pytest

import lamina as lm

RNG = np.random.default_rng(99)


def ref(fn, *args, **kwargs):
    """``fn`` computed by the numpy_ref backend."""
    with lm.backends.use("numpy_ref"):
        return fn(*args, **kwargs)


def assert_tensor(got, want, dtype, rtol=1e-12):
    assert isinstance(got, lm.Tensor)
    want = np.asarray(want)
    assert got.dtype == dtype, (got.dtype, dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.numpy().dtype == dtype.np
    if dtype.kind == "f":
        np.testing.assert_allclose(got.numpy(), want, rtol=rtol, atol=1e-12)
    else:
        np.testing.assert_array_equal(got.numpy(), want)


def ints(shape, dtype, low=-5, high=6):
    low = 0 if np.dtype(dtype).kind == "u" else low
    return RNG.integers(low, high, shape).astype(dtype)


def default():
    """The default floating dtype (Note [Default dtype]), read at call time: float32
    unless lm.set_default_dtype changed it."""
    return lm.get_default_dtype()


# ---------------------------------------------------------------- matmul

MATMUL_SHAPES = [
    ((3,), (3,)),  # 1-D @ 1-D: a 0-d result
    ((3,), (3, 4)),
    ((2, 3), (3,)),
    ((2, 3), (3, 4)),
    ((5, 1, 2, 3), (4, 3, 2)),  # batch dims broadcast
    ((3,), (2, 3, 4)),
    ((2, 2, 3), (3,)),
    ((1, 3), (6, 3, 1)),
]


@pytest.mark.parametrize(
    "dtype", [lm.float64, lm.float32, lm.int64, lm.int8, lm.uint16], ids=lambda d: d.name
)
def test_matmul_shapes_and_dtypes(dtype):
    rtol = 1e-5 if dtype is lm.float32 else 1e-12
    for sa, sb in MATMUL_SHAPES:
        a, b = ints(sa, dtype.np, -3, 4), ints(sb, dtype.np, -3, 4)
        x, y = lm.asarray(a), lm.asarray(b)
        want = np.matmul(a, b)
        for got in (lm.matmul(x, y), x @ y):
            assert_tensor(got, want, dtype, rtol)
        r = ref(lm.matmul, x, y)
        assert r.dtype == dtype and r.shape == want.shape
        np.testing.assert_allclose(r.numpy(), want, rtol=rtol)


def test_matmul_one_d_gives_0d():
    got = lm.asarray([1, 2, 3]) @ lm.asarray([4, 5, 6])
    assert got.shape == () and got.item() == 32 and got.dtype == lm.int64
    got = lm.asarray([1.0, 2.0]) @ lm.asarray([3.0, 4.0])
    assert got.shape == () and got.item() == 11.0


def test_matmul_int_wraps_like_numpy():
    a = np.full((1, 2), 200, np.uint8)
    b = np.ones((2, 1), np.uint8)
    got = lm.asarray(a) @ lm.asarray(b)
    assert_tensor(got, np.matmul(a, b), lm.uint8)  # 400 mod 256
    big = np.array([[2**40, 3]], np.int64)
    got = lm.asarray(big) @ lm.asarray(big.T)  # 2**80 + 9 wraps to 9 in int64
    assert got.item() == 9 == np.matmul(big, big.T)[0, 0]


@pytest.mark.parametrize(
    "da,db,result",
    [
        (lm.int32, lm.float32, lm.float64),
        (lm.int8, lm.uint8, lm.int16),
        (lm.float32, lm.float64, lm.float64),
        (lm.int64, lm.uint64, lm.float64),
    ],
    ids=["i32+f32", "i8+u8", "f32+f64", "i64+u64"],
)
def test_matmul_mixed_dtypes_promote(da, db, result):
    a, b = ints((2, 3), da.np, 0, 4), ints((3, 2), db.np, 0, 4)
    got = lm.asarray(a) @ lm.asarray(b)
    assert_tensor(got, np.matmul(a.astype(result.np), b.astype(result.np)), result, 1e-6)
    assert ref(lm.matmul, lm.asarray(a), lm.asarray(b)).dtype == result


def test_matmul_strided_inputs():
    a = RNG.standard_normal((4, 6))
    b = RNG.integers(-5, 5, (6, 4))
    x, y = lm.asarray(a), lm.asarray(b)
    fx = lm.flip(x.mT, axis=0)  # (6, 4), negative strides
    assert_tensor(fx @ x, a.T[::-1] @ a, lm.float64)
    yi = y.mT[::-1, ::2]  # (4, 3) int64, non-contiguous
    assert_tensor(yi @ y[::2], b.T[::-1, ::2] @ b[::2], lm.int64)
    bc = lm.broadcast_to(lm.asarray(b[:, :1]), (6, 3))
    assert_tensor(y.mT @ bc, b.T @ np.broadcast_to(b[:, :1], (6, 3)), lm.int64)


def test_matmul_empty():
    for dtype in (lm.float64, lm.int64):
        x, y = lm.zeros((2, 0), dtype=dtype), lm.zeros((0, 3), dtype=dtype)
        assert_tensor(x @ y, np.zeros((2, 3), dtype.np), dtype)
        assert_tensor(
            lm.zeros((0, 3), dtype=dtype) @ lm.ones((3, 2), dtype=dtype), np.zeros((0, 2)), dtype
        )
        assert_tensor(
            lm.zeros((0, 2, 3), dtype=dtype) @ lm.ones((3, 2), dtype=dtype),
            np.zeros((0, 2, 2)),
            dtype,
        )
        assert_tensor(ref(lm.matmul, x, y), np.zeros((2, 3)), dtype)


def test_matmul_errors():
    with pytest.raises(ValueError, match=r"matmul: shapes \(2, 3\) and \(4, 2\) do not match"):
        lm.zeros((2, 3)) @ lm.zeros((4, 2))
    with pytest.raises(ValueError, match=r"matmul: shapes \(2, 3\) and \(4, 2\) do not match"):
        ref(lm.matmul, lm.zeros((2, 3)), lm.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"shapes \(3,\) and \(2,\) do not match"):
        lm.zeros(3) @ lm.zeros(2)
    with pytest.raises(
        ValueError,
        match=r"matmul: operands must be at least 1-D, got shapes "
        r"\(\) and \(2,\)",
    ):
        lm.matmul(lm.asarray(1.0), lm.zeros(2))
    with pytest.raises(ValueError, match=r"matmul: .*\(2, 2, 3\) and \(3, 3, 2\)"):
        lm.zeros((2, 2, 3)) @ lm.zeros((3, 3, 2))
    with pytest.raises(TypeError, match="matmul needs numeric inputs, got lamina.bool"):
        lm.asarray([[True]]) @ lm.asarray([[True]])
    with pytest.raises(TypeError, match="unsupported operand type.*@"):
        lm.zeros((2, 2)) @ 2
    with pytest.raises(TypeError, match="unsupported operand type.*@"):
        2.0 @ lm.zeros((2, 2))
    with pytest.raises(TypeError, match="unsupported operand type.*@"):
        np.ones((2, 2)) @ lm.ones((2, 2))
    with pytest.raises(TypeError, match="matmul: x2 must be a tensor, got list"):
        lm.matmul(lm.zeros((2, 2)), [[1.0, 2.0], [3.0, 4.0]])


# ---------------------------------------------------------------- tensordot and vecdot


def test_tensordot():
    a = RNG.standard_normal((2, 3, 4))
    b = RNG.standard_normal((3, 4, 5))
    c = RNG.standard_normal((4, 3))
    x, y, z = lm.asarray(a), lm.asarray(b), lm.asarray(c)
    cases = [
        (x, y, a, b, 2),
        (x, z, a, c, 1),
        (x, z, a, c, ([1, 2], [1, 0])),
        (x, z, a, c, ((2,), (0,))),
        (x, y, a, b, (1, 0)),
        (x, z, a, c, ([-1, -2], [0, 1])),
        (x, y, a, b, 0),
        (z, z, c, c, ([0, 1], [0, 1])),
    ]
    for t1, t2, n1, n2, axes in cases:
        want = np.tensordot(n1, n2, axes=axes)
        assert_tensor(lm.tensordot(t1, t2, axes=axes), want, lm.float64, 1e-10)
        assert_tensor(ref(lm.tensordot, t1, t2, axes=axes), want, lm.float64, 1e-10)
    assert_tensor(
        lm.tensordot(x, lm.asarray(b[:, :, 0])), np.tensordot(a, b[:, :, 0]), lm.float64, 1e-10
    )  # default axes=2 -> contract the last two of x


def test_tensordot_ints_mixed_and_empty():
    a, b = ints((2, 3), np.int64), ints((3, 4), np.int64)
    assert_tensor(lm.tensordot(lm.asarray(a), lm.asarray(b), axes=1), a @ b, lm.int64)
    i8, u8 = ints((2, 3), np.int8), ints((3, 2), np.uint8)
    got = lm.tensordot(lm.asarray(i8), lm.asarray(u8), axes=1)
    assert_tensor(got, i8.astype(np.int16) @ u8.astype(np.int16), lm.int16)
    e = lm.tensordot(lm.zeros((2, 0)), lm.zeros((0, 3)), axes=1)  # empty contraction
    assert_tensor(e, np.zeros((2, 3)), default())
    s = lm.tensordot(lm.asarray(2.0), lm.asarray(3.0), axes=0)
    assert s.shape == () and s.item() == 6.0


def test_tensordot_errors():
    x, y = lm.zeros((2, 3)), lm.zeros((3, 2))
    with pytest.raises(
        ValueError,
        match=r"tensordot: contracted axes \(0,\) of \(2, 3\) and "
        r"\(0,\) of \(3, 2\) do not match",
    ):
        lm.tensordot(x, y, axes=([0], [0]))
    with pytest.raises(ValueError, match="tensordot: axes=-1 is out of range for shapes"):
        lm.tensordot(x, y, axes=-1)
    with pytest.raises(
        ValueError,
        match=r"axes=3 is out of range for shapes \(2, 3\) and "
        r"\(3, 2\)",
    ):
        lm.tensordot(x, y, axes=3)
    with pytest.raises(ValueError, match=r"contracted axes \(1,\) of \(2, 3\) and \(0, 1\)"):
        lm.tensordot(x, y, axes=([1], [0, 1]))
    with pytest.raises(lm.AxisError, match="tensordot: axis 2 is out of bounds"):
        lm.tensordot(x, y, axes=([2], [0]))
    with pytest.raises(TypeError, match="tensordot: x2 must be a tensor, got list"):
        lm.tensordot(x, [[1.0]], axes=0)
    with pytest.raises(TypeError, match="tensordot needs numeric inputs"):
        lm.tensordot(lm.asarray([True]), lm.asarray([True]), axes=1)


def test_vecdot():
    a = RNG.standard_normal((2, 3))
    b = RNG.standard_normal((3,))
    x, y = lm.asarray(a), lm.asarray(b)
    assert_tensor(lm.vecdot(x, y), a @ b, lm.float64)
    assert_tensor(lm.vecdot(x, x, axis=0), (a * a).sum(0), lm.float64)
    assert_tensor(lm.vecdot(x, x, axis=-2), (a * a).sum(0), lm.float64)
    c = RNG.standard_normal((4, 1, 3))
    assert_tensor(lm.vecdot(lm.asarray(c), x), (c * a).sum(-1), lm.float64)  # batch bcast
    i = lm.asarray([1, 2, 3])
    assert_tensor(lm.vecdot(i, i), np.int64(14), lm.int64)
    assert_tensor(lm.vecdot(i, lm.asarray([0.5, 0.5, 0.5])), np.float64(3.0), lm.float64)


def test_vecdot_errors():
    x = lm.zeros((2, 3))
    with pytest.raises(
        ValueError,
        match=r"vecdot: shapes \(2, 3\) and \(2,\) cannot be "
        r"broadcast",
    ):
        lm.vecdot(x, lm.zeros(2))
    with pytest.raises(
        ValueError,
        match=r"vecdot: the contracted axis has size 3 in \(1, 3\) "
        r"but 1 in \(2, 1\)",
    ):
        lm.vecdot(lm.zeros((1, 3)), lm.zeros((2, 1)))
    with pytest.raises(lm.AxisError, match="vecdot: axis 2 is out of bounds"):
        lm.vecdot(x, x, axis=2)
    with pytest.raises(TypeError, match="vecdot needs numeric inputs, got lamina.bool"):
        lm.vecdot(lm.asarray([True]), lm.asarray([True]))
    with pytest.raises(TypeError, match="vecdot: x1 must be a tensor, got list"):
        lm.vecdot([1.0], x)


# ---------------------------------------------------------------- asarray


def test_asarray_from_python_objects():
    assert_tensor(lm.asarray([1, 2, 3]), np.array([1, 2, 3]), lm.int64)
    # Python floats (and an empty list) take the default floating dtype
    assert_tensor(lm.asarray([[1.0, 2.0], [3.0, 4.0]]), [[1.0, 2.0], [3.0, 4.0]], default())
    assert_tensor(lm.asarray([True, False]), [True, False], lm.bool)
    assert_tensor(lm.asarray([1, 2.5]), [1.0, 2.5], default())
    assert_tensor(lm.asarray(3), np.int64(3), lm.int64)
    assert_tensor(lm.asarray(2.5), np.float64(2.5), default())
    assert_tensor(lm.asarray(np.float32(2)), np.float32(2), lm.float32)
    assert_tensor(lm.asarray([]), np.array([]), default())
    assert_tensor(lm.asarray([lm.asarray(1.0), lm.asarray(2.0)]), [1.0, 2.0], default())
    assert_tensor(lm.asarray(2**63), np.uint64(2**63), lm.uint64)


def test_asarray_dtype_argument():
    assert_tensor(lm.asarray([1.5, -2.7], dtype=lm.int32), [1, -2], lm.int32)
    assert_tensor(lm.asarray([1, 2], dtype="float32"), [1.0, 2.0], lm.float32)
    assert_tensor(lm.asarray([1, 2], dtype=np.int16), [1, 2], lm.int16)
    assert_tensor(lm.asarray([0, 3], dtype=bool), [False, True], lm.bool)
    assert_tensor(lm.asarray([1], dtype=float), [1.0], default())  # float: the default
    assert_tensor(lm.asarray([1], dtype=int), [1], lm.int64)
    assert_tensor(lm.asarray(np.zeros(2, np.float16), dtype=lm.float32), [0.0, 0.0], lm.float32)
    with pytest.raises(OverflowError, match="300"):
        lm.asarray([300], dtype=lm.int8)


def test_asarray_from_numpy_shares_memory():
    n = np.arange(12.0).reshape(3, 4)
    x = lm.asarray(n)
    assert np.shares_memory(x.numpy(), n) and x.is_contiguous()
    n[0, 0] = 99.0
    assert x.numpy()[0, 0] == 99.0
    assert np.shares_memory(lm.asarray(n, copy=False).numpy(), n)
    c = lm.asarray(n, copy=True)
    assert not np.shares_memory(c.numpy(), n)
    assert_tensor(c, n, lm.float64)


def test_asarray_from_non_contiguous_numpy():
    n = np.arange(24.0).reshape(4, 6)
    for view in (n[::-1, ::2], n.T, n[:, 1:5:3], np.broadcast_to(n[0], (3, 6))):
        x = lm.asarray(view)
        assert_tensor(x, view, lm.float64)
        assert not x.is_contiguous()
        assert_tensor(lm.sum(x, axis=0), view.sum(0), lm.float64)
        assert_tensor(lm.asarray(view, copy=True), view, lm.float64)
    # a field of a structured array: a stride that is not a multiple of the itemsize
    rec = np.zeros(3, dtype=[("a", np.int32), ("b", np.float64)])
    rec["b"] = [1.0, 2.0, 3.0]
    assert_tensor(lm.asarray(rec["b"]), [1.0, 2.0, 3.0], lm.float64)


def test_asarray_non_native_byte_order():
    n = np.arange(4, dtype=">i4")
    x = lm.asarray(n)
    assert_tensor(x, [0, 1, 2, 3], lm.int32)
    assert x.numpy().dtype.isnative
    assert_tensor(lm.asarray(np.array([1.5, -2.0], dtype=">f8")), [1.5, -2.0], lm.float64)
    with pytest.raises(ValueError, match="asarray: copy=False, but the conversion needs a copy"):
        lm.asarray(n, copy=False)


def test_asarray_from_tensors():
    x = lm.asarray([1.0, 2.0], dtype=lm.float64)
    assert lm.asarray(x) is x
    assert lm.asarray(x, dtype=lm.float64) is x
    assert lm.asarray(x, device="cpu") is x
    c = lm.asarray(x, copy=True)
    assert c is not x and not np.shares_memory(c.numpy(), x.numpy())
    assert_tensor(c, [1.0, 2.0], lm.float64)
    assert_tensor(lm.asarray(x, dtype=lm.int32), [1, 2], lm.int32)
    with pytest.raises(
        ValueError,
        match="asarray: converting lamina.float64 to lamina.int32 needs a copy, but copy=False",
    ):
        lm.asarray(x, dtype=lm.int32, copy=False)


def test_asarray_errors():
    for obj, what in [
        ("abc", "<U3"),
        (["a", "b"], "<U1"),
        (object(), "object"),
    ]:
        with pytest.raises(TypeError, match=f"unsupported dtype {what}"):
            lm.asarray(obj)
    with pytest.raises(
        TypeError, match="asarray: float16 is not supported; pass dtype=lamina.float32"
    ):
        lm.asarray(np.zeros(2, np.float16))
    for dtype in ("float16", np.float16, "foo", "U1"):
        with pytest.raises(TypeError, match="unsupported dtype"):
            lm.asarray([1.0], dtype=dtype)
    with pytest.raises(
        ValueError, match="asarray: cannot convert list to a tensor: .*inhomogeneous"
    ):
        lm.asarray([[1, 2], [3]])
    with pytest.raises(
        ValueError, match="asarray: copy=False needs an object that exposes its buffer"
    ):
        lm.asarray([1, 2], copy=False)
    with pytest.raises(ValueError, match="unknown device 'gpu'; known devices: cpu"):
        lm.asarray([1.0], device="gpu")
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        lm.asarray(lm.asarray([1.0]), device="gpu")


# ---------------------------------------------------------------- zeros, ones, full, ...


def test_zeros_ones_empty_full():
    assert_tensor(lm.zeros((2, 3)), np.zeros((2, 3)), default())
    assert_tensor(lm.zeros(3, dtype=lm.int8), np.zeros(3, np.int8), lm.int8)
    assert_tensor(lm.ones([2], dtype=lm.bool), [True, True], lm.bool)
    assert_tensor(lm.ones((), dtype=lm.uint32), np.uint32(1), lm.uint32)
    e = lm.empty((2, 0, 3), dtype=lm.float32)
    assert e.shape == (2, 0, 3) and e.dtype == lm.float32 and e.size == 0
    assert lm.empty(4).dtype == default() and lm.empty(4).shape == (4,)
    assert_tensor(lm.full((2,), 3), [3, 3], lm.int64)
    assert_tensor(lm.full((2,), True), [True, True], lm.bool)
    assert_tensor(lm.full((2,), 2.5), [2.5, 2.5], default())
    assert_tensor(lm.full((2, 1), 7, dtype=lm.uint8), [[7], [7]], lm.uint8)
    assert_tensor(lm.full(2, np.float32(1.5), dtype=lm.float32), [1.5, 1.5], lm.float32)
    assert_tensor(lm.full((2,), -np.inf), [-np.inf, -np.inf], default())


def test_like_functions():
    x = lm.asarray(np.arange(6, dtype=np.int16).reshape(2, 3))
    assert_tensor(lm.zeros_like(x), np.zeros((2, 3), np.int16), lm.int16)
    assert_tensor(lm.ones_like(x), np.ones((2, 3), np.int16), lm.int16)
    assert_tensor(lm.full_like(x, 7), np.full((2, 3), 7, np.int16), lm.int16)
    assert_tensor(lm.ones_like(x, dtype=lm.float32), np.ones((2, 3)), lm.float32)
    e = lm.empty_like(x.mT)
    assert e.shape == (3, 2) and e.dtype == lm.int16
    z = lm.zeros_like(x)
    assert not np.shares_memory(z.numpy(), x.numpy())
    with pytest.raises(
        OverflowError, match="full: fill value 40000 is out of bounds for lamina.int16"
    ):
        lm.full_like(x, 40000)
    with pytest.raises(TypeError, match="zeros_like: x must be a tensor, got list"):
        lm.zeros_like([1, 2])


def test_creation_errors():
    with pytest.raises(
        OverflowError, match="full: fill value 300 is out of bounds for lamina.int8"
    ):
        lm.full((2,), 300, dtype=lm.int8)
    with pytest.raises(OverflowError, match="fill value -1 is out of bounds for lamina.uint8"):
        lm.full((2,), -1, dtype=lm.uint8)
    with pytest.raises(
        TypeError, match="full: fill_value must be a bool, int, float or complex, got str"
    ):
        lm.full((2,), "a")
    with pytest.raises(TypeError, match=r"shape must be a tuple of ints, got \(2.5,\)"):
        lm.zeros((2.5,))
    with pytest.raises(TypeError, match="shape must be a tuple of ints"):
        lm.ones("ab")
    with pytest.raises(ValueError, match=r"zeros: shape must not have negative sizes, got \(-1,\)"):
        lm.zeros((-1,))
    with pytest.raises(TypeError, match="unsupported dtype 'float16'"):
        lm.zeros(2, dtype="float16")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        lm.ones(2, device="tpu")


def test_arange():
    for args, kwargs in [
        ((5,), {}),
        ((1, 7, 2), {}),
        ((5, 0, -2), {}),
        ((5, 0), {}),
        ((0, 1, 0.25), {}),
        ((0.5, 3), {}),
        ((5,), {"dtype": lm.float32}),
        ((-3, 3), {"dtype": lm.int8}),
    ]:
        got = lm.arange(*args, **kwargs)
        dtype = kwargs.get(
            "dtype", default() if any(isinstance(a, float) for a in args) else lm.int64
        )
        assert_tensor(got, np.arange(*args, dtype=dtype.np), dtype)
    with pytest.raises(ValueError, match="arange: step must not be zero"):
        lm.arange(0, 5, 0)


def test_linspace():
    assert_tensor(lm.linspace(0, 1, 5), np.linspace(0, 1, 5), default())
    assert_tensor(lm.linspace(0, 1, 4, endpoint=False), [0.0, 0.25, 0.5, 0.75], default())
    assert_tensor(lm.linspace(2, -2, 3, dtype=lm.float32), [2.0, 0.0, -2.0], lm.float32)
    assert_tensor(lm.linspace(0, 1, 0), np.zeros(0), default())
    assert_tensor(lm.linspace(3, 9, 1), [3.0], default())
    with pytest.raises(ValueError, match="linspace: num must be non-negative, got -1"):
        lm.linspace(0, 1, -1)
    with pytest.raises(TypeError, match="linspace: num must be an int, got float"):
        lm.linspace(0, 1, 2.5)


def test_eye():
    assert_tensor(lm.eye(3), np.eye(3), default())
    for n, m, k in [(3, 4, 1), (3, 4, -2), (4, 2, 0), (3, 3, 5), (3, 3, -3), (0, 2, 0)]:
        assert_tensor(lm.eye(n, m, k=k), np.eye(n, m, k), default())
    assert_tensor(lm.eye(2, dtype=lm.int32), np.eye(2, dtype=np.int32), lm.int32)
    assert_tensor(lm.eye(2, dtype=lm.bool), np.eye(2, dtype=bool), lm.bool)
    with pytest.raises(ValueError, match="eye: sizes must be non-negative, got -1 x -1"):
        lm.eye(-1)
    with pytest.raises(ValueError, match="got 2 x -3"):
        lm.eye(2, -3)


# ---------------------------------------------------------------- DLPack


def test_from_dlpack_round_trip():
    n = np.arange(6.0).reshape(2, 3)
    x = lm.from_dlpack(n)
    assert_tensor(x, n, lm.float64)
    assert np.shares_memory(x.numpy(), n)  # zero copy
    back = np.from_dlpack(x)
    assert np.shares_memory(back, n)
    np.testing.assert_array_equal(back, n)
    assert_tensor(lm.from_dlpack(x), n, lm.float64)
    v = n[:, ::-1]
    assert_tensor(lm.from_dlpack(v), v, lm.float64)
    c = lm.from_dlpack(n, copy=True)
    assert not np.shares_memory(c.numpy(), n)
    i8 = np.array([1, -2], np.int8)
    assert_tensor(lm.from_dlpack(i8), i8, lm.int8)
    assert x.__dlpack_device__() == (1, 0)  # kDLCPU, device 0
    assert type(x.__dlpack__()).__name__ == "PyCapsule"
    assert type(x.__dlpack__(max_version=(1, 0))).__name__ == "PyCapsule"
    with pytest.raises(
        TypeError, match="from_dlpack: expected an object with __dlpack__, got list"
    ):
        lm.from_dlpack([1, 2])


# ---------------------------------------------------------------- random


def test_rand_randn_seed_reproducibility():
    lm.random.seed(42)
    a = lm.rand(3, 2)
    b = lm.randn(4)
    lm.random.seed(42)
    a2 = lm.rand((3, 2))  # a shape tuple is the same as separate ints
    b2 = lm.randn(4)
    assert a.shape == (3, 2) and a.dtype == default() and b.dtype == default()
    np.testing.assert_array_equal(a.numpy(), a2.numpy())
    np.testing.assert_array_equal(b.numpy(), b2.numpy())
    assert not np.array_equal(lm.rand(3, 2).numpy(), a.numpy())  # the stream moves on
    lm.random.seed(7)
    u = lm.rand(10000, dtype=lm.float32)
    assert u.dtype == lm.float32
    assert u.numpy().min() >= 0.0 and u.numpy().max() < 1.0
    assert abs(u.numpy().mean() - 0.5) < 0.02
    z = lm.randn(10000)
    assert abs(z.numpy().mean()) < 0.05 and abs(z.numpy().std() - 1.0) < 0.05
    assert lm.rand().shape == ()
    with pytest.raises(TypeError, match="rand: needs a floating dtype, got lamina.int32"):
        lm.rand(2, dtype=lm.int32)
    with pytest.raises(TypeError, match="randn: needs a floating dtype"):
        lm.randn(2, dtype=lm.bool)
    with pytest.raises(TypeError, match="shape must be a tuple of ints"):
        lm.rand(2.5)


# ---------------------------------------------------------------- dtype introspection


def test_finfo_iinfo():
    for d in (lm.float32, lm.float64):
        f, nf = lm.finfo(d), np.finfo(d.np)
        assert (f.bits, f.eps, f.max, f.min, f.smallest_normal) == (
            nf.bits,
            float(nf.eps),
            float(nf.max),
            float(nf.min),
            float(nf.smallest_normal),
        )
        assert f.dtype == d and isinstance(f.eps, float)
    assert lm.finfo(lm.zeros(1, dtype=lm.float32)).bits == 32  # a tensor works too
    for d in (lm.int8, lm.uint8, lm.int64, lm.uint64):
        i, ni = lm.iinfo(d), np.iinfo(d.np)
        assert (i.bits, i.min, i.max, i.dtype) == (ni.bits, int(ni.min), int(ni.max), d)
        assert type(i.max) is int
    assert lm.iinfo("int16").max == 32767
    with pytest.raises(TypeError, match="finfo needs a floating dtype, got lamina.int32"):
        lm.finfo(lm.int32)
    with pytest.raises(TypeError, match="iinfo needs an integer dtype, got lamina.float64"):
        lm.iinfo(lm.float64)
    with pytest.raises(TypeError, match="iinfo needs an integer dtype, got lamina.bool"):
        lm.iinfo(lm.bool)


def test_result_type_and_can_cast():
    assert lm.result_type(lm.int8, lm.uint8) == lm.int16
    assert lm.result_type(lm.int64, lm.uint64) == lm.float64
    assert lm.result_type(lm.bool, lm.int8) == lm.int8
    assert lm.result_type(lm.float32, lm.int32) == lm.float64
    assert lm.result_type(lm.uint8, lm.uint16, lm.int8) == lm.int32
    assert lm.result_type(lm.zeros(1, dtype=lm.float32), lm.float32) == lm.float32
    assert lm.result_type(lm.int16) is lm.int16
    with pytest.raises(ValueError, match=r"result_type\(\) needs at least one"):
        lm.result_type()
    assert lm.can_cast(lm.int8, lm.int16) and not lm.can_cast(lm.int16, lm.int8)
    assert lm.can_cast(lm.bool, lm.int8) and not lm.can_cast(lm.int8, lm.bool)
    assert not lm.can_cast(lm.uint8, lm.int8) and lm.can_cast(lm.uint8, lm.int16)
    assert lm.can_cast(lm.float32, lm.float64) and not lm.can_cast(lm.float64, lm.float32)
    assert not lm.can_cast(lm.zeros(1, dtype=lm.float64), lm.float32)


def test_isdtype():
    assert lm.isdtype(lm.int8, "signed integer") and not lm.isdtype(lm.uint8, "signed integer")
    assert lm.isdtype(lm.uint8, "integral") and lm.isdtype(lm.uint64, "unsigned integer")
    assert lm.isdtype(lm.float32, "real floating") and lm.isdtype(lm.float32, "numeric")
    assert not lm.isdtype(lm.bool, "numeric") and lm.isdtype(lm.bool, "bool")
    assert not lm.isdtype(lm.float64, "complex floating")
    assert lm.isdtype(lm.float32, ("bool", "real floating"))
    assert lm.isdtype(lm.float32, lm.float32) and not lm.isdtype(lm.float32, lm.float64)
    with pytest.raises(ValueError, match="unknown dtype kind 'foo'; valid kinds: bool"):
        lm.isdtype(lm.int8, "foo")


def test_numpy_takes_lamina_dtypes():
    """A lamina dtype has NumPy's kind letter, so code written for NumPy dtypes (as
    scikit-learn's RidgeCV without array API dispatch, casting NumPy results to
    X.dtype) hands it to NumPy, which raised "Cannot interpret 'lamina.float32'"."""
    for dtype in lm.__array_namespace_info__().dtypes().values():
        assert np.dtype(dtype) == np.dtype(dtype.name)
        assert np.zeros(2, dtype=dtype).dtype == np.dtype(dtype.name)
    assert np.arange(3).astype(lm.float32).dtype == np.float32


# ---------------------------------------------------------------- the Tensor protocol


def test_array_namespace_and_version():
    x = lm.zeros(2)
    assert x.__array_namespace__() is lm
    assert x.__array_namespace__(api_version="2023.12") is lm
    assert x.__array_namespace__(api_version="2024.12") is lm
    assert lm.__array_api_version__ == "2024.12"
    with pytest.raises(ValueError, match="unsupported Array API version '1999.01'"):
        x.__array_namespace__(api_version="1999.01")


def test_repr():
    # the default float is implied by the printed values (as PyTorch's); the other is not
    other = lm.float64 if default() is lm.float32 else lm.float32
    assert repr(lm.asarray([1.0, 2.0], dtype=other)) == f"tensor([1., 2.], dtype={other!r})"
    assert repr(lm.asarray([1.0, 2.0])) == "tensor([1., 2.])"
    assert repr(lm.asarray([1, 2])) == "tensor([1, 2])"
    assert repr(lm.asarray(np.array([1, 2], np.int8))) == "tensor([1, 2], dtype=lamina.int8)"
    assert repr(lm.asarray([True, False])) == "tensor([ True, False])"
    assert repr(lm.asarray(1.5)) == "tensor(1.5)"
    assert repr(lm.asarray([[1, 2], [3, 4]])) == "tensor([[1, 2],\n        [3, 4]])"
    assert repr(lm.zeros((0,))) == "tensor([])"
    assert repr(lm.zeros((0,), dtype=lm.int64)) == "tensor([], dtype=lamina.int64)"
    assert repr(lm.zeros((0, 3), dtype=lm.int32)) == "tensor([], shape=(0, 3), dtype=lamina.int32)"
    assert repr(lm.arange(2000)) == "tensor([   0,    1,    2, ..., 1997, 1998, 1999])"
    assert repr(lm.float32) == "lamina.float32"


def test_device():
    x = lm.zeros(2)
    assert x.device == "cpu" and str(x.device) == "cpu"
    assert repr(x.device) == "device(type='cpu')"
    assert x.device == lm.ones(3, dtype=lm.int8).device
    assert x.to_device("cpu") is x and x.to_device(x.device) is x
    with pytest.raises(ValueError, match="to_device: unknown device 'gpu'; known devices: cpu"):
        x.to_device("gpu")


def test_numpy_and_array_protocol():
    x = lm.asarray(np.arange(6.0).reshape(2, 3))
    n = x.numpy()
    n[0, 0] = -1.0  # .numpy() is the storage itself
    assert x[0, 0].item() == -1.0
    assert np.shares_memory(np.asarray(x), n)
    assert not np.shares_memory(np.array(x, copy=True), n)
    a32 = np.asarray(x, dtype=np.float32)
    assert a32.dtype == np.float32 and a32[0, 0] == -1.0
    assert np.add(np.ones(3), np.asarray(lm.ones(3))).tolist() == [2.0, 2.0, 2.0]
    v = x.mT.numpy()  # a view's numpy() is a view too
    assert np.shares_memory(v, n) and v.shape == (3, 2)


def test_scalar_conversions():
    assert lm.asarray([[3.5]]).item() == 3.5
    assert type(lm.asarray([2]).item()) is int
    assert type(lm.asarray(True).item()) is bool
    assert lm.asarray([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert lm.asarray(5).tolist() == 5
    assert bool(lm.asarray(0.0)) is False and bool(lm.asarray(2)) is True
    assert int(lm.asarray(3.7)) == 3 and float(lm.asarray(3)) == 3.0
    assert int(lm.asarray(np.uint64(2**64 - 1))) == 2**64 - 1
    assert complex(lm.asarray(2.0)) == 2 + 0j
    assert [10, 20, 30][lm.asarray(1)] == 20  # __index__
    assert np.isnan(float(lm.asarray(np.nan)))
    with pytest.raises(
        ValueError,
        match=r"item\(\) needs a tensor with one element, got "
        r"shape \(2, 3\)",
    ):
        lm.zeros((2, 3)).item()
    with pytest.raises(
        TypeError,
        match=r"only 0-d tensors convert to Python bool, got "
        r"shape \(2,\)",
    ):
        bool(lm.asarray([1.0, 2.0]))
    with pytest.raises(TypeError, match="only 0-d tensors convert to Python int"):
        int(lm.asarray([1]))
    with pytest.raises(TypeError, match="only 0-d tensors convert to Python float"):
        float(lm.zeros((1, 1)))
    with pytest.raises(
        TypeError, match=f"only integer tensors can be used as an index, got {default()!r}"
    ):
        [1, 2][lm.asarray(1.0)]


def test_tensor_misc():
    with pytest.raises(TypeError, match="Tensor has no public constructor"):
        lm.Tensor()
    x = lm.asarray(np.arange(6, dtype=np.int16).reshape(2, 3))
    y = pickle.loads(pickle.dumps(x))
    assert_tensor(y, x.numpy(), lm.int16)
    assert (x.size, x.ndim, lm.asarray(1.0).size, lm.zeros((2, 0)).size) == (6, 2, 1, 0)
    assert lm.Array is lm.Tensor and lm.newaxis is None
    assert lm.pi == np.pi and lm.e == np.e and lm.inf == np.inf and np.isnan(lm.nan)


def test_creation_takes_numpy_scalars_and_0d_tensors_by_their_kind():
    """NumPy scalars and 0-d tensors infer dtypes and check ranges as the Python
    scalars they hold; a Python int beyond 64 bits is an OverflowError."""
    assert lm.arange(0, 1, np.float32(0.25)).tolist() == [0.0, 0.25, 0.5, 0.75]
    assert lm.arange(lm.asarray(2.5)).dtype == default()
    assert lm.arange(np.int32(3)).tolist() == [0, 1, 2]
    assert lm.full((2,), np.int32(5)).dtype == lm.int64
    assert lm.full((2,), np.bool_(True)).dtype == lm.bool
    assert lm.full((2,), lm.asarray(1.5)).tolist() == [1.5, 1.5]
    with pytest.raises(OverflowError):
        lm.full((2,), np.int64(300), dtype=lm.uint8)
    with pytest.raises(OverflowError, match="64 bits"):
        lm.asarray(2**64)
