"""The meta device (backends/meta): every sample of every operator, run on meta
tensors, gives results of the CPU results' dtypes, shapes and strides (Note [Result
rules], Note [Result layouts]); what needs values refuses clearly."""

import numpy as np
import pytest
import samples as S

import lamina as lm
from lamina.dispatch import layouts
from lamina.dispatch.schema import OPERATORS

# results whose shape depends on the values: the meta device refuses them
VALUE_DEPENDENT = {"nonzero", "unique_all", "unique_counts", "unique_inverse", "unique_values"}
# not computations on tensors: moves between devices and sparse conversions
NOT_ON_META = {"to_device", "to_sparse", "to_dense", "coalesce", "sparse_mask"}


def to_meta(a):
    if isinstance(a, lm.Tensor):
        return a.to_device("meta") if a.device == "cpu" and not a.is_sparse else a
    if type(a) in (list, tuple):
        return type(a)(to_meta(b) for b in a)
    if type(a) is dict:
        return {k: to_meta(v) for k, v in a.items()}
    return a


def _boolean_mask(sample):
    """Whether a sample indexes with a boolean tensor (a result shape of its values)."""
    keys = [a for a in sample.args[1:2] for a in (a if isinstance(a, tuple) else (a,))]
    return any(isinstance(k, lm.Tensor) and k.dtype == lm.bool for k in keys)


def results(out):
    return list(out) if isinstance(out, tuple) else [out]


def layout(t):
    """(shape, strides) with the strides of size-1 axes left out (they never matter);
    an empty tensor has no layout to compare."""
    strides = layouts.strides_of(t)
    if 0 in t.shape:
        return t.shape, None
    return t.shape, tuple(s for n, s in zip(t.shape, strides) if n != 1)


# The meta functions' rules against the CPU's results, operator by operator: the same
# code under either per-call core, which the other tests here run on meta tensors too
# (Note [Core-independent tests]; 155 s of the pure-Python core's run)
@pytest.mark.core_independent
@pytest.mark.parametrize("name", sorted(set(OPERATORS) - NOT_ON_META))
def test_every_sample_on_meta_matches_the_cpu_result(name):
    for sample in S.samples(name):
        if name in VALUE_DEPENDENT or (name == "getitem" and _boolean_mask(sample)):
            with pytest.raises(NotImplementedError, match="depends on .*values"):
                sample.fn(*to_meta(sample.args), **to_meta(sample.kwargs))
            continue
        cpu = results(sample.call())
        kwargs = to_meta(sample.kwargs)
        if OPERATORS[name].category == "creation":
            kwargs["device"] = "meta"
        meta = results(sample.fn(*to_meta(sample.args), **kwargs))
        assert len(meta) == len(cpu), sample
        for m, c in zip(meta, cpu):
            assert m.device == "meta", sample
            assert (m.dtype, layout(m)) == (c.dtype, layout(c)), sample


def test_creation_random_and_moves_on_meta():
    gen = lm.Generator().manual_seed(0)
    x = lm.rand((2, 3), device="meta", generator=gen)
    assert (x.shape, x.dtype, str(x.device)) == ((2, 3), lm.get_default_dtype(), "meta")
    assert repr(x) == "tensor(..., device='meta', size=(2, 3))"
    nhwc = lm.nn.functional.to_layout(lm.zeros((2, 3, 4, 5)), "NHWC").to_device("meta")
    assert lm.nn.functional.conv2d(nhwc, lm.empty((6, 3, 3, 3), device="meta")).shape == (
        2,
        6,
        2,
        3,
    )
    one = lm.empty((), device="meta")
    for read in (lambda: one.item(), lambda: x.numpy(), lambda: x.to_device("cpu")):
        with pytest.raises((RuntimeError, TypeError), match="meta"):
            read()
    with pytest.raises(NotImplementedError, match="getitem: the shape of its result depends"):
        x[lm.ones((2, 3), dtype=lm.bool, device="meta")]


def test_meta_runs_arguments_checks_and_huge_shapes_cost_nothing():
    big = lm.empty((10**6, 10**6), device="meta")  # 4 TB: never allocated
    assert lm.matmul(big, big.mT).shape == (10**6, 10**6)
    with pytest.raises(ValueError, match="matmul"):
        lm.matmul(big, lm.empty((3, 4), device="meta"))
    with pytest.raises(ValueError, match="meta"):
        lm.add(big, lm.zeros(1))  # a CPU tensor beside a meta one


def test_autograd_records_on_meta():
    w = lm.empty((4, 3), device="meta").requires_grad_()
    loss = lm.sum(lm.tanh(lm.matmul(lm.empty((5, 4), device="meta"), w)))
    loss.backward()
    assert w.grad.device == "meta" and w.grad.shape == (4, 3)
    assert np.dtype(w.grad.dtype.np) == np.float32


def _tensor_args(sample):
    """(position or keyword, tensor) of every tensor argument of a sample."""
    found = []
    for i, a in enumerate(sample.args):
        parts = a if type(a) in (list, tuple) else [a]
        found += [(i, t) for t in parts if isinstance(t, lm.Tensor) and not t.is_sparse]
    found += [(k, t) for k, t in sample.kwargs.items() if isinstance(t, lm.Tensor)]
    return found


@pytest.mark.parametrize("name", sorted(set(OPERATORS) - NOT_ON_META))
def test_an_operator_writes_only_the_arguments_its_schema_names(name):
    """Note [Mutation]: after every sample, each tensor argument the schema does not
    list in ``writes`` holds the values it had."""
    op = OPERATORS[name]
    written = {i for i, p in enumerate(op.params) if p.name in op.writes} | set(op.writes)
    for sample in S.samples(name):
        before = [(where, t, t.numpy().copy()) for where, t in _tensor_args(sample)]
        sample.call()
        for where, t, values in before:
            if where not in written:
                np.testing.assert_array_equal(t.numpy(), values, err_msg=f"{sample} {where}")
