"""docs/backends.md and docs/from_pytorch.md cannot drift from lamina: every ``python``
block on them runs, in order, in one namespace, in a fresh process (``>>>`` blocks as
doctests, comparing their output; a plain block followed by a ``text`` block must print
that text), and the backend page's tables of helpers and registry methods give the
real signatures."""

import inspect
import pathlib
import re
import subprocess
import sys

import pytest

import lamina as lm
from lamina.backends import setup

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
DOC = DOCS / "backends.md"

RUNNER = r"""
import contextlib, doctest, io, pathlib, re, sys

path = sys.argv[1]
text = pathlib.Path(path).read_text()
blocks = [
    (m.group(1), m.group(2), text.count("\n", 0, m.start()) + 2)
    for m in re.finditer(r"^```(\w+)\n(.*?)^```\n", text, re.M | re.S)
]
globs = {"__name__": "__main__"}
failures = examples = 0
for i, (lang, code, line) in enumerate(blocks):
    if lang != "python":
        continue
    if code.lstrip().startswith(">>>"):
        name = f"block at line {line}"
        test = doctest.DocTestParser().get_doctest(code, globs, name, path, line - 1)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        result = runner.run(test, clear_globs=False)
        failures, examples = failures + result.failed, examples + result.attempted
        continue
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{path}:{line}", "exec"), globs)
    if i + 1 < len(blocks) and blocks[i + 1][0] == "text":
        want = blocks[i + 1][1].strip()
        if out.getvalue().strip() != want:
            failures += 1
            print(f"block at line {line} printed:\n{out.getvalue()}\nexpected:\n{want}")
n = sum(lang == "python" for lang, _, _ in blocks)
print(f"{n} blocks, {examples} examples, {failures} failures")
sys.exit(1 if failures else 0)
"""


# the page, and how many blocks and examples it has at least (so none goes unrun)
PAGES = {
    "backends.md": (14, 40),
    "from_pytorch.md": (2, 14),
    "guide/tensors.md": (7, 40),
    "guide/autograd.md": (5, 28),
    "guide/nn.md": (5, 37),
    "guide/threads.md": (1, 4),
    "guide/compile.md": (4, 12),
}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_code_block_of_the_docs_runs_and_shows_what_lamina_does(page):
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, str(DOCS / page)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    *_, blocks, _, examples, _, failures, _ = out.stdout.split()
    least_blocks, least_examples = PAGES[page]
    assert (int(blocks) >= least_blocks, int(examples) >= least_examples, failures) == (
        True,
        True,
        "0",
    ), out.stdout


def _documented_calls(section):
    """The ``name(params)`` calls in the first column of the tables of ``section``."""
    body = DOC.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    calls = {}
    for cell in re.findall(r"^\| `([^|]+?)`", body, re.M):
        for call in re.findall(r"(\w+)\(([^)]*)\)", cell):
            calls[call[0]] = [
                p.split("=")[0].strip(" *") for p in call[1].split(",") if p.strip(" *")
            ]
    return calls


def _params(fn, documented):
    """fn's parameter names, but trailing ones with defaults that the docs leave out
    (``from_array(data)`` for ``from_array(data, ks=CPU)``)."""
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    while len(params) > len(documented) and params[-1].default is not inspect.Parameter.empty:
        params.pop()
    return [p.name for p in params]


def test_the_helper_tables_give_the_real_signatures():
    documented = _documented_calls("Helpers")
    public = [
        name
        for name, fn in vars(setup).items()
        if inspect.isfunction(fn) and not name.startswith("_")
    ]
    assert public and set(public) <= set(documented), set(public) - set(documented)
    for name in public:
        assert documented[name] == _params(getattr(setup, name), documented[name]), name
    for name in ("new_tensor", "from_array", "from_flat", "dtype_from_numpy", "cpu_fallback"):
        assert documented[name] == _params(getattr(lm.backends, name), documented[name]), name


def test_the_registry_table_gives_the_real_signatures():
    documented = _documented_calls("The registry")
    methods = [m for m in vars(lm.backends.Registry) if not m.startswith("_")]
    assert set(methods) == set(documented), set(methods) ^ set(documented)
    for name in methods:
        fn = getattr(lm.backends.Registry, name)
        assert documented[name] == _params(fn, documented[name]), name
