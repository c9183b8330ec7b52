"""The float32 precision of the CPU kernels (``lm.set_float32_matmul_precision``),
process-wide, with PyTorch's names and values.

Note [Float32 precision]: at "highest", the default, every float32 result comes from an
algorithm whose rounding error is that of the direct sum: within 3x PyTorch's own
float32 error against a float64 reference (tests/test_precision.py asserts it for
convolutions and their gradients, matmul and reductions). A 3x3 stride-1 convolution
then runs by Winograd's F(2x2, 3x3), whose transforms add and subtract and whose filter
transform is computed in float64 (winograd.py). At "high" (and "medium", which
lamina treats as "high") float32 convolutions may trade precision for speed:
F(4x4, 3x3), F(3x3, 4x4) and F(2x2, 5x5), whose transforms multiply by up to 8 and
1/24 and give ~10x the error. float64 results use the fast algorithms at every
setting (their error stays below 1e-14); ``LAMINA_WINOGRAD=0`` turns Winograd off at
every setting. docs/performance.md, "Float32 precision", has each setting's error and
speed.
"""

PRECISIONS = ("highest", "high", "medium")

_precision = "highest"


def set_float32_matmul_precision(precision: str) -> None:
    """Set how exact float32 convolutions are, process-wide: "highest" (the default:
    as exact as the direct sum, as PyTorch's), "high" or "medium" (faster algorithms
    with ~10x the rounding error; lamina treats both alike). Matrix products run in
    float32 BLAS at every setting. Note [Float32 precision]."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(
            f"set_float32_matmul_precision: precision must be one of "
            f"{', '.join(map(repr, PRECISIONS))}, got {precision!r}"
        )
    global _precision
    _precision = precision


def get_float32_matmul_precision() -> str:
    """The current float32 precision: "highest", "high" or "medium"."""
    return _precision


def fast_float32() -> bool:
    """Whether float32 kernels may use their faster, less exact algorithms."""
    return _precision != "highest"
