"""Symbolic sizes: one compiled graph for every size of a dynamic function's inputs.

Note [Symbolic sizes]: when a dynamic function (Note [Dynamic sizes] in compiler.py)
meets a new size of a known kind, the dimensions of its contiguous inputs that changed
since the kind's latest variant (with a size of 2 or more now: 0 and 1 stay
specialized, since broadcasting and empty tensors take other paths) become symbols
``s0, s1, ...``; dimensions of equal size share a symbol. The function is traced at the
call's sizes, as always, and once more at probe sizes: each symbol a prime above its
size, none of the inputs' other sizes. If the two optimized graphs have the same
structure -- the same calls, the same fused loops, the same Python values except
integers -- each integer that differs (a reshape's size, a result's shape or strides, a
fused loop's length) is solved as ``c * s0**e0 * s1**e1 ...``: the probe's primes give
the exponents, the call's sizes check the solution; a third trace, at sizes away from
both (about half the call's), must give every integer its expression's value, so that
a size that only agreed at two sizes (``n // 2``) is caught. No number of traces
catches a clamp whose bound lies beyond all of them (``x[:16]`` has ``min(n, 16)``
elements: ``n`` at every traced size below 16), so a slice with a bound along a
symbolic dimension is refused. An integer with no such
solution, another value that differs (a float such as ``1 / n``), such a slice or
a structure that differs (Python that branches on a size) leaves the kind with one
variant per size, as before: never a wrong graph. A graph whose folded constants
depend on a size (``fold`` runs creation calls at compile time) is tried again without
``fold``. Otherwise the probe's graph, its integers replaced by their expressions
(``Sym``: printed ``s0``, ``10*s0``), is planned once: the plan reads each symbol from
an input's shape at every call and computes every size it passes (Note [Executor]), a
fused loop takes its length from them, and every reduction's divisor is the kernel's,
of the tensor it gets. A later call of that kind is that plan's if its sizes keep the
relations the probe had (``Family.values``): each symbol the same in every dimension
it names, 2 or more, different from the other symbols and from the inputs' fixed
sizes, and each fused loop on the same side of the parallel threshold; any other call
is a new variant, whose changed dimensions may make another symbolic variant. What
three traces cannot see: Python that branches on a size the same way at all three but
another way elsewhere (``if n > 1000:``): compile such a function with
``dynamic=False``.
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any

from lamina.backends import threads

from .graph import Graph, Value

PROBES_FROM = 2  # the smallest size a symbol stands for (Note [Symbolic sizes])


class Sym(int):
    """A size of a symbolic graph: ``coefficient * s_i**e_i * ...`` (``powers``: pairs
    of symbol number and exponent); as an int, its value at one trace (in a graph, the
    probe's)."""

    coefficient: int
    powers: tuple

    def __new__(cls, hint: int, coefficient: int, powers: tuple) -> Sym:
        self = super().__new__(cls, hint)
        self.coefficient, self.powers = coefficient, powers
        return self

    def __repr__(self) -> str:
        terms = [f"s{i}" if e == 1 else f"s{i}**{e}" for i, e in self.powers]
        return "*".join(([str(self.coefficient)] if self.coefficient != 1 else []) + terms)

    __str__ = __repr__

    def at(self, values: tuple) -> int:
        """The size for the symbols' ``values``."""
        return self.coefficient * math.prod(values[i] ** e for i, e in self.powers)

    @property
    def symbol(self) -> int | None:
        """The symbol's number where this size is one symbol alone."""
        alone = self.coefficient == 1 and len(self.powers) == 1 and self.powers[0][1] == 1
        return self.powers[0][0] if alone else None


def sizes_at(shape: tuple, values: tuple) -> tuple:
    return tuple(d.at(values) if isinstance(d, Sym) else d for d in shape)


def product(sizes: tuple) -> int:
    """The product of sizes, a ``Sym`` where one is."""
    coefficient, powers = 1, {}
    for d in sizes:
        coefficient *= d.coefficient if isinstance(d, Sym) else d
        for i, e in getattr(d, "powers", ()):
            powers[i] = powers.get(i, 0) + e
    hint = math.prod(sizes)
    return Sym(hint, coefficient, tuple(sorted(powers.items()))) if powers else hint


def symbol_places(inputs: list[Value], count: int) -> list[tuple[int, int]]:
    """Where a plan reads each of its graph's ``count`` symbols: (input, dimension),
    the first of its ``inputs`` that has it as one dimension (Note [Symbolic sizes])."""
    found: dict[int, tuple[int, int]] = {}
    for k, v in enumerate(inputs):
        for d, size in enumerate(v.shape):
            if isinstance(size, Sym) and size.symbol is not None:
                found.setdefault(size.symbol, (k, d))
    if len(found) < count:
        raise Mismatch("a symbol is no input's dimension")
    return [found[i] for i in range(count)]


class SymbolicFused:
    """A fused loop of a symbolic graph: the C loop of a ``FusedCall`` of the fuse pass
    (``like``) at the sizes of the symbols' values at a call, made once per values; a
    Numba loop (broadcast operands, a parallel loop) takes any size, so its lines are
    ``like``'s with the symbolic sizes."""

    c_loop = False  # never a plan's only call taken as is: it needs the symbols first
    KEPT = 256  # loops kept per fused node (bounded memory for ever new sizes)

    def __init__(
        self, like: Any, shape: tuple, result_shape: tuple | None, inner: Any, count: int
    ) -> None:
        self.like, self.shape, self.result_shape, self.inner = like, shape, result_shape, inner
        self.count = count  # the graph's symbols, all passed to ``at``
        self.name = like.name
        self.loops: dict[tuple, Any] = {}
        self.parallel = like.size >= threads.parallel_threshold()

    def fits(self, values: tuple) -> bool:
        """Whether the loop at these values is on the side of the parallel threshold
        the traced one was (else its variant's loop is another)."""
        size = math.prod(sizes_at(self.shape, values))
        return (size >= threads.parallel_threshold()) == self.parallel

    def at(self, *values: int) -> Any:
        """The loop's entry for the symbols' values (all of them, in order)."""
        loop = self.loops.get(values)
        if loop is None:
            if len(self.loops) >= self.KEPT:
                self.loops.clear()
            result_shape = (
                None if self.result_shape is None else sizes_at(self.result_shape, values)
            )
            inner = self.inner.at(values) if isinstance(self.inner, Sym) else self.inner
            shape = sizes_at(self.shape, values)
            loop = self.loops[values] = self.like.loop_at(shape, result_shape, inner)
        return loop

    def emit(self, args: list[str], results: list[str], bind: Any) -> list:
        if not self.like.c_loop:
            numba = copy.copy(self.like)
            numba.shape, numba.size = self.shape, product(self.shape)
            return numba.emit(args, results, bind)
        values = "".join(f"s{i}, " for i in range(self.count))
        targets = results[0] if len(results) == 1 else "".join(r + ", " for r in results)
        return [f"{targets} = {bind(self.at, 'k')}({values})({', '.join(args)})"]


class Mismatch(Exception):
    """The two traces differ in a way no symbolic size explains."""


class Generalizer:
    """Matches the call's graphs against the probe's, turning the probe's integers
    into ``Sym`` where they differ (Note [Symbolic sizes]); with ``check``, matches a
    third trace's graphs (at sizes ``actual``) against the symbolic ones instead,
    changing nothing."""

    def __init__(self, actual: list[int], probe: list[int], check: bool = False) -> None:
        self.actual, self.probe, self.check = actual, probe, check
        self.matched: dict[Value, Value] = {}  # probe Value -> call Value
        self.fused: list[SymbolicFused] = []

    def solve(self, a: int, b: int) -> int:
        """``b`` (the probe's) as ``c * s0**e0 * ...``, checked at ``a`` (the call's);
        a fixed factor may hold a probe's prime too, so each split of its power is
        tried, the most symbolic first."""
        if self.check:
            if (b.at(self.actual) if isinstance(b, Sym) else b) != a:
                raise Mismatch(f"the size {b} is not {a} at a third size")
            return b
        if a == b:
            return b
        most = [_multiplicity(b, p) for p in self.probe]
        for exponents in itertools.product(*(range(m, -1, -1) for m in most)):
            powers = tuple((i, e) for i, e in enumerate(exponents) if e)
            c = b // math.prod(p**e for p, e in zip(self.probe, exponents))
            if powers and c * math.prod(self.actual[i] ** e for i, e in powers) == a:
                return Sym(b, c, powers)
        raise Mismatch(f"the size {a} (probe {b}) is not a product of symbols")

    def sizes(self, a: tuple, b: tuple) -> tuple:
        if len(a) != len(b):
            raise Mismatch("ranks differ")
        return tuple(self.solve(x, y) for x, y in zip(a, b))

    def value(self, a: Value, b: Value) -> Value:
        seen = self.matched.get(b)
        if seen is not None:
            if seen is not a:
                raise Mismatch(f"{b.name} is another value")
            return b
        if (a.dtype, a.kind, a.device, a.requires_grad) != (
            b.dtype,
            b.kind,
            b.device,
            b.requires_grad,
        ):
            raise Mismatch(f"{b.name}'s type differs")
        if a.kind is not None and a.source is not b.source:
            raise Mismatch(f"{b.name} is another tensor")
        b.shape, b.strides = self.sizes(a.shape, b.shape), self.sizes(a.strides, b.strides)
        self.matched[b] = a
        return b

    def arg(self, a: Any, b: Any) -> Any:
        if isinstance(b, Value):
            if not isinstance(a, Value):
                raise Mismatch("a tensor against another argument")
            return self.value(a, b)
        if type(a) is int and isinstance(b, int) and type(b) in (int, Sym):
            return self.solve(a, b)
        if type(a) is not type(b):
            raise Mismatch(f"{a!r} against {b!r}")
        if isinstance(b, (tuple, list)):
            if len(a) != len(b):
                raise Mismatch("sequences of other lengths")
            items = [self.arg(x, y) for x, y in zip(a, b)]
            return type(b)(*items) if hasattr(b, "_fields") else type(b)(items)
        if isinstance(b, dict):
            if a.keys() != b.keys():
                raise Mismatch("dicts of other keys")
            return {k: self.arg(a[k], b[k]) for k in b}
        if not _same(a, b):
            raise Mismatch(f"an argument ({type(b).__name__}) differs")
        return b

    def target(self, a: Any, b: Any) -> Any:
        if a is b:
            return b
        if type(a) is type(b) and hasattr(b, "plan") and str(a.plan.graph) == str(b.plan.graph):
            return b  # calls on parameters alone (hoisted): no size of an input in them
        like = getattr(b, "like", b)  # a loop made symbolic: checked against its traced one
        if type(a) is not type(like) or not hasattr(like, "group") or a.c_loop != like.c_loop:
            raise Mismatch(f"{getattr(b, 'name', b)} is another call")
        group, other = a.group, like.group
        same = (a.ops, group.scalars, group.flat) == (like.ops, other.scalars, other.flat)
        if a.code != like.code or not same:  # the same compiled loop, on the same operands
            raise Mismatch(f"{b.name} is another loop")
        if like is not b:
            self.sizes(a.shape, b.shape), self.solve(a.inner, b.inner)
            return b
        shape = self.sizes(a.shape, b.shape)
        result = None if b.result_shape is None else self.sizes(a.result_shape, b.result_shape)
        inner = self.solve(a.inner, b.inner)
        if not any(isinstance(d, Sym) for d in (*shape, inner)):
            return b  # a loop of fixed length: as it is
        fused = SymbolicFused(b, shape, result, inner, len(self.probe))
        self.fused.append(fused)
        return fused

    def graph(self, a: Graph, b: Graph) -> None:
        """Match ``b`` (the probe's) against ``a``, writing its Syms into ``b``."""
        if len(a.nodes) != len(b.nodes) or len(a.inputs) != len(b.inputs):
            raise Mismatch("the graphs have other lengths")
        for x, y in zip(a.inputs, b.inputs):
            self.value(x, y)
        for x, y in zip(a.nodes, b.nodes):
            if x.several != y.several or len(x.results) != len(y.results):
                raise Mismatch(f"{y.name} has other results")
            try:
                y.target = self.target(x.target, y.target)
                y.args = self.arg(x.args, y.args)
                if y.name == "getitem":
                    _fixed_positions(*y.args)
                for r, s in zip(x.results, y.results):
                    self.value(r, s)
            except Mismatch as e:
                raise Mismatch(f"{y.name}: {e}") from None
        b.outputs = self.arg(a.outputs, b.outputs)


def _fixed_positions(x: Value, index: Any) -> None:
    """Refuses a slice with a bound along a symbolic dimension: the bound clamps to the
    size (``x[:16]`` has ``min(n, 16)`` elements, which three traces below 16 take for
    ``n``: Note [Symbolic sizes]). An integer index leaves no size behind, and the
    kernel checks it against the call's tensor."""
    items = index if isinstance(index, tuple) else (index,)
    bounded = [isinstance(i, slice) and (i.start, i.stop) != (None, None) for i in items]
    if Ellipsis in items:  # positions counted from both ends: any symbol may be sliced
        if any(bounded) and any(isinstance(d, Sym) for d in x.shape):
            raise Mismatch("a bounded slice beside an ellipsis on a symbolic tensor")
        return
    dims = [item for item in items if item is not None]  # None adds a dimension
    for dim, item in enumerate(dims):
        fixed = isinstance(item, slice) and (item.start, item.stop) != (None, None)
        if fixed and dim < len(x.shape) and isinstance(x.shape[dim], Sym):
            raise Mismatch(f"a bounded slice along the symbolic dimension {dim}")


def symbolic_layout(shapes: list, before: list, contiguous: list) -> tuple | None:
    """The sizes of the symbols at the call and each input's shape with its symbolic
    dimensions as ``Sym``: those of contiguous inputs that differ from the shapes
    ``before``, 2 or more now, one symbol per distinct size; None where there are none
    (Note [Symbolic sizes])."""
    changed = [
        {d for d, (n, m) in enumerate(zip(shape, old)) if n != m and n >= PROBES_FROM}
        if dense
        else set()
        for shape, old, dense in zip(shapes, before, contiguous)
    ]
    actual = sorted({shape[d] for shape, dims in zip(shapes, changed) for d in dims})
    if not actual:
        return None
    symbol = {n: Sym(n, 1, ((i, 1),)) for i, n in enumerate(actual)}
    layout = [
        tuple(symbol[n] if d in dims else n for d, n in enumerate(shape))
        for shape, dims in zip(shapes, changed)
    ]
    return actual, layout


def probe_sizes(actual: list[int], taken: set[int]) -> list[int]:
    """A prime for each symbol, above its size at the call, none among ``taken``
    (the inputs' fixed sizes) or the others (Note [Symbolic sizes])."""
    probes: list[int] = []
    for size in actual:
        p = size + 1
        while not _prime(p) or p in taken or p in probes or p in actual:
            p += 1
        probes.append(p)
    return probes


def check_sizes(actual: list[int], probes: list[int], taken: set[int]) -> list[int]:
    """A size for each symbol for the third trace, away from both traced ones: about
    half the call's where that is 2 or more, else above twice the probe's; none among
    ``taken``, the traced sizes or the others."""
    used = set(taken) | set(actual) | set(probes)
    sizes: list[int] = []
    for size, probe in zip(actual, probes):
        n = size // 2 if size >= 4 else 2 * probe + 1
        while n in used or n < PROBES_FROM:
            n += 1
        used.add(n)
        sizes.append(n)
    return sizes


def _same(a: Any, b: Any) -> bool:
    """Whether two arguments other than tensors and integers are equal (an array's
    ``==`` is no bool: never)."""
    try:
        return a is b or (a == b) is True
    except Exception:
        return False


def _multiplicity(n: int, p: int) -> int:
    """How many times the prime ``p`` divides ``n``."""
    count = 0
    while n and n % p == 0:
        n, count = n // p, count + 1
    return count


def _prime(n: int) -> bool:
    return n >= 2 and all(n % k for k in range(2, math.isqrt(n) + 1))


class Family:
    """The symbolic variant of one kind of a dynamic function's inputs: which input
    dimension is which symbol, and what its plan assumed (Note [Symbolic sizes])."""

    def __init__(
        self, variant: Any, layout: list[tuple], fused: list, described: list[str]
    ) -> None:
        self.variant = variant
        self.layout = layout  # per input tensor: its shape, its symbols as Sym
        self.key = layout_key(layout)
        self.fused = fused
        self.described = described  # "x dimension 0 is s0", for explain and recompiles
        self.count = len({d.symbol for shape in layout for d in shape if isinstance(d, Sym)})
        self.fixed = {d for shape in layout for d in shape if not isinstance(d, Sym)}

    def values(self, shapes: list[tuple]) -> tuple | None:
        """The symbols' values at these input shapes, or None where the plan does not
        hold for them."""
        if len(shapes) != len(self.layout):
            return None
        values: list = [None] * self.count
        for shape, layout in zip(shapes, self.layout):
            if len(shape) != len(layout):
                return None
            for size, want in zip(shape, layout):
                if not isinstance(want, Sym):
                    if size != want:
                        return None
                elif values[want.symbol] is None:
                    values[want.symbol] = size
                elif values[want.symbol] != size:
                    return None
        found = tuple(values)
        if len(set(found)) < len(found) or any(v < PROBES_FROM or v in self.fixed for v in found):
            return None
        return found if all(f.fits(found) for f in self.fused) else None


def layout_key(layout: list[tuple]) -> tuple:
    """A layout as a key: its symbols by name (a Sym equals its size as an int)."""
    return tuple(tuple(str(d) if isinstance(d, Sym) else d for d in shape) for shape in layout)
