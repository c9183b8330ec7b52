"""The declared fusions called as functions, for tests that compare them with the
chains they replace (Note [Rewrites])."""

from lamina.dispatch.rewrites import REWRITES
from lamina.dispatch.schema import OPERATORS


def batch_norm_relu(
    input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5
):
    """relu(F.batch_norm(...)) through the batch_norm_relu rewrite."""
    args = OPERATORS["native_batch_norm"].check(
        input, weight, bias, running_mean, running_var, training, momentum, eps
    )
    return REWRITES["batch_norm_relu"].apply(input, lambda x: args, lambda x: (x,))


def conv2d_relu(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """relu(F.conv2d(...)) through the conv2d_relu rewrite."""
    pair = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    args = OPERATORS["conv2d"].check(
        input, weight, bias, pair(stride), padding, pair(dilation), groups
    )
    return REWRITES["conv2d_relu"].apply(input, lambda x: args, lambda x: (x,))


def linear_relu(input, weight, bias=None):
    """relu(F.linear(...)) through the linear_relu rewrite."""
    args = OPERATORS["linear"].check(input, weight, bias)
    return REWRITES["linear_relu"].apply(input, lambda x: args, lambda x: (x,))
