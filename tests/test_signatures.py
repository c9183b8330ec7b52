"""Every public function has the signature the Array API 2024.12 writes (parameter
names, positional-only / keyword-only kinds, defaults), checked against the table in
tests/data/array_api_2024_12_signatures.txt, and the namespace (top level, linalg, fft)
has every name of array-api-strict's, the standard's strict reference, but the ones
of its 2025.12 revision and its own helpers."""

import inspect
import pathlib

import array_api_strict as xp
import pytest

import lamina as lm

TABLE = pathlib.Path(__file__).parent / "data" / "array_api_2024_12_signatures.txt"
SPEC = {
    line.partition("(")[0]: "(" + line.partition("(")[2]
    for line in TABLE.read_text().splitlines()
    if line and not line.startswith("#")
}
# array-api-strict's names that are not the 2024.12 standard's: its flags, and the
# functions 2025.12 added
STRICT_ONLY = {
    "ArrayAPIStrictFlags",
    "get_array_api_strict_flags",
    "reset_array_api_strict_flags",
    "set_array_api_strict_flags",
}
NEWER = {"broadcast_shapes", "isin", "linalg.eig", "linalg.eigvals"}


# PyTorch's spellings lamina adds (Note [Two spellings]): keyword-only arguments after the
# standard's, which the standard allows, and max/min's positional dim
TORCH_SPELLINGS = {"dim", "keepdim", "unbiased", "torch_args"}


def text(fn):
    """A signature as the table writes it: no annotations, ``*`` and ``/`` markers; the
    PyTorch spellings left out."""
    params = [p for p in inspect.signature(fn).parameters.values() if p.name not in TORCH_SPELLINGS]
    parts, star = [], False
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.kind is p.VAR_POSITIONAL:
            parts.append("*" + p.name)
            star = True
            continue
        parts.append(p.name + ("" if p.default is p.empty else "=" + repr(p.default)))
        last_positional = i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY
        if p.kind is p.POSITIONAL_ONLY and last_positional:
            parts.append("/")
    return "(" + ", ".join(parts) + ")"


def _public(name):
    module, _, short = name.rpartition(".")
    return getattr(getattr(lm, module, None) if module else lm, short, None)


@pytest.mark.parametrize("name", sorted(SPEC))
def test_signature_is_the_standards(name):
    fn = _public(name)
    assert fn is not None, f"lamina has no {name}"
    assert text(fn) == SPEC[name]


def test_the_table_is_the_2024_12_one():
    assert "cumulative_prod" in SPEC and "linalg.svd" in SPEC and "fft.ihfft" in SPEC
    assert not NEWER & set(SPEC)
    assert lm.__array_api_version__ == "2024.12"


@pytest.mark.parametrize("module", ["", "linalg", "fft"])
def test_every_name_of_the_standard_exists(module):
    """array-api-strict lists the standard's names (dtypes and constants too); lamina
    has each one of its 2024.12 revision, and every function of the table."""
    ref = getattr(xp, module) if module else xp
    names = {f"{module}.{n}" if module else n for n in ref.__all__} - STRICT_ONLY - NEWER
    namespace = getattr(lm, module) if module else lm
    missing = sorted(n for n in names if not hasattr(namespace, n.rpartition(".")[2]))
    assert missing == []
    prefix = f"{module}." if module else ""
    in_table = {n for n in SPEC if n.startswith(prefix) and (module or "." not in n)}
    assert in_table <= names | {"__array_namespace_info__"}


def test_the_namespace_exports_no_stray_modules():
    """Every public module attribute is one of lamina's own submodules (an ``import sys``
    in lamina/__init__.py once showed up as ``lamina.sys``)."""
    import types

    modules = {
        n: getattr(lm, n).__name__
        for n in dir(lm)
        if not n.startswith("_") and isinstance(getattr(lm, n), types.ModuleType)
    }
    assert {"autograd", "backends", "dispatch", "fft", "linalg", "memory", "nn"} <= set(modules)
    assert all(name == f"lamina.{n}" for n, name in modules.items()), modules
