"""numba_cpu's neural-network primitives (seed 2), one module per family:

conv.py           conv2d and its backward operators (blocked im2col + BLAS), linear
depthwise.py      depthwise conv2d's direct loops (called by conv.py)
pooling.py        max, min, average and adaptive average pooling, their backward
normalization.py  batch, layer, group and local response norm, forward and backward
embedding.py      embedding lookup and its dense gradient
attention.py      scaled dot-product attention in one kernel
recurrent.py      the LSTM cell in one pass, forward and backward
activation.py     relu, leaky_relu, gelu, sigmoid, silu, hardtanh, hardswish and their
                  gradients; softmax
loss.py           nll_loss, mse_loss
layout.py         NCHW and channels-last memory (Note [Layouts]), to_layout
windows.py        window tables of convolution and pooling
resize.py         resampling (interpolate, pad's reflect, replicate, circular modes)
"""

from . import (
    activation,
    attention,
    conv,
    embedding,
    layout,
    loss,
    normalization,
    pooling,
    recurrent,
    resize,
)

MODULES = (
    activation,
    attention,
    conv,
    embedding,
    layout,
    loss,
    normalization,
    pooling,
    recurrent,
    resize,
)


def register(registry):
    for module in MODULES:
        module.register(registry)
