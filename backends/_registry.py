"""``Registry``: what a plugin's ``lamina_register_kernels`` hook receives."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from inspect import CO_VARARGS
from types import FunctionType
from typing import Any

from lamina.dispatch import devices, keys, modes
from lamina.dispatch import registry as R
from lamina.dispatch.schema import OPERATORS, get


def check_kernel(what: str, fn: object, priority: object, *calls: str) -> None:
    """``fn`` must be callable, ``priority`` an int, and ``fn`` must accept each of
    ``calls`` (a call such as ``add(ks, x1, x2)``): a kernel of the wrong arity is an
    error at registration, naming the plugin's call, not a TypeError at its first use."""
    if not callable(fn):
        raise TypeError(f"{what} must be callable, got {type(fn).__name__}")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"priority must be an int, got {priority!r}")
    for call in calls:
        n = call.count(",") + 1
        if _accepts(fn, n) is False:
            raise TypeError(
                f"{what} is called as {call} ({n} positional arguments), but its "
                f"signature is {inspect.signature(fn)}"
            )


def _accepts(fn: Any, n: int) -> bool | None:
    """Whether ``fn`` accepts ``n`` positional arguments; None where its signature
    cannot be read (a compiled or built-in function). A plain function's code object
    says so directly: ``inspect.signature`` took ~25 us a kernel, 15 ms of ``import
    lamina`` for the built-in plugins' 600 kernels."""
    if isinstance(fn, FunctionType) and not hasattr(fn, "__wrapped__"):
        code = fn.__code__
        if code.co_kwonlyargcount > len(fn.__kwdefaults__ or ()):
            return False  # a keyword-only argument without a default
        required = code.co_argcount - len(fn.__defaults__ or ())
        return required <= n and (n <= code.co_argcount or bool(code.co_flags & CO_VARARGS))
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(n))
    except TypeError:
        return False
    return True


MOVE_PRIORITY = -1000  # of the to_device kernel add_device registers for a device
# Note [Core operators] (dispatch/decompositions.py): add_device registers every
# decomposition for the new device under this plugin name, below any priority a plugin
# uses, so a kernel of the device's own wins and a decomposition serves before the
# device's fallback (which would round-trip through host memory).
DECOMPOSITIONS = "decompositions"
DECOMPOSITION_PRIORITY = -(2**31)


def _site() -> tuple[str, int]:
    """(file, line) of the plugin code calling the registry: where warnings about a
    registration point (PluginWarning)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_lineno)


def key_of(device: str) -> int:
    """The key of a device or layer name."""
    device = str(device)
    if device in keys.devices():
        return keys.device_key(device)
    try:
        return keys.LAYER_KEYS[device]
    except KeyError:
        raise ValueError(
            f"unknown device or layer {device!r}; devices: "
            f"{', '.join(keys.devices())}; layers: "
            f"{', '.join(keys.LAYER_KEYS)}"
        ) from None


class Registry:
    """What a plugin's ``lamina_register_kernels`` hook receives (docs/backends.md).

    Everything it records belongs to ``plugin`` (its name) and is dropped together when
    the plugin is unregistered or its hook fails; the tables are rebuilt once after the
    hook returns, never per registration."""

    def __init__(self, plugin: str) -> None:
        self.plugin = plugin

    def register(
        self,
        op: str,
        device: str,
        fn: Callable,
        priority: int = 0,
        *,
        with_scalar: Callable | None = None,
        unchecked: Callable | None = None,
        declines: bool = False,
    ) -> None:
        """Serve operator ``op`` on ``device`` (or layer) with ``fn(ks, *args)``.

        Optional variants (Note [Kernel variants]): ``with_scalar(ks, a, b)`` for
        binary calls with a Python scalar operand, ``unchecked(ks, *args)`` for the
        "checks" layer switched off. ``declines=True``: ``fn`` may return
        ``NotImplemented`` for a call it does not handle, which then goes to the
        kernel ranked below it (Note [Declining kernels])."""
        call = get(op).kernel_call
        check_kernel(f"the kernel for {op!r}", fn, priority, call)
        if with_scalar is not None and OPERATORS[op].kind not in ("binary", "inplace"):
            raise ValueError(f"with_scalar is for binary operators; {op!r} is {OPERATORS[op].kind}")
        for name, variant in (("with_scalar", with_scalar), ("unchecked", unchecked)):
            if variant is not None:
                if declines:
                    raise ValueError(
                        f"a kernel that declines ({op!r}) cannot have a {name} variant"
                    )
                check_kernel(f"the {name} variant of the kernel for {op!r}", variant, 0, call)
        if not isinstance(declines, bool):
            raise TypeError(f"declines must be a bool, got {declines!r}")
        R.register_kernel(
            op,
            key_of(device),
            fn,
            self.plugin,
            priority,
            with_scalar=with_scalar,
            unchecked=unchecked,
            site=_site(),
            declines=declines,
        )

    def implements(
        self, op: str, device: str = "cpu", priority: int = 0, *, declines: bool = False
    ) -> Callable:
        """Decorator form of ``register``."""

        def decorate(fn: Callable) -> Callable:
            self.register(op, device, fn, priority, declines=declines)
            return fn

        return decorate

    def register_wrapper(self, op: str, device: str, wrapper: Callable, priority: int = 0) -> None:
        """``wrapper(next_kernel) -> kernel``, called at table-build time with the kernel
        that would serve (op, device) without it (Note [Kernel wrappers])."""
        get(op)
        check_kernel(f"the kernel wrapper for {op!r}", wrapper, priority, "wrapper(next_kernel)")
        R.register_kernel(
            op, key_of(device), wrapper, self.plugin, priority, wraps=True, site=_site()
        )

    def add_device(
        self,
        name: str,
        *,
        to_cpu: Callable,
        from_cpu: Callable,
        shares_memory: bool = True,
        decompositions: bool = True,
    ) -> int:
        """Add device ``name`` with its own dispatch key; returns the key (an int).

        ``to_cpu(t)`` returns a CPU tensor with ``t``'s values, ``from_cpu(t)`` a tensor
        of this device with the CPU tensor ``t``'s values; both may share memory with
        their argument when ``shares_memory`` (moves then copy once on the CPU side).
        With ``decompositions`` every operator outside the core set that the plugin
        gives no kernel runs as its decomposition on the device (Note [Core
        operators])."""
        if not isinstance(name, str) or not name or not name.replace("_", "a").isalnum():
            raise ValueError(
                f"a device name must be a non-empty string of letters, "
                f"digits and underscores, got {name!r}"
            )
        if name == "cpu" or name in keys.LAYER_KEYS:
            raise ValueError(f"{name!r} is a built-in device or layer name")
        if name in keys.devices():
            spec = devices.spec(name)
            owner = spec.plugin if spec is not None else "lamina"
            raise ValueError(f"device {name!r} is already provided by plugin {owner!r}")
        for what, fn in (("to_cpu", to_cpu), ("from_cpu", from_cpu)):
            check_kernel(f"{what} of device {name!r}", fn, 0, f"{what}(t)")
        key = devices.add(name, self.plugin, to_cpu, from_cpu, bool(shares_memory))
        if decompositions:
            _register_decompositions(key)
        # moves off the device: the converters, unless the plugin registers a
        # to_device kernel of its own (which outranks this one)
        R.register_kernel(
            "to_device", key, devices.move_kernel, self.plugin, MOVE_PRIORITY, site=_site()
        )
        return key

    def register_fallback(self, device: str, fn: Callable, priority: int = 0) -> None:
        """``fn(op, ks, *args)`` serves every operator without a kernel on ``device``
        (Note [Backend fallback]); ``cpu_fallback`` is the usual choice."""
        check_kernel(f"the fallback of device {device!r}", fn, priority, *_FALLBACK_CALLS)
        key = key_of(device)
        if not key & keys.BACKEND_MASK:
            raise ValueError(f"fallbacks are for devices, not the {device!r} layer")
        R.register_fallback(key, fn, self.plugin, priority, site=_site())


def _register_decompositions(key: int) -> None:
    from lamina.dispatch.decompositions import DECOMPOSITIONS as TABLE

    for name, fn in TABLE.items():
        if not any(k.plugin == DECOMPOSITIONS for k in R.kernels.get((name, key), ())):
            R.register_kernel(
                name, key, _below_autograd(fn), DECOMPOSITIONS, DECOMPOSITION_PRIORITY
            )


def _below_autograd(fn: Callable) -> Callable:
    """A decomposition serves at a device key, below the autograd layer, which has
    recorded the operator itself (with its formula): the operators it calls dispatch
    with AUTOGRAD excluded (Note [Modes]), so they are not recorded a second time."""

    def decomposed(ks: int, *args: Any) -> Any:
        with modes.exclude(keys.AUTOGRAD):
            return fn(ks, *args)

    decomposed.__qualname__ = fn.__qualname__
    decomposed.__module__ = fn.__module__
    return decomposed


def _fallback_calls() -> list[str]:
    """One call per arity of kernel call: a fallback serves every operator."""
    by_arity: dict[int, str] = {}
    for op in OPERATORS.values():
        args = op.kernel_call.split("(", 1)[1]
        by_arity.setdefault(len(op.kernel_params), f"fallback(op, {args}")
    return [by_arity[n] for n in sorted(by_arity)]


_FALLBACK_CALLS = _fallback_calls()
