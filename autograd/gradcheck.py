"""Check analytical gradients against central finite differences (in float64)."""
import numpy as np


def _flat_outputs(fn, inputs):
    out = fn(*inputs)
    return out if isinstance(out, (tuple, list)) else (out,)


def gradcheck(fn, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True):
    """True when every input's gradient matches finite differences; otherwise raise
    (or return False) naming the input and the largest mismatch.

    ``inputs`` are tensors (float64 ones that require grad are checked) or other
    arguments passed through unchanged."""
    import lamina as lm
    inputs = list(inputs)
    checked = [i for i, x in enumerate(inputs) if isinstance(x, lm.Tensor) and x.requires_grad]
    for i in checked:
        if inputs[i].dtype is not lm.float64:
            raise TypeError(f"gradcheck needs float64 inputs, input {i} is {inputs[i].dtype}")
    if not checked:
        raise ValueError("gradcheck: no input is a tensor that requires grad")
    outputs = _flat_outputs(fn, inputs)
    if not any(isinstance(out, lm.Tensor) and out.requires_grad for out in outputs):
        # nothing was recorded: passing would check nothing
        raise ValueError("gradcheck: no output of fn requires grad")
    for k, out in enumerate(outputs):
        if not isinstance(out, lm.Tensor) or not out.requires_grad:
            continue
        n_out = out.size
        for i in checked:
            x = inputs[i]
            analytical = np.zeros((n_out, x.size))
            for j in range(n_out):
                seed = np.zeros(n_out)
                seed[j] = 1.0
                g = lm.autograd.grad(out, x, lm.asarray(seed.reshape(out.shape),
                                                        dtype=out.dtype),
                                     retain_graph=True, allow_unused=True)[0]
                if g is not None:
                    analytical[j] = g.numpy().reshape(-1)
            numerical = np.zeros((n_out, x.size))
            base = x.numpy().copy()
            for m in range(x.size):
                for sign in (1, -1):
                    data = base.copy().reshape(-1)
                    data[m] += sign * eps
                    probe = list(inputs)
                    probe[i] = lm.asarray(data.reshape(x.shape))
                    with lm.no_grad():
                        y = _flat_outputs(fn, probe)[k].numpy().astype(np.float64)
                    numerical[:, m] += sign * y.reshape(-1) / (2 * eps)
            if not np.allclose(analytical, numerical, atol=atol, rtol=rtol):
                worst = np.abs(analytical - numerical).max()
                if raise_exception:
                    raise AssertionError(
                        f"gradcheck: the gradient of output {k} with respect to input {i} "
                        f"(shape {x.shape}) differs from finite differences by up to "
                        f"{worst:.3g}\nanalytical:\n{analytical}\nnumerical:\n{numerical}")
                return False
    return True
