"""Elementwise kernels of the CPU backend: unary, binary and ternary operators.

Operator setup follows the seed's 0.4.1 path: a short fast path (same shape, same
dtype, C-contiguous: one flat loop) and a general path that branches off it (type
promotion, broadcasting, strides). Kernels compile lazily, once per dtype, and load
from Numba's on-disk cache afterwards (Note [Kernel cache]).
"""

import functools

import numpy as np

from lamina.backends import jit, threads
from lamina.backends import setup as S
from lamina.dispatch import core, layouts
from lamina.dispatch import dtypes as D
from lamina.dispatch.schema import OPERATORS, tagged
from lamina.dispatch.tensor import from_array, from_flat

from . import kernels as K
from .layout import strided_args

empty = np.empty
KERNELS = []  # (ElementwiseKernel, Elementwise): their limits follow the thread count
_parallel_min = float("inf")  # Note [Parallel threshold] (lamina.backends.threads)
_parallel_min_narrow = float("inf")  # the same, for elements under 4 bytes


def _set_threshold(threshold):
    global _parallel_min, _parallel_min_narrow
    _parallel_min = threshold
    _parallel_min_narrow = threshold * threads.NARROW_ELEMENTWISE_FACTOR
    for kernel, _ in KERNELS:
        kernel.set_limit(threshold)  # Note [Fast path]: from it on, the general path


threads.on_change(_set_threshold)

# ---------------------------------------------------------------- elementwise

_FLAT = {1: K.unary_flat, 2: K.binary_flat, 3: K.ternary_flat}
_STRIDED = {1: K.unary_strided, 2: K.binary_strided, 3: K.ternary_strided}
_SCALAR = {2: K.binary_scalar, 3: K.ternary_scalars}
_INPLACE = {2: K.binary_inplace}
_TEMPLATES = {core.LOOP_FLAT: _FLAT, core.LOOP_SCALAR: _SCALAR, core.LOOP_STRIDED: _STRIDED}
# the C core's loops called by address, by arity (Note [C loops by address])
_FLAT_AT = {1: K.unary_flat_at, 2: K.binary_flat_at}
_STRIDED_AT = {1: K.unary_strided_at, 2: K.binary_strided_at}
# the C core's loops by form (reference.LOOP_FLAT, LOOP_SCALAR, LOOP_STRIDED) and arity
_C_LOOPS = {
    (core.LOOP_FLAT, 1): K.unary_cloop,
    (core.LOOP_FLAT, 2): K.binary_cloop,
    (core.LOOP_SCALAR, 2): K.scalar_cloop,
    (core.LOOP_STRIDED, 1): K.unary_strided_cloop,
    (core.LOOP_STRIDED, 2): K.binary_strided_cloop,
}
# operators whose float loops call kernels.py's vector math (Note [Vector math])
VECTOR_MATH = ("exp", "log", "tanh")
_INT_BOUNDS = [
    (int(np.iinfo(d.np).min), int(np.iinfo(d.np).max)) if d.kind in "iu" else None for d in D.ALL
]


def in_parallel(comp, n):
    """Whether an elementwise loop over n elements of dtype ``comp`` runs in parallel
    (Note [Parallel threshold] in lamina.backends.threads)."""
    return n >= (_parallel_min if comp.np.itemsize >= 4 else _parallel_min_narrow)


class Elementwise:
    """Kernels and setup of one elementwise operator (unary, binary or ternary).

    ``scalar(dtype)`` picks the scalar function for a computation dtype;
    ``in_dtypes(dtype)`` gives each input's dtype (``where`` takes a bool condition)."""

    def __init__(self, op, arity, scalar, in_dtypes=None, promote_from=0, validate=None, simd=None):
        self.op, self.arity, self.scalar_fn = op, arity, scalar
        # NumPy's ufunc, whose loops compute float operands at every size (Note [NumPy
        # SIMD loops]; the C core calls its inner loops itself: Note [NumPy inner loops])
        self.simd = simd
        self.numpy_loops = isinstance(simd, np.ufunc) and op.name not in OWN_LOOP_FASTER
        self.in_dtypes = in_dtypes or (lambda d: [d] * arity)
        self.promote_from = promote_from
        # (dtype kinds, fn(op, dtype, arrays)): a check of the values before the kernel
        # runs, for those kinds; they skip the fast paths
        self.validate_kinds, self.validate = validate or ("", None)
        self.flat = jit.Family(lambda i: self._numpy_flat(i) or self._serial(core.LOOP_FLAT, i))
        self.flat_parallel = jit.Family(lambda i: self._compile(_FLAT, i, jit.prange))
        self.strided = jit.Family(lambda i: self._serial(core.LOOP_STRIDED, i))
        self.strided_parallel = jit.Family(lambda i: self._compile(_STRIDED, i, jit.prange))
        self.scalar = jit.Family(
            lambda i: self._numpy_scalar(i) or self._serial(core.LOOP_SCALAR, i)
        )
        self.scalar_parallel = jit.Family(lambda i: self._compile(_SCALAR, i, jit.prange))
        self.inplace = jit.Family(lambda i: self._compile(_INPLACE, i, range))
        self.inplace_parallel = jit.Family(lambda i: self._compile(_INPLACE, i, jit.prange))
        # Note [Fast path]: the result dtype of a call whose inputs all have dtype i and
        # need no promotion, or None where dtype i must go through the general path.
        self.fast_out = []
        for d in D.ALL:
            try:
                comp = S.check_dtype(op, d)
            except TypeError:
                comp = None
            fast = comp is d and arity != 3 and d.kind not in self.validate_kinds
            self.fast_out.append(S.result_dtype(op, d) if fast else None)
        # the result dtype of a loop computing in dtype i (the unchecked path's)
        self.results = [S.result_dtype(op, d) for d in D.ALL]

    def numpy_ufunc(self, index):
        """The NumPy ufunc whose inner loop computes in dtype index ``index``, or None
        where the backend's loops do (Note [NumPy inner loops])."""
        return self.simd if self.numpy_loops and D.ALL[index].kind == "f" else None

    def _numpy_flat(self, index):
        """The reference core's flat loop where NumPy's computes: the ufunc itself."""
        if self.numpy_ufunc(index) is None:
            return None
        return lambda *arrays: self.run_simd(arrays[-1], *arrays[:-1])

    def _numpy_scalar(self, index):
        """The same, for a tensor and a Python scalar (converted to the dtype first, as
        the loops convert it)."""
        if self.numpy_ufunc(index) is None:
            return None
        to_dtype = D.ALL[index].np.type

        def scalar(x, v, out, first):
            with np.errstate(all="ignore"):
                v = to_dtype(v)
            self.run_simd(out, *((v, x) if first else (x, v)))

        return scalar

    def address(self, form, index):
        """The C address of the loop of dtype index ``index`` in ``form`` (LOOP_FLAT,
        LOOP_SCALAR, LOOP_STRIDED): what the C core calls, with no Numba unboxing (Note
        [C loops])."""
        comp = D.ALL[index]
        out = S.result_dtype(self.op, comp)
        template = _C_LOOPS[form, self.arity]
        fn, ins = self.scalar_fn(comp), self.in_dtypes(comp)
        return jit.c_loop(
            (template, fn, comp, out, tuple(ins)),
            lambda cache: K.c_loop(template, fn, comp, out, ins, cache),
        )

    def _serial(self, form, index):
        """The serial loop of ``form`` (LOOP_FLAT, LOOP_SCALAR, LOOP_STRIDED) computing
        in dtype index ``index``: the C core's loop, called by address (Note [C loops by
        address] in backends/jit.py); a ternary operator has none, and its template is
        compiled."""
        if self.arity == 3:
            return self._compile(_TEMPLATES[form], index, range)
        types, comp = jit.types, D.ALL[index]
        out = jit.array(S.result_dtype(self.op, comp).np)
        ins = [jit.array(d.np) for d in self.in_dtypes(comp)]
        if form == core.LOOP_FLAT:
            kernel, args = _FLAT_AT[self.arity], (*ins, out)
        elif form == core.LOOP_SCALAR:
            scalar = getattr(types, K.SCALAR_ARGUMENT[comp.kind])
            kernel, args = K.scalar_at, (ins[0], scalar, out, types.boolean)
        else:
            operand = (types.int64, jit.index())  # offset, strides
            strided = [t for a in [out, *ins] for t in (a, *operand)]
            kernel, args = _STRIDED_AT[self.arity], (*strided, jit.index())
        sig = types.void(types.int64, *args)
        entry = jit.cached((kernel, sig), lambda: jit.compile_kernel(kernel, sig))
        return functools.partial(entry, self.address(form, index))

    def _compile(self, family, index, loop):
        types = jit.types
        comp = D.ALL[index]
        out = jit.array(S.result_dtype(self.op, comp).np)
        ins = [jit.array(d.np) for d in self.in_dtypes(comp)]
        if family is _FLAT:
            sig = types.void(*ins, out)
        elif family is _SCALAR and self.arity == 2:
            sig = types.void(ins[0], jit.numba.from_dtype(comp.np), out, types.boolean)
        elif family is _SCALAR:
            scalars = [jit.numba.from_dtype(d.np) for d in self.in_dtypes(comp)[1:]]
            sig = types.void(ins[0], *scalars, out)
        elif family is _INPLACE:
            sig = types.void(out, ins[1])
        else:
            operand = (types.int64, jit.index())  # offset, strides
            sig = types.void(out, *operand, *[t for a in ins for t in (a, *operand)], jit.index())
        return K.instantiate(family[self.arity], (self.scalar_fn(comp), loop), sig)

    def general(self, args, target=None, op=None):
        """Promotion, broadcasting, strides; ``target`` is the tensor of an in-place op
        and ``op`` that operator (``add_``), so that errors name what was called."""
        op = op or self.op
        comp = S.promote(op, args[self.promote_from :])
        res = S.result_dtype(op, comp)
        shape = S.broadcast_shapes(op.name, *(S.shape_of(a) for a in args))
        if S.mixed_sign_comparison(op, args):  # Note [Mixed-sign comparisons]
            return from_array(np.asarray(getattr(np, op.name)(*[a._data for a in args])))
        ins = self.in_dtypes(comp)
        arrays = [S.operand(a, d) for a, d in zip(args, ins)]
        if target is None:
            if not all(a.flags.c_contiguous for a in arrays):
                like = layouts.layout_source(op, args)
                if like is not None:  # operands in one dense order: the result too, and
                    # the loop runs over the memory in that order (Note [Result layouts])
                    order = layouts.dense_order(like._shape, layouts.strides_of(like))
                    physical = empty(tuple(shape[i] for i in order), res.np)
                    arrays = [a.transpose(order) if a.ndim else a for a in arrays]
                    if comp.kind in self.validate_kinds and physical.size:
                        self.validate(op, comp, arrays)
                    self.run(comp, physical, arrays)
                    return from_array(physical.transpose(layouts.inverse_order(order)))
            out = empty(shape, res.np)
        else:
            S.inplace_check(op, target, res, shape)
            out = target._data
            # the target itself is read and written at the same index: no copy needed
            # (copying it made every ``x += y`` allocate a temporary of x's size)
            arrays = [
                a.copy() if a is not out and np.may_share_memory(a, out) else a for a in arrays
            ]
        if comp.kind in self.validate_kinds and out.size:  # nothing computed, nothing to refuse
            self.validate(op, comp, arrays)
        self.run(comp, out, arrays)
        return target if target is not None else from_array(out)

    def run(self, comp, out, arrays):
        n = out.size
        if n == 0:
            return
        parallel = in_parallel(comp, n)
        if self.numpy_loops and comp.kind == "f":
            self.run_simd(out, *arrays)
            return
        i = comp.index
        if out.flags.c_contiguous:
            dense = [a.shape == out.shape and a.flags.c_contiguous for a in arrays]
            if self.arity == 2 and (dense[0] or dense[1]):
                a, b = arrays
                if a is out and (dense[1] or b.size == 1):  # Note [In-place loops]
                    inplace = self.inplace_parallel if parallel else self.inplace
                    inplace[i](out.reshape(-1), b.reshape(-1))
                    return
                # a tensor and a scalar; a complex one takes the strided loop serially
                # (the C loops take a real scalar: Note [Scalar fast path])
                one = a.size == 1 or b.size == 1
                if not all(dense) and one and (parallel or comp.kind != "c"):
                    scalar = self.scalar_parallel if parallel else self.scalar
                    first = not dense[0]
                    tensor, v = (b, a) if first else (a, b)
                    scalar[i](tensor.reshape(-1), v.reshape(-1)[0], out.reshape(-1), first)
                    return
            if self.arity == 3 and dense[0] and arrays[1].size == 1 and arrays[2].size == 1:
                scalar = self.scalar_parallel if parallel else self.scalar
                b, c = (a.reshape(-1)[0] for a in arrays[1:])
                scalar[i](arrays[0].reshape(-1), b, c, out.reshape(-1))
                return
            if all(dense):
                flat = self.flat_parallel if parallel else self.flat
                flat[i](*[a.reshape(-1) for a in arrays], out.reshape(-1))
                return
        strided = self.strided_parallel if parallel else self.strided
        strided[i](*strided_args(out.shape, [out, *arrays]))

    def run_simd(self, out, *arrays):
        """NumPy's loops, on the threads from the parallel threshold on: in parts of
        dense operands called from C (Note [NumPy loops on threads]), else split by rows
        from SPLIT_FACTOR times the threshold (Note [NumPy SIMD loops])."""
        if out.size >= _parallel_min:
            job = self._numpy_job(out, arrays)
            if job is not None:
                _numpy_parts()(job.ctypes.data, threads.get_num_threads())
                return
        rows = out.shape[0] if out.ndim else 0
        if out.size < _parallel_min * SPLIT_FACTOR or rows < 2:
            self._run_simd(out, *arrays)
            return

        def part(start, stop):  # an operand broadcast along the rows is read whole
            split = [
                a[start:stop] if np.ndim(a) == out.ndim and len(a) == rows else a for a in arrays
            ]
            self._run_simd(out[start:stop], *split)

        threads.split(part, rows)

    def _numpy_job(self, out, arrays):
        """Note [NumPy loops on threads]: the C core's job for NumPy's loop on a dense
        out and operands of its size or of one element, or None."""
        loop = None
        if self.numpy_loops and core.numpy_loop is not None and out.flags.c_contiguous:
            loop = core.numpy_loop(self.simd, D.from_numpy(out.dtype).index)
        dense = all(
            isinstance(a, np.ndarray)
            and a.dtype == out.dtype
            and (a.size == 1 or (a.size == out.size and a.flags.c_contiguous))
            for a in arrays
        )
        if loop is None or not dense:
            return None
        operands = [*arrays, out]
        steps = [0 if a.size == 1 < out.size else out.itemsize for a in operands]
        pointers = [a.ctypes.data for a in operands]
        padding = [0] * (3 - len(operands))
        return np.array([*loop, len(operands), out.size, *pointers, *padding, *steps, *padding])

    def _run_simd(self, out, *arrays):
        with np.errstate(all="ignore"):  # lamina never warns on inf/nan results
            self.simd(*arrays, out=out)


_numpy_parts_kernel = None
_run_numpy_part = None  # the C core's run_numpy_part as the kernel calls it


def _numpy_parts():
    """Note [NumPy loops on threads]: a parallel loop over a job's parts, each run by the
    C core's run_numpy_part (as threads.split's parts kernel calls its trampoline)."""
    global _numpy_parts_kernel, _run_numpy_part
    if _numpy_parts_kernel is None:
        import llvmlite.binding as llvm

        numba = jit.numba
        llvm.add_symbol("lamina_run_numpy_part", core.numpy_part_address())
        i64 = numba.types.int64
        # a global, not a closure cell, as threads.py's trampoline (the cache key)
        _run_numpy_part = numba.types.ExternalFunction(
            "lamina_run_numpy_part", numba.types.void(i64, i64, i64)
        )

        def parts(job, count):
            for i in numba.prange(count):
                _run_numpy_part(job, i, count)

        kernel = numba.njit("void(int64, int64)", parallel=True, nogil=True, cache=True)(parts)
        _numpy_parts_kernel = threads.synced(kernel)
    return _numpy_parts_kernel


def _named(kernel, name):
    kernel.__module__, kernel.__qualname__ = __name__, name  # how dumps show it
    return kernel


def _fast_kernel(ew, general=None):
    kernel = core.ElementwiseKernel(
        ew.op.name,
        ew.arity,
        ew.fast_out,
        ew.results,
        ew,
        general or (lambda ks, *args: ew.general(args)),
        _INT_BOUNDS,
        _parallel_min,
    )
    KERNELS.append((kernel, ew))
    return _named(kernel, ew.op.name)


def unary_kernel(ew, general=None):
    """The C core's kernel of a unary operator; ``general(ks, x)`` serves the calls its
    fast path does not (ew's general path by default)."""
    return _fast_kernel(ew, general)


def scalar_kernel(ew, general):
    """The C core's kernel of an operator of a tensor and a Python number parameter
    (leaky_relu's slope): the scalar form of ew's kernel (Note [Scalar fast path]), so a
    contiguous call runs one loop with the number converted to the tensor's dtype;
    ``general(ks, x, number)`` serves the calls it does not."""
    return _named(_fast_kernel(ew, general).variant(core.SCALAR), ew.op.name)


def binary_kernel(ew):
    """The kernel and its two variants (Note [Kernel variants]): a Python scalar operand
    (``x * 2.0``), and the checks layer off (Note [Unchecked fast path])."""
    kernel = _fast_kernel(ew)
    variants = [_named(kernel.variant(form), ew.op.name) for form in (core.SCALAR, core.UNCHECKED)]
    return kernel, *variants


def inplace_kernel(ew, op):
    def kernel(ks, x1, x2):
        return ew.general((x1, x2), target=x1, op=op)

    kernel.__qualname__ = kernel.__name__ = op.name
    return kernel


def _by_kind(**fns):
    """A scalar-function chooser: keyword = dtype kinds ("f", "c", "iu", "b", "biuf")."""

    def choose(dtype):
        return next(fn for kinds, fn in fns.items() if dtype.kind in kinds)

    return choose


def _same(fn):
    return lambda dtype: fn


# Complex dtypes (kind "c") take the complex scalar functions of kernels.py (Note
# [Complex scalar functions]); the operators whose rule refuses complex never see them.
ELEMENTWISE_SCALARS = {
    "abs": _same(K.absolute),  # a complex one's modulus, into the real result dtype
    "negative": _same(K.negative),
    "positive": _same(K.identity),
    "square": _same(K.square),
    "conj": _by_kind(c=K.conjugate, biuf=K.identity),
    "real": _by_kind(c=K.real_part, biuf=K.identity),
    "imag": _same(K.imag_part),
    "sign": _by_kind(f=K.float_sign, c=K.complex_sign, iu=K.sign),
    "floor": _by_kind(f=K.float_floor, iu=K.identity),
    "ceil": _by_kind(f=K.float_ceil, iu=K.identity),
    "trunc": _by_kind(f=K.float_trunc, iu=K.identity),
    "round": _by_kind(f=K.round_half_even, c=K.complex_round, iu=K.identity),
    "bitwise_invert": _by_kind(b=K.logical_not, iu=K.bitwise_invert),
    "logical_not": _same(K.logical_not),
    "isfinite": _by_kind(f=K.isfinite, c=K.complex_isfinite, biu=K.always_true),
    "isinf": _by_kind(f=K.isinf, c=K.complex_isinf, biu=K.always_false),
    "isnan": _by_kind(f=K.isnan, c=K.complex_isnan, biu=K.always_false),
    "signbit": _same(K.signbit),
    "pow": _by_kind(f=K.power, c=K.complex_power, i=K.int_power, u=K.uint_power),
    "floor_divide": _by_kind(i=K.int_floor_divide, uf=K.floor_divide),
    "divide": _by_kind(f=K.divide, c=K.complex_divide),
    "reciprocal": _by_kind(f=K.reciprocal, c=K.complex_reciprocal),
    **{
        name: _by_kind(f=getattr(K, "float_" + name), c=getattr(K, "complex_" + name))
        for name in "expm1 log1p log2 log10 sqrt sin cos tan asin acos atan sinh cosh "
        "asinh acosh atanh".split()
    },
    **{  # Note [Vector math]
        name: _by_kind(f=getattr(K, "vector_" + name), c=getattr(K, "complex_" + name))
        for name in VECTOR_MATH
    },
    **{
        name: _same(getattr(K, name))
        for name in "add subtract multiply remainder maximum minimum atan2 "
        "copysign hypot logaddexp equal not_equal greater greater_equal less less_equal "
        "logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor "
        "bitwise_left_shift bitwise_right_shift".split()
    },
    "nextafter": lambda dtype: getattr(K, f"{dtype.name}_nextafter"),  # float32, float64
}


_REAL_SCALARS = (int, float)  # exactly: a bool bound is refused by the general path


def _clip_bounds(x, lo, hi):
    """clip's None bounds become the dtype's extremes; the result keeps x's dtype."""
    if x._dtype.kind == "f":
        lo = -np.inf if lo is None else lo
        hi = np.inf if hi is None else hi
    else:
        info = np.iinfo(x._dtype.np)
        lo = int(info.min) if lo is None else lo
        hi = int(info.max) if hi is None else hi
    return lo, hi


# Note [NumPy SIMD loops]: Numba has no vector math library here (Intel's SVML is not a
# dependency), so its loops call libm once per element for transcendental functions,
# where NumPy ships SIMD loops: on 1e5 float32 elements tanh took 1.26 ms against
# NumPy's 36 us, exp 233 against 45 (5-40x; float64 4-13x, except sin and cos). These
# operators' float32 and float64 loops are NumPy's, at every size: the C core calls the
# ufunc's inner loop itself (Note [NumPy inner loops] in dispatch/csrc/fastpath.c: 10**4
# float32 sin 11.3 -> 4.2 us, 100 elements 0.4 -> 0.26, NumPy's own call 4.3 and 0.26),
# and the general path and the pure-Python core call the ufunc on the operands lamina
# has set up as usual (promoted, broadcast, output allocated), so the values are
# NumPy's whatever the size, layout or core. NumPy's loops are single-threaded: from
# the parallel threshold on, run_simd runs them on the threads, on dense operands in
# parts called from C with no GIL (Note [NumPy loops on threads]: 2**17 float32 sin 55
# -> 33 us on two threads); others, and the pure-Python core's, from SPLIT_FACTOR times
# the threshold, on row blocks through threads.split, whose parts take the GIL to call
# the ufunc (a split costs ~43 us over half the work, Note [Split work]: at 2**17
# elements sin's ~65 us and reciprocal's ~35 us would gain nothing). Not for complex
# dtypes: NumPy's complex loops call libm once per element too (1e5 complex128 exp: 3.0
# ms, the Numba loop 2.9 ms), so the Numba loop serves them at every size. Nor for
# logaddexp, whose NumPy loop calls libm per element too: its loop is lamina's own, on
# the vector math below (kernels.logaddexp), at every size.
# The operators of VECTOR_MATH have scalar functions of lamina's own that LLVM vectorizes
# (Note [Vector math]); fused kernels call them, and exp's and log's loops run at every
# size: with 512-bit vectors, as NumPy's (Note [Vector width] in lamina.backends.jit),
# they are faster than NumPy's (1e5 float32: exp 27 us against 35, log 29 against 31).
# tanh's loop took 1.4-1.8x NumPy's time per element, so eager tanh runs NumPy's, as sin
# does (10**4 float32: 4.6 -> 2.7 us, NumPy 2.7); a fused tanh differs from it by at
# most the ulps of the Note.
SPLIT_FACTOR = 4
OWN_LOOP_FASTER = ("exp", "log")
SIMD_OPERATORS = frozenset(op.name for op in tagged("simd"))


def refuse_negative_exponent(op, dtype, arrays):
    """Integers to negative integer powers raise, as in NumPy and PyTorch (a truncated
    1 / x**k would be a silently different answer from every other backend)."""
    exponent = arrays[1]
    if exponent.size and exponent.min() < 0:
        raise ValueError(
            f"{op.name}: integers to negative integer powers are not allowed "
            f"(got a negative exponent for {dtype}); use a float base"
        )


ELEMENTWISE_CHECKS = {"pow": ("i", refuse_negative_exponent)}

BY_NAME = {}  # operator name -> Elementwise (the overhead tool's raw-kernel row reads it)


def register(registry):
    """A kernel for every operator with a scalar function in ELEMENTWISE_SCALARS (and
    its in-place variant); tests/test_dispatch.py checks that every elementwise
    operator of the schema has one."""
    for name, scalar_fn in ELEMENTWISE_SCALARS.items():
        op = OPERATORS[name]
        simd = None
        if op.name in SIMD_OPERATORS:
            simd = getattr(np, op.numpy)
        ew = BY_NAME[name] = Elementwise(
            op, op.arity, scalar_fn, simd=simd, validate=ELEMENTWISE_CHECKS.get(name)
        )
        if op.arity == 1:
            registry.register(name, "cpu", unary_kernel(ew))
        else:
            kernel, with_scalar, unchecked = binary_kernel(ew)
            registry.register(name, "cpu", kernel, with_scalar=with_scalar, unchecked=unchecked)
        if op.inplace is not None:
            registry.register(op.inplace.name, "cpu", inplace_kernel(ew, op.inplace))
    where = Elementwise(
        OPERATORS["where"], 3, _same(K.where), in_dtypes=lambda d: [D.bool_, d, d], promote_from=1
    )

    def where_kernel(ks, condition, x1, x2):
        try:  # the common case first: three contiguous tensors of one shape
            fc, f1, f2, dtype, shape = condition._flat, x1._flat, x2._flat, x1._dtype, x1._shape
            fast = (
                condition._dtype is D.bool_
                and x2._dtype is dtype
                and dtype.kind == "f"
                and condition._shape == shape == x2._shape
                and fc is not None
                and f1 is not None
                and f2 is not None
                and f1.size < _parallel_min
            )
        except AttributeError:  # a Python scalar operand
            fast = False
        if fast:
            out = empty(f1.size, dtype.np)
            where.flat[dtype.index](fc, f1, f2, out)
            return from_flat(out, shape, dtype)
        return where.general((condition, x1, x2))

    registry.register("where", "cpu", _named(where_kernel, "where"))
    clip = Elementwise(OPERATORS["clip"], 3, _same(K.clip))

    def clip_kernel(ks, x, min=None, max=None):
        flat, dtype = x._flat, x._dtype
        if (  # the common case first: a contiguous float tensor between two numbers
            type(min) in _REAL_SCALARS
            and type(max) in _REAL_SCALARS
            and dtype.kind == "f"
            and flat is not None
            and flat.size < _parallel_min
        ):
            out = empty(flat.size, dtype.np)
            clip.scalar[dtype.index](flat, min, max, out)
            return from_flat(out, x._shape, dtype)
        S.check_dtype(clip.op, x._dtype)
        S.check_clip_bounds(x, min, max)
        lo, hi = _clip_bounds(x, min, max)
        # the result has the broadcast shape of x and the bounds (Array API, as
        # array-api-strict); its dtype stays x's
        shape = S.broadcast_shapes("clip", x._shape, S.shape_of(lo), S.shape_of(hi))
        arrays = [x._data] + [S.clip_bound(b, x._dtype) for b in (lo, hi)]
        out = empty(shape, x._dtype.np)
        clip.run(x._dtype, out, arrays)
        return from_array(out)

    registry.register("clip", "cpu", clip_kernel)
