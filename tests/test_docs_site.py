"""The README and the documentation site (docs/, built by Sphinx in CI with warnings as
errors) hold together without Sphinx installed: the set-up commands stay where readers
and CI look for them, every page is in a toctree, every relative link and anchor leads
somewhere, and no page speaks the project's internal shorthand."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
COMMANDS = (
    "pip install -e . && python -m lamina.demo\n"
    "pip install -e .[test] -e examples/lamina-example-backend && pytest\n"
)


def _prose(text):
    """The text outside fenced code blocks."""
    return re.sub(r"^```.*?^```\n", "", text, flags=re.M | re.S)


def _slug(heading):
    """The anchor GitHub and MyST (myst_heading_anchors) give a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path):
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", _prose(path.read_text()), re.M)}


def test_the_readme_opens_with_the_two_set_up_commands():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"^```\n(.*?)^```\n", readme, re.M | re.S).group(1)
    assert first_block == COMMANDS
    # CI installs as the README says
    assert COMMANDS.splitlines()[1].removesuffix(" && pytest") in (ROOT / ".ci/run").read_text()


def test_every_page_of_the_site_is_in_a_toctree():
    listed = set()
    for page in PAGES:
        for block in re.findall(r"^```\{toctree\}\n(.*?)^```", page.read_text(), re.M | re.S):
            for entry in block.splitlines():
                if entry.strip() and not entry.startswith(":"):
                    listed.add((page.parent / f"{entry.strip()}.md").resolve())
    assert {p.resolve() for p in PAGES} - {(DOCS / "index.md").resolve()} == listed


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_every_relative_link_leads_somewhere(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target} (no such heading)")
    assert not broken, broken


# Words only the project's history explains: the papers are named by what they are
# (the PyTorch per-operator framework overhead study, the TensorFlow CPU optimization
# paper), never by the project's shorthand, and no page points outside the repository.
SHORTHAND = re.compile(r"\bseed [12]\b|\bissue \d+|\bissue's\b|\.\./shared", re.I)


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_page_speaks_internal_shorthand(page):
    assert not SHORTHAND.findall(page.read_text())
