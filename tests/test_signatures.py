"""Every public function has the signature the Array API 2024.12 writes (parameter
names, positional-only / keyword-only kinds, defaults), checked against the table in
tests/data/array_api_2024_12_signatures.txt; what lamina does not have yet is listed
here, so the list shrinks as it is built and a function added without its exact
signature fails."""

import inspect
import pathlib

import pytest

import lamina as lm

TABLE = pathlib.Path(__file__).parent / "data" / "array_api_2024_12_signatures.txt"
SPEC = {
    line.partition("(")[0]: "(" + line.partition("(")[2]
    for line in TABLE.read_text().splitlines()
    if line and not line.startswith("#")
}
# lamina.fft is not built yet (issue 15)
NOT_YET = {name for name in SPEC if name.startswith("fft.")}


def text(fn):
    """A signature as the table writes it: no annotations, ``*`` and ``/`` markers."""
    params = list(inspect.signature(fn).parameters.values())
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


@pytest.mark.parametrize("name", sorted(set(SPEC) - NOT_YET))
def test_signature_is_the_standards(name):
    fn = _public(name)
    assert fn is not None, f"lamina has no {name}"
    assert text(fn) == SPEC[name]


def test_what_is_not_built_yet_is_really_missing():
    assert [name for name in sorted(NOT_YET) if _public(name) is not None] == []
    assert "cumulative_prod" in SPEC and "linalg.svd" in SPEC  # the table is the 2024.12 one
