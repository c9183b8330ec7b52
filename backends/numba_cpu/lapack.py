"""lamina.linalg on the CPU: LAPACK through NumPy (np.linalg), the well-kept library
for factorizations, with lamina's dtype rules (integers are computed in the default
float, float32 stays float32, complex64 complex64; real results of complex matrices,
as singular values or eigenvalues of Hermitian ones, have the real dtype), named
results and lamina's LinAlgError."""

import numpy as np

from lamina.backends import setup as S
from lamina.dispatch import dtypes as D
from lamina.dispatch import keys, result_types
from lamina.dispatch.arguments import LinAlgError
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array

_NO_AUTOGRAD = ~keys.AUTOGRAD


def _operands(name, *xs):
    comp = S.promote(OPERATORS[name], xs)
    return comp, [S.operand(x, comp) for x in xs]


def _tensor(a, dtype):
    """A result of computation dtype ``dtype``: complex results keep it, real ones of a
    complex computation take its real dtype (Note [Complex dtypes])."""
    return from_array(  # C-contiguous, as every new result (Note [Result layouts])
        np.asarray(a, dtype.np if np.iscomplexobj(a) else D.real_of(dtype).np, order="C")
    )


def _lapack(name, fn, *args, **kwargs):
    """np.linalg's ``fn``, with NumPy's LinAlgError as lamina's, naming the function."""
    try:
        return fn(*args, **kwargs)
    except np.linalg.LinAlgError as exc:
        raise LinAlgError(f"linalg.{name}: {exc}") from None


def _unary(name, fn):
    def kernel(ks, x):
        comp, (a,) = _operands(name, x)
        return _tensor(_lapack(name, fn, a), comp)

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def cholesky(ks, x, upper):
    comp, (a,) = _operands("cholesky", x)
    return _tensor(_lapack("cholesky", np.linalg.cholesky, a, upper=upper), comp)


def slogdet(ks, x):
    comp, (a,) = _operands("slogdet", x)
    sign, logabsdet = _lapack("slogdet", np.linalg.slogdet, a)
    return result_types.SlogdetResult(_tensor(sign, comp), _tensor(logabsdet, comp))


def solve(ks, x1, x2):
    comp, (a, b) = _operands("solve", x1, x2)
    return _tensor(_lapack("solve", np.linalg.solve, a, b), comp)


def eigh(ks, x):
    comp, (a,) = _operands("eigh", x)
    w, v = _lapack("eigh", np.linalg.eigh, a)
    return result_types.EighResult(_tensor(w, comp), _tensor(v, comp))


def qr(ks, x, mode):
    comp, (a,) = _operands("qr", x)
    q, r = _lapack("qr", np.linalg.qr, a, mode=mode)
    return result_types.QRResult(_tensor(q, comp), _tensor(r, comp))


def svd(ks, x, full_matrices):
    comp, (a,) = _operands("svd", x)
    u, s, vh = _lapack("svd", np.linalg.svd, a, full_matrices=full_matrices)
    return result_types.SVDResult(_tensor(u, comp), _tensor(s, comp), _tensor(vh, comp))


def svdvals(ks, x):
    comp, (a,) = _operands("svdvals", x)
    return _tensor(_lapack("svdvals", np.linalg.svd, a, compute_uv=False), comp)


def diagonal(ks, x, offset):
    # NumPy's diagonal is a read-only view: the Array API leaves writes unspecified
    return from_array(np.diagonal(x._data, offset, -2, -1), x._ks & _NO_AUTOGRAD)


def vector_norm(ks, x, axis, keepdims, ord):
    comp, (a,) = _operands("vector_norm", x)
    if a.size == 0 and ord in (np.inf, -np.inf) and any(x._shape[d] == 0 for d in axis):
        raise ValueError(
            f"vector_norm: ord={ord} of an empty axis (shape {x._shape}) has no identity"
        )
    out = np.linalg.vector_norm(a, axis=axis, keepdims=keepdims, ord=ord) if axis else abs(a)
    return _tensor(out, comp)


def register(registry):
    kernels = {
        "det": _unary("det", np.linalg.det),
        "inv": _unary("inv", np.linalg.inv),
        "eigvalsh": _unary("eigvalsh", np.linalg.eigvalsh),
    }
    for fn in (cholesky, slogdet, solve, eigh, qr, svd, svdvals, diagonal):
        kernels[fn.__name__] = fn
    for name, fn in kernels.items():
        registry.register(name, "cpu", fn)
