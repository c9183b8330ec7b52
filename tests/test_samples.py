"""Tests on the sample table of every operator (``samples.py``): the table covers the
schema; numba_cpu agrees with the numpy_ref oracle on every sample (dtype, shape,
values, and what the operator wrote into its arguments); every differentiable
operator's float64 samples pass gradcheck; every result has the dtype and shape the
operator's rules give (Note [Result rules], checked by ``check_kernels``)."""

import os
import sys

import numpy as np
import pytest

import lamina as lm
from lamina.dispatch import keys
from lamina.dispatch.schema import OPERATORS

sys.path.insert(0, os.path.dirname(__file__))
import samples as S

pytestmark = pytest.mark.core_independent  # Note [Core-independent tests]

# Bugs the table found that are not fixed yet, by test: those tests must fail (strict
# xfail), so that fixing the bug shows up as an unexpected pass.
KNOWN_BUGS: dict[str, dict[str, str]] = {}


def names(test):
    return [
        pytest.param(name, marks=pytest.mark.xfail(reason=KNOWN_BUGS[test][name], strict=True))
        if name in KNOWN_BUGS.get(test, {})
        else name
        for name in OPERATORS
    ]


DIFFERENTIABLE = [name for name, op in OPERATORS.items() if op.differentiable]
# float32 and complex64 results of two correct kernels differ by their summation order
RTOL = {"float32": 2e-5, "complex64": 2e-5, "float64": 1e-11, "complex128": 1e-11}


def test_every_operator_has_samples_covering_the_layouts_and_dtypes():
    """Every operator has samples in each of its dtypes; across the table, 0-d, empty
    and non-contiguous (incl. negative-stride) inputs, and every dtype lamina has."""
    missing = [name for name in OPERATORS if name not in S.TABLE]
    assert not missing, f"operators without samples (add them to tests/samples.py): {missing}"
    assert set(S.TABLE) == set(OPERATORS), f"not operators: {set(S.TABLE) - set(OPERATORS)}"
    seen = {"0d": 0, "empty": 0, "noncontiguous": 0, "negative": 0}
    for name in OPERATORS:
        for d in S.dtypes(name):
            made = S.samples(name, d)
            assert made, f"{name} has no {d} samples"
            for a in (a for s in made for a in _tensors(s.args)):
                seen["0d"] += a.ndim == 0
                seen["empty"] += a.size == 0
                seen["noncontiguous"] += not a.is_contiguous()
                seen["negative"] += any(st < 0 for st in a._data.strides)
    assert all(seen.values()), seen
    assert {d for name in OPERATORS for d in S.dtypes(name)} == set(S.I.ALL_DTYPES)


def _tensors(args):
    for a in args:
        if isinstance(a, lm.Tensor) and not a._ks & keys.SPARSE:
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors(a)


def _host(out):
    """A result as NumPy: tensors (sparse ones densified) and tuples of them."""
    if isinstance(out, lm.Tensor):
        return out.to_dense().numpy() if out._ks & keys.SPARSE else out.numpy()
    if isinstance(out, (tuple, list)):
        return [_host(o) for o in out]
    return out


def _assert_close(got, want, where):
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got} != {want}"
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_close(g, w, f"{where}[{i}]")
        return
    if not isinstance(want, np.ndarray):
        assert got == want, where
        return
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
    if want.dtype.kind in "fc":
        scale = np.max(np.abs(want[np.isfinite(want)]), initial=1.0)
        rtol = RTOL[want.dtype.name]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=where)
    else:
        np.testing.assert_array_equal(got, want, err_msg=where)


def _run(sample):
    """(result, arguments after the call) as NumPy."""
    out = sample.call()
    if not sample.values:
        return [(o.dtype, o.shape) for o in (out if isinstance(out, tuple) else (out,))], None
    return _host(out), [a.numpy() for a in _tensors(sample.args)]


@pytest.mark.parametrize("name", names("parity"))
def test_numba_cpu_agrees_with_the_oracle(name):
    ours, oracle = S.samples(name), S.samples(name)  # made outside the oracle's block
    got = [_run(s) for s in ours]
    with lm.backends.use("numpy_ref"):
        want = [_run(s) for s in oracle]
    for s, (g_out, g_args), (w_out, w_args) in zip(ours, got, want):
        _assert_close(g_out, w_out, s.label)
        if w_args is not None:
            _assert_close(g_args, w_args, f"{s.label} (arguments after the call)")


@pytest.mark.parametrize("name", names("rules"))
def test_results_follow_the_operator_rules(name):
    """Every sample through check_kernels: each kernel's result is a tensor of the
    device, dtype and shape the operator's rules give (dispatch/results.py, meta.py)."""
    with lm.backends.check_kernels():
        for s in S.samples(name):
            s.call()


# their input must stay symmetric under gradcheck's one-element steps
SYMMETRIC_INPUT = {"cholesky", "eigh", "eigvalsh"}


def _grad_call(name, sample):
    """(fn, inputs) for gradcheck: the sample's tensors to differentiate become fn's
    arguments; an in-place operator writes into a copy of its first argument."""
    args = list(sample.args)
    listed = isinstance(args[0], list)  # concat, stack
    flat = list(args[0]) + args[1:] if listed else args
    chosen = sample.grad_args
    if chosen is None:
        chosen = [
            i
            for i, a in enumerate(flat)
            if isinstance(a, lm.Tensor) and a.dtype in (lm.float64, lm.complex128)
        ]

    def fn(*tensors):
        full = list(flat)
        for i, t in zip(chosen, tensors):
            full[i] = t
        if "inplace" in OPERATORS[name].tags:
            full[0] = OPERATORS["copy"](full[0])
        if name in SYMMETRIC_INPUT:
            full[0] = (full[0] + lm.conj(lm.matrix_transpose(full[0]))) / 2
        if listed:
            full = [full[: len(args[0])], *full[len(args[0]) :]]
        return sample.fn(*full, **sample.kwargs)

    chosen = [i for i in chosen if isinstance(flat[i], lm.Tensor)]  # not an absent weight
    inputs = [flat[i].detach().requires_grad_() for i in chosen]
    return fn, inputs


def _differentiable_result(fn, inputs):
    out = fn(*inputs)
    return any(o.requires_grad for o in (out if isinstance(out, (tuple, list)) else (out,)))


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradients_match_finite_differences(name):
    """gradcheck on the smooth float64 samples (complex128 for imag); samples whose
    result is not differentiable (astype to an integer) or empty are passed over."""
    dtype = "complex128" if OPERATORS[name].dtypes == "complex" else "float64"
    checked = 0
    for s in S.samples(name, dtype, smooth=True):
        fn, inputs = _grad_call(name, s)
        if not any(x.size for x in inputs) or not _differentiable_result(fn, inputs):
            continue
        lm.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)
        checked += 1
    assert checked, f"{name}: no sample to gradcheck"
