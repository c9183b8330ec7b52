"""``python -m lamina.bench convnet``: its three models build, run and learn in lamina;
with PyTorch installed, the agreement check passes for identical models and catches
a model whose weights differ; the command prints its table. Timing is left to the
command itself (no timed tests)."""

import argparse
import json
import math

import numpy as np
import pytest

import lamina as lm
from lamina.dispatch import memory
from lamina.tools.bench import convnet, main, timing

MODELS = list(convnet.ARCHITECTURES)


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
    main(["convnet", "--model", "alexnet", "--batch", "1", "--rounds", "1"]
         + ["--mode", "infer", "--no-torch", "--settle", "0"]
         + ([where] if where.startswith("--") else []))  # fmt: skip
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert ("in this process" if where == "--in-process" else "each in its own process") in out
    header = next(i for i, line in enumerate(lines) if line.startswith("model"))
    assert lines[header].split() == ["model", "mode", "batch", "lamina", "img/s"]
    row = lines[header + 2].split()
    assert row[:3] == ["alexnet", "infer", "1"] and float(row[3]) > 0
    assert "PyTorch not used" in out


def test_several_thread_counts_give_a_column_each_and_the_scaling(capsys):
    main(["convnet", "--model", "alexnet", "--batch", "1", "--rounds", "1", "--mode", "infer"]
         + ["--no-torch", "--settle", "0", "--threads", "1,2", "--json"])  # fmt: skip
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
