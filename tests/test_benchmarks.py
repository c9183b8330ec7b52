"""Every asv benchmark imports and runs once, so a broken benchmark fails CI.

Discovers benchmarks the way asv does (``time_``, ``timeraw_``, ``peakmem_``, ``mem_``,
``track_`` functions and methods in the modules of asv_benchmarks/benchmarks) and calls
each one's ``setup``, body and ``teardown`` once per parameter combination, at the
smallest size only (see ``_param_combinations``); a combination that ``setup`` skips
(``NotImplementedError``) is left out. ``timeraw_`` code runs in a fresh process, as asv
runs it. Timing is left to asv; full runs stay out of CI
(see asv_benchmarks/README.md).
"""

import importlib.util
import inspect
import itertools
import json
import pkgutil
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# the suite is a tool: its code runs the same under either per-call core
pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "asv_benchmarks"
BENCH_DIR = SUITE / "benchmarks"
PACKAGE = "lamina_asv_benchmarks"  # imported under a name that cannot clash
PREFIXES = ("time_", "timeraw_", "peakmem_", "mem_", "track_")


def _import_suite():
    spec = importlib.util.spec_from_file_location(
        PACKAGE, BENCH_DIR / "__init__.py", submodule_search_locations=[str(BENCH_DIR)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    spec.loader.exec_module(package)
    return [
        importlib.import_module(f"{PACKAGE}.{info.name}")
        for info in pkgutil.iter_modules([str(BENCH_DIR)])
    ]


MODULES = _import_suite()


def _benchmarks():
    """(id, class or None, name) for every benchmark of the suite."""
    found = []
    for module in MODULES:
        short = module.__name__.removeprefix(PACKAGE + ".")
        for name, obj in vars(module).items():
            if inspect.isfunction(obj) and name.startswith(PREFIXES):
                found.append((f"{short}.{name}", None, obj))
            elif inspect.isclass(obj) and obj.__module__ == module.__name__:
                for attr in dir(obj):
                    if attr.startswith(PREFIXES) and callable(getattr(obj, attr)):
                        found.append((f"{short}.{obj.__name__}.{attr}", obj, attr))
    return found


BENCHMARKS = _benchmarks()


def _param_combinations(owner, name):
    """Every combination of parameter values, except that a size (a parameter named
    ``n``, listed smallest first) takes only its first value: each code path once, at
    the smallest size. ``timeraw_`` benchmarks (a fresh process each) run only the first
    combination."""
    params = getattr(owner, "params", [])
    if not params:
        return [()]
    if not all(isinstance(p, (list, tuple)) for p in params):
        params = [params]  # asv: a flat list is the values of a single parameter
    names = getattr(owner, "param_names", [])
    params = [p[:1] if n == "n" else p for p, n in itertools.zip_longest(params, names)]
    combos = list(itertools.product(*params))
    return combos[:1] if name.startswith("timeraw_") else combos


def _run_raw(result):
    stmt, setup = result if isinstance(result, tuple) else (result, "")
    code = textwrap.dedent(setup) + "\n" + textwrap.dedent(stmt)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _run(klass, attr, combo):
    """setup, body, teardown once; False when setup skips the combination."""
    if klass is None:
        func, setup, teardown, name = attr, None, None, attr.__name__
    else:
        instance = klass()
        func, name = getattr(instance, attr), attr
        setup = getattr(instance, "setup", None)
        teardown = getattr(instance, "teardown", None)
        if getattr(instance, "setup_cache", None) is not None:
            combo = (instance.setup_cache(), *combo)
    try:
        if setup is not None:
            setup(*combo)
    except NotImplementedError:  # asv's way to skip a parameter combination; asv
        if teardown is not None:  # still calls teardown afterwards
            teardown(*combo)
        return False
    try:
        result = func(*combo)
        if name.startswith("timeraw_"):
            _run_raw(result)
        elif name.startswith("track_"):
            assert isinstance(result, (int, float)), f"{name} returned {result!r}"
    finally:
        if teardown is not None:
            teardown(*combo)
    return True


def test_suite_has_benchmarks():
    assert len(BENCHMARKS) >= 10, [b[0] for b in BENCHMARKS]


@pytest.mark.parametrize("klass, attr", [b[1:] for b in BENCHMARKS], ids=[b[0] for b in BENCHMARKS])
def test_benchmark_runs_once(klass, attr):
    import lamina as lm

    threads = lm.get_num_threads()
    owner, name = (klass, attr) if klass is not None else (attr, attr.__name__)
    ran = [combo for combo in _param_combinations(owner, name) if _run(klass, attr, combo)]
    assert ran, "every parameter combination was skipped"
    assert lm.get_num_threads() == threads, "the benchmark's teardown must restore threads"
    assert "asv_bench_plugin" not in {row["name"] for row in lm.backends.list()}


def test_param_names_match_params():
    for _, klass, _ in BENCHMARKS:
        if klass is not None and getattr(klass, "params", None):
            params = klass.params
            n = len(params) if all(isinstance(p, (list, tuple)) for p in params) else 1
            assert len(getattr(klass, "param_names", [])) == n, klass


def test_no_module_attribute_is_mistaken_for_a_setup_function():
    # asv looks up module-level setup/teardown case-insensitively: a constant named
    # SETUP is called as the setup of every benchmark in the module, and fails
    for module in MODULES:
        for name, value in vars(module).items():
            if name.lower() in ("setup", "teardown", "setup_cache"):
                assert callable(value), f"{module.__name__}.{name} is not a function"


def test_asv_config():
    text = (SUITE / "asv.conf.json").read_text()  # JSON with // comment lines, as asv allows
    conf = json.loads(
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))
    )
    assert (SUITE / conf["benchmark_dir"]).resolve() == BENCH_DIR
    assert (SUITE / conf["repo"]).resolve() == ROOT
    assert conf["environment_type"] == "virtualenv"
    assert "--no-deps" in " ".join(conf["build_command"])
    install = " ".join(conf["install_command"])
    assert "--force-reinstall" in install and "--no-deps" in install
    for key in ("env_dir", "results_dir", "html_dir"):  # under the ignored .asv/
        assert (SUITE / conf[key]).resolve().is_relative_to(ROOT / ".asv"), key
    assert ".asv/" in (ROOT / ".gitignore").read_text().split()


def test_asv_check_discovers_the_suite():
    asv = shutil.which("asv", path=str(Path(sys.executable).parent))
    assert asv, "asv is not installed beside this Python (it is in the test extra)"
    proc = subprocess.run(
        [asv, "check", "--python=same"], cwd=SUITE, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
