"""The autograd graph: nodes recorded by the layer's kernels.

Note [Graph ownership]: edges point backwards only. An output tensor owns its
``grad_fn`` node; a node owns the tensors it saved and the nodes of its inputs; a leaf
owns its AccumulateGrad node (made once, so recording finds it with one attribute
read), which holds the leaf only weakly. A node never holds its own output strongly (a
weakref, plus a detached alias of the result for formulas that use it), so there are
no reference cycles: a graph is freed by reference counting the moment its last output
goes, without the garbage collector.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from lamina.dispatch import core, keys
from lamina.dispatch.devices import Device, device_of_key
from lamina.dispatch.tensor import PY_SCALARS, Tensor, version_of
from lamina.dispatch.tensor import versions as _modified  # storages ever written in place

if TYPE_CHECKING:
    from .derivatives import Derivative

AUTOGRAD = keys.AUTOGRAD

# hook(gradient): a replacement gradient of the same shape, dtype and device, or None
GradHook = Callable[[Tensor], Tensor | None]
PostAccumulateGradHook = Callable[[Tensor], None]  # hook(leaf), once leaf.grad is complete
Operand = Tensor | bool | int | float | complex  # of a binary operator


class Node(core.NodeBase):
    """One recorded operation: its derivative formula, saved arguments, and edges.

    ``next_nodes[i]`` is the node the gradient of argument i (of the i-th tensor of
    the list argument, for concat and stack) flows into, or None; ``next_nrs[i]`` is
    which of that node's outputs it is (None when all are 0)."""

    # Every node sets the first three; the rest are rarely anything but the class
    # defaults below and live in the instance __dict__ when set (Note [Cheap recording])
    __slots__ = ()  # derivative, next_nodes, saved: core.NodeBase's (C or Python)
    next_nrs = None
    versions = ()  # the version of each of saved_tensors(node); () when all were 0
    shapes = None  # an input's shape, where it differs from the result's
    dtypes = None  # an input's dtype, where it differs from the result's
    result = None  # (weakref to the output, detached alias) for formulas that use it
    hooks = None
    n_outputs = 1

    @property
    def name(self) -> str:
        return self.derivative.name

    @property
    def edges(self) -> tuple[Edge | None, ...]:
        nrs = self.next_nrs or (0,) * len(self.next_nodes)
        return tuple(None if n is None else (n, nr) for n, nr in zip(self.next_nodes, nrs))

    next_functions = edges

    def register_hook(self, hook: tuple[int, GradHook]) -> _Handle:
        if self.hooks is None:
            self.hooks = {}
        return _Handle(self.hooks, hook)

    def __repr__(self) -> str:
        return f"<{self.derivative.name}_backward>"


class AccumulateGrad:
    """The node that ends every path at a leaf: it adds the gradient to ``leaf.grad``."""

    __slots__ = ("_variable", "hooks", "post_hooks", "__weakref__")
    n_outputs = 1
    next_nodes = edges = next_functions = ()

    def __init__(self, variable: Tensor) -> None:
        self._variable = weakref.ref(variable)  # Note [Graph ownership]
        self.hooks = None
        self.post_hooks = None  # hook(leaf) once the gradient is in leaf.grad

    @property
    def variable(self) -> Tensor | None:
        """The leaf, or None once nothing else holds it (its gradient has no reader)."""
        return self._variable()

    name = "AccumulateGrad"
    register_hook = Node.register_hook

    def __repr__(self) -> str:
        return "<AccumulateGrad>"


class _Handle:
    _ids = itertools.count(1)  # next() is atomic: handles made in two threads never collide

    def __init__(
        self,
        hooks: dict[int, tuple[int, GradHook]] | dict[int, PostAccumulateGradHook],
        hook: tuple[int, GradHook] | PostAccumulateGradHook,
    ) -> None:
        self.hooks, self.id = hooks, next(_Handle._ids)
        hooks[self.id] = hook

    def remove(self) -> None:
        self.hooks.pop(self.id, None)


class Sizes:
    """What a node keeps of a tensor argument its formula reads only the shape and
    dtype of (Derivative.sizes): not the tensor, so neither its storage nor its later
    in-place changes concern the graph."""

    __slots__ = ("shape", "dtype", "_ks")

    def __init__(self, t: Tensor) -> None:
        self.shape, self.dtype, self._ks = t._shape, t._dtype, t._ks & keys.BACKEND_MASK

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def device(self) -> Device:
        return device_of_key(self._ks)


AnyNode = Node | AccumulateGrad
Edge = tuple[AnyNode, int]  # (node, which of its outputs)

_accumulator_lock = threading.Lock()


def grad_accumulator(leaf: Tensor) -> AccumulateGrad:
    """The leaf's AccumulateGrad node, made once and shared by every edge into it (made
    under a lock: two threads recording with one leaf must get the same node, or
    ``grad()`` would not find the gradient of the other's graph)."""
    acc = leaf._accumulator
    if acc is None:
        with _accumulator_lock:
            acc = leaf._accumulator
            if acc is None:
                acc = leaf._accumulator = AccumulateGrad(leaf)
    return acc


def edge(t: Tensor | None) -> Edge | None:
    """(node, output number) a gradient for tensor ``t`` flows into, or None."""
    if t is None or not t._ks & AUTOGRAD:
        return None
    fn = t._grad_fn
    if fn is None:
        return (grad_accumulator(t), 0)
    return (fn, t._output_nr)


def register_hook(t: Tensor, hook: GradHook) -> _Handle:
    """Hooks run on the gradient of ``t`` when it is computed (Tensor.register_hook)."""
    if not t._ks & AUTOGRAD:
        raise RuntimeError("cannot register a hook on a tensor that does not require grad")
    node, nr = edge(t)
    return node.register_hook((nr, hook))


def register_post_accumulate_grad_hook(t: Tensor, hook: PostAccumulateGradHook) -> _Handle:
    """``hook(t)`` runs each time backward has added a gradient into ``t.grad``, a leaf's
    (Tensor.register_post_accumulate_grad_hook, as PyTorch's: data-parallel training
    starts sending a gradient the moment it is complete)."""
    if not t._ks & AUTOGRAD or t._grad_fn is not None:
        raise RuntimeError(
            "register_post_accumulate_grad_hook needs a leaf tensor that requires grad; "
            "use register_hook for a gradient computed along the way"
        )
    acc = grad_accumulator(t)
    if acc.post_hooks is None:
        acc.post_hooks = {}
    return _Handle(acc.post_hooks, hook)


def slots(args: Sequence[Any]) -> list[Tensor | None]:
    """The tensors a node's gradients are for: one slot per argument (None for
    non-tensors), or one per tensor of the list argument of concat and stack."""
    if args and type(args[0]) in (list, tuple):
        return list(args[0])
    return [a if isinstance(a, Tensor) else None for a in args]


def record(
    derivative: Derivative, args: tuple[Any, ...], outputs: tuple[Tensor, ...]
) -> Node | None:
    """Make the node of one call and mark ``outputs`` as its results.

    Note [Cheap recording]: this runs once per differentiable call, and every container
    it allocates is also work for the garbage collector on long tapes (seed issue:
    GC turned a 1.25 us record into 2.6-6.3 us). So it is one pass over the arguments
    and, in the common case, allocates the node, one tuple of next nodes and nothing
    else: output numbers, shapes (kept only where an input's shape differs from the
    result's, so its gradient must be summed back), dtypes (only where they differ)
    and saved tensors (only those the formula needs) default to None or shared
    constants."""
    out0 = outputs[0]
    dtype, shape = out0._dtype, out0._shape
    if dtype.kind not in "fc":
        return None  # an integer or bool result (astype to int) never requires grad
    node = Node()
    node.derivative = derivative
    listed = derivative.list_input
    inputs = args[0] if listed else args
    nodes, nrs, shapes, dtypes, plain = [], None, None, None, False
    i = -1
    for t in inputs:
        i += 1
        if t.__class__ is not Tensor:
            nodes.append(None)
            plain = True  # a non-tensor argument: formulas always get those
            continue
        if listed or t._shape != shape:
            shapes = shapes or [None] * len(inputs)
            shapes[i] = t._shape
        if t._dtype is not dtype:
            dtypes = dtypes or [None] * len(inputs)
            dtypes[i] = t._dtype
        if not t._ks & AUTOGRAD:
            nodes.append(None)
            continue
        fn = t._grad_fn
        if fn is None:
            acc = t._accumulator
            nodes.append(acc if acc is not None else grad_accumulator(t))
        else:
            nodes.append(fn)
            if t._output_nr:
                nrs = nrs or [0] * len(inputs)
                nrs[i] = t._output_nr
    node.next_nodes = tuple(nodes)
    if nrs:
        node.next_nrs = tuple(nrs)
    if shapes:
        node.shapes = tuple(shapes)
    if dtypes:
        node.dtypes = tuple(dtypes)
    saves, sizes = derivative.saves, derivative.sizes
    if saves == () and not sizes and not plain and not listed:
        node.saved = _NOTHING_SAVED[len(args)]  # only tensors, none saved: a constant
    else:
        node.saved = (
            args
            if saves is None
            else tuple(
                [
                    Sizes(a)
                    if i in sizes
                    else None
                    if i not in saves and a.__class__ is Tensor
                    else a
                    for i, a in enumerate(args)
                ]
            )
        )
    if derivative.uses_result:
        # A weakref to the output (differentiable, for create_graph) and a detached
        # alias of its storage for when the output itself is gone. The alias's version
        # is checked too: the result modified in place is a saved tensor modified. A
        # node of several outputs (eigh, svd, qr) keeps one such pair per output.
        if len(outputs) == 1:
            node.result = (weakref.ref(out0), out0.detach())
        else:
            node.result = tuple([(weakref.ref(o), o.detach()) for o in outputs])
    if len(outputs) > 1:
        node.n_outputs = len(outputs)  # before saved_tensors, which reads it
    if _modified:
        node.versions = tuple([version_of(t) for t in saved_tensors(node)])
    out0._ks |= AUTOGRAD
    out0._grad_fn = node
    marked = len(outputs) if derivative.outputs is None else derivative.outputs
    for i in range(1, marked):  # split: output i is gradient slot i
        out = outputs[i]
        out._ks |= AUTOGRAD
        out._grad_fn = node
        out._output_nr = i
    return node


def saved_tensors(node: Node) -> list[Tensor]:
    """The tensors whose versions the node checks at backward (Note [Version
    counters]): its saved tensor arguments (every tensor of the list argument of concat
    and stack), then the alias of its result for formulas that use it."""
    d = node.derivative
    source = node.saved[0] if d.saves is None and d.list_input else node.saved
    tensors = [a for a in source if a.__class__ is Tensor]
    if node.result is not None:
        if node.n_outputs == 1:
            tensors.append(node.result[1])
        else:
            tensors.extend([alias for _, alias in node.result])
    return tensors


def record_binary(derivative: Derivative, a: Tensor, b: Tensor, out: Tensor) -> Node | None:
    """record() for one output of a binary operator, specialized for the seed's loop
    body (``out = out + x``, ``out = out * x``): two tensors of the result's shape and
    dtype, none of them a later output of a multi-output node, and a formula that
    saves nothing or both (Derivative.binary_saves). The node then needs its
    derivative and two tuples (Note [Cheap recording]); anything else takes record()."""
    shape, dtype, saves = out._shape, out._dtype, derivative.binary_saves
    if not (
        saves is not None
        and a.__class__ is Tensor
        and b.__class__ is Tensor
        and a._dtype is dtype
        and b._dtype is dtype
        and a._shape == shape
        and b._shape == shape
    ):
        return record(derivative, (a, b), (out,))
    # the two edges, inlined: a helper call would cost ~5% of the whole operation
    if a._ks & AUTOGRAD:
        next_a = a._grad_fn
        if next_a is None:
            next_a = a._accumulator or grad_accumulator(a)
        elif a._output_nr:
            return record(derivative, (a, b), (out,))
    else:
        next_a = None
    if b._ks & AUTOGRAD:
        next_b = b._grad_fn
        if next_b is None:
            next_b = b._accumulator or grad_accumulator(b)
        elif b._output_nr:
            return record(derivative, (a, b), (out,))
    else:
        next_b = None
    node = Node()  # calling the class is ~20 ns cheaper than object.__new__(Node)
    node.derivative = derivative
    node.next_nodes = (next_a, next_b)
    if saves:
        node.saved = (a, b)
        if _modified:
            node.versions = (version_of(a), version_of(b))
    else:
        node.saved = _NOTHING_SAVED[2]
    out._ks |= AUTOGRAD
    out._grad_fn = node
    return node


def record_unary(derivative: Derivative, x: Tensor, out: Tensor, *setting: Any) -> Node | None:
    """record() for an operator of one tensor (exp, tanh, relu, ...) and at most one
    setting after it (softmax's dim, leaky_relu's slope): a tensor of the result's shape
    and dtype, not a later output of a multi-output node, and a formula that saves
    nothing or its input (Derivative.unary_saves; the setting is always kept), with the
    result's pair where it uses the result (Note [Cheap recording]); anything else takes
    record()."""
    saves = derivative.unary_saves
    if not (
        saves is not None
        and x.__class__ is Tensor
        and x._dtype is out._dtype
        and x._shape == out._shape
    ):
        return record(derivative, (x, *setting), (out,))
    if x._ks & AUTOGRAD:
        next_x = x._grad_fn
        if next_x is None:
            next_x = x._accumulator or grad_accumulator(x)
        elif x._output_nr:
            return record(derivative, (x, *setting), (out,))
    else:
        next_x = None
    node = Node()
    node.derivative = derivative
    if setting:
        node.next_nodes = (next_x, None)
        node.saved = (x if saves else None, *setting)
    else:
        node.next_nodes = (next_x,)
        node.saved = (x,) if saves else _NOTHING_SAVED[1]
    if derivative.uses_result:
        node.result = (weakref.ref(out), out.detach())
    if _modified and (saves or derivative.uses_result):
        node.versions = tuple([version_of(t) for t in saved_tensors(node)])
    out._ks |= AUTOGRAD
    out._grad_fn = node
    return node


def record_with_scalar(derivative: Derivative, a: Operand, b: Operand, out: Tensor) -> Node | None:
    """record_binary's counterpart for one tensor and one Python scalar (``x * 2.0``,
    ``1 - x``): the scalar is always saved (formulas read it), the tensor as the
    formula says; anything else takes record()."""
    saves, first = derivative.binary_saves, type(a) is Tensor
    t, scalar = (a, b) if first else (b, a)
    e = edge(t) if type(t) is Tensor else False
    if (
        saves is None
        or e is False
        or (e is not None and e[1])
        or type(scalar) not in PY_SCALARS
        or t._dtype is not out._dtype
        or t._shape != out._shape
    ):
        return record(derivative, (a, b), (out,))
    node = Node()
    node.derivative = derivative
    nxt, kept = e and e[0], t if saves else None
    node.next_nodes, node.saved = (
        ((nxt, None), (kept, scalar)) if first else ((None, nxt), (scalar, kept))
    )
    if saves and _modified:
        node.versions = (version_of(t),)
    out._ks |= AUTOGRAD
    out._grad_fn = node
    return node


_NOTHING_SAVED = [(None,) * n for n in range(8)]
