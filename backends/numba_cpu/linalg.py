"""Linear algebra kernels of the CPU backend: matmul (BLAS through NumPy for floats,
a Numba kernel for integers), tensordot and vecdot built on it."""

import math

import numpy as np

from lamina.backends import jit
from lamina.backends import setup as S
from lamina.dispatch import meta
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import from_array

from . import gemm
from . import kernels as K


def matmul(ks, x1, x2):
    a, b = x1._data, x2._data
    # two matrices of one float dtype, the common case: the BLAS at once
    if (
        a.ndim == 2 == b.ndim
        and a.dtype == b.dtype
        and a.dtype.kind == "f"
        and a.shape[1] == b.shape[0]
    ):
        return from_array(gemm.matmul(a, b))
    op = OPERATORS["matmul"]
    comp = S.promote(op, (x1, x2))
    meta.matmul(x1, x2)  # the binding checked already; internal callers may not have
    a, b = S.operand(x1, comp), S.operand(x2, comp)
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if comp.kind in "fc":
        out = gemm.matmul(a2, b2)  # BLAS, on lamina's threads
    else:
        batch = S.broadcast_shapes("matmul", a2.shape[:-2], b2.shape[:-2])
        m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
        nb = math.prod(batch)  # explicit: reshape(-1, ...) is ambiguous at size 0
        a3 = np.broadcast_to(a2, batch + (m, k)).reshape(nb, m, k)
        b3 = np.broadcast_to(b2, batch + (k, n)).reshape(nb, k, n)
        out = np.zeros((nb, m, n), comp.np)

        def build():
            arr = jit.array(comp, 3, "A")
            return K.instantiate(K.matmul_int, (range,), jit.types.void(arr, arr, arr))

        if out.size:
            jit.cached((K.matmul_int, comp), build)(a3, b3, out)
        out = out.reshape(batch + (m, n))
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    # not ascontiguousarray: it turns the 0-d result of 1-D @ 1-D into shape (1,)
    return from_array(out if out.flags.c_contiguous else out.copy())


def tensordot(ks, x1, x2, axes):
    a_axes, b_axes = axes
    free_a = [d for d in range(len(x1._shape)) if d not in a_axes]
    free_b = [d for d in range(len(x2._shape)) if d not in b_axes]
    op = OPERATORS["tensordot"]
    comp = S.promote(op, (x1, x2))
    a = S.operand(x1, comp).transpose(free_a + list(a_axes))
    b = S.operand(x2, comp).transpose(list(b_axes) + free_b)
    k = math.prod([x1._shape[d] for d in a_axes])
    a2 = a.reshape(math.prod([x1._shape[d] for d in free_a]), k)  # not -1: k may be 0
    b2 = b.reshape(k, math.prod([x2._shape[d] for d in free_b]))
    out = matmul(ks, from_array(np.ascontiguousarray(a2)), from_array(np.ascontiguousarray(b2)))
    shape = tuple(x1._shape[d] for d in free_a) + tuple(x2._shape[d] for d in free_b)
    return from_array(out._data.reshape(shape))


def vecdot(ks, x1, x2, axis):
    """The contracted axis (negative, into the broadcast shape) moved last, then one
    batched matmul of row vectors (x1's, conjugated when complex) with column vectors."""
    comp = S.promote(OPERATORS["vecdot"], (x1, x2))
    a = S.operand(x1, comp)
    a, b = np.broadcast_arrays(np.conj(a) if comp.kind == "c" else a, S.operand(x2, comp))
    a, b = np.moveaxis(a, axis, -1)[..., None, :], np.moveaxis(b, axis, -1)[..., :, None]
    out = matmul(ks, from_array(a), from_array(b))._data[..., 0, 0]
    return from_array(np.ascontiguousarray(out) if out.ndim else out.copy())


def register(registry):
    for fn in (matmul, tensordot, vecdot):
        registry.register(fn.__name__, "cpu", fn)
