"""The layering of the code base: imports run one way (``dispatch`` <- ``backends``,
``autograd`` <- ``lamina``), no module imports itself back through others, and what
the schema promises of the public functions (a true signature, a docstring) holds.

Imports are read from the source (every ``import`` statement, inside functions too),
so a lazy import that goes upward or closes a cycle fails here as well. The C core
(dispatch/csrc/) is read too: its includes, and which of its files name autograd's
recording (Note [Autograd in C] in dispatch/csrc/core.h).
"""

import ast
import functools
import inspect
import pathlib
import re

import pytest

import lamina as lm
from lamina.dispatch import bindings, schema

ROOT = pathlib.Path(__file__).resolve().parents[1]
# tests that read the sources only, whichever core runs (Note [Core-independent tests])
SOURCE_ONLY = pytest.mark.core_independent
# folder -> (package it is imported as, rank): a module may import its own rank and
# below; ranks 1 are peers that must not import each other
LAYERS = {
    "dispatch": ("lamina.dispatch", 0),
    "backends": ("lamina.backends", 1),
    "autograd": ("lamina.autograd", 1),
    "lamina": ("lamina", 2),
}


def _modules():
    """module name -> source path, for every module of the four layers; the compiled
    extension's is its folder of C files (they import no Python module: checked below)."""
    found = {"lamina.dispatch._core": ROOT / "dispatch" / "csrc"}
    for folder, (package, _) in LAYERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _layer(module):
    """(layer folder, rank) of a lamina module name."""
    for folder, (package, rank) in sorted(LAYERS.items(), key=lambda kv: -len(kv[1][0])):
        if module == package or module.startswith(package + "."):
            return folder, rank
    raise AssertionError(module)


def _imports(module, path):
    """(line, imported lamina module) for every import in the module's source; ``from
    X import y`` counts as importing X.y where that is a module, else X."""
    if path.is_dir():
        return []
    is_package = path.name == "__init__.py"
    here = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("lamina")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            if not base.startswith("lamina"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((node.lineno, sub if sub in MODULES else base))
    return found


@functools.cache
def _graph():
    """module -> its imports, read when a test first needs it, not at collection (every
    worker of the suite collects this module)."""
    return {m: _imports(m, p) for m, p in MODULES.items()}


@SOURCE_ONLY
def test_the_layers_are_all_found():
    assert {
        "lamina.dispatch.tensor",
        "lamina.backends.numba_cpu",
        "lamina.autograd.engine",
        "lamina.tools.overhead",
    } <= set(MODULES)


@SOURCE_ONLY
@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_downward(module):
    folder, rank = _layer(module)
    bad = []
    for line, target in _graph()[module]:
        other, other_rank = _layer(target)
        if other_rank > rank or (other_rank == rank and other != folder):
            bad.append(f"line {line}: {target} ({other}, rank {other_rank})")
    assert not bad, f"{module} ({folder}, rank {rank}) imports upward or sideways: {bad}"


def _cycles(graph):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for _, w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or any(t == v for _, t in graph.get(v, ())):
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@SOURCE_ONLY
def test_no_import_cycles():
    assert _cycles(_graph()) == []


@SOURCE_ONLY
def test_the_cycle_check_can_fail():
    graph = {"a": [(1, "b")], "b": [(1, "c")], "c": [(1, "a")], "d": [(1, "a")]}
    assert _cycles(graph) == [["a", "b", "c"]]


@SOURCE_ONLY
def test_the_direction_check_can_fail():
    assert _layer("lamina.backends.numba_cpu.views") == ("backends", 1)
    assert _layer("lamina.autograd") == ("autograd", 1)
    assert _layer("lamina") == ("lamina", 2)
    # a backend importing the public face would be reported
    assert _layer("lamina")[1] > _layer("lamina.backends.sparse")[1]


# ---------------------------------------------------------------- the C core

C_CORE = ROOT / "dispatch" / "csrc"
C_FILES = sorted([*C_CORE.glob("*.c"), *C_CORE.glob("*.h")])
# what a C file may include: the core's own header, the C library's, Python's, NumPy's
C_INCLUDES = re.compile(
    r'"core\.h"|<(Python|structmember|fenv|stdint|string|stdlib)\.h>|<numpy/\w+\.h>'
)
# Note [Autograd in C]: autograd's names (its nodes, derivatives, grad mode, recording,
# and TensorBase's autograd fields) belong to recording.c; what other files may name
AUTOGRAD_NAMES = re.compile(r"grad|accumulator|output_nr|node|record|derivative", re.I)
AUTOGRAD_FIELDS = {"grad_fn", "accumulator", "output_nr"}
AUTOGRAD_ALLOWED = {
    "recording.c": None,  # autograd's recording itself: any of them
    "core.h": AUTOGRAD_FIELDS | {"init_recording"},  # declares the fields and the init
    "module.c": {"init_recording"},  # adds recording.c's types to the module
    # stores the fields and gives Python access to them, as reference.TensorBase does
    "tensor.c": AUTOGRAD_FIELDS
    | {"tensor_get_accumulator", "tensor_set_accumulator"}
    | {"tensor_get_output_nr", "tensor_set_output_nr"},
}


# comments, strings and characters: what C code may say of autograd without naming it
C_TEXT = re.compile(r"""/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'""", re.S)


def _c_violations(name, source):
    """What a C file of the core does that Note [Autograd in C] forbids it."""
    bad = [
        f"includes {target}"
        for target in re.findall(r"^\s*#\s*include\s*(\S+)", source, re.M)
        if not C_INCLUDES.fullmatch(target)
    ]
    code = C_TEXT.sub(" ", source)
    bad += [
        f"imports a Python module ({n})" for n in sorted(set(re.findall(r"\bPyImport_\w+", code)))
    ]
    allowed = AUTOGRAD_ALLOWED.get(name, set())
    if allowed is not None:
        names = set(re.findall(r"\b[A-Za-z_]\w*", code))
        bad += [
            f"names autograd's {n}"
            for n in sorted(names)
            if AUTOGRAD_NAMES.search(n) and n not in allowed
        ]
    return bad


@SOURCE_ONLY
def test_the_c_core_is_found():
    names = {p.name for p in C_FILES}
    assert {"core.h", "module.c", "tensor.c", "tables.c", "fastpath.c", "recording.c"} <= names
    assert set(AUTOGRAD_ALLOWED) <= names


@SOURCE_ONLY
@pytest.mark.parametrize("path", C_FILES, ids=lambda p: p.name)
def test_c_files_keep_autograd_in_the_recording_file(path):
    assert _c_violations(path.name, path.read_text()) == []


@SOURCE_ONLY
def test_the_c_check_can_fail():
    source = """
        #include "../../autograd/graph.h"
        #include <Python.h>
        static PyObject *f(TensorObject *t) {  /* grad_fn in a comment is fine */
            PyObject *graph = PyImport_ImportModule("lamina.autograd.graph");
            return t->grad_fn != NULL ? t->grad_fn : graph;
        }
    """
    assert _c_violations("fastpath.c", source) == [
        'includes "../../autograd/graph.h"',
        "imports a Python module (PyImport_ImportModule)",
        "names autograd's grad_fn",
    ]
    assert _c_violations("tensor.c", source) == _c_violations("fastpath.c", source)[:2]
    assert _c_violations("recording.c", source) == _c_violations("fastpath.c", source)[:2]


# ---------------------------------------------------------------- the public functions


NAMESPACES = ("", "linalg")  # the top level and the Array API extensions
PUBLIC = [op for ns in NAMESPACES for op in bindings.public_operators(ns)]


TORCH_SPELLINGS = {"dim", "keepdim", "unbiased", "torch_args"}


@pytest.mark.parametrize("op", PUBLIC, ids=lambda op: f"{op.namespace or 'lamina'}.{op.name}")
def test_public_functions_have_the_schema_signature_and_a_docstring(op):
    module = getattr(lm, op.namespace) if op.namespace else lm
    fn = getattr(module, op.name)
    # the Array API's arguments first, then PyTorch's spellings (Note [Two spellings])
    params = inspect.signature(fn).parameters.values()
    spelled = lambda ps: [(p.name, p.kind, p.default) for p in ps]
    standard = [p for p in params if p.name not in TORCH_SPELLINGS]
    assert spelled(standard) == spelled(op.signature.parameters.values())
    assert fn.__doc__ and fn.__doc__.startswith(op.doc)
    assert fn.__module__ == ("lamina." + op.namespace if op.namespace else "lamina")


def test_every_public_function_has_a_docstring():
    missing = [
        name for name in lm.dispatch.ops.__all__ if not (getattr(lm, name).__doc__ or "").strip()
    ]
    missing += [
        "linalg." + name
        for name in lm.linalg.__all__
        if not (getattr(lm.linalg, name).__doc__ or "").strip()
    ]
    assert missing == []


def test_sum_exposes_its_dtype_keyword_and_pytorchs_spellings():
    assert list(inspect.signature(lm.sum).parameters) == [
        "x", "axis", "dtype", "keepdims", "dim", "keepdim"
    ]  # fmt: skip


def test_generated_bindings_show_their_source():
    text = bindings.source("sum")
    assert text.startswith(
        "def sum(x, /, *, axis=None, dtype=None, keepdims=False, dim=None, keepdim=None):"
    )
    assert "axis = _alias(dim, axis is not None, 'sum', 'dim', 'axis')" in text
    assert "_Axes(axis, 'sum', 'axis', len(x._shape))" in text


def test_every_schema_tag_and_category_is_known():
    for op in schema.OPERATORS.values():
        assert op.tags <= schema.TAGS and op.category in schema.CONVENTIONS, op.name
        assert op.doc, op.name


def test_the_operator_reference_and_the_stubs_are_fresh():
    """docs/operators.md and the stubs of the functions made from the schema
    (dispatch/ops.pyi, _dunders.pyi, lamina/nn/functional.pyi)."""
    from lamina.tools import operators

    for path, render in operators.GENERATED.items():
        assert path.read_text() == render(), (
            f"{path.name} is stale: run python -m lamina.tools.operators --write"
        )


def test_the_state_fixture_sees_what_a_test_leaves_changed():
    """tests/conftest.py fails a test that leaves global state changed; its snapshot
    must see each kind of change."""
    from conftest import state

    before = state()
    with lm.layers.off("checks"):
        assert state()["layers"] != before["layers"]
        assert state()["tables"] != before["tables"]  # checks off: unchecked variants
    for _ in range(2):  # tables computed, then kept ones (Note [Preference snapshots])
        with lm.backends.use("numpy_ref"):
            assert state()["preferred plugin"] == "numpy_ref"
            assert state()["tables"] != before["tables"]
    with lm.no_grad():
        assert state()["grad mode"] is False
    assert state() == before


# ---------------------------------------------------------------- lamina.nn.functional

NN_PUBLIC = list(bindings.public_operators("nn.functional"))


def test_the_nn_namespace_has_operators():
    assert {"conv2d", "max_pool2d_with_indices", "relu", "to_layout"} <= {
        op.name for op in NN_PUBLIC
    }


@pytest.mark.parametrize("op", NN_PUBLIC, ids=lambda op: op.name)
def test_nn_functional_operators_have_the_schema_signature_and_a_docstring(op):
    fn = getattr(lm.nn.functional, op.name)
    # PyTorch's arguments, then the Array API's spellings (axis=) keyword-only
    params = list(inspect.signature(fn).parameters.values())
    extra = [p for p in params if p.name in bindings.ARRAY_API_ALIASES]
    own, schema = params[: len(params) - len(extra)], list(op.signature.parameters.values())
    if op.name in lm.nn.functional._COMPOSITES:  # over the operator, with PyTorch's
        own = own[: len(schema)]  # arguments after its own (Note [In-place activations])
    assert own == schema
    assert all(p.kind is p.KEYWORD_ONLY and p.default is None for p in extra)
    assert fn.__doc__ and fn.__doc__.startswith(op.doc)
    assert fn.__module__ == "lamina.nn.functional"
    assert not hasattr(lm, op.name) or getattr(lm, op.name) is not fn  # not top level


def test_every_nn_functional_function_is_documented_and_typed():
    for name in lm.nn.functional.__all__:
        fn = getattr(lm.nn.functional, name)
        assert (fn.__doc__ or "").strip(), name
        sig = inspect.signature(fn)
        untyped = [p for p, v in sig.parameters.items() if v.annotation is inspect.Parameter.empty]
        assert not untyped, (name, untyped)
        assert sig.return_annotation is not inspect.Signature.empty, name


def test_every_autograd_function_is_typed():
    # read from the source, so that nested functions (the layer's kernels) count too;
    # derivatives.py's formulas are not annotated yet
    untyped = []
    for path in sorted((ROOT / "autograd").glob("*.py")):
        if path.name == "derivatives.py":
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = fn.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]
            missing = [
                p.arg for p in params if p.annotation is None and p.arg not in ("self", "cls")
            ]
            missing += ["return"] * (fn.returns is None)
            if missing:
                untyped.append((path.name, fn.name, missing))
    assert untyped == []
