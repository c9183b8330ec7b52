"""Explicit SIMD vectors for kernels whose loops LLVM does not vectorize as wanted.

Note [Explicit vectors]: a kernel calls ``load(a, i)``, ``store(a, i, v)`` and
``multiply_add(x, w, acc)`` on vectors of ``lanes(a)`` consecutive elements of a
C-contiguous float array (indexed flat, unaligned, no bounds check: the caller keeps
i + lanes within the array). A vector is a value, not memory, so one loaded before a
loop stays in a register through it, where LLVM reloaded a weight row on every pass
of a loop over arrays, unable to prove that the output written in the loop does not
alias it (Note [Channels-last depthwise forward] in nn/depthwise.py). A vector
is as wide as the host's widest registers (512 bits with AVX-512, 256 with AVX, else
128); Numba's disk cache keys compiled code by the host CPU, so a kernel compiled for
one width is never loaded on a CPU of another. multiply_add is a multiply and an add
that LLVM may contract into one fused multiply-add (rounded once) where the CPU has
it, never a call to libm's fma where it does not. ``prefetch(a, i)`` and
``prefetch_write(a, i)`` hint that element i is read or written soon (llvm.prefetch:
no fault outside the array).
"""

import functools

import numpy as np

from lamina.backends import jit


def lanes(a):
    """The number of ``a``'s elements in one vector (a compile-time constant)."""
    raise NotImplementedError  # kernels only


def load(a, i):
    """The vector of a's elements i, i + 1, ..., i + lanes(a) - 1 (a flat index)."""
    raise NotImplementedError


def splat(a, i):
    """The vector whose every lane is a's element i (a flat index)."""
    raise NotImplementedError


def load_even(a, i):
    """The vector of a's elements i, i + 2, ..., i + 2 (lanes(a) - 1): every other one of
    the two vectors from i (a stride-2 loop's operand)."""
    raise NotImplementedError


def store(a, i, v):
    """a's elements i, ... = vector v."""
    raise NotImplementedError


def store_first(a, i, v, count):
    """a's elements i, ..., i + count - 1 = the first ``count`` lanes of vector v (a
    masked store: the elements after them are not touched)."""
    raise NotImplementedError


def multiply_add(x, w, acc):
    """acc + x * w, lane by lane."""
    raise NotImplementedError


def fold_max(best, x):
    """x where x > best or x is NaN, else best, lane by lane: a max pooling's running
    extreme (a NaN wins and stays, a tie keeps ``best``)."""
    raise NotImplementedError


def fold_min(best, x):
    """x where x < best or x is NaN, else best, lane by lane."""
    raise NotImplementedError


def taken_max(best, x, where, here):
    """``here`` where fold_max(best, x) takes x, else ``where``, lane by lane: where a
    running maximum was found."""
    raise NotImplementedError


def taken_min(best, x, where, here):
    """``here`` where fold_min(best, x) takes x, else ``where``."""
    raise NotImplementedError


def registers():
    """How many vector registers the host has (a compile-time constant): 32 with
    AVX-512 and on 64-bit Arm, else 16. A kernel keeps fewer vectors than that live
    through its inner loop, or LLVM spills them to memory (Note [Registers] in nn/direct.py)."""
    raise NotImplementedError


def prefetch(a, i):
    """Hint that a's element i is read soon."""
    raise NotImplementedError


def prefetch_write(a, i):
    """Hint that a's element i is written soon."""
    raise NotImplementedError


def lanes_of(dtype):
    """How many elements of ``dtype`` one vector holds on this host."""
    return _host_register_bytes() // np.dtype(dtype).itemsize


@functools.cache
def _host_register_bytes():
    return _register_bytes(jit.numba)  # asking LLVM for the host's features takes ~0.3 ms


@functools.cache
def _features(numba):
    codegen = numba.core.registry.cpu_target.target_context.codegen()
    return codegen._get_host_cpu_features().split(",")


def _register_bytes(numba):
    """The width in bytes of the host's widest vector registers."""
    features = _features(numba)
    return 64 if "+avx512f" in features else 32 if "+avx" in features else 16


def _register_count(numba):
    """The number of the host's vector registers (``registers``)."""
    features = _features(numba)
    return 32 if "+avx512f" in features or "+neon" in features else 16


def _lower(numba):
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic, models, overload, register_model

    class Vector(types.Type):
        def __init__(self, dtype, count):
            self.dtype, self.count = dtype, count
            super().__init__(name=f"Vector({dtype}, {count})")

    @register_model(Vector)
    class VectorModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            element = dmm.lookup(fe_type.dtype).get_value_type()
            super().__init__(dmm, fe_type, ir.VectorType(element, fe_type.count))

    width = _register_bytes(numba)

    def vector_of(array):
        return Vector(array.dtype, width * 8 // array.dtype.bitwidth)

    def pointer(context, builder, array_type, array, i):
        """The address of element i of a C-contiguous array, as a vector pointer."""
        data = context.make_array(array_type)(context, builder, array).data
        vector = context.get_value_type(vector_of(array_type))
        return builder.bitcast(builder.gep(data, [i]), vector.as_pointer())

    def floats(array):
        ok = isinstance(array, types.Array) and array.layout == "C"
        return ok and isinstance(array.dtype, types.Float)

    @intrinsic
    def vector_load(typingctx, a, i):
        if not floats(a) or not isinstance(i, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            p = pointer(context, builder, a, args[0], args[1])
            return builder.load(p, align=a.dtype.bitwidth // 8)

        return vector_of(a)(a, i), codegen

    @intrinsic
    def vector_splat(typingctx, a, i):
        if not floats(a) or not isinstance(i, types.Integer):
            return None
        lanes = vector_of(a).count

        def codegen(context, builder, sig, args):
            data = context.make_array(a)(context, builder, args[0]).data
            value = builder.load(builder.gep(data, [args[1]]))
            i32 = ir.IntType(32)
            vector = ir.Constant(context.get_value_type(vector_of(a)), None)
            vector = builder.insert_element(vector, value, ir.Constant(i32, 0))
            zeros = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
            return builder.shuffle_vector(vector, vector, zeros)

        return vector_of(a)(a, i), codegen

    @intrinsic
    def vector_load_even(typingctx, a, i):
        if not floats(a) or not isinstance(i, types.Integer):
            return None
        count = vector_of(a).count

        def codegen(context, builder, sig, args):
            p = pointer(context, builder, a, args[0], args[1])
            align = a.dtype.bitwidth // 8
            first = builder.load(p, align=align)
            second = builder.load(builder.gep(p, [ir.Constant(ir.IntType(64), 1)]), align=align)
            mask = ir.Constant(ir.VectorType(ir.IntType(32), count), [2 * k for k in range(count)])
            return builder.shuffle_vector(first, second, mask)

        return vector_of(a)(a, i), codegen

    @intrinsic
    def vector_store(typingctx, a, i, v):
        if not floats(a) or not isinstance(i, types.Integer) or v != vector_of(a):
            return None

        def codegen(context, builder, sig, args):
            p = pointer(context, builder, a, args[0], args[1])
            builder.store(args[2], p, align=a.dtype.bitwidth // 8)

        return types.void(a, i, v), codegen

    @intrinsic
    def vector_store_first(typingctx, a, i, v, count):
        ok = floats(a) and isinstance(i, types.Integer) and v == vector_of(a)
        if not ok or not isinstance(count, types.Integer):
            return None
        lanes = vector_of(a).count

        def codegen(context, builder, sig, args):
            p = pointer(context, builder, a, args[0], args[1])
            i32, vector = ir.IntType(32), ir.VectorType(ir.IntType(32), lanes)
            limit = builder.trunc(args[3], i32)
            limits = builder.insert_element(ir.Constant(vector, None), limit, ir.Constant(i32, 0))
            limits = builder.shuffle_vector(limits, limits, ir.Constant(vector, [0] * lanes))
            mask = builder.icmp_signed("<", ir.Constant(vector, list(range(lanes))), limits)
            value = context.get_value_type(vector_of(a))
            name = f"llvm.masked.store.v{lanes}f{a.dtype.bitwidth}.p0"
            fnty = ir.FunctionType(ir.VoidType(), [value, p.type, i32, mask.type])
            fn = cgutils.get_or_insert_function(builder.module, fnty, name)
            builder.call(fn, [args[2], p, ir.Constant(i32, a.dtype.bitwidth // 8), mask])

        return types.void(a, i, v, count), codegen

    def takes(builder, op, best, x):
        """Where a fold by ``op`` takes x: x beyond best, or x NaN."""
        beyond = builder.fcmp_ordered(op, x, best)
        return builder.or_(beyond, builder.fcmp_unordered("uno", x, x))

    def folder(op):
        @intrinsic
        def vector_fold(typingctx, best, x):
            if not (isinstance(x, Vector) and x == best):
                return None

            def codegen(context, builder, sig, args):
                best, x = args
                return builder.select(takes(builder, op, best, x), x, best)

            return x(best, x), codegen

        return lambda best, x: lambda best, x: vector_fold(best, x)

    def taker(op):
        @intrinsic
        def vector_taken(typingctx, best, x, where, here):
            if not (isinstance(x, Vector) and x == best == where == here):
                return None

            def codegen(context, builder, sig, args):
                best, x, where, here = args
                return builder.select(takes(builder, op, best, x), here, where)

            return x(best, x, where, here), codegen

        return lambda best, x, where, here: (
            lambda best, x, where, here: vector_taken(best, x, where, here)
        )

    overload(fold_max)(folder(">"))
    overload(fold_min)(folder("<"))
    overload(taken_max)(taker(">"))
    overload(taken_min)(taker("<"))

    @intrinsic
    def vector_multiply_add(typingctx, x, w, acc):
        if not (isinstance(x, Vector) and x == w == acc):
            return None

        def codegen(context, builder, sig, args):
            product = builder.fmul(args[0], args[1], flags=("contract",))
            return builder.fadd(args[2], product, flags=("contract",))

        return x(x, w, acc), codegen

    def prefetcher(write):
        @intrinsic
        def element_prefetch(typingctx, a, i):
            if not floats(a) or not isinstance(i, types.Integer):
                return None

            def codegen(context, builder, sig, args):
                data = context.make_array(a)(context, builder, args[0]).data
                i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
                address = builder.bitcast(builder.gep(data, [args[1]]), i8p)
                fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
                fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
                hints = [ir.Constant(i32, int(write)), ir.Constant(i32, 3), ir.Constant(i32, 1)]
                builder.call(fn, [address, *hints])

            return types.void(a, i), codegen

        return lambda a, i: lambda a, i: element_prefetch(a, i)

    overload(prefetch)(prefetcher(False))
    overload(prefetch_write)(prefetcher(True))

    @overload(lanes)
    def _lanes(a):
        if floats(a):
            count = vector_of(a).count
            return lambda a: count

    count = _register_count(numba)
    overload(registers)(lambda: lambda: count)
    overload(load)(lambda a, i: lambda a, i: vector_load(a, i))
    overload(store_first)(lambda a, i, v, n: lambda a, i, v, n: vector_store_first(a, i, v, n))
    overload(splat)(lambda a, i: lambda a, i: vector_splat(a, i))
    overload(load_even)(lambda a, i: lambda a, i: vector_load_even(a, i))
    overload(store)(lambda a, i, v: lambda a, i, v: vector_store(a, i, v))
    overload(multiply_add)(lambda x, w, acc: lambda x, w, acc: vector_multiply_add(x, w, acc))


jit.on_load(_lower)
