"""Embedding lookup and its dense gradient.

The lookup is NumPy's ``take`` of whole rows (a copy per index at memory speed); the
gradient sums rows of grad into a zero table at their indices, one Numba loop in index
order, so repeated indices accumulate (a scatter-add, which ``take``'s adjoint is) and
the padding row is passed over. Indices are checked against the table before either
runs: the loops do not bounds-check.
"""

import numpy as np

from lamina.backends import jit
from lamina.dispatch.tensor import from_array


def checked_indices(indices, rows):
    """The indices as a flat int64 array; an IndexError naming the first index outside
    [0, rows)."""
    flat = np.ascontiguousarray(indices._data, dtype=np.int64).reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= rows):
        bad = flat[(flat < 0) | (flat >= rows)][0]
        raise IndexError(f"embedding: index {bad} is out of range for {rows} embeddings")
    return flat


def embedding(ks, weight, indices, padding_idx):
    w = weight._data
    flat = checked_indices(indices, w.shape[0])
    out = np.take(w, flat, axis=0)
    return from_array(out.reshape(*indices._shape, w.shape[1]))


def scatter_rows(g, indices, padding, out):
    """out[indices[i]] += g[i] for every i whose index is not ``padding``."""
    for i in range(indices.shape[0]):
        k = indices[i]
        if k != padding:
            row, src = out[k], g[i]
            for j in range(g.shape[1]):
                row[j] += src[j]


def embedding_dense_backward(ks, grad, indices, num_weights, padding_idx):
    flat = checked_indices(indices, num_weights)
    dim = grad._shape[-1]
    g = np.ascontiguousarray(grad._data).reshape(flat.size, dim)
    out = np.zeros((num_weights, dim), g.dtype)
    padding = -1 if padding_idx is None else padding_idx
    _scatter(g.dtype)(g, flat, padding, out)
    return from_array(out)


def _scatter(dtype):
    def build():
        rows = jit.array(dtype, 2)
        signature = jit.types.void(rows, jit.array(np.int64), jit.types.int64, rows)
        return jit.compile_kernel(scatter_rows, signature)

    return jit.cached((scatter_rows, dtype), build)


KERNELS = {"embedding": embedding, "embedding_dense_backward": embedding_dense_backward}


def register(registry):
    for name, fn in KERNELS.items():
        registry.register(name, "cpu", fn)
