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
every mask, so a call skips it at no cost. AUTOGRAD also falls through for operators
without an autograd kernel (they are not differentiable). Backend keys and SPARSE never
fall through silently: without a kernel their table slot holds an error kernel that
names the operator, the key and the keys that do have kernels.
"""
from dataclasses import dataclass, field

from . import keys


@dataclass
class Kernel:
    fn: object
    plugin: str
    priority: int
    order: int  # registration order, only for stable tie-breaking

    @property
    def name(self):
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
        raise ValueError(f"unknown operator {name!r}") from None


def register_kernel(op_name, key, fn, plugin, priority=0):
    """Record a kernel for (operator, key); call ``rebuild()`` to make it active."""
    global _order
    get(op_name)  # unknown operator names are an error, not a silent new entry
    _order += 1
    _kernels.setdefault((op_name, key), []).append(Kernel(fn, plugin, priority, _order))


def unregister_plugin(plugin):
    """Drop every kernel that ``plugin`` registered; the next rebuild restores others."""
    for k, entries in list(_kernels.items()):
        entries[:] = [e for e in entries if e.plugin != plugin]
        if not entries:
            del _kernels[k]


def kernels_of(plugin):
    return [(op, key, e) for (op, key), es in _kernels.items() for e in es if e.plugin == plugin]


def _winner(entries):
    # Note [Kernel priority]: the preferred backend (lm.backends.use) beats priority;
    # then higher priority; then the plugin name (alphabetical), then registration
    # order, so ties never depend on the order plugins were loaded in.
    return min(entries, key=lambda e: (e.plugin != _preferred_plugin, -e.priority,
                                       e.plugin, e.order))


def _missing_kernel(op, key):
    def no_kernel(ks, *args, **kwargs):
        have = [keys.key_name(k) for k in keys.all_keys() if k in op.winners]
        what = "no key" if key == 0 else f"key {keys.key_name(key)}"
        raise NotImplementedError(
            f"operator {op.name!r} has no kernel for {what} (the call's keys: "
            f"{', '.join(keys.keyset_names(ks)) or 'none'}); keys with kernels: "
            f"{', '.join(have) or 'none'}")
    return no_kernel


def _rebuild_op(op):
    all_keys = keys.all_keys()
    op.winners = {k: _winner(_kernels[op.name, k]) for k in all_keys if _kernels.get((op.name, k))}
    table = [_missing_kernel(op, 0)]
    mask = 0
    for bit in range(max(all_keys).bit_length()):
        key = 1 << bit
        layer_off = any(key == keys.LAYER_KEYS[n] for n in _disabled_layers)
        winner = op.winners.get(key)
        table.append(winner.fn if winner else _missing_kernel(op, key))
        if not layer_off and (winner or key != keys.AUTOGRAD):
            mask |= key
    op.table[:] = table  # in place: bindings may hold the list itself
    op.mask = mask


def rebuild():
    """Recompute every operator's table and mask (registration time, never per call)."""
    for op in OPERATORS.values():
        _rebuild_op(op)


def set_layer(name, enabled):
    if name not in keys.LAYER_KEYS:
        raise ValueError(f"unknown layer {name!r}; dispatch layers: {', '.join(keys.LAYER_KEYS)}")
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
        if not op.mask & key:
            how = "off (fallthrough)" if any(
                key == keys.LAYER_KEYS[n] for n in _disabled_layers) else "fallthrough"
            rows.append((keys.key_name(key), f"[{how}]", "", ""))
        elif w:
            rows.append((keys.key_name(key), w.name, w.plugin, w.priority))
        else:
            rows.append((keys.key_name(key), "[missing: NotImplementedError]", "", ""))
    return TableDump(op, rows)
