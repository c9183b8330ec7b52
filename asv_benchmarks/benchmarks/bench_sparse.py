"""Sparse COO tensors: spmm against dense matmul of the same operands, and what the
sparse layer costs a dense-only call (nothing expected: dense calls never carry the
SPARSE key, so they index the same table slot with or without the layer).

The matrix is n x n float32 with 1% of its entries set, times an n x 64 float32 dense
matrix; the dense contender multiplies ``to_dense()`` of the same matrix (BLAS).
"""

import numpy as np

import lamina as lm

from .common import Benchmark, memo, warm

DENSITY = 0.01
COLS = 64


def _operands(n):
    def make():
        rng = np.random.default_rng(0)
        nnz = int(n * n * DENSITY)
        flat = rng.choice(n * n, nnz, replace=False)
        idx = np.stack(np.unravel_index(flat, (n, n)))
        vals = rng.standard_normal(nnz).astype(np.float32)
        raw = lm.sparse_coo_tensor(idx, vals, (n, n))  # entries in random order
        s = raw.coalesce()
        b = lm.asarray(rng.standard_normal((n, COLS)).astype(np.float32))
        bt = lm.asarray(np.ascontiguousarray(b.numpy().T))
        return raw, s, s.to_dense(), b, bt

    return memo(("sparse", n), make)


class SpMM(Benchmark):
    """1%-dense n x n float32 sparse matrix with an n x 64 dense one."""

    params = [[512, 4096]]
    param_names = ["n"]

    def setup(self, n):
        if not hasattr(lm, "sparse_coo_tensor"):  # a commit before sparse tensors
            raise NotImplementedError("this commit has no sparse tensors")
        self.raw, self.s, self.dense, self.b, self.bt = _operands(n)
        warm(
            ("sparse", n),
            lambda: (
                self.s @ self.b,
                self.raw @ self.b,
                self.bt @ self.s,
                self.dense @ self.b,
                self.raw.coalesce(),
                self.s.to_dense(),
            ),
        )

    def time_spmm(self, n):
        """sparse @ dense, coalesced: row by row."""
        self.s @ self.b

    def time_spmm_uncoalesced(self, n):
        """sparse @ dense, entries in random order: scattered."""
        self.raw @ self.b

    def time_dense_matmul(self, n):
        """The same product with the sparse operand densified (BLAS)."""
        self.dense @ self.b

    def time_dense_at_sparse(self, n):
        """(64 x n) dense @ sparse."""
        self.bt @ self.s

    def time_coalesce(self, n):
        self.raw.coalesce()

    def time_to_dense(self, n):
        self.s.to_dense()


class DenseCallLayerCost(Benchmark):
    """``out = out + x`` (100 float32, 1000 calls) with the sparse layer on, off, and
    its plugin unregistered: the three should time the same."""

    params = [["layer on", "layer off", "plugin unregistered"]]
    param_names = ["sparse"]

    def setup(self, sparse):
        if not lm.backends.plugin_manager.has_plugin("sparse"):  # before sparse tensors
            raise NotImplementedError("this commit has no sparse plugin")
        lm.set_num_threads(1)
        self.x = memo(("sparse-layer-x",), lambda: lm.asarray(np.ones(100, np.float32)))
        if sparse == "layer off":
            lm.layers.disable("sparse")
        elif sparse == "plugin unregistered":
            lm.backends.unregister("sparse")
        self.x + self.x

    def teardown(self, sparse):
        if not hasattr(self, "x"):  # setup skipped (asv calls teardown even then)
            return
        lm.layers.enable("sparse")
        if not lm.backends.plugin_manager.has_plugin("sparse"):
            from lamina.backends import sparse as plugin

            lm.backends.register(plugin, "sparse", "built-in")

    def time_add_loop_1000(self, sparse):
        out, x = self.x, self.x
        for _ in range(1000):
            out = out + x
