"""``lamina.linalg``: the Array API's linear algebra extension (all 23 functions),
generated from the operator schema and its composites (``lamina.dispatch.linalg``)."""

from lamina.dispatch.linalg import *  # noqa: F403
from lamina.dispatch.linalg import __all__  # noqa: F401
