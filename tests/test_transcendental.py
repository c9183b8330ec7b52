"""Accuracy of the vector math (Note [Vector math] in numba_cpu/kernels.py): the
maximum error in ulps of exp, log, tanh, sigmoid, logaddexp (and float32 erf) over
samples of every float exponent, against float64 (for float32 results) and long double
(for float64 results), and the special values; softmax and log_softmax (Note [Softmax kernels])
against float64 along every dim of both memory layouts."""

import math

import numpy as np
import pytest

import lamina as lm
import lamina.nn.functional as F
from lamina.backends import jit
from lamina.backends.numba_cpu import kernels as K

# the bound per function and float dtype, in ulps (the measured maxima are in the Note)
BOUNDS = {"exp": 1, "log": 1, "tanh": 2, "sigmoid": 3}
EXTENDED = np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant


def _float32_sample():
    """About 10**6 float32 values spread evenly over all bit patterns: every exponent,
    subnormals included, both signs."""
    bits = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    return x[np.isfinite(x)]


def _float64_sample():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**64, 2 * 10**5, dtype=np.uint64).view(np.float64)
    wide = rng.uniform(-800, 800, 10**5)  # every exp result, subnormal to overflow
    narrow = rng.uniform(-2, 2, 10**5)  # tanh and sigmoid's both ranges
    return np.concatenate([x[np.isfinite(x)], wide, narrow])


def _lamina(name, x):
    """lamina's function on x: tanh's vector polynomial in a loop of its own, since eager
    tanh runs NumPy's SIMD loop and only fused kernels run the polynomial (Note [NumPy
    SIMD loops])."""
    if name != "tanh":
        fn = F.sigmoid if name == "sigmoid" else getattr(lm, name)
        return fn(lm.asarray(x)).numpy()
    return _vector_loop(K.vector_tanh, x)


def _vector_loop(fn, x):
    """fn (a vector math function of kernels.py) on each element of x, in a Numba loop."""

    def loop(x, out):
        for i in range(x.size):
            out[i] = fn(x[i])

    got = np.empty_like(x)
    jit._load().njit(loop)(x, got)
    return got


def _reference(name, x):
    with np.errstate(all="ignore"):
        if name == "sigmoid":
            return 1 / (1 + np.exp(-x))
        return getattr(np, name)(x)


def max_ulp_error(got, want, dtype):
    """The largest |got - want| in ulps of want rounded to ``dtype`` (subnormal ulps
    below the normal range); NaN and infinities must match exactly."""
    with np.errstate(over="ignore"):
        rounded = want.astype(dtype)
    special = ~np.isfinite(rounded) | ~np.isfinite(got)
    np.testing.assert_array_equal(got[special], rounded[special])
    ulp = np.spacing(np.abs(rounded[~special])).astype(want.dtype)
    return float(np.max(np.abs(got[~special].astype(want.dtype) - want[~special]) / ulp))


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_float32_max_ulp_error(name):
    x = _float32_sample()
    if name == "log":
        x = np.abs(x)
    err = max_ulp_error(_lamina(name, x), _reference(name, x.astype(np.float64)), np.float32)
    assert err <= BOUNDS[name], f"{name} float32: {err:.3f} ulp"


@pytest.mark.skipif(not EXTENDED, reason="long double is no wider than float64 here")
@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_float64_max_ulp_error(name):
    x = _float64_sample()
    if name == "log":
        x = np.abs(x)
    err = max_ulp_error(_lamina(name, x), _reference(name, x.astype(np.longdouble)), np.float64)
    assert err <= BOUNDS[name], f"{name} float64: {err:.3f} ulp"


def test_float32_erf_max_ulp_error():
    """erf is no operator of lamina's: gelu calls it, so it is checked on its own here."""
    x = _float32_sample()
    got = _vector_loop(K.vector_erf, x)
    want = np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))
    err = max_ulp_error(got, want, np.float32)
    assert err <= 5, f"erf float32: {err:.3f} ulp"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logaddexp_max_ulp_error(dtype):
    """logaddexp's one vector loop (kernels.logaddexp): within 3 ulps of the largest of
    |max(x1, x2)|, log1p(t) and t |x1 - x2|, t = exp(-|x1 - x2|) (the terms it adds,
    and what the rounding of x1 - x2 moves; NumPy's is as close: near a zero result
    both have fewer correct bits), for operands over many magnitudes and differences
    from equal to far apart; against float64 (long double for float64)."""
    reference = np.float64 if dtype == np.float32 else np.longdouble
    if dtype == np.float64 and not EXTENDED:
        pytest.skip("long double is no wider than float64 here")
    rng = np.random.default_rng(2)
    x = rng.standard_normal(2 * 10**5) * rng.choice([1e-3, 1, 30, 1e4], 2 * 10**5)
    y = x + rng.standard_normal(x.size) * rng.choice([0, 1e-6, 0.1, 1, 30], x.size)
    x, y = x.astype(dtype), y.astype(dtype)
    got = lm.logaddexp(lm.asarray(x), lm.asarray(y)).numpy()
    a, b = x.astype(reference), y.astype(reference)
    want = np.logaddexp(a, b)
    d = np.abs(a - b)
    t = np.exp(-d)
    term = np.maximum.reduce([np.abs(np.maximum(a, b)), np.log1p(t), t * d])
    ulps = np.abs(got - want) / np.spacing(term.astype(dtype)).astype(reference)
    assert float(ulps.max()) <= 3, f"logaddexp {dtype.__name__}: {float(ulps.max()):.3f} ulp"
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, np.inf, -np.inf, 1e30, 1.0], dtype)
    other = np.array([np.inf, -np.inf, 1.0, -0.0, 0.0, -np.inf, 3.0, -1e30, np.nan], dtype)
    got = lm.logaddexp(lm.asarray(special), lm.asarray(other)).numpy()
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, np.logaddexp(special, other))


SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 5e-324, 88.73, -103.98, 710.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_special_values(name, dtype):
    """Infinities, NaN, signed zeros, subnormals, the overflow and underflow thresholds:
    C99's results (NumPy's), the sign of zero included."""
    x = np.array(SPECIALS, dtype)
    got = _lamina(name, x)
    want = _reference(name, x)
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps, equal_nan=True)
    number = ~np.isnan(want)  # a NaN's sign means nothing
    np.testing.assert_array_equal(np.signbit(got[number]), np.signbit(want[number]))


def _softmax_reference(a, dim, log):
    x = a.astype(np.float64)
    shifted = x - x.max(axis=dim, keepdims=True)
    total = np.exp(shifted).sum(axis=dim, keepdims=True)
    return shifted - np.log(total) if log else np.exp(shifted) / total


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_along_every_dim_of_both_layouts(dtype, log):
    """Rows (dim innermost in memory) and blocks of columns (any other dim, the inner
    size crossing a block boundary), contiguous, channels-last and strided views; the
    result keeps the input's memory layout."""
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((2, 3, 5, 300)) * 4).astype(dtype)
    channels_last = np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    fn = F.log_softmax if log else F.softmax
    eps = np.finfo(dtype).eps
    for view in (a, channels_last, a[:, :, ::2, 1::3]):
        for dim in range(-view.ndim, view.ndim):
            got = fn(lm.asarray(view), dim)
            want = _softmax_reference(view, dim, log)
            tol = dict(atol=16 * eps) if log else dict(rtol=32 * eps, atol=1e-30)
            np.testing.assert_allclose(got.numpy(), want, **tol, err_msg=f"dim {dim}")
            if view.flags.c_contiguous or view is channels_last:
                assert got._data.strides == view.strides


def test_softmax_special_rows():
    """A NaN in a row makes it NaN, so do +inf and a row of -inf only (PyTorch's
    results); -inf elements of a finite row give 0 (log: -inf); a row of one element."""
    x = np.array([[0, np.nan, 1], [-np.inf] * 3, [np.inf, 0, 1], [-np.inf, 0, 0]], np.float32)
    for dim, data in ((1, x), (0, np.ascontiguousarray(x.T))):
        got = F.softmax(lm.asarray(data), dim).numpy()
        got = got if dim == 1 else got.T
        assert np.isnan(got[:3]).all()
        np.testing.assert_array_equal(got[3], [0, 0.5, 0.5])
        logs = F.log_softmax(lm.asarray(data), dim).numpy()
        logs = logs if dim == 1 else logs.T
        np.testing.assert_allclose(logs[3], [-np.inf, -np.log(2), -np.log(2)], rtol=1e-7)
    np.testing.assert_array_equal(F.softmax(lm.asarray(np.ones((4, 1), np.float32)), 1).numpy(), 1)


def _activation_reference(name, x):
    """The activation in float64 (gelu from erfc: no cancellation in its tail)."""
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if name == "gelu":
            return 0.5 * x * np.vectorize(math.erfc, otypes=[np.float64])(-x / math.sqrt(2))
        if name == "gelu_tanh":
            return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        return x / (1 + np.exp(-x))  # silu


ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_error_relative_to_input(name, dtype):
    """gelu (both forms) and silu on 2 * 10**5 values over [-12, 12], contiguous (the
    fast path) and every other one (the general path): x Phi(x) computed as
    0.5 x (1 + erf(x / sqrt(2))) is off by a few eps |x| where Phi(x) is tiny, so the
    error is measured in eps * max(|x|, 1) (measured at most 1.7)."""
    x = np.random.default_rng(0).uniform(-12, 12, 2 * 10**5 + 1).astype(dtype)
    want = _activation_reference(name, x)
    scale = np.finfo(dtype).eps * np.maximum(np.abs(x.astype(np.float64)), 1.0)
    for got in (ACTIVATIONS[name](lm.asarray(x)), ACTIVATIONS[name](lm.asarray(x)[::2])):
        step = 1 if got.shape[0] == x.size else 2
        err = np.abs(got.numpy().astype(np.float64) - want[::step]) / scale[::step]
        assert err.max() <= 4, f"{name} {dtype.__name__}: {err.max():.2f} eps |x|"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_special_values(name, dtype):
    """inf stays inf, -inf and NaN give NaN (-inf times 0, as in PyTorch), the zeros
    keep their sign and a tiny x gives x / 2."""
    x = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, -1e-30], dtype)
    got = ACTIVATIONS[name](lm.asarray(x)).numpy()
    np.testing.assert_array_equal(got[:3], [np.inf, np.nan, np.nan])
    assert list(np.signbit(got[3:5])) == [True, False]
    assert got[3] == got[4] == 0 and got[5] == pytest.approx(-0.5e-30, rel=1e-6)


def test_vector_width_is_chosen_per_kernel():
    """Note [Vector width]: a loop of the vector math compiles for 512-bit vectors (on a
    CPU that has them), any other loop for the host's preferred width; a loop's values
    do not depend on its width, bit for bit."""
    import ctypes

    import llvmlite.binding as llvm

    from lamina.backends import jit
    from lamina.backends.numba_cpu import kernels as K
    from lamina.backends.numba_cpu.elementwise import BY_NAME
    from lamina.dispatch import dtypes as D

    assert K.vector_width(K.vector_exp) == jit.WIDE and K.vector_width(K.add) is None
    pointer = jit.types.CPointer(jit.types.float32)
    signature = jit.types.void(pointer, pointer, jit.types.int64)
    x = np.concatenate([_float32_sample()[::97], np.array(SPECIALS, np.float32)])
    results, attribute = [], '"prefer-vector-width"="512"'
    for width in (None, jit.WIDE):
        loop = jit.compile_cfunc(K.unary_cloop(K.vector_exp), signature, False, vector_width=width)
        assert (attribute in loop.inspect_llvm()) == (width is not None)
        if width and "+avx512f" in llvm.get_host_cpu_features().flatten():
            assert "zmm" in loop._library.get_asm_str()
        out = np.empty_like(x)
        as_pointer = ctypes.POINTER(ctypes.c_float)
        loop.ctypes(x.ctypes.data_as(as_pointer), out.ctypes.data_as(as_pointer), x.size)
        results.append(out)
    np.testing.assert_array_equal(results[0], results[1])
    # the elementwise loops of exp's operator are among the wide ones
    assert K.vector_width(BY_NAME["exp"].scalar_fn(D.float32)) == jit.WIDE
