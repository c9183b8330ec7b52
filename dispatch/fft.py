"""Every public function of ``lamina.fft`` (the Array API's Fourier transform
extension): the bindings of the schema's ``namespace="fft"`` operators (the ten
transforms, pocketfft through NumPy on the CPU, overridable per device like every
operator) and the four composite functions below (sample frequencies and shifts),
which are compositions of operators, so they run on every device and the shifts are
differentiable."""

from __future__ import annotations

from typing import Any

from . import arguments as A
from . import bindings
from . import composites as C
from . import dtypes as D
from . import operators as _operators  # noqa: F401  (defines every operator)
from .schema import OPERATORS
from .tensor import Tensor

__all__ = ["fftfreq", "fftshift", "ifftshift", "rfftfreq"]

bindings.install(globals(), "fft")
__all__ += [op.name for op in bindings.public_operators("fft")]
__all__.sort()


def _frequencies(fn: str, n: Any, d: Any, dtype: Any, device: Any, positive_only: bool) -> Tensor:
    n = A.integer(n, fn, "n")
    if n < 1:
        raise ValueError(f"fft.{fn}: n must be a positive integer, got {n}")
    d = A.real(d, fn, "d")
    dtype = D.default_float if dtype is None else A.dtype(dtype, fn, "dtype")
    if dtype.kind != "f":
        raise TypeError(f"fft.{fn}: dtype must be a real floating dtype, got {dtype}")
    k = C.arange(n // 2 + 1 if positive_only else n, device=device)
    if not positive_only:  # 0, 1, ..., (n - 1) // 2, then -(n // 2), ..., -1
        k = OPERATORS["where"](OPERATORS["less"](k, (n + 1) // 2), k, OPERATORS["subtract"](k, n))
    # integers times 1 / (d n) in float64, as NumPy computes them, then the dtype
    f = OPERATORS["multiply"](OPERATORS["astype"](k, D.float64, False), 1.0 / (d * n))
    return f if dtype is D.float64 else OPERATORS["astype"](f, dtype, False)


def fftfreq(n: int, /, *, d: float = 1.0, dtype: Any = None, device: Any = None) -> Tensor:
    """The sample frequencies of a transform of length n with sample spacing d:
    [0, 1, ..., n/2 - 1, -n/2, ..., -1] / (d n) for even n, [0, ..., (n-1)/2,
    -(n-1)/2, ..., -1] / (d n) for odd n (the default float dtype)."""
    return _frequencies("fftfreq", n, d, dtype, device, positive_only=False)


def rfftfreq(n: int, /, *, d: float = 1.0, dtype: Any = None, device: Any = None) -> Tensor:
    """The sample frequencies of rfft's n // 2 + 1 outputs: [0, 1, ..., n // 2] / (d n)."""
    return _frequencies("rfftfreq", n, d, dtype, device, positive_only=True)


def _shift(fn: str, x: Any, axes: Any, sign: int) -> Tensor:
    A.tensor(x, fn, "x")
    if axes is None:
        axes = tuple(range(x.ndim))
    elif not isinstance(axes, (tuple, list)):
        axes = (axes,)
    axes = tuple(A.axis(a, fn, "axes", x.ndim) for a in axes)
    if not axes:
        return x
    return C.roll(x, tuple(sign * (x.shape[a] // 2) for a in axes), axis=axes)


def fftshift(x: Tensor, /, *, axes: int | tuple[int, ...] | None = None) -> Tensor:
    """x with the zero frequency moved to the middle of the given axes (every axis by
    default): a roll by n // 2."""
    return _shift("fftshift", x, axes, 1)


def ifftshift(x: Tensor, /, *, axes: int | tuple[int, ...] | None = None) -> Tensor:
    """fftshift's inverse: a roll by -(n // 2)."""
    return _shift("ifftshift", x, axes, -1)
