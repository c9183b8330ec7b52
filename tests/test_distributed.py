"""lamina.distributed: the pieces that run in one process here; the collectives,
DistributedDataParallel, checkpoints and failures on two processes started through
the launcher (``python -m lamina.distributed.run -n 2``) on scripts in
tests/distributed/, whose every rank reports each check it passed."""

import os
import subprocess
import sys

import numpy as np
import pytest

import lamina as lm
import lamina.distributed as dist
from lamina.distributed import run

pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]

HERE = os.path.join(os.path.dirname(__file__), "distributed")
RANKS = 2


def launch(script, *args, timeout=90):
    """Run ``script`` on RANKS processes through the launcher: (exit status, output)."""
    pytest.importorskip("mpi4py")
    command = [sys.executable, "-m", "lamina.distributed.run", "-n", str(RANKS)]
    done = subprocess.run(
        [*command, os.path.join(HERE, script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout + done.stderr


CHECKS = [
    "all_reduce",
    "all_reduce non-contiguous and empty",
    "all_reduce async",
    "broadcast",
    "all_gather",
    "all_gather gradient",
    "reduce_scatter",
    "mismatch",
    "bad arguments",
    "ddp gradients",
    "ddp gradients alone",
    "ddp gradient_as_bucket_view",
    "ddp compiled",
    "ddp no_sync",
    "ddp unused parameters",
    "ddp different models",
    "checkpoint",
    "sampler",
]


def test_collectives_ddp_and_checkpoints_on_two_processes(tmp_path):
    code, out = launch("checks.py", tmp_path / "checkpoint.lamina")
    assert code == 0, out
    for rank in range(RANKS):
        for check in CHECKS:
            assert f"rank {rank} ok [{check}]" in out, f"rank {rank}: {check}\n{out}"
        assert f"rank {rank} done" in out, out


def test_a_rank_that_raises_ends_every_rank_naming_it():
    code, out = launch("fails.py", "raise", 60)  # ends long before the timeout
    assert code != 0
    assert "rank 0 started" in out and "rank 1 started" in out, out
    # rank 0's error, naming rank 1's; the ranks share one stderr, so another rank's
    # line (MPI's abort message) may land between the error's name and its message
    assert "lamina.distributed.collectives.RankFailedError: " in out, out
    assert "rank 1 failed: ValueError: a failure on purpose" in out, out
    assert "finished" not in out


def test_a_rank_that_never_comes_times_the_others_out():
    code, out = launch("fails.py", "stuck", 2)
    assert code != 0
    assert "DistributedTimeoutError: all_reduce: rank 0 waited 2 s" in out, out
    assert "finished" not in out


# ---------------------------------------------------------------- in this process


def test_import_lamina_does_not_import_mpi():
    code = "import sys, lamina, lamina.distributed; print('mpi4py' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def test_missing_mpi4py_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    assert not dist.is_available()
    with pytest.raises(ImportError, match=r"pip install 'lamina\[distributed\]'"):
        dist.init_process_group()
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "call",
    [
        dist.get_rank,
        dist.get_world_size,
        dist.barrier,
        lambda: dist.all_reduce(lm.ones(2)),
        lambda: dist.DistributedDataParallel(lm.nn.Linear(2, 2)),
    ],
)
def test_calls_before_init_say_what_to_do(call):
    with pytest.raises(RuntimeError, match=r"call lamina.distributed.init_process_group\(\) first"):
        call()


def test_init_arguments_are_checked():
    with pytest.raises(ValueError, match="backend must be 'mpi'"):
        dist.init_process_group("gloo")
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        dist.init_process_group(timeout=0)


@pytest.mark.parametrize("n, replicas", [(10, 3), (9, 3), (2, 3)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_shares(n, replicas, drop_last):
    shares = [
        list(dist.DistributedSampler(range(n), replicas, r, seed=3, drop_last=drop_last))
        for r in range(replicas)
    ]
    lengths = {len(s) for s in shares}
    assert len(lengths) == 1  # every rank makes as many steps
    per_rank = n // replicas if drop_last else -(-n // replicas)
    assert lengths == {per_rank}
    taken = np.array(shares).T.reshape(-1)  # in the order the ranks interleave them
    order = np.random.default_rng(3).permutation(n)
    np.testing.assert_array_equal(taken, np.resize(order, per_rank * replicas))
    if drop_last:
        assert len(set(taken.tolist())) == len(taken)  # nothing twice
    else:
        assert set(taken.tolist()) == set(range(n))  # nothing left out


def test_sampler_epochs_and_order():
    sampler = dist.DistributedSampler(range(8), 2, 1, seed=0)
    first = list(sampler)
    assert list(sampler) == first  # the same epoch, the same share
    sampler.set_epoch(1)
    assert list(sampler) != first
    unshuffled = dist.DistributedSampler(range(7), 2, 1, shuffle=False)
    assert list(unshuffled) == [1, 3, 5, 0] and len(unshuffled) == 4


def test_sampler_arguments_are_checked():
    with pytest.raises(ValueError, match="rank must be from 0 to 1"):
        dist.DistributedSampler(range(4), 2, 2)
    with pytest.raises(ValueError, match="num_replicas must be at least 1"):
        dist.DistributedSampler(range(4), 0, 0)
    with pytest.raises(TypeError, match="rank must be an int"):
        dist.DistributedSampler(range(4), 2, 1.0)


def test_ddp_arguments_are_checked():
    with pytest.raises(TypeError, match="module must be an nn.Module"):
        dist.DistributedDataParallel(lambda x: x)
    with pytest.raises(ValueError, match="bucket_cap_mb must be a positive number"):
        dist.DistributedDataParallel(lm.nn.Linear(2, 2), bucket_cap_mb=0)


def test_gradient_buckets_start_small_and_split_by_dtype(monkeypatch):
    from lamina.distributed import ddp

    monkeypatch.setattr(ddp, "ALONE_BYTES", 2**30)  # every parameter in a bucket
    mib = 2**20 // 4  # float32 elements in a MiB
    sizes = [(mib, "float32"), (mib // 2, "float32"), (mib // 4, "float64"), (3 * mib, "float32")]
    sizes += [(mib // 2, "float32"), (mib // 2, "float32")]
    named = [(f"p{i}", lm.zeros(n, dtype=getattr(lm, d))) for i, (n, d) in enumerate(sizes)]
    buckets = ddp._buckets(named, cap_bytes=2.5 * 2**20)
    # reversed: the last parameters first; the first bucket holds at most 1 MiB, the
    # others 2.5 MiB or one larger parameter; a dtype change starts a bucket
    assert [b.names for b in buckets] == [["p5", "p4"], ["p3"], ["p2"], ["p1", "p0"]]
    assert [b.buffer.dtype.name for b in buckets] == ["float32", "float32", "float64", "float32"]


def test_large_gradients_travel_alone_where_they_come():
    from lamina.distributed import ddp

    small, large = ddp.ALONE_BYTES // 4 - 1, ddp.ALONE_BYTES // 4  # float32 elements
    named = [(f"p{i}", lm.zeros(n)) for i, n in enumerate([small, large, small, large, small])]
    buckets = ddp._buckets(named, cap_bytes=25 * 2**20)
    # in reverse order each large one goes as it comes, in its gradient's memory (no
    # buffer); the small ones around them share the bucket left open
    assert [(b.names, b.alone) for b in buckets] == [
        (["p3"], True),
        (["p1"], True),
        (["p4", "p2", "p0"], False),
    ]
    assert [b.buffer is None for b in buckets] == [True, True, False]


@pytest.mark.parametrize(
    "processes, hosts, cores, threads", [(2, 1, 2, 1), (2, 1, 16, 8), (3, 1, 2, 1), (8, 2, 16, 4)]
)
def test_threads_per_process_never_oversubscribe(processes, hosts, cores, threads):
    assert run.threads_per_process(processes, hosts, cores) == threads


def test_launcher_command(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two machines\nnode1:8\n\nnode2:8\n")
    args = run.parser().parse_args(
        ["-n", "4", "--hostfile", str(hostfile), "--mpiexec", "mpx", "train.py", "--lr", "0.1"]
    )
    line, variables = run.command(args, cores=8)
    assert line == [
        "mpx",
        "-n",
        "4",
        "-f",
        str(hostfile),
        sys.executable,
        "train.py",
        "--lr",
        "0.1",
    ]
    assert variables == dict.fromkeys(run.THREAD_VARIABLES, "4")  # 2 per host, 8 cores
    args = run.parser().parse_args(["-n", "2", "--threads", "3", "--mpiexec", "mpx", "t.py"])
    assert run.command(args, cores=8)[1]["LAMINA_NUM_THREADS"] == "3"


def test_launcher_refuses_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run.main(["-n", "0", "train.py"])
    assert "must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="lists no hosts"):
        (tmp_path / "empty").write_text("# nothing\n")
        run.main(["-n", "2", "--hostfile", str(tmp_path / "empty"), "--dry-run", "t.py"])


def test_launcher_dry_run(capsys):
    assert run.main(["-n", "2", "--threads", "1", "--mpiexec", "mpx", "--dry-run", "t.py"]) == 0
    assert capsys.readouterr().out.startswith("LAMINA_NUM_THREADS=1 OMP_NUM_THREADS=1")


def test_bench_report_computes_scaling_and_bandwidth():
    from types import SimpleNamespace

    from lamina.tools.bench import distributed as bench

    args = SimpleNamespace(models=["mlp"], batch=32, rounds=3, sizes=[1], no_torch=False)
    libs = [SimpleNamespace(name="lamina", version="0"), SimpleNamespace(name="torch", version="0")]
    seconds = {"lamina": (0.1, 0.09, 0.125, 0.1), "torch": (0.2, 0.2, 0.25, 0.2)}
    results = {}
    for lib, (ddp1, local1, ddp2, local2) in seconds.items():
        results[f"{lib} 1p", "train", "mlp", "ddp"] = ddp1
        results[f"{lib} 1p", "train", "mlp", "local"] = local1
        results[f"{lib} 2p", "train", "mlp", "ddp"] = ddp2
        results[f"{lib} 2p", "train", "mlp", "local"] = local2
    results["lamina 2p", "bucket", "mlp"] = 0.02  # the bound: 1 + 0.02 / 0.1
    results["lamina 2p", "allreduce", "1", "lamina"] = 0.001
    results["lamina 2p", "allreduce", "1", "mpi4py"] = 0.0009
    text = bench.report(args, results, libs)
    # 320 -> 512 images/s: 0.80; the DDP step 1.25x the step alone; ceiling 640 / (2 x 355.6)
    mlp = next(line.split() for line in text.splitlines() if line.startswith("MLP"))
    assert mlp == ["MLP", "320.0", "512.0", "0.80", "1.25x", "1.20x", "0.90"] + [
        "160.0",
        "256.0",
        "0.80",
        "1.25x",
        "2.00x",
    ]
    one_mb = next(line.split() for line in text.splitlines() if line.startswith("1 MB"))
    assert one_mb == [
        "1",
        "MB",
        f"{2**20 / 0.001 / 1e9:.2f}",
        f"{2**20 / 0.0009 / 1e9:.2f}",
        "0.90x",
    ]
