"""``default_collate`` (a list of samples -> one batch) and ``default_convert`` (one
sample, NumPy arrays and scalars -> tensors), with PyTorch's rules."""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np

from lamina.dispatch import ops
from lamina.dispatch.dtypes import float64, int64
from lamina.dispatch.tensor import Tensor

_COLLATE_ERROR = (
    "default_collate: a batch must hold tensors, NumPy arrays, numbers, strings, dicts or "
    "sequences; found {}"
)


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _is_text_array(a: np.ndarray) -> bool:
    return a.dtype.kind in "USOV"  # strings, bytes, objects and records have no tensor dtype


def _rebuild(like: Any, items: Any) -> Any:
    """``items`` in a container of ``like``'s type where that type can be built from
    them, else in the plain one (a list or a dict)."""
    try:
        return type(like)(items)
    except TypeError:
        return items


def default_collate(batch: Sequence[Any]) -> Any:
    """A list of samples as one batch, by the type of the first sample: tensors are
    stacked along a new first dimension (``lm.stack``); NumPy arrays and NumPy scalars
    become tensors, stacked; Python floats a float64 tensor, ints an int64 one (bools a
    bool one); strings and bytes stay as given; dicts, namedtuples and sequences are
    collated field by field (a tuple's fields come back as a list, as PyTorch's)."""
    elem = batch[0]
    if isinstance(elem, Tensor):
        return ops.stack(list(batch), axis=0)
    if isinstance(elem, np.ndarray):
        if _is_text_array(elem):
            raise TypeError(_COLLATE_ERROR.format(f"a NumPy array of dtype {elem.dtype}"))
        return ops.asarray(np.stack(batch))
    if isinstance(elem, np.generic) and not isinstance(elem, (np.str_, np.bytes_)):
        if isinstance(elem, (np.object_, np.void)):
            raise TypeError(_COLLATE_ERROR.format(type(elem).__name__))
        return ops.asarray(np.asarray(batch))
    if isinstance(elem, float):
        return ops.asarray(batch, dtype=float64)
    if isinstance(elem, bool) and all(isinstance(x, bool) for x in batch):
        return ops.asarray(list(batch))
    if isinstance(elem, int):
        if all(isinstance(x, int) for x in batch):
            return ops.asarray(list(batch), dtype=int64)
        return ops.asarray(list(batch))  # ints and floats mixed: the default float dtype
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, Mapping):
        collated = {key: default_collate([d[key] for d in batch]) for key in elem}
        if isinstance(elem, MutableMapping):
            clone = copy.copy(elem)  # keeps the mapping's type and its extra state
            clone.update(collated)
            return clone
        return _rebuild(elem, collated)
    if _is_namedtuple(elem):
        return type(elem)(*(default_collate(field) for field in zip(*batch)))
    if isinstance(elem, Sequence):
        size = len(elem)
        if any(len(sample) != size for sample in batch):
            raise RuntimeError(
                f"default_collate: each sample of a batch of sequences must have the same "
                f"length, got lengths {[len(sample) for sample in batch]}"
            )
        fields = [default_collate(field) for field in zip(*batch)]
        if isinstance(elem, tuple):
            return fields
        return _rebuild(elem, fields)
    raise TypeError(_COLLATE_ERROR.format(type(elem).__name__))


def default_convert(data: Any) -> Any:
    """One sample with its NumPy arrays and NumPy scalars made tensors, containers
    converted item by item (a tuple comes back as a list, as PyTorch's); everything
    else as given. ``DataLoader(batch_size=None)`` applies it to each item."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, np.ndarray):
        return data if _is_text_array(data) else ops.asarray(data)
    if isinstance(data, (np.number, np.bool_)):
        return ops.asarray(data)
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, Mapping):
        converted = {key: default_convert(data[key]) for key in data}
        if isinstance(data, MutableMapping):
            clone = copy.copy(data)
            clone.update(converted)
            return clone
        return _rebuild(data, converted)
    if _is_namedtuple(data):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, Sequence):
        return _rebuild(data, [default_convert(d) for d in data])
    return data
