"""lamina.dispatch -- the core: keys, dtypes, the Tensor, the operator schema, the
bindings derived from it, and the dispatch tables plugins fill.

See Note [Operator schema] (``schema.py``), Note [Dispatch table] and Note [Table entry
precedence] (``entries.py``). ``dump_table(name)`` shows which kernel, from which
plugin, serves each key of an operator, and why.
"""

from . import (
    keys,
    ops,  # the public functions (defines every operator)
)
from .dump import dump_table, operators
from .entries import rebuild
from .keys import AUTOGRAD, CPU, SPARSE
from .schema import OPERATORS, Operator, get, keyset

__all__ = [
    "AUTOGRAD",
    "CPU",
    "OPERATORS",
    "SPARSE",
    "Operator",
    "dump_table",
    "get",
    "keys",
    "keyset",
    "operators",
    "ops",
    "rebuild",
]
