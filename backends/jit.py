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

Note [Lazy Numba]: importing Numba takes ~150 ms, more than NumPy does, so lamina
imports it when a kernel is first compiled (or loaded from Numba's cache), not with
``import lamina``: a program whose operations the loop cache serves (Note [Loop cache])
never imports it. Backend modules reach Numba only through this module (threads.py,
which sets Numba's thread count, imports it where it does so) and only at compile
time: ``jit.numba``, ``jit.types`` and ``jit.prange`` are resolved on first use
(importing Numba), ``jitable`` marks a scalar function for Numba (``register_jitable``)
and ``on_load`` runs other setup (intrinsics) once Numba is in. A module-level constant
made of Numba types would import Numba with its module, so signatures are built in
functions. tests/test_loop_cache.py checks that ``import lamina`` and an elementwise
operation served by the loop cache leave ``numba`` out of ``sys.modules``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from lamina.dispatch import dtypes as D

from . import loop_cache, threads

# No nogil: releasing and retaking the GIL costs ~40 ns a call, a tenth of the seed
# benchmark's budget; parallelism comes from prange instead.
OPTIONS = dict(cache=True, error_model="numpy")

# Floating-point reassociation and FMA contraction, for kernels whose reductions must
# vectorize (batch-norm statistics, window sums); never the flags that assume no NaN.
REASSOCIATE = frozenset({"reassoc", "contract"})

_numba: Any = None  # the numba module, once loaded
_jitables: list[Callable] = []
_on_load: list[Callable[[Any], None]] = []
_load_lock = threading.RLock()


def _load() -> Any:
    """Numba, imported on first call, with every ``jitable`` and ``on_load`` applied."""
    global _numba
    if _numba is None:
        with _load_lock:
            if _numba is None:
                numba = threads._numba()  # Note [Numba's first compile] in threads.py
                from numba.extending import register_jitable

                for fn in _jitables:  # a list: ones added while loading are seen too
                    register_jitable(fn)
                for setup in _on_load:
                    setup(numba)
                globals().update(numba=numba, types=numba.types, prange=numba.prange)
                _numba = numba
    return _numba


def __getattr__(name: str) -> Any:
    """``jit.numba``, ``jit.types``, ``jit.prange``: Numba's, imported on first use."""
    if name in ("numba", "types", "prange"):
        _load()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def jitable(fn: Callable) -> Callable:
    """Mark scalar function ``fn`` callable from kernels (Numba's ``register_jitable``,
    applied when Numba loads); ``fn`` itself is returned, so its name is unchanged."""
    if _numba is None:
        with _load_lock:
            if _numba is None:
                _jitables.append(fn)
                return fn
    from numba.extending import register_jitable

    return register_jitable(fn)


def on_load(setup: Callable[[Any], None]) -> None:
    """Run ``setup(numba)`` once Numba is imported (now, if it is)."""
    with _load_lock:
        if _numba is None:
            _on_load.append(setup)
            return
    setup(_numba)


def index(ndim: int = 1) -> Any:
    """The Numba type of a C-contiguous int64 array (indices, shapes, strides)."""
    return array(np.int64, ndim)


def array(dtype: Any, ndim: int = 1, layout: str = "C") -> Any:
    """The Numba type of an array of NumPy (or lamina) dtype ``dtype``."""
    numba = _load()
    np_dtype = dtype.np if isinstance(dtype, D.DType) else np.dtype(dtype)
    return numba.types.Array(numba.from_dtype(np_dtype), ndim, layout)


def compile_kernel(
    pyfunc: Callable, signature: Any, parallel: bool = False, **options: Any
) -> Callable:
    """Compile ``pyfunc`` for one explicit signature; return its entry point. ``options``
    are ``compile_dispatcher``'s (``nogil`` releases the GIL while it runs, for kernels
    called from ``threads.split``'s parts)."""
    dispatcher = compile_dispatcher(pyfunc, signature, parallel, **options)
    entry = entry_point(dispatcher, signature)
    return threads.synced(entry) if parallel else entry  # Note [Thread count]


def compile_dispatcher(
    pyfunc: Callable,
    signature: Any,
    parallel: bool = False,
    fastmath: Any = False,
    nogil: bool = False,
) -> Any:
    """``compile_kernel``'s Numba dispatcher, compiled for ``signature``: for a kernel
    another kernel calls, which then links this compiled code instead of compiling
    ``pyfunc`` again (``compile_kernel`` gives Python its entry point)."""
    fastmath = set(fastmath) if fastmath else False  # Numba takes a set, not a frozenset
    dispatcher = _load().njit(parallel=parallel, fastmath=fastmath, nogil=nogil, **OPTIONS)(pyfunc)
    dispatcher.compile(signature)
    return dispatcher


def entry_point(dispatcher: Any, signature: Any) -> Callable:
    """The compiled entry point of a dispatcher's overload for ``signature``, called
    without Numba's argument typing (Note [Kernel signatures])."""
    return dispatcher.overloads[signature.args].entry_point


_cfuncs: list = []  # compiled cfuncs stay alive: the C core holds only their addresses


def compile_cfunc(pyfunc: Callable, signature: Any, cache: bool = True) -> Any:
    """Compile ``pyfunc`` as a C function (numba.cfunc) of ``signature`` (Note [C loops]
    in numba_cpu/kernels.py); ``cache=False`` skips Numba's cache, keeping the IR."""
    return _load().cfunc(signature, **{**OPTIONS, "cache": cache})(pyfunc)


def c_loop(key: tuple, build: Callable[[bool], Any]) -> int:
    """The C address of the loop of ``key``, opened from the loop cache (Note [Loop
    cache]) or compiled by ``build(cache)`` (a cfunc; ``cache``: use Numba's) on first
    use."""
    address = _entries.get(key)
    if address is None:
        address, library = loop_cache.find(key)
        if address is None:
            cfunc = build(library is None)
            _cfuncs.append(cfunc)
            stored = library and loop_cache.store(library, cfunc)
            address = stored or cfunc.address
        _entries[key] = address
    return address


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


_entries: dict[Hashable, Any] = {}  # entry points; C addresses of c_loop


def cached(key: Hashable, build: Callable[[], Callable]) -> Callable:
    """The entry point stored under ``key``, built (compiled) on first use."""
    entry = _entries.get(key)
    if entry is None:
        entry = _entries[key] = build()
    return entry
