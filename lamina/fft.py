"""``lamina.fft``: the Array API's Fourier transform extension (all 14 functions),
generated from the operator schema and its composites (``lamina.dispatch.fft``)."""

from lamina.dispatch.fft import *  # noqa: F403
from lamina.dispatch.fft import __all__  # noqa: F401
