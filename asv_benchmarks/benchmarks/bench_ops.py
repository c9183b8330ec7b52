"""Every operator of ``python -m lamina.bench ops`` -- elementwise, reductions (over all
elements and along the last axis), scans, sorting and nn functions -- on float32 inputs
of 10^2, 10^4 and 10^6 elements, lamina alone (the sweep puts PyTorch and NumPy beside
it). The operators, their inputs and arguments come from lamina.tools.bench.ops, so the
two measure the same calls. See Note [Setup runs between timed calls].
"""

from lamina.tools.bench import ops as sweep

from .common import Benchmark, memo, number_for, warm

OPERATORS = {op.name: op for op in sweep.select("")}


class Operator(Benchmark):
    params = [list(sweep.SIZES), list(OPERATORS)]
    param_names = ["n", "op"]

    def setup(self, n, op):
        self.call = memo(("ops", n, op), lambda: sweep.make_case("lamina", OPERATORS[op], n))
        self.number = number_for(n)
        warm(("ops", n, op), self.call)

    def time_op(self, n, op):
        self.call()
