"""The operator schema: what one entry of ``operators.py`` says about an operator.

Note [Operator schema]: every operator is one ``define(...)`` call in ``operators.py``
(the role of PyTorch's native_functions.yaml). The entry gives

* the **signature**, written as Python (``"sum(x: Tensor, /, *, axis: Axes = None,
  ...) -> Tensor"``) and parsed once; the annotations name argument kinds of
  ``arguments.py``, which the generated binding checks and normalizes;
* the **category** (elementwise, reduction, view, ...), which fixes the kernel calling
  convention (``CONVENTIONS``);
* **tags** -- ``view``, ``inplace`` (writes its first argument), ``keeps_zero``
  (f(0) == 0: the sparse layer keeps the pattern), ``simd`` (NumPy has a SIMD loop for
  it), ``comparison`` -- and ``differentiable`` (its formula is in
  ``autograd/derivatives.py``);
* the dtype rule of its inputs and result, its NumPy name, its dunder names, whether it
  has an in-place variant (``add_`` for ``+=``), its public namespace and its doc.

Bindings, dunders, in-place variants, the sparse and SIMD operator lists, the operator
reference (``docs/operators.md``) and the tests' operator sweeps derive from it.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import reference
from .core import OperatorTable

# How kernels of each category are called (docs/operators.md, docs/backends.md).
CONVENTIONS = {
    "elementwise": "kernel(ks, *operands): tensors or Python scalars (a binary operator "
    "may get the scalar in either position); shapes broadcast",
    "reduction": "kernel(ks, x, axis, ...): axis a sorted tuple of non-negative ints "
    "(None arrives as every axis), the other arguments in signature order",
    "scan": "kernel(ks, x, axis, ...): axis a non-negative int",
    "view": "kernel(ks, x, ...): arguments normalized (axes non-negative); the result "
    "shares x's storage where the layout allows",
    "manipulation": "kernel(ks, ...): arguments in signature order, normalized",
    "indexing": "kernel(ks, x, key, ...): key as the user gave it (ints, slices, "
    "Ellipsis, None, tensors)",
    "linalg": "kernel(ks, ...): arguments in signature order, normalized",
    "conversion": "kernel(ks, ...): arguments in signature order",
    "creation": "kernel(ks, ...): the signature's arguments but device, which chose the key",
    "sorting": "kernel(ks, x, axis, ...): axis a non-negative int, the flags in signature order",
    "searching": "kernel(ks, ...): arguments in signature order, normalized; results whose "
    "shape depends on the values",
    "set": "kernel(ks, x): a tensor, or a named tuple of tensors (dispatch/result_types.py)",
    "fft": "kernel(ks, x, ...): arguments in signature order; axes non-negative, sizes "
    "resolved (n, s), norm one of 'backward', 'ortho', 'forward'",
    "nn": "kernel(ks, ...): arguments in signature order as the operator's check gives them "
    "(dispatch/meta.py): pairs (h, w), conv2d's padding as (top, bottom, left, right), the "
    "input's layout kept (NCHW or channels-last)",
}

DTYPE_RULES = {
    "any": "every dtype",
    "real": "every dtype but the complex ones",
    "numeric": "every dtype but bool",
    "real_numeric": "integer and real floating dtypes",
    "float": "floating dtypes, complex included; integers and bool are computed in the "
    "default float",
    "real_float": "real floating dtypes; integers and bool are computed in the default float",
    "complex": "complex floating dtypes",
    "int": "integer dtypes",
    "intbool": "integer and bool dtypes",
    "floating": "real floating dtypes only; integers, bool and complex raise TypeError",
}
RESULT_RULES = {
    "same": "the computation dtype",
    "bool": "bool",
    "sum": "the input's floating dtype; signed integers and bool give int64, unsigned uint64",
    "index": "int64",
    "arg": "given by an argument (dtype=)",
    "real": "the real dtype of the computation dtype's precision (complex64 gives float32)",
    "complex": "the complex dtype of the computation dtype's precision (float32 gives complex64)",
}
TAGS = frozenset({"view", "inplace", "keeps_zero", "simd", "comparison", "differentiable"})


@dataclass(frozen=True)
class Param:
    """One parameter of a signature: its kind (inspect's), annotation and default."""

    name: str
    kind: Any  # inspect.Parameter.POSITIONAL_ONLY, ...
    annotation: str  # e.g. "Tensor", "Axes", "DType | None"
    default: Any = inspect.Parameter.empty

    @property
    def type(self) -> str:
        """The annotation without ``| None``."""
        return self.annotation.removesuffix(" | None")

    @property
    def optional(self) -> bool:
        return self.annotation.endswith(" | None") or self.default is None


def parse_signature(text: str) -> tuple[str, tuple[Param, ...], str]:
    """(name, params, return annotation) of ``"name(params) -> ret"``."""
    tree = ast.parse(f"def {text}: pass").body[0]
    a = tree.args
    kinds = inspect.Parameter
    params = []
    positional = [(p, kinds.POSITIONAL_ONLY) for p in a.posonlyargs] + [
        (p, kinds.POSITIONAL_OR_KEYWORD) for p in a.args
    ]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for (p, kind), d in zip(positional, defaults):
        params.append(_param(p, kind, d))
    if a.vararg is not None:
        params.append(_param(a.vararg, kinds.VAR_POSITIONAL, None))
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        params.append(_param(p, kinds.KEYWORD_ONLY, d))
    ret = ast.unparse(tree.returns) if tree.returns is not None else "None"
    return tree.name, tuple(params), ret


def _param(p: ast.arg, kind: Any, default: ast.expr | None) -> Param:
    if p.annotation is None:
        raise ValueError(f"parameter {p.arg!r} has no annotation")
    value = inspect.Parameter.empty if default is None else ast.literal_eval(default)
    return Param(p.arg, kind, ast.unparse(p.annotation), value)


@dataclass(eq=False)
class Operator:
    """One operator: its schema entry and, filled by the registry, its dispatch table.

    Note [Dispatch table]: ``table`` is a list indexed by the highest set bit of a key
    set (``ks.bit_length()``) and ``mask`` holds the keys that take part in the
    operator's dispatch. The hot path is::

        ks = (a._ks | b._ks) & op.mask
        return op.table[ks.bit_length()](ks, a, b)

    ``lamina.dispatch.entries.rebuild`` recomputes tables and masks when a kernel is
    registered or removed, a layer is switched, or the preferred backend changes; the
    call path never looks anything up by name."""

    name: str
    params: tuple[Param, ...]
    returns: str
    category: str
    dtypes: str = "any"  # DTYPE_RULES
    result: str = "same"  # RESULT_RULES
    tags: frozenset = frozenset()
    numpy: str | None = None  # NumPy's name for it, where NumPy has one
    dunder: str | None = None  # "add": __add__, __radd__ (and __iadd__ with inplace)
    inplace_of: Operator | None = None  # add_ -> add
    inplace: Operator | None = None  # add -> add_
    namespace: str | None = ""  # "" the top level, "linalg", ...; None: not public
    check: Callable | None = None  # dispatch/meta.py: argument rules beyond the types
    doc: str = ""
    writes: tuple[str, ...] = ()  # Note [Mutation]: the arguments it writes
    # filled by the registry (lamina.dispatch.entries), never by the schema: what the
    # bindings read per call, and key -> Entry for dumps
    dispatch: OperatorTable = field(default_factory=OperatorTable, repr=False)
    entries: dict = field(default_factory=dict, repr=False)

    @property
    def table(self) -> list:
        return self.dispatch.table

    @property
    def scalar_table(self) -> list:  # Note [Kernel variants]
        return self.dispatch.scalar_table

    @property
    def mask(self) -> int:
        return self.dispatch.mask

    @mask.setter
    def mask(self, value: int) -> None:
        self.dispatch.mask = value

    @property
    def signature(self) -> inspect.Signature:
        """The public signature (annotations are the schema's argument kinds)."""
        return inspect.Signature(
            [
                inspect.Parameter(p.name, p.kind, default=p.default, annotation=p.annotation)
                for p in self.params
            ],
            return_annotation=self.returns,
        )

    @property
    def signature_text(self) -> str:
        """The signature as the schema writes it (annotations unquoted)."""
        text = re.sub(r": '([^']*)'", r": \1", str(self.signature))
        return re.sub(r"-> '(.*)'$", r"-> \1", text)

    @property
    def arity(self) -> int:
        return len(self.params)

    @property
    def kernel_params(self) -> tuple[Param, ...]:
        """The parameters a kernel receives after ``ks``: the signature's, but a
        creation operator's ``device`` (the key it dispatched on chose the kernel)."""
        if self.category == "creation":
            return tuple(p for p in self.params if p.name != "device")
        return self.params

    @property
    def kernel_call(self) -> str:
        """How its kernels are called, e.g. ``sum(ks, x, axis, dtype, keepdims)``."""
        return f"{self.name}(ks, {', '.join(p.name for p in self.kernel_params)})"

    @property
    def winners(self) -> dict:
        """key -> the registration that serves it (the outermost of its chain)."""
        return {k: e.chain[0] for k, e in self.entries.items() if e.chain}

    @property
    def differentiable(self) -> bool:
        return "differentiable" in self.tags

    @property
    def convention(self) -> str:
        return CONVENTIONS[self.category]

    @property
    def kind(self) -> str:
        """inplace for operators that write their first argument, unary / binary /
        ternary for elementwise operators, else the category."""
        if "inplace" in self.tags:
            return "inplace"
        if self.category == "elementwise":
            return {1: "unary", 2: "binary", 3: "ternary"}[self.arity]
        return self.category

    def __call__(self, *args: Any) -> Any:
        """Dispatch canonical arguments with the key set of the tensors among them
        (slow, generic path: the kernel receives ``args`` as given)."""
        ks = keyset(args)
        if reference.modes_active:  # Note [Modes]
            ks = reference.with_modes(ks)
        ks &= self.mask
        return self.table[ks.bit_length()](ks, *args)

    def __repr__(self) -> str:
        return f"<operator {self.name}{self.signature_text}>"


def keyset(args: Any) -> int:
    """The union of the key sets of all tensors among ``args`` (lists searched too)."""
    ks = 0
    for a in args:
        k = getattr(a, "_ks", None)
        if k is not None:
            ks |= k
        elif type(a) in (list, tuple):
            ks |= keyset(a)
    return ks


OPERATORS: dict[str, Operator] = {}  # name -> Operator, in definition order


def define(
    signature: str,
    category: str,
    *,
    dtypes: str = "any",
    result: str = "same",
    tags: str = "",
    numpy: str | None = None,
    dunder: str | None = None,
    inplace: bool = False,
    namespace: str | None = "",
    check: Callable | None = None,
    doc: str = "",
    writes: str = "",
) -> Operator:
    """Add one operator to the schema (Note [Operator schema]); with ``inplace`` also
    its in-place variant ``name_`` (``x1 op= x2``).

    Note [Mutation]: ``writes`` names the arguments an operator writes besides its
    results (PyTorch's ``Tensor(a!)``): native_batch_norm's running statistics, the
    random generator whose state rand and randn advance (two draws are not one). An
    operator tagged ``inplace`` writes its first argument and returns it; one tagged
    ``view`` returns results that share its first argument's storage (their strides:
    Note [Result layouts]). Nothing else writes or aliases its arguments, so a graph
    pass may reorder, fuse or drop any other call whose results are unused."""
    name, params, returns = parse_signature(signature)
    if name in OPERATORS:
        raise ValueError(f"operator {name!r} is defined twice")
    if category not in CONVENTIONS:
        raise ValueError(f"{name}: unknown category {category!r}")
    if dtypes not in DTYPE_RULES or result not in RESULT_RULES:
        raise ValueError(f"{name}: unknown dtype rule {dtypes!r} or result {result!r}")
    tag_set = frozenset(tags.split())
    written = tuple(writes.split()) + ((params[0].name,) if "inplace" in tag_set else ())
    unknown = [w for w in written if w not in [p.name for p in params]]
    if unknown:
        raise ValueError(f"{name}: writes unknown arguments {unknown}")
    if tag_set - TAGS:
        raise ValueError(f"{name}: unknown tags {sorted(tag_set - TAGS)}")
    if not doc:
        raise ValueError(f"{name}: every operator needs a doc")
    op = OPERATORS[name] = Operator(
        name,
        params,
        returns,
        category,
        dtypes,
        result,
        tag_set,
        numpy,
        dunder,
        namespace=namespace,
        check=check,
        doc=doc,
        writes=written,
    )
    if inplace:
        variant = OPERATORS[name + "_"] = Operator(
            name + "_",
            params,
            returns,
            category,
            dtypes,
            result,
            tag_set | {"inplace"},
            numpy,
            inplace_of=op,
            namespace=None,
            doc=f"In-place {name}: x1 is overwritten "
            f"with {name}(x1, x2) (``x1 {_symbol(dunder)}= x2``); x1 keeps its dtype and "
            "shape.",
            writes=(params[0].name,),
        )
        op.inplace = variant
    return op


def _symbol(dunder: str | None) -> str:
    return {
        "add": "+",
        "sub": "-",
        "mul": "*",
        "truediv": "/",
        "floordiv": "//",
        "mod": "%",
        "pow": "**",
        "and": "&",
        "or": "|",
        "xor": "^",
        "lshift": "<<",
        "rshift": ">>",
    }.get(dunder or "", "op")


def get(name: str) -> Operator:
    """The operator called ``name``; ValueError with close matches otherwise."""
    try:
        return OPERATORS[name]
    except KeyError:
        import difflib  # only for this message: ~1 ms of import lamina

        close = difflib.get_close_matches(str(name), OPERATORS, n=3, cutoff=0.75)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise ValueError(
            f"unknown operator {name!r}{hint}; operators are listed in "
            "lamina.dispatch.OPERATORS and docs/operators.md"
        ) from None


def tagged(tag: str) -> list[Operator]:
    """Every operator carrying ``tag`` (Note [Operator schema])."""
    return [op for op in OPERATORS.values() if tag in op.tags and op.inplace_of is None]
