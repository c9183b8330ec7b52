"""lamina — a tensor library whose every layer can be switched off and measured.

``import lamina as lm`` gives the Python Array API (2023.12): tensors, dtypes,
creation, elementwise, statistical, manipulation and linear-algebra functions.
"""
from ._dtypes import (bool_ as bool, can_cast, finfo, float32, float64, iinfo,  # noqa: A004
                      int8, int16, int32, int64, isdtype, result_type, uint8, uint16,
                      uint32, uint64)
from ._dtypes import DType
from ._tensor import Device, Tensor, install_bindings
from ._functions import (AxisError, all, any, arange, argmax, argmin, asarray,  # noqa: A004
                         astype, broadcast_arrays, broadcast_to, clip, concat, empty,
                         empty_like, expand_dims, eye, flip, from_dlpack, full, full_like,
                         linspace, matmul, matrix_transpose, max, mean, min, ones,
                         ones_like, permute_dims, prod, rand, randn, reshape, split,
                         squeeze, stack, std, sum, tensordot, unstack, var, vecdot, where,
                         zeros, zeros_like)
from . import layers, optim, random
from lamina import autograd, backends, dispatch
from lamina.autograd import enable_grad, no_grad, set_grad_enabled
from lamina.backends.numba_cpu import get_num_threads, set_num_threads
from lamina.backends.sparse import sparse_coo_tensor

__version__ = "0.1.0"
__array_api_version__ = "2023.12"

install_bindings(globals())  # the elementwise functions, from dispatch/operators.py

e = 2.718281828459045
pi = 3.141592653589793
inf = float("inf")
nan = float("nan")
newaxis = None
Array = Tensor

# last, so that third-party plugins (entry points) imported now see a complete lamina
backends.load_builtin_and_installed()
