"""A reference model of the dispatcher, checked against the real dispatch tables.

In the style of PyTorch's ``torch/_python_dispatcher.py``: a slow, obviously correct
model of how one dispatch table entry is chosen, written from the rules -- Note [Table
entry precedence] (dispatch/entries.py) and Note [Kernel priority] (dispatch/registry.py)
-- and never by calling ``entries.compute_entry``.

The model's input is a configuration:

* the registrations: the built-in ones for the operators under test, read from
  ``lamina.dispatch.registry`` at test time (that is data, not the algorithm), plus
  those of a few probe plugins (kernels, kernel wrappers and device fallbacks at
  various priorities and plugin names; one of them may add the device ``probe_dev``);
* the layers switched off (autograd, sparse, checks) and the preferred plugin.

For each (operator, key) it computes a slot (``Model.slot``): the first rule that
applies of

1. a layer that is off: AUTOGRAD falls through (not in the mask), SPARSE raises
   RuntimeError;
2. the best kernel (preferred plugin, then higher priority, then plugin name, then
   registration order); kernels that may decline rank above the best one that may not
   and decline to it (with none below them, to the fallback; without one of those, a
   layer key falls through and any other key raises NotImplementedError);
3. a device key with fallbacks: the best fallback;
4. AUTOGRAD without a kernel falls through;
5. anything else raises NotImplementedError (so does a device bit no plugin provides).

Under rules 2 and 3 all of the slot's wrappers sit above what serves, ranked among
themselves (best outermost), whatever their priority relative to the kernel.

A device key other than CPU checks the call's devices (ValueError when another backend
bit is set). A kernel serving its slot unwrapped and unchecked contributes its variants:
``with_scalar`` to the scalar table, ``unchecked`` to the table while "checks" is off.

From the slots it predicts a call ``table[ks.bit_length()](ks, *args)`` with
``ks = raw & mask`` (``Model.call``): the trace of (probe label, key set) that run, and
the exception that ends it, if any. A probe kernel records itself; on a layer key
(SPARSE, AUTOGRAD) it then redispatches ``ks & ~key`` through the same table (its
``with_scalar`` variant through the scalar table), as the autograd layer does. A
wrapper records itself and calls what is below it; a fallback records itself with the
operator it was bound to. A built-in kernel is never run: while a configuration is
installed, stubs that record ``builtin:<name>`` take their place (names, priorities and
order kept). Every kernel returns a storage-less stand-in tensor of the call's device,
dtype and shape, so the tables' result checks (Note [Result checks]) pass.

Each configuration is registered for real, and for every subset of the keys CPU,
probe_dev, SPARSE and AUTOGRAD (with the other devices' bits added where the call also
carries CPU or probe_dev, so that their own fallbacks are never reached) both tables
are called and compared with the model, as are the mask and every ``dump_table`` row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import pytest

import lamina as lm
from lamina.dispatch import entries, keys, registry
from lamina.dispatch.decompositions import DECOMPOSITIONS
from lamina.dispatch.tensor import from_storage

CPU, SPARSE, AUTOGRAD = keys.CPU, keys.SPARSE, keys.AUTOGRAD
TRACER = keys.LAYER_KEYS["trace"]  # lamina.jit's tracer: a built-in kernel for every operator
BACKENDS = keys.BACKEND_MASK
LAYER_OF = {SPARSE: "sparse", AUTOGRAD: "autograd", TRACER: "trace"}
# Core operators (Note [Core operators]): a device gets no decomposition of them, so
# every slot of the probe device is decided by the configuration's registrations
H, C, B = "atan2", "nextafter", "bitwise_and"  # bitwise_and: integers, not differentiable
OPS = (H, C, B)
assert not set(OPS) & set(DECOMPOSITIONS), "the model's operators must be core operators"
DEVICE = "probe_dev"
# Stand-in arguments: no probe looks at them and no built-in kernel runs (stubs take
# their place), but the result checks of the tables (Note [Result checks]) read their
# dtypes and shapes; each kernel returns a stand-in result of the call's device.
DTYPES = {H: lm.float64, C: lm.float64, B: lm.int64}


def stand_in(name: str, ks: int):
    """A storage-less tensor of operator ``name``'s dtype, shape (2,), on the device of
    the highest backend key of ``ks``, as every kernel here returns."""
    backend = ks & BACKENDS
    key = 1 << (backend.bit_length() - 1) if backend else CPU
    return from_storage(None, key, DTYPES[name], (2,))


def args_of(name: str):
    return (stand_in(name, CPU), stand_in(name, CPU))


# ---------------------------------------------------------------- configurations


@dataclass(frozen=True)
class Probe:
    op: str | None  # None for a fallback
    device: str  # "cpu", DEVICE, "sparse" or "autograd"
    kind: str  # "kernel", "decliner", "wrapper" or "fallback"
    priority: int = 0
    scalar: bool = False  # registered with a with_scalar variant
    unchecked: bool = False  # registered with an unchecked variant


@dataclass(frozen=True)
class PluginSpec:
    name: str
    probes: tuple[Probe, ...]
    adds_device: bool = False  # add_device(DEVICE) before registering

    def tag(self, i: int) -> str:
        p = self.probes[i]
        return f"{self.name}.{p.kind}{i}.{p.op or 'any'}.{p.device}.{p.priority}"


@dataclass(frozen=True)
class Config:
    id: str
    plugins: tuple[PluginSpec, ...]
    off: tuple[str, ...] = ()
    preferred: str | None = None


def K(op, device, priority=0, *, scalar=False, unchecked=False):
    return Probe(op, device, "kernel", priority, scalar, unchecked)


def D(op, device, priority=0):
    """A kernel registered with declines=True that declines every call."""
    return Probe(op, device, "decliner", priority)


def W(op, device, priority=0):
    return Probe(op, device, "wrapper", priority)


def F(device, priority=0):
    return Probe(None, device, "fallback", priority)


def P(name, *probes, device=False):
    return PluginSpec(name, probes, device)


def variant(config: Config, **changes) -> Config:
    what = ", ".join(f"{k}={v}" for k, v in changes.items())
    return dataclasses.replace(config, id=f"{config.id}[{what}]", **changes)


TIES = Config(
    "ties",
    (
        # same plugin, same priority: registration order; ties with built-ins by name
        P(
            "probe_b",
            K(C, "cpu", 5),
            K(C, "cpu", 5),
            K(H, "cpu", 5),
            K(H, "autograd"),
            K(B, "autograd"),
        ),
        P("probe_a", K(H, "cpu", 5), K(B, "cpu", -20), K(B, "autograd")),
        P("aaa_probe", K(B, "cpu"), K(H, "autograd"), K(C, "sparse", 3)),
        P("probe_c", K(C, "sparse", 3), K(C, "autograd", 1)),
    ),
)
PRIORITIES = Config(
    "priorities",
    (
        P("probe_a", K(H, "cpu", 1), K(C, "cpu", -5), K(C, "sparse", 7)),
        P("probe_b", K(H, "cpu", 3), K(C, "sparse", 2), K(B, "cpu", -20)),
        P("probe_c", K(H, "cpu", 2), K(B, "sparse", 1), K(H, "autograd", -1), K(B, "autograd", -1)),
    ),
)
WRAPPERS = Config(
    "wrappers",
    (
        P("probe_k", K(C, "cpu", 3, scalar=True, unchecked=True), K(B, "sparse")),
        P(
            "probe_w",
            # wrappers rank among themselves: all three wrap numba_cpu's kernel, the one
            # ranked below it too
            *(W(H, "cpu", 10), W(H, "cpu", 5), W(H, "cpu", -5)),
            *(W(C, "cpu", 3), W(C, "cpu", 4)),  # at probe_k's kernel's priority and above
            W(H, "autograd", 1),  # above the built-in autograd kernel
            W(H, "sparse"),  # nothing below it: skipped
            W(B, "sparse", 5),  # above a layer probe
            W(B, "cpu", -20),  # below every built-in kernel: wraps numba_cpu's all the same
            W(B, "autograd", 9),  # nothing below it on AUTOGRAD: still a fallthrough
        ),
    ),
)
DEVICE_ONLY = Config(
    "device",
    (
        P("probe_dev_plugin", K(H, DEVICE), W(C, DEVICE), device=True),
        P(
            "probe_b",
            K(H, DEVICE, 2, scalar=True, unchecked=True),  # device-checked: no variants
            K(B, "cpu", 1, scalar=True, unchecked=True),
            K(B, "autograd"),
            W(B, DEVICE, 3),  # nothing below it and no fallback: skipped
        ),
    ),
)
DEVICE_FALLBACK = Config(
    "fallback",
    (
        P("probe_dev_plugin", F(DEVICE), K(H, DEVICE), device=True),
        P(
            "probe_f2",
            F(DEVICE, 1),
            W(B, DEVICE),  # wraps the fallback
            K(C, "autograd", 3, scalar=True),
            K(B, "sparse", scalar=True),
        ),
    ),
)
LAYERS = Config(
    "layers",
    (
        P(
            "probe_l",
            *(K(H, "autograd", 1), K(H, "sparse", 1), K(H, "cpu", 1, scalar=True, unchecked=True)),
            K(C, "sparse", scalar=True, unchecked=True),
            K(C, "autograd", 2, scalar=True, unchecked=True),
            K(B, "sparse"),
        ),
    ),
)
DECLINING = Config(
    "declining",
    (
        P(
            "probe_d",
            *(D(H, "cpu", 5), D(H, "cpu", 3)),  # two decline, to numba_cpu's kernel
            D(C, "autograd", 2),  # to the built-in autograd kernel
            D(B, "autograd", 1),  # nothing below it on AUTOGRAD: falls through
            D(B, "sparse"),  # nothing below on SPARSE (no kernel): raises
            D(H, DEVICE, 1),  # to the device's fallback
            D(C, DEVICE),  # nothing below on the device, no fallback there... (see F)
            F(DEVICE),
            device=True,
        ),
        P("probe_dw", W(H, "cpu", -3), W(C, "autograd"), K(H, DEVICE, scalar=True)),
    ),
)
DECLINE_NOTHING = Config(
    "declining-to-nothing",
    (P("probe_n", D(C, DEVICE), D(H, "cpu", 2), K(H, "cpu", 1, scalar=True), device=True),),
)
ALL_OFF = ("autograd", "sparse", "checks")
CONFIGS = [
    TIES,
    variant(TIES, preferred="probe_b"),
    PRIORITIES,
    variant(PRIORITIES, preferred="probe_c"),
    variant(PRIORITIES, preferred="numpy_ref"),
    WRAPPERS,
    variant(WRAPPERS, off=("checks",)),
    variant(WRAPPERS, preferred="probe_w"),
    DEVICE_ONLY,
    variant(DEVICE_ONLY, off=("checks",)),
    DEVICE_FALLBACK,
    variant(DEVICE_FALLBACK, preferred="probe_dev_plugin"),
    variant(DEVICE_FALLBACK, off=ALL_OFF),
    DECLINING,
    variant(DECLINING, preferred="probe_dw"),
    variant(DECLINING, off=ALL_OFF),
    DECLINE_NOTHING,
    LAYERS,
    *(variant(LAYERS, off=(layer,)) for layer in ALL_OFF),
    variant(LAYERS, off=ALL_OFF),
]


# ---------------------------------------------------------------- the model


@dataclass(frozen=True, eq=False)
class Reg:
    """One registration as the model sees it."""

    op: str | None  # None for a fallback
    key: int
    kind: str  # "kernel", "wrapper" or "fallback"
    plugin: str
    priority: int
    order: int
    name: str  # how dump_table names it
    label: str  # what the trace records when it runs
    builtin: bool = False
    scalar: bool = False
    unchecked: bool = False


@dataclass(frozen=True)
class Slot:
    rule: int
    in_mask: bool
    error: type[Exception] | None = None  # raised by the slot itself
    marker: str = ""  # dump_table's text for a slot without kernels
    chain: tuple[Reg, ...] = ()  # wrappers outermost first, then the base
    checked: bool = False  # Note [Device check]
    variant: str = ""  # what op.table runs of the base: "" or "unchecked"
    scalar_variant: str = ""  # what op.scalar_table runs of the base: "" or "scalar"


FLOORS = {  # what serves below kernels that all declined, on a layer key and elsewhere
    key_is_autograd: Reg(None, 0, kind, "-", "-", 0, name, name)
    for key_is_autograd, kind, name in (
        (True, "fallthrough", "[fallthrough]"),
        (False, "missing", "[missing: NotImplementedError]"),
    )
}


class Outcome(NamedTuple):
    trace: tuple[tuple[str, int], ...]
    error: type[Exception] | None


class _Raises(Exception):
    def __init__(self, error):
        super().__init__(error.__name__)
        self.error = error


class BuiltinFallbackReached(Exception):
    """The model predicts that a built-in device fallback runs: the harness cannot
    observe it without running it, so key sets are chosen never to reach one."""


@dataclass
class Model:
    regs: list[Reg]
    devices: set[int]  # the active backend keys
    off: frozenset[str]
    preferred: str | None

    def beats(self, a: Reg, b: Reg) -> bool:
        """Note [Kernel priority]: does ``a`` rank above ``b``?"""
        if (a.plugin == self.preferred) != (b.plugin == self.preferred):
            return a.plugin == self.preferred
        if a.priority != b.priority:
            return a.priority > b.priority
        if a.plugin != b.plugin:
            return a.plugin < b.plugin
        return a.order < b.order

    def ranked(self, regs: list[Reg]) -> list[Reg]:
        """Best first, by repeatedly picking the one that beats every other."""
        rest, out = list(regs), []
        while rest:
            top = rest[0]
            for r in rest[1:]:
                if self.beats(r, top):
                    top = r
            out.append(top)
            rest = [r for r in rest if r is not top]
        return out

    def slot(self, op: str, key: int) -> Slot:
        """Note [Table entry precedence], rule by rule."""
        missing = Slot(5, True, NotImplementedError, "missing: NotImplementedError")
        if key in LAYER_OF and LAYER_OF[key] in self.off:  # rule 1
            if key == SPARSE:
                return Slot(1, True, RuntimeError, "off: RuntimeError")
            return Slot(1, False, marker="off: fallthrough")
        if key & BACKENDS and key not in self.devices:  # a device nobody provides now
            return missing
        here = [r for r in self.regs if r.op == op and r.key == key]
        kernels = self.ranked([r for r in here if r.kind in ("kernel", "decliner")])
        wrappers = [r for r in here if r.kind == "wrapper"]
        fallbacks = [r for r in self.regs if r.kind == "fallback" and r.key == key]
        decliners = []
        while kernels and kernels[0].kind == "decliner":
            decliners.append(kernels.pop(0))
        if kernels:  # rule 2
            rule, base = 2, kernels[0]
        elif key & BACKENDS and fallbacks:  # rule 3, or 2 when something declines to it
            rule, base = 2 if decliners else 3, self.ranked(fallbacks)[0]
        elif decliners:  # rule 2: they decline to nothing
            rule, base = 2, FLOORS[key in (AUTOGRAD, TRACER)]
        elif key in (AUTOGRAD, TRACER):  # rule 4
            return Slot(4, False, marker="fallthrough")
        else:  # rule 5
            return missing
        checked = key != CPU and bool(key & BACKENDS)
        own = rule == 2 and not wrappers and not decliners and not checked  # Note [Kernel variants]
        return Slot(
            rule,
            True,
            chain=(*self.ranked(wrappers), *decliners, base),
            checked=checked,
            variant="unchecked" if own and base.unchecked and "checks" in self.off else "",
            scalar_variant="scalar" if own and base.scalar else "",
        )

    def active_keys(self) -> list[int]:
        return [*sorted(self.devices), SPARSE, AUTOGRAD, TRACER]

    def mask(self, op: str) -> int:
        bits = (1 << b for b in range(TRACER.bit_length()))
        return sum(key for key in bits if self.slot(op, key).in_mask)

    def call(self, op: str, raw: int, scalar: bool = False) -> Outcome:
        trace: list[tuple[str, int]] = []
        try:
            self._run(op, raw & self.mask(op), scalar, trace)
        except _Raises as e:
            return Outcome(tuple(trace), e.error)
        return Outcome(tuple(trace), None)

    def _run(self, op: str, ks: int, scalar: bool, trace: list) -> None:
        if ks == 0:
            raise _Raises(NotImplementedError)
        key = 1 << (ks.bit_length() - 1)
        slot = self.slot(op, key)
        assert slot.in_mask, "a key outside the mask indexed the table"
        if slot.error is not None:
            raise _Raises(slot.error)
        if slot.checked and ks & BACKENDS & ~key:
            raise _Raises(ValueError)
        *links, base = slot.chain  # wrappers, then kernels that decline, then what serves
        trace += [(w.label, ks) for w in links]
        if base.kind == "missing":
            raise _Raises(NotImplementedError)
        if base.kind == "fallthrough":  # redispatches below, through op.table
            self._run(op, ks & ~key, False, trace)
            return
        if base.kind == "fallback":
            if base.builtin:
                raise BuiltinFallbackReached(f"{op}: {base.name}")
            trace.append((f"{base.label}[{op}]", ks))
            return
        var = slot.scalar_variant if scalar else slot.variant
        trace.append((f"{base.label}:{var}" if var else base.label, ks))
        if key in LAYER_OF and not base.builtin:  # a layer probe redispatches below its key
            self._run(op, ks & ~key, var == "scalar", trace)

    @staticmethod
    def link_name(r: Reg) -> str:
        return {"fallback": f"[fallback] {r.name}", "decliner": f"[declines] {r.name}"}.get(
            r.kind, r.name
        )

    def rows(self, op: str) -> list[tuple]:
        """dump_table's (key, kernel, plugin, priority, rule) as the model predicts them."""
        out = []
        for key in self.active_keys():
            s = self.slot(op, key)
            if len(s.chain) == 1:
                (r,) = s.chain
                row = (self.link_name(r), r.plugin, r.priority)
            elif s.chain:  # every column link by link, outermost first
                text = " -> ".join(self.link_name(r) for r in s.chain)
                row = (
                    text,
                    *(
                        " -> ".join(str(getattr(r, f)) for r in s.chain)
                        for f in ("plugin", "priority")
                    ),
                )
            else:
                row = (f"[{s.marker}]", "", "")
            out.append((keys.key_name(key), *row, s.rule))
        return out


# ---------------------------------------------------------------- built-ins, as data


@dataclass
class Baseline:
    regs: list[Reg]
    devices: set[int]


def _builtin(k: registry.Kernel, op: str | None, key: int, kind: str, label: str) -> Reg:
    scalar, unchecked = k.with_scalar is not None, k.unchecked is not None
    return Reg(op, key, kind, k.plugin, k.priority, k.order, k.name, label, True, scalar, unchecked)


def read_baseline() -> Baseline:
    """The built-in registrations (of OPS, and every fallback), as the model's data."""
    regs = []
    for (op, key), ks in registry.kernels.items():
        if op not in OPS:
            continue
        for k in ks:
            assert not k.wraps, "built-in wrappers are not modelled: pick other operators"
            regs.append(_builtin(k, op, key, "kernel", f"builtin:{k.name}"))
    for key, ks in registry.fallbacks.items():
        regs += [_builtin(k, None, key, "fallback", f"builtin:[fallback] {k.name}") for k in ks]
    devices = {k for k in keys.all_keys() if k & BACKENDS}
    return Baseline(regs, devices)


def key_of(device: str, probe_key: int) -> int:
    return {"cpu": CPU, DEVICE: probe_key, "sparse": SPARSE, "autograd": AUTOGRAD}[device]


def model_of(config: Config, base: Baseline, probe_key: int) -> Model:
    regs, devices = list(base.regs), set(base.devices)
    order = itertools.count(max([r.order for r in regs], default=0) + 1)
    for spec in config.plugins:
        if spec.adds_device:
            devices.add(probe_key)
        for i, p in enumerate(spec.probes):
            tag, key = spec.tag(i), key_of(p.device, probe_key)
            reg = Reg(p.op, key, p.kind, spec.name, p.priority, next(order), f"probe.{tag}", tag)
            regs.append(dataclasses.replace(reg, scalar=p.scalar, unchecked=p.unchecked))
    return Model(regs, devices, frozenset(config.off), config.preferred)


# ---------------------------------------------------------------- the real side


TRACE: list[tuple[str, int]] = []


def enter(fn, ks, args):
    """Call a slot (or what a wrapper wraps)."""
    return fn(ks, *args)


def builtin_stub(label: str, name: str):
    """Stands in for a built-in kernel (or variant) while a configuration is installed:
    records its label and returns, so no real kernel ever runs on the stand-in
    arguments -- whoever calls it (a slot, a wrapper, a layer probe, a declining
    kernel's slot)."""

    def stub(ks, *args):
        TRACE.append((label, ks))
        return stand_in(name, ks)

    return stub


@contextlib.contextmanager
def builtins_stubbed():
    """The built-in kernels of OPS replaced by stubs (names, priorities and order kept,
    so dumps and rankings are unchanged); restored afterwards."""
    saved = {}
    for (op, key), ks in registry.kernels.items():
        if op in OPS:
            saved[op, key] = list(ks)
            ks[:] = [
                dataclasses.replace(
                    k,
                    fn=builtin_stub(f"builtin:{k.name}", op),
                    with_scalar=k.with_scalar and builtin_stub(f"builtin:{k.name}:scalar", op),
                    unchecked=k.unchecked and builtin_stub(f"builtin:{k.name}:unchecked", op),
                    label=k.name,
                )
                for k in ks
            ]
    try:
        yield
    finally:
        for slot, ks in saved.items():
            registry.kernels[slot][:] = ks
        entries.rebuild()


def _named(fn, label):
    fn.__module__, fn.__qualname__, fn.__name__ = "probe", label, label
    return fn


def probe_kernel(tag: str, op, layer_key: int | None, var: str = ""):
    label = f"{tag}:{var}" if var else tag
    table = op.scalar_table if var == "scalar" else op.table  # the lists stay the same objects

    def kernel(ks, *args):
        TRACE.append((label, ks))
        if layer_key is not None:
            below = ks & ~layer_key
            return enter(table[below.bit_length()], below, args)
        return stand_in(op.name, ks)

    return _named(kernel, label)


def probe_decliner(tag: str):
    def kernel(ks, *args):
        TRACE.append((tag, ks))
        return NotImplemented

    return _named(kernel, tag)


def probe_wrapper(tag: str):
    def factory(inner):
        def wrapped(ks, *args):
            TRACE.append((tag, ks))
            return enter(inner, ks, args)

        return wrapped

    return _named(factory, tag)


def probe_fallback(tag: str):
    def fallback(op, ks, *args):
        TRACE.append((f"{tag}[{op.name}]", ks))
        return stand_in(op.name, ks)

    return _named(fallback, tag)


def _no_move(t):
    raise AssertionError("probe_dev tensors are never made")


def make_plugin(spec: PluginSpec):
    class ProbePlugin:
        @lm.backends.hookimpl
        def lamina_register_kernels(self, registry):
            if spec.adds_device:
                registry.add_device(DEVICE, to_cpu=_no_move, from_cpu=_no_move)
            for i, p in enumerate(spec.probes):
                tag = spec.tag(i)
                if p.kind == "fallback":
                    registry.register_fallback(p.device, probe_fallback(tag), p.priority)
                elif p.kind == "wrapper":
                    registry.register_wrapper(p.op, p.device, probe_wrapper(tag), p.priority)
                elif p.kind == "decliner":
                    registry.register(
                        p.op, p.device, probe_decliner(tag), p.priority, declines=True
                    )
                else:
                    op, layer = lm.dispatch.get(p.op), keys.LAYER_KEYS.get(p.device)
                    mk = functools.partial(probe_kernel, tag, op, layer)
                    registry.register(
                        p.op,
                        p.device,
                        mk(),
                        p.priority,
                        with_scalar=mk("scalar") if p.scalar else None,
                        unchecked=mk("unchecked") if p.unchecked else None,
                    )

    return ProbePlugin()


def _slot_id(fn):
    # error slots are closures, made afresh once a rebuild stopped using them
    missing = getattr(fn, "__qualname__", "") == "missing_kernel.<locals>.no_kernel"
    return "missing" if missing else fn


def snapshot() -> dict:
    return {
        name: (
            [_slot_id(f) for f in op.table],
            [_slot_id(f) for f in op.scalar_table],
            op.mask,
        )
        for name in OPS
        for op in [lm.dispatch.get(name)]
    }


@contextlib.contextmanager
def installed(config: Config):
    """Register the configuration's probe plugins, prefer and switch off what it says;
    afterwards everything is undone and the tables are as before."""
    assert registry.preferred_plugin is None and lm.layers.state() == lm.layers.DEFAULTS
    before, names = snapshot(), []
    stubs = builtins_stubbed()
    stubs.__enter__()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the ties are on purpose
            for spec in config.plugins:
                ok = lm.backends.register(make_plugin(spec), spec.name)
                if ok:
                    names.append(spec.name)
                assert ok, f"probe plugin {spec.name} failed to register"
        with contextlib.ExitStack() as stack:
            if config.preferred is not None:
                stack.enter_context(lm.backends.use(config.preferred))
            if config.off:
                stack.enter_context(lm.layers.off(*config.off))
            yield
    finally:
        for name in reversed(names):
            lm.backends.unregister(name)
        stubs.__exit__(None, None, None)
    assert registry.preferred_plugin is None and lm.layers.state() == lm.layers.DEFAULTS
    assert snapshot() == before, "the configuration left the dispatch tables changed"


def real_call(op, raw: int, scalar: bool) -> Outcome:
    TRACE.clear()
    ks = raw & op.mask
    table = op.scalar_table if scalar else op.table
    try:
        enter(table[ks.bit_length()], ks, args_of(op.name))
    except Exception as exc:
        return Outcome(tuple(TRACE), type(exc))
    return Outcome(tuple(TRACE), None)


def real_rows(name: str) -> list[tuple]:
    return [(*r[:4], int(r[4].split(":")[0])) for r in lm.dispatch.dump_table(name)]


# ---------------------------------------------------------------- comparing


def key_sets(probe_key: int, base: Baseline) -> list[int]:
    """Every subset of CPU, probe_dev, SPARSE, AUTOGRAD; and those carrying CPU or
    probe_dev again with each other device's bit (a device check must stop them)."""
    main = (CPU, probe_key, SPARSE, AUTOGRAD)
    others = sorted(base.devices - {CPU, probe_key})
    out = []
    for n in range(1 << len(main)):
        ks = sum(k for i, k in enumerate(main) if n >> i & 1)
        out.append(ks)
        if ks & (CPU | probe_key):
            out += [ks | o for o in others]
    return out


def compare(model: Model, probe_key: int, base: Baseline) -> tuple[list[str], int]:
    """(mismatches, number of comparisons) between the model and the real tables."""
    bad, n = [], 0
    for name in OPS:
        op = lm.dispatch.get(name)
        n += 1
        if op.mask != model.mask(name):
            bad.append(f"{name}: mask {op.mask:#x}, model {model.mask(name):#x}")
        got, want = real_rows(name), model.rows(name)
        n += len(want)
        if got != want:
            bad += [f"{name}: dump row {g}, model {w}" for g, w in zip(got, want) if g != w]
            if len(got) != len(want):
                bad.append(f"{name}: dump keys {[r[0] for r in got]}, model {[r[0] for r in want]}")
        for raw in key_sets(probe_key, base):
            for scalar in (False, True):
                n += 1
                expected = model.call(name, raw, scalar)
                actual = real_call(op, raw, scalar)
                if actual != expected:
                    table = "scalar_table" if scalar else "table"
                    bad.append(
                        f"{name} {table} {keys.keyset_names(raw)}: real {actual}, model {expected}"
                    )
    return bad, n


@pytest.fixture(scope="module")
def probe_key():
    """The key of probe_dev, reserved once (Note [Device keys]: it keeps its bit)."""
    got = {}

    class Reserve:
        @lm.backends.hookimpl
        def lamina_register_kernels(self, registry):
            got["key"] = registry.add_device(DEVICE, to_cpu=_no_move, from_cpu=_no_move)

    assert lm.backends.register(Reserve(), "probe_reserve_device")
    lm.backends.unregister("probe_reserve_device")
    return got["key"]


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.id)
def test_the_tables_agree_with_the_model(config, probe_key):
    base = read_baseline()
    model = model_of(config, base, probe_key)
    with installed(config):
        mismatches, n = compare(model, probe_key, base)
    assert n >= len(OPS) * (1 + 4 + 2 * 16), n  # mask, dump rows, both tables per key set
    assert not mismatches, f"{len(mismatches)} of {n} differ:\n" + "\n".join(mismatches[:20])


def test_the_configurations_cover_every_rule_and_outcome(probe_key):
    """The model alone: the configurations reach every rule and every kind of outcome."""
    base, seen = read_baseline(), set()
    for config in CONFIGS:
        model = model_of(config, base, probe_key)
        for name in OPS:
            for key in model.active_keys():
                s = model.slot(name, key)
                seen.add(f"rule {s.rule}" + (" wrapped" if len(s.chain) > 1 else ""))
                kinds = [r.kind for r in s.chain]
                if "decliner" in kinds:
                    seen.add(f"declines to {kinds[-1]}")
            for raw in key_sets(probe_key, base):
                for scalar in (False, True):
                    out = model.call(name, raw, scalar)
                    seen.add(out.error.__name__ if out.error else "returns")
                    for label, _ in out.trace:
                        seen.update(v for v in (":scalar", ":unchecked") if label.endswith(v))
                        seen.update(["fallback"] if label.endswith(f"[{name}]") else [])
                    if len(out.trace) > 1:
                        seen.add("more than one kernel runs")
    assert seen >= {
        *(f"rule {r}" for r in (1, 2, 3, 4, 5)),
        *("rule 2 wrapped", "rule 3 wrapped"),
        *("returns", "NotImplementedError", "ValueError", "RuntimeError"),
        *(":scalar", ":unchecked", "fallback", "more than one kernel runs"),
        *(f"declines to {k}" for k in ("kernel", "fallback", "fallthrough", "missing")),
    }, seen


def test_a_wrong_priority_rule_makes_the_comparison_fail(probe_key, monkeypatch):
    """The comparison can fail: ranking lower priorities first is caught."""
    base = read_baseline()
    model = model_of(PRIORITIES, base, probe_key)
    with installed(PRIORITIES):
        assert compare(model, probe_key, base)[0] == []

        def lowest_priority_first(e):
            return (e.plugin != registry.preferred_plugin, e.priority, e.plugin, e.order)

        monkeypatch.setattr(registry, "rank", lowest_priority_first)
        try:
            entries.rebuild()
            mismatches, _ = compare(model, probe_key, base)
        finally:
            monkeypatch.undo()
            entries.rebuild()
        assert compare(model, probe_key, base)[0] == []
    assert any(m.startswith("atan2: dump row ('CPU'") for m in mismatches), mismatches
    assert any(m.startswith("atan2 table ['CPU']") for m in mismatches), mismatches
