"""Table entries: which function serves each (operator, key), and why.

``compute_entry`` is the one place that decides (the role of PyTorch's
``computeDispatchTableEntryWithDebug``); ``rebuild`` fills every operator's table from
it (Note [Dispatch table] in ``schema.py``); ``dump.dump_table`` prints the reasons it
stored.

Note [Table entry precedence]: for operator ``op`` and key ``k``, the first rule that
applies decides:

1. ``k`` is the key of a layer that is switched off (lamina.layers): AUTOGRAD falls
   through (cleared from the mask); SPARSE raises (Note [Sparse layer off]).
2. A kernel is registered for (op, k): the best by rank (Note [Kernel priority]).
3. ``k`` is a device key with a fallback (Note [Backend fallback]): the best fallback,
   bound to the operator.
4. ``k`` is a layer key other than SPARSE -- AUTOGRAD, or a key a mode includes (Note
   [Modes]): falls through (for AUTOGRAD: the operator is not differentiable).
5. Otherwise the slot raises NotImplementedError naming the operator, the key and the
   keys that have kernels (backend keys and SPARSE never fall through silently).

Under rule 2, kernels that may decline (Note [Declining kernels]) serve above the best
kernel that may not, and decline to it (or, without one, to what rules 3 to 5 give).
Under rules 2 and 3 every wrapper registered for (op, k) wraps what serves, whatever
its priority (Note [Kernel wrappers]).

Then: the slot of a device key other than CPU checks the call's devices (Note [Device
check]); a kernel serving its slot unwrapped contributes its variants (Note [Kernel
variants]): ``with_scalar`` to the scalar table, ``unchecked`` while the checks layer
is off.

Note [Result checks]: what a kernel returns is checked against Note [Result rules]
(``results.py``) wherever that costs nothing measurable, so that a plugin's mistake is an
error naming its kernel and plugin (KernelResultError), not a wrong result or an
AttributeError three calls later:

* the slot of a device key other than CPU, a device check already, checks every
  result's type and device, and on its first call its dtype and shape too;
* the slot of the CPU or of a layer key that a plugin's kernel or wrapper serves checks
  its first result completely, then puts the bare kernel in its own place in the table.
  The built-in plugins' kernels (tested against the rules) are not checked: the CPU
  hot path stays exactly the kernel;
* ``lamina.backends.check_kernels()`` (or ``LAMINA_CHECK_KERNELS=1``) checks every
  result of every link of every chain, built-in ones included, for debugging.

Note [Backend fallback]: a device may register one fallback ``fn(op, ks, *args)`` (as
PyTorch's backend fallbacks): every operator without a kernel for that device gets a
slot that calls it with the operator. ``lamina.backends.cpu_fallback`` is the usual
one: convert to CPU, run the CPU kernel, convert back.

Note [Device check]: the slot of every device key other than CPU checks that the call
has no other backend bit set (a tensor of another device) and raises a ValueError
naming both devices. CPU's slot needs no check (Note [Key priority]: CPU is the lowest
bit, so a call reaches it only when every tensor is on the CPU): the CPU hot path is
exactly the kernel. Slots are built once and cached, so a rebuild that changes nothing
leaves every table entry the identical object.

Note [Kernel wrappers]: a kernel registered with ``wraps=True`` is a factory
``fn(next_kernel) -> kernel``; at table-build time it receives the kernel (or fallback)
that would serve the slot without it -- for instrumentation or a pre/post-processing
step that delegates. Wrappers are ranked against each other only (Note [Kernel
priority]: the best is outermost) and always sit above the kernel or fallback that
serves, so no kernel's priority, name or preference can make a wrapper silently
inactive. The one exception is a slot with nothing to wrap (rules 1, 4 and 5): its
wrappers are inactive, and lamina.backends warns when such a wrapper is registered.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import keys, layers, results
from . import registry as R
from .schema import OPERATORS, Operator
from .tensor import Tensor


@dataclass(frozen=True)
class Entry:
    """What serves one (operator, key), and which rule of Note [Table entry
    precedence] decided it."""

    slot: Callable  # what op.table holds
    scalar_slot: Callable  # what op.scalar_table holds
    in_mask: bool
    rule: int
    reason: str
    chain: tuple[R.Kernel, ...] = ()  # what serves, outermost first (wrappers, then base)


# > 0: every result of every kernel is checked (Note [Result checks]);
# lamina.backends.check_kernels() or LAMINA_CHECK_KERNELS=1
check_all = int(os.environ.get("LAMINA_CHECK_KERNELS", "0") == "1")
broken: dict[str, tuple[Exception, R.Kernel]] = {}  # plugin -> (error, wrapper that raised)
_slot_cache: dict[tuple, Callable] = {}
_used: dict[tuple, Callable] = {}


def _cached(cache_key: tuple, make: Callable[[], Callable]) -> Callable:
    fn = _slot_cache.get(cache_key)
    if fn is None:
        fn = make()
    _slot_cache[cache_key] = _used[cache_key] = fn
    return fn


def _sparse_layer_off(op: Operator) -> Callable:
    """Note [Sparse layer off]: switching the sparse layer off does not make SPARSE a
    fallthrough: a sparse tensor's storage is not an array, and a dense kernel handed
    one would fail obscurely or compute garbage. Its slot raises instead and the bit
    stays in the mask. Dense calls never carry the bit, so on or off they index the
    same slot as before: the switch costs them nothing either way."""

    def sparse_layer_off(ks, *args, **kwargs):
        raise RuntimeError(
            f"{op.name}: got a sparse input, but the sparse layer is off "
            "(lamina.layers.enable('sparse') turns it back on)"
        )

    return sparse_layer_off


def missing_kernel(op: Operator, key: int) -> Callable:
    def no_kernel(ks, *args, **kwargs):
        have = [keys.key_name(k) for k, e in op.entries.items() if e.rule in (2, 3)]
        what = "no key" if key == 0 else f"key {keys.key_name(key)}"
        if key & keys.BACKEND_MASK and key not in keys.all_keys():
            what += " (a device key that no registered plugin provides now)"
        if key == keys.SPARSE:
            what += (
                f": {op.name} has no sparse kernel, and sparse inputs are never "
                "densified silently (convert with .to_dense() first)"
            )
        raise NotImplementedError(
            f"operator {op.name!r} has no kernel for {what} (the call's keys: "
            f"{', '.join(keys.keyset_names(ks)) or 'none'}); keys with kernels: "
            f"{', '.join(have) or 'none'}"
        )

    return no_kernel


def _bind_fallback(op: Operator, fallback: Callable) -> Callable:
    def fallback_kernel(ks, *args, **kwargs):
        return fallback(op, ks, *args, **kwargs)

    fallback_kernel.__qualname__ = f"fallback_kernel[{op.name}]"
    return fallback_kernel


def _device_mismatch(op: Operator, ks: int) -> ValueError:
    names = keys.device_names(ks)
    return ValueError(
        f"{op.name}: expected all tensors on one device, got tensors on "
        f"{' and '.join(names)}; move them to one device first, e.g. with "
        f"x.to({names[0]!r})"
    )


def _kernel_text(chain: tuple[R.Kernel, ...]) -> str:
    return " -> ".join(f"{k.name} (plugin {k.plugin!r})" for k in chain if k.plugin != "-")


def _check_result(
    op: Operator, key: int, chain: tuple, ks: int, args: tuple, out: Any, full: bool
) -> None:
    """Note [Result checks]: raise KernelResultError naming the kernel chain that
    returned ``out`` when ``results.problem`` finds something wrong with it."""
    why = results.problem(op, ks, args, out, full)
    if why is not None:
        raise results.KernelResultError(
            f"{op.name}: the kernel {_kernel_text(chain)}, serving {op.name} on "
            f"{keys.key_name(key)}, {why}"
        )


def _device_check(op: Operator, key: int, fn: Callable, chain: tuple) -> Callable:
    """Note [Device check] and Note [Result checks]: the call's devices before ``fn``;
    after it, that the result is a tensor of the device (every call: two comparisons)
    and, on the slot's first call, that its dtype and shape follow the rules."""
    others, mask, first = keys.BACKEND_MASK & ~key, keys.BACKEND_MASK, True

    def checked(ks, *args, **kwargs):
        nonlocal first
        if ks & others:  # Note [Device check]
            raise _device_mismatch(op, ks)
        out = fn(ks, *args, **kwargs)
        if first or out.__class__ is not Tensor or out._ks & mask != key:
            _check_result(op, key, chain, ks, args, out, first)
            first = False
        return out

    checked.__qualname__ = f"device_checked[{op.name}, {keys.key_name(key)}]"
    return checked


def _first_call_checked(op: Operator, key: int, fn: Callable, chain: tuple, which: str) -> Callable:
    """Note [Result checks]: the slot of a plugin's kernel on the CPU or a layer key
    checks the result of its first call (type, device, dtype, shape), then puts the
    bare kernel in its place in ``op.<which>``: free afterwards."""
    index, done = key.bit_length(), False

    def first_call(ks, *args):
        nonlocal done
        if done:  # someone kept this slot (the direct bindings): no more checks
            return fn(ks, *args)
        out = fn(ks, *args)
        _check_result(op, key, chain, ks, args, out, True)
        done = True
        with R.lock:  # a rebuild may have replaced the slot meanwhile: leave it then
            table = getattr(op, which)
            if table[index] is first_call:
                table[index] = fn
        return out

    first_call.__qualname__ = f"first_call_checked[{op.name}, {keys.key_name(key)}]"
    return first_call


def _link_checked(op: Operator, key: int, link: R.Kernel, fn: Callable) -> Callable:
    """Debug mode (Note [Result checks]): every result of one link of a chain checked
    against the rules, naming that link (a declining kernel may return NotImplemented)."""

    def link_checked(ks, *args):
        out = fn(ks, *args)
        if not (out is NotImplemented and link.declines):
            _check_result(op, key, (link,), ks, args, out, True)
        return out

    link_checked.__qualname__ = f"result_checked[{link.name}]"
    return link_checked


def _wrap(wrapper: R.Kernel, inner: Callable) -> Callable:
    fn = wrapper.fn(inner)
    if not callable(fn):
        raise TypeError(f"kernel wrapper {wrapper.name} returned {type(fn).__name__}, not a kernel")
    return fn


def _declining(fn: Callable, name: str, below: Callable) -> Callable:
    """Note [Declining kernels]: a kernel registered with ``declines=True`` may return
    ``NotImplemented`` for a call it does not handle (a dtype, a layout); the kernel
    ranked below it (or the fallback, or the missing-kernel error) serves it then."""

    def declining(ks, *args):
        out = fn(ks, *args)
        return below(ks, *args) if out is NotImplemented else out

    declining.__qualname__ = f"declining[{name}]"
    return declining


def _apply_wrappers(
    op: Operator, key: int, wrappers: list[R.Kernel], serving: tuple, fn: Callable, debug: bool
) -> tuple[Callable, tuple[R.Kernel, ...]]:
    chain = list(serving)
    for w in reversed(wrappers):  # the lowest-ranked wrapper is innermost
        try:
            fn = _cached((op.name, key, "wrap", w.fn, fn), lambda w=w, fn=fn: _wrap(w, fn))
        except Exception as exc:  # skipped; lamina.backends warns and drops the plugin
            broken.setdefault(w.plugin, (exc, w))
            continue
        if debug:
            fn = _cached(
                (op.name, key, "debug", fn), lambda w=w, fn=fn: _link_checked(op, key, w, fn)
            )
        chain.insert(0, w)
    return fn, tuple(chain)


def compute_entry(op: Operator, key: int) -> Entry:
    """The entry of ``key`` in ``op``'s table (Note [Table entry precedence])."""
    layer = keys.layer_of(key)
    if layer is not None and layers.is_off(layer):  # rule 1
        if key == keys.SPARSE:
            slot = _cached((op.name, key, "sparse off"), lambda: _sparse_layer_off(op))
            return Entry(slot, slot, True, 1, "sparse layer off: raises RuntimeError")
        slot = _cached((op.name, key, "missing"), lambda: missing_kernel(op, key))
        return Entry(slot, slot, False, 1, f"{layer} layer off: falls through")
    ranked = sorted(R.kernels.get((op.name, key), ()), key=R.rank)
    wrappers = [e for e in ranked if e.wraps]
    kernels = [e for e in ranked if not e.wraps]
    # Note [Declining kernels]: kernels that may decline serve above the first that
    # may not; what they decline goes to the next one down
    stop = next((i for i, e in enumerate(kernels) if not e.declines), len(kernels))
    decliners, kernels = kernels[:stop], kernels[stop:]
    if kernels:  # rule 2
        rule, base = 2, kernels[0]
        fn, reason = base.fn, f"kernel of {base.plugin!r} (priority {base.priority})"
    elif key & keys.BACKEND_MASK and R.fallbacks.get(key):  # rule 3 (or 2, declining to it)
        rule, best = 3, min(R.fallbacks[key], key=R.rank)
        fn = _cached((op.name, key, "fallback", best.fn), lambda: _bind_fallback(op, best.fn))
        base = R.Kernel(fn, best.plugin, best.priority, best.order, label=f"[fallback] {best.name}")
        reason = f"fallback of device {keys.key_name(key)!r} from {best.plugin!r}"
    elif decliners:  # rule 2, with nothing below what declines
        rule, (label, reason) = 2, _FLOORS[keys.falls_through(key)]
        fn = _cached((op.name, key, "floor"), lambda: _floor(op, key))
        base = R.Kernel(fn, "-", "-", 0, label=label)  # no plugin: lamina's floor
    elif keys.falls_through(key):  # rule 4
        slot = _cached((op.name, key, "missing"), lambda: missing_kernel(op, key))
        what = "not differentiable" if key == keys.AUTOGRAD else "nothing to do"
        reason = f"no {keys.layer_of(key)} kernel: {what}, falls through"
        return Entry(slot, slot, False, 4, reason)
    else:  # rule 5
        slot = _cached((op.name, key, "missing"), lambda: missing_kernel(op, key))
        return Entry(slot, slot, True, 5, "no kernel: raises NotImplementedError")
    debug = check_all > 0
    if debug and base.plugin != "-":
        fn = _cached((op.name, key, "debug", fn), lambda fn=fn: _link_checked(op, key, base, fn))
    for d in reversed(decliners):
        dfn = (
            d.fn
            if not debug
            else _cached((op.name, key, "debug", d.fn), lambda d=d: _link_checked(op, key, d, d.fn))
        )
        fn = _cached(
            (op.name, key, "declines", dfn, fn),
            lambda d=d, dfn=dfn, fn=fn: _declining(dfn, d.name, fn),
        )
        rule, reason = 2, f"kernel of {d.plugin!r} (priority {d.priority}), declining to {reason}"
    slot, chain = _apply_wrappers(op, key, wrappers, (*decliners, base), fn, debug)
    if len(chain) > len(decliners) + 1:
        reason += ", wrapped by " + ", ".join(repr(w.plugin) for w in chain if w.wraps)
    own = chain == (base,) and rule == 2  # Note [Kernel variants]
    if key != keys.CPU and key & keys.BACKEND_MASK:
        slot = _cached(
            (op.name, key, "check", slot), lambda s=slot: _device_check(op, key, s, chain)
        )
        own = False
        reason += ", device-checked"
    scalar_slot = slot
    if own:
        if base.with_scalar is not None:
            scalar_slot = base.with_scalar
            if debug:
                scalar_slot = _cached(
                    (op.name, key, "debug", scalar_slot),
                    lambda: _link_checked(op, key, base, base.with_scalar),
                )
        if layers.is_off("checks") and base.unchecked is not None:
            slot = base.unchecked  # Note [Unchecked fast path]
            if debug:
                slot = _cached(
                    (op.name, key, "debug", slot),
                    lambda: _link_checked(op, key, base, base.unchecked),
                )
            reason += ", unchecked (checks layer off)"
    plugins = any(k.plugin not in R.builtin for k in chain if k.plugin != "-")
    if debug:
        reason += ", every result checked (check_kernels)"
    elif plugins and (key & keys.BACKEND_MASK == 0 or key == keys.CPU):  # Note [Result checks]
        slot, scalar_slot = (
            _cached(
                (op.name, key, "first", which, s),
                lambda s=s, which=which: _first_call_checked(op, key, s, chain, which),
            )
            for s, which in ((slot, "table"), (scalar_slot, "scalar_table"))
        )
        reason += ", first result checked"
    return Entry(slot, scalar_slot, True, rule, reason, chain)


_FLOORS = {  # (dump label, reason) of what serves below kernels that all declined
    False: ("[missing: NotImplementedError]", "nothing: raises NotImplementedError"),
    True: ("[fallthrough]", "nothing: falls through the layer"),
}


def _floor(op: Operator, key: int) -> Callable:
    """What serves below kernels that all declined: a layer key redispatches below
    itself (as a fallthrough would), any other key has no kernel."""
    if not keys.falls_through(key):
        return missing_kernel(op, key)
    below, table = ~key, op.table

    def fallthrough(ks, *args):
        ks &= below
        return table[ks.bit_length()](ks, *args)

    return fallthrough


def rebuild_op(op: Operator) -> None:
    all_keys = keys.all_keys()
    entries = {key: compute_entry(op, key) for key in all_keys}
    none = _cached((op.name, 0, "missing"), lambda: missing_kernel(op, 0))
    table, scalar_table, mask = [none], [none], 0
    for bit in range(max(all_keys).bit_length()):
        key = 1 << bit
        entry = entries.get(key)
        if entry is None:  # a device key no registered plugin provides now: rule 5
            slot = _cached((op.name, key, "missing"), lambda k=key: missing_kernel(op, k))
            entry = Entry(slot, slot, True, 5, "no kernel: raises NotImplementedError")
        table.append(entry.slot)
        scalar_table.append(entry.scalar_slot)
        if entry.in_mask:
            mask |= key
    _install(op, (entries, table, scalar_table, mask))


def _install(op: Operator, tables: tuple) -> None:
    """Make (entries, table, scalar table, mask) op's."""
    entries, table, scalar_table, mask = tables
    # Note [Rebuild order]: calls in other threads go on while a table is rebuilt, so a
    # key leaves the mask before its slot changes and joins it after: no call indexes a
    # slot whose key is in the mask but whose entry is not (the lists are replaced in
    # place, each in one step: bindings hold the lists themselves)
    op.entries = entries
    op.mask &= mask
    op.table[:] = table
    op.scalar_table[:] = scalar_table
    op.mask = mask


# Note [Generation]: the number of table rebuilds so far. Whatever is derived from the
# tables -- a compiled plan, a cached choice of kernels -- records it and is stale once
# it differs: every registration, plugin load, layer switch, preferred backend and
# priority change goes through rebuild().
generation = 0


def rebuild() -> None:
    """Recompute every operator's table and mask (registration time, never per call)."""
    with R.lock:
        _preferences.clear()
        _rebuild()


# Note [Preference snapshots]: ``lm.backends.use`` changes only which plugin is
# preferred (Note [Preferred plugin]), and a test or a comparison switches back and
# forth between the same few: so the tables of each preference seen since the tables
# were last computed are kept, and switching to one of them installs its tables again
# instead of computing every entry (13 ms, twice per ``use`` block, now 0.25 ms per
# block: most of the time of an elementwise test comparing against numpy_ref). Anything
# else that changes what tables hold -- a registration, a plugin loaded, a layer
# switched, a priority, check_kernels -- goes through rebuild(), which forgets them all;
# so does a kernel registered since (the registrations' order counter moved).
_preferences: dict[str | None, list[tuple]] = {}  # plugin -> every (operator, its tables)
_computed_at = -1  # the registrations' order counter when the tables were computed


def rebuild_preferring(before: str | None) -> None:
    """rebuild() after the preferred plugin changed from ``before`` (the tables') to
    ``R.preferred_plugin``, from a snapshot where one is kept (Note [Preference
    snapshots])."""
    global generation
    with R.lock:
        if R._order != _computed_at or any(len(k) != len(OPERATORS) for k in _preferences.values()):
            _preferences.clear()  # kernels or operators added since
        elif before not in _preferences:
            _preferences[before] = [
                (op, (op.entries, list(op.table), list(op.scalar_table), op.mask))
                for op in OPERATORS.values()
            ]
        kept = _preferences.get(R.preferred_plugin)
        if kept is None:
            _rebuild()
            return
        generation += 1
        for op, tables in kept:
            _install(op, tables)


def _rebuild() -> None:
    global _slot_cache, generation, _computed_at
    generation += 1
    _computed_at = R._order
    _used.clear()
    for op in OPERATORS.values():
        rebuild_op(op)
    # slots built from removed kernels are forgotten; error slots are kept, so that a
    # key that comes back to "missing" gets the identical slot again
    _slot_cache = {k: f for k, f in _slot_cache.items() if k[2] == "missing"} | _used


def describe(entry: Entry) -> Any:
    """(kernel text, plugin, priority) of an entry, as dumps show it; a chain of
    wrappers reads outermost first, each column link by link (``a -> b``)."""
    if not entry.chain:
        marker = (
            "off: RuntimeError"
            if entry.rule == 1 and entry.in_mask
            else "off: fallthrough"
            if entry.rule == 1
            else "fallthrough"
            if entry.rule == 4
            else "missing: NotImplementedError"
        )
        return (f"[{marker}]", "", "")
    links = [
        (f"[declines] {k.name}" if k.declines else k.name, k.plugin, k.priority)
        for k in entry.chain
    ]
    if len(links) == 1:
        return links[0]
    return tuple(" -> ".join(str(link[i]) for link in links) for i in range(3))
