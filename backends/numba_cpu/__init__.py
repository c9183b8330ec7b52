"""numba_cpu -- the default backend of device "cpu".

Numba-JIT kernels (``kernels.py`` holds the templates) for elementwise operators,
reductions and integer matmul; NumPy where it is the right tool (BLAS matmul, views,
indexing, creation). One module per family of operators:

    elementwise.py   unary, binary, ternary operators: the fast path and the general one
    reductions.py    sum, prod, max, min, all, any, argmax, argmin, mean, var, std
    linalg.py        matmul, tensordot, vecdot
    manipulation.py  concat, stack
    views.py         views, indexing, astype, copy
    creation.py      full, empty, arange, linspace, eye, from_host, rand, randn
    scan.py          cumulative_sum, cumulative_prod
    sorting.py       sort, argsort, searchsorted, nonzero, unique_*
    lapack.py        lamina.linalg's factorizations and solvers (LAPACK through NumPy)
    fft.py           lamina.fft's transforms (pocketfft through NumPy)
    layout.py        strided operands of the general path
    nn/              neural-network primitives: convolution, pooling, normalization,
                     activations, losses, layout conversion
"""

from lamina.backends.hookspecs import hookimpl

from . import (
    creation,
    elementwise,
    fft,
    lapack,
    linalg,
    manipulation,
    nn,
    reductions,
    scan,
    sorting,
    views,
)


@hookimpl
def lamina_register_kernels(registry):
    for module in (
        elementwise,
        reductions,
        linalg,
        manipulation,
        views,
        creation,
        scan,
        sorting,
        lapack,
        nn,
        fft,
    ):
        module.register(registry)
