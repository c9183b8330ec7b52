"""Bindings: the public functions and Tensor's operators, derived from the schema.

Note [Bindings]: an operator's Python binding does the dispatcher's work inline (OR
the key sets, AND the mask, index the table by bit_length), so ``a + b`` costs one
Python call before the kernel. Python scalars have no key set; the AttributeError
branch handles them off the fast path.

Elementwise unary and binary operators get the core's bindings (the hot path, in C or
in the Python reference: Note [Two cores] in reference.py). Every other public operator
gets a function generated from its signature (Note [Generated bindings]): it checks each
argument by its kind (``arguments.py``), applies the operator's ``check`` (``meta.py``)
and dispatches. ``source(name)`` shows the code.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np

from . import arguments, core, keys, reference
from .reference import scalar_keys
from .schema import OPERATORS, Operator, keyset
from .tensor import Tensor, bump_version


def unary_binding(op: Operator) -> Callable:
    return _named(core.unary_binding(op.name, op.dispatch), op)


def binary_binding(op: Operator) -> Callable:
    return _named(core.binary_binding(op.name, op.dispatch), op)


def _named(fn: Callable, op: Operator) -> Callable:
    fn.__name__ = fn.__qualname__ = op.name
    fn.__module__ = f"lamina.{op.namespace}" if op.namespace else "lamina"
    fn.__doc__ = docstring(op)
    fn.__signature__ = op.signature
    return fn


def docstring(op: Operator) -> str:
    """The doc of a public function: the schema's doc, its arguments' kinds."""
    kinds = [
        f"    {p.name}: {arguments.DESCRIPTIONS[p.type]}"
        + (" or None" if p.annotation.endswith("| None") else "")
        for p in op.params
    ]
    return (
        f"{op.doc}\n\nArguments:\n"
        + "\n".join(kinds)
        + f"\n\nOperator {op.name!r} ({op.category}): see docs/operators.md."
    )


# ---------------------------------------------------------------- generated bindings
# Note [Generated bindings]: the binding of a non-elementwise operator is generated
# from its signature, as PyTorch generates its Python bindings, so that it has the
# operator's real signature (inspect.signature shows it) and costs no argument parsing
# beyond Python's own: one line per parameter checks it by its kind, then the
# operator's check (dispatch/meta.py), then the dispatch. For ``sum``:
#
#     def sum(x, /, *, axis=None, dtype=None, keepdims=False):
#         x = _Tensor(x, 'sum', 'x')
#         axis = _Axes(axis, 'sum', 'axis', len(x._shape))
#         if dtype is not None:
#             dtype = _DType(dtype, 'sum', 'dtype')
#         keepdims = _bool(keepdims, 'sum', 'keepdims')
#         ks = x._ks
#         if _reference.modes_active:  # Note [Modes]
#             ks = _reference.with_modes(ks)
#         ks &= _op.mask
#         return _table[ks.bit_length()](ks, x, axis, dtype, keepdims)


def source(name: str) -> str:
    """The Python source of the generated binding of operator ``name``."""
    op = OPERATORS[name]
    params = op.params
    plain = inspect.Signature(
        [inspect.Parameter(p.name, p.kind, default=p.default) for p in params]
    )
    tensors = [p for p in params if p.type in ("Tensor", "Tensors")]
    ndim = (
        None
        if not tensors
        else f"len({tensors[0].name}._shape)"
        if tensors[0].type == "Tensor"
        else f"len({tensors[0].name}[0]._shape)"
    )
    aliases = torch_aliases(op)
    empty = inspect.Parameter.empty
    required = {name for name in aliases.values() if plain.parameters[name].default is empty}
    plain = with_aliases(plain, aliases)
    if required:  # either spelling may give it: the binding checks that one did
        plain = plain.replace(
            parameters=[
                p.replace(default=None) if p.name in required else p
                for p in plain.parameters.values()
            ]
        )
    lines = [f"def {op.name}{plain}:"]
    defaults = {p.name: None if p.name in required else p.default for p in params}
    for alias, name in aliases.items():  # Note [Two spellings] in pytorch.py
        given = f"{name} is not None" if defaults[name] is None else f"{name} != {defaults[name]!r}"
        lines += [
            f"    if {alias} is not None:",
            f"        {name} = _alias({alias}, {given}, {op.name!r}, {alias!r}, {name!r})",
        ]
        if name in required:
            lines += [
                f"    elif {name} is None:",
                f'        raise TypeError("{op.name}() missing required argument: '
                f"'{name}' (or {alias}=)\")",
            ]
    for p in params:
        _, needs_ndim = arguments.KINDS[p.type]
        extra = f", {ndim}" if needs_ndim else ""
        check = f"{p.name} = _{p.type}({p.name}, {op.name!r}, {p.name!r}{extra})"
        if p.annotation.endswith("| None"):
            lines += [f"    if {p.name} is not None:", f"        {check}"]
        else:
            lines.append(f"    {check}")
    names = ", ".join(p.name for p in params)
    if op.check is not None:
        lines.append(f"    {names}{',' if len(params) == 1 else ''} = _check({names})")
    key_terms = []
    for p in params:
        if p.type == "Tensor" and not p.optional:
            key_terms.append(f"{p.name}._ks")
        elif p.type in ("TensorOrScalar", "Tensor"):  # a scalar or None has no keys
            key_terms.append(f"getattr({p.name}, '_ks', 0)")
        elif p.type == "Tensors":
            key_terms.append(f"_keyset({p.name})")
    lines.append(f"    ks = {' | '.join(key_terms) or '0'}")
    lines.append("    if _reference.modes_active:")  # Note [Modes]
    lines.append("        ks = _reference.with_modes(ks)")
    lines.append("    ks &= _op.mask")
    lines.append(f"    return _table[ks.bit_length()](ks, {names})")
    return "\n".join(lines) + "\n"


# PyTorch's names of the Array API's arguments, accepted keyword-only beside them
TORCH_ALIASES = {"dim": "axis", "keepdim": "keepdims"}
# and the reverse in nn.functional, whose operators are spelled as PyTorch's
ARRAY_API_ALIASES = {"axis": "dim", "keepdims": "keepdim"}


def torch_aliases(op: Operator) -> dict[str, str]:
    """The other spelling's names an operator's binding accepts, keyword-only: PyTorch's
    (``dim``, ``keepdim``) for the optional arguments of the Array API's operators (a
    required one is positional already: ``expand_dims(x, 1)``), the Array API's
    (``axis``) for nn.functional's (``F.softmax(x, axis=1)``)."""
    if op.namespace == "nn.functional":
        names = {p.name for p in op.params}
        return {alias: name for alias, name in ARRAY_API_ALIASES.items() if name in names}
    names = {p.name for p in op.params if p.default is not inspect.Parameter.empty}
    return {alias: name for alias, name in TORCH_ALIASES.items() if name in names}


def with_aliases(signature: inspect.Signature, aliases: dict) -> inspect.Signature:
    """``signature`` with the other spelling's names appended, keyword-only, default
    None, each of its argument's kind."""
    extra = [
        inspect.Parameter(
            alias,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=signature.parameters[name].annotation,
        )
        for alias, name in aliases.items()
    ]
    return signature.replace(parameters=[*signature.parameters.values(), *extra])


def _alias(value: object, both: bool, fn: str, alias: str, name: str) -> object:
    """``value``, given as PyTorch's ``alias`` of argument ``name``; ``both``: ``name``
    was given too (it differs from its default), an error."""
    if both:
        raise TypeError(f"{fn}: got both {alias}= and {name}=; pass one")
    return tuple(value) if isinstance(value, list) else value


def generated_binding(op: Operator) -> Callable:
    namespace = {f"_{kind}": check for kind, (check, _) in arguments.KINDS.items()}
    namespace.update(
        _op=op,
        _table=op.table,
        _check=op.check,
        _keyset=keyset,
        _alias=_alias,
        _reference=reference,
    )
    exec(compile(source(op.name), f"<binding of {op.name}>", "exec"), namespace)
    fn = _named(namespace[op.name], op)
    fn.__signature__ = with_aliases(op.signature, torch_aliases(op))
    return fn


# ---------------------------------------------------------------- dunders


def _comparison(fn: Callable) -> Callable:
    def compare(self, other):
        if isinstance(other, (list, tuple, np.ndarray)):  # not a silent identity False
            raise TypeError(
                f"{fn.__name__}: expected a tensor or a Python scalar, got "
                f"{type(other).__name__} (convert it with lamina.asarray)"
            )
        if not isinstance(other, (Tensor, bool, int, float, complex, np.generic)):
            return NotImplemented  # Python then falls back to identity (t == None)
        return fn(self, other)

    return compare


def _inplace(op: Operator) -> Callable:
    binding = binary_binding(op)

    def inplace(self, other):
        binding(self, other)
        bump_version(self)  # Note [Version counters]
        return self

    return inplace


def _tensors_only(fn: Callable, reflected: bool) -> Callable:
    """A dunder of a non-elementwise operator: NotImplemented for a non-tensor operand,
    so Python raises its own TypeError (``t @ 2``)."""

    def dunder(self, other):
        if not isinstance(other, Tensor):
            return NotImplemented
        return fn(other, self) if reflected else fn(self, other)

    return dunder


def _install_dunders(namespace: dict) -> None:
    """Tensor's operator methods, through the core (``core.set_slot``): an elementwise
    binding takes its operands in their own order, so it serves ``a + b`` and ``2 + a``
    alike (``symmetric``)."""
    for op in OPERATORS.values():
        d = op.dunder
        if d is None:
            continue
        fn = namespace[op.name]
        if op.category != "elementwise":
            core.set_slot(d, _tensors_only(fn, False), _tensors_only(fn, True))
        elif op.kind == "unary" or "comparison" in op.tags:
            core.set_slot(d, fn if op.kind == "unary" else _comparison(fn))
        else:
            core.set_slot(d, fn, symmetric=True)
            if op.inplace is not None:
                core.set_slot(f"i{d}", _inplace(op.inplace))


# ---------------------------------------------------------------- dispatcher off


def _direct(op: Operator) -> Callable:
    """A binding straight to the CPU kernel, for the "dispatcher" layer switched off."""
    kernel = op.table[keys.CPU.bit_length()]

    def refuse(args):
        raise RuntimeError(
            f"{op.name}: the dispatcher layer is off, so only dense CPU "
            f"tensors that do not require grad are accepted (got key sets "
            f"{[keys.keyset_names(getattr(a, '_ks', 0)) for a in args]}); "
            "use lamina.layers.enable('dispatcher')"
        )

    if op.kind == "unary":

        def call(x, /):
            if x._ks != keys.CPU:
                refuse((x,))
            return kernel(keys.CPU, x)
    else:

        def call(x1, x2, /):
            try:
                ks = x1._ks | x2._ks
            except AttributeError:
                ks = scalar_keys(op.name, x1, x2)
            if ks != keys.CPU:
                refuse((x1, x2))
            return kernel(keys.CPU, x1, x2)

    return _named(
        core.direct_binding(op.name, op.dispatch, 1 if op.kind == "unary" else 2, kernel, call), op
    )


# ---------------------------------------------------------------- installing

_namespaces: list[dict] = []  # every namespace the bindings were installed into
_direct_mode = False


def public_operators(namespace: str = "") -> list[Operator]:
    return [op for op in OPERATORS.values() if op.namespace == namespace]


def _fast(op: Operator) -> bool:
    return op.category == "elementwise" and op.kind in ("unary", "binary")


def _bindings(direct: bool, which: str = "") -> dict[str, Callable]:
    found = {}
    for op in public_operators(which):
        if _fast(op):
            found[op.name] = (
                _direct(op)
                if direct
                else unary_binding(op)
                if op.kind == "unary"
                else binary_binding(op)
            )
        else:
            found[op.name] = generated_binding(op)
    return found


def install(namespace: dict, which: str = "") -> None:
    """Put every public function of namespace ``which`` ("" the top level, "linalg",
    "fft") into ``namespace`` (a module's globals) and keep it up to date when the
    dispatcher layer is switched (``reinstall``)."""
    bound = _bindings(_direct_mode, which)
    namespace.update(bound)
    if which:  # only top-level operators are elementwise: nothing to rebind
        return
    if not any(ns is namespace for ns in _namespaces):
        _namespaces.append(namespace)
    _install_dunders(bound)


def reinstall(direct: bool) -> None:
    """Rebind every installed namespace: ``direct`` binds the elementwise functions
    and operators straight to the CPU kernels (lamina.layers, "dispatcher" off)."""
    global _direct_mode
    _direct_mode = direct
    bound = _bindings(direct)
    fast = {name: fn for name, fn in bound.items() if _fast(OPERATORS[name])}
    for namespace in _namespaces:
        namespace.update(fast)
    _install_dunders(bound)
