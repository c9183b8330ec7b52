"""The per-call core in pure Python: the readable reference of the C extension.

Note [Two cores]: what every call pays for -- the Tensor's storage, the bindings (OR the
key sets, AND the mask, index the table by ``bit_length``) and the dense elementwise
fast path -- exists twice: here, in Python, and in ``csrc/``, in C. Both implement
exactly the same algorithm with the same names; ``core.py`` chooses one at import
(``LAMINA_PURE_PYTHON=1`` forces this one) and the test suite runs under both. The C
core handles only the common cases itself (tensors of the exact Tensor type, dense,
contiguous, same shape and dtype, below the kernel's size limit) and calls this
module's code -- or the kernel's general path -- for everything else, so errors and
corner cases are the same code in both.

* ``TensorBase``: the fields of every tensor (Note [Tensor fields] in tensor.py).
* ``OperatorTable``: an operator's table, scalar table and mask (Note [Dispatch table]).
* ``unary_binding``, ``binary_binding``: the public functions of elementwise operators
  (Note [Bindings]).
* ``ElementwiseKernel``: the dense fast path of an elementwise operator, filled by a
  backend with its per-dtype loops (Note [Fast path]).
* ``set_slot``: Tensor's operator methods (``__add__``, ...).
* ``guard_key``, ``guard_token``: a compiled function's guard (Note [Guards] in
  lamina.jit's compiler).
* ``FusedLoop``: a compiled plan's call of a fused elementwise loop (Note [Fused loops]).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# exact types: subclasses take the general paths, and so does a Python complex (Note
# [Scalar fast path]); scalar_keys accepts it
PY_SCALARS = (float, int, bool)
CPU = 1  # the CPU key (dispatch/keys.py), repeated here so the core imports nothing
IMPLEMENTATION = "python"


class TensorBase:
    """The fields of a tensor; ``tensor.Tensor`` adds the methods. Note [Autograd
    fields]: ``_output_nr`` (which output of ``_grad_fn`` the tensor is) and
    ``_accumulator`` (a leaf's AccumulateGrad node) are rarely anything but these
    defaults (the C core keeps them in its struct)."""

    __slots__ = ("__dict__", "__weakref__", "_data", "_dtype", "_flat", "_grad_fn", "_ks", "_shape")
    _output_nr = 0
    _accumulator = None


class NodeBase:
    """The fields every autograd node sets (lamina.autograd.graph.Node adds the rest):
    its derivative, the nodes its inputs' gradients flow into, what it saved."""

    __slots__ = ("__dict__", "__weakref__", "derivative", "next_nodes", "saved")


def RecordingKernel(kernel, **parts):
    """The autograd layer's binary kernel: the reference is the layer's own function
    (``kernel``; the C core records the common case itself, Note [C recording])."""
    return kernel


class OperatorTable:
    """Note [Dispatch table]: what a binding reads per call, kept apart from the schema
    entry so that the C core can read it as a struct: ``table`` and ``scalar_table``
    (lists indexed by ``ks.bit_length()``, updated in place) and ``mask``."""

    __slots__ = ("mask", "scalar_table", "table")

    def __init__(self) -> None:
        self.table: list = []
        self.scalar_table: list = []
        self.mask = 0


_tensor_type: type | None = None


def set_tensor_type(tensor_type: type) -> None:
    """The class kernels' outputs are made of (``tensor.Tensor``)."""
    global _tensor_type
    _tensor_type = tensor_type


def guard_key(prefix: tuple, args: tuple) -> tuple | None:
    """``prefix`` followed by, for each tensor of ``args``, (shape, dtype, key set,
    strides or False): False for a C-contiguous CPU storage (its ``_flat``), its
    strides otherwise. None when an argument is not a tensor with a storage that has
    strides (a sparse one refuses: TypeError)."""
    try:
        return (
            *prefix,
            *[(a._shape, a._dtype, a._ks, a._flat is None and a._data.strides) for a in args],
        )
    except (AttributeError, TypeError):
        return None


def guard_token(prefix: tuple, args: tuple) -> tuple | None:
    """A hashable of exactly the facts of ``guard_key(prefix, args)`` (``prefix``: of
    ints), cheap to hash and compare: the key the compiled call's hot path looks up (the
    C core's is bytes); None where ``guard_key`` must decide."""
    return guard_key(prefix, args)


# ---------------------------------------------------------------- bindings
# Note [Bindings]: an operator's binding does the dispatcher's work inline (OR the key
# sets, AND the mask, index the table by bit_length), so that ``a + b`` costs one call
# before the kernel. Python scalars have no key set; the AttributeError branch handles
# them off the fast path.


class _ModeKeys(threading.local):
    """This thread's mode keys (Note [Modes] in ``modes.py``)."""

    include = 0
    exclude = 0


mode_keys = _ModeKeys()
modes_active = False  # whether a mode is on in any thread: the bindings test it first


def set_modes_active(on: bool) -> None:
    global modes_active
    modes_active = on


def with_modes(ks: int) -> int:
    """A call's key set with this thread's modes applied (Note [Modes])."""
    return (ks | mode_keys.include) & ~mode_keys.exclude


def scalar_keys(name: str, *args: Any) -> int:
    """The key set of a call with Python scalars among its operands."""
    ks = 0
    for a in args:
        if type(a) in PY_SCALARS:
            continue
        k = getattr(a, "_ks", None)
        if k is not None:
            ks |= k
        elif not isinstance(a, (float, int, complex, np.generic)):  # IntEnum, 1j, ...
            raise TypeError(f"{name}: expected a tensor or a Python scalar, got {type(a).__name__}")
    if not ks:
        raise TypeError(
            f"{name}: expected at least one tensor, got {', '.join(type(a).__name__ for a in args)}"
        )
    return ks


def scalar_call(name: str, d: OperatorTable, x1: Any, x2: Any) -> Any:
    """A binary call with a Python scalar operand, through the table of the kernels'
    ``with_scalar`` variants (Note [Kernel variants]): a backend kernel's scalar path,
    which would otherwise first try its tensor fast path and raise there."""
    ks = scalar_keys(name, x1, x2)
    if modes_active:
        ks = with_modes(ks)
    ks &= d.mask
    return d.scalar_table[ks.bit_length()](ks, x1, x2)


def unary_binding(name: str, d: OperatorTable) -> Callable:
    table = d.table

    def call(x, /):
        try:
            ks = x._ks
        except AttributeError:
            raise TypeError(f"{name}: expected a tensor, got {type(x).__name__}") from None
        if modes_active:
            ks = with_modes(ks)
        ks &= d.mask
        return table[ks.bit_length()](ks, x)

    return call


def binary_binding(name: str, d: OperatorTable) -> Callable:
    table = d.table

    def call(x1, x2, /):
        try:
            ks = x1._ks | x2._ks
        except AttributeError:
            return scalar_call(name, d, x1, x2)
        if modes_active:
            ks = with_modes(ks)
        ks &= d.mask
        return table[ks.bit_length()](ks, x1, x2)

    return call


def set_slot(
    dunder: str, fn: Callable | None, reflected: Callable | None = None, symmetric: bool = False
) -> None:
    """Tensor's ``__{dunder}__`` (and ``__r{dunder}__``) operator method. ``symmetric``:
    ``fn`` takes the operands in their own order whichever is the tensor (an elementwise
    binding), so the reflected method is ``fn`` with its operands swapped back."""
    setattr(_tensor_type, f"__{dunder}__", fn)
    if symmetric:
        reflected = _reflected(fn)
    if reflected is not None:
        setattr(_tensor_type, f"__r{dunder}__", reflected)


def _reflected(fn: Callable) -> Callable:
    def reflected(self, other):
        return fn(other, self)

    return reflected


# ---------------------------------------------------------------- the fast path
# Note [Fast path]: a backend describes the dense fast path of an elementwise operator
# with an ElementwiseKernel: per input dtype (index) the result dtype of a call that
# needs no promotion (``fast_out``, None where the dtype must take the general path),
# the loops (per dtype, over contiguous 1-D arrays), the general path for everything
# else, and a size limit above which the general path serves (parallel loops, NumPy's
# SIMD loops). A call takes the fast path when its operands are tensors of the exact
# Tensor type, contiguous, of one dtype and one shape, below the limit.

TENSOR, SCALAR, UNCHECKED = 0, 1, 2  # the three forms of one kernel
# the forms of a backend's loops (loops.address(form, i)): contiguous; contiguous with a
# scalar operand; strided, the inner loop of a NumPy ufunc (the C core's general path)
LOOP_FLAT, LOOP_SCALAR, LOOP_STRIDED = 0, 1, 2
# a reduction's loops: over the rows of a (rows, cols) array, or down its columns
LOOP_ROWS, LOOP_COLUMNS = 3, 4
# var's second pass, the squared deviations from each row's mean (Note [C moments])
LOOP_DEVIATION_ROWS, LOOP_DEVIATION_COLUMNS = 5, 6
_empty = np.empty
_new = object.__new__


class ElementwiseKernel:
    """The dense fast path of one unary or binary elementwise operator.

    ``loops.flat[i](a, b, out)`` (``(x, out)`` for unary) and
    ``loops.scalar[i](a, v, out, scalar_first)`` run a contiguous loop computing in
    dtype index i; ``loops.address(form, i)`` gives the same loop's C address (the C
    core calls it without Python). ``results[i]`` is the result dtype of a computation
    in dtype i, ``fast_out[i]`` the same or None where dtype i takes the general path;
    ``general(ks, *args)`` serves every other call; ``bounds[i]`` are the (min, max) of
    integer dtype i, None otherwise. The SCALAR and UNCHECKED forms (Note [Kernel
    variants]) share everything but ``form``; ``limit`` is set on all three at once
    (``set_limit``). Each (arity, form) is a subclass with its own ``__call__``: the
    fast path is one Python frame, as a hand-written kernel's would be."""

    __slots__ = (
        "arity",
        "bounds",
        "fast_out",
        "flat",
        "form",
        "general",
        "limit",
        "loops",
        "name",
        "results",
        "scalar",
        "variants",
        "__dict__",
    )

    def __new__(cls, name: str, arity: int, *args: Any, form: int = TENSOR, **kwargs: Any):
        if cls is ElementwiseKernel:
            cls = _FORMS[arity, form]
        return _new(cls)

    def __init__(
        self,
        name: str,
        arity: int,
        fast_out: Sequence,
        results: Sequence,
        loops: Any,
        general: Callable,
        bounds: Sequence,
        limit: float,
        *,
        form: int = TENSOR,
    ):
        self.name, self.arity, self.loops, self.general = name, arity, loops, general
        self.fast_out, self.results, self.bounds = tuple(fast_out), tuple(results), tuple(bounds)
        self.limit, self.form, self.variants = limit, form, [self]
        self.flat, self.scalar = loops.flat, getattr(loops, "scalar", None)

    def variant(self, form: int) -> ElementwiseKernel:
        """The same kernel in another form: SCALAR or UNCHECKED."""
        k = ElementwiseKernel(
            self.name,
            self.arity,
            self.fast_out,
            self.results,
            self.loops,
            self.general,
            self.bounds,
            self.limit,
            form=form,
        )
        self.variants.append(k)
        return k

    def set_limit(self, limit: float) -> None:
        """The element count from which the general path serves (Note [Parallel
        threshold]), for this kernel and its variants."""
        for k in self.variants:
            k.limit = limit


class _Unary(ElementwiseKernel):
    __slots__ = ()

    def __call__(self, ks: int, x: Any) -> Any:
        fx, dt = x._flat, x._dtype
        out_dt = self.fast_out[dt.index]
        if fx is not None and out_dt is not None and fx.size < self.limit:
            shape = x._shape
            out = _empty(shape, out_dt.np)
            t = _new(_tensor_type)
            t._data, t._flat = out, out if len(shape) == 1 else out.reshape(-1)
            self.flat[dt.index](fx, t._flat)
            t._ks, t._dtype, t._shape = CPU, out_dt, shape
            return t
        return self.general(ks, x)


class _Binary(ElementwiseKernel):
    __slots__ = ()

    def __call__(self, ks: int, a: Any, b: Any) -> Any:
        try:
            fa = a._flat
            fast = (
                fa is not None
                and a._dtype is b._dtype
                and a._shape == b._shape
                and b._flat is not None
            )
        except AttributeError:  # not two tensors: the general path
            return self.general(ks, a, b)
        if fast:
            dt = a._dtype
            out_dt = self.fast_out[dt.index]
            if out_dt is not None and fa.size < self.limit:
                shape = a._shape
                out = _empty(shape, out_dt.np)
                t = _new(_tensor_type)  # the constructor, inlined: ~60 ns a call
                t._data, t._flat = out, out if len(shape) == 1 else out.reshape(-1)
                self.flat[dt.index](fa, b._flat, t._flat)
                t._ks, t._dtype, t._shape = CPU, out_dt, shape
                return t
        return self.general(ks, a, b)


class _WithScalar(ElementwiseKernel):
    __slots__ = ()

    def __call__(self, ks: int, a: Any, b: Any) -> Any:
        """Note [Scalar fast path]: a contiguous tensor and a Python scalar whose weak
        promotion keeps the tensor's dtype (``x * 2.0`` on floats and complex, ``i + 1``
        on ints in range): one loop with the scalar passed as an argument, converted to
        the dtype by the loop. Anything else takes the general path, a Python complex
        included (the C core passes scalars as one double or int)."""
        first = type(a) in PY_SCALARS
        t, v = (b, a) if first else (a, b)
        if type(v) not in PY_SCALARS or t.__class__ is not _tensor_type or t._flat is None:
            return self.general(ks, a, b)
        dt = t._dtype
        if type(v) is int:
            # an int keeps an int dtype when in range (else OverflowError, from the
            # general path); with floats it is converted; with bool it promotes
            bounds = self.bounds[dt.index]
            if dt.kind == "b" or (bounds is not None and not bounds[0] <= v <= bounds[1]):
                return self.general(ks, a, b)
        elif type(v) is float and dt.kind not in "fc":
            return self.general(ks, a, b)  # promotion to the default float
        out_dt = self.fast_out[dt.index]
        f = t._flat
        if out_dt is None or f.size >= self.limit:
            return self.general(ks, a, b)
        out = _empty(f.size, out_dt.np)
        self.scalar[dt.index](f, v, out, first)
        shape = t._shape
        r = _new(_tensor_type)
        r._data, r._flat = out if len(shape) == 1 else out.reshape(shape), out
        r._ks, r._dtype, r._shape = CPU, out_dt, shape
        return r


class _Unchecked(ElementwiseKernel):
    __slots__ = ()

    def __call__(self, ks: int, a: Any, b: Any) -> Any:
        # Note [Unchecked fast path]: the "checks" layer switched off (lamina.layers):
        # no shape, contiguity or promotion decisions, only what keeps memory safe
        # (equal sizes and dtypes; the loop rejects a non-array, i.e. None).
        try:
            fa, fb, dt = a._flat, b._flat, a._dtype
        except AttributeError:  # a scalar from a caller that does not use with_scalar
            return self.general(ks, a, b)
        if fa is None or fb is None or fa.size != fb.size or dt is not b._dtype:
            raise ValueError(
                f"{self.name}: with the checks layer off, both inputs must be "
                "contiguous tensors of one size and dtype"
            )
        out_dt = self.results[dt.index]
        shape = a._shape
        out = _empty(shape, out_dt.np)
        t = _new(_tensor_type)
        t._data, t._flat = out, out if len(shape) == 1 else out.reshape(-1)
        self.flat[dt.index](fa, fb, t._flat)
        t._ks, t._dtype, t._shape = CPU, out_dt, shape
        return t


# ---------------------------------------------------------------- fused loops
# Note [Fused loops]: a group of elementwise calls that lamina.jit fused, over contiguous
# operands below the parallel threshold, is one C function ``loop(pointers, rows,
# inner)`` (Note [Fused kernels] in numba_cpu/fused.py): ``pointers`` holds each input's
# data, then each output's; an input has ``rows * inner`` elements, or one (a scalar of
# the group, read at index 0); an output has ``rows * inner``, or ``rows`` where the
# group ends in a reduction of rows of ``inner`` values (Note [Fused reductions]). A
# compiled plan calls it through ``FusedLoop``, which checks its inputs, allocates its
# outputs and wraps them as tensors of ``shape``: one call per group, no Numba
# dispatcher, so a plan whose loops are in the loop cache runs without importing Numba.
# Its inputs are fixed by the plan's guards; the checks keep a wrong call (a plan bug)
# from reading out of bounds (Note [C safety]).

_LOOP = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(ctypes.c_void_p), ctypes.c_longlong, ctypes.c_longlong
)


class FusedLoop:
    """``loop(inputs...)``: the fused loop at C ``address``, run over ``rows`` rows of
    ``inner`` elements, on tensors of the dtypes and sizes of ``inputs`` ((DType,
    size) pairs), giving a new tensor of ``shape`` per dtype of ``outputs`` (one: the
    tensor; several: a tuple)."""

    def __init__(
        self, address: int, shape: tuple, inputs: tuple, outputs: tuple, rows: int, inner: int
    ) -> None:
        self.address, self.shape, self.inputs, self.outputs = address, shape, inputs, outputs
        self.rows, self.inner = rows, inner
        self.size = int(np.prod(shape, dtype=np.int64))
        # the loop writes ``rows`` values per output (``rows * inner`` with ``inner``
        # 1 for an elementwise group) and reads ``rows * inner`` (or one) per input
        if self.size != rows or any(size not in (1, rows * inner) for _, size in inputs):
            raise ValueError("FusedLoop: the sizes of its operands and its rows disagree")
        self._loop = _LOOP(address)

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.inputs):
            raise TypeError(f"fused loop: {len(args)} inputs, expected {len(self.inputs)}")
        pointers = []
        for k, (a, (dtype, size)) in enumerate(zip(args, self.inputs)):
            flat = getattr(a, "_flat", None)
            if (
                type(flat) is not np.ndarray
                or a._dtype is not dtype
                or flat.dtype != dtype.np
                or flat.size != size
            ):
                raise TypeError(
                    f"fused loop: input {k} is not a contiguous tensor of {size} elements "
                    f"of {dtype}"
                )
            pointers.append(flat.ctypes.data)
        results = [_empty(self.size, dtype.np) for dtype in self.outputs]
        pointers += [out.ctypes.data for out in results]
        self._loop((ctypes.c_void_p * len(pointers))(*pointers), self.rows, self.inner)
        shape = self.shape
        for m, (out, dtype) in enumerate(zip(results, self.outputs)):
            t = results[m] = _new(_tensor_type)
            t._data, t._flat = out if len(shape) == 1 else out.reshape(shape), out
            t._ks, t._dtype, t._shape = CPU, dtype, shape
        return results[0] if len(results) == 1 else tuple(results)

    def run(self, inputs: Sequence) -> Any:
        """The call on a sequence of inputs: a plan that is this one call runs it."""
        return self(*inputs)


_FORMS = {
    (1, TENSOR): _Unary,
    (2, TENSOR): _Binary,
    (2, SCALAR): _WithScalar,
    (2, UNCHECKED): _Unchecked,
}
