"""lamina.dispatch — keys, key sets, the operator registry and precomputed tables.

See Note [Dispatch table] and Note [Key priority]. ``dump_table(name)`` shows which
kernel, from which plugin, serves each key of an operator.
"""
from . import keys
from .keys import AUTOGRAD, CPU, SPARSE
from .table import OPERATORS, Operator, dump_table, get, keyset, rebuild
from . import operators  # noqa: F401  (defines every operator)

__all__ = ["keys", "AUTOGRAD", "CPU", "SPARSE", "OPERATORS", "Operator", "dump_table",
           "get", "keyset", "rebuild"]
