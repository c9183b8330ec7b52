"""``python -m lamina.bench models``: the reference models build and classify in lamina;
with PyTorch installed, the agreement check passes for identical models and catches a
wrong gradient; a model needing a layer lamina lacks is reported, not run; the quick
command prints its table in words a user knows. Timing is left to the command itself
(no timed tests)."""

import argparse
import json
import re
from types import SimpleNamespace

import numpy as np
import pytest

import lamina as lm
from lamina.tools.bench import convnet, main, models

pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]

QUICK = ["models", "--quick", "--models", "resnet18_cifar", "--batches", "1", "--modes", "infer",
         "--rounds", "1", "--settle", "0", "--no-torch"]  # fmt: skip
# words of the project's own documents, which mean nothing to a user
INTERNAL = re.compile(r"seed|issue|\.\./shared", re.IGNORECASE)


@pytest.mark.parametrize("name", list(models.MODELS))
def test_model_gives_class_scores_in_float32(name):
    spec = models.MODELS[name]
    lm.random.seed(0)
    try:
        model = spec.make(convnet._lamina(), "NCHW")
    except models.MissingLayer as missing:
        pytest.skip(f"lamina.nn has no {missing.args[0]} yet")
    x, _ = spec.inputs(np.random.default_rng(0), 2)
    with lm.no_grad():
        scores = model.eval()(spec.tensor(convnet._lamina(), x, "NCHW"))
    assert scores.shape == (2, spec.classes) and scores.dtype == lm.float32
    assert np.isfinite(scores.numpy()).all()


def test_agreement_with_pytorch():
    pytest.importorskip("torch")
    libs = [convnet._lamina(), convnet._torch()]
    lm.random.seed(1)
    _, agreement = models.check("resnet18", libs, "NCHW", batch=2)
    assert agreement.ok, agreement.message()
    assert abs(agreement.loss[0] - agreement.loss[1]) <= 1e-3 * abs(agreement.loss[1])


def _scaled_backward(y, factor):
    """y, whose gradient is ``factor`` times what it gets."""
    return y * factor - y.detach() * (factor - 1)


def test_a_missing_layer_is_named_and_the_model_not_run(monkeypatch):
    monkeypatch.delattr(lm.nn, "ReLU")
    built, verdict = models.check("resnet18_cifar", [convnet._lamina()], "NCHW")
    assert built is None and not verdict.ok
    assert verdict.message() == "resnet18_cifar: NOT RUN -- lamina.nn has no ReLU layer"


def test_quick_command_prints_a_table(capsys):
    main(QUICK)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "PyTorch not used (--no-torch): lamina alone is timed"
    assert lines[1].startswith("Reference models, training step")
    assert "1 thread(s)" in lines[1] and "median of 1 rounds" in lines[1]
    assert not INTERNAL.findall(out), INTERNAL.findall(out)
    header = lines.index("", 1) + 1
    assert lines[header].split() == ["model", "input", "mode", "batch", "lamina", "items/s"]
    assert set(lines[header + 1]) == {"-", " "}
    row = lines[header + 2].split()
    assert row[:4] == ["resnet18_cifar", "3x32x32", "infer", "1"] and float(row[4]) > 0


def models_args(argv):
    parser = argparse.ArgumentParser()
    models.add_arguments(parser)
    args = parser.parse_args(argv)
    for option, value in models.FULL.items():
        setattr(args, option, getattr(args, option) or value)
    return args


def test_table_columns_ratios_and_messages():
    """Both libraries at two thread counts, from made-up seconds: rates, lamina /
    PyTorch (above 1: lamina faster), each library's scaling, the verdicts below."""
    args = models_args(["--threads", "1,2"])
    libs = [SimpleNamespace(name=n, version="1.0") for n in ("lamina", "torch")]
    cases = [convnet.Case("transformer", "train", 8)]
    seconds = {("lamina", 1): 2.0, ("lamina", 2): 1.0, ("torch", 1): 1.0, ("torch", 2): 0.8}
    verdicts = {"transformer": None, "mobilenet_v2": models.NotRun("mobilenet_v2", "why")}
    text = models.report(args, cases, {("transformer", "train", 8): seconds}, libs, verdicts)
    lines = text.splitlines()
    header = lines.index("", 0) + 1
    assert (
        lines[header].split()
        == (
            "model input mode batch lamina 1t torch 1t lamina/torch 1t lamina 2t torch 2t "
            "lamina/torch 2t lamina 2t/1t torch 2t/1t"
        ).split()
    )
    assert lines[header + 2].split() == [
        "transformer", "128", "tokens", "train", "8",
        "4.0", "8.0", "0.50x", "8.0", "10.0", "0.80x", "2.00x", "1.25x",
    ]  # fmt: skip
    assert lines[-1] == "mobilenet_v2: NOT RUN -- why"


def test_json_names_inputs_verdicts_and_rates():
    args = models_args(["--models", "resnet18_cifar", "--threads", "2"])
    libs = [SimpleNamespace(name="lamina", version="1.0")]
    cases = [convnet.Case("resnet18_cifar", "infer", 4)]
    results = {("resnet18_cifar", "infer", 4): {("lamina", 2): 0.5}}
    out = json.loads(models._json(args, cases, results, libs, {"resnet18_cifar": None}))
    assert out["inputs"] == {"resnet18_cifar": "3x32x32"}
    assert out["agreement"] == {"resnet18_cifar": None}  # PyTorch not used
    assert out["results"] == [
        {"model": "resnet18_cifar", "mode": "infer", "batch": 4, "threads": 2,
         "lamina_seconds": 0.5, "lamina_items_per_second": 8.0}
    ]  # fmt: skip


@pytest.mark.parametrize("bad", ["resnet", "all,transformer", ""])
def test_unknown_models_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        main(["models", "--models", bad])
    assert "--models" in capsys.readouterr().err


def test_a_wrong_gradient_is_caught_and_rounding_noise_is_not():
    """A convolution (with a bias: Note [Gradients zero but for rounding]), batch norm,
    relu, a linear layer; then lamina's relu made to pass 1% too much gradient back."""
    pytest.importorskip("torch")
    libs = [convnet._lamina(), convnet._torch()]
    lm.random.seed(2)
    built = {}
    for lib in libs:
        nn = lib.nn
        layers = [nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 5)]
        built[lib.name] = nn.Sequential(*layers).float()
    convnet.copy_weights(built["lamina"], built["torch"])
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((4, 3, 4, 4)), rng.integers(0, 5, 4)

    def compare():
        return convnet.compare_step("tiny", built, libs, lambda lib: lib.tensor(x), y)

    agreement = compare()
    assert agreement.ok, agreement.message()
    with pytest.MonkeyPatch.context() as patch:  # the conv bias's gradient, noise, at its own scale
        patch.setattr(convnet, "ZERO_GRADIENT", 0.0)
        noise = compare()
    assert not noise.ok and noise.worst == "0.bias" and noise.worst_abs < 1e-15
    # the relu's output unchanged, the gradients of what precedes it 1% too large
    built["lamina"][2].forward = lambda t: _scaled_backward(lm.nn.functional.relu(t), 1.01)
    wrong = compare()
    assert not wrong.ok and wrong.loss[0] == pytest.approx(agreement.loss[0], rel=1e-12)
    assert wrong.worst in ("0.weight", "1.weight", "1.bias")
    assert "NOT TIMED" in wrong.message() and "tiny" in wrong.message()
