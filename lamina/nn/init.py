"""``lamina.nn.init``: in-place initializations of parameters, PyTorch's formulas.

Random values come from lamina.random's generator (``lm.random.seed`` makes them
reproducible) and are drawn on the tensor's own device. Every function fills its
tensor under no_grad and returns it, as PyTorch's do.
"""

from __future__ import annotations

import math
import numbers

from lamina.autograd import no_grad
from lamina.dispatch import ops
from lamina.dispatch.tensor import Tensor

__all__ = [
    "calculate_gain",
    "constant_",
    "fan_in_and_fan_out",
    "kaiming_normal_",
    "kaiming_uniform_",
    "normal_",
    "ones_",
    "uniform_",
    "xavier_normal_",
    "xavier_uniform_",
    "zeros_",
]


def _finite(fn: str, name: str, value: float) -> float:
    """A finite real number ``value``, or an error naming the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{fn}: {name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{fn}: {name} must be a finite number, got {value}")
    return value


def _non_negative(fn: str, name: str, value: float) -> float:
    value = _finite(fn, name, value)
    if value < 0:
        raise ValueError(f"{fn}: {name} must be non-negative, got {value}")
    return value


def _fill(tensor: Tensor, values: Tensor) -> Tensor:
    with no_grad():
        tensor[...] = values
    return tensor


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with samples of the uniform distribution on [a, b)."""
    a, b = _finite("uniform_", "a", a), _finite("uniform_", "b", b)
    if a > b:
        raise ValueError(f"uniform_: a must be at most b (the range [a, b)), got a={a} > b={b}")
    u = ops.rand(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    return _fill(tensor, u * (b - a) + a)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with samples of the normal distribution N(mean, std**2)."""
    mean, std = _finite("normal_", "mean", mean), _non_negative("normal_", "std", std)
    z = ops.randn(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    return _fill(tensor, z * std + mean)


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill with ``val``."""
    return _fill(tensor, val)


def ones_(tensor: Tensor) -> Tensor:
    """Fill with 1."""
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    """Fill with 0."""
    return constant_(tensor, 0.0)


def fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight: (in, out) for (out, in, *kernel) shapes, times
    the kernel's size (PyTorch's _calculate_fan_in_and_fan_out)."""
    if tensor.ndim < 2:
        raise ValueError(
            f"fan in and fan out need a tensor of at least 2 dimensions, got shape {tensor.shape}"
        )
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain of a nonlinearity (PyTorch's table)."""
    linear = ("linear", "conv1d", "conv2d", "conv3d", "sigmoid", "identity")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else _finite("calculate_gain", "param", param)
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _fan(tensor: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot: U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out))."""
    gain = _non_negative("xavier_uniform_", "gain", gain)
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    if not tensor.size:  # nothing to fill (PyTorch: a no-op), and no fan to divide by
        return tensor
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot: N(0, std**2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    gain = _non_negative("xavier_normal_", "gain", gain)
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    if not tensor.size:
        return tensor
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))


def kaiming_uniform_(
    tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"
) -> Tensor:
    """He: U(-b, b) with b = gain * sqrt(3 / fan); PyTorch's Linear and Conv2d weights use
    a = sqrt(5), which makes b = 1 / sqrt(fan_in)."""
    gain = calculate_gain(nonlinearity, _finite("kaiming_uniform_", "a", a))
    fan = _fan(tensor, mode)
    if not tensor.size:
        return tensor
    bound = gain * math.sqrt(3.0 / fan)
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(
    tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"
) -> Tensor:
    """He: N(0, std**2) with std = gain / sqrt(fan)."""
    gain = calculate_gain(nonlinearity, _finite("kaiming_normal_", "a", a))
    fan = _fan(tensor, mode)
    if not tensor.size:
        return tensor
    return normal_(tensor, 0.0, gain / math.sqrt(fan))
