"""Devices: the ``Device`` objects tensors report, and the devices plugins add.

A device is a name with a backend key (``keys.register_device``). A plugin that adds
one (``Registry.add_device`` in ``lamina.backends``) gives two converters, ``to_cpu``
and ``from_cpu``; moves between devices go through the CPU with them (``move``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import keys
from .schema import OPERATORS

Tensor = Any  # lamina.dispatch.tensor.Tensor, which imports this module


class Device:
    """Where a tensor's storage lives. Compares equal to its name: ``x.device == "cpu"``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        keys.device_key(name)  # ValueError for an unknown device
        self.name = name

    def __eq__(self, other: object) -> bool:
        return self.name == (other.name if isinstance(other, Device) else other)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"device(type={self.name!r})"

    def __str__(self) -> str:
        return self.name


_devices: dict[str, Device] = {}


def device_of_key(ks: int) -> Device:
    """The Device of a key set (its CPU bit, else its highest backend bit's device)."""
    name = "cpu" if ks & keys.CPU else keys.device_names(ks)[0]
    return _devices.get(name) or _devices.setdefault(name, Device(name))


class DeviceSpec:
    """A device a plugin added: its key, its owner and its converters to/from the CPU."""

    __slots__ = ("name", "plugin", "key", "to_cpu", "from_cpu", "shares_memory")

    def __init__(
        self,
        name: str,
        plugin: str,
        key: int,
        to_cpu: Callable,
        from_cpu: Callable,
        shares_memory: bool,
    ) -> None:
        self.name, self.plugin, self.key = name, plugin, key
        self.to_cpu, self.from_cpu, self.shares_memory = to_cpu, from_cpu, shares_memory

    def __repr__(self) -> str:
        return f"DeviceSpec({self.name!r}, plugin={self.plugin!r}, key={self.key:#x})"


_specs: dict[str, DeviceSpec] = {}  # device name -> spec, for devices plugins added
_spec_by_key: dict[int, DeviceSpec] = {}


def add(name: str, plugin: str, to_cpu: Callable, from_cpu: Callable, shares_memory: bool) -> int:
    """Register device ``name`` of ``plugin``; returns its backend key."""
    key = keys.register_device(name)
    _specs[name] = _spec_by_key[key] = DeviceSpec(
        name, plugin, key, to_cpu, from_cpu, shares_memory
    )
    return key


def remove_devices_of(plugin: str) -> None:
    """Forget every device ``plugin`` added (their keys stay reserved, Note [Device keys])."""
    for spec in [s for s in _specs.values() if s.plugin == plugin]:
        del _specs[spec.name], _spec_by_key[spec.key]
        keys.unregister_device(spec.name)


def spec(name: str) -> DeviceSpec | None:
    return _specs.get(name)


def spec_of_key(key: int) -> DeviceSpec | None:
    return _spec_by_key.get(key)


def added_by(plugin: str) -> list[str]:
    return sorted(s.name for s in _specs.values() if s.plugin == plugin)


def _spec_for_move(name: str, t: Tensor) -> DeviceSpec | None:
    found = _specs.get(name)
    if found is None and name != "cpu":
        raise ValueError(
            f"cannot move a tensor from {t.device} to {name!r}: unknown device "
            f"{name!r}; known devices: {', '.join(keys.devices())}"
        )
    return found


def move(t: Tensor, device: str | Device) -> Tensor:
    """``t`` on ``device``, through the CPU: the source device's ``to_cpu``, then the
    target's ``from_cpu``; one CPU-side copy when both may share memory, so the result
    never shares storage with ``t``. What ``Tensor.to_device`` / ``Tensor.to`` call."""
    name, src = str(device), t.device.name
    dst_spec = _spec_for_move(name, t)
    if name == src:
        return t
    src_spec = _spec_for_move(src, t)
    cpu = t if src_spec is None else _converted(src_spec, "to_cpu", t, keys.CPU)
    if (src_spec is None or src_spec.shares_memory) and (
        dst_spec is None or dst_spec.shares_memory
    ):
        cpu = OPERATORS["copy"](cpu)
    return cpu if dst_spec is None else _converted(dst_spec, "from_cpu", cpu, dst_spec.key)


def move_kernel(ks: int, x: Tensor, device: str | Device) -> Tensor:
    """The kernel of operator ``to_device`` on the CPU and on every device a plugin
    adds (``Registry.add_device`` registers it for the device, below any ``to_device``
    kernel of the plugin's own): ``move``."""
    return move(x, device)


def _converted(s: DeviceSpec, which: str, t: Tensor, key: int) -> Tensor:
    out = getattr(s, which)(t)
    if (
        not isinstance(getattr(out, "_ks", None), int)
        or not out._ks & key
        or (out._shape != t._shape)
    ):
        raise TypeError(
            f"{which} of device {s.name!r} (plugin {s.plugin!r}) returned "
            f"{out!r:.80}, not a tensor of shape {t._shape} on "
            f"{'cpu' if key == keys.CPU else s.name}"
        )
    return out
