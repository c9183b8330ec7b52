"""Every public function of lamina, in one namespace: the bindings generated from the
schema (``bindings.py``) and the composite functions (``composites.py``).

``import lamina`` re-exports them; the autograd layer's formulas call them, so they
run on every device. Switching the dispatcher layer rebinds them here too.
"""

from . import bindings
from . import operators as _operators  # noqa: F401  (defines every operator)
from .arguments import AxisError  # noqa: F401  (re-exported)
from .composites import *  # noqa: F403
from .composites import __all__ as _composites

bindings.install(globals())

__all__ = sorted(
    [op.name for op in bindings.public_operators()] + list(_composites) + ["AxisError"]
)
