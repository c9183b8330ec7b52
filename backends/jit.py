"""The one place where Numba compiles: entry points of kernel families, per dtype.

Note [Kernel signatures]: every kernel is compiled for an explicit signature and called
through its compiled entry point, skipping Numba's per-call argument typing (about
100 ns on the seed's path). That is safe because callers only pass arrays of exactly
the signature's types. Signatures are built once, when an entry is first needed, and
Numba's on-disk cache (``cache=True``) makes later processes load the compiled code in
milliseconds.

A ``Family`` holds one kernel's entry points indexed by dtype index (a list: no dict
lookup per call); each compiles on its first call. ``cached`` keeps entry points of
other shapes of key (layouts, dtype pairs) in one dict.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numba
import numpy as np
from numba import njit, types

from lamina.dispatch import dtypes as D

from . import threads

# No nogil: releasing and retaking the GIL costs ~40 ns a call, a tenth of the seed
# benchmark's budget; parallelism comes from prange instead.
OPTIONS = dict(cache=True, error_model="numpy")

INDEX = types.Array(types.int64, 1, "C")
INDEX_2D = types.Array(types.int64, 2, "C")


def array(dtype: Any, ndim: int = 1, layout: str = "C") -> types.Array:
    """The Numba type of an array of NumPy (or lamina) dtype ``dtype``."""
    np_dtype = dtype.np if isinstance(dtype, D.DType) else np.dtype(dtype)
    return types.Array(numba.from_dtype(np_dtype), ndim, layout)


# Floating-point reassociation and FMA contraction, for kernels whose reductions must
# vectorize (batch-norm statistics, window sums); never the flags that assume no NaN.
REASSOCIATE = frozenset({"reassoc", "contract"})


def compile_kernel(
    pyfunc: Callable,
    signature: Any,
    parallel: bool = False,
    fastmath: Any = False,
    nogil: bool = False,
) -> Callable:
    """Compile ``pyfunc`` for one explicit signature; return its entry point. ``nogil``
    releases the GIL while it runs (for kernels called from ``threads.split``'s parts)."""
    fastmath = set(fastmath) if fastmath else False  # Numba takes a set, not a frozenset
    dispatcher = njit(parallel=parallel, fastmath=fastmath, nogil=nogil, **OPTIONS)(pyfunc)
    dispatcher.compile(signature)
    entry = dispatcher.overloads[signature.args].entry_point
    return threads.synced(entry) if parallel else entry  # Note [Thread count]


_cfuncs: list = []  # compiled cfuncs stay alive: the C core holds only their addresses


def compile_cfunc(pyfunc: Callable, signature: Any) -> int:
    """Compile ``pyfunc`` as a C function (numba.cfunc) of ``signature``; return its
    address (Note [C loops] in numba_cpu/kernels.py)."""
    c = numba.cfunc(signature, **OPTIONS)(pyfunc)
    _cfuncs.append(c)
    return c.address


class _Stub:
    """Stands in a Family slot until first called; then compiles and steps aside."""

    __slots__ = ("family", "index")

    def __init__(self, family: Family, index: int) -> None:
        self.family, self.index = family, index

    def __call__(self, *args: Any) -> Any:
        entry = self.family.build(self.index)
        self.family[self.index] = entry
        return entry(*args)


class Family(list):
    """Entry points of one kernel indexed by dtype index, compiled on first call by
    ``build(index)``."""

    def __init__(self, build: Callable[[int], Callable]) -> None:
        super().__init__(_Stub(self, i) for i in range(len(D.ALL)))
        self.build = build

    def of(self, array_: np.ndarray) -> Callable:
        """The entry point for an array's dtype."""
        return self[D.from_numpy(array_.dtype).index]


def kernel_family(
    pyfunc: Callable, signature_of: Callable[[D.DType], Any], parallel: bool = False
) -> Family:
    """A Family of one plain function, compiled for ``signature_of(dtype)``."""
    return Family(lambda i: compile_kernel(pyfunc, signature_of(D.ALL[i]), parallel))


_entries: dict[Hashable, Callable] = {}


def cached(key: Hashable, build: Callable[[], Callable]) -> Callable:
    """The entry point stored under ``key``, built (compiled) on first use."""
    entry = _entries.get(key)
    if entry is None:
        entry = _entries[key] = build()
    return entry
