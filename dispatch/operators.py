"""The one declarative list of lamina's operators (cf. PyTorch's native_functions.yaml).

Each line: name, signature, kind, the dtypes it accepts and the dtype of its result.
Bindings (``lm.add``, ``Tensor.__add__``), in-place variants (``add_`` for ``+=``),
dispatch tables, ``dump_table`` and the tests' operator list all derive from it.

dtypes (checked on the promoted computation dtype):
    any      every dtype                  numeric  not bool
    float    floats; ints and bool are promoted to the default float (as NumPy)
    int      integers                     intbool  integers and bool
result:
    same     the computation dtype        bool     bool
    sum      float as is, signed -> int64, unsigned -> uint64, bool -> int64
    index    int64
"""
from .table import define


def _unary(names, dtypes, result="same", differentiable=True):
    return [(n, "(x, /)", "unary", dtypes, result, differentiable, False)
            for n in names.split()]


def _binary(names, dtypes, result="same", differentiable=True, inplace=True):
    return [(n, "(x1, x2, /)", "binary", dtypes, result, differentiable, inplace)
            for n in names.split()]


ELEMENTWISE = [
    *_unary("abs negative positive square sign floor ceil round trunc", "numeric"),
    *_unary("exp expm1 log log1p log2 log10 sqrt sin cos tan asin acos atan sinh cosh tanh"
            " asinh acosh atanh", "float"),
    *_unary("bitwise_invert", "intbool", differentiable=False),
    *_unary("logical_not", "any", "bool", differentiable=False),
    *_unary("isfinite isinf isnan", "any", "bool", differentiable=False),
    *_unary("signbit", "float", "bool", differentiable=False),
    *_binary("add subtract multiply floor_divide remainder pow maximum minimum", "numeric"),
    *_binary("divide atan2 copysign hypot logaddexp", "float"),
    *_binary("bitwise_and bitwise_or bitwise_xor", "intbool", differentiable=False),
    *_binary("bitwise_left_shift bitwise_right_shift", "int", differentiable=False),
    *_binary("equal not_equal greater greater_equal less less_equal", "any", "bool",
             differentiable=False, inplace=False),
    *_binary("logical_and logical_or logical_xor", "any", "bool", differentiable=False,
             inplace=False),
]

OTHERS = [
    # name, signature, kind, dtypes, result, differentiable
    ("clip", "(x, /, min=None, max=None)", "ternary", "numeric", "same", True),
    ("where", "(condition, x1, x2, /)", "ternary", "any", "same", True),
    ("astype", "(x, dtype, /, *, copy=True)", "conversion", "any", "arg", True),
    ("sum", "(x, /, *, axis=None, dtype=None, keepdims=False)", "reduction", "any", "sum", True),
    ("prod", "(x, /, *, axis=None, dtype=None, keepdims=False)", "reduction", "any", "sum", True),
    ("mean", "(x, /, *, axis=None, keepdims=False)", "reduction", "float", "same", True),
    ("var", "(x, /, *, axis=None, correction=0.0, keepdims=False)", "reduction", "float", "same", True),
    ("std", "(x, /, *, axis=None, correction=0.0, keepdims=False)", "reduction", "float", "same", True),
    ("max", "(x, /, *, axis=None, keepdims=False)", "reduction", "any", "same", True),
    ("min", "(x, /, *, axis=None, keepdims=False)", "reduction", "any", "same", True),
    ("all", "(x, /, *, axis=None, keepdims=False)", "reduction", "any", "bool", False),
    ("any", "(x, /, *, axis=None, keepdims=False)", "reduction", "any", "bool", False),
    ("argmax", "(x, /, *, axis=None, keepdims=False)", "reduction", "any", "index", False),
    ("argmin", "(x, /, *, axis=None, keepdims=False)", "reduction", "any", "index", False),
    ("reshape", "(x, /, shape, *, copy=None)", "view", "any", "same", True),
    ("permute_dims", "(x, /, axes)", "view", "any", "same", True),
    ("matrix_transpose", "(x, /)", "view", "any", "same", True),
    ("expand_dims", "(x, /, *, axis=0)", "view", "any", "same", True),
    ("squeeze", "(x, /, axis)", "view", "any", "same", True),
    ("flip", "(x, /, *, axis=None)", "view", "any", "same", True),
    ("broadcast_to", "(x, /, shape)", "view", "any", "same", True),
    ("getitem", "(x, key, /)", "view", "any", "same", True),
    ("setitem", "(x, key, value, /)", "inplace", "any", "same", True),
    ("split", "(x, split_size_or_sections, /, axis=0)", "view", "any", "same", True),
    ("concat", "(arrays, /, *, axis=0)", "join", "any", "same", True),
    ("stack", "(arrays, /, *, axis=0)", "join", "any", "same", True),
    ("matmul", "(x1, x2, /)", "linalg", "numeric", "same", True),
    ("tensordot", "(x1, x2, /, *, axes=2)", "linalg", "numeric", "same", True),
    ("vecdot", "(x1, x2, /, *, axis=-1)", "linalg", "numeric", "same", True),
    ("copy", "(x, /)", "conversion", "any", "same", True),
    # sparse COO layout (backends/sparse): dense kernels convert or refuse, the sparse
    # layer does the work; not differentiable yet (autograd support is to come)
    ("to_dense", "(x, /)", "conversion", "any", "same", False),
    ("to_sparse", "(x, /)", "conversion", "numeric", "same", False),
    ("coalesce", "(x, /)", "conversion", "numeric", "same", False),
    # creation: dispatched on the key of the requested device
    ("full", "(shape, fill_value, dtype, device)", "creation", "any", "arg", False),
    ("empty", "(shape, dtype, device)", "creation", "any", "arg", False),
    ("arange", "(start, stop, step, dtype, device)", "creation", "any", "arg", False),
    ("linspace", "(start, stop, num, dtype, device, endpoint)", "creation", "any", "arg", False),
    ("eye", "(n_rows, n_cols, k, dtype, device)", "creation", "any", "arg", False),
    ("from_host", "(data, dtype, device)", "creation", "any", "arg", False),
    ("rand", "(shape, dtype, device, generator)", "creation", "float", "arg", False),
    ("randn", "(shape, dtype, device, generator)", "creation", "float", "arg", False),
]


class OpInfo:
    """What the list says about one operator, kept on it as ``op.info``."""

    __slots__ = ("dtypes", "result")

    def __init__(self, dtypes, result):
        self.dtypes, self.result = dtypes, result


def _define_all():
    for entry in ELEMENTWISE:
        name, sig, kind, dtypes, result, diff, inplace = entry
        define(name, sig, kind, diff).info = OpInfo(dtypes, result)
        if inplace:
            define(name + "_", "(x1, x2, /)", "inplace", diff, inplace_of=name).info = \
                OpInfo(dtypes, result)
    for name, sig, kind, dtypes, result, diff in OTHERS:
        define(name, sig, kind, diff).info = OpInfo(dtypes, result)


_define_all()
