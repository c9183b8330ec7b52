"""``lamina.nn.utils``: the helpers of PyTorch's ``torch.nn.utils`` that training loops
use -- gradient clipping (``clip_grad_norm_``, ``clip_grad_value_``) and one flat vector
of all the parameters (``parameters_to_vector``, ``vector_to_parameters``).

``foreach`` is accepted for PyTorch code and changes nothing: lamina has one
implementation.
"""

from __future__ import annotations

from collections.abc import Iterable

from lamina import linalg
from lamina.autograd import no_grad
from lamina.dispatch import ops
from lamina.dispatch.arguments import checked
from lamina.dispatch.tensor import Tensor

__all__ = [
    "clip_grad_norm_",
    "clip_grad_value_",
    "parameters_to_vector",
    "vector_to_parameters",
]


def _tensors(parameters: Tensor | Iterable[Tensor], fn: str) -> list[Tensor]:
    items = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for i, p in enumerate(items):
        if not isinstance(p, Tensor):
            raise TypeError(
                f"{fn}: parameters must be tensors, but item {i} is a {type(p).__name__}"
            )
    return items


@checked
def clip_grad_norm_(
    parameters: Tensor | Iterable[Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """Scale the gradients of ``parameters`` in place so that their total norm (the
    ``norm_type``-norm of all of them as one vector; ``inf`` for the largest absolute
    value) is at most ``max_norm``, and return that total norm as it was before.

    As PyTorch: the scale is ``min(1, max_norm / (total + 1e-6))``; parameters without
    a gradient are left out (no gradient at all: the norm is 0). A total norm that is
    NaN or infinite raises a RuntimeError with ``error_if_nonfinite`` (the gradients
    untouched), and otherwise scales the gradients by NaN or 0 as PyTorch does."""
    grads = [p.grad for p in _tensors(parameters, "clip_grad_norm_") if p.grad is not None]
    if not grads:
        return ops.asarray(0.0)
    with no_grad():
        norms = [linalg.vector_norm(g, ord=norm_type) for g in grads]
        total = linalg.vector_norm(ops.stack(norms), ord=norm_type)
        if error_if_nonfinite and not bool(ops.isfinite(total)):
            raise RuntimeError(
                f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is "
                f"{total.item()}, so they cannot be clipped; with error_if_nonfinite=False "
                "they are scaled by it anyway"
            )
        scale = ops.clip(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g *= scale if scale.dtype == g.dtype else ops.astype(scale, g.dtype)
    return total


@checked
def clip_grad_value_(
    parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None
) -> None:
    """Clip the gradients of ``parameters`` in place to ``[-clip_value, clip_value]``
    (parameters without a gradient are left out)."""
    for p in _tensors(parameters, "clip_grad_value_"):
        g = p.grad
        if g is not None:
            with no_grad():
                g[...] = ops.clip(g, min=-clip_value, max=clip_value)


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """All of ``parameters`` flattened into one 1-D tensor, one after the other
    (differentiable, as the reshapes and the concatenation it is made of)."""
    params = _tensors(parameters, "parameters_to_vector")
    _one_device(params, "parameters_to_vector")
    return ops.concat([ops.reshape(p, (-1,)) for p in params])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy the 1-D ``vec`` into ``parameters``, in place, in the layout of
    ``parameters_to_vector`` (the parameters keep their own storage)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"vector_to_parameters: vec must be a tensor, got {type(vec).__name__}")
    params = _tensors(parameters, "vector_to_parameters")
    _one_device(params, "vector_to_parameters")
    needed = sum(p.size for p in params)
    if vec.ndim != 1 or vec.shape[0] < needed:
        raise ValueError(
            f"vector_to_parameters: vec must be 1-D with at least the {needed} values of the "
            f"parameters, got shape {vec.shape}"
        )
    start = 0
    with no_grad():
        for p in params:
            p[...] = ops.reshape(vec[start : start + p.size], p.shape)
            start += p.size


def _one_device(params: list[Tensor], fn: str) -> None:
    if len({p.device for p in params}) > 1:
        raise TypeError(f"{fn}: found parameters on different devices, which is not supported")
