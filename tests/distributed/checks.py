"""Run by tests/test_distributed.py on two processes (python -m lamina.distributed.run
-n 2 checks.py CHECKPOINT): every rank checks the collectives against NumPy and
DistributedDataParallel against one process training on the whole batch, and prints
``rank R ok [NAME]`` after each check; the test reads every rank's lines. Every rank can
make every rank's inputs (their random generators start from the rank), so each
checks the result against NumPy on all ranks' inputs."""

import sys

import numpy as np

import lamina as lm
import lamina.distributed as dist
from lamina.distributed import ddp as ddp_module
from lamina.distributed.ddp import ALONE_BYTES

dist.init_process_group(timeout=60)
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 2, world


def ok(name):
    sys.stdout.write(f"rank {rank} ok [{name}]\n")  # one write: the ranks share a pipe
    sys.stdout.flush()


def inputs(r, shape, dtype):
    """Rank r's input."""
    values = np.random.default_rng(r).standard_normal(shape) * 10
    if np.dtype(dtype).kind == "c":
        values = values + 1j * np.random.default_rng(r + 100).standard_normal(shape)
    return values.astype(dtype)


def raises(exception, words, fn):
    try:
        fn()
    except exception as e:
        for w in words:
            assert w in str(e), (w, str(e))
        return
    raise AssertionError(f"{fn} did not raise {exception.__name__}")


# ---------------------------------------------------------------- collectives

REFERENCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}
for dtype, ops in [
    ("float32", ["sum", "mean", "max", "min"]),
    ("float64", ["sum", "mean"]),
    ("int32", ["sum", "max", "min"]),
    ("complex64", ["sum"]),
]:
    for op in ops:
        everyone = np.stack([inputs(r, (3, 4), dtype) for r in range(world)])
        want = REFERENCE[op](everyone, axis=0).astype(dtype)
        t = lm.asarray(inputs(rank, (3, 4), dtype))
        assert dist.all_reduce(t, op) is t  # in place: the tensor's own memory
        np.testing.assert_allclose(t.numpy(), want, rtol=1e-6, atol=1e-5)
ok("all_reduce")

# a non-contiguous view: reduced through a copy, written back into the view only
base = lm.asarray(inputs(rank, (4, 6), "float64"))
view = base[:, ::2].mT
dist.all_reduce(view)
want = sum(inputs(r, (4, 6), "float64") for r in range(world))
np.testing.assert_allclose(base.numpy()[:, ::2], want[:, ::2])
np.testing.assert_array_equal(base.numpy()[:, 1::2], inputs(rank, (4, 6), "float64")[:, 1::2])
empty = lm.zeros((0, 3))
assert dist.all_reduce(empty).shape == (0, 3)
ok("all_reduce non-contiguous and empty")

t = lm.asarray(inputs(rank, (1000,), "float32"))
work = dist.all_reduce(t, "max", async_op=True)
assert work.wait() is t
assert work.is_completed()
np.testing.assert_array_equal(
    t.numpy(), np.maximum(*[inputs(r, (1000,), "float32") for r in range(2)])
)
ok("all_reduce async")

t = lm.asarray(inputs(rank, (5, 2), "float64")).mT
dist.broadcast(t, src=1)
np.testing.assert_array_equal(t.numpy(), inputs(1, (5, 2), "float64").T)
work = dist.broadcast(lm.asarray(inputs(rank, (3,), "int64")), src=0, async_op=True)
np.testing.assert_array_equal(work.wait().numpy(), inputs(0, (3,), "int64"))
ok("broadcast")

for dtype in ("float32", "int64", "bool"):
    gathered = dist.all_gather(lm.asarray(inputs(rank, (2, 3), dtype)))
    np.testing.assert_array_equal(
        gathered.numpy(), np.stack([inputs(r, (2, 3), dtype) for r in range(world)])
    )
assert dist.all_gather(lm.asarray(inputs(rank, (4, 3), "float32"))[:, 1]).shape == (2, 4)
work = dist.all_gather(lm.asarray(inputs(rank, (), "float64")), async_op=True)
np.testing.assert_array_equal(work.wait().numpy(), [inputs(r, (), "float64") for r in range(2)])
ok("all_gather")

# all_gather's gradient: rank p's tensor gets the sum over ranks q of q's gradient for
# slice p. With loss_q = sum(weights_q * gathered), that is sum_q weights_q[p].
x = lm.asarray(inputs(rank, (3,), "float64")).requires_grad_()
gathered = dist.all_gather(x)
weights = [inputs(r + 10, (world, 3), "float64") for r in range(world)]
(gathered * lm.asarray(weights[rank])).sum().backward()
np.testing.assert_allclose(x.grad.numpy(), sum(w[rank] for w in weights))
ok("all_gather gradient")

for op in ("sum", "mean", "max"):
    everyone = np.stack([inputs(r, (4, 3), "float32") for r in range(world)])
    part = dist.reduce_scatter(lm.asarray(inputs(rank, (4, 3), "float32")), op)
    np.testing.assert_allclose(
        part.numpy(), REFERENCE[op](everyone, axis=0)[2 * rank : 2 * rank + 2], rtol=1e-6
    )
ok("reduce_scatter")

# ---------------------------------------------------------------- refused calls

tensor = lm.zeros((3,) if rank == 0 else (4,))
raises(
    ValueError,
    [
        "all_reduce",
        "rank 0: all_reduce sum of float32 (3)",
        "rank 1: all_reduce sum of float32 (4)",
    ],
    lambda: dist.all_reduce(tensor),
)
tensor = lm.zeros((3,), dtype=lm.float32 if rank == 0 else lm.int64)
raises(ValueError, ["float32", "int64", "rank 1"], lambda: dist.all_gather(tensor))
tensor = lm.zeros((2,))
if rank == 0:
    raises(ValueError, ["broadcast from rank 0", "all_reduce"], lambda: dist.broadcast(tensor))
else:
    raises(ValueError, ["broadcast from rank 0", "all_reduce"], lambda: dist.all_reduce(tensor))
# the same size but not the same op, or a shape differing past the dimensions the
# message shows: refused, and the tensor left as it was (never a sum of the two calls)
tensor = lm.asarray(np.full(4, rank + 1.0, np.float32))
op = "sum" if rank == 0 else "max"
raises(
    ValueError,
    ["rank 0: all_reduce sum", "rank 1: all_reduce max"],
    lambda: dist.all_reduce(tensor, op),
)
np.testing.assert_array_equal(tensor.numpy(), np.full(4, rank + 1.0, np.float32))
tensor = lm.zeros((1,) * 6 + ((2, 3) if rank == 0 else (3, 2)))
raises(
    ValueError,
    ["rank 1: all_reduce sum of float32 (1, 1, 1, 1, 1, 1, ...)"],
    lambda: dist.all_reduce(tensor),
)
ok("mismatch")  # ... and the ranks still agree on what comes next:

raises(ValueError, ["op must be one of"], lambda: dist.all_reduce(lm.zeros(2), "prod"))
raises(
    TypeError,
    ["'mean' needs a floating-point"],
    lambda: dist.all_reduce(lm.zeros(2, dtype=lm.int32), "mean"),
)
raises(ValueError, ["src must be a rank from 0 to 1"], lambda: dist.broadcast(lm.zeros(2), src=2))
raises(ValueError, ["split into 2 equal blocks"], lambda: dist.reduce_scatter(lm.zeros(3)))
raises(ValueError, ["read-only"], lambda: dist.all_reduce(lm.broadcast_to(lm.zeros(1), (3,))))
dist.barrier()
ok("bad arguments")

# ---------------------------------------------------------------- DistributedDataParallel

BATCH = 8  # the whole batch; each rank trains on its half


def mlp(seed):
    lm.random.seed(seed)
    return lm.nn.Sequential(lm.nn.Linear(5, 16), lm.nn.ReLU(), lm.nn.Linear(16, 3)).double()


class WithUnused(lm.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = mlp(seed=0)
        self.extra = lm.nn.Linear(2, 2).double()  # never called

    def forward(self, x):
        return self.body(x)


def data(step):
    rng = np.random.default_rng(1000 + step)
    return lm.asarray(rng.standard_normal((BATCH, 5))), lm.asarray(rng.integers(0, 3, BATCH))


def mine(x, y):
    half = BATCH // world
    return x[rank * half : (rank + 1) * half], y[rank * half : (rank + 1) * half]


loss_fn = lm.nn.CrossEntropyLoss()
single = mlp(seed=0)
# each rank starts from other weights: wrapping gives every rank rank 0's
ddp = dist.DistributedDataParallel(mlp(seed=rank), bucket_cap_mb=0.0005)  # several buckets
assert len(ddp._buckets) > 1
for (name, p), (_, q) in zip(ddp.module.named_parameters(), single.named_parameters()):
    np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)

x, y = data(0)
loss_fn(single(x), y).backward()
xs, ys = mine(x, y)
loss_fn(ddp(xs), ys).backward()
for (name, p), (_, q) in zip(ddp.module.named_parameters(), single.named_parameters()):
    np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
ok("ddp gradients")

# large gradients travel alone, reduced in their own memory (Note [Gradient buckets]):
# here both weights (640 and 384 bytes), the biases in one bucket; the first layer's
# weight gradient made Fortran-ordered by a hook that runs before DDP's, so that it
# travels through a buffer of its own and comes back into that same .grad
ddp_module.ALONE_BYTES = 300
model = mlp(seed=rank)
where = {}


def fortran(p):
    p.grad = lm.asarray(np.asfortranarray(p.grad.numpy()))
    where["0.weight"] = p.grad


model[0].weight.register_post_accumulate_grad_hook(fortran)
model[2].weight.register_post_accumulate_grad_hook(
    lambda p: where.__setitem__("2.weight", p.grad.numpy().ctypes.data)
)
alone = dist.DistributedDataParallel(model)
assert [(b.names, b.alone) for b in alone._buckets] == [
    (["2.weight"], True),
    (["0.weight"], True),
    (["2.bias", "0.bias"], False),
]
for step in (0, 1):
    single.zero_grad()
    alone.zero_grad()
    x, y = data(step)
    loss_fn(single(x), y).backward()
    loss_fn(alone(mine(x, y)[0]), mine(x, y)[1]).backward()
    for (name, p), (_, q) in zip(model.named_parameters(), single.named_parameters()):
        np.testing.assert_allclose(
            p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=name
        )
    assert model[2].weight.grad.numpy().ctypes.data == where["2.weight"]  # in place
    assert model[0].weight.grad is where["0.weight"]  # copied back into the same .grad
    assert model[0].weight.grad.numpy().flags.f_contiguous
ddp_module.ALONE_BYTES = ALONE_BYTES
ok("ddp gradients alone")

# gradient_as_bucket_view: the same averages, each .grad a view of its bucket, in two
# passes (the second overwrites the buckets the first left in .grad)
view = dist.DistributedDataParallel(
    mlp(seed=rank), bucket_cap_mb=0.0005, gradient_as_bucket_view=True
)
for step in (0, 1):
    single.zero_grad()
    view.zero_grad()
    x, y = data(step)
    loss_fn(single(x), y).backward()
    loss_fn(view(mine(x, y)[0]), mine(x, y)[1]).backward()
    for (name, p), (_, q) in zip(view.module.named_parameters(), single.named_parameters()):
        np.testing.assert_allclose(
            p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=name
        )
        assert any(np.shares_memory(p.grad.numpy(), b.buffer) for b in view._buckets), name
ok("ddp gradient_as_bucket_view")

# compiled models: the wrapper around a compiled module, and the wrapper compiled
for wrap in (
    lambda m: dist.DistributedDataParallel(lm.jit.compile(m)),
    lambda m: lm.jit.compile(dist.DistributedDataParallel(m)),
):
    model = mlp(seed=rank)
    run = wrap(model)
    for step in (0, 1):  # traced and compiled, then the compiled plan
        single.zero_grad()
        model.zero_grad()
        x, y = data(step)
        loss_fn(single(x), y).backward()
        loss_fn(run(mine(x, y)[0]), mine(x, y)[1]).backward()
        for (name, p), (_, q) in zip(model.named_parameters(), single.named_parameters()):
            np.testing.assert_allclose(
                p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=name
            )
ok("ddp compiled")

# no_sync: the first backward only accumulates; the second averages the sum
single.zero_grad()
ddp.zero_grad()
for step in (1, 2):
    x, y = data(step)
    loss_fn(single(x), y).backward()
    xs, ys = mine(x, y)
    if step == 1:
        with ddp.no_sync():
            loss_fn(ddp(xs), ys).backward()
        local = {n: p.grad.numpy().copy() for n, p in ddp.module.named_parameters()}
    else:
        loss_fn(ddp(xs), ys).backward()
for (name, p), (_, q) in zip(ddp.module.named_parameters(), single.named_parameters()):
    np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
other = dist.all_gather(lm.asarray(local["0.weight"])).numpy()
assert not np.allclose(other[0], other[1])  # inside no_sync, each rank had its own
ok("ddp no_sync")

# a parameter without gradient: refused by name, or counted as zero
ddp = dist.DistributedDataParallel(WithUnused())
x, y = mine(*data(0))
raises(
    RuntimeError,
    ["extra.weight", "extra.bias", "find_unused_parameters=True"],
    lambda: loss_fn(ddp(x), y).backward(),
)
for ddp_module.ALONE_BYTES in (ALONE_BYTES, 32):  # extra.weight in a bucket, then alone
    ddp = dist.DistributedDataParallel(WithUnused(), find_unused_parameters=True)
    loss_fn(ddp(x), y).backward()
    np.testing.assert_array_equal(ddp.module.extra.weight.grad.numpy(), np.zeros((2, 2)))
ddp_module.ALONE_BYTES = ALONE_BYTES
ok("ddp unused parameters")

# models that differ between ranks are refused at wrap, on every rank
different = lm.nn.Linear(3, 4 + rank)
raises(
    ValueError,
    ["rank 0 has", "rank 1 has", "weight"],
    lambda: dist.DistributedDataParallel(different),
)
ok("ddp different models")

# ---------------------------------------------------------------- checkpoints


def trainer(seed):
    model = dist.DistributedDataParallel(mlp(seed))
    return model, lm.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train(model, optimizer, steps):
    for step in steps:
        optimizer.zero_grad()
        x, y = mine(*data(step))
        loss_fn(model(x), y).backward()
        optimizer.step()


path = sys.argv[1]
model, optimizer = trainer(seed=3)
train(model, optimizer, range(2))
if rank == 0:
    lm.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, path)
dist.barrier()
train(model, optimizer, range(2, 4))
resumed, resumed_optimizer = trainer(seed=4)  # other weights, replaced by the checkpoint
checkpoint = lm.load(path)
resumed.module.load_state_dict(checkpoint["model"])
resumed_optimizer.load_state_dict(checkpoint["optimizer"])
train(resumed, resumed_optimizer, range(2, 4))
for (name, p), (_, q) in zip(model.named_parameters(), resumed.named_parameters()):
    np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
gathered = dist.all_gather(model.module[0].weight.detach()).numpy()
np.testing.assert_array_equal(gathered[0], gathered[1])  # every rank took the same steps
ok("checkpoint")

# ---------------------------------------------------------------- sampler

sampler = dist.DistributedSampler(range(11), seed=5)
sampler.set_epoch(2)
shares = dist.all_gather(lm.asarray(list(sampler))).numpy()
everything = np.random.default_rng(7).permutation(11)
np.testing.assert_array_equal(shares.T.reshape(-1), np.resize(everything, 12))
ok("sampler")

dist.barrier()
print(f"rank {rank} done", flush=True)
