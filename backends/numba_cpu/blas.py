"""The BLAS matrix product NumPy uses, called from Python or from inside Numba kernels.

Note [GEMM in kernels]: a part of a split convolution (Note [Split convolutions] in
nn/conv.py) runs block after block of transforms and GEMMs. Called from Python, every
kernel and every np.matmul gives up the GIL and takes it back, and when the other
thread's part is in its Python just then, the thread sleeps until woken (~0.1 ms in
this VM, whose idle CPUs halt). Measured on 2 cores: np.matmul of 36 (224 x 16) @
(16 x 16) float32 products, one call after another, took 45 us a call on one thread
and 1.34x that on each of two (two processes: 1.0x); the same products called from a
``nogil`` Numba loop, 0.89x. So a part's block loop is one Numba kernel that calls the
BLAS itself: ``gemm`` and ``gemms`` below, which kernels call like NumPy functions.

In a kernel they are a call of the BLAS's ``cblas_sgemm`` / ``cblas_dgemm`` through a
symbol registered with LLVM when Numba loads (as kernels.py's libm functions), so
kernels calling them are cached on disk like the others. Only the 64-bit-integer
interface of the OpenBLAS NumPy's wheels link is looked for (``scipy_cblas_sgemm64_``,
or ``cblas_sgemm64_`` of older wheels), in the BLAS libraries threadpoolctl finds
loaded: an interface whose integer width is not in its name could be called wrongly.
Where none is found, ``available()`` is False and callers run the same loops from
Python (where ``gemm`` and ``gemms`` are NumPy's dot and matmul).

The calls run in the thread that makes them, on the BLAS's pool when it has several
threads: lamina gives it one (Note [BLAS threads] in lamina.backends.threads).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from lamina.backends import jit

# the 64-bit-integer GEMMs of scipy-openblas64 (NumPy's wheels), then of openblas64_
_SYMBOLS = ("scipy_cblas_{}gemm64_", "cblas_{}gemm64_")
_LLVM_NAME = "lamina_{}gemm64"  # the name kernels call them by
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _find() -> dict[str, int] | None:
    """{LLVM name: address} of the 64-bit-integer sgemm and dgemm of a loaded BLAS."""
    from lamina.backends import threads

    for lib in threads._blas_libraries().lib_controllers:
        try:
            dll = ctypes.CDLL(lib.filepath)
        except OSError:
            continue
        for symbol in _SYMBOLS:
            functions = {t: getattr(dll, symbol.format(t), None) for t in "sd"}
            if all(functions.values()):
                return {
                    _LLVM_NAME.format(t): ctypes.cast(fn, ctypes.c_void_p).value
                    for t, fn in functions.items()
                }
    return None


@functools.cache
def _addresses() -> dict[str, int] | None:
    """``_find``'s answer, looked up once (threadpoolctl takes ~10 ms)."""
    return _find()


def available() -> bool:
    """Whether kernels can call ``gemm``."""
    return _addresses() is not None


def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, trans_a: bool, trans_b: bool, beta):
    """c = op(a) @ op(b) + beta c, op(x) being x.T where trans_x; beta is 0 or 1 (0
    ignores c's values). a, b and c are 2-D with unit column strides and c is
    C-contiguous (a kernel's caller checks: the BLAS does not)."""
    _store(np.dot(a.T if trans_a else a, b.T if trans_b else b), c, beta)


def gemms(a: np.ndarray, b: np.ndarray, c: np.ndarray, trans_a: bool, trans_b: bool, beta):
    """``gemm`` of each (a[i], b[i], c[i]): one np.matmul from Python."""
    _store(
        np.matmul(a.swapaxes(1, 2) if trans_a else a, b.swapaxes(1, 2) if trans_b else b), c, beta
    )


def _store(product, c, beta):
    if beta:
        c += product
    else:
        c[...] = product


def _lower(numba: Any) -> None:
    """``gemm`` and ``gemms`` for kernels (Note [GEMM in kernels])."""
    if not available():
        return
    import llvmlite.binding as llvm
    from llvmlite import ir
    from numba.core import cgutils
    from numba.extending import intrinsic, overload

    for name, address in _addresses().items():
        llvm.add_symbol(name, address)
    types = numba.types

    def blas_call(real, symbol):
        """An intrinsic (trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc) calling
        cblas_?gemm row-major with alpha 1; the arrays are passed as addresses."""

        @intrinsic
        def call(typingctx, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):
            i64, address = types.int64, types.uintp
            sig = types.void(*[i64] * 5, address, i64, address, i64, real, address, i64)

            def codegen(context, builder, signature, args):
                i32, l64 = ir.IntType(32), ir.IntType(64)
                value = context.get_value_type(real)
                pointer = ir.IntType(8).as_pointer()
                params = [i32, i32, i32, l64, l64, l64, value, pointer, l64, pointer, l64, value]
                fnty = ir.FunctionType(ir.VoidType(), [*params, pointer, l64])
                fn = cgutils.get_or_insert_function(builder.module, fnty, symbol)
                ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc = args
                builder.call(
                    fn,
                    [
                        ir.Constant(i32, _ROW_MAJOR),
                        builder.trunc(ta, i32),
                        builder.trunc(tb, i32),
                        m,
                        n,
                        k,
                        ir.Constant(value, 1.0),
                        builder.inttoptr(a, pointer),
                        lda,
                        builder.inttoptr(b, pointer),
                        ldb,
                        beta,
                        builder.inttoptr(c, pointer),
                        ldc,
                    ],
                )

            return sig, codegen

        return call

    calls = {
        types.float32: (blas_call(types.float32, _LLVM_NAME.format("s")), np.float32),
        types.float64: (blas_call(types.float64, _LLVM_NAME.format("d")), np.float64),
    }

    @overload(gemm)
    def _gemm(a, b, c, trans_a, trans_b, beta):
        call, real = calls[c.dtype]

        def impl(a, b, c, trans_a, trans_b, beta):
            m, n = c.shape
            k = a.shape[0] if trans_a else a.shape[1]
            size = c.itemsize
            call(
                _TRANS if trans_a else _NO_TRANS,
                _TRANS if trans_b else _NO_TRANS,
                m,
                n,
                k,
                a.ctypes.data,
                max(1, a.strides[0] // size),
                b.ctypes.data,
                max(1, b.strides[0] // size),
                real(beta),
                c.ctypes.data,
                max(1, c.strides[0] // size),
            )

        return impl

    @overload(gemms)
    def _gemms(a, b, c, trans_a, trans_b, beta):
        def impl(a, b, c, trans_a, trans_b, beta):
            for i in range(c.shape[0]):
                gemm(a[i], b[i], c[i], trans_a, trans_b, beta)

        return impl


jit.on_load(_lower)
