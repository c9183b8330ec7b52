"""Start-up cost in a fresh process: ``import lamina`` and the first call of an operator.

``timeraw_`` benchmarks return code that asv times in a new Python process, once per
sample (only the statement is timed, not the setup code or interpreter start-up).
The caches are warmed in ``setup`` first, so the first call measures loading compiled
kernels, not compiling them: the C core's loops from the loop cache, without Numba
(Note [Loop cache]); anything else from Numba's cache, with Numba's import.
"""

import subprocess
import sys
import textwrap

from .common import Benchmark

# statement timed on the first call, after the (untimed) setup code
FIRST_CALLS = {
    "add": "x + x",
    "exp": "lm.exp(x)",
    "sum": "lm.sum(x)",
    "matmul": "m @ m",
    "strided add": "x[::2] + x[::2]",
    "relu": "lm.nn.functional.relu(x)",  # a Numba entry point: imports Numba
}
SETUP_CODE = textwrap.dedent("""
    import numpy as np
    import lamina as lm
    x = lm.asarray(np.ones(100, np.float32))
    m = lm.asarray(np.ones((64, 64), np.float32))
""")


def _run(code):
    subprocess.run([sys.executable, "-c", code], check=True, timeout=600)


class Startup(Benchmark):
    repeat = (3, 5, 10.0)  # every sample is a fresh process
    warmup_time = 0
    timeout = 300

    def timeraw_import_lamina(self):
        return "import lamina"

    def timeraw_import_numpy_pluggy(self):
        """What ``import lamina`` cannot be faster than: the dependencies it imports
        (Numba is imported on first compile: Note [Lazy Numba])."""
        return "import numpy, pluggy"


class FirstCall(Benchmark):
    """Latency of the first call of an operator in a fresh process, warm caches."""

    params = [list(FIRST_CALLS)]
    param_names = ["call"]
    repeat = (3, 5, 10.0)
    warmup_time = 0
    timeout = 300

    def setup(self, call):
        _run(SETUP_CODE + FIRST_CALLS[call])  # compile once: fills Numba's disk cache

    def timeraw_first_call(self, call):
        return FIRST_CALLS[call], SETUP_CODE
