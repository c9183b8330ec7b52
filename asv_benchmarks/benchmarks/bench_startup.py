"""Start-up cost in a fresh process: ``import lamina`` and the first call of an operator.

``timeraw_`` benchmarks return code that asv times in a new Python process, once per
sample (only the statement is timed, not the setup code or interpreter start-up).
Numba's disk cache is warmed in ``setup`` first, so the first call measures loading
compiled kernels from the cache (plus Numba's own initialization), not compilation.
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

    def timeraw_import_numpy_numba_pluggy(self):
        """What ``import lamina`` cannot be faster than: its dependencies."""
        return "import numpy, numba, pluggy"


class FirstCall(Benchmark):
    """Latency of the first call of an operator in a fresh process, warm Numba cache."""

    params = [list(FIRST_CALLS)]
    param_names = ["call"]
    repeat = (3, 5, 10.0)
    warmup_time = 0
    timeout = 300

    def setup(self, call):
        _run(SETUP_CODE + FIRST_CALLS[call])  # compile once: fills Numba's disk cache

    def timeraw_first_call(self, call):
        return FIRST_CALLS[call], SETUP_CODE
