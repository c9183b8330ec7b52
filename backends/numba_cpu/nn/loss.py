"""Losses: nll_loss and mse_loss, NumPy where it is the right tool (a gather along the
class axis, one subtraction and a sum); their gradients are formulas of dispatched
operators (autograd/derivatives.py)."""

import numpy as np

from lamina.dispatch.tensor import from_array


def class_targets(fn, target, classes, ignore_index):
    """The target indices with ignored entries replaced by class 0, and the mask of
    entries that count; a ValueError for an index outside [0, classes)."""
    t = target._data.astype(np.int64, copy=False)
    counted = t != ignore_index
    bad = counted & ((t < 0) | (t >= classes))
    if bad.any():
        raise ValueError(
            f"{fn}: target values must be class indices in [0, {classes}) (or ignore_index="
            f"{ignore_index}), got {t[bad].reshape(-1)[0]}"
        )
    return np.where(counted, t, 0), counted


def nll_loss(ks, input, target, weight, ignore_index, reduction):
    x = input._data
    if x.ndim == 1:  # one unbatched sample: (C,) log-probabilities, a 0-d target
        x = x[None]
    classes = x.shape[1]
    t, counted = class_targets("nll_loss", target, classes, ignore_index)
    t = t.reshape(x.shape[:1] + x.shape[2:])
    picked = np.take_along_axis(x, t[:, None], axis=1)[:, 0]
    w = counted.reshape(t.shape).astype(x.dtype)
    if weight is not None:
        w *= weight._data[t]
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf data: no warnings
        return _nll_reduce(x, picked, w, target, reduction)


def _nll_reduce(x, picked, w, target, reduction):
    losses = -picked * w
    if reduction == "none":
        return from_array(losses.reshape(target._shape))
    total = losses.sum(dtype=np.float64)
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):  # everything ignored: NaN
            total = total / w.sum(dtype=np.float64)
    return from_array(np.asarray(total, x.dtype))


def mse_loss(ks, input, target, reduction):
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf data: no warnings
        return _mse_reduce(input._data - target._data, reduction)


def _mse_reduce(d, reduction):
    squares = d * d
    if reduction == "none":
        return from_array(np.asarray(squares, order="C"))  # ascontiguousarray: 0-d -> 1-d
    total = squares.sum(dtype=np.float64)
    if reduction == "mean":
        with np.errstate(invalid="ignore"):  # empty: NaN, as in PyTorch
            total = total / squares.size
    return from_array(np.asarray(total, squares.dtype))


def register(registry):
    for fn in (nll_loss, mse_loss):
        registry.register(fn.__name__, "cpu", fn)
