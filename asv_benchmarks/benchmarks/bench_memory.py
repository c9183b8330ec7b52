"""Memory of big elementwise operations (1e7 float32 elements, 40 MB per operand).

``peakmem_`` is the process's peak resident memory (asv's measure: it includes the
interpreter, lamina and the inputs made in ``setup``, so read it as a trend).
``track_alloc_bytes`` is exact: the peak of the bytes NumPy allocated during the
call (tracemalloc), i.e. the result plus any temporaries operator setup made. For
``add`` it should stay at one output (4e7 bytes); an in-place ``iadd`` should stay near 0.
"""

import lamina as lm

from .common import Benchmark, binary_operands, memo, operand, peak_alloc_bytes, warm

N = 10**7


class BigElementwise(Benchmark):
    params = [["add", "exp", "iadd"], ["contiguous", "strided", "broadcast"]]
    param_names = ["op", "layout"]
    timeout = 300

    def setup(self, op, layout):
        if op == "exp":
            x = operand(N, layout)
            self.call = lambda: lm.exp(x)
        else:
            a, b = binary_operands(N, layout)
            if op == "iadd":
                a = memo(("iadd target", layout), lambda: lm.asarray(a, copy=True))

                def call():
                    t = a
                    t += b

                self.call = call
            else:
                self.call = lambda: a + b
        warm((op, layout), self.call)

    def peakmem_op(self, op, layout):
        self.call()

    def track_alloc_bytes(self, op, layout):
        return peak_alloc_bytes(self.call)

    track_alloc_bytes.unit = "bytes"
