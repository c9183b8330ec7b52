"""DistributedDataParallel: one model per process, gradients averaged over processes
while backward still runs.

Note [Gradient buckets]: the parameters that require grad are grouped, in reverse order
(backward reaches the last layers first) and by dtype, into buckets of at most
``bucket_cap_mb`` megabytes, each with one flat buffer; the first bucket holds at most 1
MiB, as PyTorch's, so that the exchange starts early in backward even when the whole
model would fit in one bucket. A parameter of ``ALONE_BYTES`` or more travels alone, in
its gradient's own memory when that is contiguous and writable (a leaf's ``.grad`` is
its own: Note [Taking gradients over]): copying it into a bucket and back cost more than
an all-reduce call of its own (AlexNet's 5.8 MB of gradients on two processes: 1.7 ms of
a 47 ms step, where its 5 more calls cost 0.3 ms). A hook on every parameter
(``register_post_accumulate_grad_hook``) copies its gradient into its bucket at once,
while it is in the cache, divided by the number of processes on the way (one pass over
memory for both; a gradient alone is divided where it is), and counts the gradients that
are in; when a bucket is complete an all-reduce (a sum: of the divided gradients, so
their mean) of it is started, while backward goes on with the layers before. Buckets
start strictly in order (a complete bucket waits for the ones before it), because MPI
needs every rank to start its collectives in the same order. The first hook of a
backward pass queues a callback at its end (``engine.queue_callback``), which finishes
what is left: the unused parameters, the waits, and the averaged gradients: copied back
into each parameter's ``.grad``, or, with ``gradient_as_bucket_view=True``, ``.grad``
made a view of its bucket (no copy; the next backward pass overwrites it).

MPI's nonblocking collectives move data only inside MPI calls (no progress thread, so
none takes a core from computing), so the first hook also has the engine test the
requests in flight between every two nodes of the backward pass
(``engine.call_between_nodes``), which is what makes the exchange overlap backward: a
bucket started before a long convolution's backward moves on at the nodes around it.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from lamina.autograd import engine
from lamina.dispatch.tensor import Tensor, bump_version, from_array
from lamina.nn.modules import Module

from .collectives import ProcessGroup, group


class _Bucket:
    """Parameters whose gradients travel in one all-reduce (Note [Gradient buckets]):
    a flat buffer of their own, or, for one large parameter, the gradient's memory
    (``buffer`` None until its gradient is ready)."""

    def __init__(self, params: list[Tensor], names: list[str], *, alone: bool = False):
        self.params, self.names = params, names
        self.offsets = [0, *itertools.accumulate(math.prod(p.shape) for p in params)]
        self.dtype = params[0].numpy().dtype
        self.alone = alone
        self.buffer = None if alone else np.empty(self.offsets[-1], self.dtype)
        self.in_grad = False  # buffer is the gradient's own memory
        self.ready = 0
        self.request = None

    def slices(self) -> Iterator[tuple[Tensor, np.ndarray]]:
        for p, start, stop in zip(self.params, self.offsets, self.offsets[1:]):
            yield p, self.buffer[start:stop].reshape(p.shape)


FIRST_BUCKET_BYTES = 2**20  # PyTorch's
ALONE_BYTES = 2**18  # Note [Gradient buckets]


def _buckets(named: list[tuple[str, Tensor]], cap_bytes: float) -> list[_Bucket]:
    """Reverse parameter order, one dtype per bucket, at most ``cap_bytes`` each and
    the first at most ``FIRST_BUCKET_BYTES``; a parameter of ``ALONE_BYTES`` or more
    travels alone, in its gradient's memory, placed where it comes (the smaller ones
    around it go on filling the open bucket)."""
    buckets, params, names, size = [], [], [], 0
    for name, p in reversed(named):
        nbytes = p.numpy().nbytes
        if nbytes >= ALONE_BYTES:
            buckets.append(_Bucket([p], [name], alone=True))
            continue
        cap = cap_bytes if buckets else min(cap_bytes, FIRST_BUCKET_BYTES)
        if params and (size + nbytes > cap or p.dtype is not params[0].dtype):
            buckets.append(_Bucket(params, names))
            params, names, size = [], [], 0
        params.append(p)
        names.append(name)
        size += nbytes
    if params:
        buckets.append(_Bucket(params, names))
    return buckets


def _broadcast_arrays(g: ProcessGroup, arrays: list[np.ndarray], what: str) -> None:
    """Rank 0's values into ``arrays`` on every rank: one broadcast per dtype."""
    by_dtype = {}
    for a in arrays:
        by_dtype.setdefault(a.dtype, []).append(a)
    for dtype, same in by_dtype.items():
        flat = np.concatenate([a.reshape(-1) for a in same]) if same else np.empty(0, dtype)
        g.wait(g.comm.Ibcast(flat, root=0), what)
        start = 0
        for a in same:
            a[...] = flat[start : start + a.size].reshape(a.shape)
            start += a.size


class DistributedDataParallel(Module):
    """``DistributedDataParallel(module)``: train ``module`` on every rank, each on its
    own share of the data, with the gradients averaged over the ranks during backward,
    so that after ``backward()`` every rank holds the gradient of the whole batch (as
    PyTorch's). ``module`` may be compiled (``lm.jit.compile(model)``: its calls run
    compiled), or the wrapper compiled in turn (``lm.jit.compile(ddp)``).

    At wrap, rank 0's parameters and buffers are copied to every rank (and the ranks
    must agree on the parameters' names, shapes and dtypes). ``bucket_cap_mb`` sizes
    the gradient buckets (Note [Gradient buckets]). A parameter that gets no gradient
    in a backward pass is an error naming it, unless ``find_unused_parameters=True``,
    which counts its gradient as zero. ``gradient_as_bucket_view=True`` leaves each
    ``.grad`` a view of its bucket instead of a copy, saving a pass over the gradients
    per step (a ``.grad`` kept from one step then changes in the next, as in PyTorch).
    A large gradient is averaged in its own ``.grad`` (Note [Gradient buckets]): a
    gradient hook registered after wrapping sees it divided by the number of processes
    and in flight, and must not write it before backward ends. ``broadcast_buffers``
    copies rank 0's buffers (batch-norm statistics) to every rank before each forward.
    ``no_sync()`` skips the exchange, for gradient accumulation: the next backward
    outside it averages everything accumulated."""

    def __init__(
        self,
        module: Module,
        *,
        bucket_cap_mb: float = 25.0,
        find_unused_parameters: bool = False,
        broadcast_buffers: bool = True,
        gradient_as_bucket_view: bool = False,
    ):
        super().__init__()
        run = module  # called by forward: a compiled module (lm.jit.compile) runs compiled
        module = getattr(module, "_orig_mod", module)
        if not isinstance(module, Module):
            raise TypeError(
                f"DistributedDataParallel: module must be an nn.Module, got {type(module).__name__}"
            )
        if isinstance(bucket_cap_mb, bool) or not (
            isinstance(bucket_cap_mb, (int, float)) and bucket_cap_mb > 0
        ):
            raise ValueError(
                f"DistributedDataParallel: bucket_cap_mb must be a positive number, got "
                f"{bucket_cap_mb!r}"
            )
        g = group("DistributedDataParallel")
        self.module = module
        self._run = run
        self.find_unused_parameters = find_unused_parameters
        self.broadcast_buffers = broadcast_buffers
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self._group = g
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._check_same_parameters(g, module)
        _broadcast_arrays(
            g, [t.numpy() for t in module.state_dict().values()], "DistributedDataParallel"
        )
        self._buckets = _buckets(named, bucket_cap_mb * 2**20)
        self._bucket_of = {}  # id(parameter) -> (bucket index, its slice of the buffer)
        for i, b in enumerate(self._buckets):
            if b.alone:
                self._bucket_of[id(b.params[0])] = (i, None)
            else:
                for p, part in b.slices():
                    self._bucket_of[id(p)] = (i, part)
        self._syncing = True
        self._pass_started = False
        self._seen: set[int] = set()
        self._next = 0  # the first bucket not started in this backward pass
        self._grad_hooks = [
            p.register_post_accumulate_grad_hook(self._grad_ready) for _, p in named
        ]

    @staticmethod
    def _check_same_parameters(g: ProcessGroup, module: Module) -> None:
        mine = [(n, tuple(t.shape), t.dtype.name) for n, t in module.state_dict().items()]
        everyone = g.comm.allgather(mine)
        for r, theirs in enumerate(everyone):
            if theirs != everyone[0]:
                diff = next((a, b) for a, b in zip(everyone[0] + [None], theirs + [None]) if a != b)
                raise ValueError(
                    "DistributedDataParallel: the ranks' models differ: rank 0 has "
                    f"{diff[0]} where rank {r} has {diff[1]} (name, shape, dtype); every "
                    "rank must wrap the same model"
                )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and self._group.size > 1:
            buffers = [b.numpy() for _, b in self.module.named_buffers()]
            if buffers:
                _broadcast_arrays(self._group, buffers, "DistributedDataParallel.forward")
        return self._run(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate ``.grad`` on each rank; the first one
        after it averages what was accumulated."""
        before, self._syncing = self._syncing, False
        try:
            yield
        finally:
            self._syncing = before

    # ------------------------------------------------------------ during backward

    def _grad_ready(self, param: Tensor) -> None:
        if not self._syncing:
            return
        if not self._pass_started:
            self._pass_started = True
            engine.queue_callback(self._finish)
            engine.call_between_nodes(self._progress)
        if id(param) in self._seen:
            return  # counted once per pass: a bucket's count must end at its size
        self._seen.add(id(param))
        i, part = self._bucket_of[id(param)]
        self._copy_in(self._buckets[i], param, part)  # now, while the gradient is in the cache
        self._buckets[i].ready += 1
        if i == self._next:
            self._start_complete()

    def _start_complete(self) -> None:
        buckets = self._buckets
        while self._next < len(buckets) and buckets[self._next].ready == len(
            buckets[self._next].params
        ):
            self._start(buckets[self._next])
            self._next += 1

    def _copy_in(self, bucket: _Bucket, p: Tensor, part: np.ndarray | None) -> None:
        """p's gradient, divided by the number of processes on the way (the sum of the
        shares is the mean), into its place in ``bucket``: ``part`` of its buffer, or,
        for a parameter alone, the gradient's own memory where MPI can use it."""
        grad = None if p.grad is None else p.grad.numpy()
        scale = bucket.dtype.type(1.0 / self._group.size)
        if part is not None:
            if grad is None:  # unused (find_unused_parameters): counts as zero
                part[...] = 0
            else:
                np.multiply(grad, scale, out=part)
        elif grad is not None and grad.flags.c_contiguous and grad.flags.writeable:
            if scale != 1:
                np.multiply(grad, scale, out=grad)
            bucket.buffer, bucket.in_grad = grad.reshape(-1), True
        elif grad is None:  # unused (find_unused_parameters): counts as zero
            bucket.buffer = np.zeros(bucket.offsets[-1], bucket.dtype)
        else:  # memory MPI cannot take as it is: a buffer of its own
            bucket.buffer = np.multiply(grad, scale, order="C").reshape(-1)

    def _start(self, bucket: _Bucket) -> None:
        for p in bucket.params:
            if id(p) not in self._seen:  # unused in this pass; in no earlier one, zero
                self._copy_in(bucket, p, self._bucket_of[id(p)][1])
        g = self._group
        bucket.request = g.comm.Iallreduce(g.mpi.IN_PLACE, bucket.buffer, g.mpi.SUM)

    def _progress(self) -> None:
        """Lets MPI move the buckets in flight (see the module's docstring)."""
        if self._next:
            self._group.mpi.Request.Testall([b.request for b in self._buckets[: self._next]])

    def _finish(self) -> None:
        g = self._group
        started = self._buckets[: self._next]
        unused = [
            name
            for b in self._buckets
            for name, p in zip(b.names, b.params)
            if id(p) not in self._seen
        ]
        try:
            if unused and not self.find_unused_parameters:
                for b in started:
                    g.wait(b.request, "DistributedDataParallel backward")
                raise RuntimeError(
                    "DistributedDataParallel: these parameters got no gradient in this "
                    f"backward pass: {', '.join(unused)}. Use every parameter in the "
                    "loss, set requires_grad=False on those not trained, or pass "
                    "find_unused_parameters=True to count their gradients as zero"
                )
            for b in self._buckets:
                b.ready = len(b.params)
            self._start_complete()
            for b in self._buckets:
                g.wait(b.request, "DistributedDataParallel backward")
                for p, part in b.slices():
                    grad = p.grad
                    if b.in_grad:  # reduced where it was
                        bump_version(grad)
                    elif self.gradient_as_bucket_view:
                        p.grad = from_array(part)
                        bump_version(p.grad)  # the bucket's memory was written
                    elif grad is None or not grad.numpy().flags.writeable:
                        p.grad = from_array(part.copy())
                    else:
                        np.copyto(grad.numpy(), part)
                        bump_version(grad)
        finally:
            for b in self._buckets:
                b.ready, b.request, b.in_grad = 0, None, False
                if b.alone:
                    b.buffer = None
            self._seen.clear()
            self._next = 0
            self._pass_started = False
