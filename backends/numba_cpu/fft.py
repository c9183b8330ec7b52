"""lamina.fft on the CPU: pocketfft through NumPy (np.fft), the well-kept library for
discrete Fourier transforms, with lamina's dtype rules: float32 and complex64 stay in
single precision (NumPy 2 computes them there), integers are transformed in the default
float, a real-input transform (rfft, rfftn, ihfft) refuses complex input. The binding
has resolved n, s, axes and norm (Note [FFT arguments] in dispatch/meta.py)."""

import numpy as np

from lamina.backends import setup as S
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array


def _transform(name):
    op, npfn = OPERATORS[name], getattr(np.fft, name)

    def kernel(ks, x, size, axes, norm):
        comp = S.check_dtype(op, x._dtype)
        if name in ("fftn", "ifftn", "rfftn", "irfftn"):
            out = npfn(S.operand(x, comp), s=size, axes=axes, norm=norm)
        else:
            out = npfn(S.operand(x, comp), n=size, axis=axes, norm=norm)
        return from_array(np.ascontiguousarray(out, S.result_dtype(op, comp).np))

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


NAMES = "fft ifft fftn ifftn rfft irfft rfftn irfftn hfft ihfft".split()


def register(registry):
    for name in NAMES:
        registry.register(name, "cpu", _transform(name))
