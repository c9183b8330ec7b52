"""The per-call core: the C extension (``_core``) or its pure-Python reference.

Note [Two cores] (reference.py): both implement the same algorithm with the same names.
The C core is used when it was built and ``LAMINA_PURE_PYTHON`` is not ``1``; an install
where it could not be built falls back to the reference, with one warning. Each C
object keeps its reference twin and hands it every call it does not handle itself.
"""

import os
import warnings

from . import reference

PURE_PYTHON = os.environ.get("LAMINA_PURE_PYTHON") == "1"
_core = None
if not PURE_PYTHON:
    try:
        from . import _core
    except ImportError as exc:  # no compiler at install time, or a broken build
        warnings.warn(
            f"lamina: the C core could not be loaded ({exc}); using the pure-Python "
            "core (slower per call, same results; LAMINA_PURE_PYTHON=1 silences "
            "this)",
            RuntimeWarning,
            stacklevel=2,
        )

TENSOR, SCALAR, UNCHECKED = reference.TENSOR, reference.SCALAR, reference.UNCHECKED
LOOP_FLAT, LOOP_SCALAR, LOOP_STRIDED = (
    reference.LOOP_FLAT,
    reference.LOOP_SCALAR,
    reference.LOOP_STRIDED,
)
LOOP_ROWS, LOOP_COLUMNS = reference.LOOP_ROWS, reference.LOOP_COLUMNS
LOOP_DEVIATION_ROWS = reference.LOOP_DEVIATION_ROWS
LOOP_DEVIATION_COLUMNS = reference.LOOP_DEVIATION_COLUMNS
PY_SCALARS = reference.PY_SCALARS
with_modes = reference.with_modes  # Note [Modes] (modes.py)
guard_key = reference.guard_key if _core is None else _core.guard_key
guard_token = reference.guard_token if _core is None else _core.guard_token
# Note [NumPy loops on threads] (csrc/fastpath.c): the C core's, or None
numpy_loop = None if _core is None else _core.numpy_loop
numpy_part_address = None if _core is None else _core.numpy_part_address

if _core is None:
    IMPLEMENTATION = "python"
    TensorBase = reference.TensorBase
    NodeBase = reference.NodeBase
    RecordingKernel = reference.RecordingKernel
    OperatorTable = reference.OperatorTable
    ElementwiseKernel = reference.ElementwiseKernel
    FusedLoop = reference.FusedLoop
    unary_binding = reference.unary_binding
    binary_binding = reference.binary_binding
    set_slot = reference.set_slot

    def direct_binding(name, d, arity, kernel, fallback):
        """(The reference's direct binding is ``fallback`` itself.)"""
        return fallback

    def ReductionKernel(kernel, spec):
        """(The reference's reduction kernel is the backend's Python kernel itself.)"""
        return kernel

    def CompiledCall(general, runs, generation, grad):
        """(The reference's hot path of a compiled function is the function's own
        ``__call__``: Note [Guard tokens] in lamina.jit's compiler.)"""
        return general

    def RowsKernel(kernel, spec):
        """(The reference's kernel along the last axis is the Python kernel itself.)"""
        return kernel

    def set_tensor_type(tensor_type):
        reference.set_tensor_type(tensor_type)

    def set_dtypes(dtypes):
        """(The reference reads dtypes' fields directly.)"""

    set_modes_active = reference.set_modes_active

else:
    IMPLEMENTATION = "c"
    TensorBase = _core.TensorBase
    NodeBase = _core.NodeBase
    RecordingKernel = _core.RecordingKernel
    OperatorTable = _core.OperatorTable
    set_slot = _core.set_slot
    set_dtypes = _core.set_dtypes

    def set_tensor_type(tensor_type):
        reference.set_tensor_type(tensor_type)
        _core.set_tensor_type(tensor_type)

    def ElementwiseKernel(*args, **kwargs):
        return _core.ElementwiseKernel(reference.ElementwiseKernel(*args, **kwargs))

    def FusedLoop(*args):
        return _core.FusedLoop(reference.FusedLoop(*args))

    def unary_binding(name, d):
        return _core.Binding(name, d, 1, reference.unary_binding(name, d))

    def binary_binding(name, d):
        return _core.Binding(name, d, 2, reference.binary_binding(name, d))

    def direct_binding(name, d, arity, kernel, fallback):
        """A binding straight to ``kernel`` for dense CPU tensors (the dispatcher layer
        off); ``fallback``, the Python version, serves and refuses everything else."""
        return _core.Binding(name, d, arity, fallback, kernel)

    ReductionKernel = _core.ReductionKernel
    CompiledCall = _core.CompiledCall
    RowsKernel = _core.RowsKernel  # Note [C rows] (csrc/fastpath.c)

    def set_modes_active(on):
        """Both cores' flag: the C bindings hand calls to their Python twins while on."""
        reference.set_modes_active(on)
        _core.set_modes_active(on)
