"""Oracle kernels of lamina.fft: the discrete Fourier transform from its definition,
sum_k x_k exp(-+2 pi i j k / n), as a matrix product per axis in complex128 -- O(n**2)
and independent of pocketfft, which the CPU backend calls. Zero-padding, trimming,
Hermitian extension and the norm modes are spelled out as the standard writes them."""

import numpy as np

from lamina.backends import setup as S
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array


def _resized(a, axis, n):
    """a trimmed or zero-padded to n elements along axis."""
    m = a.shape[axis]
    if n <= m:
        return np.take(a, np.arange(n), axis=axis)
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, n - m)
    return np.pad(a, pad)


def _scale(norm, n, inverse):
    """The factor of a transform of length n: forward transforms are unscaled under
    'backward', inverse ones under 'forward'."""
    if norm == "ortho":
        return 1 / np.sqrt(n)
    return 1 / n if (norm == "forward") != inverse else 1.0


def _dft(a, axis, n, inverse, norm, n_out=None):
    """The DFT of length n along axis (a already has n elements there), keeping the
    first n_out frequencies (all by default)."""
    k = np.arange(n if n_out is None else n_out)[:, None]
    j = np.arange(n)[None, :]
    sign = 1 if inverse else -1
    matrix = np.exp(sign * 2j * np.pi * (k * j % n) / n) * _scale(norm, n, inverse)
    moved = np.moveaxis(a.astype(np.complex128), axis, -1)
    return np.moveaxis(moved @ matrix.T, -1, axis)


def _hermitian(a, axis, n):
    """The full spectrum of length n whose first n//2 + 1 entries are a's (resized to
    n//2 + 1): X[n - k] = conj(X[k])."""
    half = _resized(a.astype(np.complex128), axis, n // 2 + 1)
    rest = np.conj(np.flip(np.take(half, np.arange(1, n - n // 2), axis=axis), axis))
    return np.concatenate([half, rest], axis=axis)


def _c2c(x, s, axes, norm, inverse):
    a = x
    for axis, n in zip(axes, s):
        a = _dft(_resized(a, axis, n), axis, n, inverse, norm)
    return a


def fft(x, n, axis, norm):
    return _c2c(x, (n,), (axis,), norm, False)


def ifft(x, n, axis, norm):
    return _c2c(x, (n,), (axis,), norm, True)


def fftn(x, s, axes, norm):
    return _c2c(x, s, axes, norm, False)


def ifftn(x, s, axes, norm):
    return _c2c(x, s, axes, norm, True)


def rfft(x, n, axis, norm):
    return _dft(_resized(x, axis, n), axis, n, False, norm, n_out=n // 2 + 1)


def rfftn(x, s, axes, norm):
    a = rfft(x, s[-1], axes[-1], norm)
    return _c2c(a, s[:-1], axes[:-1], norm, False)


def irfft(x, n, axis, norm):
    # the imaginary parts of X[0] (and X[n/2]) drop out of the real part
    return np.real(_dft(_hermitian(x, axis, n), axis, n, True, norm))


def irfftn(x, s, axes, norm):
    a = _c2c(x, s[:-1], axes[:-1], norm, True)
    return irfft(a, s[-1], axes[-1], norm)


def hfft(x, n, axis, norm):
    """The forward transform of the Hermitian signal whose first half is x: real."""
    return np.real(_dft(_hermitian(x, axis, n), axis, n, False, norm))


def ihfft(x, n, axis, norm):
    """The first n//2 + 1 frequencies of the inverse transform of a real signal."""
    return _dft(_resized(x, axis, n), axis, n, True, norm, n_out=n // 2 + 1)


def _kernel(name, compute):
    op = OPERATORS[name]

    def kernel(ks, x, size, axes, norm):
        comp = S.check_dtype(op, x._dtype)
        out = compute(S.operand(x, comp), size, axes, norm)
        return from_array(np.asarray(out, S.result_dtype(op, comp).np))

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


KERNELS = {
    fn.__name__: _kernel(fn.__name__, fn)
    for fn in (fft, ifft, fftn, ifftn, rfft, irfft, rfftn, irfftn, hfft, ihfft)
}
