"""``repr`` of tensors, in the style of NumPy's and PyTorch's."""
import numpy as np

from . import _dtypes as D

_IMPLIED = (D.float64, D.int64, D.bool_)  # dtypes the printed values already imply


def format_tensor(t):
    data = t.numpy()
    prefix = "tensor("
    body = np.array2string(data, separator=", ", prefix=prefix, threshold=1000, edgeitems=3)
    extras = []
    if data.size == 0 and data.shape != (0,):
        extras.append(f"shape={t.shape}")
    if t.dtype not in _IMPLIED or (data.size == 0 and t.dtype is not D.float64):
        extras.append(f"dtype={t.dtype!r}")
    if t.device != "cpu":
        extras.append(f"device={str(t.device)!r}")
    return prefix + body + "".join(", " + e for e in extras) + ")"
