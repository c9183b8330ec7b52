"""The filter cache: what convolutions make of a weight, kept while the weight does not
change (Note [Filter cache])."""

import weakref

import numpy as np

from lamina.dispatch.tensor import seal_array, stamp_of

# Note [Filter cache]: Winograd's filter transform is most of a small convolution's time
# in inference (measured one thread, 128 -> 64 channels 3 x 3: 402 us, against 6.5 us to
# compare the weight with a copy), and the weights rarely change between calls. So the
# last transforms (and the other convolutions' rearranged weights: space-to-depth,
# flipped, tap-major, channels-last and direct) are kept with a copy of the weight they
# came from, keyed by the weight's memory, and served again only while its bits equal
# the copy's: by content, so a write through a NumPy view of the weight is seen as well
# as any lamina operation. A weight that changed since the last call, as in training,
# keeps only its copy: its results would not be served, except those asked for again
# before the weight changes (``reused``: the tap-major weight of Note [Taps inside tiny
# planes] in conv.py, which the input gradient takes after the forward). At most
# FILTER_CACHE_BYTES (copies and results) stay, the copies without a result going first,
# then the entries served longest ago: so a model trained between inferences of another,
# or of its own copy, does not evict the other's transforms. A ResNet-18's take 101 MB
# in inference at batch 32 (32 x 32 images; its 512-channel layers' U is 16.8 MB each,
# Note [Steady filters] in winograd.py), and a cache smaller than a model's transforms
# serves none of them (each call evicts the entry the next one needs): the
# reference-model bench's four models, each trained and run for inference in one
# process, hold 416 MB, and with 256 MB its ResNet-18 inference on 32 x 32 images took
# 204 ms a batch of 32 instead of 137 (two threads), its filters evicted and made again
# on every call. A module parameter's weight is not copied or compared: its storage's
# stamp (Note [Sealed storages] in lamina.dispatch.tensor) stands for its values, so an
# entry keeps the stamp instead of a copy. Comparing and copying took ~9 ms of a
# ResNet-18 training step at batch 32 on 64 x 64 images and ~4 ms of its inference (45
# MB of weights, two threads).
FILTER_CACHE_BYTES = 512 << 20
_prepared: dict = {}  # (address, shape, strides, dtype, tag) -> (w's copy or stamp, result)


def prepared(w, tag, build, steady=False, reused=False):
    """``build(w)``, made again only when w's values changed (Note [Filter cache]);
    ``tag`` names what ``build`` makes of a weight. With ``steady``, not made before w
    was seen unchanged from one call to the next: None until then (Note [Steady
    filters]). With ``reused``, kept even when w changed since the last call: asked for
    again before w changes next."""
    key = (w.__array_interface__["data"][0], w.shape, w.strides, w.dtype, tag)
    stamp = stamp_of(w)
    hit = _prepared.get(key)
    if hit is None:  # first seen
        copy, result = _reference(w, stamp), None if steady else build(w)
        kept = result
    elif _unchanged(hit[0], w, stamp):
        if hit[1] is not None:
            _prepared.pop(key, None)  # (another thread may have evicted it)
            _prepared[key] = hit  # the last one served
            return hit[1]
        copy, result = hit[0], build(w)
        kept = result
    else:  # changed since the last call (training): its result kept only if reused
        copy, result = _rewritten(hit, w, stamp), None if steady else build(w)
        kept = result if reused else None
    if isinstance(result, np.ndarray) and not np.may_share_memory(result, w):
        seal_array(result)  # never written: what is cached from it keeps its stamp
    _prepared.pop(key, None)
    _prepared[key] = (copy, kept)
    # only an entry that grew takes the cache past its bound (summing every entry's
    # bytes on every call took ~1 ms of a ResNet-18 training step)
    if hit is None or _entry_bytes((copy, kept)) > _entry_bytes(hit):
        while _cached_bytes() > FILTER_CACHE_BYTES:
            copies = (k for k, (_, r) in _prepared.items() if r is None)
            del _prepared[next(copies, next(iter(_prepared)))]
    return result


def _reference(w, stamp):
    """What an entry keeps to tell whether w changed: its storage's stamp, as (a weak
    reference to the storage, its version), or else a copy of w."""
    return w.copy() if stamp is None else (weakref.ref(stamp[0]), stamp[1])


def _unchanged(reference, w, stamp):
    """Whether w is as when ``reference`` was taken: the same stamp, or where w has none,
    the same bits as the copy: its first block compared first, where a weight changed
    by an optimizer's step already differs (the whole weight was compared: 0.8 ms for
    512 x 512 x 3 x 3 float32, one thread)."""
    if isinstance(reference, tuple):
        return stamp is not None and reference[0]() is stamp[0] and reference[1] == stamp[1]
    bits = np.dtype(f"u{w.itemsize}") if w.itemsize in (1, 2, 4, 8) else None
    return (
        stamp is None
        and bits is not None
        and all(np.array_equal(a.view(bits), b.view(bits)) for a, b in _blocks_of(reference, w))
    )


def _rewritten(hit, w, stamp):
    """A reference (``_reference``) for the entry ``hit`` of a weight that changed: w's
    stamp, or its copy: the entry's own rewritten in place (a new one took 0.7 ms more
    for 512 x 512 x 3 x 3 float32), unless a result was kept with it (another thread may
    be comparing w with that copy to serve the result, which must then fail) or it
    kept a stamp."""
    if stamp is not None or hit[1] is not None or isinstance(hit[0], tuple):
        return _reference(w, stamp)
    np.copyto(hit[0], w)
    return hit[0]


def _blocks_of(copy, w):
    """(copy, w) flat, their first _FIRST_BLOCK elements and then the rest; whole where
    w is not a C array (flattening it would copy it on every call)."""
    if not w.flags.c_contiguous:
        yield copy, w
        return
    a, b = copy.reshape(-1), w.reshape(-1)
    yield a[:_FIRST_BLOCK], b[:_FIRST_BLOCK]
    yield a[_FIRST_BLOCK:], b[_FIRST_BLOCK:]


_FIRST_BLOCK = 4096


def _cached_bytes():
    return sum(map(_entry_bytes, _prepared.values()))


def _entry_bytes(entry):
    reference, result = entry
    copied = 0 if isinstance(reference, tuple) else reference.nbytes
    return copied + (0 if result is None else result.nbytes)
