"""Every operator of lamina, one entry each (Note [Operator schema] in ``schema.py``).

To add an operator: one entry here, its kernels (``backends/numba_cpu`` for the CPU,
``backends/numpy_ref`` for the test oracle) and, if it is differentiable, its formula
in ``autograd/derivatives.py`` (CONTRIBUTING.md walks through it). Signatures are
Python; annotations are argument kinds (``dispatch/arguments.py``); ``check`` names
the argument rules of ``dispatch/meta.py``.

dtypes (checked on the promoted computation dtype), and result:
    any      every dtype                  real          not complex
    numeric  not bool                     real_numeric  not bool, not complex
    float    floats, complex included; ints and bool are promoted to the default float
    real_float  real floats; ints and bool promoted as for float
    complex  complex floats               int  integers    intbool  integers and bool
    same     the computation dtype        bool     bool
    sum      float as is, signed -> int64, unsigned -> uint64, bool -> int64
    index    int64                        arg      given by an argument
    real     the real dtype of the precision (complex64 -> float32; reals as they are)
    complex  the complex dtype of the precision (float32 -> complex64)
"""

from . import meta
from .schema import define

DIFF = "differentiable"


def unary(name, dtypes, doc, *, result="same", tags=DIFF, numpy=None, dunder=None):
    return define(
        f"{name}(x: Tensor, /) -> Tensor",
        "elementwise",
        dtypes=dtypes,
        result=result,
        tags=tags,
        numpy=numpy or name,
        dunder=dunder,
        doc=doc,
    )


def binary(name, dtypes, doc, *, result="same", tags=DIFF, numpy=None, dunder=None, inplace=True):
    return define(
        f"{name}(x1: TensorOrScalar, x2: TensorOrScalar, /) -> Tensor",
        "elementwise",
        dtypes=dtypes,
        result=result,
        tags=tags,
        numpy=numpy or name,
        dunder=dunder,
        inplace=inplace,
        doc=doc,
    )


def comparison(name, dunder, doc, dtypes="real"):
    return binary(name, dtypes, doc, result="bool", tags="comparison", dunder=dunder, inplace=False)


# ---------------------------------------------------------------- elementwise, unary
ZERO = f"{DIFF} keeps_zero"  # f(0) == 0: sparse tensors keep their pattern
SIMD = f"{DIFF} simd"  # NumPy has SIMD loops for it (Note [NumPy SIMD loops])

unary(
    "abs",
    "numeric",
    "The absolute value of each element (the modulus of a complex one, a real result).",
    result="real",
    tags=ZERO,
    numpy="absolute",
    dunder="abs",
)
unary("negative", "numeric", "The negation of each element (``-x``).", tags=ZERO, dunder="neg")
unary("positive", "numeric", "Each element unchanged (``+x``).", tags=ZERO, dunder="pos")
unary("square", "numeric", "The square of each element.", tags=ZERO)
unary("conj", "numeric", "The complex conjugate of each element (a real one unchanged).", tags=ZERO)
unary(
    "real",
    "numeric",
    "The real part of each element (a real one unchanged), in the real dtype.",
    result="real",
    tags=ZERO,
)
unary(
    "imag",
    "complex",
    "The imaginary part of each complex element, in the real dtype.",
    result="real",
    tags=ZERO,
)
unary(
    "sign",
    "numeric",
    "-1, 0 or 1 by the sign of each element (NaN stays NaN); z / |z| for a complex one (0 at 0).",
    tags=ZERO,
)
unary("floor", "real_numeric", "The largest integer not above each element.", tags=ZERO)
unary("ceil", "real_numeric", "The smallest integer not below each element.", tags=ZERO)
unary(
    "round",
    "numeric",
    "Each element rounded to the nearest integer, halves to even (complex: both parts).",
    tags=ZERO,
    numpy="rint",
)
unary("trunc", "real_numeric", "Each element rounded toward zero.", tags=ZERO)
unary("exp", "float", "e raised to each element.", tags=SIMD)
unary("expm1", "float", "exp(x) - 1, accurate for small x.", tags=f"{SIMD} keeps_zero")
unary("log", "float", "The natural logarithm of each element.", tags=SIMD)
unary("log1p", "float", "log(1 + x), accurate for small x.", tags=f"{SIMD} keeps_zero")
unary("log2", "float", "The base-2 logarithm of each element.", tags=SIMD)
unary("log10", "float", "The base-10 logarithm of each element.", tags=SIMD)
unary("sqrt", "float", "The non-negative square root of each element.", tags=ZERO)
unary("sin", "float", "The sine of each element (radians).", tags=f"{SIMD} keeps_zero")
unary("cos", "float", "The cosine of each element (radians).", tags=SIMD)
unary("tan", "float", "The tangent of each element (radians).", tags=f"{SIMD} keeps_zero")
unary(
    "asin", "float", "The inverse sine of each element.", tags=f"{SIMD} keeps_zero", numpy="arcsin"
)
unary("acos", "float", "The inverse cosine of each element.", tags=SIMD, numpy="arccos")
unary(
    "atan",
    "float",
    "The inverse tangent of each element.",
    tags=f"{SIMD} keeps_zero",
    numpy="arctan",
)
unary("sinh", "float", "The hyperbolic sine of each element.", tags=f"{SIMD} keeps_zero")
unary("cosh", "float", "The hyperbolic cosine of each element.", tags=SIMD)
unary("tanh", "float", "The hyperbolic tangent of each element.", tags=f"{SIMD} keeps_zero")
unary(
    "asinh",
    "float",
    "The inverse hyperbolic sine of each element.",
    tags=f"{SIMD} keeps_zero",
    numpy="arcsinh",
)
unary(
    "acosh", "float", "The inverse hyperbolic cosine of each element.", tags=SIMD, numpy="arccosh"
)
unary(
    "atanh",
    "float",
    "The inverse hyperbolic tangent of each element.",
    tags=f"{SIMD} keeps_zero",
    numpy="arctanh",
)
unary(
    "bitwise_invert",
    "intbool",
    "The bitwise NOT of each element (``~x``).",
    tags="",
    numpy="invert",
    dunder="invert",
)
unary("logical_not", "any", "True where an element is zero (False).", result="bool", tags="")
unary(
    "isfinite", "any", "True where an element is neither infinite nor NaN.", result="bool", tags=""
)
unary(
    "isinf",
    "any",
    "True where an element is positive or negative infinity.",
    result="bool",
    tags="",
)
unary("isnan", "any", "True where an element is NaN.", result="bool", tags="")
unary(
    "signbit",
    "real_float",
    "True where an element's sign bit is set (-0.0 included).",
    result="bool",
    tags="",
)

# ---------------------------------------------------------------- elementwise, binary
binary("add", "numeric", "The sum of each pair of elements (``x1 + x2``).", dunder="add")
binary("subtract", "numeric", "The difference of each pair (``x1 - x2``).", dunder="sub")
binary("multiply", "numeric", "The product of each pair (``x1 * x2``).", dunder="mul")
binary("floor_divide", "real_numeric", "x1 / x2 rounded down (``x1 // x2``).", dunder="floordiv")
binary(
    "remainder",
    "real_numeric",
    "The remainder of x1 // x2, with x2's sign (``x1 % x2``).",
    dunder="mod",
)
binary(
    "pow",
    "numeric",
    "x1 raised to x2 (``x1 ** x2``); integers to negative integer powers raise.",
    tags=SIMD,
    numpy="power",
    dunder="pow",
)
binary("maximum", "real_numeric", "The larger of each pair (NaN propagates).")
binary("minimum", "real_numeric", "The smaller of each pair (NaN propagates).")
binary(
    "divide",
    "float",
    "The true quotient of each pair (``x1 / x2``).",
    numpy="true_divide",
    dunder="truediv",
)
binary(
    "atan2",
    "real_float",
    "The angle of the point (x2, x1), in radians.",
    tags=SIMD,
    numpy="arctan2",
)
binary("copysign", "real_float", "The magnitude of x1 with the sign of x2.")
binary("hypot", "real_float", "sqrt(x1**2 + x2**2), without overflow in the squares.")
binary("logaddexp", "real_float", "log(exp(x1) + exp(x2)), without overflow.")
binary(
    "bitwise_and", "intbool", "The bitwise AND of each pair (``x1 & x2``).", tags="", dunder="and"
)
binary("bitwise_or", "intbool", "The bitwise OR of each pair (``x1 | x2``).", tags="", dunder="or")
binary(
    "bitwise_xor", "intbool", "The bitwise XOR of each pair (``x1 ^ x2``).", tags="", dunder="xor"
)
binary(
    "bitwise_left_shift",
    "int",
    "x1 shifted left by x2 bits (``x1 << x2``); 0 from the width on.",
    tags="",
    numpy="left_shift",
    dunder="lshift",
)
binary(
    "bitwise_right_shift",
    "int",
    "x1 shifted right by x2 bits (``x1 >> x2``).",
    tags="",
    numpy="right_shift",
    dunder="rshift",
)
comparison("equal", "eq", "True where x1 == x2.", dtypes="any")
comparison("not_equal", "ne", "True where x1 != x2.", dtypes="any")
comparison("greater", "gt", "True where x1 > x2.")
comparison("greater_equal", "ge", "True where x1 >= x2.")
comparison("less", "lt", "True where x1 < x2.")
comparison("less_equal", "le", "True where x1 <= x2.")
binary(
    "logical_and",
    "any",
    "True where both elements are nonzero.",
    result="bool",
    tags="",
    inplace=False,
)
binary(
    "logical_or",
    "any",
    "True where either element is nonzero.",
    result="bool",
    tags="",
    inplace=False,
)
binary(
    "logical_xor",
    "any",
    "True where exactly one of the elements is nonzero.",
    result="bool",
    tags="",
    inplace=False,
)

# ---------------------------------------------------------------- elementwise, ternary
define(
    "clip(x: Tensor, /, min: TensorOrScalar | None = None, "
    "max: TensorOrScalar | None = None) -> Tensor",
    "elementwise",
    dtypes="real_numeric",
    tags=DIFF,
    numpy="clip",
    doc="Each element limited to [min, max] (a None bound "
    "is open); the result keeps x's dtype and shape, the bounds broadcast to it.",
)
define(
    "where(condition: Tensor, x1: TensorOrScalar, x2: TensorOrScalar, /) -> Tensor",
    "elementwise",
    tags=DIFF,
    numpy="where",
    doc="x1 where condition is True, x2 elsewhere; the three broadcast together.",
)

# ---------------------------------------------------------------- reductions
REDUCED = "axis: Axes = None, keepdims: bool = False"
define(
    "sum(x: Tensor, /, *, axis: Axes = None, dtype: DType | None = None, "
    "keepdims: bool = False) -> Tensor",
    "reduction",
    result="sum",
    tags=DIFF,
    doc="The sum over the given axes (every axis by default), accumulated in 64 bits; "
    "``dtype`` casts the input first.",
)
define(
    "prod(x: Tensor, /, *, axis: Axes = None, dtype: DType | None = None, "
    "keepdims: bool = False) -> Tensor",
    "reduction",
    result="sum",
    tags=DIFF,
    doc="The product over the given axes (every axis by default).",
)
define(
    f"mean(x: Tensor, /, *, {REDUCED}) -> Tensor",
    "reduction",
    dtypes="float",
    tags=DIFF,
    doc="The arithmetic mean over the given axes (NaN over none).",
)
define(
    "var(x: Tensor, /, *, axis: Axes = None, correction: float = 0.0, "
    "keepdims: bool = False) -> Tensor",
    "reduction",
    dtypes="float",
    result="real",
    tags=DIFF,
    doc="The variance over the given axes, divided by N - correction (of a complex "
    "tensor: the mean squared modulus of the deviations, real, as in NumPy).",
)
define(
    "std(x: Tensor, /, *, axis: Axes = None, correction: float = 0.0, "
    "keepdims: bool = False) -> Tensor",
    "reduction",
    dtypes="float",
    result="real",
    tags=DIFF,
    doc="The standard deviation over the given axes (sqrt of var).",
)
define(
    f"max(x: Tensor, /, *, {REDUCED}) -> Tensor",
    "reduction",
    dtypes="real",
    tags=DIFF,
    doc="The largest element over the given axes (NaN propagates; an empty axis raises).",
)
define(
    f"min(x: Tensor, /, *, {REDUCED}) -> Tensor",
    "reduction",
    dtypes="real",
    tags=DIFF,
    doc="The smallest element over the given axes (NaN propagates; an empty axis raises).",
)
define(
    f"all(x: Tensor, /, *, {REDUCED}) -> Tensor",
    "reduction",
    result="bool",
    doc="Whether every element over the given axes is nonzero.",
)
define(
    f"any(x: Tensor, /, *, {REDUCED}) -> Tensor",
    "reduction",
    result="bool",
    doc="Whether some element over the given axes is nonzero.",
)
define(
    "argmax(x: Tensor, /, *, axis: OneAxisOrAll = None, keepdims: bool = False) -> Tensor",
    "reduction",
    dtypes="real",
    result="index",
    doc="The index of the first largest "
    "element along axis (of the flattened tensor when axis is None).",
)
define(
    "argmin(x: Tensor, /, *, axis: OneAxisOrAll = None, keepdims: bool = False) -> Tensor",
    "reduction",
    dtypes="real",
    result="index",
    doc="The index of the first smallest "
    "element along axis (of the flattened tensor when axis is None).",
)

# ---------------------------------------------------------------- views
define(
    "reshape(x: Tensor, /, shape: Shape, *, copy: bool | None = None) -> Tensor",
    "view",
    tags=f"view {DIFF}",
    check=meta.reshape,
    doc="The elements in a new shape (one size may be -1); a view when the strides "
    "allow, a copy otherwise (``copy=False`` refuses to copy).",
)
define(
    "permute_dims(x: Tensor, /, axes: Any) -> Tensor",
    "view",
    tags=f"view {DIFF}",
    check=meta.permute_dims,
    doc="A view with the axes reordered: result axis i is axis ``axes[i]`` of x.",
)
define(
    "matrix_transpose(x: Tensor, /) -> Tensor",
    "view",
    tags=f"view {DIFF}",
    check=meta.at_least_2d("matrix_transpose"),
    doc="A view with the last two axes swapped.",
)
define(
    "expand_dims(x: Tensor, /, axis: NewAxis) -> Tensor",
    "view",
    tags=f"view {DIFF}",
    doc="A view with a new axis of size 1 at position axis.",
)
define(
    "squeeze(x: Tensor, /, axis: Axes) -> Tensor",
    "view",
    tags=f"view {DIFF}",
    check=meta.squeeze,
    doc="A view without the given axes, which must have size 1.",
)
define(
    "flip(x: Tensor, /, *, axis: Axes = None) -> Tensor",
    "view",
    tags=f"view {DIFF}",
    doc="A view with the order of elements reversed along the given axes.",
)
define(
    "broadcast_to(x: Tensor, /, shape: Shape) -> Tensor",
    "view",
    tags=f"view {DIFF}",
    check=meta.broadcast_to,
    doc="A read-only view of x broadcast to shape.",
)
define(
    "split(x: Tensor, split_size_or_sections: Any, /, axis: Axis = 0) -> Any",
    "view",
    tags=f"view {DIFF}",
    check=meta.split,
    doc="Views of consecutive pieces along "
    "axis (PyTorch's split): an int gives chunks of that size, the last may be "
    "smaller; a list gives the size of each piece.",
)
define(
    "getitem(x: Tensor, key: Any, /) -> Tensor",
    "indexing",
    tags=f"view {DIFF}",
    namespace=None,
    doc="``x[key]``: basic indexing gives a view, integer and boolean indexing a copy.",
)

# ---------------------------------------------------------------- indexing
define(
    "setitem(x: Tensor, key: Any, value: TensorOrScalar, /) -> Tensor",
    "indexing",
    tags=f"inplace {DIFF}",
    namespace=None,
    doc="``x[key] = value``, in place.",
)
define(
    "index_add(x: Tensor, key: Any, values: Tensor, /) -> Tensor",
    "indexing",
    tags=DIFF,
    namespace=None,
    doc="A copy of x with values added at x[key]; an "
    "index that repeats adds each time (getitem's backward).",
)

# ---------------------------------------------------------------- manipulation
define(
    "concat(arrays: Tensors, /, *, axis: int | None = 0) -> Tensor",
    "manipulation",
    tags=DIFF,
    check=meta.concat,
    doc="The tensors joined along an existing axis "
    "(flattened first when axis is None); dtypes promote.",
)
define(
    "stack(arrays: Tensors, /, *, axis: int = 0) -> Tensor",
    "manipulation",
    tags=DIFF,
    check=meta.stack,
    doc="The tensors, of one shape, joined along a new axis.",
)

# ---------------------------------------------------------------- linear algebra
define(
    "matmul(x1: Tensor, x2: Tensor, /) -> Tensor",
    "linalg",
    dtypes="numeric",
    tags=DIFF,
    dunder="matmul",
    check=meta.matmul,
    doc="The matrix product (``x1 @ x2``), batched over "
    "leading axes that broadcast; 1-D operands are vectors.",
)
define(
    "tensordot(x1: Tensor, x2: Tensor, /, *, axes: Any = 2) -> Tensor",
    "linalg",
    dtypes="numeric",
    tags=DIFF,
    check=meta.tensordot,
    doc="The sum of products over "
    "the last ``axes`` axes of x1 and the first of x2, or over a pair of axis lists.",
)
define(
    "vecdot(x1: Tensor, x2: Tensor, /, *, axis: int = -1) -> Tensor",
    "linalg",
    dtypes="numeric",
    tags=DIFF,
    check=meta.vecdot,
    doc="The dot product of vectors along axis, broadcast over the other axes; x1 is "
    "conjugated (sum of conj(x1) * x2).",
)

# ---------------------------------------------------------------- conversion
define(
    "astype(x: Tensor, dtype: DType, /, *, copy: bool = True) -> Tensor",
    "conversion",
    result="arg",
    tags=DIFF,
    namespace=None,
    doc="x's values in dtype; ``copy=False`` returns x itself when it has the dtype.",
)
define(
    "copy(x: Tensor, /) -> Tensor",
    "conversion",
    tags=DIFF,
    namespace=None,
    doc="A tensor owning a copy of x's values, in x's memory layout (as np.copy).",
)
define(
    "to_device(x: Tensor, device: Device, /) -> Tensor",
    "conversion",
    tags=DIFF,
    namespace=None,
    doc="x on device (``x.to(device)``): through the CPU with the devices' converters, "
    "never sharing storage with x; differentiable (the gradient moves back).",
)
define(
    "to_dense(x: Tensor, /) -> Tensor",
    "conversion",
    namespace=None,
    doc="A dense tensor with x's values (x itself when it is dense).",
)
define(
    "to_sparse(x: Tensor, /) -> Tensor",
    "conversion",
    dtypes="numeric",
    namespace=None,
    doc="A coalesced sparse COO tensor of x's nonzero entries.",
)
define(
    "coalesce(x: Tensor, /) -> Tensor",
    "conversion",
    dtypes="numeric",
    namespace=None,
    doc="The sparse tensor x with entries sorted row-major and duplicates summed.",
)
define(
    "sparse_mask(x: Tensor, mask: Tensor, /) -> Tensor",
    "conversion",
    namespace=None,
    doc="A sparse tensor with mask's entries holding x's values there (a dense "
    "gradient of a sparse leaf).",
)

# ---------------------------------------------------------------- neural-network primitives
# Seed 2's primitives, public in lamina.nn.functional with PyTorch's names and semantics
# (lamina.nn.functional adds the composites: max_pool2d, batch_norm, cross_entropy, ...).
# Logical shapes are NCHW; the memory layout is NCHW or channels-last (NHWC strides) and
# every kernel keeps its input's (Note [Layouts] in backends/numba_cpu/nn/layout.py).
# Their checks (dispatch/meta.py) refuse bad input before any kernel runs and give the
# kernels canonical arguments. The internal operators (namespace None) are the backward
# kernels; those that are differentiable make double backward work.
NN = "nn.functional"
FLOATING = "floating"
POOL = (
    "kernel_size: Pair, stride: Pair | None = None, padding: Pair = 0, dilation: Pair = 1, "
    "ceil_mode: bool = False"
)
CONV = "stride: Pair, padding: Any, dilation: Pair, groups: int"

define(
    "conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Pair = 1, "
    "padding: Any = 0, dilation: Pair = 1, groups: int = 1) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.conv2d,
    doc="The 2-D cross-correlation of a (N, C, H, W) or unbatched (C, H, W) input with "
    "weight (C_out, C / groups, kH, kW), plus bias (C_out,); padding is an int, a pair, "
    "'valid' or 'same'.",
)
define(
    f"conv2d_relu(input: Tensor, weight: Tensor, bias: Tensor | None, {CONV}) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.conv2d,
    doc="relu(conv2d(...)): max(result, 0) applied where the bias is added, in the same "
    "pass over the output (Note [Fused epilogues]).",
)
define(
    f"conv2d_backward_input(grad: Tensor, weight: Tensor, input: Tensor, {CONV}) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="conv2d's gradient with respect to its input (the transposed convolution of grad), "
    "in the input's shape and layout (its values are not read).",
)
define(
    f"conv2d_backward_weight(grad: Tensor, input: Tensor, weight_shape: Shape, {CONV}, "
    "bias_grad: bool) -> tuple[Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="conv2d's gradients with respect to its weight and its bias: (grad_weight, grad_bias); "
    "without bias_grad (a convolution with no bias) grad_bias is empty, a pass over grad "
    "not made.",
)
define(
    "resample2d(input: Tensor, rows: Tensor, cols: Tensor, row_weights: Tensor | None = None, "
    "col_weights: Tensor | None = None) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.resample2d,
    doc="Each output pixel (i, j) of an image is input[..., rows[i, a], cols[j, b]] weighted "
    "by row_weights[i, a] col_weights[j, b], summed over the taps a and b (without weights: "
    "the first tap alone): interpolate's sampling, and pad's in its reflect, replicate and "
    "circular modes, in the input's layout.",
)
define(
    "resample2d_backward(grad: Tensor, rows: Tensor, cols: Tensor, row_weights: Tensor | "
    "None, col_weights: Tensor | None, input: Tensor) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="resample2d's gradient with respect to its input (its adjoint), in the input's shape "
    "and layout (its values are not read).",
)
define(
    "linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.linear,
    doc="input @ weight.T + bias: weight (out_features, in_features), over any leading "
    "axes of input.",
)
define(
    "linear_relu(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.linear,
    doc="relu(linear(...)): max(result, 0) applied where the bias is added, in the same "
    "pass over the output (Note [Fused epilogues]).",
)
define(
    f"max_pool2d(input: Tensor, {POOL}) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.max_pool2d,
    doc="max_pool2d_with_indices' values alone: what lamina.nn.functional.max_pool2d runs "
    "when nothing needs the indices (inference); its backward computes them.",
)
define(
    f"min_pool2d(input: Tensor, {POOL}) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.min_pool2d,
    doc="min_pool2d_with_indices' values alone (lamina.nn.functional.min_pool2d without "
    "gradients).",
)
define(
    f"max_pool2d_with_indices(input: Tensor, {POOL}) -> tuple[Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.max_pool2d,
    doc="The largest value of each window and its flat index into the H x W plane "
    "(int64); padding counts as -inf, NaN wins.",
)
define(
    f"min_pool2d_with_indices(input: Tensor, {POOL}) -> tuple[Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.min_pool2d,
    doc="The smallest value of each window and its flat index into the H x W plane "
    "(int64); padding counts as +inf, NaN wins.",
)
define(
    "pool2d_scatter(grad: Tensor, indices: Tensor, input_shape: Shape) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="grad summed into zeros of input_shape at the pooling indices (max and min "
    "pooling's backward), in the indices' layout.",
)
define(
    "pool2d_gather(x: Tensor, indices: Tensor) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="x's values at the pooling indices (pool2d_scatter's adjoint).",
)
define(
    "avg_pool2d(input: Tensor, kernel_size: Pair, stride: Pair | None = None, "
    "padding: Pair = 0, ceil_mode: bool = False, count_include_pad: bool = True, "
    "divisor_override: int | None = None) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.avg_pool2d,
    doc="The mean of each window; padding counts as zeros when count_include_pad, and "
    "divisor_override replaces the window size as the divisor.",
)
define(
    "avg_pool2d_backward(grad: Tensor, input: Tensor, kernel_size: Pair, stride: Pair, "
    "padding: Pair, ceil_mode: bool, count_include_pad: bool, divisor_override: int | None"
    ") -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="avg_pool2d's gradient with respect to its input (its adjoint), in the input's "
    "shape and layout.",
)
define(
    "adaptive_avg_pool2d(input: Tensor, output_size: Any) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.adaptive_avg_pool2d,
    doc="Average pooling to output_size (an int or a pair; None keeps the input's size) "
    "over windows [floor(i H / h), ceil((i + 1) H / h)).",
)
define(
    "adaptive_avg_pool2d_backward(grad: Tensor, input: Tensor) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="adaptive_avg_pool2d's gradient with respect to its input (its adjoint), in the "
    "input's shape and layout.",
)
define(
    "native_local_response_norm(input: Tensor, size: int, alpha: float, beta: float, "
    "k: float) -> tuple[Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.local_response_norm,
    doc="Local response normalization across channels, and the scale "
    "k + alpha / size * (sum of squares over the channel window) it divided by (to the "
    "power beta), saved for backward.",
)
define(
    "local_response_norm_backward(grad: Tensor, input: Tensor, result: Tensor, "
    "scale: Tensor, size: int, alpha: float, beta: float, k: float) -> Tensor",
    "nn",
    dtypes=FLOATING,
    namespace=None,
    doc="local_response_norm's gradient with respect to its input, from the saved scale.",
)
define(
    "native_batch_norm(input: Tensor, weight: Tensor | None, bias: Tensor | None, "
    "running_mean: Tensor | None, running_var: Tensor | None, training: bool, "
    "momentum: float, eps: float, relu: bool = False) -> tuple[Tensor, Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.batch_norm,
    writes="running_mean running_var",  # in training
    doc="Batch normalization over every axis but 1, and the mean and inverse standard "
    "deviation it used (saved for backward); training updates the running statistics "
    "in place. With relu, max(result, 0) in the same pass (Note [Fused batch norm and "
    "relu]).",
)
define(
    "native_batch_norm_backward(grad: Tensor, input: Tensor, weight: Tensor | None, "
    "mean: Tensor, invstd: Tensor, training: bool, result: Tensor | None = None) "
    "-> tuple[Tensor, Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    namespace=None,
    doc="batch_norm's gradients with respect to input, weight and bias, from the saved "
    "mean and inverse standard deviation; given the result of a batch norm with relu, "
    "grad counts only where that result is positive.",
)
define(
    "native_layer_norm(input: Tensor, normalized_shape: Shape, weight: Tensor | None, "
    "bias: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.layer_norm,
    doc="Layer normalization over the trailing normalized_shape axes, and the mean and "
    "inverse standard deviation of each normalized slice (shaped to broadcast against "
    "input), saved for backward.",
)
define(
    "native_layer_norm_backward(grad: Tensor, input: Tensor, normalized_shape: Shape, "
    "mean: Tensor, rstd: Tensor, weight: Tensor | None) -> tuple[Tensor, Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    namespace=None,
    doc="layer_norm's gradients with respect to input, weight and bias (the last two of "
    "normalized_shape), from the saved mean and inverse standard deviation.",
)
define(
    "native_group_norm(input: Tensor, weight: Tensor | None, bias: Tensor | None, "
    "num_groups: int, eps: float) -> tuple[Tensor, Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.group_norm,
    doc="Group normalization of (N, C, ...) over each of num_groups groups of channels "
    "and every other axis but 0, with a per-channel weight and bias; the (N, num_groups) "
    "mean and inverse standard deviation are saved for backward.",
)
define(
    "native_group_norm_backward(grad: Tensor, input: Tensor, mean: Tensor, rstd: Tensor, "
    "weight: Tensor | None, num_groups: int) -> tuple[Tensor, Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    namespace=None,
    doc="group_norm's gradients with respect to input, weight and bias, from the saved "
    "mean and inverse standard deviation.",
)
define(
    "native_lstm_cell(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.lstm_cell,
    doc="One LSTM step in one pass: from the pre-activations gates (4, *c.shape) of the "
    "input, forget, cell and output gates and the cell state c, (h, the next c, and the "
    "gates' activations sigmoid, sigmoid, tanh, sigmoid, saved for backward).",
)
define(
    "native_lstm_cell_backward(grad_h: Tensor | None, grad_c: Tensor | None, c: Tensor, "
    "c_next: Tensor, activations: Tensor) -> tuple[Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    namespace=None,
    doc="native_lstm_cell's gradients with respect to gates and c, from c, the next c "
    "and the saved activations; a missing gradient counts as zeros.",
)
define(
    "native_lstm_sequence(projections: Tensor, h0: Tensor, c0: Tensor, weight_hh: Tensor) "
    "-> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.lstm_sequence,
    doc="An LSTM layer over a whole sequence in one call, the sequence in columns: from "
    "the input's projections (4H, L, N) (each step's gate pre-activations but the "
    "hidden state's part), the initial states h0 and c0 (H, N) and weight_hh (4H, H), "
    "(every step's h (H, L, N), the last h and c (H, N), and saved for backward every "
    "step's c (L, H, N) and the gates' activations (L, 4, H, N)).",
)
define(
    "native_lstm_sequence_backward(grad_output: Tensor | None, grad_h_n: Tensor | None, "
    "grad_c_n: Tensor | None, h0: Tensor, c0: Tensor, weight_hh: Tensor, output: Tensor, "
    "cs: Tensor, activations: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    namespace=None,
    check=meta.lstm_sequence_backward,
    doc="native_lstm_sequence's gradients with respect to projections, h0, c0 and "
    "weight_hh, from its saved results; a missing gradient counts as zeros.",
)
define(
    "native_gru_sequence(projections: Tensor, h0: Tensor, weight_hh: Tensor, "
    "bias_hh: Tensor | None) -> tuple[Tensor, Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.gru_sequence,
    doc="A GRU layer over a whole sequence in one call, the sequence in columns: from "
    "the input's projections (3H, L, N) (with the input's bias), the initial state h0 "
    "(H, N), weight_hh (3H, H) and bias_hh (3H,) or None, (every step's h (H, L, N), "
    "the last h (H, N), and saved for backward every step's r, z, n and w_hn h + b_hn "
    "(L, 4, H, N)).",
)
define(
    "native_gru_sequence_backward(grad_output: Tensor | None, grad_h_n: Tensor | None, "
    "h0: Tensor, weight_hh: Tensor, output: Tensor, activations: Tensor) "
    "-> tuple[Tensor, Tensor, Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    namespace=None,
    check=meta.gru_sequence_backward,
    doc="native_gru_sequence's gradients with respect to projections, h0, weight_hh and "
    "bias_hh, from its saved results; a missing gradient counts as zeros.",
)
define(
    "embedding(weight: Tensor, indices: Tensor, padding_idx: int | None) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.embedding,
    doc="The rows of weight (num_embeddings, embedding_dim) at integer indices of any "
    "shape: a result of shape indices.shape + (embedding_dim,). The row padding_idx "
    "gets no gradient.",
)
define(
    "embedding_dense_backward(grad: Tensor, indices: Tensor, num_weights: int, "
    "padding_idx: int | None) -> Tensor",
    "nn",
    dtypes=FLOATING,
    namespace=None,
    doc="embedding's gradient with respect to weight: the rows of grad summed into "
    "zeros (num_weights, embedding_dim) at their indices, repeated indices "
    "accumulating; the row padding_idx stays zero.",
)
define(
    "native_scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, "
    "attn_mask: Tensor | None, is_causal: bool, scale: float, need_weights: bool) "
    "-> tuple[Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.attention,
    doc="softmax(query @ key^T * scale + mask) @ value for (..., L, E) queries and "
    "(..., S, E) keys and (..., S, Ev) values of the same leading shape, and the "
    "attention weights (..., L, S) when need_weights (saved for backward; else an "
    "empty tensor). A boolean attn_mask keeps where True, a float one is added; "
    "is_causal keeps the positions at or below the diagonal. A row whose every key "
    "is masked gets zero weights.",
)
define(
    "native_scaled_dot_product_attention_backward(grad: Tensor, query: Tensor, key: "
    "Tensor, value: Tensor, weights: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]",
    "nn",
    dtypes=FLOATING,
    namespace=None,
    check=meta.attention_backward,
    doc="scaled_dot_product_attention's gradients with respect to query, key and value "
    "from the saved attention weights (..., L, S) and the output's gradient (..., L, Ev).",
)
define(
    "relu(input: Tensor) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.activation("relu"),
    doc="max(input, 0), in the input's layout.",
)
define(
    "relu_backward(grad: Tensor, result: Tensor) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="grad where relu's result is positive, 0 elsewhere.",
)
define(
    "leaky_relu(input: Tensor, negative_slope: float = 0.01) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.activation("leaky_relu"),
    doc="input where positive, negative_slope * input elsewhere.",
)
define(
    "leaky_relu_backward(grad: Tensor, input: Tensor, negative_slope: float) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="grad where input is positive, negative_slope * grad elsewhere.",
)
define(
    "gelu(input: Tensor, approximate: str = 'none') -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.gelu,
    doc="input * Phi(input) (Phi the standard normal CDF); approximate='tanh' uses "
    "0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x**3))).",
)
define(
    "gelu_backward(grad: Tensor, input: Tensor, approximate: str) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="grad times gelu's derivative at input.",
)
define(
    "sigmoid(input: Tensor) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.activation("sigmoid"),
    doc="1 / (1 + exp(-input)), in the input's layout.",
)
define(
    "softmax(input: Tensor, dim: Axis) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.softmax("softmax"),
    doc="exp(input) normalized to sum 1 along dim (computed without overflow).",
)
define(
    "log_softmax(input: Tensor, dim: Axis) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.softmax("log_softmax"),
    doc="input - logsumexp(input) along dim: the log of softmax, without its rounding.",
)
define(
    "softmax_backward(grad: Tensor, result: Tensor, dim: Axis) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="result * (grad - sum(grad * result, dim)): softmax's gradient, from its result.",
)
define(
    "log_softmax_backward(grad: Tensor, result: Tensor, dim: Axis) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="grad - exp(result) * sum(grad, dim): log_softmax's gradient, from its result.",
)
define(
    "nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, "
    "ignore_index: int = -100, reduction: str = 'mean') -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.nll_loss,
    doc="-input[n, target[n]] * weight[target[n]] for (N, C, ...) log-probabilities and "
    "integer targets, reduced by 'mean' (over the weights), 'sum' or 'none'.",
)
define(
    "nll_loss_backward(grad: Tensor, input: Tensor, target: Tensor, weight: Tensor | None, "
    "ignore_index: int, reduction: str) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="nll_loss's gradient with respect to input: -grad * weight[target[n]] (divided by "
    "the targets' total weight for 'mean') at each target's class, 0 elsewhere and at "
    "ignored targets.",
)
define(
    "cross_entropy_loss(input: Tensor, target: Tensor, ignore_index: int = -100) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    check=meta.cross_entropy_loss,
    doc="-log_softmax(input, 1)[n, target[n]] averaged over the targets that are not "
    "ignore_index, for (N, C) logits and (N,) class indices: cross_entropy's common case "
    "(no weight, reduction 'mean') in one pass, no log-probabilities stored.",
)
define(
    "cross_entropy_loss_backward(grad: Tensor, input: Tensor, target: Tensor, "
    "ignore_index: int) -> Tensor",
    "nn",
    dtypes=FLOATING,
    namespace=None,
    check=meta.cross_entropy_loss_backward,
    doc="cross_entropy_loss's gradient with respect to input, from the loss's 0-d grad: "
    "(softmax(input, 1) - onehot(target)) * grad / count in each row whose target is "
    "not ignore_index (count such rows), 0 in the others, in one pass per row.",
)
define(
    "add_scaled_(x1: Tensor, x2: Tensor, /, alpha: float) -> Tensor",
    "linalg",
    dtypes=FLOATING,
    tags="inplace",
    namespace=None,
    check=meta.add_scaled,
    doc="``x1 += alpha * x2``, in place and in one pass (BLAS's axpy; Tensor.add_ with "
    "alpha): x2 has x1's shape and dtype. The optimizers' step.",
)
define(
    "mse_loss(input: Tensor, target: Tensor, reduction: str = 'mean') -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.mse_loss,
    doc="(input - target) ** 2 reduced by 'mean', 'sum' or 'none' (shapes must match).",
)
define(
    "silu(input: Tensor) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.activation("silu"),
    doc="input * sigmoid(input) (computed as input / (1 + exp(-input))), in the input's layout.",
)
define(
    "silu_backward(grad: Tensor, input: Tensor) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="grad times silu's derivative at input, s (1 + input (1 - s)) with s = sigmoid(input).",
)
define(
    "tanh_backward(grad: Tensor, result: Tensor) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="grad times tanh's derivative from its result, 1 - result**2 (one pass, where "
    "the formula took three).",
)
define(
    "sigmoid_backward(grad: Tensor, result: Tensor) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="grad times sigmoid's derivative from its result, result (1 - result).",
)
define(
    "hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.hardtanh,
    doc="input clamped to [min_val, max_val] (NaN stays NaN), in the input's layout; "
    "relu6 is hardtanh(input, 0, 6).",
)
define(
    "hardtanh_backward(grad: Tensor, input: Tensor, min_val: float, max_val: float) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="grad where min_val < input < max_val, 0 elsewhere (at the bounds too).",
)
define(
    "hardswish(input: Tensor) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.activation("hardswish"),
    doc="input * min(max(input + 3, 0), 6) / 6, in the input's layout.",
)
define(
    "hardswish_backward(grad: Tensor, input: Tensor) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="0 where input <= -3, grad * (input / 3 + 1 / 2) where input < 3, grad elsewhere.",
)
define(
    "binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None "
    "= None, reduction: str = 'mean', pos_weight: Tensor | None = None) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.binary_cross_entropy_with_logits,
    doc="weight ((1 - target) input - l log(sigmoid(input))), l = 1 + (pos_weight - 1) "
    "target, without overflow (log(sigmoid(x)) = min(x, 0) - log1p(exp(-abs(x)))), reduced "
    "by 'mean', 'sum' or 'none'; weight and pos_weight broadcast to the input (no "
    "gradient for them).",
)
define(
    "smooth_l1_loss(input: Tensor, target: Tensor, reduction: str = 'mean', beta: float "
    "= 1.0) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=NN,
    check=meta.smooth_l1_loss,
    doc="0.5 d ** 2 / beta where abs(d) < beta, abs(d) - 0.5 beta elsewhere (d = input - "
    "target; beta=0: abs(d)), reduced by 'mean', 'sum' or 'none'.",
)
define(
    "smooth_l1_loss_backward(grad: Tensor, input: Tensor, target: Tensor, reduction: str, "
    "beta: float) -> Tensor",
    "nn",
    dtypes=FLOATING,
    tags=DIFF,
    namespace=None,
    doc="smooth_l1_loss's gradient with respect to input (target's is its negative): "
    "grad (divided by the number of elements for 'mean') times d / beta where abs(d) < "
    "beta, sign(d) elsewhere.",
)
define(
    "to_layout(input: Tensor, layout: str) -> Tensor",
    "view",
    tags=f"view {DIFF}",
    namespace=NN,
    check=meta.to_layout,
    doc="The 4-D input in memory layout 'NCHW' (contiguous) or 'NHWC' (channels-last "
    "strides), same logical shape; the input's storage when it is in that layout already.",
)

# ---------------------------------------------------------------- creation
# Dispatched on the key of the requested device; the public functions (zeros, full,
# asarray, ...) are in composites.py.
define(
    "full(shape: Shape, fill_value: Any, dtype: DType, device: Device) -> Tensor",
    "creation",
    result="arg",
    namespace=None,
    doc="A tensor filled with fill_value.",
)
define(
    "empty(shape: Shape, dtype: DType, device: Device) -> Tensor",
    "creation",
    result="arg",
    namespace=None,
    doc="A tensor with uninitialized values.",
)
define(
    "arange(start: Any, stop: Any, step: Any, dtype: DType, device: Device) -> Tensor",
    "creation",
    result="arg",
    namespace=None,
    doc="Evenly spaced values in [start, stop).",
)
define(
    "linspace(start: Any, stop: Any, num: int, dtype: DType, device: Device, "
    "endpoint: bool) -> Tensor",
    "creation",
    result="arg",
    namespace=None,
    doc="num evenly spaced values from start to stop.",
)
define(
    "eye(n_rows: int, n_cols: int, k: int, dtype: DType, device: Device) -> Tensor",
    "creation",
    result="arg",
    namespace=None,
    doc="Ones on the k-th diagonal, zeros elsewhere.",
)
define(
    "from_host(data: Any, dtype: DType, device: Device) -> Tensor",
    "creation",
    result="arg",
    namespace=None,
    doc="A tensor of the device holding a NumPy array's values (the CPU keeps the array itself).",
)
define(
    "rand(shape: Shape, dtype: DType, device: Device, generator: Any) -> Tensor",
    "creation",
    dtypes="float",
    result="arg",
    namespace=None,
    writes="generator",  # its state advances
    doc="Uniform samples in [0, 1).",
)
define(
    "randn(shape: Shape, dtype: DType, device: Device, generator: Any) -> Tensor",
    "creation",
    dtypes="float",
    result="arg",
    namespace=None,
    writes="generator",  # its state advances
    doc="Standard normal samples.",
)

# ---------------------------------------------------------------- Array API 2024.12
# (issue 15) the functions the standard added up to 2024.12 that are operators; the
# composite ones (meshgrid, tril, take, roll, ...) are in composites.py.
unary("reciprocal", "float", "1 / x for each element.", tags=SIMD)
binary(
    "nextafter",
    "real_float",
    "The next representable value after x1 in the direction of x2.",
    tags="",
    inplace=False,
)
SCANNED = "axis: int | None = None, dtype: DType | None = None, include_initial: bool = False"
define(
    f"cumulative_sum(x: Tensor, /, *, {SCANNED}) -> Tensor",
    "scan",
    result="sum",
    tags=DIFF,
    numpy="cumsum",
    check=meta.cumulative("cumulative_sum"),
    doc="The running sum along axis (optional for 1-D x), accumulated as sum does; "
    "``include_initial`` starts the result with 0.",
)
define(
    f"cumulative_prod(x: Tensor, /, *, {SCANNED}) -> Tensor",
    "scan",
    result="sum",
    tags=DIFF,
    numpy="cumprod",
    check=meta.cumulative("cumulative_prod"),
    doc="The running product along axis (optional for 1-D x); ``include_initial`` "
    "starts the result with 1.",
)
SORTED = "axis: Axis = -1, descending: bool = False, stable: bool = True"
define(
    f"sort(x: Tensor, /, *, {SORTED}) -> Tensor",
    "sorting",
    dtypes="real",
    tags=DIFF,
    doc="x's elements sorted along axis (stably; NaNs last, or first when descending).",
)
define(
    f"argsort(x: Tensor, /, *, {SORTED}) -> Tensor",
    "sorting",
    dtypes="real",
    result="index",
    doc="The indices that sort x along axis (ties keep their order: the sort is stable).",
)
define(
    "searchsorted(x1: Tensor, x2: TensorOrScalar, /, *, side: Any = 'left', "
    "sorter: Tensor | None = None) -> Tensor",
    "searching",
    dtypes="real",
    result="index",
    check=meta.searchsorted,
    doc="Where each element of x2 would be inserted into the sorted 1-D x1 (before "
    "equal elements with side='left', after them with 'right'); ``sorter`` sorts x1.",
)
define(
    "nonzero(x: Tensor, /) -> Any",
    "searching",
    result="index",
    check=meta.at_least_1d("nonzero"),
    doc="A tuple of index tensors, one per axis, of the nonzero elements in row-major order.",
)
define(
    "unique_all(x: Tensor, /) -> Any",
    "set",
    doc="The sorted unique values of x with the index of each one's first occurrence, "
    "the inverse indices (x's shape) and the counts; NaNs are each distinct.",
)
define(
    "unique_counts(x: Tensor, /) -> Any",
    "set",
    doc="The sorted unique values of x and how often each occurs.",
)
define(
    "unique_inverse(x: Tensor, /) -> Any",
    "set",
    doc="The sorted unique values of x and, in x's shape, the index of each element's value.",
)
define(
    "unique_values(x: Tensor, /) -> Tensor",
    "set",
    doc="The sorted unique values of x (NaNs are each distinct).",
)

# ---------------------------------------------------------------- lamina.linalg
# (issue 15) the Array API's linear algebra extension: LAPACK through NumPy on the
# CPU; the composite functions (matrix_norm, pinv, matrix_rank, matrix_power, outer,
# trace, cross) are in dispatch/linalg.py, which also re-exports matmul, tensordot,
# vecdot and matrix_transpose.
LINALG = dict(category="linalg", dtypes="float", namespace="linalg")
define(
    "cholesky(x: Tensor, /, *, upper: bool = False) -> Tensor",
    tags=DIFF,
    check=meta.square("cholesky"),
    doc="The Cholesky factor of each symmetric positive-definite matrix: lower "
    "triangular L with x = L @ L.mT (upper: U = L.mT). LinAlgError when x is not "
    "positive definite.",
    **LINALG,
)
define(
    "det(x: Tensor, /) -> Tensor",
    tags=DIFF,
    check=meta.square("det"),
    doc="The determinant of each square matrix.",
    **LINALG,
)
define(
    "slogdet(x: Tensor, /) -> Any",
    tags=DIFF,
    check=meta.square("slogdet"),
    doc="(sign, logabsdet) of the determinant of each square matrix; a singular "
    "matrix gives sign 0 and logabsdet -inf.",
    **LINALG,
)
define(
    "inv(x: Tensor, /) -> Tensor",
    tags=DIFF,
    check=meta.square("inv"),
    doc="The inverse of each square matrix; LinAlgError for a singular one.",
    **LINALG,
)
define(
    "solve(x1: Tensor, x2: Tensor, /) -> Tensor",
    tags=DIFF,
    check=meta.solve,
    doc="The solution X of x1 @ X = x2 for square x1 (x2 of shape (M,) is a vector); "
    "batches broadcast. LinAlgError for a singular x1.",
    **LINALG,
)
define(
    "eigh(x: Tensor, /) -> Any",
    tags=DIFF,
    check=meta.square("eigh"),
    doc="(eigenvalues, eigenvectors) of each symmetric matrix, eigenvalues ascending; "
    "only the lower triangle is read.",
    **LINALG,
)
define(
    "eigvalsh(x: Tensor, /) -> Tensor",
    result="real",
    tags=DIFF,
    check=meta.square("eigvalsh"),
    doc="The eigenvalues of each symmetric matrix, ascending.",
    **LINALG,
)
define(
    "qr(x: Tensor, /, *, mode: Any = 'reduced') -> Any",
    tags=DIFF,
    check=meta.qr,
    doc="(Q, R) with x = Q @ R, Q orthonormal columns and R upper triangular; "
    "mode 'reduced' (K = min(M, N) columns) or 'complete'.",
    **LINALG,
)
define(
    "svd(x: Tensor, /, *, full_matrices: bool = True) -> Any",
    tags=DIFF,
    check=meta.at_least_2d("svd"),
    doc="(U, S, Vh) with x = U @ diag(S) @ Vh, S descending; full_matrices=False "
    "keeps K = min(M, N) columns of U and rows of Vh.",
    **LINALG,
)
define(
    "svdvals(x: Tensor, /) -> Tensor",
    result="real",
    tags=DIFF,
    check=meta.at_least_2d("svdvals"),
    doc="The singular values of each matrix, descending.",
    **LINALG,
)
define(
    "diagonal(x: Tensor, /, *, offset: int = 0) -> Tensor",
    "view",
    tags=f"view {DIFF}",
    check=meta.at_least_2d("diagonal"),
    namespace="linalg",
    doc="A read-only view of the offset-th diagonal of each matrix (the last two axes).",
)
define(
    "vector_norm(x: Tensor, /, *, axis: Axes = None, keepdims: bool = False, "
    "ord: Any = 2) -> Tensor",
    "reduction",
    dtypes="float",
    result="real",
    tags=DIFF,
    check=meta.vector_norm,
    namespace="linalg",
    doc="The ord-norm of the vectors along axis (every axis by default): "
    "(sum |x|**ord)**(1/ord); inf and -inf give the largest and smallest |x|, 0 the "
    "number of nonzeros.",
)

# ---------------------------------------------------------------- lamina.fft
# (issue 15) the Array API's Fourier transform extension: pocketfft through NumPy on
# the CPU; the sample frequencies and the shifts are composites in dispatch/fft.py.
# Complex input for fft, ifft, fftn, ifftn, irfft, irfftn and hfft (real input is
# promoted to the complex dtype of its precision, as in NumPy); real input for rfft,
# rfftn and ihfft. The checks resolve n, s and axes (Note [FFT arguments]).
FFT1 = "(x: Tensor, /, *, n: int | None = None, axis: int = -1, norm: Any = 'backward')"
FFTN = "(x: Tensor, /, *, s: Any = None, axes: Any = None, norm: Any = 'backward')"
_FFT_DOCS = {
    "fft": ("float", "complex", "The one-dimensional discrete Fourier transform along axis."),
    "ifft": ("float", "complex", "The one-dimensional inverse discrete Fourier transform."),
    "fftn": ("float", "complex", "The n-dimensional discrete Fourier transform over axes."),
    "ifftn": ("float", "complex", "The n-dimensional inverse discrete Fourier transform."),
    "rfft": (
        "real_float",
        "complex",
        "The discrete Fourier transform of real input: the n // 2 + 1 non-negative frequencies.",
    ),
    "irfft": (
        "float",
        "real",
        "The inverse of rfft: a real signal of n (default 2 * (M - 1)) samples.",
    ),
    "rfftn": (
        "real_float",
        "complex",
        "The n-dimensional transform of real input (the last axis keeps s[-1] // 2 + 1).",
    ),
    "irfftn": ("float", "real", "The inverse of rfftn: a real signal of shape s."),
    "hfft": (
        "float",
        "real",
        "The transform of a signal with Hermitian symmetry (x its first half): real.",
    ),
    "ihfft": (
        "real_float",
        "complex",
        "The inverse of hfft: the n // 2 + 1 first frequencies of a real signal's "
        "inverse transform.",
    ),
}
for _name, (_dtypes, _result, _doc) in _FFT_DOCS.items():
    _nd = _name.endswith("n")
    define(
        f"{_name}{FFTN if _nd else FFT1} -> Tensor",
        "fft",
        dtypes=_dtypes,
        result=_result,
        tags=DIFF,
        namespace="fft",
        check=(meta.fftn if _nd else meta.fft1)(_name),
        doc=_doc + (" s[i] = -1 keeps axis i's size." if _nd else ""),
    )
