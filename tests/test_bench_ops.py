"""``python -m lamina.bench ops``: its operator list, the calls it times (each library's
call computes what NumPy's does), its ratios and its report. Timings are not checked."""

import math

import numpy as np
import pytest

from lamina.dispatch.schema import OPERATORS
from lamina.tools.bench import main
from lamina.tools.bench import ops as sweep

pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]


def test_the_list_follows_the_schema_and_every_operator_resolves_in_lamina():
    ops = sweep.select("")
    names = {op.name for op in ops}
    for op in ops:
        assert callable(sweep.resolve("lamina", op.paths["lamina"])), op.name
    float_elementwise = {
        op.name
        for op in OPERATORS.values()
        if op.category == "elementwise"
        and op.inplace_of is None
        and op.dtypes not in ("complex", "int", "intbool")
        and op.name not in ("positive", "conj", "real")
    }
    assert float_elementwise <= names
    assert "bitwise_and" not in names and "imag" not in names  # no float32 inputs
    assert "positive" not in names and "real" not in names  # nothing to time in PyTorch
    for reduction in ("sum", "prod", "mean", "var", "std", "max", "min", "argmax", "any"):
        assert {reduction, f"{reduction} axis=-1"} <= names
    assert {"cumulative_sum", "sort", "argsort", "softmax", "cross_entropy"} <= names
    assert [op.category for op in ops] == sorted(
        (op.category for op in ops), key=sweep.CATEGORIES.index
    )


def test_numpy_names_come_from_the_schema_and_nn_functions_have_none():
    ops = {op.name: op for op in sweep.select("")}
    assert ops["round"].paths["numpy"] == "rint"
    assert ops["cumulative_sum"].paths["numpy"] == "cumsum"
    assert ops["vector_norm axis=-1"].paths["numpy"] == "linalg.vector_norm"
    assert ops["softmax"].paths["numpy"] is None
    assert ops["max"].paths["torch"] == "amax"  # torch.max would return indices too


def _host(result):
    return np.asarray(result)


def test_every_case_computes_what_numpy_computes():
    """The sweep times like against like: lamina's call on its inputs gives NumPy's
    result (sorting stable in both, variance without correction, axis -1 alike)."""
    for op in sweep.select(""):
        if not sweep.available(op, "numpy"):
            continue
        got = _host(sweep.make_case("lamina", op, 12)())
        want = sweep.make_case("numpy", op, 12)()
        assert got.shape == np.shape(want), op.name
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=op.name)


def test_nn_cases_compute_what_pytorch_computes():
    torch = pytest.importorskip("torch")
    for op in sweep.select(""):
        if op.category != "nn" or not sweep.available(op, "torch"):
            continue
        got = _host(sweep.make_case("lamina", op, 12)())
        want = sweep.make_case("torch", op, 12)()
        assert isinstance(want, torch.Tensor)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6, err_msg=op.name)


def test_ratios_and_geometric_mean():
    assert sweep.ratios({"lamina": 3.0, "torch": 2.0, "numpy": 1.5}) == (1.5, 2.0)
    assert sweep.ratios({"lamina": 3.0, "torch": 2.0, "numpy": None}) == (1.5, 1.5)
    assert sweep.ratios({"lamina": 3.0, "numpy": 6.0}) == (None, 0.5)  # no PyTorch
    assert math.isclose(sweep.geometric_mean([0.5, 2.0, None, 4.0]), 4 ** (1 / 3))
    assert sweep.geometric_mean([None]) is None


def test_shapes_are_as_square_as_the_size_allows():
    assert sweep.shape_of(10**6) == (1000, 1000)
    assert sweep.shape_of(10**3) == (25, 40)
    assert sweep.shape_of(7) == (1, 7)


def test_quick_run_prints_the_table_and_its_summary(capsys):
    main(["ops", "--quick", "--in-process", "--no-torch", "--ops", "add,sum axis=-1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("PyTorch not used")
    # the PyTorch columns, empty without it, are left out
    assert (
        lines[3].split()
        == "operator category elements threads lamina us NumPy us lamina/best".split()
    )
    rows = {line.split()[0]: line.split() for line in lines[5:7]}
    assert rows["add"][1:4] == ["elementwise", "100", "1"]
    assert rows["sum"][1:5] == ["axis=-1", "reduction", "100", "1"]
    summary = lines.index("geometric means of the ratios")
    assert lines[summary + 2].split() == ["category", "threads", "cases", "lamina/best"]
    assert [line.split()[0] for line in lines[summary + 4 : summary + 7]] == [
        "elementwise",
        "reduction",
        "all",
    ]
    worst = lines.index("furthest behind (lamina / best)")
    assert sorted(line.split()[0] for line in lines[worst + 4 :]) == ["add", "sum"]


def test_an_operator_pattern_matching_nothing_names_the_option():
    with pytest.raises(SystemExit, match="--ops 'nothing_like_this'"):
        main(["ops", "--quick", "--in-process", "--ops", "nothing_like_this"])
