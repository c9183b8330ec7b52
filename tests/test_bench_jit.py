"""``python -m lamina.bench jit``: its workloads compute what NumPy computes, its
agreement check stops a wrong result, its report. Timings are not checked."""

import argparse

import numpy as np
import pytest

import lamina as lm
from lamina.tools.bench import jit as bench
from lamina.tools.bench import main, timing

pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]

QUICK = ["jit", "--quick", "--in-process", "--no-torch", "--sizes", "10", "--no-compile-times"]


def test_the_hand_written_mlp_gradients_are_finite_differences_of_the_loss():
    """The NumPy reference every library's training step is checked against."""
    data = {k: v.astype(np.float64) for k, v in bench.mlp_data().items() if k != "labels"}
    labels = bench.mlp_data()["labels"]
    reference = bench.mlp_reference()

    def loss(p):
        hidden = np.tanh(p["x"] @ p["hidden.weight"].T + p["hidden.bias"])
        logits = hidden @ p["out.weight"].T + p["out.bias"]
        logits -= logits.max(axis=1, keepdims=True)
        log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        return -log_p[np.arange(len(labels)), labels].mean()

    assert reference["loss"] == pytest.approx(loss(data), rel=1e-12)
    h = 1e-6
    for name, index in [
        ("hidden.weight", (5, 100)),
        ("hidden.bias", (511,)),
        ("out.weight", (9, 17)),
        ("out.bias", (3,)),
    ]:
        up, down = dict(data), dict(data)
        up[name], down[name] = data[name].copy(), data[name].copy()
        up[name][index] += h
        down[name][index] -= h
        numeric = (loss(up) - loss(down)) / (2 * h)
        assert numeric == pytest.approx(reference[name][index], rel=1e-5, abs=1e-9), name


def _cells(line: str, rule: str) -> list[str]:
    """The cells of a table line, cut where the rule of dashes under the heading is."""
    spans, start = [], 0
    for dashes in rule.split("  "):
        spans.append((start, start + len(dashes)))
        start += len(dashes) + 2
    return [line[a:b].strip() for a, b in spans]


def test_quick_run_prints_every_workload(capsys):
    main(QUICK)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("PyTorch not used")
    assert "median of 2 interleaved rounds" in lines[1]
    rule = lines[4]
    table = {tuple(_cells(line, rule)[:2]): _cells(line, rule)[2:] for line in lines[5:]}
    # the PyTorch columns, empty without it, are left out
    assert _cells(lines[3], rule) == [
        "workload",
        "size",
        "lamina eager us",
        "lamina compiled us",
        "NumPy us",
        "lamina compiled/eager",
    ]
    assert list(table) == [
        ("chain of 10 ops", "10"),
        ("per op", "10"),
        ("add of 8 inputs", "8 x 1"),
        ("MLP step ->512->10", "128x256"),
    ]
    chain, per_op = table["chain of 10 ops", "10"], table["per op", "10"]
    for total, one in zip(chain[:3], per_op[:3]):
        assert float(one) == pytest.approx(float(total) / 10, abs=0.006)
    eager, compiled, numpy, ratio = table["MLP step ->512->10", "128x256"]
    assert numpy == ""  # NumPy has no training step
    assert float(ratio[:-1]) == pytest.approx(
        float(compiled.replace(",", "")) / float(eager.replace(",", "")), abs=0.006
    )


def test_a_wrong_compiled_result_stops_the_benchmark(monkeypatch):
    compile = lm.jit.compile

    def off_by_a_little(fn):
        compiled = compile(fn)
        return lambda *args: compiled(*args) * 1.001

    monkeypatch.setattr(lm.jit, "compile", off_by_a_little)
    with pytest.raises(SystemExit, match=r"lamina.jit chain of 10 elements: .* differs"):
        main(QUICK)


def test_the_agreement_check_names_the_difference():
    want = np.array([1.0, -2.0, 3.0])
    bench.agree("x", "y", want * (1 + 1e-6), want)  # float32 rounding passes
    with pytest.raises(SystemExit, match="x y: the result differs .* by up to 0.003"):
        bench.agree("x", "y", want * 1.001, want)
    with pytest.raises(SystemExit, match="differs"):
        bench.agree("x", "y", [1.0, np.nan, 3.0], want)
    with pytest.raises(SystemExit, match=r"shape \(2,\), NumPy's \(3,\)"):
        bench.agree("x", "y", want[:2], want)


def test_the_compile_time_table_follows_the_timings():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(QUICK[1:])
    results = {("chain", 10): {"lamina": 2e-6, "lamina.jit": 1e-6, "numpy": 4e-6}}
    compiled = {
        "lamina.jit": {"cold": 1.234, "warm": 0.05},
        "torch.compile": {"cold": None, "warm": None},
    }
    lines = bench.report(args, results, ["lamina", "lamina.jit", "numpy"], compiled).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("compile time"))
    assert lines[start + 2].split() == ["compiler", "cold", "s", "warm", "s"]
    assert lines[start + 4].split() == ["lamina", "compiled", "1.23", "0.05"]
    assert lines[start + 5].split() == ["torch.compile", "failed", "failed"]


def test_eager_pytorch_runs_the_same_workloads_and_agrees():
    """PyTorch gets the same inputs and initial weights: its first results pass the
    check (a case that disagreed would stop here), and the timed functions run."""
    pytest.importorskip("torch")
    torch = bench._library("torch")
    for workload, size in [("chain", 10), ("add8", 1), ("mlp", bench.MLP["batch"])]:
        timed = bench._case(torch, workload, size)
        assert timed is not timing.not_run
        timed()
