"""lamina.fft (issue 15): all 14 functions of the standard's Fourier transform
extension, tested differentially against array-api-strict, NumPy and the numpy_ref
oracle (the DFT from its definition, independent of pocketfft): dtypes (single and
double precision, real input promoted where NumPy promotes it), n / s padding and
trimming, axes, the three norms, non-contiguous input, with hypothesis for the sizes;
bad input with type and message. The formulas' gradients are sampled in
test_autograd.py."""

import math

import array_api_strict as xp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lamina as lm

F = lm.fft
NORMS = ["backward", "ortho", "forward"]


def default_np():
    """NumPy's dtype of lamina's default float, read at call time (Note [Default dtype])."""
    return np.dtype(lm.get_default_dtype().name)


def default_complex_np():
    """NumPy's dtype of lamina's default complex dtype (of the default float's precision)."""
    return np.result_type(default_np(), np.complex64)


def default_rtol():
    """The tolerance of a result in the default dtype against a float64 reference: the
    usual 1e-10 in double precision; in single, float32's eps (1.2e-7) grown by the
    log2(n) butterfly passes and the rounding of the input, so 1e-5 of the values' scale."""
    return 1e-10 if lm.get_default_dtype() == lm.float64 else 1e-5


def cdata(shape, seed=0, dtype=np.complex128):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def rdata(shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def host(t):
    return t.numpy() if isinstance(t, lm.Tensor) else np.asarray(np.from_dlpack(t))


def same(got, want, rtol=1e-10):
    g, w = host(got), host(want) if not isinstance(want, np.ndarray) else want
    assert g.dtype == w.dtype, (g.dtype, w.dtype)
    assert g.shape == w.shape, (g.shape, w.shape)
    scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
    np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale)


def views(data):
    """Contiguous, transposed (of the reversed shape) and stepped views of data."""
    wide = np.zeros(data.shape[:-1] + (2 * data.shape[-1],), data.dtype)
    wide[..., ::2] = data
    return [data, np.ascontiguousarray(data.T).T, wide[..., ::2]]


ONE_D = [
    ("fft", {}),
    ("fft", {"n": 7, "axis": 0}),
    ("fft", {"n": 2}),
    ("ifft", {"norm": "ortho"}),
    ("ifft", {"n": 6, "axis": -2, "norm": "forward"}),
    ("irfft", {}),
    ("irfft", {"n": 7, "norm": "ortho"}),
    ("irfft", {"n": 3, "axis": 0}),
    ("hfft", {}),
    ("hfft", {"n": 5, "norm": "forward"}),
]
REAL_1D = [
    ("rfft", {}),
    ("rfft", {"n": 7, "axis": 0, "norm": "ortho"}),
    ("rfft", {"n": 3, "norm": "forward"}),
    ("ihfft", {}),
    ("ihfft", {"n": 8, "axis": 0}),
]
ND = [
    ("fftn", {}),
    ("fftn", {"s": (2, 6), "axes": (0, 1)}),
    ("fftn", {"axes": (1,), "norm": "ortho"}),
    ("ifftn", {"s": (-1, 3), "axes": (1, 0), "norm": "forward"}),
    ("irfftn", {}),
    ("irfftn", {"s": (3, 7), "axes": (0, 1), "norm": "ortho"}),
]
REAL_ND = [
    ("rfftn", {}),
    ("rfftn", {"s": (2, 5), "axes": (1, 0), "norm": "forward"}),
    ("rfftn", {"axes": (0,)}),
]


def _check(name, kwargs, data, rtol=1e-10):
    """numba_cpu (pocketfft) against array-api-strict and the oracle, on every view."""
    want = getattr(xp.fft, name)(xp.asarray(data), **kwargs)
    for view in views(data):
        t = lm.asarray(view)
        got = getattr(F, name)(t, **kwargs)
        same(got, want, rtol)
        with lm.backends.use("numpy_ref"):
            same(getattr(F, name)(t, **kwargs), want, rtol)


@pytest.mark.parametrize("name, kwargs", ONE_D + ND, ids=[f"{n}-{k}" for n, k in ONE_D + ND])
def test_complex_input_transforms_match_array_api_strict(name, kwargs):
    _check(name, kwargs, cdata((3, 4)))


@pytest.mark.parametrize(
    "name, kwargs", REAL_1D + REAL_ND, ids=[f"{n}-{k}" for n, k in REAL_1D + REAL_ND]
)
def test_real_input_transforms_match_array_api_strict(name, kwargs):
    _check(name, kwargs, rdata((3, 4)))


@pytest.mark.parametrize("name", ["fft", "ifft", "fftn", "ifftn", "irfft", "hfft"])
def test_real_and_integer_input_is_promoted_as_numpy_does(name):
    """The standard asks complex input of these; real input is what NumPy and PyTorch
    users pass, so it is promoted to the complex dtype of its precision."""
    got = getattr(F, name)(lm.asarray(rdata((2, 5))))
    same(got, getattr(np.fft, name)(rdata((2, 5))))
    # integers are promoted to the default float (its complex dtype for fft, ifft, ...)
    ints = np.arange(10).reshape(2, 5)
    got = getattr(F, name)(lm.asarray(ints))
    want = getattr(np.fft, name)(ints)
    want = want.astype(default_np() if name in ("irfft", "hfft") else default_complex_np())
    same(got, want, rtol=default_rtol())
    got = getattr(F, name)(lm.asarray(rdata((2, 5), dtype=np.float32)))
    assert got.dtype == (lm.float32 if name in ("irfft", "hfft") else lm.complex64)


@pytest.mark.parametrize("name", ["fft", "ifftn", "irfft", "hfft", "rfft", "ihfft", "rfftn"])
def test_single_precision_stays_single(name):
    real = name in ("rfft", "ihfft", "rfftn")
    data = rdata((4, 6), dtype=np.float32) if real else cdata((4, 6), dtype=np.complex64)
    got = getattr(F, name)(lm.asarray(data))
    want = getattr(xp.fft, name)(xp.asarray(data))
    same(got, want, rtol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
def test_inverse_transforms_invert_and_norms_scale(norm):
    x = cdata((4, 6))
    t = lm.asarray(x)
    same(F.ifft(F.fft(t, norm=norm), norm=norm), x)
    same(F.ifftn(F.fftn(t, norm=norm), norm=norm), x)
    r = lm.asarray(x.real)
    same(F.irfft(F.rfft(r, norm=norm), n=6, norm=norm), x.real)
    same(F.irfftn(F.rfftn(r, norm=norm), s=(4, 6), axes=(0, 1), norm=norm), x.real)
    half = x.copy()  # a Hermitian signal's first half: real at 0 and n / 2
    half[:, 0], half[:, 5] = half[:, 0].real, half[:, 5].real
    same(F.ihfft(F.hfft(lm.asarray(half), n=10, norm=norm), norm=norm), half)
    scale = {"backward": 1.0, "ortho": 1 / math.sqrt(6), "forward": 1 / 6}[norm]
    same(F.fft(t, norm=norm), np.fft.fft(x) * scale)


def test_zero_size_batches_and_one_element_transforms():
    empty = np.zeros((0, 4), np.complex128)
    same(F.fft(lm.asarray(empty)), np.fft.fft(empty))
    same(F.rfft(lm.asarray(np.zeros((0, 4)))), np.fft.rfft(np.zeros((0, 4))))
    one = cdata((1,))
    same(F.fft(lm.asarray(one)), np.fft.fft(one))
    same(F.irfft(lm.asarray(one), n=1), np.fft.irfft(one, n=1))


def test_frequencies_match_array_api_strict_and_numpy():
    for n in (1, 4, 7):
        for d in (1.0, 0.25):
            # array-api-strict's default is float64, so both are told the dtype
            for dtype in ("float32", "float64"):
                ours, theirs = getattr(lm, dtype), getattr(xp, dtype)
                same(F.fftfreq(n, d=d, dtype=ours), xp.fft.fftfreq(n, d=d, dtype=theirs), rtol=0)
                same(F.rfftfreq(n, d=d, dtype=ours), xp.fft.rfftfreq(n, d=d, dtype=theirs), rtol=0)
            # without a dtype: lamina's default float
            dflt = getattr(xp, default_np().name)
            same(F.fftfreq(n, d=d), xp.fft.fftfreq(n, d=d, dtype=dflt), rtol=0)
            same(F.rfftfreq(n, d=d), xp.fft.rfftfreq(n, d=d, dtype=dflt), rtol=0)
    same(F.fftfreq(5, dtype=lm.float32), np.fft.fftfreq(5).astype(np.float32), rtol=0)
    on = F.rfftfreq(6, d=2.0, device="counting")
    assert on.device == "counting"
    same(on.to("cpu"), np.fft.rfftfreq(6, d=2.0).astype(default_np()), rtol=0)


@pytest.mark.parametrize("axes", [None, 0, (1,), (0, 1), (-1, 0)])
def test_shifts_match_array_api_strict(axes):
    data = cdata((4, 5))
    s = xp.asarray(data)
    same(F.fftshift(lm.asarray(data), axes=axes), xp.fft.fftshift(s, axes=axes), rtol=0)
    same(F.ifftshift(lm.asarray(data), axes=axes), xp.fft.ifftshift(s, axes=axes), rtol=0)
    freqs = F.fftfreq(5)
    same(F.ifftshift(F.fftshift(freqs)), freqs.numpy(), rtol=0)
    assert F.fftshift(freqs).tolist() == sorted(freqs.tolist())


def test_transforms_are_dispatched_operators_a_device_serves():
    """Each transform is an operator in namespace 'fft' (so a third-party device can
    override it); the example plugin's device runs them through its CPU fallback."""
    for name in (
        "fft",
        "ifft",
        "fftn",
        "ifftn",
        "rfft",
        "irfft",
        "rfftn",
        "irfftn",
        "hfft",
        "ihfft",
    ):
        op = lm.dispatch.OPERATORS[name]
        assert op.namespace == "fft" and op.category == "fft"
        assert getattr(F, name).__module__ == "lamina.fft"
    data = cdata((2, 4))
    got = F.fft(lm.asarray(data, device="counting"), n=5)
    assert got.device == "counting"
    same(got.to("cpu"), np.fft.fft(data, n=5))


BAD = [
    (lambda: F.rfft(lm.asarray(cdata(4))), TypeError, "rfft needs real-valued floating-point"),
    (lambda: F.ihfft(lm.asarray(cdata(4))), TypeError, "ihfft needs real-valued"),
    (lambda: F.rfftn(lm.asarray(cdata((2, 2)))), TypeError, "rfftn needs real-valued"),
    (lambda: F.fft(lm.asarray(cdata(4)), n=0), ValueError, "fft.fft: n must be a positive"),
    (lambda: F.fft(lm.asarray(cdata(4)), norm="none"), ValueError, "norm must be one of"),
    (lambda: F.fft(lm.asarray(1j)), lm.AxisError, "fft: axis -1 is out of bounds"),
    (lambda: F.ifft(lm.asarray(cdata(4)), axis=1), lm.AxisError, "axis 1 is out of bounds"),
    (lambda: F.irfft(lm.asarray(cdata(1))), ValueError, "gives n = 0; pass a positive n"),
    (lambda: F.fftn(lm.asarray(cdata((2, 2))), s=(2, 2)), ValueError, "s needs axes"),
    (lambda: F.fftn(lm.asarray(cdata((2, 2))), axes=(0, 0)), ValueError, "repeated axis"),
    (
        lambda: F.fftn(lm.asarray(cdata((2, 2))), s=(2,), axes=(0, 1)),
        ValueError,
        "s must be a sequence of one size per axis",
    ),
    (lambda: F.fftn(lm.asarray(cdata((2, 2))), axes=1), TypeError, "axes must be a sequence"),
    (lambda: F.rfftn(lm.ones((2, 2)), axes=()), ValueError, "needs at least one axis"),
    (lambda: F.fft(lm.asarray(cdata(4)), n=2.5), TypeError, "n must be an int"),
    (lambda: F.fftfreq(0), ValueError, "fft.fftfreq: n must be a positive integer"),
    (lambda: F.rfftfreq(4, dtype=lm.int64), TypeError, "dtype must be a real floating dtype"),
    (lambda: F.fftshift(lm.ones(3), axes=2), lm.AxisError, "fftshift: axes 2 is out of"),
    (lambda: F.fft([1j, 2j]), TypeError, "fft: x must be a tensor, got list"),
]


@pytest.mark.parametrize("call, error, message", BAD, ids=[b[2][:28] for b in BAD])
def test_bad_input_raises_a_clear_exception(call, error, message):
    with pytest.raises(error, match=message):
        call()


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=3),
    st.integers(1, 9),
    st.sampled_from(["fft", "ifft", "rfft", "irfft", "hfft", "ihfft"]),
    st.sampled_from(NORMS),
    st.data(),
)
def test_one_dimensional_transforms_agree_with_the_oracle(shape, n, name, norm, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    real = name in ("rfft", "ihfft")
    x = rdata(tuple(shape), seed=n) if real else cdata(tuple(shape), seed=n)
    t = lm.asarray(x)
    got = getattr(F, name)(t, n=n, axis=axis, norm=norm)
    with lm.backends.use("numpy_ref"):
        oracle = getattr(F, name)(t, n=n, axis=axis, norm=norm)
    same(got, oracle.numpy())
    same(got, getattr(np.fft, name)(x, n=n, axis=axis, norm=norm))
