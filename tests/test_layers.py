"""Layer switches (lamina.layers) and the overhead tool (python -m lamina.overhead)."""

import enum
import json
import subprocess
import sys

import numpy as np
import pytest

import lamina as lm
from lamina.tools import overhead


def test_state_lists_every_layer_and_only_the_allocator_is_off_by_default():
    assert (
        lm.layers.state()
        == lm.layers.DEFAULTS
        == {
            "dispatcher": True,
            "autograd": True,
            "sparse": True,
            "checks": True,
            "allocator": False,
        }
    )


def test_unknown_layer_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown layer 'grad'.*dispatcher, autograd"):
        lm.layers.disable("grad")
    with pytest.raises(ValueError, match="unknown layer"):
        with lm.layers.off("autograd", "nope"):
            pass
    assert lm.layers.state() == lm.layers.DEFAULTS


def test_off_restores_state_even_when_the_block_raises():
    with pytest.raises(KeyError):
        with lm.layers.off("autograd", "checks", "dispatcher"):
            assert lm.layers.state() == {
                "dispatcher": False,
                "autograd": False,
                "sparse": True,
                "checks": False,
                "allocator": False,
            }
            raise KeyError("boom")
    assert lm.layers.state() == lm.layers.DEFAULTS
    x = lm.ones(3, requires_grad=True)
    assert (x * 2).requires_grad  # autograd is back


def test_nested_off_keeps_outer_switches():
    with lm.layers.off("autograd"):
        with lm.layers.off("autograd", "checks"):
            pass
        assert lm.layers.state()["autograd"] is False
        assert lm.layers.state()["checks"] is True
    assert lm.layers.state()["autograd"] is True


def test_autograd_off_records_nothing():
    x = lm.ones(3, requires_grad=True)
    with lm.layers.off("autograd"):
        y = x * 3.0
        with lm.enable_grad():
            z = lm.exp(x)
    assert not y.requires_grad and y.grad_fn is None
    assert not z.requires_grad
    np.testing.assert_array_equal(y.numpy(), [3.0, 3.0, 3.0])
    with lm.layers.off("autograd"):
        row = next(r for r in lm.dispatch.dump_table("multiply") if r[0] == "Autograd")
        assert "off" in row[1]


def test_sparse_off_makes_sparse_inputs_error_and_dense_work():
    s = lm.asarray([[0.0, 2.0], [3.0, 0.0]]).to_sparse()
    d = lm.ones((2, 2))
    with lm.layers.off("sparse"):
        with pytest.raises(Exception, match="(?i)sparse.*off|off.*sparse"):
            s + d
        np.testing.assert_array_equal((d + d).numpy(), 2 * np.ones((2, 2)))
    np.testing.assert_array_equal(
        (s + d).numpy() if not (s + d).is_sparse else (s + d).to_dense().numpy(), [[1, 3], [4, 1]]
    )


def test_checks_off_uses_the_unchecked_kernel_and_stays_memory_safe():
    a = lm.asarray(np.arange(4, dtype=np.float32))
    with lm.layers.off("checks"):
        np.testing.assert_array_equal((a + a).numpy(), 2 * np.arange(4))
        with pytest.raises(ValueError, match="checks layer off"):
            a + lm.ones(5, dtype=lm.float32)
        with pytest.raises(ValueError, match="checks layer off"):
            a + lm.asarray(np.arange(8, dtype=np.float32))[::2]  # not contiguous
    with pytest.raises(ValueError, match="broadcast"):
        a + lm.ones(5, dtype=lm.float32)


@pytest.mark.parametrize("layer", [None, "checks", "dispatcher", "autograd"])
def test_python_scalar_operands_in_every_layer_configuration(layer):
    """A Python scalar takes the kernels' scalar path (the bindings call it directly),
    with any layer off; reflected operators and functions too."""
    n = np.arange(4, dtype=np.float32)
    a = lm.asarray(n)
    with lm.layers.off(*([layer] if layer else [])):
        for got, want in [
            (a * 2.0, n * 2),
            (3 - a, 3 - n),
            (lm.add(1, a), n + 1),
            (a**2, n**2),
            (a > 1.5, n > 1.5),
            (2.0 / (a + 1), 2 / (n + 1)),
        ]:
            assert got.dtype == lm.asarray(want).dtype
            np.testing.assert_allclose(got.numpy(), want)
        with pytest.raises(TypeError, match="expected a tensor or a Python scalar"):
            lm.add(a, "2")
        # subclasses of int and float are scalars too (an IntEnum member, say)
        two = enum.IntEnum("Two", {"TWO": 2}).TWO
        np.testing.assert_array_equal((a * two).numpy(), n * 2)
        np.testing.assert_array_equal((a == two).numpy(), n == 2)


def test_dispatcher_off_binds_directly_and_refuses_other_tensors():
    a = lm.asarray(np.arange(3, dtype=np.float64))
    g = lm.ones(3, requires_grad=True)
    with lm.layers.off("dispatcher"):
        np.testing.assert_array_equal((a + a).numpy(), [0, 2, 4])
        np.testing.assert_array_equal(lm.multiply(a, 2.0).numpy(), [0, 2, 4])
        with pytest.raises(RuntimeError, match="dispatcher layer is off"):
            a + g
    assert (a + g).requires_grad  # dispatched again


def test_switching_costs_nothing_per_call(monkeypatch):
    calls = []
    from lamina.dispatch import entries

    original = entries.rebuild
    monkeypatch.setattr(entries, "rebuild", lambda: (calls.append(1), original()))
    with lm.layers.off("autograd"):
        for _ in range(10):
            lm.ones(3) + lm.ones(3)
    assert len(calls) == 2  # once off, once back on; none per call


def test_attribution_is_non_negative_and_adds_up():
    ns = {
        "full": 1000.0,
        "autograd off": 1010.0,
        "sparse off": 900.0,
        "checks off": 850.0,
        "dispatcher off": 700.0,
        "raw kernel": 150.0,
        "binding probe": 60.0,
    }
    buckets = overhead.attribute(ns)
    assert set(buckets) == set(overhead.BUCKETS)
    assert all(v >= 0 for v in buckets.values())
    assert sum(buckets.values()) == pytest.approx(1000.0)
    assert buckets["autograd"] == 0.0  # noise (1010 > 1000) is not a negative bucket
    assert buckets["computation"] == 150.0 and buckets["binding"] == 60.0


def test_cli_quick_json_has_every_row_and_bucket():
    """Both cores (the C one where it is built, and the pure-Python one) get every row
    and bucket, with NumPy measured in each one's rounds."""
    from lamina.dispatch import core

    proc = subprocess.run(
        [sys.executable, "-m", "lamina.overhead", "--k", "200", "--rounds", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    stacks = json.loads(proc.stdout)
    expected = ["c", "python"] if core.IMPLEMENTATION == "c" or core.PURE_PYTHON else ["python"]
    assert [s["stack"] for s in stacks] == expected
    for data in stacks:
        assert [r["config"] for r in data["rows"]] == [name for name, _ in overhead.CONFIGS]
        assert all(r["ns_per_op"] > 0 for r in data["rows"])
        assert set(data["buckets"]) == set(overhead.BUCKETS)
        assert all(v >= 0 for v in data["buckets"].values())
        assert data["peers"]["numpy"] > 0
        full = data["rows"][0]["ns_per_op"]
        assert sum(data["buckets"].values()) == pytest.approx(full, rel=1e-6)


def test_cli_table_mentions_rows_and_buckets():
    out = overhead.report(
        type(
            "A",
            (),
            {
                "op": "add",
                "n": 100,
                "dtype": "float32",
                "threads": 1,
                "k": 10,
                "requires_grad": False,
                "sparse": False,
                "callgrind": False,
            },
        )(),
        {name: 100.0 for name, _ in overhead.CONFIGS},
        dict.fromkeys(overhead.BUCKETS, 100.0 / 6),
        {"numpy": 50.0, "torch": None},
    )
    for name, _ in overhead.CONFIGS:
        assert name in out
    assert "operator setup" in out and "lamina/numpy = 2.00x" in out
    assert "not installed" in out


def test_callgrind_without_valgrind_is_a_clear_error(tmp_path):
    env = {"PATH": str(tmp_path)}  # no valgrind here
    proc = subprocess.run(
        [sys.executable, "-m", "lamina.overhead", "--callgrind", "--k", "10"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "needs valgrind" in proc.stderr


def test_overhead_tool_refuses_an_operator_that_is_not_binary_elementwise(capsys):
    # its loop is out = op(out, x): a unary operator's loop run that way read past its
    # arguments and crashed the process
    with pytest.raises(SystemExit) as exit:
        overhead.main(["--op", "sin"])
    assert exit.value.code == 2
    message = capsys.readouterr().err
    assert "--op 'sin' is not a binary elementwise operator" in message and "atan2" in message
