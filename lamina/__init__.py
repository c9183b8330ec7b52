"""lamina -- a tensor library whose every layer can be switched off and measured.

``import lamina as lm`` gives the Python Array API (2024.12, its extensions included):
tensors, dtypes (complex64 and complex128 too), creation, elementwise, statistical,
manipulation, searching, sorting, set, linear-algebra (``lamina.linalg``) and Fourier
transform (``lamina.fft``) functions, with autograd and sparse COO tensors. The
functions are generated from the operator schema (``lamina.dispatch``); this module
only gathers the public face.
"""

import sys as _sys

from lamina import autograd, backends, dispatch
from lamina.autograd import enable_grad, no_grad, set_grad_enabled
from lamina.backends.precision import (
    get_float32_matmul_precision,
    set_float32_matmul_precision,
)
from lamina.backends.sparse import sparse_coo_tensor
from lamina.backends.threads import (
    get_num_interop_threads,
    get_num_threads,
    set_num_interop_threads,
    set_num_threads,
)
from lamina.dispatch import bindings as _bindings
from lamina.dispatch import pytorch as _pytorch
from lamina.dispatch import tensor as _tensor
from lamina.dispatch.devices import Device
from lamina.dispatch.dtypes import (
    DType,
    can_cast,
    complex64,
    complex128,
    finfo,
    float32,
    float64,
    iinfo,
    int8,
    int16,
    int32,
    int64,
    isdtype,
    result_type,
    uint8,
    uint16,
    uint32,
    uint64,
)
from lamina.dispatch.dtypes import bool_ as bool
from lamina.dispatch.ops import *  # noqa: F403  (every public function)
from lamina.dispatch.tensor import Tensor

from . import distributed, fft, jit, layers, linalg, memory, nn, optim, random, utils
from .serialization import load, save

__version__ = "0.1.0"
__array_api_version__ = "2024.12"  # README "Array API conformance"

e = 2.718281828459045
pi = 3.141592653589793
inf = float("inf")
nan = float("nan")
newaxis = None
Array = Tensor

_bindings.install(globals())  # switching the dispatcher layer rebinds them here too
_pytorch.install(globals())  # PyTorch's spelling beside the Array API's (float, long, ...)
_tensor.upper.namespace = _sys.modules[__name__]  # Tensor.__array_namespace__

# the built-in plugins, then the autograd and trace layers (registered like backends),
# then the installed third-party plugins last, so that they see a complete lamina
backends.load_builtin((autograd.plugin, "autograd"), (jit.tracer, "trace"))
backends.load_entry_points()
