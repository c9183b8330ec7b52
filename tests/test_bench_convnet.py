"""``python -m lamina.bench convnet``: its three models build, run and learn in lamina;
with PyTorch installed, the agreement check passes for identical models and catches
a model whose weights differ; the command prints its table, in words a user knows,
says when PyTorch is missing, and plots. Timing is left to the command itself (no
timed tests)."""

import argparse
import contextlib
import io
import json
import math
import re
import struct
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import lamina as lm
from lamina.dispatch import memory
from lamina.tools.bench import convnet, main, output, timing

pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]

MODELS = list(convnet.ARCHITECTURES)
QUICK = ["convnet", "--model", "alexnet", "--batch", "1", "--rounds", "1", "--mode", "infer",
         "--settle", "0"]  # fmt: skip
# words of the project's own documents, which mean nothing to a user
INTERNAL = re.compile(r"seed|issue|\.\./shared", re.IGNORECASE)


def _batch(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *convnet.IMAGE), dtype=np.float32)
    return lm.asarray(x), lm.asarray(rng.integers(0, convnet.CLASSES, n))


@pytest.mark.parametrize("name", MODELS)
def test_model_outputs_class_scores_and_learns_a_batch(name):
    lm.random.seed(0)
    model = convnet.build(convnet.ARCHITECTURES[name], convnet._lamina())
    x, y = _batch(2)
    assert model(x).shape == (2, convnet.CLASSES)
    assert model(x).dtype == lm.float32
    optimizer = lm.optim.SGD(model.parameters(), lr=0.02)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = lm.nn.CrossEntropyLoss()(model(x), y)
        loss.backward()
        losses.append(float(loss))
        for pname, p in model.named_parameters():
            assert p.grad is not None, f"{name}: no gradient for {pname}"
            assert np.isfinite(p.grad.numpy()).all(), f"{name}: {pname}"
        optimizer.step()
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0], f"{name}: loss did not decrease: {losses}"


def test_conv_before_batch_norm_has_no_bias():
    model = convnet.build(convnet.ARCHITECTURES["vgg"], convnet._lamina())
    assert model[0].bias is None and isinstance(model[1], lm.nn.BatchNorm2d)
    alexnet = convnet.build(convnet.ARCHITECTURES["alexnet"], convnet._lamina())
    assert alexnet[0].bias is not None


def test_agreement_with_pytorch_and_a_mismatch_is_caught():
    torch = pytest.importorskip("torch")
    libs = [convnet._lamina(), convnet._torch()]
    threads = torch.get_num_threads()
    for name in MODELS:
        lm.random.seed(1)
        models = {"lamina": convnet.build(convnet.ARCHITECTURES[name], libs[0])}
        assert all(p.dtype == lm.float32 for p in models["lamina"].parameters())
        models["torch"] = convnet.build(convnet.ARCHITECTURES[name], libs[1])
        convnet.copy_weights(models["lamina"], models["torch"])
        agreement = convnet.check_agreement(name, models, libs, "NCHW", batch=2)
        assert agreement.ok, agreement.message()
        assert abs(agreement.loss[0] - agreement.loss[1]) <= 1e-3 * abs(agreement.loss[1])
    # the last model with one weight of PyTorch's changed: refused, that weight named
    with torch.no_grad():
        models["torch"][0].weight[0, 0, 0, 0] += 0.5
    agreement = convnet.check_agreement(name, models, libs, "NCHW", batch=2)
    assert not agreement.ok
    assert agreement.worst == "0.weight"
    assert "NOT TIMED" in agreement.message() and name in agreement.message()
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize("where", ["--in-process", "child"])
def test_command_prints_a_table(where, capsys):
    """By default the library is timed in a child process (Note [Separate processes])."""
    main([*QUICK, "--no-torch"] + ([where] if where.startswith("--") else []))
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert ("in this process" if where == "--in-process" else "each in its own process") in out
    assert lines[0] == "PyTorch not used (--no-torch): lamina alone is timed"
    assert lines[1].startswith("AlexNet-like convnet on 3x64x64 float32 images")
    assert not INTERNAL.findall(out), INTERNAL.findall(out)
    header = next(i for i, line in enumerate(lines) if line.startswith("model"))
    assert lines[header].split() == ["model", "mode", "batch", "lamina", "img/s"]
    row = lines[header + 2].split()
    assert row[:3] == ["alexnet", "infer", "1"] and float(row[3]) > 0


def test_several_thread_counts_give_a_column_each_and_the_scaling(capsys, monkeypatch):
    configs = []
    started = timing.started
    monkeypatch.setattr(
        timing,
        "started",
        lambda m, n, config, *a: configs.append(config) or started(m, n, config, *a),
    )
    main([*QUICK, "--no-torch", "--threads", "1,2", "--json"])
    assert [c["threads"] for c in configs] == [1, 2]  # each runner on its own count
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [(r["model"], r["batch"], r["threads"]) for r in rows] == [
        ("alexnet", 1, 1),
        ("alexnet", 1, 2),
    ]
    assert all(r["lamina_images_per_second"] > 0 for r in rows)
    args = convnet_args(["--threads", "1,2"])
    results = {("alexnet", "infer", 1): {("lamina", 1): 0.5, ("lamina", 2): 0.25}}
    cases = [convnet.Case("alexnet", "infer", 1)]
    table = convnet.report(args, cases, results, [convnet._lamina()], {}).splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("model"))
    assert table[header].split()[3:] == ["lamina", "1t", "lamina", "2t", "lamina", "2t/1t"]
    assert table[header + 2].split()[3:] == ["2.0", "4.0", "2.00x"]
    with pytest.raises(SystemExit, match="one thread count"):
        main(["convnet", "--threads", "1,2", "--in-process"])


def convnet_args(argv):
    parser = argparse.ArgumentParser()
    convnet.add_arguments(parser)
    return parser.parse_args(argv)


# both benches (bench nn's forward + backward arrays must pass the pool's 128 KiB)
BENCH_ALLOCATOR_RUNS = {
    "convnet": ["convnet", "--model", "vgg", "--batch", "2", "--mode", "train"],
    "nn": ["nn", "--shape", "2", "16", "32", "32", "--only", "relu", "--layout", "NCHW"],
}


@pytest.mark.parametrize("bench", list(BENCH_ALLOCATOR_RUNS))
def test_lamina_is_timed_with_its_pool_allocator_unless_told(bench, capsys):
    """The README's advice for training; the pure-Python core has no pool, and says so."""
    for setting in ("on", "off"):
        before = lm.memory.stats()["allocations"]
        main(BENCH_ALLOCATOR_RUNS[bench] + ["--rounds", "1", "--no-torch", "--settle", "0"]
             + ["--in-process", "--allocator", setting])  # fmt: skip
        out, err = capsys.readouterr()
        pooled = lm.memory.stats()["allocations"] > before
        if memory.AVAILABLE:
            assert f"pool allocator {setting})" in out and pooled == (setting == "on")
        else:
            assert "pool allocator off)" in out and not pooled
            assert ("needs the C core" in err) == (setting == "on")


def test_a_runner_gets_the_weights_it_is_given(tmp_path):
    """What a child process builds from the weights file is the parent's model."""
    lib = convnet._lamina()
    lm.random.seed(3)
    model = convnet.build(convnet.ARCHITECTURES["inception"], lib).eval()
    convnet.save_states(tmp_path / "w.npz", convnet._states({"inception": {"lamina": model}}))
    lm.random.seed(4)  # the runner's own initialization differs
    states = convnet.load_states(tmp_path / "w.npz")
    copy = convnet.models_of(lib, states, "NCHW")["inception"].eval()
    x, _ = _batch(2)
    with lm.no_grad():
        np.testing.assert_array_equal(copy(x).numpy(), model(x).numpy())


def test_a_child_process_that_fails_stops_the_command():
    config = {"weights": "/nonexistent/weights.npz", "layout": "NCHW", "threads": 1}
    child = timing.Child("convnet", "lamina", {**config, "cases": [["vgg", "infer", 1]]})
    with pytest.raises(SystemExit, match="lamina benchmark process exited with status 1"):
        list(child.warm())
    child.close()


@pytest.mark.parametrize("bad", ["0", "8,x", "", "8,8"])
def test_bad_batch_sizes_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        main(["convnet", "--batch", bad])
    assert "--batch" in capsys.readouterr().err


def test_help_names_the_workloads():
    texts = []
    for argv in (["--help"], ["convnet", "--help"]):
        with pytest.raises(SystemExit) as exited, contextlib.redirect_stdout(io.StringIO()) as f:
            main(argv)
        assert exited.value.code == 0
        texts.append(f.getvalue())
    assert "AlexNet-, VGG- and Inception-v1-like convnets" in texts[0] + texts[1]
    assert "convolution, pooling, LRN, batch norm and activation primitives" in texts[0]
    assert not INTERNAL.findall("".join(texts)), INTERNAL.findall("".join(texts))


def test_without_pytorch_the_report_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, as uninstalled
    main([*QUICK, "--in-process"])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == (
        "PyTorch not found: lamina alone is timed; "
        f"`pip install torch=={output.TORCH_VERSION}` adds it as a peer"
    )
    header = next(line for line in lines if line.startswith("model"))
    assert header.split() == ["model", "mode", "batch", "lamina", "img/s"]
    assert "agree" not in out + err  # no agreement check without PyTorch


def test_plot_without_matplotlib_names_the_bench_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit, match=re.escape("pip install 'lamina[bench]'")):
        main([*QUICK, "--plot", "unused.png"])


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert width >= 600 and height >= 300 and len(data) > 20_000


def test_plot_draws_bars_per_model_mode_and_thread_count(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    main([*QUICK, "--no-torch", "--in-process", "--plot", str(tmp_path / "alone.png")])
    _assert_png(tmp_path / "alone.png")
    # both libraries, every model and mode, two batch sizes and two thread counts
    args = convnet_args(["--batch", "1,8", "--threads", "1,2"])
    cases = convnet._cases(args)
    libs = [SimpleNamespace(name=n, version="1.0") for n in ("lamina", "torch")]
    seconds = {(lib.name, t): 0.01 / t for lib in libs for t in (1, 2)}
    results = {(c.model, c.mode, c.batch): seconds for c in cases}
    convnet.plot(tmp_path / "both.png", args, cases, results, libs)
    _assert_png(tmp_path / "both.png")
    # --jit: the compiled models' bars beside, a case one of them did not run left out
    args = convnet_args(["--batch", "1,8", "--threads", "1,2", "--jit"])
    names = ("lamina", "lamina.jit", "torch", "torch.compile")
    results = {
        (c.model, c.mode, c.batch): {
            (n, t): None if n == "lamina.jit" and c.model == "vgg" else 0.01 / t
            for n in names
            for t in (1, 2)
        }
        for c in cases
    }
    convnet.plot(tmp_path / "compiled.png", args, cases, results, libs)
    _assert_png(tmp_path / "compiled.png")


def test_jit_times_the_compiled_model_after_checking_it_against_eager(capsys):
    """``--jit``: lamina.jit's column and its ratio to eager; the compiled model checked
    against the eager one (and compile-timed) in a fresh process, cold and warm."""
    main([*QUICK, "--no-torch", "--in-process", "--jit", "--json"])
    out = json.loads(capsys.readouterr().out)
    (row,) = out["results"]
    assert row["lamina.jit_images_per_second"] > 0 and row["lamina_images_per_second"] > 0
    checks = out["compiled"]["first_calls"]
    assert [(c["start"], c["library"], c["model"], c["mode"]) for c in checks] == [
        ("cold", "lamina.jit", "alexnet", "infer"),
        ("warm", "lamina.jit", "alexnet", "infer"),
    ]
    assert all(c["agrees"] and 0 <= c["worst_ratio"] <= 1 and c["first"] > 0 for c in checks)
    assert out["compiled"]["memory_bytes"] == []  # no training step asked for


def test_a_compiled_model_agrees_with_eager_in_either_layout(tmp_path):
    """Note [Agreement in either layout]: a compiled lamina model is checked against
    eager lamina in both layouts, and agrees where either agrees; the report says which.
    A gradient off by a tenth disagrees with both."""
    rng = np.random.default_rng(0)
    want = {"loss": np.float64(4.6), "0.weight": rng.standard_normal((4, 3))}
    moved = {**want, "0.weight": want["0.weight"] * 1.1}  # a max pool picked the other value
    assert convnet._agreement(want, want)["agrees"]
    found = convnet._agreement(moved, want)
    assert not found["agrees"] and found["worst"] == "0.weight" and found["worst_ratio"] > 1

    def message(layout, agrees=True):
        found = {**convnet._agreement(want, want), "agrees": agrees, "layout": layout}
        return convnet._check_message("lamina.jit", "vgg", "train", found)

    assert "agrees with eager lamina (worst" in message(None)
    assert "agrees with eager lamina run channels-last (worst" in message("NHWC")
    assert "NOT TIMED -- differs from eager lamina:" in message(None, agrees=False)


def _probes(memory: bool) -> convnet.Probes:
    agrees = {"agrees": True, "loss": [4.6, 4.6], "worst": "0.weight", "worst_ratio": 0.01,
              "worst_abs": 1e-7, "first": 2.5, "then": 0.5}  # fmt: skip
    differs = {**agrees, "agrees": False, "worst": "3.weight", "worst_ratio": 7.0}
    failed = {"error": "NotImplementedError at compiled call 2: no (raised at x.py:1)"}
    checks = {}
    for start in ("cold", "warm"):
        checks[start, "lamina.jit", "vgg", "train"] = failed
        checks[start, "lamina.jit", "vgg", "infer"] = agrees
        checks[start, "torch.compile", "vgg", "train"] = differs
        checks[start, "torch.compile", "vgg", "infer"] = {**agrees, "first": 0.501}
    names = ["lamina", "lamina.jit", "torch", "torch.compile"]
    found = {"rss": 50 * 2**20, "pool": 10 * 2**20}
    steps = {("lamina", "vgg"): found, ("torch", "vgg"): {"rss": 60 * 2**20, "pool": None}}
    return convnet.Probes(1, checks, 32, steps if memory else {}, names)


def test_the_report_of_compiled_models_names_what_failed_and_their_costs():
    args = convnet_args(["--jit", "--batch", "1,32", "--model", "vgg"])
    probes = _probes(memory=True)
    assert probes.refused() == {
        "lamina.jit": [["vgg", "train"]],
        "torch.compile": [["vgg", "train"]],
    }
    cases = convnet._cases(args)
    seconds = {"lamina": 0.4, "lamina.jit": 0.2, "torch": 0.1, "torch.compile": 0.05}
    results = {
        (c.model, c.mode, c.batch): {
            (n, 2): None if c.mode == "train" and n in convnet.COMPILED else s
            for n, s in seconds.items()
        }
        for c in cases
    }
    libs = [SimpleNamespace(name=n, version="1.0") for n in ("lamina", "torch")]
    text = convnet.report(args, cases, results, libs, {}, probes)
    assert not INTERNAL.findall(text), INTERNAL.findall(text)
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("model"))
    assert re.split(r"\s{2,}", lines[header])[3:] == [
        "lamina img/s", "lamina.jit img/s", "torch img/s", "torch.compile img/s",
        "lamina/torch", "lamina.jit/lamina", "lamina.jit/torch.compile",
    ]  # fmt: skip
    assert lines[header + 2].split() == ["vgg", "train", "1", "2.5", "10.0", "0.25x"]
    assert lines[header + 4].split()[3:] == [
        "2.5",
        "5.0",
        "10.0",
        "20.0",
        "0.25x",
        "2.00x",
        "0.25x",
    ]
    assert "lamina.jit vgg train: NOT TIMED -- compiling or running it failed: " \
        "NotImplementedError at compiled call 2" in text  # fmt: skip
    assert "torch.compile vgg train: NOT TIMED -- differs from eager torch: loss 4.6 vs 4.6; " \
        "worst '3.weight'" in text  # fmt: skip
    assert "lamina.jit vgg infer: agrees with eager lamina (worst: 0.weight" in text
    compile_times = next(i for i, line in enumerate(lines) if line.endswith("torch.compile warm"))
    assert lines[compile_times + 2].split() == ["vgg", "train", "failed", "failed", "2.00", "2.00"]
    assert lines[compile_times + 3].split() == ["vgg", "infer", "2.00", "2.00", "<0.01", "<0.01"]
    assert "cold: the first such process, with the kernel and compiler caches as" in text
    memory = lines[
        lines.index(next(line for line in lines if line.startswith("model  lamina pool")))
    ]
    assert re.split(r"\s{2,}", memory) == ["model", "lamina pool", "lamina.jit pool", "lamina RSS",
                                  "lamina.jit RSS", "torch RSS", "torch.compile RSS"]  # fmt: skip
    assert lines[-1].split() == [
        "vgg",
        "10.0",
        "not",
        "run",
        "50.0",
        "not",
        "run",
        "60.0",
        "not",
        "run",
    ]
    assert "PyTorch on the CPU has no allocator counter" in text
    without_memory = convnet.report(args, cases, results, libs, {}, _probes(memory=False))
    assert "memory of a training step" not in without_memory


def test_passes_are_checked_and_need_jit(capsys):
    args = convnet_args(["--jit", "--passes", "fuse, dce"])
    assert args.passes == ["fuse", "dce"]
    assert convnet_args(["--jit", "--passes", ""]).passes == []  # none
    with pytest.raises(SystemExit):
        convnet_args(["--jit", "--passes", "fuse,nope"])
    assert "unknown pass 'nope'; the passes are" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="needs --jit"):
        main(["convnet", "--passes", "fuse"])
