"""Memory layouts: the strides of a result, as an operator's description gives them.

Note [Result layouts]: a result is a new C-contiguous tensor, except

* a view (an operator tagged ``view``), whose strides are those NumPy gives for the
  same view of its input's strides (computed on a stand-in array that owns no memory);
* the result of an nn operator, which keeps the layout of the argument it follows
  (``layout_source``): an image result of a channels-last image is channels-last
  (Note [Layouts] in the CPU backend's nn kernels), and a result of the input's shape
  has the input's stride order when the input is dense (a C-contiguous array with its
  axes permuted), as the elementwise nn kernels give it.

The meta device takes a result's layout from here. The CPU kernels decide it
themselves, from NumPy's contiguity flags (faster on the per-call path than these
functions; allocating from the description would cost more than a small call), and
cannot drift from it unnoticed: the meta-device test compares the two for every sample
of every operator. A plugin's kernel may return any strides (its values and shape are
what the result checks hold it to).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import keys
from .schema import Operator

Shape = tuple[int, ...]
NCHW, NHWC = "NCHW", "NHWC"


def contiguous(shape: Shape) -> Shape:
    """The element strides of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def channels_last(shape: Shape) -> Shape:
    """The element strides of an (N, C, H, W) array stored as (N, H, W, C)."""
    n, c, h, w = contiguous((shape[0], shape[2], shape[3], shape[1]))
    return (n, w, c, h)


class MetaStorage:
    """The storage of a meta tensor: its strides (in elements) and no values."""

    __slots__ = ("strides",)

    def __init__(self, strides: Shape) -> None:
        self.strides = tuple(strides)

    def __repr__(self) -> str:
        return f"MetaStorage(strides={self.strides})"


def strides_of(t: Any) -> Shape:
    """A tensor's strides in elements: a NumPy storage's, or those a device's storage
    states (``strides``: the meta device's), else C-contiguous."""
    data = t._data
    if isinstance(data, np.ndarray):
        return element_strides(data)
    strides = getattr(data, "strides", None)
    return contiguous(t._shape) if strides is None else tuple(strides)


def _compact(shape: Shape, strides: Shape) -> tuple[Shape, Shape]:
    """Axes of size 1 have no meaningful stride: left out of layout comparisons."""
    kept = [(n, s) for n, s in zip(shape, strides) if n != 1]
    return tuple(n for n, _ in kept), tuple(s for _, s in kept)


def image_layout(shape: Shape, strides: Shape) -> str | None:
    """ "NCHW" (C-contiguous), "NHWC" (channels-last strides of a 4-D shape) or None
    (other strides). One that is both (one channel, or 1 x 1 images) is "NCHW"."""
    if _same_layout(shape, strides, contiguous(shape)):
        return NCHW
    if len(shape) == 4 and _same_layout(shape, strides, channels_last(shape)):
        return NHWC
    return None


def in_layout(shape: Shape, strides: Shape, layout: str) -> bool:
    """Whether an array of ``shape`` and ``strides`` is stored in image ``layout`` (a
    1 x 1 image or a single channel is in both)."""
    want = channels_last(shape) if layout == NHWC and len(shape) == 4 else contiguous(shape)
    return (layout == NCHW or len(shape) == 4) and _same_layout(shape, strides, want)


def _same_layout(shape: Shape, a: Shape, b: Shape) -> bool:
    return 0 in shape or _compact(shape, a)[1] == _compact(shape, b)[1]


@functools.lru_cache(maxsize=4096)
def dense_order(shape: Shape, strides: Shape) -> tuple[int, ...] | None:
    """The axes from outermost to innermost when ``strides`` are those of a C-contiguous
    array with permuted axes (a dense layout), else None. Remembered per shape and
    strides: every elementwise call on channels-last operands asks it of each operand
    (sorting them took a third of a small channels-last add's 20 us)."""
    order = tuple(sorted(range(len(shape)), key=lambda i: -strides[i]))
    step = 1
    for i in reversed(order):
        if shape[i] != 1 and strides[i] != step:
            return None
        step *= shape[i]
    return order


@functools.lru_cache(maxsize=256)
def inverse_order(order: tuple[int, ...]) -> tuple[int, ...]:
    """The axes that put an array transposed by ``order`` back (NumPy's argsort of a
    tuple took 3 us)."""
    return tuple(sorted(range(len(order)), key=order.__getitem__))


# Note [Result layouts]: operators whose result keeps a dense input's stride order
# (NumPy's "K" order: copies and sorts made by NumPy, and the nn kernels that run on the
# flat memory of their input), and the image operators, whose result is channels-last
# when their image input is (Note [Layouts] in the CPU backend's nn kernels).
KEEPS_ORDER = frozenset(
    {
        "astype",
        "copy",
        "index_add",
        "sort",
        "softmax",
        "log_softmax",
        "softmax_backward",
        "log_softmax_backward",
        "relu",
        "relu_backward",
        "leaky_relu",
        "leaky_relu_backward",
        "gelu",
        "gelu_backward",
        "sigmoid",
        "silu",
        "silu_backward",
        "hardtanh",
        "hardtanh_backward",
        "hardswish",
        "hardswish_backward",
    }
)
IMAGE = frozenset(
    {
        "conv2d",
        "conv2d_relu",
        "conv2d_backward_input",
        "resample2d",
        "resample2d_backward",
        "max_pool2d",
        "min_pool2d",
        "max_pool2d_with_indices",
        "min_pool2d_with_indices",
        "pool2d_scatter",
        "pool2d_gather",
        "avg_pool2d",
        "avg_pool2d_backward",
        "adaptive_avg_pool2d",
        "adaptive_avg_pool2d_backward",
        "native_local_response_norm",
        "local_response_norm_backward",
        "native_batch_norm",
        "native_batch_norm_backward",
        "native_group_norm",
        "native_group_norm_backward",
    }
)


# nn operators that are elementwise in all but their namespace, and are laid out as
# elementwise operators are (their kernels are the elementwise module's: Note
# [Pointwise activations] in the CPU backend)
ELEMENTWISE_LIKE = frozenset({"tanh_backward", "sigmoid_backward"})


def layout_source(op: Operator, args: tuple) -> Any:
    """The tensor whose layout ``op``'s results follow, or None (C-contiguous results):
    the first argument of a KEEPS_ORDER operator or the image argument of an IMAGE
    one (``input``; ``result`` for relu's backward, ``grad`` for pool2d_scatter's);
    for a concat of channels-last images, the first (Inception's branches joined on
    channels stay channels-last, as in PyTorch); for an elementwise operator, an
    operand whose dense order every tensor operand of the result's shape shares (a
    residual ``x + y`` of channels-last images is channels-last, as in PyTorch)."""
    if op.category == "elementwise" or op.name in ELEMENTWISE_LIKE:
        return _common_order_operand(args)
    if op.name == "concat":
        images = args[0]
        nhwc = all(image_layout(t._shape, strides_of(t)) == NHWC for t in images)
        return images[0] if images and nhwc and len(images[0]._shape) == 4 else None
    if op.name not in KEEPS_ORDER and op.name not in IMAGE:
        return None
    names = [p.name for p in op.params]
    for name in ("input", "result", "x", "grad"):
        if name in names:
            return args[names.index(name)]
    return args[0]


def _common_order_operand(args: tuple) -> Any:
    """An elementwise call's first tensor operand when every tensor operand has its
    shape and one dense order that is not C order (the others being 0-d), else None."""
    tensors = [a for a in args if hasattr(a, "_shape")]
    if any(t._ks & keys.SPARSE for t in tensors):  # no strides: a sparse result is COO
        return None
    full = [t for t in tensors if t._shape]
    if not full or any(t._shape != full[0]._shape for t in full):
        return None
    first = strides_of(full[0])
    if first == contiguous(full[0]._shape):
        return None
    order = dense_order(full[0]._shape, first)
    if order is None:
        return None
    if any(dense_order(t._shape, strides_of(t)) != order for t in full[1:]):
        return None
    return full[0]


def _in_order(shape: Shape, order: list[int]) -> Shape:
    strides, step = [0] * len(shape), 1
    for i in reversed(order):
        strides[i] = step
        step *= max(shape[i], 1)
    return tuple(strides)


def new_strides(op: Operator, shape: Shape, like: Any) -> Shape:
    """The strides of a new result of ``op`` of ``shape`` that follows ``like`` (what
    ``layout_source`` gives): Note [Result layouts]."""
    if like is None:
        return contiguous(shape)
    like_strides = strides_of(like)
    if op.name in KEEPS_ORDER or op.category == "elementwise" or op.name in ELEMENTWISE_LIKE:
        order = dense_order(like._shape, like_strides)
        if order is not None and tuple(shape) == like._shape:
            return _in_order(shape, order)
    elif len(shape) == 4 and image_layout(like._shape, like_strides) == NHWC:
        return channels_last(shape)
    return contiguous(shape)


def stand_in(t: Any, strided: bool = True) -> np.ndarray:
    """An array of ``t``'s shape, dtype and (with ``strided``) strides that owns no
    memory: views of it give a view's shape and strides. Never read its values; one
    whose strides are all 0 (``strided=False``) may be read."""
    dtype = t._dtype.np
    base = np.zeros(1, dtype)
    strides = strides_of(t) if strided else (0,) * len(t._shape)
    return np.lib.stride_tricks.as_strided(
        base, t._shape, tuple(s * dtype.itemsize for s in strides), writeable=False
    )


def element_strides(a: np.ndarray) -> Shape:
    return tuple(s // a.itemsize for s in a.strides)


def split_bounds(size: int, sections: int | list[int]) -> list[int]:
    """Where split cuts an axis of ``size``: every ``sections`` elements, or after each
    of the given section sizes but the last."""
    if isinstance(sections, int):
        return list(range(sections, size, sections))
    return [int(b) for b in np.cumsum(sections)[:-1]]


def _reshape(a: np.ndarray, shape: Shape, copy: bool | None) -> np.ndarray:
    """reshape's view where the strides allow one, else a C-contiguous copy's layout
    (never copying the stand-in itself: setting .shape refuses instead)."""
    if not copy:
        view = a.view()
        try:
            view.shape = shape
            return view
        except AttributeError:  # needs a copy
            pass
    steps = contiguous(shape)
    return np.lib.stride_tricks.as_strided(
        np.zeros(1, a.dtype), shape, tuple(s * a.itemsize for s in steps), writeable=False
    )


def _getitem(a: np.ndarray, key: Any) -> np.ndarray:
    out = a[key]
    if not isinstance(out, np.ndarray):  # NumPy's scalar: PyTorch's 0-d view instead
        out = a[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
    return out


# Note [Host views]: each view operator as the NumPy view it is; the CPU kernels apply
# these to their storage, and descriptions to a stand-in of the input (``view_strides``).
VIEWS = {
    "reshape": _reshape,
    "permute_dims": lambda a, axes: a.transpose(axes),
    "matrix_transpose": lambda a: np.swapaxes(a, -1, -2),
    "expand_dims": np.expand_dims,
    "squeeze": np.squeeze,
    "flip": np.flip,
    "broadcast_to": np.broadcast_to,
    "split": lambda a, sections, axis: np.split(a, split_bounds(a.shape[axis], sections), axis),
    "diagonal": lambda a, offset: np.diagonal(a, offset, -2, -1),
    "getitem": _getitem,
}


def view_strides(op: Operator, args: tuple) -> list[Shape]:
    """The strides of each result of the view operator ``op`` (Note [Result layouts])."""
    x, *rest = args
    if op.name == "to_layout":
        (layout,) = rest
        if image_layout(x._shape, strides_of(x)) == layout:
            return [strides_of(x)]
        return [channels_last(x._shape) if layout == NHWC else contiguous(x._shape)]
    if op.name == "getitem":
        rest = [host_key(rest[0])]
        if _advanced(rest[0]):  # a new array: its layout is NumPy's, whatever x's strides
            return [element_strides(_getitem(stand_in(x, strided=False), rest[0]))]
    out = VIEWS[op.name](stand_in(x), *rest)
    return [element_strides(o) for o in (out if isinstance(out, list) else [out])]


def host_key(key: Any) -> Any:
    """An indexing key with tensors as stand-ins of their shape (index 0 everywhere:
    valid wherever the axis is not empty)."""
    if isinstance(key, tuple):
        return tuple(host_key(k) for k in key)
    if hasattr(key, "_dtype"):
        if key._dtype.kind == "b":
            raise NotImplementedError(
                "getitem: the shape of a boolean mask's result depends on its values"
            )
        return np.zeros(key._shape, np.intp)
    return key


def _advanced(key: Any) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (np.ndarray, list)) for k in keys)
