"""The graph passes that optimize convnets, each alone on a golden graph (canonical
printed graphs before and after, as TensorFlow's layout-pass tests), then all together
on the three benchmark convnets: compiled equals eager in inference and training, in
both memory layouts."""

import copy
import itertools

import numpy as np
import pytest

import lamina as lm
from lamina import jit
from lamina.jit import executor, passes
from lamina.jit.passes import hoist, layout, recompute
from lamina.tools.bench import convnet

F = lm.nn.functional


def rand(*shape, seed=0):
    return lm.asarray(np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32))


def conv_bn_relu(bias=False):
    """Conv2d, BatchNorm2d (running statistics away from 0 and 1), ReLU, in eval mode."""
    lm.random.seed(0)
    model = lm.nn.Sequential(
        lm.nn.Conv2d(3, 4, 3, padding=1, bias=bias), lm.nn.BatchNorm2d(4), lm.nn.ReLU()
    )
    bn = model[1]
    with lm.no_grad():
        bn.running_mean.copy_(rand(4, seed=1))
        bn.running_var.copy_(lm.abs(rand(4, seed=2)) + 0.5)
        bn.weight.copy_(rand(4, seed=3))
        bn.bias.copy_(rand(4, seed=4))
    return model.eval()


def close(got, want, rtol=1e-5):
    got, want = got.numpy(), want.numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


# ---------------------------------------------------------------- rewrite


def test_a_declared_fusion_applies_to_functional_code():
    bn = conv_bn_relu()[1]

    def f(x):
        return F.relu(bn(x)) * 2.0

    x = rand(2, 4, 5, 5)
    with lm.no_grad():
        graph = passes.apply(jit.trace(f, x), ["rewrite"])
        graph.lint()
        assert str(graph) == (
            "graph(x: float32[2, 4, 5, 5]):\n"
            "  %0: float32[4] = parameter\n"
            "  %1: float32[4] = parameter\n"
            "  %2: float32[4] = constant\n"
            "  %3: float32[4] = constant\n"
            "  %9: float32[2, 4, 5, 5], %10: float32[4], %11: float32[4] = "
            "native_batch_norm(x, %0, %1, %2, %3, False, 0.1, 1e-05, True)\n"
            "  %8: float32[2, 4, 5, 5] = multiply(%9, 2.0)\n"
            "  return %8"
        )
        got = jit.compile(f, passes=["rewrite"])(x)
        np.testing.assert_array_equal(got.numpy(), f(x).numpy())  # declared exact


def test_a_value_read_elsewhere_is_never_fused_away():
    bn = conv_bn_relu()[1]

    def f(x):
        y = bn(x)
        return F.relu(y), y  # batch norm's own result is returned too

    with lm.no_grad():
        graph = passes.apply(jit.trace(f, rand(2, 4, 5, 5)), ["rewrite"])
    assert [n.name for n in graph.nodes] == ["native_batch_norm", "relu"]


# ---------------------------------------------------------------- fold_batch_norm


@pytest.mark.parametrize("bias", [False, True])
def test_batch_norm_in_evaluation_folds_into_the_convolution(bias):
    model = conv_bn_relu(bias)
    x = rand(2, 3, 5, 5)
    with lm.no_grad():
        graph = passes.apply(jit.trace(model, x), ["fold_batch_norm"])
        graph.lint()
        assert [n.name for n in graph.nodes][-2:] == ["conv2d", "relu"]
        assert "native_batch_norm" not in str(graph)
        for layout in ("NCHW", "NHWC"):
            image = F.to_layout(x, layout)
            close(jit.compile(model, passes=["fold_batch_norm"])(image), model(image))


def test_batch_norm_in_training_and_a_shared_convolution_are_not_folded():
    model = conv_bn_relu().train()
    graph = passes.apply(jit.trace(model, rand(2, 3, 5, 5)), ["fold_batch_norm"])
    assert "native_batch_norm" in [n.name for n in graph.nodes]
    model.eval()
    conv, bn = model[0], model[1]

    def shared(x):
        y = conv(x)
        return bn(y), y

    with lm.no_grad():
        graph = passes.apply(jit.trace(shared, rand(2, 3, 5, 5)), ["fold_batch_norm"])
    assert [n.name for n in graph.nodes] == ["conv2d", "native_batch_norm"]


# ---------------------------------------------------------------- hoist


def test_calls_on_parameters_alone_are_hoisted_and_rerun_when_one_changes():
    model = conv_bn_relu()
    x = rand(2, 3, 5, 5)
    with lm.no_grad():
        graph = passes.apply(jit.trace(model, x), ["fold_batch_norm", "hoist"])
        assert str(graph) == (
            "graph(x: float32[2, 3, 5, 5]):\n"
            "  %0: float32[4, 3, 3, 3] = parameter\n"
            "  %2: float32[4] = parameter\n"
            "  %3: float32[4] = parameter\n"
            "  %4: float32[4] = constant\n"
            "  %5: float32[4] = constant\n"
            "  %17: float32[4, 3, 3, 3], %15: float32[4] = hoisted[add, sqrt, divide, "
            "multiply, negative, multiply, add, reshape, multiply](%5, %2, %4, %3, %0)\n"
            "  %18: float32[2, 4, 5, 5] = conv2d(x, %17, %15, (1, 1), (1, 1, 1, 1), (1, 1), 1)\n"
            "  %19: float32[2, 4, 5, 5] = relu(%18)\n"
            "  return %19"
        )
        compiled = jit.compile(model, passes=["fold_batch_norm", "hoist"])
        close(compiled(x), model(x))
        (variant,) = compiled._compiled.variants.values()
        (target,) = [n.target for n in variant.graph.nodes if isinstance(n.target, hoist.Hoisted)]
        runs = []
        plan_run = target.plan.run
        target.plan.run = lambda tensors: runs.append(1) or plan_run(tensors)
        compiled(x)
        assert runs == []  # nothing changed: the last results serve
        model[0].weight.mul_(0.5)  # an in-place write (an optimizer step)
        model[1].running_var.add_(1.0)  # a buffer
        close(compiled(x), model(x))
        state = copy.deepcopy(conv_bn_relu().state_dict())
        state["1.running_mean"] = rand(4, seed=9)
        model.load_state_dict(state)
        close(compiled(x), model(x))
        assert len(runs) == 2


# ---------------------------------------------------------------- siblings


def branches():
    """An Inception-like block: two 1 x 1 convolutions of x with relu (siblings), a
    3 x 3 one (another geometry) and a 1 x 1 one without bias (another family)."""
    lm.random.seed(0)
    a, b = lm.nn.Conv2d(4, 3, 1), lm.nn.Conv2d(4, 2, 1)
    c, d = lm.nn.Conv2d(4, 2, 3, padding=1), lm.nn.Conv2d(4, 5, 1, bias=False)
    after = lm.nn.Conv2d(2, 2, 3, padding=1)

    def f(x):
        return lm.concat([F.relu(a(x)), after(F.relu(b(x))), c(x), d(x)], axis=1)

    return f, [m.weight for m in (a, b, c, d, after)] + [a.bias, b.bias]


def test_sibling_convolutions_merge_into_one_and_split():
    f, _ = branches()
    x = rand(2, 4, 5, 5)
    with lm.no_grad():
        graph = passes.apply(jit.trace(f, x), ["rewrite", "siblings"])
        graph.lint()
        assert str(graph) == (
            "graph(x: float32[2, 4, 5, 5]):\n"
            "  %0: float32[3, 4, 1, 1] = parameter\n"
            "  %1: float32[3] = parameter\n"
            "  %4: float32[2, 4, 1, 1] = parameter\n"
            "  %5: float32[2] = parameter\n"
            "  %8: float32[2, 2, 3, 3] = parameter\n"
            "  %9: float32[2] = parameter\n"
            "  %11: float32[2, 4, 3, 3] = parameter\n"
            "  %12: float32[2] = parameter\n"
            "  %14: float32[5, 4, 1, 1] = parameter\n"
            "  %19: float32[5, 4, 1, 1] = concat([%0, %4], 0)\n"
            "  %20: float32[5] = concat([%1, %5], 0)\n"
            "  %21: float32[2, 5, 5, 5] = "
            "conv2d_relu(x, %19, %20, (1, 1), (0, 0, 0, 0), (1, 1), 1)\n"
            "  %22: float32[2, 3, 5, 5]{125,25,5,1}, %23: float32[2, 2, 5, 5]{125,25,5,1} = "
            "split(%21, [3, 2], 1)\n"
            "  %10: float32[2, 2, 5, 5] = conv2d(%23, %8, %9, (1, 1), (1, 1, 1, 1), (1, 1), 1)\n"
            "  %13: float32[2, 2, 5, 5] = conv2d(x, %11, %12, (1, 1), (1, 1, 1, 1), (1, 1), 1)\n"
            "  %15: float32[2, 5, 5, 5] = conv2d(x, %14, None, (1, 1), (0, 0, 0, 0), (1, 1), 1)\n"
            "  %16: float32[2, 12, 5, 5] = concat([%22, %10, %13, %15], 1)\n"
            "  return %16"
        )
        hoisted = passes.apply(jit.trace(f, x), ["rewrite", "siblings", "hoist"])
        assert hoisted.nodes[0].name == "hoisted[concat, concat]"
        compiled = jit.compile(f, passes=["rewrite", "siblings", "hoist"])
        close(compiled(x), f(x))


def _sibling_programs():
    """Programs whose sibling convolutions must not merge (Note [Sibling convolutions]),
    each with the input it runs on."""
    lm.random.seed(0)
    a, b = lm.nn.Conv2d(4, 3, 1), lm.nn.Conv2d(4, 2, 1)

    def reshaped(x):  # a reader that depends on the strides
        return a(x).reshape(2, -1).exp() * 2, b(x).flatten(1) + 1

    def returned(x):
        return a(x), b(x)

    def written(x):  # the input changes between the siblings
        y = a(x)
        x.mul_(2)
        return lm.concat([y, b(x)], axis=1)

    def broken(x):  # a graph break between them
        y, z = a(x), b(x)
        return lm.concat([y * float(y.sum()), z], axis=1)

    images = rand(2, 4, 5, 5)
    return [
        (reshaped, images),
        (returned, images),
        (written, images),
        (broken, images),
        (returned, rand(4, 5, 5)),  # unbatched
        (returned, F.to_layout(images, "NHWC")),
    ]


def results(out):
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("case", range(6))
def test_siblings_that_a_view_would_change_stay_apart(case):
    f, x = _sibling_programs()[case]
    with lm.no_grad():
        want = results(f(x.clone()))
        compiled = jit.compile(f, layout=None)
        got = results(compiled(x.clone()))
    for g, w in zip(got, want, strict=True):
        close(g, w)
        assert g.is_contiguous() == w.is_contiguous()
    assert not any("split" in str(graph) for graph in compiled.graphs)


def test_siblings_in_training_keep_their_gradients():
    """In a joint graph the siblings' results are saved for the backward (returned by
    the forward); a program that records autograd through its plan (one returning a
    dict) does not merge them either: both give eager mode's gradients."""
    f, params = branches()
    for wrap in (lambda y: y, lambda y: {"y": y}):
        x = rand(2, 4, 5, 5).requires_grad_()
        grads = []
        for run in (lambda x, wrap=wrap: wrap(f(x)), jit.compile(lambda x, wrap=wrap: wrap(f(x)))):
            for p in [x, *params]:
                p.grad = None
            out = run(x)
            ((out["y"] if isinstance(out, dict) else out) ** 2).sum().backward()
            grads.append([p.grad.numpy().copy() for p in [x, *params]])
        for got, want in zip(grads[1], grads[0]):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# ---------------------------------------------------------------- layout


def test_conversions_that_are_not_borders_are_removed():
    def f(x):
        there_and_back = F.to_layout(F.to_layout(x, "NHWC"), "NCHW")
        return F.relu(there_and_back) + F.to_layout(x, "NCHW")

    x = rand(2, 3, 4, 5)
    graph = passes.apply(jit.trace(f, x), ["layout", "dce"])
    assert str(graph) == (
        "graph(x: float32[2, 3, 4, 5]):\n"
        "  %2: float32[2, 3, 4, 5] = relu(x)\n"
        "  %4: float32[2, 3, 4, 5] = add(%2, x)\n"
        "  return %4"
    )
    np.testing.assert_array_equal(jit.compile(f)(x).numpy(), f(x).numpy())
    kept = passes.apply(jit.trace(lambda x: F.to_layout(x, "NHWC"), x), ["layout", "dce"])
    assert [n.name for n in kept.nodes] == ["to_layout"]  # returned: the program's own


@pytest.mark.parametrize("name, borders", [("alexnet", 1), ("vgg", 1), ("inception", 0)])
def test_a_channels_last_convnet_converts_only_at_its_borders(name, borders):
    """Images enter channels-last and stay so through convolutions, pooling, batch
    norm, relu and Inception's concatenations; they leave it once, where they are
    flattened into features (Inception's global pooling leaves 1 x 1 images, in both
    layouts at once)."""
    model = convnet.build(convnet.ARCHITECTURES[name], convnet._lamina()).eval()
    with lm.no_grad():
        graph = passes.apply(jit.trace(model, F.to_layout(rand(1, 3, 64, 64), "NHWC")))
    assert len(layout.conversions(graph)) == borders


def small_convnet():
    """Convolution, batch norm, ReLU, pooling, flattened into a linear layer."""
    lm.random.seed(0)
    return lm.nn.Sequential(
        lm.nn.Conv2d(3, 6, 3, padding=1),
        lm.nn.BatchNorm2d(6),
        lm.nn.ReLU(),
        lm.nn.MaxPool2d(2),
        lm.nn.Flatten(),
        lm.nn.Linear(6 * 4 * 4, 5),
    )


@pytest.mark.parametrize("channels_last_faster", [True, False])
def test_auto_layout_keeps_the_faster_plan_for_a_kind_of_variant(channels_last_faster, monkeypatch):
    """Note [Compiled layout]: NCHW inference is traced channels-last too, and the
    faster plan is kept (the timing stubbed); channels-last converts only at the
    borders, where images enter and where they are flattened; a later size of the same
    kind gets the same layout without another trial."""
    trials = []
    stub = lambda *plans: trials.append(plans) or channels_last_faster
    monkeypatch.setattr(jit.layouts, "faster", stub)
    model = small_convnet().eval()
    compiled = jit.compile(model)
    with lm.no_grad():
        for batch in (2, 3):
            x = rand(batch, 3, 8, 8, seed=batch)
            close(compiled(x), model(x))
    assert len(trials) == 1
    for graph in compiled._compiled.graphs:  # each size's, and the symbolic one
        converts = [n.args[0] for n in graph.nodes if n.name == "to_layout"]
        if channels_last_faster:  # the input, and the flatten
            assert converts == [graph.inputs[0]] and len(layout.conversions(graph)) == 2
        else:
            assert not converts and not layout.conversions(graph)


def test_auto_layout_trials_of_a_training_step_leave_no_trace(monkeypatch):
    """Note [Compiled layout]: the trials (real ones) of a training step write no
    ``.grad`` and put batch norm's running statistics back, so the first compiled step
    leaves the model as eager's first step does, whichever layout won."""
    trials, real = [], jit.layouts.faster
    spy = lambda *a: trials.append(1) or real(*a)
    monkeypatch.setattr(jit.layouts, "faster", spy)
    eager = small_convnet()
    model = copy.deepcopy(eager)
    compiled = jit.compile(model)
    x = rand(4, 3, 8, 8)
    for run in (eager, compiled):
        lm.sum(run(x) ** 2).backward()
    assert trials == [1]  # a step's trial ran (its outcome is the machine's)
    (chosen,) = compiled._compiled.layouts.values()  # one kind of variant, one choice
    assert chosen in (None, "NHWC")
    largest = max(np.abs(p.grad.numpy()).max() for p in eager.parameters())
    for a, b in zip(eager.parameters(), model.parameters()):
        np.testing.assert_allclose(b.grad.numpy(), a.grad.numpy(), atol=1e-5 * largest)
    for a, b in zip(eager.buffers(), model.buffers()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-7)


def test_a_program_channels_last_images_cannot_run_keeps_its_layout():
    """Note [Failed trials]: a view of a convolution's result that NCHW strides allow
    (channels-last ones cannot give it) failed to compile under ``"auto"``; the trial's
    failure keeps NCHW, and its batch norm statistics are put back."""
    lm.random.seed(0)
    conv, bn = lm.nn.Conv2d(4, 3, 1), lm.nn.BatchNorm2d(3)

    def f(x):
        return bn(conv(x)).view(-1)

    x = rand(2, 4, 5, 5)
    twin = copy.deepcopy(bn)
    with lm.no_grad():
        got = jit.compile(f)(x)  # layout "auto"
        bn, eager = twin, bn  # the eager run on the twin's untouched statistics
        want = f(x)
    close(got, want)
    close(eager.running_mean, twin.running_mean)


def test_auto_layout_tries_nothing_whose_effects_it_could_not_undo(monkeypatch):
    """Dropout draws random numbers; an in-place write to an argument changes the
    caller's tensor: neither program is run again for a trial."""
    monkeypatch.setattr(jit.layouts, "faster", lambda *a: pytest.fail("a trial ran"))
    lm.random.seed(0)
    dropping = jit.compile(lm.nn.Sequential(lm.nn.Conv2d(3, 4, 3), lm.nn.Dropout(0.5)))
    dropping(rand(2, 3, 8, 8))
    writing = jit.compile(lambda x, w: F.conv2d(x.mul_(2.0), w))
    with lm.no_grad():
        writing(rand(2, 3, 8, 8), rand(4, 3, 3, 3))


def test_a_fixed_layout_runs_training_channels_last_and_gives_eager_results():
    """``layout="NHWC"``: a training step's loss and gradients as eager's (within
    rounding: the kernels sum in another order), images returned in their NCHW layout;
    channels-last inputs are left as they are."""
    eager = small_convnet()
    model = copy.deepcopy(eager)
    compiled = jit.compile(model, layout="NHWC")
    x = rand(2, 3, 8, 8)
    for run in (eager, compiled):
        lm.sum(run(x) ** 2).backward()
    # within 1e-5 of the largest gradient: the convolution's bias, which batch norm
    # cancels, has only rounding for a gradient
    largest = max(np.abs(p.grad.numpy()).max() for p in eager.parameters())
    for a, b in zip(eager.parameters(), model.parameters()):
        np.testing.assert_allclose(b.grad.numpy(), a.grad.numpy(), atol=1e-5 * largest)
    (variant,) = compiled._compiled.variants.values()
    assert "to_layout" in [n.name for n in variant.plan.forward.graph.nodes]
    features = jit.compile(model[:3], layout="NHWC")
    with lm.no_grad():
        out = features(x)
        close(out, model[:3](x))
        assert F.layout_of(out) == "NCHW"
        graph = jit.trace(features._compiled.fn, F.to_layout(x, "NHWC"))
        assert "to_layout" not in [n.name for n in graph.nodes]
    with pytest.raises(ValueError, match="layout must be one of"):
        jit.compile(model, layout="NCWH")


# ---------------------------------------------------------------- saved values


def _vgg_step(run, x, y):
    loss = F.cross_entropy(run(x), y)
    loss.backward()
    return loss


@pytest.mark.core_independent  # the pool's counters: the C core's
def test_a_compiled_training_step_peaks_lower_than_eager():
    """Note [Saved values of a compiled step]: the forward's values the backward reads
    are released after their last use there, as eager releases each node's saved
    tensors; and a plan's intermediates after their last use (Note [Released values]).
    With each batch norm's result made again in the backward (Note [Recomputed
    normalizations]), VGG's step peaks at most 0.8x as high as eager's (0.58x measured); without
    that pass, higher than with it."""
    lm.random.seed(0)
    model = convnet.build(convnet.ARCHITECTURES["vgg"], convnet._lamina())
    compiled = jit.compile(model, layout=None)  # NCHW both, as eager
    keeping = [p for p in passes.DEFAULT if p != "recompute_normalization"]
    x, y = rand(8, 3, 64, 64), lm.asarray(np.arange(8))
    lm.layers.enable("allocator")
    try:
        peaks = []
        for run in (model, compiled, jit.compile(model, layout=None, passes=keeping)):
            _vgg_step(run, x, y)  # compiled, the pool filled
            model.zero_grad()
            lm.memory.reset_stats()
            before = lm.memory.stats()["bytes_in_use"]
            _vgg_step(run, x, y)
            peaks.append(lm.memory.stats()["peak_bytes_in_use"] - before)
            model.zero_grad()
    finally:
        lm.layers.disable("allocator")
    assert 0 < peaks[1] <= 0.8 * peaks[0] and peaks[1] < peaks[2] <= peaks[0]


@pytest.fixture
def recompute_any_size(monkeypatch):
    """The small models below have no value worth recomputing (Note [Values worth
    recomputing]): the recompute passes' other rules are tested on them without it."""
    monkeypatch.setattr(recompute, "RECOMPUTE_BYTES", 0)


# the normalizations a training step makes again, with the index of the result made
NORMALIZATIONS = {
    "native_batch_norm": (lambda: [lm.nn.BatchNorm2d(4), lm.nn.ReLU()], 0),
    "native_local_response_norm": (lambda: [lm.nn.ReLU(), lm.nn.LocalResponseNorm(3)], 1),
}


def normalized_model(name):
    """Two convolutions, each followed by the normalization ``name`` (and a relu): on
    a batch of (4, 3, 8, 8), each result is (4, 4, 8, 8), then (4, 4, 6, 6)."""
    layers, _ = NORMALIZATIONS[name]
    lm.random.seed(0)
    return lm.nn.Sequential(
        lm.nn.Conv2d(3, 4, 3, padding=1),
        *layers(),
        lm.nn.Conv2d(4, 4, 3),
        *layers(),
        lm.nn.MaxPool2d(2),
        lm.nn.Flatten(),
        lm.nn.Linear(36, 2),
    )


def trained_alike(model, passes_=passes.DEFAULT):
    """The model compiled with ``passes_``, after two steps beside an eager copy whose
    gradients and state (running statistics) it equals bit for bit."""
    eager = copy.deepcopy(model)
    compiled = jit.compile(model, layout=None, passes=passes_)
    x = rand(4, 3, 8, 8)
    for _ in range(2):
        for run, m in ((eager, eager), (compiled, model)):
            m.zero_grad()
            lm.sum(run(x)).backward()
    for (key, a), b in zip(eager.state_dict().items(), model.state_dict().values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=key)
    for a, b in zip(eager.parameters(), model.parameters()):
        np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())
    return compiled


def calls_and_saved(compiled, name):
    """The backward's calls of ``name`` and the results of the forward's that the
    step saves (of the index NORMALIZATIONS names)."""
    _, index = NORMALIZATIONS[name]
    (step,) = compiled._compiled.variants.values()
    again = [n for n in step.plan.backward.graph.nodes if n.name == name]
    saved = [v for v in step.plan.saved if v.node and v.node.name == name]
    return again, [v for v in saved if v is v.node.results[index]]


@pytest.mark.parametrize("name", list(NORMALIZATIONS))
def test_normalizations_are_made_again_in_the_backward(name, recompute_any_size):
    """Note [Recomputed normalizations]: the forward saves no batch norm result and no
    LRN scale; the backward makes them again from the saved input (a batch norm
    without running statistics); the gradients and the running statistics after two
    steps are eager's bit for bit. Without the pass, the forward saves them."""
    model = normalized_model(name)
    again, saved = calls_and_saved(trained_alike(model), name)
    assert len(again) == 2 and not saved
    if name == "native_batch_norm":
        assert all(n.args[3] is None and n.args[4] is None for n in again)
    keeping = [p for p in passes.DEFAULT if p != "recompute_normalization"]
    again, saved = calls_and_saved(trained_alike(model, keeping), name)
    assert not again and len(saved) == 2


def test_the_channels_last_input_is_converted_again_in_the_backward(recompute_any_size):
    """Note [Recomputed conversions]: a step compiled channels-last saves no converted
    copy of its input; the backward converts the input again for the first
    convolution's weight gradient, whose gradients are bit for bit those of the step
    compiled without the pass, which saves the copy."""
    lm.random.seed(0)
    model = lm.nn.Sequential(
        lm.nn.Conv2d(3, 4, 3, padding=1), lm.nn.ReLU(), lm.nn.Flatten(), lm.nn.Linear(64, 2)
    )
    x = rand(2, 3, 4, 4)
    grads, conversions = [], []
    for names in (passes.DEFAULT, [p for p in passes.DEFAULT if p != "recompute_conversion"]):
        m = copy.deepcopy(model)
        compiled = jit.compile(m, layout="NHWC", passes=names)
        lm.sum(compiled(x)).backward()
        (step,) = compiled._compiled.variants.values()
        again = [n for n in step.plan.backward.graph.nodes if n.name == "to_layout"]
        saved = [v for v in step.plan.saved if v.node and v.node.name == "to_layout"]
        conversions.append((len(again), len(saved)))
        grads.append([p.grad.numpy() for p in m.parameters()])
    assert conversions == [(1, 0), (0, 1)]
    for a, b in zip(*grads):
        np.testing.assert_array_equal(a, b)


class _ScaledInPlace(lm.nn.Module):
    """Converts its images to channels-last itself and doubles them in place there:
    all of them, or through a view, the first row of each."""

    def __init__(self, through_view):
        super().__init__()
        self.conv, self.linear = lm.nn.Conv2d(3, 4, 3, padding=1), lm.nn.Linear(64, 2)
        self.through_view = through_view

    def forward(self, x):
        h = F.to_layout(x, "NHWC")
        (h[:, :, 0] if self.through_view else h).mul_(2)
        return self.linear(lm.flatten(F.relu(self.conv(h)), start_dim=1))


@pytest.mark.parametrize("through_view", [False, True])
def test_a_conversion_written_in_place_is_saved_not_made_again(through_view, recompute_any_size):
    """Note [Recomputed conversions]: a converted copy that the step writes in place,
    itself or through a view, is not the input's conversion any more, so the backward
    does not make it again: the step saves it, and its gradients are eager's."""
    lm.random.seed(0)
    model = _ScaledInPlace(through_view)
    eager = copy.deepcopy(model)
    x = rand(2, 3, 4, 4)
    compiled = jit.compile(model, layout=None)
    for run in (eager, compiled):
        lm.sum(run(x)).backward()
    (step,) = compiled._compiled.variants.values()
    assert not [n for n in step.plan.backward.graph.nodes if n.name == "to_layout"]
    for a, b in zip(eager.parameters(), model.parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(NORMALIZATIONS))
def test_values_under_the_recompute_size_are_kept(name, monkeypatch):
    """Note [Values worth recomputing]: with the size set to the first normalization's
    value (4 x 4 x 8 x 8 float32: 4096 bytes) that one is made again in the backward
    and the second's (4 x 4 x 6 x 6) is saved; at the default size, 512 KiB, both
    are saved. Either way the step is eager's bit for bit."""
    monkeypatch.setattr(recompute, "RECOMPUTE_BYTES", 4 * 4 * 8 * 8 * 4)
    again, saved = calls_and_saved(trained_alike(normalized_model(name)), name)
    assert len(again) == 1 and len(saved) == 1
    assert again[0].args[0].shape == (4, 4, 8, 8) and saved[0].shape == (4, 4, 6, 6)
    monkeypatch.undo()
    again, saved = calls_and_saved(trained_alike(normalized_model(name)), name)
    assert not again and len(saved) == 2


def test_recomputed_pool_indices_are_made_next_to_their_scatter(recompute_any_size):
    """Note [Inter-op parallelism]: calls whose results the graph does not return run
    at the latest level their readers allow, so even with Inception's branches run
    at once, the backward's recomputed pool indices are alive one at a time, not all
    from its start."""
    lm.random.seed(0)
    model = convnet.build(convnet.ARCHITECTURES["inception"], convnet._lamina())
    compiled = jit.compile(model, layout=None)
    lm.sum(compiled(rand(2, 3, 64, 64))).backward()
    (step,) = compiled._compiled.variants.values()
    nodes, groups = executor._schedule(step.plan.backward.graph)
    assert any(len(group) > 1 for group in groups)
    position = {nodes[i]: k for k, group in enumerate(groups) for i in group}
    alive = []  # (made, last read) of each recomputed indices
    for node in nodes:
        if node.name == "max_pool2d_with_indices":
            indices = node.results[1]
            readers = [n for n in nodes if indices in list(n.inputs())]
            alive.append((position[node], max(position[n] for n in readers)))
    assert len(alive) >= 3
    alive.sort()
    assert all(end < start for (_, end), (start, _) in itertools.pairwise(alive))


def test_pool_indices_are_recomputed_where_the_backward_reads_the_pooled_input(
    recompute_any_size,
):
    """Note [Recomputed pool indices]: relu's backward reads its result, the pooling's
    input, so the forward pools values only and saves no int64 indices; the gradients
    are eager's bit for bit."""
    lm.random.seed(0)
    model = lm.nn.Sequential(
        lm.nn.Conv2d(2, 3, 3),
        lm.nn.ReLU(),
        lm.nn.MaxPool2d(2),
        lm.nn.Flatten(),
        lm.nn.Linear(12, 2),
    )
    eager = copy.deepcopy(model)
    x = rand(2, 2, 6, 6)
    compiled = jit.compile(model, layout=None)  # eager's order of sums
    for run in (eager, compiled):
        lm.sum(run(x)).backward()
    for a, b in zip(eager.parameters(), model.parameters()):
        np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())
    (step,) = compiled._compiled.variants.values()
    forward = [n.name for n in step.plan.forward.graph.nodes]
    assert "max_pool2d" in forward and "max_pool2d_with_indices" not in forward
    assert all(v.dtype.kind == "f" for v in step.plan.saved)
    backward = [n.name for n in step.plan.backward.graph.nodes]
    assert backward.index("max_pool2d_with_indices") < backward.index("pool2d_scatter")
    without = jit.compile(
        model, passes=[p for p in passes.DEFAULT if p != "recompute"], layout=None
    )
    lm.sum(without(x)).backward()
    (step,) = without._compiled.variants.values()
    assert any(v.dtype.kind == "i" for v in step.plan.saved)  # what the pass saves


def test_a_compiled_step_backpropagates_twice_only_when_retained():
    model = lm.nn.Sequential(lm.nn.Linear(3, 4), lm.nn.Tanh(), lm.nn.Linear(4, 1))
    compiled = jit.compile(model)
    x = rand(5, 3)
    loss = lm.sum(compiled(x))
    loss.backward(retain_graph=True)
    first = [p.grad.numpy().copy() for p in model.parameters()]
    loss.backward()
    for p, g in zip(model.parameters(), first):
        np.testing.assert_allclose(p.grad.numpy(), 2 * g, rtol=1e-6)
    with pytest.raises(RuntimeError, match="a second time"):
        loss.backward()


# ---------------------------------------------------------------- the convnets


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", list(convnet.ARCHITECTURES))
def test_the_benchmark_convnets_compiled_equal_eager(name, layout):
    """Inference within rounding (batch norm folds into the convolutions); training
    (forward, backward, batch-norm statistics) bit for bit, step after step."""
    compiled_equals_eager(name, layout)


@pytest.mark.core_independent  # Note [Core-independent tests]
def test_inceptions_branches_run_at_once_and_equal_eager():
    """Note [Inter-op parallelism]: on two threads, the branches of each Inception block
    (and their gradients) run at once, each call on one thread: within rounding of
    eager's, which splits a convolution's images over both (a weight gradient then
    adds two partial sums)."""
    threads = lm.get_num_threads()
    lm.set_num_threads(2)
    lm.set_num_interop_threads(2)
    try:
        compiled = compiled_equals_eager("inception", "NCHW", rtol=1e-6)
    finally:
        lm.set_num_interop_threads(1)
        lm.set_num_threads(threads)
    sources = []
    for variant in compiled._compiled.variants.values():  # training and inference
        plan = variant.plan
        parts = [plan.forward, plan.backward] if hasattr(plan, "backward") else [plan]
        sources += [part.source for part in parts]
    assert len(sources) == 3 and all("def t" in source for source in sources)


@pytest.mark.core_independent  # Note [Core-independent tests]
@pytest.mark.parametrize("name", ["resnet18_cifar", "mobilenet_v2"])
def test_residual_and_depthwise_models_compiled_channels_last_equal_eager(name):
    """Note [Compiled layout] through residual additions, depthwise convolutions, ReLU6
    and adaptive pooling: given NCHW images, the model compiled channels-last converts
    once, where they enter (global pooling leaves 1 x 1 images, in both layouts), and a
    training step equals eager's on channels-last images bit for bit, inference within
    rounding (batch norm folded)."""
    from lamina.tools.bench import models

    spec, lib = models.MODELS[name], convnet._lamina()
    lm.random.seed(0)
    eager = spec.make(lib, "NCHW")
    model = copy.deepcopy(eager)
    compiled = jit.compile(model, layout="NHWC")
    x, y = spec.inputs(np.random.default_rng(0), 2)
    x, y = spec.tensor(lib, x, "NCHW"), lm.asarray(y)
    losses = [F.cross_entropy(eager(F.to_layout(x, "NHWC")), y), F.cross_entropy(compiled(x), y)]
    for loss in losses:
        loss.backward()
    assert float(losses[1]) == float(losses[0])
    for a, b in zip(eager.parameters(), model.parameters()):
        np.testing.assert_array_equal(b.grad.numpy(), a.grad.numpy())
    (step,) = compiled._compiled.variants.values()
    assert len(layout.conversions(step.plan.forward.graph)) == 1
    eager.eval(), model.eval()
    with lm.no_grad():
        close(compiled(x), eager(F.to_layout(x, "NHWC")), rtol=2e-5)


def compiled_equals_eager(name, layout, rtol=0.0):
    """Two training steps bit for bit (within ``rtol``), then inference within
    rounding; the compiled model, its images in the layout given (a layout the trials
    chose would sum in another order: Note [Compiled layout])."""
    lm.random.seed(0)
    eager = convnet.build(convnet.ARCHITECTURES[name], convnet._lamina())
    model = copy.deepcopy(eager)
    compiled = jit.compile(model, layout=None)
    x = F.to_layout(rand(2, 3, 64, 64), layout)
    y = lm.asarray(np.array([3, 7]))
    optimizers = [lm.optim.SGD(m.parameters(), lr=0.01) for m in (eager, model)]
    for _ in range(2):
        losses = []
        for run, optimizer in zip((eager, compiled), optimizers):
            optimizer.zero_grad()
            loss = F.cross_entropy(run(x), y)
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
        np.testing.assert_allclose(losses[0], losses[1], rtol=rtol, atol=rtol * 1e-3)
    for a, b in zip(eager.state_dict().values(), model.state_dict().values()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=rtol, atol=rtol * 1e-3)
    eager.eval(), model.eval()
    with lm.no_grad():
        close(compiled(x), eager(x), rtol=2e-5)
    return compiled
