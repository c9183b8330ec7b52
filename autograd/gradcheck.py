"""Check analytical gradients against central finite differences (in float64).

Device-generic: perturbed inputs are made on each input's own device, and values are
read back through the CPU, so a third-party device's kernels and formulas are checked
as they run there."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lamina.dispatch import ops
from lamina.dispatch.arguments import checked
from lamina.dispatch.dtypes import float64
from lamina.dispatch.tensor import Tensor

from .engine import grad
from .grad_mode import no_grad


def _flat_outputs(fn: Callable, inputs: list) -> Sequence:
    out = fn(*inputs)
    return out if isinstance(out, (tuple, list)) else (out,)


def _host(t: Tensor) -> np.ndarray:
    return np.asarray(t._host(), dtype=np.float64)


@checked
def gradcheck(
    fn: Callable,
    inputs: Sequence[Any],
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
) -> bool:
    """True when every input's gradient matches finite differences; otherwise raise
    (or return False) naming the input and the largest mismatch.

    ``inputs`` are tensors (float64 ones that require grad are checked) or other
    arguments passed through unchanged."""
    inputs = list(inputs)
    checked = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    for i in checked:
        if inputs[i].dtype is not float64:
            raise TypeError(f"gradcheck needs float64 inputs, input {i} is {inputs[i].dtype}")
    if not checked:
        raise ValueError("gradcheck: no input is a tensor that requires grad")
    outputs = _flat_outputs(fn, inputs)
    if not any(isinstance(out, Tensor) and out.requires_grad for out in outputs):
        # nothing was recorded: passing would check nothing
        raise ValueError("gradcheck: no output of fn requires grad")
    for k, out in enumerate(outputs):
        if not isinstance(out, Tensor) or not out.requires_grad:
            continue
        n_out = out.size
        for i in checked:
            x = inputs[i]
            analytical = np.zeros((n_out, x.size))
            for j in range(n_out):
                seed = np.zeros(n_out)
                seed[j] = 1.0
                g = grad(
                    out,
                    x,
                    ops.asarray(seed.reshape(out.shape), dtype=out.dtype, device=out.device),
                    retain_graph=True,
                    allow_unused=True,
                )[0]
                if g is not None:
                    analytical[j] = _host(g).reshape(-1)
            numerical = np.zeros((n_out, x.size))
            base = _host(x)
            for m in range(x.size):
                for sign in (1, -1):
                    data = base.copy().reshape(-1)
                    data[m] += sign * eps
                    probe = list(inputs)
                    probe[i] = ops.asarray(data.reshape(x.shape), device=x.device)
                    with no_grad():
                        y = _host(_flat_outputs(fn, probe)[k])
                    numerical[:, m] += sign * y.reshape(-1) / (2 * eps)
            if not np.allclose(analytical, numerical, atol=atol, rtol=rtol):
                worst = np.abs(analytical - numerical).max()
                if raise_exception:
                    raise AssertionError(
                        f"gradcheck: the gradient of output {k} with respect to input {i} "
                        f"(shape {x.shape}) differs from finite differences by up to "
                        f"{worst:.3g}\nanalytical:\n{analytical}\nnumerical:\n{numerical}"
                    )
                return False
    return True
