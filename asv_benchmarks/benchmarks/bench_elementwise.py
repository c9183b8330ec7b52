"""Elementwise operators at 1e2..1e7 elements, on the fast path and the general path.

``contiguous`` inputs take the backend's fast path (same shape, dtype, C-contiguous:
one flat Numba loop); ``strided``, ``broadcast`` and ``scalar`` inputs go through
operator setup's general path (promotion, broadcasting, strided loop). float32 and the
default thread count (1) unless the class says otherwise. See Note [Setup runs between
timed calls] in common.py.
"""

import lamina as lm

from .common import (
    SIZES,
    Benchmark,
    binary_operands,
    max_threads,
    memo,
    number_for,
    operand,
    threads,
    warm,
)


class Binary(Benchmark):
    params = [SIZES, ["add", "greater"], ["contiguous", "strided", "broadcast", "scalar"]]
    param_names = ["n", "op", "layout"]

    def setup(self, n, op, layout):
        self.fn = getattr(lm, op)
        self.a, self.b = binary_operands(n, layout)
        self.number = number_for(n)
        warm(("binary", op, layout), lambda: self.fn(*binary_operands(100, layout)))

    def time_op(self, n, op, layout):
        self.fn(self.a, self.b)


class Unary(Benchmark):
    params = [SIZES, ["negative", "exp", "tanh"], ["contiguous", "strided", "broadcast"]]
    param_names = ["n", "op", "layout"]

    def setup(self, n, op, layout):
        self.fn = getattr(lm, op)
        self.x = operand(n, layout)
        self.number = number_for(n)
        warm(("unary", op, layout), lambda: self.fn(operand(100, layout)))

    def time_op(self, n, op, layout):
        self.fn(self.x)


class InPlace(Benchmark):
    """``a += b`` (the ``add_`` operator): no output allocation, general path today."""

    params = [SIZES, ["contiguous", "broadcast"]]
    param_names = ["n", "layout"]

    def setup(self, n, layout):
        a, self.b = binary_operands(n, layout)
        # a private copy (the body writes to it), made once per process
        self.a = memo(("iadd target", n, layout), lambda: lm.asarray(a, copy=True))
        self.number = number_for(n)
        warm(("iadd", layout), lambda: self.a.__iadd__(self.b))

    def time_iadd(self, n, layout):
        a = self.a
        a += self.b


class Parallel(Benchmark):
    """Big elementwise ops with every thread Numba may use (prange kernels)."""

    params = [[10**6, 10**7], ["add", "exp"], ["contiguous", "strided"]]
    param_names = ["n", "op", "layout"]

    def setup(self, n, op, layout):
        self._threads = threads(max_threads())
        self._threads.__enter__()
        self.fn = getattr(lm, op)
        self.args = binary_operands(n, layout) if op == "add" else (operand(n, layout),)
        warm(("parallel", op, layout), lambda: self.fn(*self.args))

    def teardown(self, n, op, layout):
        self._threads.__exit__(None, None, None)

    def time_op(self, n, op, layout):
        self.fn(*self.args)
