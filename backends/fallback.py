"""Helpers for plugins: ``new_tensor`` and the fast CPU constructors, the dtype mapping,
and ``cpu_fallback`` for plugins that add a device (docs/backends.md, "Helpers")."""

from __future__ import annotations

import os
import warnings
from builtins import list as _list
from typing import Any

import numpy as np

from lamina.dispatch import devices, keys
from lamina.dispatch.dtypes import DType
from lamina.dispatch.dtypes import from_numpy as dtype_from_numpy  # noqa: F401 (a helper)
from lamina.dispatch.schema import Operator
from lamina.dispatch.tensor import (  # noqa: F401 (from_flat: a helper, re-exported)
    Tensor,
    from_array,
    from_flat,
    from_storage,
)


def new_tensor(
    storage: Any,
    device: str = "cpu",
    dtype: DType | None = None,
    shape: tuple[int, ...] | None = None,
) -> Tensor:
    """A tensor on ``device`` holding ``storage``: a NumPy array (not copied) for the
    CPU, whatever object the device's plugin defines otherwise (then ``dtype``, a
    lamina dtype, and ``shape`` are required: nothing inspects the storage)."""
    if str(device) == "cpu":
        if not isinstance(storage, np.ndarray):
            raise TypeError(f"CPU storage must be a NumPy array, got {type(storage).__name__}")
        return from_array(storage)
    if dtype is None or shape is None:
        raise TypeError(f"new_tensor on device {device!r} needs dtype= and shape=")
    return from_storage(storage, keys.device_key(str(device)), dtype, shape)


class FallbackWarning(UserWarning):
    """An operator ran on the CPU for a device without a kernel or decomposition for it
    (``cpu_fallback``): its tensors made a round trip through host memory."""


_fallback_mode = os.environ.get("LAMINA_CPU_FALLBACK", "warn")
_warned: set[tuple[str, str]] = set()
FALLBACK_MODES = ("warn", "error", "allow")


def set_cpu_fallback(mode: str) -> str:
    """What ``cpu_fallback`` does when it serves an operator on a device: "warn" (once
    per operator and device, the default), "error" (NotImplementedError naming them)
    or "allow" (silently); returns the mode it replaces. ``LAMINA_CPU_FALLBACK`` sets
    it at start-up."""
    global _fallback_mode
    if mode not in FALLBACK_MODES:
        raise ValueError(f"set_cpu_fallback: mode must be one of {FALLBACK_MODES}, got {mode!r}")
    before, _fallback_mode = _fallback_mode, mode
    return before


def _announce(op: Operator, device: str) -> None:
    if _fallback_mode == "allow" or (_fallback_mode == "warn" and (op.name, device) in _warned):
        return
    what = (  # "cpu fallback: " first, so that warning filters can name these
        f"cpu fallback: {op.name} has no kernel on device {device!r} and is not decomposed "
        "there: it runs on the CPU, its tensors copied to host memory and back"
    )
    if _fallback_mode == "error":
        raise NotImplementedError(f"{what} (set_cpu_fallback('warn') allows it)")
    _warned.add((op.name, device))
    warnings.warn(f"{what} (warned once per operator and device)", FallbackWarning, stacklevel=3)


def cpu_fallback(op: Operator, ks: int, *args: Any) -> Any:
    """The usual device fallback (Note [Backend fallback]), as PyTorch's CPU fallback:
    convert the device's tensors to CPU with its ``to_cpu``, run the CPU kernel,
    convert the results back with ``from_cpu`` (announced as ``set_cpu_fallback``
    says: by default a FallbackWarning once per operator and device). An in-place
    operator's result is written back into its first argument (its storage is replaced
    by the converted result's). Views come back as views only if the converters share
    memory."""
    spec = devices.spec_of_key(1 << ((ks & keys.BACKEND_MASK).bit_length() - 1))
    if spec is None:
        raise NotImplementedError(
            f"cpu_fallback: {op.name} was called with keys "
            f"{keys.keyset_names(ks)}, none of a plugin's device"
        )
    _announce(op, spec.name)
    key, to_cpu, from_cpu = spec.key, spec.to_cpu, spec.from_cpu

    def down(a: Any) -> Any:
        if isinstance(a, Tensor):
            return to_cpu(a) if a._ks & key else a
        if type(a) in (tuple, _list):
            return type(a)(down(b) for b in a)
        return a

    def up(a: Any) -> Any:
        if isinstance(a, Tensor):
            return from_cpu(a) if a._ks & keys.CPU else a
        if isinstance(a, tuple) and hasattr(a, "_fields"):  # a named result (eigh, qr)
            return type(a)(*(up(b) for b in a))
        if type(a) in (tuple, _list):
            return type(a)(up(b) for b in a)
        return a

    out = op.table[keys.CPU.bit_length()](keys.CPU, *[down(a) for a in args])
    if op.kind == "inplace":
        target = args[0]
        target._data = from_cpu(out)._data
        return target
    return up(out)
