"""lamina.nn's modules, init and the Adam optimizers (issue 13): the Module API
(parameters registered through nested modules, state_dict round trip, train/eval
changing batch norm and dropout, hooks, to(device)), PyTorch's default
initializations, and a small convnet (conv-BN-ReLU-pool x 2, linear) that Adam trains
on a separable task to a loss a sign-flipped gradient cannot reach."""

from collections import OrderedDict

import numpy as np
import pytest

import lamina as lm

nn = lm.nn
F = nn.functional


class Block(nn.Module):
    def __init__(self, c_in, c_out):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.scale = nn.Parameter(lm.ones(()))
        self.plain = lm.zeros(3)  # a tensor attribute, not a parameter

    def forward(self, x):
        return F.relu(self.bn(self.conv(x))) * self.scale


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(Block(1, 4), nn.MaxPool2d(2), Block(4, 4), nn.MaxPool2d(2))
        self.head = nn.Linear(4 * 2 * 2, 2)

    def forward(self, x):
        return self.head(F.flatten(self.features(x)))


def test_parameters_are_registered_through_nested_modules():
    lm.random.seed(0)
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == [  # PyTorch's order: a module's own parameters, then its children's
        "features.0.scale",
        "features.0.conv.weight",
        "features.0.bn.weight",
        "features.0.bn.bias",
        "features.2.scale",
        "features.2.conv.weight",
        "features.2.bn.weight",
        "features.2.bn.bias",
        "head.weight",
        "head.bias",
    ]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in net.parameters())
    assert not isinstance(net.features[0].plain, nn.Parameter)
    assert [n for n, _ in net.named_buffers()][:3] == [
        "features.0.bn.running_mean",
        "features.0.bn.running_var",
        "features.0.bn.num_batches_tracked",
    ]
    assert len(list(net.children())) == 2
    assert len(list(net.modules())) == 1 + 1 + 4 + 2 * 2 + 1  # net, seq, 4 in seq, 2 x 2, head
    shared = nn.Sequential(net.head, net.head)
    assert len(list(shared.parameters())) == 2  # each parameter once
    net.head = nn.Linear(16, 3)
    assert net.head.out_features == 3 and "head.weight" in dict(net.named_parameters())
    del net.head
    assert "head.weight" not in dict(net.named_parameters())
    with pytest.raises(TypeError, match="cannot assign Tensor as parameter 'scale'"):
        net.features[0].scale = lm.ones(())


def test_state_dict_round_trip():
    lm.random.seed(1)
    a = Net()
    lm.random.seed(2)
    b = Net()
    x = lm.randn(3, 1, 8, 8)
    a.eval(), b.eval()
    assert not np.allclose(a(x).numpy(), b(x).numpy())
    state = a.state_dict()
    assert (
        list(state)
        == [n for n, _ in a.named_parameters()][:4]
        + [
            "features.0.bn.running_mean",
            "features.0.bn.running_var",
            "features.0.bn.num_batches_tracked",
        ]
        + list(state)[7:]
    )
    weight = b.head.weight
    result = b.load_state_dict(state)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert b.head.weight is weight  # loaded in place
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    state["head.weight"] = lm.zeros((3, 16))
    with pytest.raises(ValueError, match=r"'head.weight' has shape \(3, 16\)"):
        b.load_state_dict(state)
    del state["head.weight"]
    with pytest.raises(KeyError, match="missing keys \\['head.weight'\\]"):
        b.load_state_dict(state)
    assert b.load_state_dict(state, strict=False).missing_keys == ["head.weight"]


def test_train_and_eval_change_batch_norm_and_dropout():
    lm.random.seed(3)
    bn = nn.BatchNorm2d(2)
    x = lm.randn(4, 2, 3, 3) * 3.0 + 1.0
    y = bn(x)
    assert bn.num_batches_tracked.item() == 1
    assert np.allclose(y.numpy().mean(axis=(0, 2, 3)), 0, atol=1e-6)  # batch statistics
    batch_mean = x.numpy().astype(np.float64).mean(axis=(0, 2, 3))  # float32 sums: 1e-6
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * batch_mean, rtol=1e-6)
    bn.eval()
    assert not bn.training
    z = bn(x)
    want = (x.numpy() - bn.running_mean.numpy()[:, None, None]) / np.sqrt(
        bn.running_var.numpy()[:, None, None] + 1e-5
    )
    np.testing.assert_allclose(z.numpy(), want, rtol=1e-6)
    assert bn.num_batches_tracked.item() == 1  # not updated in evaluation

    drop = nn.Sequential(nn.Dropout(0.5))
    ones = lm.ones((100,))
    assert (drop(ones).numpy() == 0).any()
    drop.eval()
    assert drop[0].training is False
    np.testing.assert_array_equal(drop(ones).numpy(), ones.numpy())


@pytest.mark.parametrize(
    "cls, shape",
    [("BatchNorm1d", (6, 3)), ("BatchNorm1d", (4, 3, 5)), ("BatchNorm3d", (2, 3, 2, 3, 2))],
)
def test_batch_norm_of_other_ranks_trains_and_evaluates_as_the_functional_one(cls, shape):
    """BatchNorm1d and BatchNorm3d, PyTorch's other two: the functional batch norm
    (checked against the oracle in test_nn.py) with the module's statistics."""
    lm.random.seed(4)
    bn, x = getattr(nn, cls)(3, momentum=0.2), lm.randn(*shape) * 2.0 + 1.0
    bn.weight.data[...] = lm.asarray([0.5, 1.0, 2.0])
    axes = (0, *range(2, len(shape)))
    stats = lm.zeros(3), lm.ones(3)
    want = F.batch_norm(x, *stats, bn.weight, bn.bias, training=True, momentum=0.2)
    np.testing.assert_array_equal(bn(x).detach().numpy(), want.detach().numpy())
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.2 * x.numpy().mean(axis=axes), rtol=1e-6)
    np.testing.assert_array_equal(bn.running_var.numpy(), stats[1].numpy())
    bn.eval()
    want = F.batch_norm(x, *stats, bn.weight, bn.bias)
    np.testing.assert_array_equal(bn(x).detach().numpy(), want.detach().numpy())
    assert set(bn.state_dict()) == {
        "weight", "bias", "running_mean", "running_var", "num_batches_tracked"}  # fmt: skip
    wrong = (3, 3, 3, 3) if cls == "BatchNorm1d" else (3, 3)
    with pytest.raises(ValueError, match=f"{cls}: expected a .*-D input, got shape"):
        bn(lm.ones(wrong))


def test_sequential_fuses_batch_norm_and_relu_with_the_same_results(monkeypatch):
    """Note [Fused batch norm and relu]: a BatchNorm2d then a ReLU run as one call, in
    training and evaluation, with the outputs, gradients and running statistics of
    the two modules; not where a hook would see the value between, nor for a subclass
    or when switched off."""
    relu_calls = []
    forward = nn.ReLU.forward
    monkeypatch.setattr(nn.ReLU, "forward", lambda m, x: relu_calls.append(m) or forward(m, x))
    data = np.random.default_rng(0).standard_normal((4, 3, 5, 5))
    x = lm.asarray(data, dtype=lm.get_default_dtype())  # the modules' dtype
    results = {}
    for fuse in (True, False):
        lm.random.seed(1)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2))
        model.fuse = fuse
        relu_calls.clear()
        out = model(x)
        lm.sum(out * out).backward()
        model.eval()
        results[fuse] = [out, model(x), *(p.grad for p in model.parameters()), *model.buffers()]
        assert len(relu_calls) == (0 if fuse else 2)
        assert model[1:].fuse is fuse  # a slice keeps the setting
    for got, want in zip(results[True], results[False]):
        np.testing.assert_array_equal(got.numpy(), want.numpy())

    class Norm(nn.BatchNorm2d):
        pass

    hooked = nn.Sequential(nn.BatchNorm2d(3), nn.ReLU())
    seen = []
    hooked[0].register_forward_hook(lambda m, args, out: seen.append(out))
    own_forward = nn.ReLU()
    own_forward.forward = lambda x: relu_calls.append(own_forward) or F.relu(x)
    for model in (
        hooked,
        nn.Sequential(Norm(3), nn.ReLU()),
        nn.Sequential(nn.BatchNorm2d(3), own_forward),
    ):
        relu_calls.clear()
        model(x)
        assert len(relu_calls) == 1
    assert (seen[0].numpy() < 0).any()  # the hook saw batch norm's output, before relu


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_sequential_fuses_conv2d_and_linear_with_relu_with_the_same_results(layout, monkeypatch):
    """Note [Fused epilogues]: a Conv2d or a Linear then a ReLU (in place or not) run as
    one call, in training and evaluation, with the outputs, layouts and gradients of
    the modules one by one, bit for bit."""
    relu_calls = []
    forward = nn.ReLU.forward
    monkeypatch.setattr(nn.ReLU, "forward", lambda m, x: relu_calls.append(m) or forward(m, x))
    data = np.random.default_rng(0).standard_normal((2, 3, 8, 8))
    x = F.to_layout(lm.asarray(data, dtype=lm.get_default_dtype()), layout)
    results = {}
    for fuse in (True, False):
        lm.random.seed(1)
        model = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(8, 8, 3, padding=1),  # Winograd's
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(512, 10),
            nn.ReLU(inplace=True),
            nn.Linear(10, 3),
        )
        model.fuse = fuse
        relu_calls.clear()
        out = model(x)
        lm.sum(out * out).backward()
        assert len(relu_calls) == (0 if fuse else 3)
        hidden = model[:4](x)
        assert F.layout_of(hidden) == layout
        model.eval()
        with lm.no_grad():
            results[fuse] = [out, model(x), hidden, *(p.grad for p in model.parameters())]
    for got, want in zip(results[True], results[False], strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert (results[True][2].numpy() == 0).any()  # relu clipped some outputs


def test_a_fusion_declared_in_one_place_is_applied_by_sequential(monkeypatch):
    """Note [Rewrites]: a new fusion is one ``rewrite`` declaration; Sequential applies
    it (the longest pattern first) without knowing it, and hands each stage's
    arguments to it."""
    from lamina.dispatch import rewrites

    monkeypatch.setattr(rewrites, "REWRITES", dict(rewrites.REWRITES))
    calls = []

    @rewrites.rewrite("relu_relu", ("relu", "relu"), exact=True, doc="relu is idempotent")
    def relu_once(x, first, second):
        calls.append((first(x), second(x)))
        return F.relu(x)

    x = lm.asarray([[-1.0, 2.0], [3.0, -4.0]])
    model = nn.Sequential(nn.ReLU(), nn.ReLU(), nn.ReLU(), nn.Linear(2, 2))
    out = model(x)
    assert len(calls) == 1 and calls[0][0][0] is x  # ReLU's operator_args: (x,)
    np.testing.assert_array_equal(out.numpy(), model[3](F.relu(x)).numpy())
    assert rewrites.match(["relu", "relu", "linear"]).name == "relu_relu"
    assert rewrites.match(["native_batch_norm", "relu"]).name == "batch_norm_relu"
    assert rewrites.match(["relu", None]) is None
    with pytest.raises(ValueError, match="unknown operator 'reluu'"):
        rewrites.rewrite("typo", ("reluu",), exact=True, doc="")
    with pytest.raises(ValueError, match="registered twice"):
        rewrites.rewrite("relu_relu", ("relu", "relu"), exact=True, doc="")(relu_once)


def test_batch_norm_momentum_none_is_the_cumulative_average():
    bn = nn.BatchNorm2d(1, momentum=None)
    batches = [
        lm.full((2, 1, 2, 2), float(v)) + lm.asarray([[[[0.0, 1.0], [2.0, 3.0]]]]) for v in (1, 5)
    ]
    for b in batches:
        bn(b)
    np.testing.assert_allclose(bn.running_mean.numpy(), [np.mean([2.5, 6.5])])
    bn_untracked = nn.BatchNorm2d(1, affine=False, track_running_stats=False).eval()
    y = bn_untracked(batches[0])
    assert np.allclose(y.numpy().mean(), 0, atol=1e-6)  # batch statistics even in eval
    assert list(bn_untracked.parameters()) == [] and bn_untracked.running_mean is None


def test_zero_grad_and_forward_hooks():
    net = nn.Linear(3, 2)
    calls = []
    handle = net.register_forward_hook(lambda m, args, out: calls.append(out.shape))
    pre = net.register_forward_pre_hook(lambda m, args: (args[0] * 2.0,))
    x = lm.ones((4, 3))
    out = net(x)
    np.testing.assert_allclose(
        out.numpy(), F.linear(x * 2.0, net.weight, net.bias).detach().numpy()
    )
    assert calls == [(4, 2)]
    handle.remove(), pre.remove()
    lm.sum(net(x)).backward()
    assert calls == [(4, 2)] and net.weight.grad is not None
    net.zero_grad(set_to_none=False)
    assert not net.weight.grad.numpy().any()
    net.zero_grad()
    assert net.weight.grad is None


def test_to_a_device_and_a_dtype():
    lm.random.seed(4)
    net = Net()
    x = lm.randn(2, 1, 8, 8)
    net.eval()
    want = net(x).numpy()
    net.to("counting")
    assert all(p.device == "counting" for p in net.parameters())
    assert net.features[0].bn.running_mean.device == "counting"
    got = net(x.to("counting"))
    assert got.device == "counting"
    # on the device batch norm runs as its decomposition (statistics in float32)
    np.testing.assert_allclose(got.to("cpu").numpy(), want, rtol=1e-5, atol=1e-6)
    net.to("cpu").double()  # then float: one of the two converts, whichever the default
    assert net.head.weight.dtype == lm.float64 and net.head.weight.device == "cpu"
    assert net.features[0].bn.running_var.dtype == lm.float64
    net.float()
    assert net.head.weight.dtype == lm.float32 and net.head.weight.device == "cpu"
    assert net.features[0].bn.running_var.dtype == lm.float32
    assert net.features[0].bn.num_batches_tracked.dtype == lm.int64


def test_default_initializations_follow_pytorch():
    lm.random.seed(5)
    lin = nn.Linear(50, 20)
    bound = 1 / np.sqrt(50)
    for t in (lin.weight, lin.bias):
        assert np.abs(t.numpy()).max() <= bound and np.abs(t.numpy()).max() > 0.9 * bound
    assert lin.weight.dtype == lin.bias.dtype == lm.get_default_dtype()
    other = lm.float64 if lm.get_default_dtype() == lm.float32 else lm.float32
    assert nn.Linear(2, 2, dtype=other).weight.dtype == other  # not the default
    conv = nn.Conv2d(6, 4, (3, 2), groups=2)
    bound = 1 / np.sqrt(3 * 3 * 2)
    assert np.abs(conv.weight.numpy()).max() <= bound
    assert np.abs(conv.bias.numpy()).max() <= bound
    bn = nn.BatchNorm2d(3)
    np.testing.assert_array_equal(bn.weight.numpy(), 1)
    np.testing.assert_array_equal(bn.bias.numpy(), 0)
    lm.random.seed(5)
    again = nn.Linear(50, 20)
    np.testing.assert_array_equal(again.weight.numpy(), lin.weight.numpy())  # reproducible


def test_init_functions():
    lm.random.seed(6)
    t = lm.empty((300, 200))
    nn.init.xavier_uniform_(t)
    assert np.abs(t.numpy()).max() <= np.sqrt(6 / 500)
    nn.init.kaiming_normal_(t, nonlinearity="relu")
    assert t.numpy().std() == pytest.approx(np.sqrt(2 / 200), rel=0.05)
    nn.init.normal_(t, 1.0, 0.5)
    assert t.numpy().mean() == pytest.approx(1.0, abs=0.01)
    assert nn.init.constant_(t, 3.0).numpy().min() == 3.0
    assert nn.init.calculate_gain("leaky_relu", 0.2) == pytest.approx(np.sqrt(2 / 1.04))
    assert nn.init.fan_in_and_fan_out(lm.empty((4, 3, 5, 5))) == (75, 100)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        nn.init.xavier_uniform_(lm.empty(4))
    p = nn.Parameter(lm.zeros(3))
    nn.init.ones_(p)  # a leaf that requires grad, filled under no_grad
    assert p.requires_grad and p.is_leaf and p.numpy().tolist() == [1, 1, 1]


def test_modules_repr_and_layers():
    net = nn.Sequential(
        OrderedDict(
            conv=nn.Conv2d(3, 8, 5, stride=2, padding=2), act=nn.GELU(), pool=nn.AvgPool2d(2)
        )
    )
    text = repr(net)
    assert text.splitlines()[0] == "Sequential("
    assert "(conv): Conv2d(3, 8, kernel_size=(5, 5), stride=(2, 2), padding=(2, 2))" in text
    x = lm.randn(1, 3, 16, 16)
    assert net(x).shape == (1, 8, 4, 4)
    layers = [
        (nn.MaxPool2d(3, 2, padding=1), (1, 3, 8, 8)),
        (nn.MinPool2d(2), (1, 3, 8, 8)),
        (nn.AdaptiveAvgPool2d((2, 3)), (1, 3, 2, 3)),
        (nn.LocalResponseNorm(3), (1, 3, 16, 16)),
        (nn.LeakyReLU(0.1), (1, 3, 16, 16)),
        (nn.Flatten(), (1, 768)),
        (nn.Identity(), (1, 3, 16, 16)),
    ]
    for layer, shape in layers:
        assert layer(x).shape == shape, layer
    idx = nn.MaxPool2d(2, return_indices=True)(x)[1]
    assert idx.dtype == lm.int64
    with pytest.raises(ValueError, match="expected a 4-D input"):
        nn.BatchNorm2d(3)(lm.zeros((2, 3)))
    with pytest.raises(ValueError, match="padding_mode must be one of 'zeros', 'reflect'"):
        nn.Conv2d(3, 3, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="ConvTranspose2d: only padding_mode='zeros'"):
        nn.ConvTranspose2d(3, 3, 3, padding_mode="reflect")  # PyTorch's rule too


def test_losses_as_modules():
    logits, target = lm.randn(4, 3), lm.asarray([0, 2, 1, 2])
    assert nn.CrossEntropyLoss()(logits, target).item() == pytest.approx(
        F.cross_entropy(logits, target).item()
    )
    loss = nn.NLLLoss(reduction="sum")(F.log_softmax(logits, 1), target)
    assert loss.item() == pytest.approx(F.cross_entropy(logits, target, reduction="sum").item())
    assert nn.MSELoss()(logits, logits * 0.0).item() == pytest.approx(
        float((logits.numpy() ** 2).mean())
    )


# ---------------------------------------------------------------- training


def _task(n=64, seed=0):
    """8x8 images of noise plus a bright 3x3 blob in the left half (class 0) or in the
    right half (class 1): separable, but only by where the blob is."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 0.5, (n, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 2, n)
    for i in range(n):
        row, col = rng.integers(0, 6), rng.integers(0, 2) + 4 * y[i]
        x[i, 0, row : row + 3, col : col + 2] += 2.0
    return lm.asarray(x), lm.asarray(y)


def _train(flip, steps=25):
    lm.random.seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 2 * 2, 2),
    ).float()  # the production dtype
    x, y = _task()
    opt = lm.optim.Adam(net.parameters(), lr=0.02)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        if flip:
            for p in net.parameters():
                p.grad = -p.grad
        opt.step()
    net.eval()
    test_x, test_y = _task(seed=1)
    with lm.no_grad():
        logits = net(test_x)
        return loss_fn(logits, test_y).item(), (logits.numpy().argmax(1) == test_y.numpy()).mean()


def test_a_small_convnet_learns_with_adam_and_not_with_a_flipped_gradient():
    loss, accuracy = _train(flip=False)
    flipped_loss, _ = _train(flip=True)
    assert loss < 0.05 and accuracy >= 0.95, (loss, accuracy)
    assert flipped_loss > 0.5, flipped_loss


def test_every_public_name_of_lamina_nn_is_documented():
    for name in nn.__all__:
        assert (getattr(nn, name).__doc__ or "").strip(), name
    for name in nn.init.__all__:
        assert (getattr(nn.init, name).__doc__ or "").strip(), name


def test_the_readme_convnet_example_runs():
    """README.md's "Train a convnet" block, shortened (20 steps instead of 200), in a
    fresh process: it must run as written."""
    import pathlib
    import subprocess
    import sys

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = readme.split("### Train a convnet", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "for step in range(200):" in code and "batch(2000)" in code
    code = code.replace("range(200)", "range(20)").replace("batch(2000)", "batch(200)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("step 0: loss") and lines[-1].startswith("accuracy ")
