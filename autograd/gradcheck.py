"""Check analytical gradients against central finite differences (in float64 and
complex128).

Device-generic: perturbed inputs are made on each input's own device, and values are
read back through the CPU, so a third-party device's kernels and formulas are checked
as they run there.

Complex numbers are checked as pairs of reals (Note [Complex gradients] in
derivatives.py): every real component of an output (the real and the imaginary part
of each complex element) is a row of the Jacobian, every real component of an input
a column. The analytical row of Re(out_j) is the gradient for the seed e_j, that of
Im(out_j) the gradient for the seed 1j * e_j; the gradient's real and imaginary parts
are the columns of the input's real and imaginary parts. The numerical Jacobian
perturbs each input component by +-eps (+-1j * eps for an imaginary part)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lamina.dispatch import ops
from lamina.dispatch.arguments import checked
from lamina.dispatch.dtypes import complex128, float64
from lamina.dispatch.tensor import Tensor

from .engine import grad
from .grad_mode import no_grad


def _flat_outputs(fn: Callable, inputs: list) -> Sequence:
    out = fn(*inputs)
    return out if isinstance(out, (tuple, list)) else (out,)


def _host(t: Tensor) -> np.ndarray:
    a = t._host()
    return np.asarray(a, np.complex128 if a.dtype.kind == "c" else np.float64)


def _parts(values: np.ndarray, complex_: bool) -> np.ndarray:
    """The real components of a flat array: (re, im) interleaved when complex_."""
    if not complex_:
        return np.real(values)
    return np.stack([np.real(values), np.imag(values)], axis=-1).reshape(*values.shape[:-1], -1)


def _analytical(out: Tensor, x: Tensor) -> np.ndarray:
    complex_in = x.dtype.kind == "c"
    seeds = (1.0, 1j) if out.dtype.kind == "c" else (1.0,)
    result = np.zeros((out.size * len(seeds), x.size * (2 if complex_in else 1)))
    for j in range(out.size):
        for r, v in enumerate(seeds):
            seed = np.zeros(out.size, np.complex128 if len(seeds) == 2 else np.float64)
            seed[j] = v
            g = grad(
                out,
                x,
                ops.asarray(seed.reshape(out.shape), dtype=out.dtype, device=out.device),
                retain_graph=True,
                allow_unused=True,
            )[0]
            if g is not None:
                result[j * len(seeds) + r] = _parts(_host(g).reshape(-1), complex_in)
    return result


def _numerical(fn: Callable, inputs: list, k: int, i: int, eps: float, rows: int) -> np.ndarray:
    x = inputs[i]
    steps = (eps, 1j * eps) if x.dtype.kind == "c" else (eps,)
    base = _host(x).reshape(-1)
    result = np.zeros((rows, x.size * len(steps)))
    for m in range(x.size):
        for c, step in enumerate(steps):
            for sign in (1, -1):
                data = base.copy()
                data[m] += sign * step
                probe = list(inputs)
                probe[i] = ops.asarray(data.reshape(x.shape), dtype=x.dtype, device=x.device)
                with no_grad():
                    out = _flat_outputs(fn, probe)[k]
                    y = _host(out).reshape(-1)
                result[:, m * len(steps) + c] += sign * _parts(y, out.dtype.kind == "c") / (2 * eps)
    return result


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

    ``inputs`` are tensors (float64 and complex128 ones that require grad are checked)
    or other arguments passed through unchanged."""
    inputs = list(inputs)
    checked = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    for i in checked:
        if inputs[i].dtype not in (float64, complex128):
            raise TypeError(
                f"gradcheck needs float64 or complex128 inputs, input {i} is {inputs[i].dtype}"
            )
    if not checked:
        raise ValueError("gradcheck: no input is a tensor that requires grad")
    outputs = _flat_outputs(fn, inputs)
    if not any(isinstance(out, Tensor) and out.requires_grad for out in outputs):
        # nothing was recorded: passing would check nothing
        raise ValueError("gradcheck: no output of fn requires grad")
    for k, out in enumerate(outputs):
        if not isinstance(out, Tensor) or not out.requires_grad:
            continue
        for i in checked:
            analytical = _analytical(out, inputs[i])
            numerical = _numerical(fn, inputs, k, i, eps, len(analytical))
            if not np.allclose(analytical, numerical, atol=atol, rtol=rtol):
                worst = np.abs(analytical - numerical).max()
                if raise_exception:
                    raise AssertionError(
                        f"gradcheck: the gradient of output {k} with respect to input {i} "
                        f"(shape {inputs[i].shape}, {inputs[i].dtype}) differs from finite "
                        f"differences by up to {worst:.3g}\nanalytical:\n{analytical}\n"
                        f"numerical:\n{numerical}"
                    )
                return False
    return True
