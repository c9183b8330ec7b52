"""Capture through the dispatcher: a TRACE key above AUTOGRAD, applied by a mode, that
records every operator call of a program into a Graph while the meta device computes
what each call returns.

Note [Tracing]: while a trace is on in a thread, ``modes.include(TRACE)`` puts TRACE in
the key set of every call the thread makes (Note [Modes]): calls without tensor
arguments too, so creation and random operators are seen. TRACE has a kernel for every
operator (``_tracing_kernel``): it swaps each tensor argument for its meta twin (the
program's inputs were given meta twins when the trace began; a tensor met for the first
time -- a parameter, a tensor the function read from a global or a closure -- becomes
an input of the graph, read at each call), turns a device argument "cpu" into "meta",
and continues below TRACE, where the meta device runs the operator's description
(Note [Result rules]) without computing anything. The results are meta tensors too;
the node records which Values they are. So the program runs once, in microseconds per
call, whatever its sizes, and the graph's types are the descriptions'.

A tensor the program reads a value of (``float(t)``, ``bool(t)``, ``t.tolist()``,
printing it), or an operator whose result shape depends on values (``nonzero``), cannot
be traced on meta: the trace calls ``on_break`` with the reason and the user's line
(Note [Graph breaks] in compiler.py). So does a read of a real tensor's values, a
module's buffer (``float(self.num_batches_tracked)``): read while tracing, its value
would be a constant of the graph, stale at the next call, or stale already where the
program wrote the tensor before (the write only recorded); at the break the calls
recorded so far run, and the read gets the tensor's values of that moment.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from lamina.autograd import engine
from lamina.autograd.grad_mode import enable_grad, no_grad
from lamina.backends import meta as meta_device
from lamina.backends.fallback import new_tensor
from lamina.backends.hookspecs import hookimpl
from lamina.dispatch import devices, keys, layouts, modes
from lamina.dispatch import tensor as tensor_layer
from lamina.dispatch.layouts import MetaStorage
from lamina.dispatch.schema import OPERATORS, Operator
from lamina.dispatch.tensor import Tensor

from .graph import CONSTANT, PARAMETER, Graph, Node, Value, map_values

_local = threading.local()  # .tracer: the Tracer of this thread's trace, or None
_key = 0  # the TRACE key, once the layer is registered
# the directories of lamina's packages: frames there are not the user's
_lamina_dirs = tuple(
    os.path.dirname(os.path.abspath(sys.modules[name].__file__)) + os.sep
    for name in ("lamina", "lamina.dispatch", "lamina.backends", "lamina.autograd")
)


# the file names of code lamina generates (bindings, argument checks, plans)
_GENERATED = ("<binding of ", "<checked ", "<lamina.jit plan")


class GraphBreak(Exception):
    """A value a trace cannot give: the program read a tensor's values, or called an
    operator whose result shape depends on them."""

    def __init__(self, reason: str, line: str) -> None:
        super().__init__(f"{reason}, at {line}" if line else reason)
        self.reason, self.line = reason, line


def trace_key() -> int:
    """The TRACE key (Note [Tracing])."""
    return keys.LAYER_KEYS["trace"]


@hookimpl
def lamina_register_kernels(registry: Any) -> None:
    """The tracer, registered as one of lamina's layers (``import lamina``): a kernel
    for every operator at the TRACE key, and the meta device's hook for reads."""
    global _key
    _key = keys.register_layer_key("trace")
    for op in OPERATORS.values():
        registry.register(op.name, "trace", _tracing_kernel(op))
    meta_device.on_read = _on_read
    engine.on_traced_backward = _on_backward


def user_line() -> str:
    """``file:line: source`` of the innermost frame outside lamina: the user's call."""
    frame = sys._getframe(1)
    while frame is not None:
        path = _users_path(frame.f_code.co_filename)
        if path is not None:
            import linecache

            source = linecache.getline(path, frame.f_lineno).strip()
            return f"{os.path.basename(path)}:{frame.f_lineno}: {source}"
        frame = frame.f_back
    return ""


@functools.lru_cache(maxsize=1024)
def _users_path(name: str) -> str | None:
    """The absolute path of a code file outside lamina, None for lamina's own (every
    traced call asks, for each frame between it and the user's: once per file)."""
    path = os.path.abspath(name)
    return None if path.startswith(_lamina_dirs) or name.startswith(_GENERATED) else path


class Tracer:
    """The state of one trace: the graph, and the Value of each meta tensor made."""

    def __init__(self, graph: Graph, on_break: Callable[[str, str], Any] | None = None) -> None:
        self.graph = graph
        self.on_break = on_break
        self.values: dict[int, Value] = {}  # id(meta tensor) -> its Value
        self.metas: dict[int, Tensor] = {}  # id(real tensor) -> its meta twin
        self.keep: list[Any] = []  # tensors whose ids are keys above stay alive
        self.storages: dict[int, Value] = {}  # id(a meta twin's storage) -> its Value
        self.reading = False  # a read of a real tensor's values is being handled

    def add_input(
        self,
        t: Tensor,
        kind: str,
        name: str | None = None,
        source: Any = None,
        shape: tuple | None = None,
    ) -> Tensor:
        """A meta twin of real tensor ``t``, bound to a new input Value; with ``shape``,
        a contiguous twin of that shape instead (a probe: Note [Symbolic sizes])."""
        twin = _meta_twin(t) if shape is None else _probe_twin(t, shape)
        value = self.graph.new_value(t if shape is None else twin, kind, name)
        value.source = source
        self._bind(twin, value)
        self.metas[id(t)] = twin
        self.keep.append(t)
        return twin

    def _bind(self, twin: Tensor, value: Value) -> None:
        self.values[id(twin)] = value
        self.storages[id(twin._data)] = value
        self.keep.append(twin)

    def alias_of(self, t: Tensor) -> Value | None:
        """The Value whose tensor ``t`` is a detached alias of (its storage and shape),
        or None."""
        alias = self.storages.get(id(t._data))
        return alias if alias is not None and alias.shape == t._shape else None

    def meta_of(self, a: Any) -> Any:
        """An argument as the meta device gets it: tensors as meta twins (a real tensor
        met for the first time becomes a constant input), sequences element by element."""
        if isinstance(a, Tensor):
            if id(a) in self.values:
                return a
            alias = self.alias_of(a)
            if alias is not None:  # a detached alias (a node's
                self._bind(a, alias)  # saved result): the same Value
                return a
            twin = self.metas.get(id(a))
            if twin is None:
                if a.requires_grad and a.grad_fn is None and a.device.name == "cpu":
                    twin = self.add_input(a, PARAMETER, source=a)
                else:
                    twin = self.add_input(a, CONSTANT, source=a)
            return twin
        if isinstance(a, (tuple, list)):
            return type(a)(self.meta_of(x) for x in a)
        return a

    def value_of(self, a: Any) -> Any:
        if isinstance(a, Tensor):
            return self.values[id(a)]
        if isinstance(a, (tuple, list)):
            return type(a)(self.value_of(x) for x in a)
        return a

    def detached(self, twin: Tensor, value: Value) -> Value:
        """A Value for ``twin``, a detached alias of ``value``'s tensor that the
        program returns: made by a DETACH node."""
        node = Node(DETACH, (value,), line=user_line())
        result = self.graph.new_value(twin)
        result.node = node
        node.results.append(result)
        self.graph.nodes.append(node)
        return result

    def record(self, op: Operator, args: tuple, result: Any, line: str) -> None:
        node = Node(op, self.value_of(args), line=line)
        several = isinstance(result, tuple)
        node.several = several
        if "inplace" in op.tags:  # returns its first argument: no new Value
            self.graph.nodes.append(node)
            return
        for r in result if several else (result,):
            value = self.graph.new_value(r)
            value.node = node
            node.results.append(value)
            self._bind(r, value)
        self.graph.nodes.append(node)


class _Detach:
    """The kernel of a result the program returns detached: ``t.detach()`` at each call.
    Inside a program a detached tensor is an alias of its tensor, the same Value
    (``meta_of``); returned, the alias would be the tensor itself, autograd history
    and all."""

    name = "detach"

    def __call__(self, t: Tensor) -> Tensor:
        return t.detach()


DETACH = _Detach()


def current() -> Tracer | None:
    return getattr(_local, "tracer", None)


class tracing:
    """Context: trace this thread's calls into ``tracer``'s graph."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def __enter__(self) -> Tracer:
        key = trace_key()
        if current() is not None:
            raise RuntimeError("lamina.jit: a trace is already running in this thread")
        _local.tracer = self.tracer
        with _traces_lock:  # reads of real tensors' values hooked only while traces run
            _traces.add(self.tracer)
            tensor_layer.upper.reads = _on_real_read
        self._mode = modes.include(key)
        self._mode.__enter__()
        return self.tracer

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        _local.tracer = None
        with _traces_lock:
            _traces.discard(self.tracer)
            if not _traces:  # eager reads cost no call (float(t): 0.35 -> 0.97 us)
                tensor_layer.upper.reads = None


_traces: set[Tracer] = set()  # the traces running, in any thread
_traces_lock = threading.Lock()


def record_calls(
    graph: Graph, fn: Callable[..., Any], *args: Any, grad: bool = False
) -> tuple[list[Node], Any]:
    """The nodes of ``fn``'s calls on ``args`` (Values of ``graph`` in place of their
    tensors), traced as a program's are, and the Values ``fn`` returned; the nodes are
    not added to ``graph``. A pass writes new calls this way: through the operators'
    own argument checks and descriptions, never by assembling nodes by hand. With
    ``grad`` (the calls replace one whose result required grad), they are traced in
    grad mode, so that their results require grad where it flows, and the plan records
    autograd through them as it did through the calls they replace (Note [Executor]);
    traced without, a conv2d + relu rewritten into conv2d_relu in a program that records
    autograd lost its weights' gradients."""
    scratch = Graph()
    scratch._count = graph._count  # new Values are named on from the graph's
    tracer = Tracer(scratch)

    def twin(value: Value) -> Tensor:
        meta = new_tensor(MetaStorage(value.strides), "meta", value.dtype, value.shape)
        if grad and value.requires_grad:
            meta.requires_grad_()
        tracer._bind(meta, value)
        return meta

    with enable_grad() if grad else no_grad(), tracing(tracer):
        out = fn(*map_values(args, twin))
    graph._count = scratch._count
    graph.inputs += scratch.inputs  # tensors fn read from elsewhere
    return scratch.nodes, tracer.value_of(out)


def _meta_twin(t: Tensor) -> Tensor:
    if t.device.name != "cpu":
        raise NotImplementedError(
            f"lamina.jit traces CPU tensors only, got one on {t.device.name!r}"
        )
    twin = devices.move(t.detach(), "meta")  # not a call: nothing the trace records
    if t.requires_grad:
        twin.requires_grad_()
    return twin


def _probe_twin(t: Tensor, shape: tuple) -> Tensor:
    twin = new_tensor(MetaStorage(layouts.contiguous(shape)), "meta", t.dtype, shape)
    if t.requires_grad:
        twin.requires_grad_()
    return twin


def _tracing_kernel(op: Operator) -> Callable:
    def kernel(ks: int, *args: Any) -> Any:
        tracer = current()
        below = ks & ~_key
        if tracer is None:  # a mode from another trace's thread: pass through
            return op.table[below.bit_length()](below, *args)
        line = user_line()
        meta_args = recorded = tracer.meta_of(args)
        if op.name == "to_device":  # creation operators have their device in ks
            if meta_args[1] != "cpu":
                node = Node(op, tracer.value_of(recorded))
                return _break(tracer, f"to_device to {meta_args[1]!r}", line, call=node)
            meta_args = (meta_args[0], "meta", *meta_args[2:])
        if below & keys.BACKEND_MASK & ~(keys.CPU | _meta_key()):
            return _break(tracer, f"{op.name} on a device other than the CPU", line)
        below = ((below & ~keys.BACKEND_MASK) | _meta_key()) & op.mask
        try:
            result = op.table[below.bit_length()](below, *meta_args)
        except NotImplementedError as e:  # a shape that depends on values
            node = Node(op, tracer.value_of(recorded), several=op.returns != "Tensor")
            return _break(tracer, str(e), line, call=node)
        tracer.record(op, recorded, result, line)
        return result

    kernel.__qualname__ = kernel.__name__ = f"trace_{op.name}"
    return kernel


@functools.cache
def _meta_key() -> int:
    return keys.device_key("meta")


def _flat(args: Any) -> Any:
    for a in args:
        if isinstance(a, (tuple, list)):
            yield from _flat(a)
        else:
            yield a


def _break(tracer: Tracer, reason: str, line: str, **need: Any) -> Any:
    """A graph break: GraphBreak, or what the tracer's ``on_break`` gives for ``need``
    (``read=`` a Value whose values are read, ``call=`` a Node to run eagerly, ``run=``
    a function to call eagerly: Note [Eager calls in a trace])."""
    if tracer.on_break is None:
        raise GraphBreak(reason, line)
    return tracer.on_break(reason, line, **need)


# Note [Eager calls in a trace]: a call that changes state outside the tensors it is
# given -- ``backward()``, adding into the leaves' ``.grad``, and an optimizer's
# ``step()``, which keeps new tensors in its state -- cannot be replayed from a graph
# (the tensors a trace made are meta twins, and each call's state must be the last
# call's). In a trace it is a graph break (Note [Graph breaks] in compiler.py) whose
# ``run`` makes the call eagerly, with the trace suspended, on the real tensors that
# ``real`` gives for the trace's twins; the calls recorded before it have run by then.
# So a training step compiled whole -- forward, loss, ``backward()``, ``step()`` --
# runs as torch.compile runs one: the forward and loss as a graph, backward and the
# update eagerly. (Compiling the model alone compiles its backward too: Note [Joint
# graph] in training.py.)


def eagerly(reason: str, run: Callable[[Callable[[Any], Any]], Any]) -> Any:
    """What ``run(real)`` returns, called at a graph break of this thread's trace (Note
    [Eager calls in a trace]), ``real`` giving the real tensor of a twin (any other
    argument as it is)."""
    return _break(current(), reason, user_line(), run=run)


class suspended:
    """Context: the trace of this thread (``tracer``) off, its calls made for real."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def __enter__(self) -> None:
        _local.tracer = None
        self._mode = modes.exclude(trace_key())
        self._mode.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        _local.tracer = self.tracer


def _on_backward(tensors: list, gradients: Any, retain_graph: bool, create_graph: bool) -> bool:
    """The autograd engine's hook: a traced tensor's backward() runs eagerly (Note
    [Eager calls in a trace]); False for real tensors, which it leaves to the engine."""
    tracer = current()
    if tracer is None or not any(id(t) in tracer.values for t in tensors):
        return False

    def run(real: Callable[[Any], Any]) -> None:
        several = gradients is not None and not isinstance(gradients, Tensor)
        given = [real(g) for g in gradients] if several else real(gradients)
        engine.backward([real(t) for t in tensors], given, retain_graph, create_graph)

    names = ", ".join(tracer.values[id(t)].name for t in tensors if id(t) in tracer.values)
    reason = f"backward() of {names} runs eagerly: it adds into the leaves' .grad"
    _break(tracer, reason, user_line(), run=run)
    return True


def _on_real_read(t: Tensor) -> None:
    """A read of a real tensor's values inside a trace: a graph break (Note [Tracing]),
    after which the read goes on, on the tensor as the calls before it left it."""
    tracer = current()
    if tracer is None or tracer.reading:  # none, or reads that the break itself makes
        return
    twin = tracer.metas.get(id(t))
    name = tracer.values[id(twin)].name if twin is not None else f"a {t.dtype.name}{list(t.shape)}"
    tracer.reading = True
    try:
        _break(tracer, f"reading the values of {name}", user_line(), run=lambda real: None)
    finally:
        tracer.reading = False


def _on_read(t: Tensor) -> Any:
    """The meta device's hook for a read of values: a graph break inside a trace."""
    tracer = current()
    if tracer is None or id(t) not in tracer.values:
        return None  # not ours: the meta device refuses as usual
    value = tracer.values[id(t)]
    made = f" (a result of {value.node.name})" if value.node is not None else ""
    return _break(tracer, f"reading the values of {value.name}{made}", user_line(), read=value)
