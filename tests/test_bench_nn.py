"""``python -m lamina.bench nn``: the table of every primitive, timed in a child
process per library (Note [Separate processes] in lamina.tools.bench.timing) or in
this one, on a tiny input (the command's default is 16x64x56x56); its wording, its
columns, its report without PyTorch and its plot. Timing is left to the command
itself (no timed tests)."""

import argparse
import json
import re
import struct
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from lamina.tools.bench import main, nn, output, timing

pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]

# words of the project's own documents, which mean nothing to a user
INTERNAL = re.compile(r"seed|issue|\.\./shared", re.IGNORECASE)
TINY = ["--shape", "1", "2", "6", "6", "--primitives", "convnets", "--rounds", "1", "--settle", "0"]


def _rows(out):
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("primitive"))
    end = (lines + [""]).index("", header)  # the table ends at a blank line or the end
    assert_aligned_and_filled(lines[header:end])
    return lines[header], lines[header + 2 : end]


def assert_aligned_and_filled(table):
    """Every column of ``table`` (its heading, dashes, rows) has its dashes under the
    heading and a value in some row; no line ends in spaces."""
    head, dashes, *rows = table
    spans = [m.span() for m in re.finditer(r"-+", dashes)]
    assert len(spans) == len(re.split(r"\s{2,}", head.strip()))
    for start, end in spans:
        assert head[start:end].strip(), f"a heading missing over {dashes[start:end]}"
        assert any(r[start:end].strip() for r in rows), f"empty column {head[start:end]!r}"
    assert all(line == line.rstrip() for line in table)


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


def test_wording_names_the_workloads(capsys):
    main(["nn", *TINY, "--only", "relu", "--layout", "NCHW", "--no-torch", "--in-process"])
    out = capsys.readouterr().out
    assert "convolution, pooling, LRN, batch norm and activation primitives" in out
    with pytest.raises(SystemExit) as exited:
        main(["nn", "--help"])
    assert exited.value.code == 0
    text = out + capsys.readouterr().out
    assert "AlexNet-, VGG- and Inception-v1-like" in text
    assert not INTERNAL.findall(text), INTERNAL.findall(text)


def _libs(peer):
    names = ["lamina", "torch"] if peer else ["lamina"]
    return [SimpleNamespace(name=n, version="1.0") for n in names]


def _args(argv):
    parser = argparse.ArgumentParser()
    nn.add_arguments(parser)
    return parser.parse_args(argv)


def _report(argv, names, peer):
    """The report of made-up timings of the cases named (name, layout)."""
    args = _args(argv)
    cases = [c for c in nn._cases(tuple(args.shape)) if (c.name, c.layout) in names]
    results = {(c.name, c.layout): {"lamina": 1e-3, "torch": 2e-3} for c in cases}
    return nn.report(args, cases, results, _libs(peer)), args, cases, results


def test_columns_without_a_value_are_left_out():
    """No GFLOP/s without a convolution; no goal column where no row has a goal."""
    text = _report([], [("relu", "NHWC")], peer=True)[0]
    head, rows = _rows(text)
    assert head.split() == ["primitive", "layout", "lamina", "ms", "torch", "ms", "lamina/torch"]
    assert rows[0].split() == ["relu", "NHWC", "1.00", "2.00", "0.50x"]
    assert "GFLOP/s" not in text and "goal" not in text
    conv = ("conv2d 3x3 pad 1, forward", "NCHW")
    head, rows = _rows(_report([], [conv, ("relu", "NHWC")], peer=True)[0])
    assert head.split()[-4:] == ["GFLOP/s", "lamina", "GFLOP/s", "torch"]
    assert output.table(["a", "b", "c"], [["x", "", "1"], ["y", "", "2"]], left=1) == [
        "a  c",
        "-  -",
        "x  1",
        "y  2",
    ]


def test_without_pytorch_the_report_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, as uninstalled
    main(["nn", *TINY, "--only", "relu", "--layout", "NCHW", "--in-process"])
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        "PyTorch not found: lamina alone is timed; "
        f"`pip install torch=={output.TORCH_VERSION}` adds it as a peer"
    )
    assert _rows(out)[0].split() == ["primitive", "layout", "lamina", "ms"]
    assert "torch" not in out.split("\n", 1)[1].lower()  # after the line saying so
    main(["nn", *TINY, "--only", "relu", "--layout", "NCHW", "--in-process", "--json"])
    out, err = capsys.readouterr()
    assert json.loads(out)[0]["primitive"] == "relu" and "PyTorch not found" in err


def test_plot_without_matplotlib_names_the_bench_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit, match=re.escape("pip install 'lamina[bench]'")):
        main(["nn", *TINY, "--plot", "unused.png"])


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert width >= 600 and height >= 300 and len(data) > 20_000


def test_plot_draws_the_ratio_per_primitive(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    main(["nn", *TINY, "--only", "relu", "--no-torch", "--in-process", "--plot",
          str(tmp_path / "alone.png")])  # fmt: skip
    _assert_png(tmp_path / "alone.png")
    every = [(c.name, c.layout) for c in nn._cases((1, 2, 6, 6))]
    _, args, cases, results = _report([], every, peer=True)
    nn.plot(tmp_path / "ratio.png", args, cases, results, _libs(peer=True))
    _assert_png(tmp_path / "ratio.png")


def test_model_primitives_compute_the_same_in_both_libraries():
    """Each forward case of bench models' primitives, at batch 1, gives PyTorch's
    result (the cases call the same thing in both); those lamina lacks are left out."""
    pytest.importorskip("torch")
    libs = [nn._lamina(), nn._torch()]
    cases = [c for c in nn._model_cases(batch=1) if "backward" not in c.name]
    assert len(cases) == 6 and all(c.goal == nn.MODEL_GOAL for c in cases)
    for case in cases:
        if not hasattr(libs[0].F, case.needs):
            continue
        mine, ref = (case.make(lib, None, case.layout)() for lib in libs)
        np.testing.assert_allclose(
            mine.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"{case.name} {case.layout}"
        )


def test_primitives_option_selects_the_groups_and_missing_ones_are_named():
    shape = (1, 2, 6, 6)

    def names(cases):
        return [(c.name, c.layout) for c in cases]

    convnets, models = nn._cases(shape), nn._model_cases()
    assert names(nn._selected_cases(shape, "convnets")) == names(convnets)
    assert names(nn._selected_cases(shape, "models")) == names(models)
    assert names(nn._selected_cases(shape, "all")) == names(convnets + models)
    args = _args(["--primitives", "models"])
    results = {(c.name, c.layout): {"lamina": 1e-3} for c in models[:1]}
    text = nn.report(args, models[:1], results, _libs(False), ["layer_norm", "silu"])
    assert "the primitives of ResNet, MobileNet v2 and a Transformer encoder" in text
    assert "AlexNet" not in text
    assert text.splitlines()[-1] == "not timed: lamina has no layer_norm, silu yet"
