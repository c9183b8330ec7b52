"""lamina's own tests must not depend on which other plugins a user has installed: the
tests that look at plugins, devices and tables run again with an unrelated third-party
plugin installed (tests/plugins/lamina_unrelated_plugin, found through the entry point
its dist-info folder declares)."""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
PLUGIN_SENSITIVE = [
    "test_dispatch.py",
    "test_backends_thirdparty.py",
    "test_sparse.py",
    "test_layers.py",
    "test_architecture.py",
    "test_plugin_contract.py",
]


def _env():
    path = os.pathsep.join(p for p in (str(HERE / "plugins"), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path)


def test_the_unrelated_plugin_is_found_and_registers():
    code = (
        "import lamina as lm\n"
        "row = next(r for r in lm.backends.list() if r['name'] == 'unrelated')\n"
        "print(row['source'], row['new_devices'], lm.ones(2, device='unrelated').device)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["entry", "point", "['unrelated']", "unrelated"]


@pytest.mark.core_independent  # another process; the suite runs these files under both cores
def test_plugin_sensitive_tests_pass_with_an_unrelated_plugin_installed():
    files = [str(HERE / f) for f in PLUGIN_SENSITIVE if (HERE / f).exists()]
    # -n0: one process, this test already runs in one of the suite's workers
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n0", *files],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=HERE.parent,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
