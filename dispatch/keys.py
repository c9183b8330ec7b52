"""Dispatch keys: one bit each; a higher bit has higher priority.

Note [Key priority]: a call is routed by the highest set bit of its key set, so layer
keys sit above backend keys. Backend (device) keys take the low bits; CPU is bit 0, the
lowest of all, so a CPU kernel is only ever reached when every input is on the CPU: a
tensor of any other device raises the highest backend bit and takes the call to its
own device's kernel (which is where device mismatches are detected). Keys above
AUTOGRAD are free for later layers (tracing, profiling).
"""

MAX_BACKENDS = 16  # bits 0..15 are backend keys
SPARSE = 1 << MAX_BACKENDS
AUTOGRAD = SPARSE << 1
LAYER_KEYS = {"sparse": SPARSE, "autograd": AUTOGRAD}
BACKEND_MASK = SPARSE - 1

_backend_bits = {}  # device name -> bit; filled by register_device


def register_device(name):
    """The backend key of device ``name``, allocating the next free bit on first use."""
    if name not in _backend_bits:
        if len(_backend_bits) == MAX_BACKENDS:
            raise RuntimeError(f"cannot register device {name!r}: all {MAX_BACKENDS} "
                               f"backend keys are taken by {sorted(_backend_bits)}")
        _backend_bits[name] = 1 << len(_backend_bits)
    return _backend_bits[name]


CPU = register_device("cpu")


def device_key(name):
    """The backend key of a registered device; ValueError naming the known ones."""
    try:
        return _backend_bits[name]
    except KeyError:
        raise ValueError(f"unknown device {name!r}; known devices: "
                         f"{', '.join(_backend_bits)}") from None


def devices():
    return list(_backend_bits)


def key_name(bit):
    """A readable name for a single key bit."""
    for name, b in LAYER_KEYS.items():
        if b == bit:
            return name.capitalize()
    for name, b in _backend_bits.items():
        if b == bit:
            return name.upper() if name == "cpu" else name
    return f"key{bit.bit_length() - 1}"


def all_keys():
    """Every key that has a name, lowest priority first."""
    return [*_backend_bits.values(), SPARSE, AUTOGRAD]


def keyset_names(ks):
    return [key_name(1 << i) for i in range(ks.bit_length()) if ks >> i & 1]
