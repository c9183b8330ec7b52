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

from lamina.backends import jit, threads
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
    """An (N, C, H, W) array (or (C, H, W)) as a C-contiguous array in a kernel order:
    data's memory itself where it is in that order, a tiled transpose where it is in
    the other (Note [Transposes]), else a copy."""
    if unbatched:
        data = data[None]
    found = layout_of(data)
    if found is not None and found != layout:
        return converted(data if found == NCHW else data.transpose(0, 2, 3, 1), layout)
    return np.ascontiguousarray(data.transpose(0, 2, 3, 1) if layout == NHWC else data)


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


# ---------------------------------------------------------------- conversions


# Note [Transposes]: images change order (NCHW <-> NHWC: each image's (C, H W) matrix
# transposed, or back) in a loop over TILE x TILE tiles, output row by output row of
# tiles, so that the tile's rows are read and written while their cache lines are in
# L1 whatever the strides (NumPy's copy walks the output in order and reads the input
# one element per line: a power-of-two plane made its lines collide in the cache). The
# last columns (fewer than TILE) are copied output row by output row, the last rows
# input row by input row: the 2 x 2 planes' 4 pixels, the RGB input's 3 channels.
# Measured float32, batch 32, one thread, Zen 3, us, NumPy's copy -> tiles, to
# channels-last and back: 96 x 32 x 32 10300 -> 2900 and 2860 -> 1580, 144 x 16 x 16
# 1556 -> 400 and 437 -> 411, 128 x 16 x 16 1396 -> 364 and 1372 -> 401, 192 x 8 x 8
# 284 -> 150 and 150 -> 132, 384 x 4 x 4 78 -> 65 and 96 -> 66, 960 x 2 x 2 42 -> 52 and
# 166 -> 41, 3 x 64 x 64 616 -> 126 and 128 -> 125; slower only at 960 x 2 x 2 to
# channels-last and at 16 x 64 x 56 x 56 (1908 -> 2154, but 4108 -> 1843 back). On a
# Zen 4 VM NumPy's copy of 16 x 64 x 56 x 56 to channels-last had run as fast as a
# plain copy (2.4 ms); the tiles were not measured there.
TILE = 8
TILED = (np.dtype(np.float32), np.dtype(np.float64))  # other dtypes: NumPy's copy


def transpose_tiles(loop):
    """o (N, S, R) = a (N, R, S) with its last two axes swapped, image by image
    (``loop`` over the images: range, or prange in parallel)."""

    def kernel(a, o):
        rows, columns = a.shape[1], a.shape[2]
        tiled_rows, tiled_columns = rows - rows % TILE, columns - columns % TILE
        for n in loop(a.shape[0]):
            image, out = a[n], o[n]
            for s0 in range(0, tiled_columns, TILE):
                for r0 in range(0, tiled_rows, TILE):
                    for s in range(s0, s0 + TILE):
                        for r in range(r0, r0 + TILE):
                            out[s, r] = image[r, s]
            for s in range(tiled_columns, columns):
                for r in range(rows):
                    out[s, r] = image[r, s]
            for r in range(tiled_rows, rows):
                for s in range(tiled_columns):
                    out[s, r] = image[r, s]

    return kernel


def transposed(a, out):
    """out (N, S, R) = a (N, R, S) transposed in its last two axes, out C-contiguous
    (Note [Transposes]), in parallel over the images from the parallel threshold."""
    a = np.ascontiguousarray(a)  # the kernel reads a C array (a view's strides misread)
    if a.dtype not in TILED:
        np.copyto(out, a.transpose(0, 2, 1))
        return out
    parallel = threads.parts_for(a.size, a.shape[0]) > 1
    loop = jit.prange if parallel else range

    def build():
        sig = jit.types.void(jit.array(a.dtype, 3), jit.array(a.dtype, 3))
        return jit.compile_kernel(transpose_tiles(loop), sig, parallel, nogil=True)

    jit.cached((transpose_tiles, a.dtype, parallel), build)(a, out)
    return out


def converted(a, layout):
    """Images ``a`` in the other kernel order (any strides), as a C-contiguous array in
    ``layout`` (Note [Transposes])."""
    if layout == NHWC:
        n, c, h, w = a.shape
        out = np.empty((n, h, w, c), a.dtype)
        transposed(a.reshape(n, c, h * w), out.reshape(n, h * w, c))
    else:
        n, h, w, c = a.shape
        out = np.empty((n, c, h, w), a.dtype)
        transposed(a.reshape(n, h * w, c), out.reshape(n, c, h * w))
    return out


def to_layout(ks, x, layout):
    # already in layout: a new tensor of the same storage (a view)
    return from_array(logical(in_layout(x._data, layout, False), layout, False))


def register(registry):
    registry.register("to_layout", "cpu", to_layout)
