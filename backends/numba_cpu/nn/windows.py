"""Window arithmetic of convolution and pooling along one spatial axis, as small int64
tables the kernels read (computed here in NumPy, so that no kernel tests a bound per
element).

Note [Shared window tables]: each table is made once per geometry, and the same
arrays are returned to every later call (a bounded ``functools.lru_cache``). Made on
every call, the NumPy operations on a few elements took ~10 us a table: 0.12 ms of a
compiled Inception's 1 ms at batch 1. So callers only read them (the kernels take
writable arrays, so the tables cannot be marked read-only).

Window ``o`` along an axis of ``size`` covers the taps ``t`` in [0, kernel) at input
positions ``o * stride - pad + t * dilation``; the positions outside [0, size) are
padding.
"""

import functools

import numpy as np


@functools.lru_cache(maxsize=1024)  # Note [Shared window tables]
def tap_ranges(size, out, kernel, stride, pad, dilation):
    """(lo, hi), one entry per tap t: the windows o in [lo[t], hi[t]) whose tap t falls
    inside the input (an empty range is lo == hi)."""
    lo, hi = [], []
    for t in range(kernel):  # Python ints: NumPy's clip cost more than a small convolution
        off = t * dilation - pad  # position of tap t in window 0
        lo.append(min(max(-(off // stride), 0), out))  # ceil(-off / stride)
        hi.append(min(max((size - 1 - off) // stride + 1, lo[-1]), out))
    return np.array(lo, np.int64), np.array(hi, np.int64)


@functools.lru_cache(maxsize=1024)  # Note [Shared window tables]
def windows(size, out, kernel, stride, pad, dilation):
    """(first, count), one entry per window: the input position of its first tap
    inside the input and how many of its taps are (dilation apart)."""
    start = np.arange(out, dtype=np.int64) * stride - pad
    t_lo = np.maximum(0, -(start // dilation))
    t_hi = np.minimum(kernel, (size - 1 - start) // dilation + 1)
    return start + t_lo * dilation, np.maximum(t_hi - t_lo, 0)


@functools.lru_cache(maxsize=1024)  # Note [Shared window tables]
def adaptive_windows(size, out):
    """(first, count) of adaptive pooling's windows [floor(o size / out),
    ceil((o + 1) size / out))."""
    o = np.arange(out, dtype=np.int64)
    first = o * size // out
    return first, ((o + 1) * size + out - 1) // out - first


@functools.lru_cache(maxsize=1024)  # Note [Shared window tables]
def avg_scale(h, w, ho, wo, kernel, stride, padding, count_include_pad, divisor_override):
    """1 / divisor of each window of avg_pool2d (PyTorch's rule: the window clipped to
    the padded input counts with count_include_pad, else only its part inside the
    input; divisor_override replaces both)."""
    if divisor_override is not None:
        return np.full((ho, wo), 1.0 / divisor_override)
    sizes = []
    for size, out, k, s, p in zip((h, w), (ho, wo), kernel, stride, padding):
        start = np.arange(out) * s - p
        end = np.minimum(start + k, size + p)
        if count_include_pad:
            sizes.append(end - start)
        else:
            sizes.append(np.minimum(end, size) - np.maximum(start, 0))
    return 1.0 / np.outer(sizes[0], sizes[1])
