"""Memory layouts of image tensors (Note [Layouts]) and the layout conversion operator.

Note [Layouts]: an image tensor's logical shape is always (N, C, H, W), as in PyTorch;
its memory is either C-contiguous ("NCHW") or channels-last ("NHWC": the strides of a
C-contiguous (N, H, W, C) array, PyTorch's ``torch.channels_last``). The nn kernels run
on a C-contiguous array in one of the two orders -- ``image`` gives it, copying any
other strides to NCHW first -- and return their result in the same order
(``logical``), so a network whose input is channels-last never converts. A tensor that
is both (C == 1, or H == W == 1) counts as NCHW. A 3-D tensor is one unbatched image
(N = 1), as in PyTorch.

Elementwise nn kernels (activations and their gradients) need no image structure: they
run on the flat memory of a dense tensor of any stride order (``dense``) and give a
result with the same strides.
"""

import numpy as np

from lamina.dispatch.tensor import from_array

NCHW, NHWC = "NCHW", "NHWC"


def layout_of(data):
    """ "NCHW", "NHWC" or None (other strides) for a NumPy array of an image tensor."""
    if data.flags.c_contiguous:
        return NCHW
    if data.ndim == 4 and data.transpose(0, 2, 3, 1).flags.c_contiguous:
        return NHWC
    return None


def image(x):
    """x's data as a C-contiguous 4-D array in its kernel order, (N, C, H, W) or
    (N, H, W, C): (array, layout, unbatched)."""
    data = x._data
    unbatched = data.ndim == 3
    if unbatched:
        data = data[None]
    if data.flags.c_contiguous:
        return data, NCHW, unbatched
    nhwc = data.transpose(0, 2, 3, 1)
    if nhwc.flags.c_contiguous:
        return nhwc, NHWC, unbatched
    return np.ascontiguousarray(data), NCHW, unbatched


def empty_image(n, c, h, w, dtype, layout):
    """An uninitialized (N, C, H, W) result in a kernel order."""
    return np.empty((n, h, w, c) if layout == NHWC else (n, c, h, w), dtype)


def zeros_image(n, c, h, w, dtype, layout):
    return np.zeros((n, h, w, c) if layout == NHWC else (n, c, h, w), dtype)


def logical(arr, layout, unbatched):
    """A kernel-order array as the logical (N, C, H, W) array (or (C, H, W))."""
    if layout == NHWC:
        arr = arr.transpose(0, 3, 1, 2)
    return arr[0] if unbatched else arr


def in_layout(data, layout, unbatched):
    """An (N, C, H, W) array (or (C, H, W)) as a C-contiguous array in a kernel order
    (copied where its memory is in another order)."""
    if unbatched:
        data = data[None]
    if layout == NHWC:
        data = data.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(data)


def dense(data):
    """A flat view of the memory of ``data`` when it is dense (a C-contiguous array with
    its axes permuted, e.g. channels-last), else of a C-contiguous copy: (flat, array),
    where ``array`` is what the flat view is of (``data`` or the copy)."""
    if data.flags.c_contiguous:
        return data.reshape(-1), data
    order = sorted(range(data.ndim), key=lambda d: -data.strides[d])
    permuted = data.transpose(order)
    if permuted.flags.c_contiguous:
        return permuted.reshape(-1), data
    data = np.ascontiguousarray(data)
    return data.reshape(-1), data


def flat_like(data, like):
    """A flat view of ``data`` aligned element for element with ``dense(like)``: data
    itself when it has like's strides, else a copy into like's memory order."""
    if data.strides != like.strides:
        copy = np.empty_like(like)
        copy[...] = data
        data = copy
    return dense(data)[0]


def flat_output(like):
    """A new array with like's shape, dtype and memory order, and its flat view."""
    out = np.empty_like(like)  # order="K": keeps a dense array's stride order
    return dense(out)[0], out


# ---------------------------------------------------------------- to_layout


# Images of at most FEW_CHANNELS channels (a network's RGB input) go channels-last one
# channel at a time: NumPy's copy of the whole transposition runs an inner loop of C
# elements per pixel. Measured float32, one thread, us: 1 x 3 x 64 x 64 24.5 -> 6.3,
# 16 x 3 x 224 x 224 2918 -> 727, 1 x 4 x 64 x 64 16.2 -> 6.6; from 8 channels on,
# the two are within 20% either way.
FEW_CHANNELS = 4


def to_layout(ks, x, layout):
    """NumPy's strided copy does the transposition: measured on 16x64x56x56 float32,
    NCHW -> NHWC 2.4 ms (as fast as a copy) against 11 ms for a tiled Numba loop."""
    data = x._data
    if layout_of(data) == layout:
        return from_array(data)  # a new tensor of the same storage (a view)
    n, c, h, w = data.shape
    if layout == NHWC:
        out = np.empty((n, h, w, c), data.dtype)
        if c <= FEW_CHANNELS:
            for channel in range(c):
                out[..., channel] = data[:, channel]
        else:
            out[...] = data.transpose(0, 2, 3, 1)
        return from_array(out.transpose(0, 3, 1, 2))
    return from_array(np.ascontiguousarray(data))


def register(registry):
    registry.register("to_layout", "cpu", to_layout)
