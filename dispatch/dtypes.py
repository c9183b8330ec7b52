"""lamina's data types, type promotion and dtype introspection (Array API 2024.12).

A lamina dtype is a small object that names a NumPy dtype for CPU storage. Promotion
between two tensors follows the Array API lattice (no value-based casting); where the
standard leaves mixed kinds open (bool with int, int with float or complex, int64 with
uint64) we follow NumPy 2, so results match the NumPy reference backend.
"""

import numpy as np

from . import core


class DType:
    """A tensor element type. Compare with ``==`` or ``is``; both mean the same."""

    __slots__ = ("name", "np", "index", "kind")

    def __init__(self, name, index, kind):
        self.name = name
        self.np = np.dtype(name)
        self.index = index  # position in ALL: kernels keep per-dtype lists indexed by it
        # "b" bool, "i" signed, "u" unsigned, "f" real floating, "c" complex floating
        self.kind = kind

    def __repr__(self):
        return f"lamina.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))

    @property
    def itemsize(self):
        return self.np.itemsize

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype: NumPy reads ``.dtype`` off an object it is given as a dtype,
        so lamina's dtypes work there too (``np.zeros(3, dtype=lm.float32)``,
        ``a.astype(x.dtype)``), as their ``kind`` suggests to NumPy-minded code."""
        return self.np


_NAMES = [
    ("bool", "b"),
    ("int8", "i"),
    ("int16", "i"),
    ("int32", "i"),
    ("int64", "i"),
    ("uint8", "u"),
    ("uint16", "u"),
    ("uint32", "u"),
    ("uint64", "u"),
    ("float32", "f"),
    ("float64", "f"),
    ("complex64", "c"),
    ("complex128", "c"),
]
ALL = tuple(DType(name, i, kind) for i, (name, kind) in enumerate(_NAMES))
(
    bool_,
    int8,
    int16,
    int32,
    int64,
    uint8,
    uint16,
    uint32,
    uint64,
    float32,
    float64,
    complex64,
    complex128,
) = ALL
BY_NAME = {d.name: d for d in ALL}
_FROM_NUMPY = {d.np: d for d in ALL}
default_int = int64
default_uint = uint64
# Note [Default dtype]: the default floating dtype is float32, as PyTorch's, so that
# lm.randn, lm.zeros, Python floats in lm.asarray, integers promoted to floating and
# module parameters agree with float32 data and the float32 kernels; set_default_dtype
# changes it (and the default complex dtype with it). Readers look these globals up at
# call time, never keep a copy.
default_float = float32
default_complex = complex64


def set_default_dtype(dtype):
    """Make ``dtype`` (float32 or float64) the default floating dtype, as PyTorch's
    ``torch.set_default_dtype``; the default complex dtype follows its precision."""
    global default_float, default_complex
    dtype = as_dtype(dtype)
    if dtype not in (float32, float64):
        raise TypeError(f"set_default_dtype: only float32 or float64, got {dtype}")
    default_float, default_complex = dtype, COMPLEX_OF[dtype]


def get_default_dtype():
    """The default floating dtype (float32 unless set_default_dtype said otherwise)."""
    return default_float


# Note [Complex dtypes]: a complex dtype is a pair of the real floating dtype of its
# precision; REAL_OF gives that real dtype (abs, real, imag, var, svdvals and eigvalsh
# of a complex tensor have it), COMPLEX_OF the complex dtype of a floating one (fft,
# a Python complex scalar with a float32 tensor). Other dtypes map to themselves.
REAL_OF = {complex64: float32, complex128: float64}
COMPLEX_OF = {float32: complex64, float64: complex128, complex64: complex64, complex128: complex128}


def real_of(dtype):
    """The real floating dtype of a complex one's precision (other dtypes unchanged)."""
    return REAL_OF.get(dtype, dtype)


def complex_of(dtype):
    """The complex dtype of a floating dtype's precision (the default complex dtype for
    the others)."""
    return COMPLEX_OF.get(dtype, default_complex)


def _by_name(name):
    return BY_NAME[name]


def from_numpy(np_dtype):
    """The lamina dtype for a NumPy dtype; TypeError naming it when lamina has none."""
    try:
        return _FROM_NUMPY[np_dtype]
    except KeyError:
        d = np.dtype(np_dtype)
        native = d.newbyteorder("=")  # '>i4' != '<i4' as dtypes: compare in native order
        if native in _FROM_NUMPY:  # e.g. a non-native byte order or a type object
            return _FROM_NUMPY[native]
        raise TypeError(
            f"unsupported dtype {d}: lamina supports {', '.join(x.name for x in ALL)}"
        ) from None


def as_dtype(dtype):
    """Normalize a user-given dtype (lamina dtype, NumPy dtype, name or Python type)."""
    if isinstance(dtype, DType):
        return dtype
    if dtype is bool:
        return bool_
    if dtype is int:
        return default_int
    if dtype is float:
        return default_float
    try:
        return from_numpy(np.dtype(dtype))
    except TypeError as exc:
        raise TypeError(
            f"unsupported dtype {dtype!r}: lamina supports {', '.join(x.name for x in ALL)}"
        ) from exc


# Note [Promotion table]: result_type of two dtypes is a list lookup, PROMOTE[a][b],
# computed once from NumPy 2's rules, which agree with the Array API lattice wherever
# the standard defines a result.
PROMOTE = [[from_numpy(np.promote_types(a.np, b.np)) for b in ALL] for a in ALL]


PY_SCALAR_TYPES = (bool, int, float, complex)


def weak_kind(value):
    """The kind of a Python scalar: "b", "i", "f" or "c"."""
    if isinstance(value, bool):
        return "b"
    return "i" if isinstance(value, int) else "f" if isinstance(value, float) else "c"


def promote_weak(dtype, value):
    """Note [Weak scalars]: a Python scalar takes the dtype it meets when its kind fits
    (Array API, NEP 50): ``int8 + 1`` is int8, ``float32 + 1.5`` float32, ``float32 +
    1j`` complex64 (the complex dtype of its precision). Where it does not fit, the
    kind's default (NumPy 2): ``int + 1.5`` is float64, ``int + 1j`` complex128,
    ``bool + 1`` int64."""
    kind = weak_kind(value)
    if kind == "i" and dtype.kind == "b":
        return default_int
    if kind == "f" and dtype.kind not in "fc":
        return default_float
    if kind == "c" and dtype.kind != "c":
        return complex_of(dtype)
    return dtype


def result_type(*arrays_and_dtypes):
    """Array API ``result_type``: the promoted dtype of tensors and dtypes; Python
    scalars among them are weak (Note [Weak scalars], 2024.12)."""
    dtypes = [x for x in arrays_and_dtypes if type(x) not in PY_SCALAR_TYPES]
    if not dtypes:
        raise ValueError("result_type() needs at least one tensor or dtype")
    result = None
    for x in dtypes:
        d = x.dtype if hasattr(x, "_ks") else as_dtype(x)
        result = d if result is None else PROMOTE[result.index][d.index]
    for x in arrays_and_dtypes:
        if type(x) in PY_SCALAR_TYPES:
            result = promote_weak(result, x)
    return result


def can_cast(from_, to, /):
    """Whether ``from_`` promotes to ``to`` without changing kind or losing values."""
    f = from_.dtype if hasattr(from_, "_ks") else as_dtype(from_)
    return PROMOTE[f.index][as_dtype(to).index] is as_dtype(to) and (
        f.kind == "b" or as_dtype(to).kind != "b"
    )


_KINDS = {
    "bool": "b",
    "signed integer": "i",
    "unsigned integer": "u",
    "integral": "iu",
    "real floating": "f",
    "complex floating": "c",
    "numeric": "iufc",
}


def isdtype(dtype, kind):
    """Array API ``isdtype``: is ``dtype`` of ``kind`` (a dtype, a kind name or a tuple)."""
    dtype = as_dtype(dtype)
    if isinstance(kind, tuple):
        return any(isdtype(dtype, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"unknown dtype kind {kind!r}; valid kinds: {', '.join(_KINDS)}")
        return dtype.kind in _KINDS[kind]
    return dtype is as_dtype(kind)


class finfo_object:
    __slots__ = ("bits", "eps", "max", "min", "smallest_normal", "dtype")

    def __repr__(self):
        return (
            f"finfo(bits={self.bits}, eps={self.eps}, max={self.max}, min={self.min}, "
            f"smallest_normal={self.smallest_normal}, dtype={self.dtype})"
        )


class iinfo_object:
    __slots__ = ("bits", "max", "min", "dtype")

    def __repr__(self):
        return f"iinfo(bits={self.bits}, max={self.max}, min={self.min}, dtype={self.dtype})"


def _dtype_of(type_or_tensor):
    return type_or_tensor.dtype if hasattr(type_or_tensor, "_ks") else as_dtype(type_or_tensor)


def finfo(type, /):
    """Machine limits of a floating dtype (Array API ``finfo``); a complex dtype gives
    those of its real and imaginary parts (``finfo(complex64).dtype`` is float32)."""
    d = _dtype_of(type)
    if d.kind not in "fc":
        raise TypeError(f"finfo needs a floating dtype, got {d}")
    d = real_of(d)
    info, r = np.finfo(d.np), finfo_object()
    r.bits, r.eps, r.max, r.min = info.bits, float(info.eps), float(info.max), float(info.min)
    r.smallest_normal, r.dtype = float(info.smallest_normal), d
    return r


def iinfo(type, /):
    """Machine limits of an integer dtype (Array API ``iinfo``)."""
    d = _dtype_of(type)
    if d.kind not in "iu":
        raise TypeError(f"iinfo needs an integer dtype, got {d}")
    info, r = np.iinfo(d.np), iinfo_object()
    r.bits, r.max, r.min, r.dtype = info.bits, int(info.max), int(info.min), d
    return r


core.set_dtypes(ALL)  # the C core's fast path reads dtypes by index
