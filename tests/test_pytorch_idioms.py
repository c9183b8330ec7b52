"""PyTorch's everyday idioms run unchanged on lamina and give PyTorch's results: each
idiom of tests/pytorch_idioms.py against PyTorch's recorded result (dtype, shape,
values, the structure of tuples), and against a live PyTorch when one is installed."""

import json
import pathlib

import numpy as np
import pytest
from pytorch_idioms import IDIOMS, encode, scope

import lamina as lm

RECORD = json.loads((pathlib.Path(__file__).parent / "data" / "pytorch_idioms.json").read_text())


RANDOM = ("m.randn", "m.rand(", "m.randint", "m.randperm(4)")  # only their dtype/shape is compared


def same(got, want, idiom, path="result"):
    assert got.keys() == want.keys(), f"{idiom}: {path} is {got}, PyTorch's {want}"
    if "seq" in want:
        assert len(got["seq"]) == len(want["seq"]), f"{idiom}: {path} length"
        for k, (g, w) in enumerate(zip(got["seq"], want["seq"])):
            same(g, w, idiom, f"{path}[{k}]")
    elif "tensor" in want:
        assert (got["tensor"], got["shape"]) == (want["tensor"], want["shape"]), (
            f"{idiom}: {path} is {got['tensor']}{got['shape']}, PyTorch's "
            f"{want['tensor']}{want['shape']}"
        )
        np.testing.assert_allclose(
            np.asarray(got["values"], dtype=float),
            np.asarray(want["values"], dtype=float),
            rtol=2e-6,
            atol=1e-6,
            err_msg=f"{idiom}: {path}",
        )
    elif want.get("type") == "float":
        assert got["type"] == "float" and got["scalar"] == pytest.approx(want["scalar"], rel=1e-6)
    else:
        assert got == want, f"{idiom}: {path} is {got}, PyTorch's {want}"


@pytest.mark.parametrize("idiom", IDIOMS)
def test_idiom_gives_pytorchs_result(idiom):
    got = encode(eval(idiom, scope(lm)))
    want = RECORD["results"][idiom]
    if idiom.startswith(RANDOM):
        got, want = _shape_only(got), _shape_only(want)
    same(got, want, idiom)


def _shape_only(r):
    return {k: v for k, v in r.items() if k != "values"}


def test_the_record_is_complete():
    assert set(RECORD["results"]) == set(IDIOMS), "run tests/data/record_pytorch_idioms.py"


def test_idioms_against_a_live_pytorch():
    """The record is what today's PyTorch gives (optional: needs torch installed)."""
    torch = pytest.importorskip("torch")
    for idiom in IDIOMS:
        if not idiom.startswith(RANDOM):
            same(encode(eval(idiom, scope(torch))), RECORD["results"][idiom], idiom)


def test_size_is_the_array_apis_count_and_pytorchs_method():
    x = lm.zeros((2, 3))
    assert isinstance(x.size, int) and x.size == 6 and x.size + 1 == 7  # Array API
    assert x.size() == (2, 3) and x.size(-1) == 3 and x.size().numel() == 6  # PyTorch
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        x.size(2)


def test_each_spelling_gets_its_own_semantics():
    x = lm.asarray([[1.0, 4.0], [3.0, 2.0]], dtype=lm.float64)
    n = x.numpy()
    np.testing.assert_allclose(lm.std(x).numpy(), n.std())  # Array API: correction 0
    np.testing.assert_allclose(lm.std(x, dim=0).numpy(), n.std(axis=0, ddof=1))  # PyTorch
    np.testing.assert_allclose(lm.var(x, axis=0).numpy(), n.var(axis=0))
    np.testing.assert_allclose(lm.var(x, dim=0, unbiased=False).numpy(), n.var(axis=0))
    assert isinstance(lm.max(x, axis=1), lm.Tensor)
    values, indices = lm.max(x, dim=1)
    assert values.tolist() == [4.0, 3.0] and indices.tolist() == [1, 0]
    assert lm.sort(x).tolist() == [[1.0, 4.0], [2.0, 3.0]]  # values only
    assert lm.sort(x, dim=0).indices.tolist() == [[0, 1], [1, 0]]
    with pytest.raises(TypeError, match="got both dim= and axis="):
        lm.sum(x, dim=0, axis=1)
    with pytest.raises(TypeError, match="got both keepdim= and keepdims="):
        lm.mean(x, keepdim=True, keepdims=True)
    with pytest.raises(TypeError, match="got both dim= and axis="):
        lm.roll(x, 1, dim=0, axis=1)
    # PyTorch's amax takes NumPy's spellings too (they failed: "multiple values for axis")
    assert lm.amax(x, axis=1).tolist() == [4.0, 3.0]
    assert x.amin(axis=0, keepdims=True).tolist() == [[1.0, 2.0]]
    with pytest.raises(TypeError, match="got both dim= and axis="):
        lm.amax(x, dim=0, axis=1)


def test_inplace_methods_record_the_gradient_of_what_they_compute():
    a = np.array([-1.0, 0.5, 2.0])
    x = lm.asarray(a, dtype=lm.float64, requires_grad=True)
    (x * 1).mul_(3).exp_().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3 * np.exp(3 * a))
    x = lm.asarray(a, dtype=lm.float64, requires_grad=True)
    (x.clone().clamp_(0, 1) * lm.asarray([1.0, 2.0, 3.0], dtype=lm.float64)).sum().backward()
    assert x.grad.tolist() == [0.0, 2.0, 0.0]
    leaf = lm.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        leaf.add_(1)
    with lm.no_grad():
        leaf.add_(1)
    assert leaf.tolist() == [2.0, 2.0]


def test_the_default_dtype_is_pytorchs_and_switches_everything_that_reads_it():
    assert lm.get_default_dtype() is lm.float32
    assert lm.__array_namespace_info__().default_dtypes()["real floating"] is lm.float32
    assert lm.asarray([1.5]).dtype is lm.float32 and lm.asarray([1j]).dtype is lm.complex64
    assert lm.asarray(np.ones(2)).dtype is lm.float64  # NumPy arrays keep their dtype
    assert lm.asarray(np.float64(2.5)).dtype is lm.float64  # NumPy scalars too
    assert (lm.arange(3) / 2).dtype is lm.float32 and lm.exp(lm.arange(2)).dtype is lm.float32
    assert lm.zeros(2, 3).dtype is lm.float32 and lm.nn.Linear(2, 2).weight.dtype is lm.float32
    try:
        lm.set_default_dtype(lm.float64)
        assert lm.zeros(2).dtype is lm.float64 and lm.nn.Linear(2, 2).weight.dtype is lm.float64
        assert lm.asarray([1j]).dtype is lm.complex128 and lm.randn(2).dtype is lm.float64
    finally:
        lm.set_default_dtype(lm.float32)
    with pytest.raises(TypeError, match="only float32 or float64"):
        lm.set_default_dtype(lm.int32)
    with pytest.raises(TypeError, match="only float32 or float64"):
        lm.set_default_dtype(lm.int32)


def test_pytorchs_mnist_example_runs_with_only_its_imports_changed(tmp_path):
    """examples/mnist.py is PyTorch's example with the imports swapped: it trains,
    evaluates, saves model and optimizer, and loads them back."""
    import subprocess
    import sys

    script = pathlib.Path(__file__).resolve().parents[1] / "examples" / "mnist.py"
    args = ["--epochs", "2", "--train-size", "512", "--test-size", "256", "--batch-size", "32"]
    args += ["--log-interval", "100", "--save-model", str(tmp_path / "mnist.lamina")]
    out = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    final = float(out.stdout.rsplit("final accuracy ", 1)[1])
    reloaded = float(out.stdout.rsplit("reloaded; accuracy ", 1)[1].split()[0])
    assert final > 0.3 and reloaded == final  # 10 classes: chance is 0.1
    torch_imports = "\n".join(
        line[2:] for line in script.read_text().splitlines() if line.startswith("# ")
    )
    assert "import torch\n" in torch_imports + "\n" and "torch.utils.data" in torch_imports
