"""Oracle kernels of lamina.linalg: np.linalg called in the plainest way, and the
norms from their definitions."""

import numpy as np

from lamina.backends import setup as S
from lamina.dispatch import dtypes as D
from lamina.dispatch import keys, result_types
from lamina.dispatch.arguments import LinAlgError
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array


def _float(name, x):
    comp = S.promote(OPERATORS[name], (x,))
    return comp, x._data.astype(comp.np)


def _call(name, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except np.linalg.LinAlgError as exc:
        raise LinAlgError(f"linalg.{name}: {exc}") from None


def _out(*arrays, dtype):
    """Complex results in dtype, real ones in its real dtype (a complex x's S, w)."""
    return [
        from_array(np.asarray(a, dtype.np if np.iscomplexobj(a) else D.real_of(dtype).np))
        for a in arrays
    ]


def _simple(name, fn):
    def kernel(ks, x, *options):
        comp, a = _float(name, x)
        out = _call(name, fn, a, *options)
        if isinstance(out, tuple):
            return getattr(result_types, _RESULTS[name])(*_out(*out, dtype=comp))
        return _out(out, dtype=comp)[0]

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


_RESULTS = {"slogdet": "SlogdetResult", "eigh": "EighResult", "qr": "QRResult", "svd": "SVDResult"}


def solve(ks, x1, x2):
    comp = S.promote(OPERATORS["solve"], (x1, x2))
    a, b = x1._data.astype(comp.np), x2._data.astype(comp.np)
    if b.ndim == 1:  # a vector: solve for one column
        return _out(_call("solve", np.linalg.solve, a, b[:, None])[..., 0], dtype=comp)[0]
    return _out(_call("solve", np.linalg.solve, a, b), dtype=comp)[0]


def vector_norm(ks, x, axis, keepdims, ord):
    comp, a = _float("vector_norm", x)
    m = np.abs(a)
    with np.errstate(all="ignore"):
        if ord == np.inf:
            out = np.max(m, axis=axis, keepdims=keepdims)
        elif ord == -np.inf:
            out = np.min(m, axis=axis, keepdims=keepdims)
        elif ord == 0:
            out = np.sum(m != 0, axis=axis, keepdims=keepdims)
        else:
            out = np.sum(m**ord, axis=axis, keepdims=keepdims) ** (1.0 / ord)
    return _out(out, dtype=comp)[0]


def diagonal(ks, x, offset):
    return from_array(np.diagonal(x._data, offset, -2, -1), x._ks & ~keys.AUTOGRAD)


KERNELS = {
    "cholesky": _simple("cholesky", lambda a, upper: np.linalg.cholesky(a, upper=upper)),
    "det": _simple("det", np.linalg.det),
    "slogdet": _simple("slogdet", lambda a: tuple(np.linalg.slogdet(a))),
    "inv": _simple("inv", np.linalg.inv),
    "solve": solve,
    "eigh": _simple("eigh", lambda a: tuple(np.linalg.eigh(a))),
    "eigvalsh": _simple("eigvalsh", np.linalg.eigvalsh),
    "qr": _simple("qr", lambda a, mode: tuple(np.linalg.qr(a, mode=mode))),
    "svd": _simple("svd", lambda a, full: tuple(np.linalg.svd(a, full_matrices=full))),
    "svdvals": _simple("svdvals", lambda a: np.linalg.svd(a, compute_uv=False)),
    "diagonal": diagonal,
    "vector_norm": vector_norm,
}
