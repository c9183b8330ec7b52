"""``lm.jit.trace``, ``lm.jit.compile`` and ``lm.jit.explain``.

Note [Guards]: a compiled variant is valid for the calls whose inputs match what its
trace assumed: each tensor's shape, dtype, strides (its layout) and requires_grad
(CPU tensors only: others run eagerly), the other arguments' values, grad mode, the
dispatch tables' generation number (Note [Generation]) and, for a Module, every
submodule's training flag, the identity of its parameters and buffers and whether each
parameter requires grad (read again only when a module changed or a flag flipped: Note
[Module generation] in lamina.nn.modules, Note [Grad flag changes] in
dispatch/tensor.py).
``_guard_key`` reads all of that into one tuple, the key of the variant's dict: a call
costs that tuple and one lookup.
A call matching no variant traces a new one, up to ``cache_limit`` variants per
function; past it the function runs eagerly, with one warning naming what changed.

Note [Dynamic sizes]: in a dynamic function, a variant that differs from an earlier one
only in tensor sizes makes the dimensions that changed symbolic, so that one graph
serves every later size of that kind (Note [Symbolic sizes] in symbolic.py); where it
cannot, each size is traced anew (milliseconds) and shares its fused loops, which do not
depend on sizes. Such variants do not count against ``cache_limit``. ``dynamic=None``
(the default, as PyTorch's automatic dynamic shapes) makes a function dynamic at its
first such recompile; ``True`` from the start, ``False`` never. A dynamic function keeps
the ``SIZE_VARIANTS`` most recent variants of one kind (dtypes, strides, modes: a
strided input's strides change with its sizes, so each of its sizes is a kind), and a
function keeps its ``SEGMENTS_KEPT`` most recent compiled segments (Note [Graph breaks])
and ``RECOMPILES_KEPT`` entries of ``recompiles``, so a program of ever new sizes
(sequence lengths) holds bounded memory.

Note [Graph breaks]: a program that reads a tensor's values (``float(t)``, ``if t:``,
printing) or calls an operator whose result shape depends on values (``nonzero``)
cannot be one graph. With ``fullgraph=True`` that is an error naming the operator and
the user's line. Otherwise the variant runs in segments: at every call the program runs
again under the tracer, the calls recorded since the last break become a graph (compiled
once per distinct graph, kept by its printed form), which runs when a value is needed;
the value is read, and the program goes on. Each segment is optimized and runs without
dispatch, but the Python program and the trace run at each call: cheaper than eager
only for large tensors. ``explain`` lists the breaks.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from lamina.autograd.grad_mode import is_grad_enabled
from lamina.autograd.grad_mode import state as _grad
from lamina.dispatch import core, entries, keys
from lamina.dispatch import tensor as tensor_module
from lamina.dispatch.dtypes import DType
from lamina.dispatch.layouts import NHWC
from lamina.dispatch.tensor import Tensor
from lamina.nn import modules

from . import layouts as L
from . import passes as P
from . import training
from .executor import Plan, call_node
from .graph import CONSTANT, INPUT, Graph, Value
from .symbolic import (
    Family,
    Generalizer,
    Sym,
    check_sizes,
    layout_key,
    probe_sizes,
    sizes_at,
    symbolic_layout,
)
from .tracer import GraphBreak, Tracer, current, suspended, tracing

CACHE_LIMIT = 8
SIZE_VARIANTS = 64  # kept per kind of variant in a dynamic function (Note [Dynamic sizes])
FAMILIES_KEPT = 4  # symbolic variants kept per kind, the most recent (Note [Symbolic sizes])
SEGMENTS_KEPT = 256  # compiled segments of programs with graph breaks, the most recent
RECOMPILES_KEPT = 256  # entries of ``recompiles``, the most recent


class RecompileWarning(UserWarning):
    """A compiled function met more input variants than its cache holds and runs
    eagerly from then on."""


# ---------------------------------------------------------------- tracing


def _flatten(obj: Any, found: list) -> None:
    if isinstance(obj, Tensor):
        found.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _flatten(x, found)
    elif isinstance(obj, dict):
        for x in obj.values():
            _flatten(x, found)


def _replace(obj: Any, twins: Any) -> Any:
    """``obj`` with its tensors replaced by the next items of ``twins``, in the order
    ``_flatten`` finds them."""
    if isinstance(obj, Tensor):
        return next(twins)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_replace(x, twins) for x in obj)
    if isinstance(obj, dict):
        return {k: _replace(v, twins) for k, v in obj.items()}
    return obj


def _output_of(tracer: Tracer, out: Any) -> Any:
    """The traced function's result with its meta tensors as their Values; a result
    that is not made of tensors, numbers, strings, None, tuples, lists and dicts is
    refused (a compiled function could not return it again)."""
    if isinstance(out, Tensor):
        value = tracer.value_of(tracer.meta_of(out))  # a tensor read from elsewhere: a constant
        if value.requires_grad and not out.requires_grad:  # returned detached
            return tracer.detached(out, value)
        return value
    if isinstance(out, (tuple, list)):
        return _rebuilt(out, [_output_of(tracer, x) for x in out])
    if isinstance(out, dict):
        return {k: _output_of(tracer, v) for k, v in out.items()}
    if out is None or type(out) in (bool, int, float, complex, str):
        return out
    raise TypeError(
        f"lamina.jit: the function returns a {type(out).__name__}; a compiled function "
        "returns tensors, numbers, strings, None and tuples, lists or dicts of them"
    )


def _rebuilt(like: Any, items: list) -> Any:
    """``items`` in a sequence of ``like``'s type (a named tuple's fields by position)."""
    return type(like)(*items) if hasattr(like, "_fields") else type(like)(items)


class SideEffectError(RuntimeError):
    """A traced function changed Python state a compiled call would not change again."""


def _globals_of(fn: Callable) -> dict:
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__globals__", {})


@contextmanager
def _no_global_writes(fn: Callable) -> Iterator[None]:
    """Note [Side effects]: a compiled function's Python runs once per variant, when it
    is traced; later calls run the graph. Assigning a global while running would then
    happen once instead of at every call: a silently different program, so it is an
    error naming the global. (Changes to objects, such as appending to a list, cannot be
    seen this way: the guide says so.)"""
    namespace = _globals_of(fn)
    before, tensors = dict(namespace), _module_tensors(fn)
    yield
    name = getattr(fn, "__qualname__", repr(fn))
    changed = sorted(
        k for k, v in namespace.items() if not k.startswith("__") and before.get(k, k) is not v
    )
    if changed:
        raise SideEffectError(
            f"lamina.jit: {name} assigns the global {changed[0]!r} while it runs; a "
            "compiled function runs its Python once, when it is traced, so later calls "
            "would not assign it: move the assignment out of the function, or call it "
            "eagerly"
        )
    now = _module_tensors(fn)
    replaced = [k for k, v in tensors.items() if now.get(k) is not v]
    modules = dict(fn.__self__.named_modules()) if replaced else {}
    for prefix, table, attr in replaced:  # the module keeps its real tensors
        getattr(modules[prefix], table)[attr] = tensors[prefix, table, attr]
    if replaced:
        prefix, _, attr = replaced[0]
        raise SideEffectError(
            f"lamina.jit: {name} assigns the module's tensor {prefix + '.' if prefix else ''}"
            f"{attr} while it runs; later compiled calls would not: update it in place "
            "(``t.add_(1)``, ``t.copy_(new)``), as the compiled graph then does at every call"
        )


def _module_tensors(fn: Callable) -> dict:
    """(module path, table, name) -> tensor: the parameters and buffers of the Module
    whose method ``fn`` is (none for other functions)."""
    module = getattr(fn, "__self__", None)
    if not hasattr(module, "named_modules"):
        return {}
    return {
        (prefix, table, attr): value
        for prefix, m in module.named_modules()
        for table in ("_parameters", "_buffers")
        for attr, value in getattr(m, table).items()
    }


def _start(
    fn: Callable, args: tuple, kwargs: dict, on_break: Any = None, sizes: list | None = None
) -> tuple:
    """A tracer with the tensors of ``args`` and ``kwargs`` as inputs, and the
    arguments with meta twins in their place; ``sizes``: a probe's shape for each
    tensor, or None to keep its own (Note [Symbolic sizes])."""
    if current() is not None:
        raise RuntimeError("lamina.jit: a trace is already running in this thread")
    graph = Graph()
    tracer = Tracer(graph, on_break)
    tensors: list = []
    _flatten((args, kwargs), tensors)
    # one input per argument position, the same tensor passed twice included: a later
    # call may pass two tensors there (the guards do not compare identities)
    names = [f"x{i}" if len(tensors) > 1 else "x" for i in range(len(tensors))]
    shapes = sizes or [None] * len(tensors)
    twins = iter(
        [tracer.add_input(t, INPUT, n, shape=s) for t, n, s in zip(tensors, names, shapes)]
    )
    args, kwargs = _replace((args, kwargs), twins)
    return tracer, tensors, args, kwargs


def trace(fn: Callable, *example_inputs: Any, **example_kwargs: Any) -> Graph:
    """The graph of ``fn(*example_inputs)``: every operator call it makes, with the
    dtype, shape and strides of each result, traced on meta tensors (nothing is
    computed). A read of values raises GraphBreak naming the user's line."""
    tracer, _, args, kwargs = _start(fn, example_inputs, example_kwargs)
    with _no_global_writes(fn), tracing(tracer):
        out = fn(*args, **kwargs)
    tracer.graph.outputs = _output_of(tracer, out)
    return tracer.graph


# ---------------------------------------------------------------- guards


def _guard_key(args: tuple, kwargs: dict, module: tuple | None) -> tuple | None:
    """Note [Guards]; None when an argument cannot be guarded (a tensor off the CPU or
    sparse, an unhashable value): such a call runs eagerly. ``module``:
    ``_module_guard``'s."""
    parts: list = [entries.generation, is_grad_enabled()]
    for a in (*args, *kwargs.items()) if kwargs else args:
        if isinstance(a, Tensor):
            keyed = core.guard_key((), (a,))
            if keyed is None or not a._ks & keys.CPU:
                return None
            parts.append(keyed[0])
        elif isinstance(a, (tuple, list)):
            inner = _guard_key(tuple(a), {}, None)
            if inner is None:
                return None
            parts.append((type(a), inner[2:]))
        else:
            try:
                hash(a)
            except TypeError:
                return None
            parts.append((type(a), a))
    if module is not None:
        parts += module
    return tuple(parts)


def _module_guard(module: Any) -> tuple:
    """What a compiled module's variants depend on besides the arguments: every
    submodule's mode, the identity of every parameter and buffer and whether each
    parameter requires grad (Note [Guards])."""
    parameters = list(module.parameters())
    return (
        ("modes", tuple(m.training for m in module.modules())),
        ("parameters", tuple(map(id, parameters))),
        ("grads", tuple(p.requires_grad for p in parameters)),
        ("buffers", tuple(map(id, module.buffers()))),
    )


_MODULE_CHANGES = {  # _module_guard's parts, in _what_changed's words
    "modes": "the module's training flag (or a submodule's)",
    "parameters": "the module's parameters (one added, removed or replaced)",
    "grads": "a parameter's requires_grad",
    "buffers": "the module's buffers (one added, removed or replaced)",
}


def _differences(old: tuple, new: tuple) -> int:
    """How many fields two guard keys differ in (a tensor's shape, dtype, keys and
    strides counted apart)."""
    if len(old) != len(new):
        return 4 * len(new)
    count = 0
    for a, b in zip(old, new):
        if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 4:
            count += sum(x != y for x, y in zip(a, b))
        else:
            count += a != b
    return count


def _what_changed(old: tuple, new: tuple, names: list[str]) -> str:
    """The first difference between two guard keys, in words."""
    if old[0] != new[0]:
        return "the dispatch tables were rebuilt (a plugin or a layer switch)"
    if old[1] != new[1]:
        return "grad mode"
    for i, (a, b) in enumerate(zip(old[2:], new[2:])):
        if a == b:
            continue
        if isinstance(a, tuple) and len(a) == 2 and a[0] in _MODULE_CHANGES:
            return _MODULE_CHANGES[a[0]]
        name = names[i] if i < len(names) else f"argument {i}"
        if isinstance(a, tuple) and len(a) == 4 and isinstance(b, tuple) and len(b) == 4:
            (sa, da, _, ta), (sb, db, kb, tb) = a, b
            if sa != sb:
                if len(sa) != len(sb):
                    return f"{name}: {len(sa)} dimensions instead of {len(sb)}"
                d = next(k for k in range(len(sa)) if sa[k] != sb[k])
                return f"{name}: size {sb[d]} instead of {sa[d]} in dimension {d}"
            if da != db:
                return f"{name}: dtype {db.name} instead of {da.name}"
            if ta != tb:
                return f"{name}: another memory layout (strides)"
            grad = bool(kb & keys.AUTOGRAD)
            return f"{name}: requires_grad={grad} instead of {not grad}"
        return f"{name}: {b!r} instead of {a!r}"
    return "the number of arguments"


# ---------------------------------------------------------------- compiling


@dataclass
class Break:
    reason: str
    line: str


@dataclass
class Variant:
    """One compiled variant: a whole graph's plan, or segments (Note [Graph breaks])."""

    plan: Plan | training.Training | None = None
    graph: Graph | None = None
    breaks: list[Break] = field(default_factory=list)
    shapes: list[tuple] | None = None  # its input tensors' shapes


def _graphs_of(plan: Plan | training.Training) -> list[Graph]:
    if isinstance(plan, Plan):
        return [plan.graph]
    return [plan.forward.graph, plan.backward.graph]


def _replanned(plan: Plan | training.Training) -> Plan | training.Training:
    """``plan`` made again from its graphs (after ``Generalizer`` wrote its sizes)."""
    if isinstance(plan, Plan):
        return Plan(plan.graph, plan.grad, plan.positional, plan.consume)
    plan.forward, plan.backward = _replanned(plan.forward), _replanned(plan.backward)
    return plan


def _plan(graph: Graph, names: Sequence[str], grad: bool, positional: list | None = None) -> Plan:
    graph = P.apply(graph, names)
    graph.lint()
    return Plan(graph, grad, positional)


class CompiledFunction:
    """``lm.jit.compile``'s result: calls ``fn`` through compiled variants (Note
    [Guards]), with the same signature."""

    def __init__(
        self,
        fn: Callable,
        *,
        module: Any = None,
        dynamic: bool | None = None,
        fullgraph: bool = False,
        passes: Sequence[str] = P.DEFAULT,
        cache_limit: int = CACHE_LIMIT,
        layout: str | None = "auto",
    ) -> None:
        P.check(passes)
        L.check(layout)
        self.fn, self.module, self.dynamic, self.fullgraph = fn, module, dynamic, fullgraph
        self.passes, self.cache_limit, self.layout = tuple(passes), cache_limit, layout
        self.layouts: dict[Any, str | None] = {}  # kind -> its images' layout, None: as given
        self.variants: dict[tuple, Variant] = {}
        # Note [Guard tokens]: the hot path looks a call up by its guard token (the
        # per-call core's ``guard_token``: the guard key's facts as bytes, cheap to hash
        # and compare), filled by the general path when a call of tensors finds a variant
        # with a plan; a variant with none (a tensor off the CPU, graph breaks) always
        # takes the general path. With the C core, ``lm.jit.compile`` returns a
        # ``CompiledCall`` that does the hot path of a function (not a Module) in C and
        # hands every other call to this object.
        self.runs: dict[Any, Callable] = {}
        self._module_numbers: dict[tuple, int] = {}  # a module guard -> its token number
        self.recompiles: list[str] = []  # what changed, for each variant after the first
        self.segments: dict[Any, Any] = {}  # printed segment graph -> (Plan, positional)
        self.families: dict[Any, list[Family]] = {}  # kind -> its symbolic variants
        self._tokens: dict[tuple, Any] = {}  # guard key -> its token in ``runs``
        self._keys_of: dict[Any, dict] = {}  # kind -> its keys in ``variants``, oldest first
        self._unsymbolic: set = set()  # (kind, layout) whose symbols do not explain the graph
        self._eager = False
        # (module generation, _module_guard, its number in _module_numbers)
        self._module_state: tuple = (None, None, None)
        functools.update_wrapper(self, fn)

    def _module_key(self) -> tuple:
        """``_module_guard`` of the module, read again only when a module changed
        (Note [Module generation] in lamina.nn.modules)."""
        stamp = (modules.generation, tensor_module.requires_grad_changes)
        if self._module_state[0] != stamp:  # Note [Grad flag changes] in dispatch/tensor.py
            guard = _module_guard(self.module)
            number = self._module_numbers.setdefault(guard, len(self._module_numbers))
            self._module_state = (stamp, guard, number)
        return self._module_state[1]

    def _token_prefix(self) -> tuple:
        """What the guard token adds to the tensors' facts: the generation, grad mode
        and, for a module, its guard's number (``_module_numbers``)."""
        if self.module is None:
            return (entries.generation, _grad.enabled)
        self._module_key()
        return (entries.generation, _grad.enabled, self._module_state[2])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs:  # the hot path: the guard's facts as one token, one lookup
            run = self.runs.get(core.guard_token(self._token_prefix(), args))
            if run is not None:
                return run(args)
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        module = None if self.module is None else self._module_key()
        key = None if kwargs else core.guard_key((entries.generation, _grad.enabled), args)
        if key is not None and module:
            key += module
        if key is None or any(not isinstance(a, Tensor) for a in args):
            key = _guard_key(args, kwargs, module)
        variant = self.variants.get(key)
        if variant is not None and variant.plan is not None:
            if not kwargs:  # the next such call takes the hot path
                token = core.guard_token(self._token_prefix(), args)
                if token is not None:
                    loop_at = getattr(variant.plan, "loop_at", None)
                    self.runs[token] = variant.plan.run if loop_at is None else loop_at(args)
                    self._tokens[key] = token
            tensors: list = []
            _flatten((args, kwargs), tensors)
            return variant.plan.run(tensors)
        if key is None or self._eager:
            return self.fn(*args, **kwargs)
        if variant is None:
            variant = self._symbolic(key, args, kwargs) or self._compile(key, args, kwargs)
            if variant is None:
                return self.fn(*args, **kwargs)
            if variant.plan is not None:
                tensors = []
                _flatten((args, kwargs), tensors)
                return variant.plan.run(tensors)
        return self._run_segments(variant, args, kwargs)

    @property
    def graphs(self) -> list[Graph]:
        """The graphs of the variants compiled so far (optimized), each once."""
        found = {id(v.graph): v.graph for v in self.variants.values() if v.graph is not None}
        return list(found.values())

    def _names(self, args: tuple, kwargs: dict) -> list[str]:
        import inspect

        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
            return list(bound.arguments)
        except (TypeError, ValueError):
            return [f"argument {i}" for i in range(len(args) + len(kwargs))]

    def _compile(self, key: tuple, args: tuple, kwargs: dict) -> Variant | None:
        kind, same_kind = _kind(key), None
        if self.variants:
            # the nearest variant (the latest of equals) says what changed
            old = min(reversed(self.variants), key=lambda k: _differences(k, key))
            changed = _what_changed(old, key, self._names(args, kwargs))
            kinds = {_kind(k) for k in self.variants}
            if kind in kinds and self.dynamic is None:  # Note [Dynamic sizes]
                self.dynamic = True
            if kind in kinds and self.dynamic:
                same_kind = next(  # the latest traced at its sizes
                    (
                        v
                        for k, v in reversed(self.variants.items())
                        if _kind(k) == kind and v.shapes
                    ),
                    None,
                )
                self._forget_sizes_beyond(SIZE_VARIANTS - 1, kind)
            elif len(kinds if self.dynamic else self.variants) >= self.cache_limit:
                self._eager = True
                warnings.warn(
                    f"lamina.jit: {self.__name__} met {self.cache_limit} variants of its "
                    f"inputs (the cache limit); it runs eagerly from now on. The last "
                    f"change: {changed}",
                    RecompileWarning,
                    stacklevel=3,
                )
                return None
            self.recompiles.append(changed)
            del self.recompiles[:-RECOMPILES_KEPT]
        tensors: list = []
        _flatten((args, kwargs), tensors)
        variant = self._add(key, kind, self._built(kind, args, tensors, kwargs))
        variant.shapes = [tuple(t.shape) for t in tensors]
        if same_kind is not None and variant.plan is not None:
            self._generalize(kind, same_kind.shapes, tensors, args, kwargs, variant)
        return variant

    def _built(self, kind: Any, args: tuple, tensors: list, kwargs: dict) -> Variant:
        """The variant of these arguments, its images in the layout chosen for its kind
        (Note [Compiled layout]), which the first variant of the kind chooses."""
        if kind in self.layouts:
            return self._build(args, kwargs, layout=self.layouts[kind])
        chosen = None if self.layout == "auto" else self.layout
        variant = self._build(args, kwargs, layout=chosen)
        if self.layout == "auto" and L.worth_a_trial(variant.plan, args):
            with contextlib.suppress(Exception):  # Note [Failed trials]
                other = self._build(args, kwargs, layout=NHWC)
                whole = isinstance(other.plan, type(variant.plan))  # no graph break either
                if whole and L.faster(other.plan, variant.plan, tensors):
                    variant, chosen = other, NHWC
        self.layouts[kind] = chosen
        return variant

    def _build(
        self,
        args: tuple,
        kwargs: dict,
        sizes: list | None = None,
        passes: Any = None,
        layout: str | None = None,
    ) -> Variant:
        """The variant traced at the arguments (at ``sizes``: a probe's), optimized
        by ``passes`` (the function's by default), its images in ``layout`` (None: as
        given; Note [Compiled layout])."""
        start = _start if sizes is None else functools.partial(_start, sizes=sizes)
        passes = self.passes if passes is None else passes
        fn = (layout and L.in_layout(self.fn, args, layout)) or self.fn
        no_global_writes = lambda _: _no_global_writes(self.fn)  # the user's function's
        grad = is_grad_enabled()
        if grad:  # training, where something the function reads requires grad
            trained = training.build(fn, args, kwargs, start, passes, no_global_writes)
            if trained is not None:  # Note [Joint graph]
                return Variant(trained, trained.graph)
        tracer, _, targs, tkwargs = start(fn, args, kwargs)
        try:
            with no_global_writes(fn), tracing(tracer):
                out = fn(*targs, **tkwargs)
            tracer.graph.outputs = _output_of(tracer, out)
        except GraphBreak as e:
            if self.fullgraph:
                message = f"lamina.jit (fullgraph=True): a graph break: {e.reason}"
                raise GraphBreak(message, e.line) from None
            return Variant(breaks=[Break(e.reason, e.line)])
        graph = tracer.graph
        return Variant(_plan(graph, passes, grad), graph)

    def _generalize(
        self, kind: Any, before: list, tensors: list, args: tuple, kwargs: dict, variant: Variant
    ) -> None:
        """A symbolic variant of the kind, made from the call's ``variant`` and the
        shapes ``before`` of the kind's previous one (Note [Symbolic sizes])."""
        shapes = [tuple(t.shape) for t in tensors]
        found = symbolic_layout(shapes, before, [t.is_contiguous() for t in tensors])
        if found is None:
            return
        actual, layout = found
        key = layout_key(layout)
        if any(f.key == key for f in self.families.get(kind, ())):
            return  # a symbolic variant of these symbols exists: the call's sizes break it
        if (kind, key) in self._unsymbolic:
            return  # tried: these symbols do not explain the graph
        taken = {size for shape in shapes for size in shape}
        probes = probe_sizes(actual, taken)
        checks = check_sizes(actual, probes, taken)

        def shapes_at(values: list) -> list:  # None for inputs without symbols
            symbolic = [any(isinstance(d, Sym) for d in shape) for shape in layout]
            return [sizes_at(s, values) if y else None for s, y in zip(layout, symbolic)]

        names = self._names(args, kwargs)
        names = (
            names if len(names) == len(tensors) else [f"tensor {k}" for k in range(len(tensors))]
        )
        described = [
            f"{names[k]} dimension {d} is {size}"
            for k, shape in enumerate(layout)
            for d, size in enumerate(shape)
            if isinstance(size, Sym)
        ]
        tries = [(variant, self.passes)]
        if "fold" in self.passes:  # a creation call folded at one size is another constant
            tries.append((None, tuple(p for p in self.passes if p != "fold")))  # at the next
        for traced, passes in tries:
            try:
                images = self.layouts.get(kind)  # Note [Compiled layout]
                traced = traced or self._build(args, kwargs, passes=passes, layout=images)
                probe = self._build(args, kwargs, shapes_at(probes), passes, images)
                third = self._build(args, kwargs, shapes_at(checks), passes, images)
                if None in (traced.plan, probe.plan, third.plan):
                    raise ValueError("a trace breaks")
                generalizer = Generalizer(actual, probes)
                symbolic = _graphs_of(probe.plan)
                for a, b in zip(_graphs_of(traced.plan), symbolic, strict=True):
                    generalizer.graph(a, b)
                    b.symbols = len(probes)
                checker = Generalizer(checks, probes, check=True)
                for a, b in zip(_graphs_of(third.plan), symbolic, strict=True):
                    checker.graph(a, b)  # a size that agreed at two sizes only: refused
                plan = _replanned(probe.plan)
                break
            except Exception as e:  # no wrong graph: this kind keeps a variant per size
                reason = str(e)
        else:
            self._unsymbolic.add((kind, key))
            self.recompiles[-1] += f" (sizes stay specialized: {reason})"
            return
        symbolic_variant = Variant(plan, _graphs_of(plan)[0])
        family = Family(symbolic_variant, layout, generalizer.fused, described)
        families = self.families.setdefault(kind, [])
        families.insert(0, family)  # the most recent first
        del families[FAMILIES_KEPT:]
        self.recompiles[-1] += " (symbolic from now on: " + ", ".join(described) + ")"

    def _symbolic(self, key: tuple, args: tuple, kwargs: dict) -> Variant | None:
        """The kind's symbolic variant, where it holds for these arguments' sizes (Note
        [Symbolic sizes]); a call of a new size costs this, and no trace."""
        kind = _kind(key)
        families = self.families.get(kind)
        if not families:
            return None
        tensors: list = []
        _flatten((args, kwargs), tensors)
        shapes = [t.shape for t in tensors]
        family = next((f for f in families if f.values(shapes) is not None), None)
        if family is None:
            return None
        self._forget_sizes_beyond(SIZE_VARIANTS - 1, kind)
        return self._add(key, kind, family.variant)

    def _add(self, key: tuple, kind: Any, variant: Variant) -> Variant:
        self.variants[key] = variant
        self._keys_of.setdefault(kind, {})[key] = None
        return variant

    def _forget_sizes_beyond(self, keep: int, kind: Any) -> None:
        """Drop the oldest variants of ``kind`` until ``keep`` remain (Note [Dynamic
        sizes])."""
        same_kind = self._keys_of.get(kind, {})
        while len(same_kind) > keep:
            old = next(iter(same_kind))
            del same_kind[old], self.variants[old]
            self.runs.pop(self._tokens.pop(old, None), None)

    # ------------------------------------------------------------ segments

    def _run_segments(self, variant: Variant, args: tuple, kwargs: dict) -> Any:
        runner = _Segments(self)
        out = runner.run(args, kwargs)
        if not variant.breaks or len(runner.breaks) > len(variant.breaks):
            variant.breaks = runner.breaks
        return out


def _kind(key: Any) -> Any:
    """A guard key with every tensor's shape replaced by its rank: what the variants of
    one kind share (Note [Dynamic sizes])."""
    if not isinstance(key, tuple):
        return key
    if len(key) == 4 and isinstance(key[0], tuple) and isinstance(key[1], DType):
        return (len(key[0]), *key[1:])  # a tensor's (shape, dtype, key set, strides)
    return tuple(_kind(x) for x in key)


class _Segments:
    """One call of a program with graph breaks (Note [Graph breaks])."""

    def __init__(self, compiled: CompiledFunction) -> None:
        self.compiled = compiled
        self.env: dict[Value, Tensor] = {}
        self.start = 0
        self.breaks: list[Break] = []
        self.grad = is_grad_enabled()

    def run(self, args: tuple, kwargs: dict) -> Any:
        fn = self.compiled.fn
        tracer, tensors, targs, tkwargs = _start(fn, args, kwargs, self.on_break)
        self.tracer = tracer
        for value, t in zip(tracer.graph.inputs, tensors):
            self.env[value] = t
        with tracing(tracer):
            out = fn(*targs, **tkwargs)
        self.flush()
        return self._real(out)

    def _real(self, out: Any) -> Any:
        if isinstance(out, Tensor):
            value = self.tracer.values.get(id(out)) or self.tracer.alias_of(out)
            if value is None:
                return out
            real = self.env[value]
            return real.detach() if real.requires_grad and not out.requires_grad else real
        if isinstance(out, (tuple, list)):
            return _rebuilt(out, [self._real(x) for x in out])
        if isinstance(out, dict):
            return {k: self._real(v) for k, v in out.items()}
        return out

    def flush(self) -> None:
        """Run the calls recorded since the last break as one graph."""
        graph = self.tracer.graph
        nodes, self.start = graph.nodes[self.start :], len(graph.nodes)
        if not nodes:
            return
        for v in graph.inputs:  # constants met since: known now
            if v not in self.env and v.source is not None:
                self.env[v] = v.source
        produced = {r for n in nodes for r in n.results}
        alive = set(self.tracer.values.values())
        outputs = tuple(r for n in nodes for r in n.results if r in alive)
        external = list(dict.fromkeys(v for n in nodes for v in n.inputs() if v not in produced))
        segment = Graph()
        segment.inputs, segment.nodes, segment.outputs = external, nodes, outputs
        key = (_segment_key(segment), self.grad)  # a plan records autograd or does not
        found = self.compiled.segments.get(key)
        if found is None:
            found = _plan(segment, self.compiled.passes, self.grad, external)
            segments = self.compiled.segments
            segments[key] = found
            for old in list(segments)[: max(0, len(segments) - SEGMENTS_KEPT)]:
                del segments[old]  # the oldest: bounded memory (Note [Dynamic sizes])
        results = found.run([self.env[v] for v in external])
        self.env.update(zip(outputs, results))

    def on_break(
        self, reason: str, line: str, read: Value | None = None, call: Any = None, run: Any = None
    ) -> Any:
        self.breaks.append(Break(reason, line))
        self.flush()
        if read is not None:
            return self.env[read]
        if run is not None:  # Note [Eager calls in a trace] in tracer.py
            with suspended(self.tracer):
                return run(self._real)
        results = call_node(call, self.env, self.grad)  # boolean masks keep gradients
        if not results:
            return None
        outs = []
        for r in results:
            twin = self.tracer.add_input(r, CONSTANT)
            self.env[self.tracer.values[id(twin)]] = r
            outs.append(twin)
        return tuple(outs) if call.several else outs[0]


def _segment_key(segment: Graph) -> Any:
    """A segment's printed form (its types included) and the identities of the objects
    its plan would bind (generators, host arrays): equal keys, equal programs."""
    plain = (Value, tuple, list, type(None), bool, int, float, complex, str)
    bound = [id(a) for node in segment.nodes for a in node.args if not isinstance(a, plain)]
    types = tuple((v.dtype, v.shape, v.strides, v.requires_grad) for v in segment.inputs)
    return (str(segment), types, tuple(bound))


# ---------------------------------------------------------------- public API


def compile(
    fn_or_module: Any,
    *,
    dynamic: bool | None = None,
    fullgraph: bool = False,
    passes: Sequence[str] = P.DEFAULT,
    cache_limit: int = CACHE_LIMIT,
    layout: str | None = "auto",
) -> Any:
    """``fn_or_module`` compiled: a callable with the same signature that traces each
    new variant of its inputs into a graph (Note [Guards]), optimizes it with
    ``passes`` (default: ``lm.jit.DEFAULT_PASSES``, in that order; ``passes=()``
    for none) and runs it without per-operator dispatch.
    ``fullgraph=True`` makes a graph break an error (Note [Graph breaks]);
    ``dynamic=None`` makes it dynamic at its second distinct size, ``True`` from the
    start, ``False`` never: in a dynamic function the dimensions that changed become
    symbolic, one graph for every size, and variants that differ only in sizes do not
    count against ``cache_limit`` (Note [Dynamic sizes]). ``layout="auto"`` runs image
    programs in the memory layout found faster on their first call, ``"NHWC"`` or
    ``"NCHW"`` in that one, ``None`` in their inputs' (Note [Compiled layout])."""
    from lamina.nn import Module

    options = dict(
        dynamic=dynamic, fullgraph=fullgraph, passes=passes, cache_limit=cache_limit, layout=layout
    )
    if isinstance(fn_or_module, Module):
        module = fn_or_module
        compiled = CompiledFunction(module.forward, module=module, **options)
        return _CompiledModule(module, compiled)
    if not callable(fn_or_module):
        raise TypeError(
            f"lm.jit.compile needs a function or a Module, got {type(fn_or_module).__name__}"
        )
    compiled = CompiledFunction(fn_or_module, **options)
    # Note [Guard tokens]: the C core takes the hot path before any Python runs
    return core.CompiledCall(compiled, compiled.runs, (entries, "generation"), (_grad, "enabled"))


class _CompiledModule:
    """A Module whose calls run compiled; everything else is the module's
    (``_orig_mod``, as PyTorch names it)."""

    def __init__(self, module: Any, compiled: CompiledFunction) -> None:
        self.__dict__["_module"], self.__dict__["_compiled"] = module, compiled

    @property
    def _orig_mod(self) -> Any:
        return self._module

    @property
    def graphs(self) -> list[Graph]:
        """The compiled function's graphs, as a compiled function's."""
        return self._compiled.graphs

    @property
    def recompiles(self) -> list[str]:
        """What changed at each variant after the first, as a compiled function's."""
        return self._compiled.recompiles

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._module, name, value)

    def __repr__(self) -> str:
        return f"compiled {self._module!r}"


@dataclass
class Explanation:
    """What ``explain`` found: graphs, breaks, recompiles and symbolic sizes."""

    graphs: list[Graph]
    breaks: list[Break]
    recompiles: list[str]
    symbolic: list[str] = field(default_factory=list)  # "x dimension 0 is s0"

    def __str__(self) -> str:
        lines = [
            f"{len(self.graphs)} graph(s), {len(self.breaks)} graph break(s), "
            f"{len(self.recompiles)} recompile(s)"
        ]
        for i, g in enumerate(self.graphs):
            lines.append(f"graph {i}: {len(g.nodes)} node(s)")
        for b in self.breaks:
            lines.append(f"break: {b.reason}\n    at {b.line}")
        for r in self.recompiles:
            lines.append(f"recompile: {r}")
        for s in self.symbolic:
            lines.append(f"symbolic: {s}")
        return "\n".join(lines)


def explain(fn: Any, *example_inputs: Any, **example_kwargs: Any) -> Explanation:
    """Run ``fn`` (or a compiled function, a Module) once on the examples under the
    compiler and say what it made of it: the graphs, each graph break with its reason
    and the user's line, the recompiles a compiled function has had and which of its
    inputs' dimensions are symbolic (Note [Symbolic sizes])."""
    compiled = fn._compiled if isinstance(fn, _CompiledModule) else fn
    if not isinstance(compiled, CompiledFunction):
        compiled = compile(fn)
        compiled = compiled._compiled if isinstance(compiled, _CompiledModule) else compiled
    compiled(*example_inputs, **example_kwargs)
    breaks = [b for v in compiled.variants.values() for b in v.breaks]
    graphs = compiled.graphs + [p.graph for p in compiled.segments.values()]
    symbolic = [s for kind in compiled.families.values() for f in kind for s in f.described]
    return Explanation(graphs, breaks, list(compiled.recompiles), list(dict.fromkeys(symbolic)))
