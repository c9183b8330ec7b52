"""Elementwise operators of the default numba_cpu backend, checked against the numpy_ref
backend and against NumPy itself (samples: tests/opinfo.py).

Cost note: numba_cpu compiles one kernel per (operator, dtype, flat|strided[, parallel])
on first use (~0.1-0.3 s each when Numba's cache is cold, as on CI). The sample database
picks the dtypes so that every test here reuses kernels the value tests compile anyway;
new (operator, dtype) pairs belong in opinfo.py, not in ad-hoc tests.
"""

import operator as O
import os
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numba.core.errors import NumbaPerformanceWarning

import lamina as lm
from lamina.backends import threads
from lamina.backends.numba_cpu import elementwise, reductions
from lamina.backends.numba_cpu.elementwise import SIMD_OPERATORS
from lamina.dispatch import core, layouts
from lamina.dispatch.schema import OPERATORS

sys.path.insert(0, os.path.dirname(__file__))
import opinfo as I

HYPOTHESIS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def numpy_ref(fn, *args):
    with lm.backends.use("numpy_ref"):
        return fn(*args)


def check_many(op, fn, cases):
    """For each case (lamina args, NumPy args, description): fn(*args) on numba_cpu and
    on numpy_ref both equal NumPy's result (or both raise TypeError where NumPy's dtype
    is not one the operator takes), and the inputs are left untouched. Returns the
    numba_cpu results. (numpy_ref runs in one ``backends.use`` block: a switch of
    backends installs other tables, Note [Preference snapshots].)"""
    results = []
    for lm_args, np_args, where in cases:
        want, res = I.expected(op, np_args)
        before = [a.numpy().copy() for a in lm_args if isinstance(a, lm.Tensor)]
        if want is None:
            with pytest.raises(TypeError, match=op.name):
                fn(*lm_args)
            results.append(None)
            continue
        got = fn(*lm_args)
        I.assert_matches(got, want, res, op.signed_zero, f"{op.name} numba_cpu {where}")
        after = [a.numpy() for a in lm_args if isinstance(a, lm.Tensor)]
        for b, a in zip(before, after):
            np.testing.assert_array_equal(a, b, err_msg=f"{op.name} changed its input")
        results.append(got)
    with lm.backends.use("numpy_ref"):
        for (lm_args, np_args, where), got in zip(cases, results):
            if got is None:
                with pytest.raises(TypeError, match=op.name):
                    fn(*lm_args)
                continue
            ref = fn(*lm_args)
            res = got.numpy().dtype
            I.assert_matches(
                ref, I.expected(op, np_args)[0], res, op.signed_zero, f"{op.name} numpy_ref {where}"
            )
            I.assert_matches(
                got, ref.numpy(), res, op.signed_zero, f"{op.name} vs numpy_ref {where}"
            )
    return results


def check(op, fn, lm_args, np_args, where=""):
    return check_many(op, fn, [(lm_args, np_args, where)])[0]


# ---------------------------------------------------------------- the operator list


def test_database_covers_the_operator_list():
    """Every elementwise operator of dispatch/operators.py has samples, and what the
    database assumes of it (arity, accepted dtypes, result) is what the list says."""
    listed = {
        op.name: (op.kind, op.dtypes, op.result, op.inplace is not None)
        for op in OPERATORS.values()
        if op.category == "elementwise" and op.kind in ("unary", "binary")
    }
    assert set(listed) == set(I.OPS)
    for name, (kind, dtypes, result, inplace) in listed.items():
        op = I.OPS[name]
        assert (op.arity, op.rule, op.result) == (
            {"unary": 1, "binary": 2}[kind],
            dtypes,
            result,
        ), name
        if op.inplace is not None:
            assert inplace and name + "_" in OPERATORS, name
        for d in op.dtypes:  # each tested dtype is one the operator accepts (or promotes)
            kind = np.dtype(d).kind
            assert kind in I.ACCEPTS[op.rule] or op.rule in I.PROMOTES_TO_FLOAT, (name, d)
    # Every dtype is exercised by many operators, each kind by every operator.
    for d in I.ALL_DTYPES:
        assert sum(d in op.dtypes for op in I.OPS.values()) >= 6, d
    for op in I.OPS.values():
        kinds = {np.dtype(d).kind for d in op.dtypes}
        if op.rule in I.PROMOTES_TO_FLOAT:  # floats, complex, one kind promoted to default float
            assert set(I.ACCEPTS[op.rule]) <= kinds and kinds - {"f", "c"}, op.name
            continue
        need = set(I.ACCEPTS[op.rule])
        if op.name in I.ONE_INTEGER_KIND:
            need -= {"u"} if "i" in kinds else {"i"}
        assert need <= kinds, op.name


# ---------------------------------------------------------------- values, dtypes, layouts


@pytest.mark.parametrize("layout", list(I.UNARY_LAYOUTS))
@pytest.mark.parametrize("op, dtype", I.op_dtype_params(I.UNARY))
def test_unary(op, dtype, layout):
    t, a = I.unary_sample(op, dtype, layout)
    check(op, getattr(lm, op.name), [t], [a], f"{dtype} {layout}")


@pytest.mark.parametrize("layout", list(I.BINARY_LAYOUTS))
@pytest.mark.parametrize("op, dtype", I.op_dtype_params(I.BINARY))
def test_binary(op, dtype, layout):
    (t1, t2), (a1, a2) = I.binary_sample(op, dtype, dtype, layout)
    got = check(op, getattr(lm, op.name), [t1, t2], [a1, a2], f"{dtype} {layout}")
    assert got.shape == np.broadcast_shapes(a1.shape, a2.shape)


def test_results_keep_the_dense_order_their_operands_share():
    """Note [Result layouts]: an elementwise result, and a concat of images, keep the
    dense layout every full-size operand shares (channels-last images stay so, as in
    PyTorch; NumPy's "K" order); operands in different orders or broadcast give C
    order. The meta device describes the same strides."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((2, 3, 4, 5)).astype(np.float32) for _ in range(2))
    big = rng.standard_normal((4, 64, 16, 16)).astype(np.float32)  # NumPy's SIMD path

    def nhwc(x):
        return lm.nn.functional.to_layout(lm.asarray(x), "NHWC")

    cases = [  # (computation, NumPy's values, whether channels-last)
        (lambda: nhwc(a) + nhwc(b), a + b, True),
        (lambda: nhwc(big) * nhwc(big), big * big, True),
        (lambda: nhwc(a) * 2.0, a * 2, True),
        (lambda: lm.exp(nhwc(a)), np.exp(a), True),
        (lambda: nhwc(a) > nhwc(b), a > b, True),
        (lambda: nhwc(a) * lm.asarray(np.float32(3)), a * 3, True),
        (lambda: lm.concat([nhwc(a), nhwc(b)], axis=1), np.concatenate([a, b], 1), True),
        (lambda: nhwc(a) + lm.asarray(b), a + b, False),
        (lambda: nhwc(a) + lm.asarray(b[0, 0, 0]), a + b[0, 0, 0], False),
        (lambda: lm.concat([nhwc(a), lm.asarray(b)], axis=1), np.concatenate([a, b], 1), False),
    ]
    for i, (compute, want, channels_last) in enumerate(cases):
        got = compute()
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, err_msg=str(i))
        strides = layouts.strides_of(got)
        assert layouts.image_layout(got.shape, strides) == ("NHWC" if channels_last else "NCHW"), i
    meta = lm.nn.functional.to_layout(lm.asarray(a), "NHWC").to("meta")
    assert layouts.strides_of(meta + meta) == layouts.strides_of(nhwc(a) + nhwc(b))


@pytest.mark.parametrize("op, dtype", I.op_dtype_params(I.BINARY))
def test_binary_python_scalar(op, dtype):
    """A Python scalar of the tensor's kind is weak: the result keeps the tensor's dtype
    (or is bool), on either side, through the function and the Tensor operators
    (``x - 2`` and the reflected ``2 - x``)."""
    fn = getattr(lm, op.name)
    cases = []
    for layout in ("1d", "transposed"):
        for side in (0, 1):  # the side the tensor is on
            t, a = _sample(op, dtype, side, layout)
            for s in I.python_scalars(op, dtype, 1 - side):
                args, np_args = ([t, s], [a, s]) if side == 0 else ([s, t], [s, a])
                cases.append((args, np_args, f"{dtype} {layout} scalar {s!r} side {side}"))
    alone = I.result_dtype(op, I.comp_dtype(op, [I.specials(dtype)]))  # the scalar is weak
    for (args, _, where), got in zip(cases, check_many(op, fn, cases)):
        assert got.dtype == I.lm_dtype(alone.name), where
        if op.dunder is not None:  # x - 2 and the reflected 2 - x
            I.assert_matches(
                op.dunder(*args),
                got.numpy(),
                got.numpy().dtype,
                where=f"{op.name} operator, {where}",
            )


def _sample(op, dtype, operand, layout):
    pool = op.pool(dtype, operand)
    if layout == "1d":
        return lm.asarray(pool.copy()), pool
    return I.make(pool, (5, 4), "transposed", I._rng(op.name, dtype, operand))


# Promotion between tensor dtypes follows NumPy 2 (lamina/_dtypes.py PROMOTE).
PROMOTIONS = [
    ("int8", "uint8", "int16"),
    ("int32", "float32", "float64"),
    ("int64", "uint64", "float64"),
    ("bool", "int8", "int8"),
    ("uint8", "uint16", "uint16"),
    ("float32", "float64", "float64"),
    ("bool", "float32", "float32"),
    ("int16", "uint32", "int64"),
    ("uint8", "int32", "int32"),
    ("uint32", "float32", "float64"),
    ("bool", "uint64", "uint64"),
    ("int8", "int64", "int64"),
    ("uint16", "uint8", "uint16"),
    ("float64", "int16", "float64"),
    ("float32", "complex64", "complex64"),
    ("float64", "complex64", "complex128"),
    ("int16", "complex64", "complex64"),
    ("complex64", "complex128", "complex128"),
    ("bool", "complex128", "complex128"),
    ("int64", "complex64", "complex128"),
]


def _promotion_params():
    params = []
    for op in I.BINARY:
        for d1, d2, comp in PROMOTIONS:
            ok = comp in op.dtypes or (op.rule == "float" and comp in "int16 uint16")
            if ok and np.dtype(comp).kind in I.ACCEPTS[op.rule]:
                params.append(pytest.param(op, d1, d2, comp, id=f"{op.name}-{d1}-{d2}"))
    return params


@pytest.mark.parametrize("layout", ["pairs", "bcast-3d", "transposed"])
@pytest.mark.parametrize("op, d1, d2, comp", _promotion_params())
def test_binary_promotion(op, d1, d2, comp, layout):
    assert str(np.promote_types(d1, d2)) == comp
    assert lm.result_type(I.lm_dtype(d1), I.lm_dtype(d2)) == I.lm_dtype(comp)
    fn = getattr(lm, op.name)
    cases = []
    for x1, x2 in ((d1, d2), (d2, d1)):
        (t1, t2), (a1, a2) = I.binary_sample(op, x1, x2, layout)
        cases.append(([t1, t2], [a1, a2], f"{x1}+{x2} {layout}"))
    for (_, (a1, a2), _), got in zip(cases, check_many(op, fn, cases)):
        assert got.dtype == (lm.bool if op.result == "bool" else I.lm_dtype(comp))
        with np.errstate(all="ignore"):  # NumPy itself gives the same dtype
            assert op.ref(a1, a2).dtype == got.numpy().dtype


# ---------------------------------------------------------------- weak Python scalars

# Expected results that are lamina's default float / complex dtype, whichever is set
# (Note [Default dtype]); NumPy gives float64 / complex128 there.
DEFAULT_FLOAT, DEFAULT_COMPLEX = "default_float", "default_complex"


@pytest.mark.parametrize(
    "dtype, scalar, result",
    [
        ("int8", 1, "int8"),
        ("int8", True, "int8"),
        ("int8", 1.5, DEFAULT_FLOAT),
        ("uint8", 255, "uint8"),
        ("uint64", 2**64 - 1, "uint64"),
        ("int64", -(2**63), "int64"),
        ("float32", 1.5, "float32"),
        ("float32", 1, "float32"),
        ("float32", True, "float32"),
        ("bool", 1, "int64"),
        ("bool", 1.5, DEFAULT_FLOAT),
        ("uint16", 2.0, DEFAULT_FLOAT),
        ("int16", np.int64(7), "int16"),
        ("float32", np.float64(0.25), "float32"),
        # a Python complex takes the complex dtype of a float tensor's precision
        ("float32", 1j, "complex64"),
        ("float64", 2j, "complex128"),
        ("int8", 1j, DEFAULT_COMPLEX),
        ("bool", 1j, DEFAULT_COMPLEX),
        ("complex64", 1.5, "complex64"),
        ("complex64", 2, "complex64"),
        ("complex64", True, "complex64"),
        ("complex64", 1j, "complex64"),
        ("float32", np.complex128(0.5j), "complex64"),
    ],
)
def test_weak_scalar_promotion(dtype, scalar, result):
    """int8 tensor + 1 stays int8 (and wraps like NumPy: 127 + 1 == -128); an int or
    bool tensor plus a float gives the default float, plus a complex the default complex
    (where NumPy gives float64 / complex128). NumPy scalars count as Python scalars here
    (lamina's setup.scalar_value; NumPy 2 would treat np.int64(7) as a strong int64)."""
    numpy_result = {DEFAULT_FLOAT: "float64", DEFAULT_COMPLEX: "complex128"}.get(result, result)
    if result in (DEFAULT_FLOAT, DEFAULT_COMPLEX):
        result = I.default_dtype("f" if result == DEFAULT_FLOAT else "c").name
    a = I.specials(dtype)
    t = lm.asarray(a.copy())
    py = scalar.item() if isinstance(scalar, np.generic) else scalar
    want = np.asarray(np.add(a.astype(result), np.asarray(py, result)))
    for got in (t + scalar, scalar + t, lm.add(t, scalar), numpy_ref(lm.add, scalar, t)):
        I.assert_matches(got, want.astype(result), result, where=f"{dtype} + {scalar!r}")
    eq = t == scalar
    I.assert_matches(
        eq, np.equal(a.astype(result), np.asarray(py, result)), bool, where=f"{dtype} == {scalar!r}"
    )
    assert np.result_type(a.dtype, py) == np.dtype(numpy_result)


def test_weak_int_wraps_like_numpy():
    t = lm.asarray(np.array([127, -128, 0], np.int8))
    I.assert_matches(t + 1, np.array([-128, -127, 1], np.int8), "int8")
    I.assert_matches(1 - t, np.array([-126, -127, 1], np.int8), "int8")
    u = lm.asarray(np.array([0, 255], np.uint8))
    I.assert_matches(u - 1, np.array([255, 254], np.uint8), "uint8")


def _rsub(x, s):
    return s - x


@pytest.mark.parametrize(
    "dtype, scalar",
    [
        ("uint8", 300),
        ("uint8", -1),
        ("int8", 128),
        ("int8", -129),
        ("uint64", -1),
        ("int64", 2**63),
        ("uint64", 2**64),
        ("bool", 2**63),
        ("int32", 2**31),
    ],
)
@pytest.mark.parametrize(
    "fn, np_fn",
    [
        (lm.add, np.add),
        (O.add, O.add),
        (O.mul, O.mul),
        (_rsub, _rsub),
        (lm.bitwise_and, np.bitwise_and),
        (lm.maximum, np.maximum),
    ],
    ids=["add", "+", "*", "reflected -", "bitwise_and", "maximum"],
)
def test_weak_int_out_of_range_raises(dtype, scalar, fn, np_fn):
    """An integer that does not fit the tensor's dtype (int64 for a bool tensor) raises
    OverflowError instead of wrapping, on both backends, before any kernel runs; NumPy
    2 raises too."""
    t = lm.asarray(I.specials(dtype))
    with pytest.raises(OverflowError, match="out of bounds"):
        fn(t, scalar)
    with pytest.raises(OverflowError, match="out of bounds"):
        numpy_ref(fn, t, scalar)
    with pytest.raises(OverflowError):
        np_fn(I.specials(dtype), scalar)


@pytest.mark.parametrize("fn", [O.eq, O.lt, lm.not_equal])
def test_weak_int_out_of_range_comparison_raises(fn):
    """lamina raises for an out-of-range integer in comparisons too (setup.operand:
    one rule for every operator). NumPy 2 special-cases comparisons (uint8 == 300 is
    all False) -- a documented difference, so lamina's behaviour is asserted."""
    t = lm.asarray(np.array([0, 255], np.uint8))
    with pytest.raises(OverflowError, match="300"):
        fn(t, 300)
    with pytest.raises(OverflowError, match="-1"):
        numpy_ref(fn, t, -1)


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int64", "uint64"])
def test_weak_float_scalar_on_int_tensor(dtype):
    """int tensor + 1.5 computes in the default float (and so do -, *, maximum); the
    reference computes in float64 and is cast to it."""
    a = I.specials(dtype)
    t = lm.asarray(a)
    df = I.default_dtype("f")
    for fn, ref in (
        (O.add, np.add),
        (O.sub, np.subtract),
        (O.mul, np.multiply),
        (lm.maximum, np.maximum),
    ):
        for got, want in (
            (fn(t, 1.5), ref(a.astype(np.float64), 1.5).astype(df)),
            (fn(-0.5, t), ref(-0.5, a.astype(np.float64)).astype(df)),
        ):
            I.assert_matches(got, want, df, where=f"{dtype} {fn}")


@pytest.mark.parametrize("op", ["bitwise_and", "bitwise_left_shift", "bitwise_xor"])
def test_float_scalar_on_bitwise_raises(op):
    t = lm.asarray(np.arange(4, dtype=np.int32))
    with pytest.raises(TypeError, match=op):
        getattr(lm, op)(t, 1.5)
    with pytest.raises(TypeError, match=op):
        numpy_ref(getattr(lm, op), 2.0, t)


# ---------------------------------------------------------------- rejected dtypes, errors


def _rejected(op, dtype):
    kind = np.dtype(dtype).kind
    promoted = op.rule in I.PROMOTES_TO_FLOAT and kind in "biu"
    return kind not in I.ACCEPTS[op.rule] and not promoted


def _rejections():
    """Per operator the first real dtype it refuses, and complex128 where it refuses
    complex (floor, less, maximum, atan2, ...: no order, or only real arguments)."""
    params = []
    for op in I.OPS.values():
        for d in ("bool", "float32", "float64"):
            if _rejected(op, d):
                params.append(pytest.param(op, d, id=f"{op.name}-{d}"))
                break
        if _rejected(op, "complex128"):
            params.append(pytest.param(op, "complex128", id=f"{op.name}-complex128"))
    return params


@pytest.mark.parametrize("op, dtype", _rejections())
def test_rejected_dtype_raises_type_error(op, dtype):
    """Operators reject dtype kinds they do not take (lamina is stricter than NumPy on
    bool: ``add(bool, bool)`` and ``abs(bool)`` raise, as the Array API allows)."""
    t = lm.asarray(I.specials(dtype))
    fn = getattr(lm, op.name)
    args = (t,) * op.arity
    with pytest.raises(TypeError, match=f"{op.name} needs"):
        fn(*args)
    with pytest.raises(TypeError, match=f"{op.name} needs"):
        numpy_ref(fn, *args)
    if op.arity == 2:  # also after promotion with another dtype or a scalar
        for other in (
            lm.asarray(np.array(3, "int8")),
            lm.asarray(np.array(3, "uint16")),
            True,
            1,
            1.0,
        ):
            np_other = other.numpy() if isinstance(other, lm.Tensor) else other
            if I.comp_dtype(op, [t.numpy(), np_other]) is None:
                with pytest.raises(TypeError, match=op.name):
                    fn(t, other)
                with pytest.raises(TypeError, match=op.name):
                    numpy_ref(fn, other, t)


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("add", "float64"),
        ("equal", "float64"),
        ("atan2", "float64"),
        ("bitwise_or", "int64"),
        ("logical_and", "bool"),
    ],
)
def test_binary_errors(name, dtype):
    fn = getattr(lm, name)
    x = lm.asarray(np.ones((2, 3), dtype))
    y = lm.asarray(np.ones((4,), dtype))
    for backend_fn in (fn, lambda *a: numpy_ref(fn, *a)):
        with pytest.raises(ValueError, match=r"\(2, 3\) and \(4,\)"):
            backend_fn(x, y)
        with pytest.raises(TypeError, match="at least one tensor"):
            backend_fn(1, 2)
        with pytest.raises(TypeError, match="list"):
            backend_fn(x, [1, 2, 3])
        with pytest.raises(TypeError, match="ndarray"):
            backend_fn(np.ones(3), x)


def test_unary_requires_tensor():
    for fn in (lm.exp, lm.abs, lm.isnan):
        with pytest.raises(TypeError, match="expected a tensor"):
            fn(1.0)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("backend", ["numba_cpu", "numpy_ref"])
def test_pow_negative_integer_exponent(dtype, backend):
    """An integer power with a negative exponent raises, as in NumPy and PyTorch, on
    every backend and layout (a truncated result would be silently wrong)."""
    b = lm.asarray(np.array([2, 1, -1, -1, 5, -3, 0], dtype))
    e = lm.asarray(np.array([1, 5, 1, 2, 2, 3, -1], dtype))
    with lm.backends.use(backend):
        for call in (
            lambda: b**e,
            lambda: b**-1,
            lambda: lm.pow(b[::-1], e[::-1]),
            lambda: 2**e,
            lambda: b.__ipow__(e),
        ):
            with pytest.raises(ValueError, match="negative integer powers"):
                call()
        I.assert_matches(b ** lm.abs(e), np.array(b) ** np.abs(np.array(e)), dtype)
        empty = lm.zeros((0, 7), dtype=lm.__dict__[dtype]) ** e  # nothing to compute
        assert empty.shape == (0, 7)


# ---------------------------------------------------------------- in-place operators

INPLACE = [op for op in I.BINARY if op.inplace is not None]
INPLACE_LAYOUTS = [
    "same-shape",
    "bcast",
    "scalar",
    "strided-target",
    "reversed-target",
    "transposed-target",
    "overlap",
]


def _inplace_case(op, dtype, layout):
    """(base NumPy array, target view function, lamina operand, NumPy operand); the
    test wraps a copy of the base as a tensor and updates ``view(tensor)`` in place."""
    rng = I._rng("inplace", op.name, dtype, layout)
    p0, p1 = op.pool(dtype, 0), op.pool(dtype, 1)
    view = {
        "strided-target": lambda a: a[::2, ::-3],
        "reversed-target": lambda a: a[::-1],
        "transposed-target": lambda a: a.T,
    }.get(layout, lambda a: a)
    shape = {
        "same-shape": (24,),
        "bcast": (3, 4),
        "scalar": (13,),
        "strided-target": (6, 10),
        "reversed-target": (3, 4),
        "transposed-target": (4, 3),
        "overlap": (9,),
    }[layout]
    base = I.draw(p0, shape, rng)
    target_shape = view(base).shape
    if layout == "scalar":
        s = I.python_scalars(op, dtype, 1)[0]
        return base, view, s, s
    if layout == "overlap":
        return base, view, None, None  # the operand is the target reversed
    other_shape = target_shape if layout == "same-shape" else target_shape[-1:]
    o = I.draw(p1, other_shape, rng)
    if layout == "transposed-target":
        o = I.draw(p1, (2,) + target_shape[-1:], rng)[1]
    return base, view, lm.asarray(o.copy()), o


@pytest.mark.parametrize("layout", INPLACE_LAYOUTS)
@pytest.mark.parametrize("op, dtype", I.op_dtype_params(INPLACE))
def test_inplace(op, dtype, layout):
    """``x op= y`` updates x's own storage (views included, other elements untouched),
    returns x itself, and equals NumPy's out-of-place result; a result dtype other than
    x's raises TypeError (``int16 /= 2``, ``int8 += 1.5``)."""
    if layout == "overlap" and op.rhs is not None:
        layout = "reversed-target"  # x ** x[::-1] would need negative integer exponents
    base, view, other, other_np = _inplace_case(op, dtype, layout)
    results = []
    for backend in ("numba_cpu", "numpy_ref"):
        t = lm.asarray(base.copy())
        target = view(t)
        operand = target[::-1] if layout == "overlap" else other
        target_np = view(base)
        operand_np = target_np[::-1].copy() if layout == "overlap" else other_np
        want, res = I.expected(op, [target_np, operand_np])
        with lm.backends.use(backend):
            if want is None or res != target_np.dtype:
                with pytest.raises(TypeError, match=op.name + "_"):
                    op.inplace(target, operand)
                np.testing.assert_array_equal(t.numpy(), base)  # nothing written
                continue
            out = op.inplace(target, operand)
        assert out is target
        want_base = base.copy()
        view(want_base)[...] = want
        I.assert_matches(t, want_base, dtype, op.signed_zero, f"{op.name}_ {backend}")
        results.append(t.numpy().copy())
    if len(results) == 2:
        I.assert_matches(lm.asarray(results[0]), results[1], dtype, op.signed_zero)


@pytest.mark.parametrize("backend", ["numba_cpu", "numpy_ref"])
def test_inplace_errors(backend):
    with lm.backends.use(backend):
        x = lm.asarray(np.zeros(3, np.int16))
        with pytest.raises(TypeError, match="int16"):
            x /= 2
        with pytest.raises(TypeError, match=I.default_dtype("f").name):
            x += 1.5  # int16 with a Python float: the default float
        with pytest.raises(TypeError, match="float64"):
            x *= lm.asarray(np.ones(3))  # a NumPy float64 array keeps its dtype
        f = lm.asarray(np.zeros(3))
        with pytest.raises(TypeError, match="bitwise_and_"):
            f &= 1
        with pytest.raises(TypeError, match="bitwise_left_shift_"):
            f <<= 1
        b = lm.asarray(np.zeros(3, bool))
        with pytest.raises(TypeError, match="bitwise_right_shift_"):
            b >>= True
        with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
            x += lm.asarray(np.ones((2, 3), np.int16))
        ro = lm.broadcast_to(lm.asarray(np.zeros(3, np.int16)), (2, 3))
        with pytest.raises(ValueError, match="read-only"):
            ro += 1
        with pytest.raises(OverflowError):
            x += 2**20
        np.testing.assert_array_equal(x.numpy(), np.zeros(3, np.int16))  # unchanged
        b &= True  # bool stays bool
        b |= lm.asarray(np.array([True, False, True]))
        I.assert_matches(b, np.array([True, False, True]), bool)


# ---------------------------------------------------------------- Tensor operators


REFLECTED = [
    (O.sub, 2),
    (O.add, 3),
    (O.mul, 3),
    (O.truediv, 2),
    (O.floordiv, 7),
    (O.mod, 7),
    (O.pow, 2),
    (O.lshift, 1),
    (O.rshift, 100),
    (O.and_, 6),
    (O.or_, 8),
    (O.xor, 5),
]


@pytest.mark.parametrize("fn, s", REFLECTED, ids=[f.__name__ for f, _ in REFLECTED])
def test_reflected_operators(fn, s):
    """``2 - x``, ``2 / x``, ``2 ** x`` ... equal NumPy's with the scalar on the left
    (each on the first and last dtype its operator is tested with)."""
    op = next(op for op in I.BINARY if op.dunder is fn)
    for dtype in (op.dtypes[0], op.dtypes[-1]):
        a = np.array([1, 2, 3, 7], dtype)
        t = lm.asarray(a)
        got = fn(s, t)
        with np.errstate(all="ignore"):  # NumPy 2 keeps the scalar weak too
            want = fn(s, a)
        assert want.dtype == I.result_dtype(op, I.comp_dtype(op, [a, s]))
        I.assert_matches(got, want, want.dtype, where=f"{fn.__name__}({s}, {dtype})")
        I.assert_matches(got, op.ref(np.asarray(s, want.dtype), a.astype(want.dtype)), want.dtype)


@pytest.mark.parametrize("fn", [O.eq, O.ne, O.lt, O.le, O.gt, O.ge])
def test_comparison_operators(fn):
    op = next(op for op in I.BINARY if op.dunder is fn)
    dtype = next(d for d in op.dtypes if d in I.FLOATS)
    a = np.array([[1.0, np.nan, -0.0], [3.0, 2.0, np.inf]], dtype)
    b = np.array([2.0, np.nan, 0.0], dtype)
    x, y = lm.asarray(a), lm.asarray(b)
    I.assert_matches(fn(x, y), fn(a, b), bool, where=fn.__name__)
    I.assert_matches(fn(y, x.T[::-1].T), fn(b, a[:, ::-1]), bool, where=fn.__name__)
    I.assert_matches(fn(x, 2.0), fn(a, 2.0), bool, where=fn.__name__)
    I.assert_matches(fn(2.0, x), fn(2.0, a), bool, where=f"reflected {fn.__name__}")


def test_comparison_with_other_objects():
    x = lm.asarray(np.array([1.0, 2.0]))
    assert (x == None) is False  # noqa: E711  (NotImplemented -> identity)
    assert (x != "a") is True
    with pytest.raises(TypeError):
        x < "a"  # noqa: B015


def test_unary_operators():
    a = np.array([-3, 0, 5, -128, 127], np.int8)
    t = lm.asarray(a)
    I.assert_matches(-t, -a, "int8")
    I.assert_matches(+lm.asarray(a.astype("int32")), a.astype("int32"), "int32")
    I.assert_matches(abs(t), np.abs(a), "int8")
    I.assert_matches(~t, ~a, "int8")
    b = lm.asarray(np.array([True, False]))
    I.assert_matches(~b, np.array([False, True]), bool)
    with pytest.raises(TypeError, match="negative"):
        _ = -b


def test_ndarray_operand_defers_to_tensor():
    """ndarray <op> Tensor does not let NumPy broadcast the tensor as an object array:
    Tensor sets __array_ufunc__ = None, so Python calls the reflected operator, which
    rejects the ndarray (convert it with lm.asarray)."""
    t = lm.asarray(np.arange(3.0))
    with pytest.raises(TypeError, match="ndarray"):
        np.arange(3.0) + t
    with pytest.raises(TypeError, match="ndarray"):
        np.arange(3.0) - t


# ---------------------------------------------------------------- where and clip

WHERE_DTYPES = ["bool", "int16", "uint32", "float32", "float64"]
WHERE_LAYOUTS = {  # (cond, x1, x2) (base shape, view)
    "same-shape": (((7,), "contiguous"),) * 3,
    "0d": (((), "contiguous"),) * 3,
    "empty": (((0, 2), "contiguous"), ((2,), "contiguous"), ((0, 1), "contiguous")),
    "bcast": (((3, 1), "contiguous"), ((4,), "contiguous"), ((1, 4), "contiguous")),
    "strided": (((4, 5), "transposed"), ((4, 5), "transposed"), ((10, 12), "stepped-2d")),
}


def _where_sample(dtype, layout, dtype2=None):
    rng = I._rng("where", dtype, dtype2, layout)
    (sc, vc), (s1, v1), (s2, v2) = WHERE_LAYOUTS[layout]
    c, ca = I.make(np.array([True, False]), sc, vc, rng)
    x1, a1 = I.make(I.specials(dtype), s1, v1, rng)
    x2, a2 = I.make(I.specials(dtype2 or dtype), s2, v2, rng)
    return (c, x1, x2), (ca, a1, a2)


def _expect_where(ca, a1, a2):
    comp = np.result_type(*[a.dtype if isinstance(a, np.ndarray) else a for a in (a1, a2)])
    return np.where(ca, np.asarray(a1, comp), np.asarray(a2, comp)), comp


@pytest.mark.parametrize("layout", list(WHERE_LAYOUTS))
@pytest.mark.parametrize("dtype", WHERE_DTYPES)
def test_where(dtype, layout):
    (c, x1, x2), (ca, a1, a2) = _where_sample(dtype, layout)
    want, comp = _expect_where(ca, a1, a2)
    for got in (lm.where(c, x1, x2), numpy_ref(lm.where, c, x1, x2)):
        I.assert_matches(got, want, comp, where=f"where {dtype} {layout}")
    # a non-bool condition is truth-tested, as in NumPy
    cnum = lm.asarray(ca.astype(np.float64) * 2.5)
    I.assert_matches(lm.where(cnum, x1, x2), want, comp)


@pytest.mark.parametrize(
    "d1, d2", [("int8", "uint32"), ("uint32", "float32"), ("bool", "int16"), ("float32", "float64")]
)
def test_where_promotion(d1, d2):
    """x1 and x2 promote like a binary operator (int8/uint32 -> int64, not in the
    tested list, so the strided layout keeps it at one new kernel); the condition
    takes no part in promotion."""
    (c, x1, x2), (ca, a1, a2) = _where_sample(d1, "strided", d2)
    want, comp = _expect_where(ca, a1, a2)
    assert comp == np.promote_types(d1, d2)
    assert lm.where(c, x2, x1).dtype == I.lm_dtype(str(comp))
    I.assert_matches(lm.where(c, x1, x2), want, comp)
    I.assert_matches(numpy_ref(lm.where, c, x1, x2), want, comp)


@pytest.mark.parametrize(
    "dtype, scalar", [("int16", 7), ("float32", 0.5), ("uint32", True), ("float64", float("nan"))]
)
def test_where_python_scalar(dtype, scalar):
    (c, x1, _), (ca, a1, _) = _where_sample(dtype, "bcast")
    want, comp = _expect_where(ca, a1, scalar)
    assert comp == np.dtype(dtype)  # weak
    for got in (lm.where(c, x1, scalar), numpy_ref(lm.where, c, x1, scalar)):
        I.assert_matches(got, want, dtype)
    want2, _ = _expect_where(ca, scalar, a1)
    I.assert_matches(lm.where(c, scalar, x1), want2, dtype)


def test_where_errors():
    c = lm.asarray(np.array([True, False]))
    for fn in (lm.where, lambda *a: numpy_ref(lm.where, *a)):
        with pytest.raises(TypeError, match="where"):
            fn(c, [1], 2)  # a list is neither a tensor nor a Python scalar
        # Array API 2024.12: two Python scalars take their kinds' default dtype
        assert fn(c, 1, 2).dtype == lm.int64 and fn(c, 1, 2.5).tolist() == [1.0, 2.5]
        assert fn(c, True, False).dtype == lm.bool
        with pytest.raises(ValueError, match="where"):
            fn(c, lm.asarray(np.ones(3)), 0.0)
    with pytest.raises(OverflowError):
        lm.where(c, lm.asarray(np.zeros(2, np.uint8)), -1)


CLIP_DTYPES = ["int8", "uint8", "int64", "float32", "float64"]


@pytest.mark.parametrize("dtype", CLIP_DTYPES)
def test_clip(dtype):
    """clip keeps x's dtype; a None bound is no bound; a NaN bound gives NaN (NumPy);
    lo > hi gives hi (NumPy: min(max(x, lo), hi)); the result has the broadcast shape
    of x and the bounds (Array API), which may be larger than x's."""
    a = I.specials(dtype)
    is_float = dtype in I.FLOATS
    lo_s, hi_s = (-1.0, 2.5) if is_float else (2, 100)
    rng = I._rng("clip", dtype)
    cases = []
    for layout in ("contiguous", "transposed", "reversed"):
        shape = {"contiguous": (len(a),), "transposed": (5, 4), "reversed": (17,)}[layout]
        t, x = I.make(a, shape, layout, rng)
        cases += [
            (t, x, lo_s, hi_s),
            (t, x, None, hi_s),
            (t, x, lo_s, None),
            (t, x, None, None),
            (t, x, hi_s, lo_s),
        ]
    t, x = I.make(a, (3, 4), "contiguous", rng)
    lo, _ = I.make(a, (4,), "reversed", rng)
    hi, _ = I.make(a, (3, 1), "contiguous", rng)
    cases += [(t, x, lo, hi), (t, x, lo_s, hi)]
    same_lo, _ = I.make(a, (3, 4), "contiguous", rng)  # same shape: flat kernel
    same_hi, _ = I.make(a, (3, 4), "contiguous", rng)
    cases += [(t, x, same_lo, same_hi)]
    if is_float:
        cases += [(t, x, float("nan"), None), (t, x, None, float("nan"))]
    e, ea = I.make(a, (0, 4), "contiguous", rng)
    cases += [(e, ea, lo, None)]
    # bounds broadcasting to a larger shape than x's: the result has the larger shape
    col, xc = I.make(a, (3, 1), "contiguous", rng)
    scalar, xs = I.make(a, (), "contiguous", rng)
    lo5, _ = I.make(a, (5, 4), "transposed", rng)
    cases += [(col, xc, lo, None), (col, xc, None, lo), (col, xc, lo, hi), (col, xc, lo5[:3], hi)]
    cases += [(scalar, xs, lo, hi), (scalar, xs, lo_s, lo), (scalar, xs, hi, None)]
    wants = []
    for t, x, lo, hi in cases:
        np_lo, np_hi = (b.numpy() if isinstance(b, lm.Tensor) else b for b in (lo, hi))
        want = x.copy()  # NumPy's clip: minimum(maximum(x, lo), hi); NaN propagates
        if np_lo is not None:
            want = np.maximum(want, np.asarray(np_lo, dtype))
        if np_hi is not None:
            want = np.minimum(want, np.asarray(np_hi, dtype))
        if np_lo is not None and np_hi is not None:
            np.testing.assert_array_equal(np.clip(x, np_lo, np_hi), want, strict=True)
        wants.append(want)
        I.assert_matches(lm.clip(t, lo, hi), want, dtype, where=f"clip {dtype} {lo!r} {hi!r}")
    with lm.backends.use("numpy_ref"):
        for (t, _x, lo, hi), want in zip(cases, wants):
            I.assert_matches(lm.clip(t, lo, hi), want, dtype, where=f"numpy_ref clip {dtype}")


def test_clip_errors():
    x = lm.asarray(np.arange(4, dtype=np.uint8))
    for fn in (lm.clip, lambda *a: numpy_ref(lm.clip, *a)):
        with pytest.raises(ValueError, match=r"\(4,\) and \(3,\)"):  # not broadcastable
            fn(x, lm.asarray(np.zeros(3, np.uint8)), None)
        with pytest.raises(ValueError, match=r"\(4,\) and \(\) and \(2, 3\)"):
            fn(x, 1, lm.asarray(np.zeros((2, 3), np.uint8)))
        with pytest.raises(TypeError, match="clip"):
            fn(lm.asarray(np.array([True])), 0, 1)
        with pytest.raises(OverflowError):
            fn(x, -1, None)


# ---------------------------------------------------------------- parallel path


@pytest.fixture
def two_threads():
    lm.set_num_threads(2)
    try:
        assert lm.get_num_threads() == 2
        yield
    finally:
        lm.set_num_threads(1)
    assert lm.get_num_threads() == 1


@pytest.mark.core_independent  # from the parallel threshold on, both cores take the general path
def test_parallel_kernels(two_threads):
    """Above PARALLEL_ELEMENTS the prange variants run (flat and strided, unary, binary
    and where's ternary). When they compile (a cold cache, as on CI) Numba must turn
    each prange into a parallel loop: it warns, and runs serially, when it cannot."""
    n = threads.PARALLEL_ELEMENTS + 1000
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, n // 2))
    b = rng.standard_normal(n // 2)
    a[0, :50] = np.nan
    x, y = lm.asarray(a), lm.asarray(b)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NumbaPerformanceWarning)
        I.assert_matches(x + x, a + a, "float64")  # flat_parallel
        I.assert_matches(x[:, ::-1] + y, a[:, ::-1] + b, "float64")  # strided_parallel
        I.assert_matches(x.T[::-1] + y[::-1, None], a.T[::-1] + b[::-1, None], "float64")
        t = lm.asarray(a.T.copy())
        t += y[:, None]  # in place; the (n/2, 1) operand takes the strided kernel
        I.assert_matches(t, a.T + b[:, None], "float64")
        I.assert_matches(-x.T, -a.T, "float64")  # unary strided_parallel
        I.assert_matches(-x, -a, "float64")  # unary flat_parallel
        c = lm.asarray(a > 0)
        I.assert_matches(lm.where(c.T, x.T, 0.0), np.where(a.T > 0, a.T, 0.0), "float64")
        # a tensor with two scalars (ternary scalar_parallel)
        want = np.where(a > 0, 1.0, -1.0).astype(np.float32)  # the default float
        I.assert_matches(lm.where(c, 1.0, -1.0), want, "float32")
        I.assert_matches(lm.clip(x, -0.5, 0.5), np.clip(a, -0.5, 0.5), "float64")
        # a tensor with a scalar (scalar_parallel), on either side, a Python number or a
        # size-1 tensor broadcast over it
        I.assert_matches(x * 0.5, a * 0.5, "float64")
        I.assert_matches(2.0 - x, 2.0 - a, "float64")
        I.assert_matches(x / lm.asarray([[4.0]]), a / 4.0, "float64")
        I.assert_matches(lm.asarray(3.0) - x, 3.0 - a, "float64")
        # in place on a contiguous target (inplace_parallel, Note [In-place loops]): a
        # tensor of its shape, itself, a scalar, a size-1 tensor
        t = lm.asarray(a.copy())
        t -= x
        t += lm.asarray(a[::-1].copy())
        t *= t
        t /= 4.0
        t -= lm.asarray([[0.25]])
        I.assert_matches(t, (a - a + a[::-1]) ** 2 / 4.0 - 0.25, "float64")
    with lm.backends.use("numpy_ref"):
        I.assert_matches(x[:, ::-1] + y, a[:, ::-1] + b, "float64")


def test_narrow_elements_go_parallel_from_a_higher_threshold(two_threads):
    """Note [Parallel threshold]: bool (and 8- and 16-bit) elementwise kernels stay
    serial up to NARROW_ELEMENTWISE_FACTOR times the threshold, folds up to
    NARROW_FOLD_FACTOR times, and run their prange variants above; every side gives
    NumPy's results (elementwise, any/all over a full scan, a sum of int8)."""
    factors = (threads.NARROW_ELEMENTWISE_FACTOR, threads.NARROW_FOLD_FACTOR)
    assert 1 < factors[0] < factors[1]
    thresholds = (elementwise._parallel_min_narrow, reductions._parallel_min_narrow)
    assert thresholds == tuple(threads.parallel_threshold() * f for f in factors)
    for n in (threads.PARALLEL_ELEMENTS + 5, *(int(t) + 5 for t in thresholds)):
        b = np.zeros(n, bool)
        b[-1] = True
        b[::7] = True
        x = lm.asarray(b)
        I.assert_matches(lm.logical_not(x), ~b, "bool")
        I.assert_matches(x & lm.asarray(b[::-1].copy()), b & b[::-1], "bool")
        assert lm.any(lm.asarray(np.eye(1, n, n - 1, dtype=bool)[0])).item()
        assert not lm.all(lm.asarray(~np.eye(1, n, n - 1, dtype=bool)[0])).item()
        i8 = (np.arange(n) % 5).astype(np.int8)
        assert lm.sum(lm.asarray(i8)).item() == i8.sum(dtype=np.int64)


def test_vector_math_keeps_its_own_loops_where_they_are_faster(two_threads):
    """Note [NumPy SIMD loops]: exp and log never hand over to NumPy's loop: on two
    threads from the parallel threshold on, and below it on one, their values are, bit
    for bit, those of the fast path's serial loop on small pieces (the vector math's
    results do not depend on the loop), where NumPy's loops round some elements
    differently; tanh runs NumPy's loop at every size, on both threads."""
    rng = np.random.default_rng(5)
    x = rng.uniform(0.01, 9.0, threads.PARALLEL_ELEMENTS + 3).astype(np.float32)
    pieces = np.array_split(x, 64)

    def serial(fn):
        return np.concatenate([fn(lm.asarray(p)).numpy() for p in pieces])

    for fn in (lm.exp, lm.log):
        want = serial(fn)
        np.testing.assert_array_equal(fn(lm.asarray(x)).numpy(), want, err_msg=fn.__name__)
        middle = x[: threads.PARALLEL_ELEMENTS // 2]  # below the parallel threshold
        got = fn(lm.asarray(middle)).numpy()
        np.testing.assert_array_equal(got, want[: middle.size], err_msg=fn.__name__)
    for size in (x.size, 100):
        got = lm.tanh(lm.asarray(x[:size])).numpy()
        np.testing.assert_array_equal(got, np.tanh(x[:size]))


def test_set_num_threads_validates():
    with pytest.raises(ValueError, match="num_threads"):
        lm.set_num_threads(0)
    assert lm.get_num_threads() == 1


# ---------------------------------------------------------------- hypothesis


def _views(draw, shape):
    """A float64 array of ``shape`` as a view: maybe reversed, stepped or transposed."""
    kind = draw(st.sampled_from(["contiguous", "reversed", "stepped", "transposed"]))
    elements = st.floats(allow_nan=True, allow_infinity=True, width=64) | st.sampled_from(
        I.FLOAT_SPECIALS
    )
    if kind == "transposed":
        base = draw(hnp.arrays(np.float64, shape[::-1], elements=elements))
        axes = tuple(range(len(shape)))[::-1]
        return lm.permute_dims(lm.asarray(base), axes), base.transpose(axes)
    big = tuple(2 * s for s in shape) if kind == "stepped" else shape
    base = draw(hnp.arrays(np.float64, big, elements=elements))
    t = lm.asarray(base)
    if kind == "reversed" and shape:
        return t[::-1], base[::-1]
    if kind == "stepped":
        # the Ellipsis keeps a 0-d view an array (NumPy gives a scalar for base[()])
        key = (*(slice(None, None, 2) for _ in shape), Ellipsis)
        return t[key], base[key]
    return t, base


@pytest.mark.parametrize("name", ["add", "multiply", "maximum"])
@HYPOTHESIS
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4), data=st.data()
)
def test_hypothesis_broadcasting_float64(name, shapes, data):
    op = I.OPS[name]
    (s1, s2), out_shape = shapes
    x1, a1 = _views(data.draw, s1)
    x2, a2 = _views(data.draw, s2)
    got = check(op, getattr(lm, name), [x1, x2], [a1, a2], f"{s1} {s2}")
    assert got.shape == out_shape


@HYPOTHESIS
@given(
    dtype=st.sampled_from(I.SIGNED + I.UNSIGNED + ("bool",)),
    value=st.integers(-(2**65), 2**65) | st.sampled_from([0, 1, -1, 2**63, 2**64 - 1]),
)
def test_hypothesis_weak_int_scalar(dtype, value):
    """add(tensor, int): OverflowError exactly when the int does not fit the result dtype
    (int64 for bool tensors); otherwise that dtype, with NumPy's wrapped values."""
    a = I.specials(dtype)
    t = lm.asarray(a)
    res = np.dtype("int64") if dtype == "bool" else a.dtype
    info = np.iinfo(res)
    if not info.min <= value <= info.max:
        with pytest.raises(OverflowError):
            t + value
        return
    with np.errstate(over="ignore"):
        want = np.add(a.astype(res), np.asarray(value, res))
    I.assert_matches(t + value, want, res)
    I.assert_matches(value + t[::-1], want[::-1], res)


@HYPOTHESIS
@given(
    data=st.data(),
    name=st.sampled_from(["floor_divide", "remainder"]),
    dtype=st.sampled_from(["int64", "float64"]),
)
def test_hypothesis_division(data, name, dtype):
    """floor_divide/remainder keep NumPy's sign conventions (floor, sign of divisor),
    including division by zero (0 for ints, inf/NaN for floats)."""
    op = I.OPS[name]
    n = data.draw(st.integers(0, 12))
    if dtype == "int64":
        el = st.integers(-(2**63), 2**63 - 1) | st.integers(-5, 5)
    else:
        el = st.floats(width=64) | st.sampled_from(I.FLOAT_SPECIALS)
    a1 = data.draw(hnp.arrays(dtype, n, elements=el))
    a2 = data.draw(hnp.arrays(dtype, n, elements=el))
    check(op, getattr(lm, name), [lm.asarray(a1), lm.asarray(a2)], [a1, a2])


def test_python_int_with_bool_tensor_promotes_whatever_its_value():
    # the scalar fast path must not keep bool for 0 and 1 only (NEP 50: int64 always)
    b = lm.asarray([True, False])
    for v in (0, 1, 2):
        assert (b & v).dtype == lm.int64 and (b ^ v).dtype == lm.int64
    np.testing.assert_array_equal((b ^ 1).numpy(), [0, 1])
    assert (b == 1).dtype == lm.bool and (b | True).dtype == lm.bool


def test_python_int_with_float_tensor_keeps_the_float_dtype():
    for dt in (lm.float32, lm.float64):
        x = lm.asarray([1.5, -2.0], dtype=dt)
        for result, expected in ((x * 2, [3.0, -4.0]), (3 - x, [1.5, 5.0]), (x**2, [2.25, 4.0])):
            assert result.dtype == dt
            np.testing.assert_array_equal(result.numpy(), expected)


def test_clip_refuses_a_bound_of_another_kind():
    x = lm.asarray([1, 5, 10])
    for backend in ("numba_cpu", "numpy_ref"):
        with lm.backends.use(backend):
            with pytest.raises(TypeError, match="clip: a bound of kind float"):
                lm.clip(x, 2.5, 8)
            np.testing.assert_array_equal(lm.clip(x, 2, 8).numpy(), [2, 5, 8])


@pytest.mark.parametrize("backend", ["numba_cpu", "numpy_ref"])
@pytest.mark.parametrize(
    "name", ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]
)
def test_mixed_sign_comparisons_are_exact(name, backend):
    """A signed integer against uint64 promotes to float64, which rounds above 2**53;
    comparisons must still be exact, as in NumPy 2 (2**63 - 1 < 2**63, -1 < 2**64 - 1)."""
    signed = np.array([2**63 - 1, -1, 5, -(2**63), 2**53 + 1, 0], np.int64)
    unsigned = np.array([2**63, 2**64 - 1, 5, 0, 2**53, 0], np.uint64)
    small = np.array([-128, 127, 0, 1, -1, 5], np.int8)
    fn, ref = getattr(lm, name), getattr(np, name)
    with lm.backends.use(backend):
        for a, b in [
            (signed, unsigned),
            (unsigned, signed),
            (small, unsigned),
            (signed[::-2], unsigned[::2]),
            (signed[:, None], unsigned),
        ]:
            got = fn(lm.asarray(a), lm.asarray(b))
            np.testing.assert_array_equal(got.numpy(), ref(a, b), err_msg=f"{a.dtype} {b.dtype}")
            assert got.dtype == lm.bool


@pytest.mark.parametrize("name", sorted(SIMD_OPERATORS))
def test_simd_loops_on_large_inputs(name):
    """The transcendental functions run NumPy's SIMD loops (Note [NumPy SIMD loops]) on
    operands lamina sets up: contiguous, strided and reversed float inputs, integer
    inputs promoted to the default float, special values, and no warnings for inf/nan
    results; a binary one also with a scalar second operand and one broadcast along the
    rows. The reference is NumPy's own loop in the result
    dtype (the integers cast to the default float first, as lamina does)."""
    ref = getattr(
        np,
        {
            "asin": "arcsin",
            "acos": "arccos",
            "atan": "arctan",
            "asinh": "arcsinh",
            "acosh": "arccosh",
            "atanh": "arctanh",
            "atan2": "arctan2",
            "pow": "power",
        }.get(name, name),
    )
    rng = np.random.default_rng(7)
    base = rng.uniform(-3, 3, 768)
    base[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0]
    fn = getattr(lm, name)
    binary = OPERATORS[name].arity == 2

    def check(view, dtype, second=None):
        other = lm.asarray(second) if isinstance(second, np.ndarray) else second
        args = (lm.asarray(view),) if second is None else (lm.asarray(view), other)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = fn(*args)
        with np.errstate(all="ignore"):
            x = view.astype(dtype.np)
            want = ref(x) if second is None else ref(x, np.asarray(second, dtype.np))
        assert got.dtype == dtype
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, equal_nan=True)

    for dtype in (lm.float32, lm.float64):
        n = base.astype(dtype.np)
        for view in (n, n[::2], n[::-1].reshape(-1, 4)):
            if binary:  # a Python scalar, a reversed view, a row broadcast down
                for second in (1.5, view[::-1], *[view[0]][: view.ndim - 1]):
                    check(view, dtype, second)
            else:
                check(view, dtype)
    check(np.arange(-384, 384, dtype=np.int32), lm.get_default_dtype(), *[1.5][:binary])


_NUMPY_LOOP_OPERATORS = sorted(name for name, ew in elementwise.BY_NAME.items() if ew.numpy_loops)


def _numpy_twin(name):
    return getattr(np, OPERATORS[name].numpy)


def _same_bits(got, want, what):
    """Equal values, NaN where NaN, and the same sign of every zero."""
    np.testing.assert_array_equal(got, want, err_msg=what)
    assert got.dtype == want.dtype, what
    assert np.array_equal(np.signbit(got), np.signbit(want)) or np.isnan(want).any(), what


def test_numpy_loops_give_numpy_values_at_every_size():
    """Note [NumPy inner loops]: the float32 and float64 loops of these operators are
    NumPy's own at every size -- the C core's fast path (contiguous, a Python scalar on
    either side), its general path (strided, broadcast) and the pure-Python core's
    ufunc call -- so each result equals NumPy's exactly, special values and signed
    zeros included, with no warning for inf and NaN results."""
    assert {"sin", "atanh", "pow", "atan2", "reciprocal"} <= set(_NUMPY_LOOP_OPERATORS)
    rng = np.random.default_rng(11)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5]
    for dtype in (np.float32, np.float64):
        for n in (0, 1, 100, 10_001):
            x = rng.uniform(-3, 3, n).astype(dtype)
            x[: len(special)] = special[:n]
            y = np.roll(x, 3)
            for name in _NUMPY_LOOP_OPERATORS:
                fn, ref = getattr(lm, name), _numpy_twin(name)
                binary = OPERATORS[name].arity == 2
                cases = [(x,), (x[::3],)]
                if binary:
                    cases = [(x, y), (x[::3], y[::3]), (x, 1.5), (-2.5, x)]
                    if n >= 4:
                        m = x[: n // 4 * 4].reshape(-1, 4)
                        cases.append((m, m[0]))  # a row broadcast down
                for args in cases:
                    tensors = [lm.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
                    with warnings.catch_warnings():
                        warnings.simplefilter("error")
                        got = fn(*tensors).numpy()
                    with np.errstate(all="ignore"):
                        want = ref(*[a if isinstance(a, np.ndarray) else dtype(a) for a in args])
                    _same_bits(got, want, f"{name} {dtype.__name__} n={n}")


def test_numpy_loops_split_over_threads(two_threads, monkeypatch):
    """From the parallel threshold on, NumPy's loops run on the threads: dense operands
    in parts called from C (Note [NumPy loops on threads]), others (and the pure-Python
    core's) split by rows from SPLIT_FACTOR times the threshold. Either way the values
    are NumPy's one call's, for contiguous, broadcast and in-place operands."""
    ways = []
    split, parts = threads.split, elementwise._numpy_parts
    monkeypatch.setattr(threads, "split", lambda fn, total: ways.append("rows") or split(fn, total))
    monkeypatch.setattr(elementwise, "_numpy_parts", lambda: ways.append("C") or parts())
    n = threads.PARALLEL_ELEMENTS * elementwise.SPLIT_FACTOR // 2 + 7
    rng = np.random.default_rng(12)
    a = rng.uniform(-2, 2, (2, n)).astype(np.float32)
    x = lm.asarray(a)
    _same_bits(lm.sin(x).numpy(), np.sin(a), "sin")
    _same_bits((1.5**x).numpy(), np.power(np.float32(1.5), a), "a scalar base")
    _same_bits(lm.atan2(x, x[1]).numpy(), np.arctan2(a, a[1]), "atan2 broadcast")
    t = lm.asarray(a.copy())
    t.pow_(x[::-1])  # in place, the target one of the operands
    with np.errstate(invalid="ignore"):  # negative bases: NaN
        _same_bits(t.numpy(), np.power(a, a[::-1]), "pow_")
    dense = "rows" if core.numpy_loop is None else "C"
    assert ways == [dense, dense, "rows", "rows"]  # sin, pow, atan2, pow_


def test_numpy_loop_missing_falls_back_to_the_ufunc():
    """A ufunc whose table has no loop of the dtype's signature (another NumPy's) sends
    the calls to the reference, which calls the ufunc: NumPy's values, no crash."""
    ew = elementwise.Elementwise(
        OPERATORS["sin"], 1, elementwise.ELEMENTWISE_SCALARS["sin"], simd=np.sin
    )
    ew.numpy_ufunc = lambda index: np.isnan  # float -> bool: not sin's signature
    kernel = elementwise.unary_kernel(ew)
    a = np.linspace(-3, 3, 101, dtype=np.float32)
    for x in (a, a[::2]):
        _same_bits(kernel(1, lm.asarray(x)).numpy(), np.sin(x), "sin")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nextafter_steps_bits_as_numpy(dtype):
    """nextafter's loop steps x's bits (kernels._nextafter): bit for bit NumPy's on
    every pair of special values -- zeros of both signs, subnormals, the largest finite
    values, infinities, NaN -- and on random pairs, odd and empty sizes."""
    info = np.finfo(dtype)
    special = np.array(
        [0.0, -0.0, 1.0, -1.0, 2.0, np.inf, -np.inf, np.nan, info.max, -info.max]
        + [info.smallest_subnormal, -info.smallest_subnormal, info.tiny, -info.tiny],
        dtype,
    )
    a, b = (v.ravel() for v in np.meshgrid(special, special))
    rng = np.random.default_rng(13)
    for x, y in ((a, b), (rng.standard_normal(1001).astype(dtype),) * 2, (a[:0], b[:0])):
        y = y if x is not y else rng.standard_normal(x.size).astype(dtype)
        got = lm.nextafter(lm.asarray(x), lm.asarray(y)).numpy()
        with np.errstate(all="ignore"):
            want = np.nextafter(x, y)
        bits = f"i{np.dtype(dtype).itemsize}"
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got[~nan].view(bits), want[~nan].view(bits))
    got = lm.nextafter(lm.asarray(a[::3]), 1.0).numpy()  # strided, a Python scalar
    np.testing.assert_array_equal(got, np.nextafter(a[::3], dtype(1.0)))


@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_clip_and_where_with_two_scalars(dtype):
    """clip with scalar bounds and where with scalar values run one loop over the tensor
    with the two scalars (kernels.ternary_scalars): against NumPy, with NaN in x and in a
    bound, crossed bounds (min > max: max wins), a bound missing, odd and empty sizes."""
    rng = np.random.default_rng(3)
    for n in (0, 1, 37):
        a = (rng.standard_normal(n) * 4).astype(dtype)
        if dtype == "float32" and n:
            a[0] = np.nan
        x = lm.asarray(a)
        bounds = [(-1, 2), (2, -1), (None, 0), (1, None)]
        if dtype == "float32":
            bounds += [(float("nan"), 1.0), (-0.5, 0.25)]
        for lo, hi in bounds:
            got = lm.clip(x, lo, hi)
            want = np.clip(a, *[np.asarray(b, dtype) if b is not None else None for b in (lo, hi)])
            assert got.dtype == x.dtype
            np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{lo} {hi}")
        got = lm.where(lm.asarray(a > 0), 3, -2)
        np.testing.assert_array_equal(got.numpy(), np.where(a > 0, 3, -2).astype(got.numpy().dtype))


def test_hypot_special_values_and_extremes():
    """hypot's vectorized form (the larger magnitude times sqrt(1 + r**2)) against libm's,
    through NumPy: C99's special values (an infinity beats NaN, zeros of both signs),
    magnitudes that would overflow or underflow squared, subnormals; within 2 ulp."""
    x = [0.0, -0.0, np.inf, -np.inf, np.nan, 3.0, -4.0, 1e30, 1e-30, 1e-45, np.nan, 0.0, 7.0]
    y = [-0.0, 0.0, np.nan, 3.0, -np.inf, -4.0, 3.0, 1e30, -1e-30, 1e-45, 1.0, 5.0, 1e-30]
    for dtype in (np.float32, np.float64):
        a, b = np.array(x, dtype), np.array(y, dtype)
        got = lm.hypot(lm.asarray(a), lm.asarray(b)).numpy()
        np.testing.assert_array_max_ulp(got, np.hypot(a, b), maxulp=2)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(np.hypot(a, b)))


@pytest.mark.parametrize("backend", ["numba_cpu", "numpy_ref"])
def test_clip_with_wider_integer_bounds_saturates_not_wraps(backend):
    """clip keeps x's dtype; an integer tensor bound of a wider dtype must bound as it
    would in that dtype (NumPy's values), not wrap when cast (-1 -> 255 on uint8)."""
    u8 = np.array([1, 200, 0], np.uint8)
    i8 = np.array([1, 5, -128], np.int8)
    with lm.backends.use(backend):
        for x, lo, hi in [
            (u8, np.array([-1]), None),
            (i8, None, np.array([1000])),
            (i8, np.array([-1000, 2, 0]), np.array([300])),
            (u8, np.array([300], np.int64), None),
        ]:
            got = lm.clip(
                lm.asarray(x),
                None if lo is None else lm.asarray(lo),
                None if hi is None else lm.asarray(hi),
            )
            info = np.iinfo(x.dtype)
            want = np.clip(x.astype(np.int64), lo, hi).clip(info.min, info.max).astype(x.dtype)
            assert got.dtype == lm.asarray(x).dtype
            np.testing.assert_array_equal(got.numpy(), want)


def test_comparing_with_a_list_or_array_raises():
    """Not Python's identity fallback (a silent False); None still compares False."""
    t = lm.asarray([1, 2])
    for other in ([1, 2], (1, 2), np.array([1, 2])):
        with pytest.raises(TypeError, match="lamina.asarray"):
            t == other  # noqa: B015
        with pytest.raises(TypeError, match="lamina.asarray"):
            t < other  # noqa: B015
    assert (t == None) is False  # noqa: E711
