"""The autograd layer's kernels, registered like a backend's at the AUTOGRAD key.

Its kernels sit at the AUTOGRAD dispatch key. A tensor's key set has that bit only
while it requires grad, so a call whose inputs do not require grad never enters the
layer: no-op autograd costs nothing. Inside, a kernel redispatches below its own key
through the same table, then records a graph node (unless grad mode is off).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import pluggy

from lamina.dispatch import core, keys
from lamina.dispatch.schema import OPERATORS, Operator, tagged
from lamina.dispatch.tensor import Tensor

from . import graph
from .derivatives import DERIVATIVES, Derivative
from .grad_mode import state
from .graph import Operand

# the marker of lamina's hook specs (lamina.backends.hookspecs; pluggy matches markers
# by project name, so this layer needs nothing from the backends package)
hookimpl = pluggy.HookimplMarker("lamina")
_BELOW = ~keys.AUTOGRAD

Kernel = Callable[..., Tensor | tuple[Tensor, ...]]  # fn(ks, *args)


class KernelRegistry(Protocol):
    """What the layer uses of the registry its hook gets (lamina.backends.Registry,
    which it may not import: the backends are its peers)."""

    def register(
        self, op: str, device: str, fn: Kernel, *, with_scalar: Kernel | None = None
    ) -> None: ...


def _kernel(op: Operator, derivative: Derivative) -> tuple[Kernel, Kernel | None]:
    """The layer's kernel for ``op``: redispatch below AUTOGRAD, then record."""
    table, scalar_table, record = op.table, op.scalar_table, graph.record
    record_binary, record_with_scalar = graph.record_binary, graph.record_with_scalar
    record_unary = graph.record_unary

    def kernel(ks: int, *args: Any) -> Tensor | tuple[Tensor, ...]:
        below = ks & _BELOW
        out = table[below.bit_length()](below, *args)
        if state.enabled:
            record(derivative, args, out if isinstance(out, tuple) else (out,))
        return out

    # the same for two arguments, without packing *args
    def binary(ks: int, a: Tensor, b: Tensor) -> Tensor:
        below = ks & _BELOW
        out = table[below.bit_length()](below, a, b)
        if state.enabled:
            record_binary(derivative, a, b, out)
        return out

    # the same for one tensor (exp, tanh, relu, ...) and a setting (softmax's dim)
    def unary(ks: int, x: Tensor, *setting: Any) -> Tensor:
        below = ks & _BELOW
        out = table[below.bit_length()](below, x, *setting)
        if state.enabled:
            record_unary(derivative, x, out, *setting)
        return out

    # a Python scalar operand (Note [Kernel variants])
    def with_scalar(ks: int, a: Operand, b: Operand) -> Tensor:
        below = ks & _BELOW
        out = scalar_table[below.bit_length()](below, a, b)
        if state.enabled:
            record_with_scalar(derivative, a, b, out)
        return out

    def recording(fn: Kernel, tensors: int, record: Callable) -> Kernel:
        fn.__name__ = fn.__qualname__ = op.name
        return core.RecordingKernel(  # Note [C recording] (the C core records in C)
            fn,
            derivative=derivative,
            table=op.dispatch,
            node_type=graph.Node,
            grad_state=state,
            versions=graph._modified,
            nothing_saved=graph._NOTHING_SAVED[tensors],
            accumulator=graph.grad_accumulator,
            record=record,
            autograd=keys.AUTOGRAD,
            tensors=tensors,
            inputs=len(op.params),
        )

    if op.kind == "binary":
        fn = recording(binary, 2, record_binary)
    elif _one_tensor(op):
        fn = recording(unary, 1, record_unary)
    else:
        fn = kernel
    for f in (fn, with_scalar):
        f.__name__ = f.__qualname__ = op.name
        f.__module__ = __name__  # how dumps show it (the C kernel's type is the core's)
    return fn, (with_scalar if op.kind == "binary" else None)  # Note [Kernel variants]


_SETTINGS = frozenset({"int", "float", "bool", "str", "Axis"})


def _one_tensor(op: Operator) -> bool:
    """An operator of one tensor and at most one setting after it, of one result: exp,
    tanh, relu, sigmoid, ...; softmax (dim), leaky_relu (slope), gelu (approximate)."""
    params = op.params
    return (
        1 <= len(params) <= 2
        and params[0].type == "Tensor"
        and all(p.type in _SETTINGS for p in params[1:])
        and op.returns == "Tensor"
    )


def _check_leaf(name: str, x: Tensor) -> None:
    fn = x.grad_fn
    if fn is None and x._ks & keys.AUTOGRAD:
        raise RuntimeError(
            f"{name}: a leaf tensor that requires grad cannot be modified "
            "in place (it would invalidate its gradient); do it under "
            "lamina.no_grad() or on a copy"
        )
    while fn is not None and fn.name in _VIEW_OPS:  # writing a view writes its base
        fn = fn.next_nodes[0]
        if isinstance(fn, graph.AccumulateGrad):
            leaf = fn.variable._data
            if isinstance(leaf, np.ndarray) and np.may_share_memory(leaf, x._data):
                raise RuntimeError(
                    f"{name}: a view of a leaf tensor that requires grad "
                    "cannot be modified in place; do it under "
                    "lamina.no_grad() or on a copy"
                )
            return


def _check_view(name: str, x: Tensor, value: Operand) -> None:
    """Writing through a view with grad is refused rather than silently wrong: the
    base tensor's graph would not learn of the write (PyTorch rebases it with
    CopySlices; lamina does not yet)."""
    data = x._data
    if not (isinstance(data, np.ndarray) and data.base is not None and data.base is not x._flat):
        return  # owns its storage (an advanced-indexing result is a copy, for one)
    fn = x.grad_fn
    recorded_view = fn is not None and fn.name in _VIEW_OPS
    untracked_view = not x._ks & keys.AUTOGRAD and getattr(value, "_ks", 0) & keys.AUTOGRAD
    if recorded_view or untracked_view:
        raise RuntimeError(
            f"{name}: in-place modification of a view with autograd is not "
            "supported (the base tensor's gradient would be wrong); write "
            "to the base tensor, use an out-of-place operation, or do it "
            "under lamina.no_grad()"
        )


_VIEW_OPS = frozenset(op.name for op in tagged("view"))


def _inplace_kernel(op: Operator, derivative: Derivative) -> Kernel:
    """x1 op= x2 with grad: x1's previous value is kept in a copy for the formula, then
    x1 becomes the output of the out-of-place operation (its grad_fn is replaced)."""
    table, copy = op.table, OPERATORS["copy"]

    def kernel(ks: int, x1: Tensor, x2: Operand) -> Tensor:
        below = ks & _BELOW
        if not state.enabled:
            return table[below.bit_length()](below, x1, x2)
        _check_leaf(op.name, x1)
        _check_view(op.name, x1, x2)
        previous = copy(x1) if 0 in derivative.saves else x1
        table[below.bit_length()](below, x1, x2)
        x1._output_nr = 0
        graph.record(derivative, (previous, x2), (x1,))
        return x1

    kernel.__name__ = kernel.__qualname__ = op.name
    return kernel


def _setitem_kernel(ks: int, x: Tensor, key: Any, value: Operand) -> Tensor:
    table = OPERATORS["setitem"].table
    below = ks & _BELOW
    if state.enabled:
        _check_leaf("setitem", x)
        _check_view("setitem", x, value)
    out = table[below.bit_length()](below, x, key, value)
    if state.enabled:
        x._output_nr = 0
        graph.record(DERIVATIVES["setitem"], (x, key, value), (x,))
    return out


_setitem_kernel.__name__ = _setitem_kernel.__qualname__ = "setitem"


@hookimpl
def lamina_register_kernels(registry: KernelRegistry) -> None:
    for name, derivative in DERIVATIVES.items():
        op = OPERATORS[name]
        if name == "setitem":
            registry.register(name, "autograd", _setitem_kernel)
        else:
            kernel, with_scalar = _kernel(op, derivative)
            registry.register(name, "autograd", kernel, with_scalar=with_scalar)
        if op.inplace is not None:
            registry.register(op.inplace.name, "autograd", _inplace_kernel(op.inplace, derivative))
