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
MAX_KEYS = 24  # backend keys, SPARSE, AUTOGRAD and the layer keys above it


def register_layer_key(name):
    """The key of layer ``name`` above AUTOGRAD (a tracer's, a profiler's), allocating
    the next free bit on first use. A call reaches it only when a mode includes it
    (Note [Modes] in ``modes.py``); an operator without a kernel for it falls through
    (Note [Table entry precedence])."""
    if name not in LAYER_KEYS:
        key = max(LAYER_KEYS.values()) << 1
        if key >= 1 << MAX_KEYS:
            raise RuntimeError(f"cannot register layer key {name!r}: all layer keys are taken")
        LAYER_KEYS[name] = key
    return LAYER_KEYS[name]


def unregister_layer_key(name):
    """Forget a layer key of ``register_layer_key`` (no tensor carries one: modes add
    them to calls only); the tables drop its slot at their next rebuild."""
    if name in ("sparse", "autograd"):
        raise ValueError(f"the {name} layer key cannot be unregistered")
    LAYER_KEYS.pop(name, None)


def falls_through(key):
    """Whether a layer key without a kernel passes calls to the keys below it: every
    layer's but SPARSE's (a sparse tensor never reaches a dense kernel silently)."""
    return key > BACKEND_MASK and key != SPARSE


def layer_of(key):
    """The name of the layer whose key is ``key``, or None for a backend key."""
    for name, bit in LAYER_KEYS.items():
        if bit == key:
            return name
    return None


_backend_bits = {}  # active device name -> bit; filled by register_device
_reserved = {}  # every device name ever registered -> its bit (Note [Device keys])


def register_device(name):
    """The backend key of device ``name``, allocating the next free bit on first use.

    Note [Device keys]: a bit, once given to a device name, is never given to another
    name, even after ``unregister_device``: tensors of an unregistered device may still
    exist, and their key must not route them to a stranger's kernels. Registering the
    same name again gets its old bit back."""
    if name not in _backend_bits:
        if name not in _reserved:
            if len(_reserved) == MAX_BACKENDS:
                raise RuntimeError(
                    f"cannot register device {name!r}: all {MAX_BACKENDS} "
                    f"backend keys are taken by {sorted(_reserved)}"
                )
            _reserved[name] = 1 << len(_reserved)
        _backend_bits[name] = _reserved[name]
    return _backend_bits[name]


def unregister_device(name):
    """Make ``name`` unknown again (its bit stays reserved for it, Note [Device keys])."""
    if name == "cpu":
        raise ValueError("the cpu device cannot be unregistered")
    _backend_bits.pop(name, None)


CPU = register_device("cpu")


def device_key(name):
    """The backend key of a registered device; ValueError naming the known ones."""
    try:
        return _backend_bits[name]
    except KeyError:
        raise ValueError(
            f"unknown device {name!r}; known devices: {', '.join(_backend_bits)}"
        ) from None


def is_device(name):
    """Whether ``name`` is a registered device."""
    return name in _backend_bits


def devices():
    """Active device names, lowest key (priority) first."""
    return sorted(_backend_bits, key=_backend_bits.get)


def device_names(ks):
    """The device names of the backend bits in ``ks`` (unregistered ones too)."""
    return [n for n, b in sorted(_reserved.items(), key=lambda nb: nb[1]) if b & ks]


def key_name(bit):
    """A readable name for a single key bit."""
    for name, b in LAYER_KEYS.items():
        if b == bit:
            return name.capitalize()
    for name, b in _reserved.items():
        if b == bit:
            return name.upper() if name == "cpu" else name
    return f"key{bit.bit_length() - 1}"


def all_keys():
    """Every key that has a name, lowest priority first."""
    return [*sorted(_backend_bits.values()), *sorted(LAYER_KEYS.values())]


def keyset_names(ks):
    return [key_name(1 << i) for i in range(ks.bit_length()) if ks >> i & 1]
