"""Dispatch-table rebuild time: what registering a plugin or switching a backend costs.

Tables are rebuilt at registration time, never per call (Note [Dispatch table]); these
benchmarks keep that one-off cost in view as operators and keys are added.
"""

import lamina as lm

from .common import Benchmark

PLUGIN = "asv_bench_plugin"


def _never_called(ks, *args):
    raise AssertionError("the benchmark plugin's kernels never win dispatch")


def _plugin(op_names):
    """A small runtime plugin registering a kernel for each operator, at a priority so
    low that it never takes over (a run that leaves it registered changes nothing)."""

    class Plugin:
        @lm.backends.hookimpl
        def lamina_register_kernels(self, registry):
            for name in op_names:
                registry.register(name, "cpu", _never_called, priority=-1000)

    return Plugin()


class PluginRegistration(Benchmark):
    """``lm.backends.register`` then ``unregister`` of a plugin: two table rebuilds."""

    params = [["one", "all elementwise"]]
    param_names = ["kernels"]

    def setup(self, kernels):
        names = (
            ["add"]
            if kernels == "one"
            else [
                op.name for op in lm.dispatch.OPERATORS.values() if op.kind in ("unary", "binary")
            ]
        )
        self.plugin = _plugin(names)

    def teardown(self, kernels):
        if lm.backends.plugin_manager.has_plugin(PLUGIN):
            lm.backends.unregister(PLUGIN)

    def time_register_unregister(self, kernels):
        lm.backends.register(self.plugin, PLUGIN)
        lm.backends.unregister(PLUGIN)


class TableRebuild(Benchmark):
    def time_rebuild(self):
        """Recompute every operator's table and mask once."""
        lm.dispatch.rebuild()

    def time_use_backend(self):
        """``with lm.backends.use("numpy_ref"): pass`` (a rebuild on entry and on exit)."""
        with lm.backends.use("numpy_ref"):
            pass
