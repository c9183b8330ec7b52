"""Hooks on a leaf's accumulated gradient and callbacks at the end of backward: what
data-parallel training (lamina.distributed) stands on."""

import numpy as np
import pytest

import lamina as lm
from lamina.autograd import engine


def test_post_accumulate_grad_hook_sees_the_accumulated_gradient():
    w = lm.asarray([1.0, 2.0, 3.0], dtype=lm.float64).requires_grad_()
    seen = []
    w.register_post_accumulate_grad_hook(lambda t: seen.append(np.array(t.grad.numpy())))
    (w * w).sum().backward()
    (w * 3.0).sum().backward()  # the second gradient is added before the hook runs
    np.testing.assert_array_equal(seen[0], [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(seen[1], [5.0, 7.0, 9.0])


def test_post_accumulate_grad_hook_runs_once_per_backward_and_can_be_removed():
    w = lm.asarray([1.0, 2.0]).requires_grad_()
    calls = []
    handle = w.register_post_accumulate_grad_hook(calls.append)
    (w * w + w).sum().backward()  # two paths into w: one accumulation, one call
    assert calls == [w]
    handle.remove()
    (w * w).sum().backward()
    assert calls == [w]


def test_post_accumulate_grad_hook_not_run_by_grad():
    w = lm.asarray([1.0, 2.0]).requires_grad_()
    calls = []
    w.register_post_accumulate_grad_hook(calls.append)
    lm.autograd.grad((w * w).sum(), w)  # grad() leaves .grad alone
    assert calls == [] and w.grad is None


def test_post_accumulate_grad_hook_needs_a_leaf_requiring_grad():
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        lm.asarray([1.0]).register_post_accumulate_grad_hook(print)
    w = lm.asarray([1.0]).requires_grad_()
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        (w * 2.0).register_post_accumulate_grad_hook(print)


def test_queued_callback_runs_after_every_gradient_is_in_place():
    a = lm.asarray([1.0, 2.0]).requires_grad_()
    b = lm.asarray([3.0, 4.0]).requires_grad_()
    order = []

    def queue(t):
        order.append("hook")
        engine.queue_callback(lambda: order.append((a.grad is not None, b.grad is not None)))

    a.register_post_accumulate_grad_hook(queue)
    b.register_post_accumulate_grad_hook(lambda t: order.append("hook"))
    (a * b).sum().backward()
    assert order == ["hook", "hook", (True, True)]
    (a * b).sum().backward()  # callbacks are per pass: queued again, run again
    assert order[3:] == ["hook", "hook", (True, True)]


def test_queue_callback_outside_backward_is_refused():
    with pytest.raises(RuntimeError, match="no backward pass is running"):
        engine.queue_callback(lambda: None)


def test_call_between_nodes_runs_for_the_rest_of_one_pass_and_leaves_gradients_alone():
    values = np.array([0.5, -1.0, 2.0])
    x = lm.asarray(values).requires_grad_()
    seen = []  # x's gradient at each call: backward has not reached it yet
    v = (x * 2.0).exp() * 3.0

    def register(grad):
        engine.call_between_nodes(lambda: seen.append(x.grad))

    v.register_hook(register)  # called at v's node; exp, x * 2 and x's come after
    v.sum().backward()
    assert len(seen) >= 2 and all(g is None for g in seen), seen
    np.testing.assert_allclose(x.grad.numpy(), 6.0 * np.exp(2.0 * values))
    calls = len(seen)
    x.grad = None
    ((x * 2.0).exp() * 3.0).sum().backward()  # a new pass: the callback is gone
    assert len(seen) == calls
    np.testing.assert_allclose(x.grad.numpy(), 6.0 * np.exp(2.0 * values))
    with pytest.raises(RuntimeError, match="no backward pass is running"):
        engine.call_between_nodes(lambda: None)
