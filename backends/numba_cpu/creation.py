"""Creation kernels of the CPU backend (NumPy allocates and fills)."""

import numpy as np

from lamina.dispatch.tensor import from_array


def full(ks, shape, fill_value, dtype):
    return from_array(np.full(shape, fill_value, dtype.np))  # NaN into an int raises


def empty(ks, shape, dtype):
    return from_array(np.empty(shape, dtype.np))


def arange(ks, start, stop, step, dtype):
    return from_array(np.arange(start, stop, step, dtype=dtype.np))


def linspace(ks, start, stop, num, dtype, endpoint):
    return from_array(np.linspace(start, stop, num, endpoint=endpoint, dtype=dtype.np))


def eye(ks, n_rows, n_cols, k, dtype):
    return from_array(np.eye(n_rows, n_cols, k, dtype=dtype.np))


def from_host(ks, data, dtype):
    return from_array(data)


def rand(ks, shape, dtype, generator):
    return from_array(generator.random(shape, dtype=dtype.np))


def randn(ks, shape, dtype, generator):
    return from_array(generator.standard_normal(shape, dtype=dtype.np))


def register(registry):
    for fn in (full, empty, arange, linspace, eye, from_host, rand, randn):
        registry.register(fn.__name__, "cpu", fn)
