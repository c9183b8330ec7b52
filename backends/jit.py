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

Note [Closure cells]: Numba keys a cached kernel by its signature, its code and the
pickle of its closure cells (Note [Kernel cache] in numba_cpu/kernels.py), so that key
is the same in the next process only if every cell pickles the same there. Module-level
functions (by name), numbers, modules and closures made of these do; a Numba dispatcher
or intrinsic does not: its pickle carries a uuid drawn per process. A kernel capturing
one missed the cache in every process, compiled again (~1 s for a convolution's block
loop) and appended one more entry to the cache's index, which grew without bound. So a
kernel calls another one's code through its Python function marked ``jitable`` (compiled
into the caller), never through a dispatcher it captured; and what varies per process
(an address: the BLAS's, a ctypes callback's) is a symbol registered with LLVM before
the kernel compiles or loads, which the cached code names, never a constant it bakes in
(Numba does not cache a kernel that calls a ctypes function: its address is baked in).
``compile_kernel`` and ``compile_cfunc`` refuse a cell that breaks this
(``_check_cells``); tests/test_compile_once.py checks that a second process compiles
nothing.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from lamina.dispatch import dtypes as D

from . import loop_cache, threads

# No nogil: releasing and retaking the GIL costs ~40 ns a call, a tenth of the seed
# benchmark's budget; parallelism comes from prange instead.
OPTIONS = dict(cache=True, error_model="numpy")

# A function that kernels call (``jitable``) compiled as a kernel of its own would be.
CALLEE = dict(error_model=OPTIONS["error_model"])

# Floating-point reassociation and FMA contraction, for kernels whose reductions must
# vectorize (batch-norm statistics, window sums); never the flags that assume no NaN.
REASSOCIATE = frozenset({"reassoc", "contract"})

# Note [Vector width]: LLVM vectorizes Numba's loops for the vector width it prefers on
# the host: 256 bits on AVX-512 CPUs (the "prefer-256-bit" feature), where PyTorch's and
# NumPy's SIMD loops use 512. A function attribute, "prefer-vector-width", overrides that
# preference for one function. Loops that compute a lot per element (the vector math of
# numba_cpu/kernels.py) run 20-35% faster with 512-bit vectors (float32, 1e4 elements);
# loops that only move memory (add) do not gain, and short rows (softmax over rows of
# 100) lose, since a 512-bit vector loop unrolled four times leaves most of a short row
# to its scalar remainder. So the width is chosen per kernel (``vector_width`` of
# compile_kernel and compile_cfunc; numba_cpu/kernels.py's ``vector_width`` says which):
# while one compiles, every function Numba adds to a library (the kernel's, and those of
# the functions it calls, compiled for it) gets the attribute. A CPU without 512-bit
# vectors ignores it. The width is part of the kernel's cache key (Note [Cache keys and
# options] in loop_cache.py).
WIDE = 512
_vector_width: int | None = None  # the width of the compile in progress (Numba's lock held)

_numba: Any = None  # the numba module, once loaded
_jitables: list[tuple[Callable, dict[str, Any]]] = []
_on_load: list[Callable[[Any], None]] = []
_load_lock = threading.RLock()


def _load() -> Any:
    """Numba, imported on first call, with every ``jitable`` and ``on_load`` applied."""
    global _numba
    if _numba is None:
        with _load_lock:
            if _numba is None:
                numba = threads._numba()  # Note [Numba's first compile] in threads.py
                for fn, options in _jitables:  # a list: ones added while loading are seen too
                    _register(fn, options)
                _set_vector_widths()
                for setup in _on_load:
                    setup(numba)
                loop_cache.harden_numba_cache()  # locked, keyed by options too
                loop_cache.prune_numba_cache()  # Note [Numba's cache files]
                globals().update(numba=numba, types=numba.types, prange=numba.prange)
                _numba = numba
    return _numba


def __getattr__(name: str) -> Any:
    """``jit.numba``, ``jit.types``, ``jit.prange``: Numba's, imported on first use."""
    if name in ("numba", "types", "prange"):
        _load()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def jitable(fn: Callable | None = None, **options: Any) -> Any:
    """Mark function ``fn`` callable from kernels (Numba's ``register_jitable``, applied
    when Numba loads), compiled into each kernel that calls it with Numba's jit
    ``options`` (``fastmath`` may be a frozenset; ``CALLEE`` gives a kernel's error
    model); ``fn`` itself is returned, so its name is unchanged. Without ``fn``, the
    decorator with these options."""
    if fn is None:
        return functools.partial(jitable, **options)
    if "fastmath" in options:  # Numba takes a set, not a frozenset
        options["fastmath"] = set(options["fastmath"]) if options["fastmath"] else False
    if _numba is None:
        with _load_lock:
            if _numba is None:
                _jitables.append((fn, options))
                return fn
    _register(fn, options)
    return fn


@jitable
def part(total: int, parts: int, p: int) -> tuple[int, int]:
    """Part p's items [start, stop) when ``total`` are cut into ``parts`` contiguous
    parts, for kernels' parallel loops over parts (Note [Split work] in threads.py):
    the parts' sizes differ by one at most."""
    return total * p // parts, total * (p + 1) // parts


def _register(fn: Callable, options: dict[str, Any]) -> None:
    from numba.extending import register_jitable

    if options:  # register_jitable takes options only as a decorator factory
        register_jitable(**options)(fn)
    else:
        register_jitable(fn)


def on_load(setup: Callable[[Any], None]) -> None:
    """Run ``setup(numba)`` once Numba is imported (now, if it is)."""
    with _load_lock:
        if _numba is None:
            _on_load.append(setup)
            return
    setup(_numba)


def _set_vector_widths() -> None:
    """Numba's libraries give the functions they are handed the preferred vector width
    of the compile in progress (Note [Vector width])."""
    from numba.core.codegen import CPUCodeLibrary

    add_ir_module = CPUCodeLibrary.add_ir_module
    if getattr(add_ir_module, "sets_vector_width", False):
        return

    def with_vector_width(self: Any, ir_module: Any) -> None:
        if _vector_width is not None:
            attribute = f'"prefer-vector-width"="{_vector_width}"'
            for fn in ir_module.functions:
                if not fn.is_declaration:
                    # llvmlite's attribute sets take only the attributes it names; a
                    # string attribute is written as it is
                    set.add(fn.attributes, attribute)
        add_ir_module(self, ir_module)

    with_vector_width.sets_vector_width = True  # type: ignore[attr-defined]
    CPUCodeLibrary.add_ir_module = with_vector_width


@contextlib.contextmanager
def _compiling_for(vector_width: int | None) -> Any:
    """Compile, in this block, for ``vector_width`` (Note [Vector width]); Numba's
    compiler lock keeps other threads' compiles out of it (and out of the warning
    filters, which are process-wide)."""
    global _vector_width
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.errors import NumbaIRAssumptionWarning

    with global_compiler_lock, warnings.catch_warnings():
        # Numba's SSA self-check misreads a function inlined at two call sites of one
        # kernel (logaddexp in binary_scalar's two branches) and asks the user to report
        # a bug; the code it compiles is right (tested against NumPy)
        warnings.simplefilter("ignore", NumbaIRAssumptionWarning)
        outer, _vector_width = _vector_width, vector_width
        try:
            yield
        finally:
            _vector_width = outer


def index(ndim: int = 1) -> Any:
    """The Numba type of a C-contiguous int64 array (indices, shapes, strides)."""
    return array(np.int64, ndim)


def array(dtype: Any, ndim: int = 1, layout: str = "C") -> Any:
    """The Numba type of an array of NumPy (or lamina) dtype ``dtype``."""
    numba = _load()
    np_dtype = dtype.np if isinstance(dtype, D.DType) else np.dtype(dtype)
    return numba.types.Array(numba.from_dtype(np_dtype), ndim, layout)


def compile_kernel(
    pyfunc: Callable,
    signature: Any,
    parallel: bool = False,
    fastmath: Any = False,
    nogil: bool = False,
    vector_width: int | None = None,
    symbol: str | None = None,
) -> Callable:
    """Compile ``pyfunc`` for one explicit signature; return its entry point, called
    without Numba's argument typing (Note [Kernel signatures]). ``nogil`` releases the
    GIL while it runs, for kernels called from ``threads.split``'s parts;
    ``vector_width`` overrides the host's preferred one (Note [Vector width]); with a
    ``symbol``, other kernels can call it by that name (``call_symbol``)."""
    numba = _load()
    _check_cells(pyfunc)
    fastmath = set(fastmath) if fastmath else False  # Numba takes a set, not a frozenset
    dispatcher = numba.njit(parallel=parallel, fastmath=fastmath, nogil=nogil, **OPTIONS)(pyfunc)
    # Note [Cache keys and options] in loop_cache.py
    options = (parallel, tuple(sorted(fastmath or ())), nogil)
    dispatcher._cache.options = options if vector_width is None else (*options, vector_width)
    key = f"{signature}|{dispatcher._cache.options}"
    with loop_cache.compiling_once(dispatcher._cache, key), _compiling_for(vector_width):
        dispatcher.compile(signature)  # never another variant's code: Note [Numba's cache races]
    compiled = dispatcher.overloads[signature.args]
    if symbol is not None:
        _name(symbol, dispatcher, signature)
    return threads.synced(compiled.entry_point) if parallel else compiled.entry_point


def _check_cells(pyfunc: Callable) -> None:
    """Refuse a kernel whose closure cells pickle differently in every process (Note
    [Closure cells]): it would compile again in each one."""
    from numba.core.serialize import ReduceMixin  # dispatchers' and intrinsics' base

    def per_process(value: Any) -> bool:
        if isinstance(value, ReduceMixin):
            return True
        if isinstance(value, tuple):
            return any(map(per_process, value))
        cells = getattr(value, "__closure__", None) or ()
        return any(per_process(cell.cell_contents) for cell in cells)

    if per_process(pyfunc):
        raise TypeError(
            f"{pyfunc.__qualname__} captures a Numba dispatcher or intrinsic, whose "
            f"pickle differs per process, so Numba's cache would never find it: call "
            f"a jitable Python function instead (Note [Closure cells] in backends/jit.py)"
        )


# Note [Kernels called by name]: a function that several kernels call (Winograd's
# transforms, the im2col copies of the convolutions' block loops, and the loop over one
# part that a serial kernel and its parallel twin both run: the depthwise kernels',
# Winograd's block loops') is compiled once, as a kernel of its own (``compile_kernel(...,
# symbol=name)``, the name made by ``kernel_name``), and called through
# ``call_symbol(name, args)`` (``by_name(name)`` makes the jitable that calls it): a
# call of the address registered with LLVM under that name (its C wrapper, which takes
# Numba's arrays as they are), as kernels call the BLAS (Note [GEMM in kernels] in
# numba_cpu/blas.py). Called as a jitable instead, it is compiled into each calling
# kernel again: its LLVM code generation each time, most of the compile of Winograd's
# block loops: their sixteen float32 variants (two algorithms, both layouts, serial and
# parallel, forward and weight gradient) took 111 s to compile, 41 s calling the
# transforms by name, and ran as fast (Zen 3, within noise); the convolutions' sixteen
# float32 im2col block loops 46.9 s, 36.6 s calling their copies by name (their times
# within 2% on ResNet's shapes). A kernel calling one names only the symbol, so it
# caches. Before a process compiles or loads it, the named kernel must be compiled or
# loaded, which registers the name and its signature: a call is typed by it, each
# argument converted to the named kernel's type (an int32 to int64, an array of any
# layout to 'A', never 'A' to 'C') or the call refused.
_named: dict[str, tuple[Any, Any]] = {}  # name -> (dispatcher, signature), kept alive


def call_symbol(symbol: str, args: tuple) -> Any:
    """In a kernel: the kernel compiled under ``symbol`` called with ``args``, returning
    what it returns (Note [Kernels called by name])."""
    raise TypeError("call_symbol is called from kernels only")


def kernel_name(*parts: Any) -> str:
    """The name of a kernel called by name, made of ``parts`` (names, dtypes, layouts,
    numbers) without the characters a symbol cannot hold (Note [Kernels called by
    name])."""
    return re.sub(r"\W", "", "_".join(map(str, ("lamina", *parts))))


def by_name(symbol: str) -> Callable:
    """A jitable calling the kernel compiled (or loaded) under ``symbol`` in this
    process (Note [Kernels called by name])."""
    if symbol not in _named:
        raise LookupError(f"no kernel is compiled under the name {symbol!r}")

    def call(*args):
        return call_symbol(symbol, args)

    return jitable(call, **CALLEE)


def _name(symbol: str, dispatcher: Any, signature: Any) -> None:
    import llvmlite.binding as llvm

    compiled = dispatcher.overloads[signature.args]
    wrapper = compiled.library.get_pointer_to_function(compiled.fndesc.llvm_cfunc_wrapper_name)
    llvm.add_symbol(symbol, wrapper)
    _named[symbol] = dispatcher, compiled.signature


def _lower_call_symbol(numba: Any) -> None:
    from llvmlite import ir
    from numba.core import cgutils
    from numba.extending import intrinsic, overload

    @intrinsic(prefer_literal=True)
    def call(typingctx: Any, symbol: Any, args: Any) -> Any:
        if not isinstance(symbol, numba.types.StringLiteral):
            return None
        name = symbol.literal_value
        if name not in _named:
            raise TypeError(f"no kernel is compiled under the name {name!r}")
        wanted = _named[name][1]
        given = tuple(args.types)
        if len(given) != len(wanted.args) or not all(
            typingctx.can_convert(g, w) for g, w in zip(given, wanted.args)
        ):
            raise TypeError(f"kernel {name!r} takes {wanted.args}, not {given}")

        def codegen(context: Any, builder: Any, signature: Any, values: Any) -> Any:
            fnty = ir.FunctionType(
                context.get_value_type(wanted.return_type),
                [context.get_value_type(t) for t in wanted.args],
            )
            fn = cgutils.get_or_insert_function(builder.module, fnty, name)
            packed = values[1]  # the args tuple
            converted = [
                context.cast(builder, builder.extract_value(packed, i), g, w)
                for i, (g, w) in enumerate(zip(given, wanted.args))
            ]
            return builder.call(fn, converted)

        return wanted.return_type(symbol, args), codegen

    @overload(call_symbol, prefer_literal=True)
    def _call_symbol(symbol, args):  # Numba compares these names, annotations too
        return lambda symbol, args: call(symbol, args)


on_load(_lower_call_symbol)


# Note [C loops by address]: a kernel may call a C function whose address it is given
# at run time (``call_address(address, args)``). The C core's elementwise loops and
# folds (Note [C loops] in numba_cpu/kernels.py) run this way in the pure-Python core
# and in the backend's own paths: through one small kernel per signature of dtypes,
# where each operator and dtype had its own kernels, compiled beside the C core's loops
# of the same code. The tests of elementwise operators, autograd and complex numbers, run by
# both cores side by side from empty caches as CI runs them, took 736 CPU-seconds that
# way and 652 this way (Zen 3). A pure-Python core's call pays ~0.1 us more, and a
# strided loop over many short rows a few ns per row (one C call each): int32 (20000,
# 3) + (3,) took 590-615 us before, 665-730 after, in the pure-Python core. The
# address is an argument, not a constant, so such a kernel caches. The loop is declared
# with ``args``' types (a pointer passed as the integer ``array.ctypes.data``): the same
# registers as its own pointer parameters on every 64-bit target Numba supports.
def call_address(address: int, args: tuple) -> None:
    """In a kernel: call the C function at ``address`` with ``args`` (Note [C loops by
    address])."""
    raise TypeError("call_address is called from kernels only")


def _lower_call_address(numba: Any) -> None:
    from llvmlite import ir
    from numba.extending import intrinsic, overload

    @intrinsic
    def call(typingctx: Any, address: Any, args: Any) -> Any:
        if not isinstance(address, numba.types.Integer):
            return None
        if any(isinstance(t, numba.types.Boolean) for t in args):  # an i1, not a C bool
            raise TypeError("call_address passes a flag as an integer, not a Boolean")

        def codegen(context: Any, builder: Any, signature: Any, values: Any) -> Any:
            fnty = ir.FunctionType(ir.VoidType(), [context.get_value_type(t) for t in args])
            fn = builder.inttoptr(values[0], fnty.as_pointer())
            builder.call(fn, [builder.extract_value(values[1], i) for i in range(len(args))])
            return context.get_dummy_value()

        return numba.types.void(address, args), codegen

    @overload(call_address)
    def _call_address(address, args):  # Numba compares these names, annotations too
        return lambda address, args: call(address, args)


on_load(_lower_call_address)


# Note [Assignment in kernels]: an array assigned into a slice in a kernel (``a[i:j] =
# b``) compiles Numba's check that the shapes agree, whose message formats both shapes
# with Numba's strings: 4 s of compiling string code the first time in a process and
# ~0.4 s in each kernel after; in a parallel kernel the assignment becomes a parallel
# loop of its own too. Kernels assign through ``assign(dst, src)`` instead: loops over
# the axes, src an array of dst's shape or a number. Compiled from empty caches in one
# process (float32, Zen 3): the sixteen im2col block loops of the convolutions, four of
# them assigning, in 54.7 s with Numba's assignments and 46.9 s with ``assign`` (and
# ran as fast or faster), Winograd's filter transform, serial and parallel, in 6.3 s
# and 3.9 s.
def assign(dst: Any, src: Any) -> None:
    """In a kernel: ``dst[...] = src``, ``src`` an array of dst's shape or a number
    (Note [Assignment in kernels]); outside one, NumPy's."""
    dst[...] = src


def _lower_assign(numba: Any) -> None:
    from numba.extending import overload

    Array = numba.types.Array

    @overload(assign, jit_options=CALLEE)
    def _assign(dst, src):  # Numba compares these names
        if not isinstance(dst, Array) or (isinstance(src, Array) and src.ndim != dst.ndim):
            return None
        if dst.ndim == 1:

            def elements(dst, src):
                _same_shape(dst, src)
                for i in range(dst.shape[0]):
                    dst[i] = _part(src, i)

            return elements

        def rows(dst, src):
            _same_shape(dst, src)
            for i in range(dst.shape[0]):
                assign(dst[i], _part(src, i))

        return rows

    @overload(_part, jit_options=CALLEE)
    def _part_of(src, i):
        if isinstance(src, Array):
            return lambda src, i: src[i]
        return lambda src, i: src

    @overload(_same_shape, jit_options=CALLEE)
    def _shapes(dst, src):
        if not isinstance(src, Array):
            return lambda dst, src: None

        def check(dst, src):
            if dst.shape != src.shape:
                raise ValueError("assign: the arrays' shapes differ")

        return check


def _part(src: Any, i: int) -> Any:
    """In a kernel: ``src[i]`` of an array, a number itself."""


def _same_shape(dst: Any, src: Any) -> None:
    """In a kernel: refuse arrays of two shapes."""


on_load(_lower_assign)


_cfuncs: list = []  # compiled cfuncs stay alive: the C core holds only their addresses


def compile_cfunc(
    pyfunc: Callable,
    signature: Any,
    cache: bool = True,
    fastmath: Any = False,
    vector_width: int | None = None,
) -> Any:
    """Compile ``pyfunc`` as a C function (numba.cfunc) of ``signature`` (Note [C loops]
    in numba_cpu/kernels.py); ``cache=False`` skips Numba's cache, keeping the IR;
    ``vector_width`` as compile_kernel's."""
    _load()
    from numba.core.ccallback import CFunc  # what numba.cfunc makes, its cache keyed here
    from numba.core.sigutils import normalize_signature

    if cache:
        _check_cells(pyfunc)
    fastmath = set(fastmath) if fastmath else False  # Numba takes a set, not a frozenset
    options = {**OPTIONS, "fastmath": fastmath}
    del options["cache"]
    cfunc = CFunc(pyfunc, normalize_signature(signature), locals={}, options=options)
    once: Any = contextlib.nullcontext()
    if cache:
        cfunc.enable_caching()
        cfunc._cache.options = (tuple(sorted(fastmath or ())), vector_width)
        once = loop_cache.compiling_once(cfunc._cache, f"{signature}|{cfunc._cache.options}")
    with once, _compiling_for(vector_width):
        cfunc.compile()
    return cfunc


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
