"""Packaging guards: dispatch/, autograd/ and backends/ are top-level folders mapped into
the ``lamina`` namespace with setuptools ``package-dir`` (see DESIGN.md), so every
subpackage must be listed in ``[tool.setuptools] packages`` or wheels silently lose it.
"""

import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
# folder in the repository -> its import name
ROOTS = {
    "lamina": "lamina",
    "dispatch": "lamina.dispatch",
    "autograd": "lamina.autograd",
    "backends": "lamina.backends",
}
MODULES = [
    "lamina.dispatch",
    "lamina.backends",
    "lamina.autograd",
    "lamina.backends.numba_cpu",
    "lamina.backends.numpy_ref",
    "lamina.backends.sparse",
]


def _setuptools_config():
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _package_folders():
    """import name -> folder, for every folder with an __init__.py under the four roots."""
    found = {}
    for folder, name in ROOTS.items():
        base = ROOT / folder
        assert (base / "__init__.py").is_file(), f"{folder}/ has no __init__.py"
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if "__pycache__" in rel.parts:
                continue
            found[".".join((name, *rel.parts))] = init.parent
    return found


def _folder_of(package, package_dir):
    """Where setuptools looks for ``package``: the longest mapped prefix, then the rest."""
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in package_dir:
            return ROOT.joinpath(package_dir[prefix], *parts[i:])
    return ROOT.joinpath(package_dir.get("", ""), *parts)


def test_every_package_folder_is_listed_in_pyproject():
    listed = _setuptools_config()["packages"]
    folders = _package_folders()
    missing = sorted(set(folders) - set(listed))
    assert not missing, (
        f"folders with __init__.py missing from [tool.setuptools] "
        f"packages in pyproject.toml: {missing}"
    )
    assert len(listed) == len(set(listed)), f"duplicates in packages: {listed}"
    # the known ones, so that a broken scan cannot make the test pass vacuously
    assert set(MODULES) | {"lamina"} <= set(folders)


def test_package_dir_maps_every_package_to_its_folder():
    config = _setuptools_config()
    package_dir = config["package-dir"]
    for folder, name in ROOTS.items():
        assert package_dir.get(name) == folder, (
            f"package-dir must map {name!r} to {folder!r}, got {package_dir.get(name)!r}"
        )
    folders = _package_folders()
    for package in config["packages"]:
        where = _folder_of(package, package_dir)
        assert (where / "__init__.py").is_file(), (
            f"{package} is listed but package-dir resolves it to {where}, which has no __init__.py"
        )
        assert where.resolve() == folders[package].resolve(), (package, where)


def test_subpackages_import_from_the_repository_folders():
    code = (
        "import sys, lamina, " + ", ".join(MODULES) + "\n"
        "for name in sys.argv[1:]:\n"
        "    print(name, sys.modules[name].__file__)\n"
        "import lamina as lm\n"
        "assert lm.dispatch is sys.modules['lamina.dispatch']\n"
        "assert lm.backends is sys.modules['lamina.backends']\n"
        "print(lm.add(lm.asarray([1, 2]), 3).tolist())\n"
    )
    # run outside the repository, so only the installed mapping can find the packages
    out = subprocess.run(
        [sys.executable, "-c", code, *MODULES], capture_output=True, text=True, cwd="/", timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    files = dict(line.split(" ", 1) for line in lines[:-1])
    for name in MODULES:
        sub = name.split(".")[1]
        top = sub if sub in ROOTS else "lamina"  # lamina.dispatch.* lives in dispatch/
        assert Path(files[name]).resolve().is_relative_to(ROOT / top), (name, files[name])
    assert lines[-1] == "[4, 5]"


def test_no_top_level_dispatch_or_autograd_package():
    # DESIGN.md: the folders are only ever installed as lamina.*, never as top-level
    # packages (an unrelated "autograd" from PyPI may exist; ours must not shadow it)
    code = (
        "import importlib.util\n"
        "for n in ('dispatch', 'autograd', 'backends'):\n"
        "    s = importlib.util.find_spec(n)\n"
        "    print(n, s.origin if s else None)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=60
    )
    assert out.returncode == 0, out.stderr
    rows = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert sorted(rows) == ["autograd", "backends", "dispatch"]
    for name, origin in rows.items():
        assert origin == "None" or not Path(origin).resolve().is_relative_to(ROOT), (
            f"the repository's {name}/ is importable as a top-level package: {origin}"
        )
