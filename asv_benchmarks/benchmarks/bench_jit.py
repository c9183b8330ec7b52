"""Compiled functions (lamina.jit) against eager calls: ``python -m lamina.bench jit``'s
chain of ten elementwise operations, which compiles to one fused loop, at 1e2 and 1e6
elements; and the cost of a compiled call itself (its guards and plan) on an add of 8
one-element inputs. float32, one thread. Skipped on commits without lamina.jit.
"""

import lamina as lm

from .common import Benchmark, memo, number_for, operand, warm

MODES = ["eager", "compiled"]


def _bench():
    """lamina.tools.bench.jit, where this commit has lamina.jit."""
    try:
        from lamina.tools.bench import jit
    except ImportError:
        raise NotImplementedError("this commit has no lamina.jit") from None
    return jit


def _function(name, fn, mode):
    """``fn`` itself, or compiled once per process."""
    if mode == "eager":
        return fn
    return memo(("jit compiled", name), lambda: lm.jit.compile(fn))


class Chain(Benchmark):
    params = [[10**2, 10**6], MODES]
    param_names = ["n", "mode"]

    def setup(self, n, mode):
        self.fn = _function("chain", _bench().chain_in(lm), mode)
        self.inputs = [operand(n, "contiguous", seed) for seed in range(3)]
        self.number = number_for(n)
        warm(("jit chain", n, mode), lambda: self.fn(*self.inputs))

    def time_chain(self, n, mode):
        self.fn(*self.inputs)


class CompiledCall(Benchmark):
    """Eight one-element inputs added: eager, seven operator calls; compiled, the
    guards, the plan and one fused loop."""

    params = [MODES]
    param_names = ["mode"]

    def setup(self, mode):
        self.fn = _function("add_eight", _bench().add_eight, mode)
        self.inputs = [operand(1, "contiguous", seed) for seed in range(8)]
        self.number = number_for(1)
        warm(("jit add_eight", mode), lambda: self.fn(*self.inputs))

    def time_add_eight(self, mode):
        self.fn(*self.inputs)
