"""meta — the meta device: tensors with a dtype, shape, device and memory layout, and
no storage (PyTorch's meta tensors, JAX's abstract values).

Every operator on a meta tensor runs only its description (``results.describe``, Note
[Result rules] and Note [Result layouts]) after the argument checks every call makes:
nothing is computed or allocated, so a program's shapes, dtypes and layouts can be
checked, and its memory planned, at any size in no time. The device has no kernels:
its fallback serves every operator. An operator whose result shape depends on values
(``nonzero``, ``unique_*``, a boolean mask) refuses, as does reading a value
(``item``, ``numpy``, moving to another device). Moving a tensor to ``"meta"`` keeps
its layout.
"""

from lamina.backends.fallback import new_tensor
from lamina.backends.hookspecs import hookimpl
from lamina.dispatch import result_types, results
from lamina.dispatch.layouts import MetaStorage, strides_of

DEVICE = "meta"
# the named tuples of the operators with several results (split and the nn operators
# return plain tuples)
_NAMED = {
    "eigh": result_types.EighResult,
    "qr": result_types.QRResult,
    "svd": result_types.SVDResult,
    "slogdet": result_types.SlogdetResult,
    "unique_all": result_types.UniqueAllResult,
    "unique_counts": result_types.UniqueCountsResult,
    "unique_inverse": result_types.UniqueInverseResult,
}


# A hook a tracer sets (Note [Tracing] in lamina.jit): called with a meta tensor whose
# values are asked for, it returns a CPU tensor with them, or None to refuse as usual.
on_read = None


def _no_values(t):
    if on_read is not None:
        values = on_read(t)
        if values is not None:
            return values
    raise RuntimeError(
        f"a meta tensor (shape {t.shape}, {t.dtype}) has no values to read or move; "
        "meta tensors only describe results"
    )


def _from_cpu(t):
    return new_tensor(MetaStorage(strides_of(t)), DEVICE, t.dtype, t.shape)


def run_description(op, ks, *args):
    """The fallback of the meta device: the results ``op``'s description gives."""
    if "inplace" in op.tags:
        return args[0]  # written in place: nothing changes but the values it lacks
    described = results.describe(op, ks, args)
    if any(d.shape is None for d in described):
        raise NotImplementedError(
            f"{op.name}: the shape of its result depends on the values, which meta "
            "tensors do not have"
        )
    outs = [new_tensor(MetaStorage(d.strides), DEVICE, d.dtype, d.shape) for d in described]
    if op.name in _NAMED:
        return _NAMED[op.name](*outs)
    return outs[0] if op.returns == "Tensor" else tuple(outs)


@hookimpl
def lamina_register_kernels(registry):
    # no decompositions: a description is the whole of every operator here
    registry.add_device(
        DEVICE, to_cpu=_no_values, from_cpu=_from_cpu, shares_memory=False, decompositions=False
    )
    registry.register_fallback(DEVICE, run_description)
