"""Operators, kernel registrations and their precomputed dispatch tables.

Note [Dispatch table]: each Operator owns ``table`` (a list indexed by the highest set
bit of a key set, i.e. ``ks.bit_length()``) and ``mask`` (the keys that take part in
its dispatch). The hot path is::

    ks = (a._ks | b._ks) & op.mask
    return op.table[ks.bit_length()](ks, a, b)

Tables and masks are recomputed by ``rebuild()`` only when a kernel is registered or
removed, a layer is switched, or the preferred backend changes; the call path never
looks anything up by name.

Note [Fallthrough]: a layer key (SPARSE, AUTOGRAD) that is switched off is cleared from
every mask, so a call skips it at no cost (SPARSE raises instead: Note [Sparse layer
off]). AUTOGRAD also falls through for operators
without an autograd kernel (they are not differentiable). Backend keys and SPARSE never
fall through silently: without a kernel their table slot holds an error kernel that
names the operator, the key and the keys that do have kernels.

Note [Backend fallback]: a device may register one fallback ``fn(op, ks, *args)`` (as
PyTorch's backend fallbacks): every operator without a kernel for that device gets,
at table-build time, a slot that calls it with the operator. ``lamina.backends.
cpu_fallback`` is the usual one: convert to CPU, run the CPU kernel, convert back.

Note [Device check]: the slot of every device key other than CPU checks that the call
has no other backend bit set (a tensor of another device) and raises a ValueError
naming both devices. CPU's slot needs no check (Note [Key priority]: CPU is the lowest
bit, so a call reaches it only when every tensor is on the CPU): the CPU hot path is
exactly the kernel. Slots are built once and cached (``_slot_cache``), so a rebuild
that changes nothing leaves every table entry the identical object.

Note [Kernel wrappers]: a kernel registered with ``wraps=True`` is a factory
``fn(next_kernel) -> kernel``; at table-build time it receives the kernel (or
fallback) that would serve the slot without it — for instrumentation or a
pre/post-processing step that delegates. Without anything below it, it is skipped.
"""
from dataclasses import dataclass, field

from . import keys


@dataclass
class Kernel:
    fn: object
    plugin: str
    priority: int
    order: int  # registration order, only for stable tie-breaking
    wraps: bool = False  # fn is a factory fn(next_kernel) -> kernel (Note [Kernel wrappers])
    label: str = None  # how dumps show it, when not its function's name

    @property
    def name(self):
        if self.label is not None:
            return self.label
        fn = self.fn
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


@dataclass(eq=False)
class Operator:
    name: str
    signature: str
    kind: str  # unary, binary, reduction, view, creation, ...
    differentiable: bool
    inplace_of: str = None  # "add_" names "add"
    doc: str = ""
    info: object = None  # what dispatch/operators.py says of dtypes and results
    table: list = field(default_factory=list, repr=False)
    scalar_table: list = field(default_factory=list, repr=False)  # Note [Kernel variants]
    mask: int = 0
    winners: dict = field(default_factory=dict, repr=False)  # key -> Kernel, for dumps

    def __call__(self, *args):
        """Dispatch with the key set of the tensor arguments (slow, generic path)."""
        ks = keyset(args) & self.mask
        return self.table[ks.bit_length()](ks, *args)


def keyset(args):
    """The union of the key sets of all tensors among ``args`` (lists searched too)."""
    ks = 0
    for a in args:
        k = getattr(a, "_ks", None)
        if k is not None:
            ks |= k
        elif type(a) in (list, tuple):
            ks |= keyset(a)
    return ks


OPERATORS = {}  # name -> Operator
_kernels = {}  # (op name, key bit) -> [Kernel]
_fallbacks = {}  # device key bit -> [Kernel] (Note [Backend fallback])
_slot_cache = {}  # (op name, key, what, functions...) -> built slot (Note [Device check])
_order = 0
_disabled_layers = set()
_preferred_plugin = None


def define(name, signature, kind, differentiable=False, inplace_of=None, doc=""):
    if name in OPERATORS:
        raise ValueError(f"operator {name!r} is defined twice")
    op = Operator(name, signature, kind, differentiable, inplace_of, doc)
    OPERATORS[name] = op
    return op


def get(name):
    try:
        return OPERATORS[name]
    except KeyError:
        import difflib
        close = difflib.get_close_matches(str(name), OPERATORS, n=3)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"unknown operator {name!r}{hint}; operators are listed in "
                         "lamina.dispatch.OPERATORS") from None


def register_kernel(op_name, key, fn, plugin, priority=0, wraps=False):
    """Record a kernel for (operator, key); call ``rebuild()`` to make it active."""
    global _order
    get(op_name)  # unknown operator names are an error, not a silent new entry
    _order += 1
    _kernels.setdefault((op_name, key), []).append(Kernel(fn, plugin, priority, _order,
                                                          wraps))


def register_fallback(key, fn, plugin, priority=0):
    """Record a device's fallback (Note [Backend fallback]); ``rebuild()`` activates it."""
    global _order
    if key not in keys.all_keys() or not key & keys.BACKEND_MASK:
        raise ValueError(f"a fallback needs a registered device key, got {key:#x}")
    _order += 1
    _fallbacks.setdefault(key, []).append(Kernel(fn, plugin, priority, _order))


def unregister_plugin(plugin):
    """Drop every kernel that ``plugin`` registered; the next rebuild restores others."""
    dropped = set()
    for registry in (_kernels, _fallbacks):
        for k, entries in list(registry.items()):
            dropped.update(id(e.fn) for e in entries if e.plugin == plugin)
            entries[:] = [e for e in entries if e.plugin != plugin]
            if not entries:
                del registry[k]
    while True:  # slots built from a dropped function, and slots built from those
        stale = [k for k in _slot_cache if any(id(f) in dropped for f in k[3:])]
        if not stale:
            break
        dropped.update(id(_slot_cache.pop(k)) for k in stale)


def kernels_of(plugin):
    """(op name, key, Kernel) of every kernel of ``plugin``; op name None for fallbacks."""
    return ([(op, key, e) for (op, key), es in _kernels.items() for e in es
             if e.plugin == plugin]
            + [(None, key, e) for key, es in _fallbacks.items() for e in es
               if e.plugin == plugin])


def ties(plugin):
    """(op name, key, other plugin, priority) wherever ``plugin`` and another plugin
    register the same slot (kernel or fallback) at the same priority: resolved by
    plugin name (Note [Kernel priority]), but worth a warning."""
    found = []
    for op, key, e in kernels_of(plugin):
        entries = _kernels[op, key] if op is not None else _fallbacks[key]
        found += [(op, key, o.plugin, e.priority) for o in entries
                  if o.plugin != plugin and o.priority == e.priority and o.wraps == e.wraps]
    return found


def _rank(e):
    # Note [Kernel priority]: the preferred backend (lm.backends.use) beats priority;
    # then higher priority; then the plugin name (alphabetical), then registration
    # order, so ties never depend on the order plugins were loaded in.
    return (e.plugin != _preferred_plugin, -e.priority, e.plugin, e.order)


def _winner(entries):
    return min(entries, key=_rank)


def _sparse_layer_off(op):
    """Note [Sparse layer off]: switching the sparse layer off does not make SPARSE a
    fallthrough: a sparse tensor's storage is not an array, and a dense kernel handed
    one would fail obscurely or compute garbage. Its slot raises instead and the bit
    stays in the mask. Dense calls never carry the bit, so on or off they index the
    same slot as before: the switch costs them nothing either way."""
    def sparse_layer_off(ks, *args, **kwargs):
        raise RuntimeError(f"{op.name}: got a sparse input, but the sparse layer is off "
                           "(lamina.dispatch.table.set_layer('sparse', True) turns it "
                           "back on)")
    return sparse_layer_off


def _missing_kernel(op, key):
    def no_kernel(ks, *args, **kwargs):
        have = [keys.key_name(k) for k in keys.all_keys() if k in op.winners]
        what = "no key" if key == 0 else f"key {keys.key_name(key)}"
        if key & keys.BACKEND_MASK and key not in keys.all_keys():
            what += " (a device key that no registered plugin provides now)"
        if key == keys.SPARSE:
            what += (f": {op.name} has no sparse kernel, and sparse inputs are never "
                     "densified silently (convert with .to_dense() first)")
        raise NotImplementedError(
            f"operator {op.name!r} has no kernel for {what} (the call's keys: "
            f"{', '.join(keys.keyset_names(ks)) or 'none'}); keys with kernels: "
            f"{', '.join(have) or 'none'}")
    return no_kernel


def _cached(cache_key, make):
    fn = _slot_cache.get(cache_key)
    if fn is None:
        fn = _slot_cache[cache_key] = make()
    return fn


def _bind_fallback(op, fallback):
    def fallback_kernel(ks, *args, **kwargs):
        return fallback(op, ks, *args, **kwargs)
    fallback_kernel.__qualname__ = f"fallback_kernel[{op.name}]"
    return fallback_kernel


def _device_mismatch(op, ks):
    names = keys.device_names(ks)
    return ValueError(f"{op.name}: expected all tensors on one device, got tensors on "
                      f"{' and '.join(names)}; move them to one device first, e.g. with "
                      f"x.to({names[0]!r})")


def _device_check(op, key, fn):
    others = keys.BACKEND_MASK & ~key

    def checked(ks, *args, **kwargs):
        if ks & others:  # Note [Device check]
            raise _device_mismatch(op, ks)
        return fn(ks, *args, **kwargs)
    checked.__qualname__ = f"device_checked[{op.name}, {keys.key_name(key)}]"
    return checked


broken = {}  # plugin -> the error its kernel wrapper raised at table-build time


def _wrap(wrapper, inner):
    fn = wrapper.fn(inner)
    if not callable(fn):
        raise TypeError(f"kernel wrapper {wrapper.name} returned {type(fn).__name__}, "
                        "not a kernel")
    return fn


def _serve(op, key):
    """(the Kernel dumps show, the table slot's function) for ``key`` of ``op``, or None.

    The best kernel by _rank serves; wrappers ranked above it wrap it (Note [Kernel
    wrappers]); a device key without kernels gets its fallback (Note [Backend
    fallback]); device keys other than CPU get the device check (Note [Device check])."""
    wrappers, base = [], None
    for e in sorted(_kernels.get((op.name, key), ()), key=_rank):
        if not e.wraps:
            base = e
            break
        wrappers.append(e)
    if base is None and key & keys.BACKEND_MASK and _fallbacks.get(key):
        fb = _winner(_fallbacks[key])
        fn = _cached((op.name, key, "fallback", fb.fn), lambda: _bind_fallback(op, fb.fn))
        base = Kernel(fn, fb.plugin, fb.priority, fb.order, label=f"[fallback] {fb.name}")
    if base is None:
        return None
    shown, fn = base, base.fn
    for w in reversed(wrappers):
        try:
            wrapped = _cached((op.name, key, "wrap", w.fn, fn), lambda w=w, fn=fn: _wrap(w, fn))
        except Exception as exc:  # skipped; lamina.backends warns and drops the plugin
            broken.setdefault(w.plugin, exc)
            continue
        fn = wrapped
        shown = Kernel(fn, w.plugin, w.priority, w.order, label=f"{w.name} -> {shown.name}")
    slot = fn
    if key != keys.CPU and key & keys.BACKEND_MASK:
        slot = _cached((op.name, key, "check", fn), lambda: _device_check(op, key, fn))
    return shown, slot, slot is base.fn


def _rebuild_op(op):
    all_keys = keys.all_keys()
    served = {k: s for k in all_keys if (s := _serve(op, k)) is not None}
    op.winners = {k: shown for k, (shown, _, _) in served.items()}
    table = [_missing_kernel(op, 0)]
    scalar_table = table[:]
    mask = 0
    for bit in range(max(all_keys).bit_length()):
        key = 1 << bit
        layer_off = any(key == keys.LAYER_KEYS.get(n) for n in _disabled_layers)
        winner = op.winners.get(key)
        kernel = served[key][1] if winner else _missing_kernel(op, key)
        # Note [Kernel variants]: a registered kernel serving its slot unwrapped may
        # offer ``unchecked`` (the checks layer off) and ``with_scalar`` (a Python
        # scalar operand); a wrapper, a device check or a fallback serves every call
        # itself, whatever attributes functools.wraps copied onto it.
        own = winner is not None and served[key][2]
        if own and "checks" in _disabled_layers:  # Note [Unchecked fast path]
            kernel = getattr(kernel, "unchecked", kernel)
        table.append(kernel)
        scalar_table.append(getattr(kernel, "with_scalar", kernel) if own else kernel)
        if not layer_off and (winner or key != keys.AUTOGRAD):
            mask |= key
        elif layer_off and key == keys.SPARSE:  # Note [Sparse layer off]
            table[-1] = scalar_table[-1] = _sparse_layer_off(op)
            mask |= key
    op.table[:] = table  # in place: bindings may hold the list itself
    op.scalar_table[:] = scalar_table
    op.mask = mask


def rebuild():
    """Recompute every operator's table and mask (registration time, never per call)."""
    for op in OPERATORS.values():
        _rebuild_op(op)


def set_layer(name, enabled):
    """Switch a table-level layer: a layer key, or "checks" (kernels' unchecked variants)."""
    if name not in keys.LAYER_KEYS and name != "checks":
        raise ValueError(f"unknown layer {name!r}; table layers: "
                         f"{', '.join([*keys.LAYER_KEYS, 'checks'])}")
    (_disabled_layers.discard if enabled else _disabled_layers.add)(name)
    rebuild()


def set_preferred_plugin(plugin):
    global _preferred_plugin
    previous, _preferred_plugin = _preferred_plugin, plugin
    rebuild()
    return previous


class TableDump(list):
    """Rows of (key, kernel, plugin, priority); prints as an aligned table."""

    def __init__(self, op, rows):
        super().__init__(rows)
        self.op = op

    def __str__(self):
        head = ("key", "kernel", "plugin", "priority")
        rows = [head] + [tuple(str(c) for c in r) for r in self]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [f"dispatch table of {self.op.name}{self.op.signature}  (mask {self.op.mask:#x})"]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(2, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    __repr__ = __str__


def dump_table(name):
    """Each key -> the kernel that serves it and the plugin that provided it.

    Keys with no kernel show how a call with that key is handled: an error, or
    fallthrough to the keys below (a layer that is off, or an operator that is not
    differentiable)."""
    op = get(name)
    rows = []
    for key in keys.all_keys():
        w = op.winners.get(key)
        if key == keys.SPARSE and "sparse" in _disabled_layers:  # Note [Sparse layer off]
            rows.append((keys.key_name(key), "[off: RuntimeError]", "", ""))
        elif not op.mask & key:
            how = "off (fallthrough)" if any(
                key == keys.LAYER_KEYS.get(n) for n in _disabled_layers) else "fallthrough"
            rows.append((keys.key_name(key), f"[{how}]", "", ""))
        elif w:
            rows.append((keys.key_name(key), w.name, w.plugin, w.priority))
        else:
            rows.append((keys.key_name(key), "[missing: NotImplementedError]", "", ""))
    return TableDump(op, rows)
