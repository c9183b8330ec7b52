"""The backward engine: an iterative topological traversal (no recursion, so a
100,000-node chain works) that runs each node's formula once all the gradients flowing
into it have arrived."""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from lamina.dispatch import keys, ops
from lamina.dispatch.arguments import checked
from lamina.dispatch.composites import construct
from lamina.dispatch.dtypes import DType
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import Tensor, sole_storage, version_of, versions

from . import grad_mode, graph
from .derivatives import _sum_to
from .graph import AccumulateGrad, AnyNode, Edge, GradHook, Node, edge

# A formula's gradient for one input: False where it skipped the work (``n[i] and
# expr``), None where there is none
InputGrad = Tensor | Literal[False] | None
Buffers = dict[AnyNode, list[Tensor | None]]  # the gradients that reached each node so far


def _dependencies(roots: Iterable[AnyNode]) -> dict[AnyNode, int]:
    """How many edges point into each node reachable from ``roots``."""
    deps = {}
    seen = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for n in node.next_nodes:
            if n is not None:
                deps[n] = deps.get(n, 0) + 1
                stack.append(n)
    return deps


def _check_versions(node: Node) -> None:
    if not versions:
        return  # nothing was ever modified in place: every version is still 0
    expected = node.versions
    for i, t in enumerate(graph.saved_tensors(node)):
        now, then = version_of(t), expected[i] if expected else 0
        if now != then:
            raise RuntimeError(
                f"one of the tensors needed to compute the gradient of {node.name} has "
                f"been modified by an in-place operation: a tensor of shape {t.shape} is "
                f"at version {now}; expected version {then}. Clone it before modifying "
                "it, or modify it after backward."
            )


def _conform(g: Tensor, shape: tuple[int, ...] | None, dtype: DType | None) -> Tensor:
    """A formula's gradient reduced to the input's shape and cast to its dtype; a real
    input keeps the real part of a complex gradient (Note [Complex gradients])."""
    if shape is not None and g.shape != shape:
        g = _sum_to(g, shape)
    if dtype is not None and g.dtype is not dtype:
        if g.dtype.kind == "c" and dtype.kind != "c":
            g = ops.real(g)
        g = g if g.dtype is dtype else ops.astype(g, dtype)
    return g


def _accumulate(buffers: Buffers, key: AnyNode, n_outputs: int, nr: int, g: Tensor) -> None:
    buf = buffers.get(key)
    if buf is None:
        buf = buffers[key] = [None] * n_outputs
    buf[nr] = g if buf[nr] is None else buf[nr] + g


def _run_hooks(node: AnyNode, grads: list[Tensor | None]) -> None:
    for nr, hook in list(node.hooks.values()):
        g = grads[nr]
        if g is not None:
            new = hook(g)
            if new is not None:
                grads[nr] = _hook_result(hook, g, new)


def _hook_result(hook: GradHook, g: Tensor, new: object) -> Tensor:
    """A gradient a hook returned: it must be a tensor like the one it got (PyTorch
    raises too), or the gradient of a leaf silently changes shape or device."""
    name = getattr(hook, "__qualname__", repr(hook))
    if not isinstance(new, Tensor):
        raise TypeError(
            f"hook {name} returned {type(new).__name__}, but a gradient hook must "
            "return a tensor (or None to keep the gradient)"
        )
    for what, got, want in (
        ("shape", new.shape, g.shape),
        ("dtype", new.dtype, g.dtype),
        ("device", new.device, g.device),
    ):
        if got != want:
            raise RuntimeError(
                f"hook {name} changed the {what} of the gradient from {want} to {got}; "
                "a gradient hook must return a tensor of the gradient's shape, dtype "
                "and device"
            )
    return new


def run(
    roots: Sequence[Edge],
    root_grads: Sequence[Tensor],
    retain_graph: bool,
    create_graph: bool,
    capture: dict[Edge, Tensor | None] | None = None,
) -> None:
    """Propagate ``root_grads`` from the ``roots`` edges backwards.

    Without ``capture`` the gradients of leaves accumulate into ``.grad``; with it (a
    dict edge -> None) they are collected there instead and leaves are left alone.
    Then the callbacks that hooks queued (``queue_callback``) run."""
    outer = getattr(_pass, "callbacks", None)
    _pass.callbacks = callbacks = _Callbacks()
    try:
        _propagate(roots, root_grads, retain_graph, create_graph, capture, callbacks.between)
        while callbacks:  # a callback may queue another
            callbacks.pop(0)()
    finally:
        _pass.callbacks = outer


class _Callbacks(list):
    """Those queued for the end of a backward pass; ``.between``, those called between
    its nodes."""

    __slots__ = ("between",)

    def __init__(self) -> None:
        self.between: list[Callable[[], object]] = []


_pass = threading.local()  # .callbacks: the _Callbacks of the backward pass running


def queue_callback(callback: Callable[[], object]) -> None:
    """Call ``callback()`` once the backward pass now running has finished, after every
    gradient is in place (PyTorch's ``Variable._execution_engine.queue_callback``); a
    hook calls it, so that work started during backward (data-parallel training's
    gradient exchange) is finished before backward returns."""
    callbacks = getattr(_pass, "callbacks", None)
    if callbacks is None:
        raise RuntimeError("queue_callback: no backward pass is running in this thread")
    callbacks.append(callback)


def call_between_nodes(callback: Callable[[], object]) -> None:
    """Call ``callback()`` before each node of the backward pass now running, from now
    until the pass ends (then it is dropped): a hook calls it for work that advances
    only while it is polled, as MPI's transfers (data-parallel training's gradient
    exchange, started during backward, moves on while backward computes)."""
    callbacks = getattr(_pass, "callbacks", None)
    if callbacks is None:
        raise RuntimeError("call_between_nodes: no backward pass is running in this thread")
    callbacks.between.append(callback)


def _propagate(
    roots: Sequence[Edge],
    root_grads: Sequence[Tensor],
    retain_graph: bool,
    create_graph: bool,
    capture: dict[Edge, Tensor | None] | None,
    between: list[Callable[[], object]],
) -> None:
    root_nodes = [e[0] for e in roots]
    deps = _dependencies(root_nodes)
    buffers = {}
    for (node, nr), g in zip(roots, root_grads):
        _accumulate(buffers, node, node.n_outputs, nr, g)
    ready = deque(n for n in dict.fromkeys(root_nodes) if deps.get(n, 0) == 0)
    with grad_mode.set_grad_enabled(create_graph):
        while ready:
            if between:  # empty but for a hook's call_between_nodes
                for callback in between:
                    callback()
            node = ready.popleft()
            grads = buffers.pop(node)
            if node.hooks:
                _run_hooks(node, grads)
            if capture is not None:
                for nr in range(node.n_outputs):
                    if (node, nr) in capture and grads[nr] is not None:
                        capture[node, nr] = grads[nr]
            if isinstance(node, AccumulateGrad):
                # nobody holds a leaf that is gone: no one can read its .grad
                if capture is None and node.variable is not None:
                    # pop: grads must not hold g (Note [Taking gradients over])
                    _accumulate_grad(node.variable, grads.pop(), create_graph)
                    if node.post_hooks:
                        for hook in list(node.post_hooks.values()):
                            hook(node.variable)
                continue
            _send(node, _apply(node, grads, retain_graph), deps, buffers, ready)


def _send(
    node: Node,
    input_grads: Sequence[InputGrad],
    deps: dict[AnyNode, int],
    buffers: Buffers,
    ready: deque[AnyNode],
) -> None:
    """Pass a node's input gradients on to the nodes that made its inputs. (A function
    of its own: no local of _propagate's may still hold a gradient, Note [Taking gradients
    over].)"""
    nrs = node.next_nrs or _ZEROS  # repeat(0): never cuts the zip short
    for nxt, nr, g in zip(node.next_nodes, nrs, input_grads):
        if nxt is None:
            continue
        if g is not None and g is not False:
            _accumulate(buffers, nxt, nxt.n_outputs, nr, g)
        deps[nxt] -= 1
        if deps[nxt] == 0:
            if nxt in buffers:
                ready.append(nxt)
            else:
                _skip(nxt, deps, buffers, ready)


_grad_lock = threading.Lock()


def _temporary_refs(obj: object) -> int:
    return sys.getrefcount(obj)


def _sole_refs() -> int:
    """What getrefcount says of an argument no one else holds, called as
    _accumulate_grad calls it (the count differs between Python versions); -1 (never
    sole: copies) where one more holder does not add one."""
    sole, held = _temporary_refs(object()), object()
    return sole if _temporary_refs(held) == sole + 1 else -1


_SOLE_REFS = _sole_refs()


# Note [Taking gradients over]: a leaf's first dense gradient becomes its .grad. It is
# copied when anything else could see it change (an in-place step, zero_grad(set_to_none=
# False) or a later accumulation would write into both): the caller's gradient=, the
# same tensor passed on to two leaves (add's backward), a view of either (reshape's),
# a tensor a hook kept, a read-only view (sum's broadcast gradient). Otherwise, a
# gradient a backward formula just made, it is taken over, as PyTorch does when the
# gradient's use count says no one else holds it: copying a 16 x 64 x 56 x 56 relu
# gradient took 0.85 ms of a 2.7 ms forward + backward. Nothing may hold the gradient
# here but the argument (the engine pops it from its buffer), and
# dispatch.tensor.sole_storage checks its storage. A gradient for create_graph is
# always copied: by the differentiable copy operator, so the copy stays in the graph.
# Copies keep the gradient's memory layout. (A sparse gradient is kept as it comes,
# as before: there is no sparse copy kernel.)


def _accumulate_grad(leaf: Tensor, g: Tensor, create_graph: bool) -> None:
    """``leaf.grad += g``, under a lock: backward passes in several threads may reach
    one leaf at once, and a read-modify-write of ``.grad`` would lose updates (as
    PyTorch, which accumulates under a lock)."""
    if leaf.is_sparse and not g.is_sparse:
        g = _on_pattern(g, leaf)  # a new tensor: nothing to copy
    with _grad_lock:
        if leaf.grad is not None:
            leaf.grad = leaf.grad + (g if create_graph else g.detach())
        elif g.is_sparse:
            leaf.grad = g if create_graph else g.detach()
        elif create_graph:
            leaf.grad = OPERATORS["copy"](g)
        elif sys.getrefcount(g) == _SOLE_REFS and sole_storage(g):
            leaf.grad = g.detach()
        else:
            leaf.grad = OPERATORS["copy"](g.detach())


def _on_pattern(g: Tensor, leaf: Tensor) -> Tensor:
    """A dense gradient of a sparse leaf, kept at the leaf's stored entries only: the
    gradient with respect to its values (sum(s), s @ dense), as a sparse tensor."""
    return OPERATORS["sparse_mask"](g, leaf)


def _skip(node: AnyNode, deps: dict[AnyNode, int], buffers: Buffers, ready: deque[AnyNode]) -> None:
    """A node that received no gradient at all: release its dependents too."""
    stack = [node]
    while stack:
        n = stack.pop()
        for nxt in n.next_nodes:
            if nxt is None:
                continue
            deps[nxt] -= 1
            if deps[nxt] == 0:
                (ready.append if nxt in buffers else stack.append)(nxt)


def _apply(node: Node, grads: list[Tensor | None], retain_graph: bool) -> Sequence[InputGrad]:
    if node.saved is _FREED:
        raise RuntimeError(
            f"trying to backward through {node.name} a second time, but its saved "
            "tensors were freed after the first backward; pass retain_graph=True to the "
            "first backward (or grad) if you need to go through the graph twice"
        )
    _check_versions(node)
    d = node.derivative
    g = grads if node.n_outputs > 1 else grads[0]
    if g is None:
        return [None] * len(node.next_nodes)
    result = None
    if node.result is not None:
        if node.n_outputs == 1:
            result = _result(node.result, node, 0)
        else:  # Note [Saved outputs]: state outputs past d.outputs stay detached
            marked = node.n_outputs if d.outputs is None else d.outputs
            pairs = enumerate(node.result)
            result = tuple([_result(p, node, i) if i < marked else p[1] for i, p in pairs])
    needs = [n is not None for n in node.next_nodes]
    if d.releases:  # Note [Releasing saved values]
        out = d.formula(g, result, needs, not retain_graph, *node.saved)
    else:
        out = d.formula(g, result, needs, *node.saved)
    if not retain_graph and graph.saved_tensors(node):  # nothing to free: reusable
        node.saved = _FREED
        if node.versions:  # the class defaults need no instance entries
            node.versions = ()
        if node.result is not None:
            node.result = None
    if node.shapes is None and node.dtypes is None:
        return out
    shapes = node.shapes or (None,) * len(out)
    dtypes = node.dtypes or (None,) * len(out)
    return [
        gi if gi is None or gi is False else _conform(gi, shape, dt)
        for gi, shape, dt in zip(out, shapes, dtypes)
    ]


def _result(pair: tuple[weakref.ref[Tensor], Tensor], node: Node, nr: int) -> Tensor:
    """Output ``nr`` of ``node`` for its formula: the detached alias, or under
    create_graph (the result must be differentiable) the output itself."""
    ref, alias = pair
    if not grad_mode.state.enabled:
        return alias
    out = ref()
    return out if out is not None else _as_output(alias, node, nr)


def _as_output(alias: Tensor, node: Node, nr: int) -> Tensor:
    """Output ``nr`` of ``node`` again, for a formula under create_graph once the output
    tensor itself is gone (as PyTorch unpacks a saved output): the alias's storage,
    with ``node`` as its grad_fn, so gradients through the result reach the node."""
    t = alias.detach()
    t._ks |= keys.AUTOGRAD
    t._grad_fn = node
    if nr:
        t._output_nr = nr
    return t


_FREED = ("freed",)
_ZEROS = itertools.repeat(0)


def _root_grads(
    fn: str, tensors: Sequence[Tensor], grads: Tensor | Sequence[Any] | None, what: str
) -> list[Tensor]:
    """The gradients to start from: one per output (None for a one-element output)."""
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(
                f"{fn}: the outputs must be tensors; output {i} is a {type(t).__name__}"
            )
    grads = [grads] if isinstance(grads, Tensor) else grads
    if grads is not None and len(grads) != len(tensors):
        raise ValueError(
            f"{fn}: got {len(tensors)} output{'s' if len(tensors) != 1 else ''} but "
            f"{len(grads)} gradient{'s' if len(grads) != 1 else ''} ({what}); give one "
            "per output (None for an output with one element)"
        )
    out = []
    for t, g in zip(tensors, grads or [None] * len(tensors)):
        if not t.requires_grad:
            raise RuntimeError(
                "element of the outputs does not require grad and has no "
                "grad_fn (did you call backward on a tensor computed under "
                "no_grad, or forget requires_grad=True?)"
            )
        if g is None:
            if t.size != 1 or t.dtype.kind == "c":
                raise RuntimeError(
                    f"grad can be implicitly created only for real outputs with "
                    f"one element; this one is {t.dtype} of shape {t.shape}: pass "
                    "gradient="
                )
            # the creation operator itself: ones_like's argument checks cost more than
            # the call, and a backward starts with this on every training step
            g = construct("full", t._shape, 1, t._dtype, device=t.device)
        elif not isinstance(g, Tensor):
            g = ops.asarray(g, dtype=t.dtype, device=t.device)
        if g.shape != t.shape:
            raise ValueError(f"gradient has shape {g.shape}, but the output has shape {t.shape}")
        if g.device != t.device:  # the formulas would put .grad on the gradient's device
            raise ValueError(
                f"{fn}: the gradient of an output on {t.device} is on {g.device}; move it "
                f"with .to({str(t.device)!r})"
            )
        if g.dtype is not t.dtype:  # as PyTorch: the gradient is taken in the output's dtype
            g = ops.astype(g, t.dtype)
        out.append(g)
    return out


# A hook a tracer sets (Note [Eager calls in a trace] in lamina.jit.tracer): called with
# backward's arguments; True where the tensors were a trace's, which ran the pass itself
on_traced_backward: Callable[..., bool] | None = None


@checked
def backward(
    tensors: Tensor | Sequence[Tensor],
    grad_tensors: Tensor | Sequence[Any] | None = None,
    retain_graph: bool = False,
    create_graph: bool = False,
) -> None:
    """Accumulate the gradients of ``tensors`` (a tensor or a sequence of them) into the
    ``.grad`` of the leaves they were computed from; ``grad_tensors`` gives one gradient
    per output (None for a one-element output)."""
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    if on_traced_backward is not None and on_traced_backward(
        tensors, grad_tensors, retain_graph, create_graph
    ):
        return
    grads = _root_grads("backward", tensors, grad_tensors, "grad_tensors")
    run([edge(t) for t in tensors], grads, retain_graph or create_graph, create_graph)


@checked
def grad(
    outputs: Tensor | Sequence[Tensor],
    inputs: Tensor | Sequence[Tensor],
    grad_outputs: Tensor | Sequence[Any] | None = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> tuple[Tensor | None, ...]:
    """Gradients of ``outputs`` with respect to ``inputs``, returned (not accumulated)."""
    single = isinstance(outputs, Tensor)
    outputs = [outputs] if single else list(outputs)
    inputs_single = isinstance(inputs, Tensor)
    inputs = [inputs] if inputs_single else list(inputs)
    grads = _root_grads("grad", outputs, grad_outputs, "grad_outputs")
    for i, t in enumerate(inputs):
        if not isinstance(t, Tensor):
            raise TypeError(f"grad: the inputs must be tensors; input {i} is a {type(t).__name__}")
        if not t.requires_grad:
            raise RuntimeError(f"an input (shape {t.shape}) does not require grad")
    capture = {edge(t): None for t in inputs}
    retain = create_graph if retain_graph is None else retain_graph
    run([edge(t) for t in outputs], grads, retain, create_graph, capture)
    result = []
    for t in inputs:
        g = capture[edge(t)]
        if g is None and not allow_unused:
            raise RuntimeError(
                f"one of the inputs (shape {t.shape}) was not used to compute "
                "the outputs; pass allow_unused=True to get None for it"
            )
        if g is not None and not create_graph:
            g = g.detach()
        result.append(g)
    return tuple(result)
