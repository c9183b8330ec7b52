"""``python -m lamina.bench nn``: the table of every primitive, timed in a child
process per library (Note [Separate processes] in lamina.tools.bench.timing) or in
this one, on a tiny input (the issue's size is the command's default). Timing is left
to the command itself (no timed tests)."""

import pytest

from lamina.tools.bench import main, nn, timing

TINY = ["--shape", "1", "2", "6", "6", "--rounds", "1", "--settle", "0"]


def _rows(out):
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("primitive"))
    return lines[header], [line for line in lines[header + 2 :] if line and line[0] != "*"][:-1]


@pytest.mark.parametrize("where", ["--in-process", "child"])
def test_command_prints_every_primitive_in_both_layouts(where, capsys):
    main(["nn", *TINY, "--no-torch"] + ([where] if where.startswith("--") else []))
    out = capsys.readouterr().out
    assert ("in this process" if where == "--in-process" else "in a process of its own") in out
    head, rows = _rows(out)
    assert head.split() == ["primitive", "layout", "lamina", "ms", "GFLOP/s", "lamina"]
    names = [(c.name, c.layout) for c in nn._cases((1, 2, 6, 6))]
    assert len(rows) == len(names) == 16
    for (name, layout), row in zip(names, rows):
        assert row.startswith(name) and row[len(name) :].split()[0] == layout
        assert float(row[len(name) :].split()[1]) >= 0
    # GFLOP/s for the convolutions only
    assert [len(r[len(n) :].split()) for (n, _), r in zip(names, rows)][:3] == [3, 3, 2]


def test_beside_pytorch_each_in_its_own_process(capsys):
    pytest.importorskip("torch")  # the optional peer
    main(["nn", *TINY, "--only", "relu", "--layout", "NCHW"])
    out = capsys.readouterr().out
    assert "PyTorch 2" in out and "each in its own process" in out
    head, rows = _rows(out)
    assert head.split()[2:8] == ["lamina", "ms", "torch", "ms", "lamina/torch", "goal"]
    assert [r.split()[:2] for r in rows] == [["relu", "NCHW"], ["relu", "forward"]]
    cells = rows[0].split()
    assert float(cells[2]) >= 0 and float(cells[3]) >= 0
    assert cells[4].endswith("x") and "<= 1.0x" in rows[0]


def test_a_runner_times_the_cases_it_is_given():
    cases = [["relu", "NHWC"], ["relu", "NCHW"]]
    config = {"shape": [1, 2, 6, 6], "threads": 1, "allocator": False, "cases": cases}
    with timing.started("nn", ["lamina"], config, in_process=True) as (runner,):
        assert list(runner.warm()) == [("relu", "NHWC"), ("relu", "NCHW")]
        samples = dict(runner.round())
    assert list(samples) == [("relu", "NHWC"), ("relu", "NCHW")]
    assert all(s > 0 for s in samples.values())
