"""The process group and the collectives on tensors, over MPI (mpi4py).

Note [Collective buffers]: a collective works on the tensor's own memory, the NumPy
array of its storage, through mpi4py's buffer interface (its upper-case calls), so a
C-contiguous tensor is never copied; any other is copied into a contiguous array and,
for the in-place collectives, back when the collective completes.

Note [Waiting with a deadline]: a rank never waits in a blocking MPI call for ranks
that may not come: every collective starts with ``ProcessGroup.agree``, a nonblocking
exchange waited for by polling it (``ProcessGroup.wait``), which gives up after the
group's timeout and meanwhile looks for a failure notice from another rank (Note
[Failing together]). Once it completes, every rank has reached the same collective,
so the blocking collective that follows cannot hang (``_run``).

Note [Failing together]: an exception that ends a rank's script would otherwise leave
the other ranks waiting for it forever. ``init_process_group`` installs an excepthook
that sends a notice ("rank R failed: ValueError: ...") to every other rank, on a
communicator of its own, and waits (up to the timeout) until each has received it;
a rank that receives one raises ``RankFailedError`` from the collective it is waiting
in, and its own excepthook then ends it. The failing rank finally calls MPI's Abort,
which ends whatever is left of the job -- but only once each rank it told has printed
its own error and said so (a message back, or the timeout): MPI's Abort kills every
rank at once, and had cut a notified rank's traceback mid-line on a loaded machine.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import os
import sys
import time
from typing import Any

import numpy as np

from lamina.autograd import grad_mode
from lamina.dispatch import ops
from lamina.dispatch.tensor import Tensor, bump_version, from_array

REDUCE_OPS = ("sum", "mean", "max", "min")
_KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
FAILURE_TAG = 1
REPORTED_TAG = 2  # a notified rank to the failing one: my error is printed
_SHAPE_SLOTS = 6  # dimensions a mismatch's message shows
# a wait polls without yielding its core this long: on a busy machine a yield costs a
# time slice, many times a 1 MB all-reduce
SPIN_SECONDS = 0.001


class ReduceOp:
    """PyTorch's spelling of the reduction operations (``ReduceOp.SUM`` is "sum")."""

    SUM = "sum"
    MEAN = AVG = "mean"
    MAX = "max"
    MIN = "min"


class RankFailedError(RuntimeError):
    """Another rank raised an exception; this one stops too (Note [Failing together])."""


class DistributedTimeoutError(TimeoutError):
    """A collective did not complete within the process group's timeout."""


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError:
        raise ImportError(
            "lamina.distributed needs mpi4py and an MPI library: pip install 'lamina[distributed]'"
        ) from None
    return MPI


class ProcessGroup:
    """Every process of the MPI job: its communicators, rank, size and timeout."""

    def __init__(self, mpi: Any, timeout: float):
        self.mpi = mpi
        world = mpi.COMM_WORLD
        self.comm = world.Dup()  # the collectives'
        self.notices = world.Dup()  # failure notices only: never mixed with data
        self.rank, self.size = world.Get_rank(), world.Get_size()
        self.timeout = timeout
        self.failed = False  # a notice was received, or this rank sent one
        self.notified_by: set[int] = set()  # the ranks whose notices this one received
        self._extremes = np.empty(2, np.int64)  # agree's result

    # Note [Waiting with a deadline]
    def wait(self, request: Any, what: str, pause: float = 0.0) -> None:
        """Poll ``request`` until it completes: without a pause, as MPI's own blocking
        calls do (its transfers between processes advance only while it is polled);
        ``pause`` seconds between polls leave the core to others in a long wait."""
        start = time.monotonic()
        polls = 0
        while not request.Test():
            polls += 1
            if polls % 64 and not pause:
                continue
            self.check_notices()
            now = time.monotonic()
            if now - start > self.timeout:
                raise DistributedTimeoutError(
                    f"{what}: rank {self.rank} waited {self.timeout:g} s for the other "
                    "ranks (one may be stuck, have stopped, or be calling a different "
                    "collective); the timeout is init_process_group(timeout=...)"
                )
            if pause:
                time.sleep(pause)
            elif now - start > SPIN_SECONDS:  # as MPI's polling does: a rank sharing
                os.sched_yield()  # its core lets the other run, but not in a short wait

    def check_notices(self) -> None:
        notice = self._notice()
        if notice is not None:
            self.failed = True
            raise RankFailedError(notice)

    def _notice(self) -> str | None:
        """A failure notice another rank sent, received (None if there is none)."""
        status = self.mpi.Status()
        if not self.notices.Iprobe(source=self.mpi.ANY_SOURCE, tag=FAILURE_TAG, status=status):
            return None
        source = status.Get_source()
        message = self.notices.recv(source=source, tag=FAILURE_TAG)
        self.notified_by.add(source)
        return f"rank {source} failed: {message}"

    def announce_failure(self, error: BaseException) -> None:
        """Tell every other rank that this one failed with ``error``, and wait (up to
        the timeout) until each has received it (Note [Failing together])."""
        self.failed = True
        message = f"{type(error).__name__}: {error}"
        requests = [
            self.notices.issend(message, dest=r, tag=FAILURE_TAG)
            for r in range(self.size)
            if r != self.rank
        ]
        deadline = time.monotonic() + self.timeout
        while not self.mpi.Request.Testall(requests) and time.monotonic() < deadline:
            self._notice()  # ranks failing at once: each takes the other's notice
            time.sleep(0.001)
        # then each rank told reports its own error printed; a rank that failed too
        # (its notice taken here) reports nothing: it is announcing its own
        waiting = {
            r: self.notices.irecv(source=r, tag=REPORTED_TAG)
            for r in range(self.size)
            if r != self.rank
        }
        while waiting and time.monotonic() < deadline:
            self._notice()
            done = {r for r, q in waiting.items() if r in self.notified_by or q.test()[0]}
            waiting = {r: q for r, q in waiting.items() if r not in done}
            time.sleep(0.001)

    def reported(self) -> None:
        """Tell each rank whose failure notice this one received that its own error is
        printed (Note [Failing together])."""
        for r in self.notified_by:
            self.notices.send(None, dest=r, tag=REPORTED_TAG)

    def agree(self, kind: str, array: np.ndarray, detail: int = 0) -> None:
        """Check that every rank calls the same collective on the same shape and dtype
        (a sum of mismatched buffers would be silently wrong, or hang); on a difference
        every rank raises the same ValueError naming the ranks' calls.

        Note [One exchange to agree]: the ranks compare a 62-bit hash of the call, h,
        in one tiny all-reduce: the maximum of (h, -h) over the ranks is (max h,
        -min h), which is this rank's own (h, -h) on every rank exactly when every h is
        the same (two different calls hash alike with odds of 2**-62); any difference is
        seen by every rank at once, so they all go on to gather the calls' descriptions
        for the message. It completes before any data moves, not beside it: an
        exchange of mismatched buffers may hang or overwrite the tensor in place, and
        the blocking form of the data's collective is safe only after it (Note
        [Waiting with a deadline]). It runs before every collective, so it does as
        little as it can in Python: a 1 MB all-reduce on two processes takes ~150 us,
        and each microsecond here is visible."""
        mine, agreed = _signature(kind, array.shape, array.dtype.char, detail)
        extremes = self._extremes
        self.wait(self.comm.Iallreduce(mine, extremes, self.mpi.MAX), kind)
        if extremes.tobytes() != agreed:
            self._disagree(kind, _description(kind, array.shape, array.dtype.char, detail))

    def _disagree(self, kind: str, mine: np.ndarray) -> None:
        everyone = np.empty((self.size, mine.size), mine.dtype)
        self.wait(self.comm.Iallgather(mine, everyone), kind)
        described = "; ".join(f"rank {r}: {_describe(s)}" for r, s in enumerate(everyone))
        raise ValueError(
            f"{kind}: the ranks' tensors or calls differ ({described}); every rank must "
            "call the same collective, in the same order, on tensors of the same shape and "
            "dtype"
        )


@functools.lru_cache(maxsize=1024)
def _signature(
    kind: str, shape: tuple[int, ...], char: str, detail: int
) -> tuple[np.ndarray, bytes]:
    """Note [One exchange to agree]: (h, -h) for the call's hash h, and its bytes."""
    digest = hashlib.blake2b(repr((kind, shape, char, detail)).encode(), digest_size=8).digest()
    h = int.from_bytes(digest, "little") >> 2  # 62 bits: -h is an int64 too
    pair = np.array([h, -h], np.int64)
    pair.flags.writeable = False  # shared by every call with these arguments
    return pair, pair.tobytes()


def _description(kind: str, shape: tuple[int, ...], char: str, detail: int) -> np.ndarray:
    """The call as numbers, for the message: kind, detail, dtype, ndim, the first
    dimensions."""
    padded = list(shape[:_SHAPE_SLOTS]) + [-1] * (_SHAPE_SLOTS - len(shape[:_SHAPE_SLOTS]))
    return np.array([_KINDS.index(kind), detail, ord(char), len(shape), *padded], np.int64)


def _describe(signature: np.ndarray) -> str:
    kind, detail, char, ndim, *dims = (int(v) for v in signature)
    shown = dims[: min(ndim, _SHAPE_SLOTS)]
    shape = "(" + ", ".join(map(str, shown)) + (", ..." if ndim > _SHAPE_SLOTS else "") + ")"
    extra = f" {REDUCE_OPS[detail]}" if _KINDS[kind] in ("all_reduce", "reduce_scatter") else ""
    extra = f" from rank {detail}" if _KINDS[kind] == "broadcast" else extra
    return f"{_KINDS[kind]}{extra} of {np.dtype(chr(char)).name} {shape}"


_group: ProcessGroup | None = None


def group(what: str) -> ProcessGroup:
    """The process group, or a clear error naming ``what`` was called too early."""
    if _group is None:
        raise RuntimeError(
            f"{what}: the process group is not initialized; call "
            "lamina.distributed.init_process_group() first (in a script started by "
            "python -m lamina.distributed.run -n N script.py, or by mpiexec)"
        )
    return _group


def init_process_group(
    backend: str = "mpi", *, timeout: float | datetime.timedelta = 1800.0
) -> None:
    """Join the job the MPI launcher started (``python -m lamina.distributed.run`` or
    ``mpiexec``): rank and world size come from its environment; a script started
    alone is a job of one process. ``timeout`` (seconds, or a ``timedelta``) bounds
    every wait in a collective (Note [Waiting with a deadline]); an exception that ends
    one rank's script ends every rank with an error naming it (Note [Failing
    together])."""
    global _group
    if backend != "mpi":
        raise ValueError(f"init_process_group: backend must be 'mpi', got {backend!r}")
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(
            f"init_process_group: timeout must be a positive number of seconds, got {timeout!r}"
        )
    if _group is not None:
        raise RuntimeError("init_process_group: the process group is already initialized")
    _group = ProcessGroup(_mpi(), float(timeout))
    sys.excepthook = _failing_together(sys.excepthook)


def _end_job(error: BaseException) -> None:
    g = _group
    if g is None or g.size == 1:
        return
    sys.stderr.flush()
    if not g.failed:
        g.announce_failure(error)
    else:
        g.reported()
    g.comm.Abort(1)


def _failing_together(previous):
    def hook(kind, error, traceback):
        previous(kind, error, traceback)
        if not issubclass(kind, KeyboardInterrupt):
            _end_job(error)

    hook.previous = previous
    return hook


def destroy_process_group() -> None:
    """Leave the process group (its communicators are freed; MPI itself stays up until
    the process ends)."""
    global _group
    g = group("destroy_process_group")
    sys.excepthook = getattr(sys.excepthook, "previous", sys.excepthook)
    g.comm.Free()
    g.notices.Free()
    _group = None


def is_initialized() -> bool:
    return _group is not None


def is_available() -> bool:
    """Whether mpi4py can be imported (the ``distributed`` extra is installed)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def get_rank() -> int:
    return group("get_rank").rank


def get_world_size() -> int:
    return group("get_world_size").size


def barrier() -> None:
    g = group("barrier")
    g.wait(g.comm.Ibarrier(), "barrier")


class Work:
    """A collective in flight (``async_op=True``): ``wait()`` finishes it and returns
    its result, ``is_completed()`` says whether it has finished without waiting."""

    def __init__(self, g: ProcessGroup, what: str, request: Any, finish):
        self._group, self._what, self._request, self._finish = g, what, request, finish
        self._done, self._result = False, None

    def is_completed(self) -> bool:
        return self._done or bool(self._request.Test())

    def wait(self) -> Any:
        if not self._done:
            self._group.wait(self._request, self._what)
            self._result, self._done = self._finish(), True
        return self._result


# ---------------------------------------------------------------- argument checks


def _array(tensor: Any, what: str, *, writes: bool) -> np.ndarray:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{what}: tensor must be a lamina tensor, got {type(tensor).__name__}")
    try:
        a = tensor.numpy()
    except TypeError:
        raise TypeError(
            f"{what}: tensor must be a dense CPU tensor, got one on {tensor.device}"
        ) from None
    if writes and not a.flags.writeable:
        raise ValueError(
            f"{what}: tensor is a read-only view and the collective writes into it; pass a copy"
        )
    return a


def _contiguous(a: np.ndarray) -> np.ndarray:
    """Note [Collective buffers]: the array itself when MPI can use it, else a copy."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _reduce_op(op: Any, a: np.ndarray, what: str) -> str:
    if op not in REDUCE_OPS:
        raise ValueError(f"{what}: op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
    if a.dtype == np.bool_:
        raise TypeError(f"{what}: bool tensors cannot be reduced; convert to an integer dtype")
    if op == "mean" and a.dtype.kind not in "fc":
        raise TypeError(f"{what}: op 'mean' needs a floating-point tensor, got {a.dtype.name}")
    if op in ("max", "min") and a.dtype.kind == "c":
        raise TypeError(f"{what}: op {op!r} is not defined for complex tensors")
    return op


def _mpi_op(g: ProcessGroup, op: str) -> Any:
    return {"sum": g.mpi.SUM, "mean": g.mpi.SUM, "max": g.mpi.MAX, "min": g.mpi.MIN}[op]


def _run(g: ProcessGroup, what: str, call: str, args: tuple, finish, async_op: bool) -> Any:
    """MPI's collective ``call`` (``"Allreduce"``) on ``args``, then ``finish()``; with
    ``async_op``, its nonblocking form (``Iallreduce``) and a ``Work`` that finishes it.
    Note [Waiting with a deadline]: the blocking form runs only after ``agree``, so every
    rank has reached it and it cannot hang; it is MPI's faster path (measured on 2
    processes: a 10 MB all-reduce took 16 ms blocking, 26 ms nonblocking)."""
    if async_op:
        return Work(g, what, getattr(g.comm, "I" + call.lower())(*args), finish)
    getattr(g.comm, call)(*args)
    return finish()


# ---------------------------------------------------------------- the collectives


def all_reduce(tensor: Tensor, op: str = "sum", *, async_op: bool = False) -> Any:
    """Reduce ``tensor`` over every rank (``op``: sum, mean, max or min) and leave the
    result in it, on every rank. Returns the tensor, or with ``async_op=True`` a
    ``Work`` whose ``wait()`` does."""
    g = group("all_reduce")
    a = _array(tensor, "all_reduce", writes=True)
    op = _reduce_op(op, a, "all_reduce")
    buf = _contiguous(a)
    g.agree("all_reduce", buf, REDUCE_OPS.index(op))

    def finish():
        if op == "mean":
            np.divide(buf, g.size, out=buf)
        if buf is not a:
            a[...] = buf
        bump_version(tensor)
        return tensor

    args = (g.mpi.IN_PLACE, buf, _mpi_op(g, op))
    return _run(g, "all_reduce", "Allreduce", args, finish, async_op)


def broadcast(tensor: Tensor, src: int = 0, *, async_op: bool = False) -> Any:
    """Rank ``src``'s ``tensor`` into ``tensor`` on every rank."""
    g = group("broadcast")
    if not isinstance(src, int) or isinstance(src, bool) or not 0 <= src < g.size:
        raise ValueError(f"broadcast: src must be a rank from 0 to {g.size - 1}, got {src!r}")
    a = _array(tensor, "broadcast", writes=True)
    buf = _contiguous(a)
    g.agree("broadcast", buf, src)

    def finish():
        if buf is not a:
            a[...] = buf
        bump_version(tensor)
        return tensor

    return _run(g, "broadcast", "Bcast", (buf, src), finish, async_op)


def all_gather(tensor: Tensor, *, async_op: bool = False) -> Any:
    """Every rank's ``tensor`` (the same shape and dtype on each), stacked in rank order:
    a new tensor of shape ``(world_size, *tensor.shape)``. Differentiable: the gradient
    of a rank's tensor is the sum over ranks of their gradients for its slice."""
    g = group("all_gather")
    buf = _contiguous(_array(tensor, "all_gather", writes=False))
    g.agree("all_gather", buf)
    out = np.empty((g.size, *buf.shape), buf.dtype)

    def finish():
        gathered = from_array(out)
        if tensor.requires_grad and grad_mode.is_grad_enabled():
            return _differentiable_gather(g, tensor, gathered)
        return gathered

    return _run(g, "all_gather", "Allgather", (buf, out), finish, async_op)


def _differentiable_gather(g: ProcessGroup, tensor: Tensor, gathered: Tensor) -> Tensor:
    """``gathered`` with this rank's slice replaced by ``tensor`` itself, so that the
    gradient reaches it; a hook turns this rank's slice of the gradient into the sum of
    every rank's gradient for it (a reduce-scatter), as each rank's loss used it."""
    parts = [tensor if r == g.rank else gathered[r] for r in range(g.size)]
    result = ops.stack(parts)

    def summed_over_ranks(grad):
        full = np.array(grad.numpy())  # a copy of its own: the hook returns it
        own = reduce_scatter(from_array(full.reshape(g.size, -1)), "sum")
        full[g.rank] = own.numpy().reshape(tensor.shape)
        return from_array(full)

    result.register_hook(summed_over_ranks)
    return result


def reduce_scatter(tensor: Tensor, op: str = "sum", *, async_op: bool = False) -> Any:
    """Reduce ``tensor`` over every rank and give each its share: ``tensor``'s first axis
    is split into ``world_size`` equal blocks and rank r gets the reduction of block r,
    a new tensor of shape ``(tensor.shape[0] // world_size, *tensor.shape[1:])``."""
    g = group("reduce_scatter")
    a = _array(tensor, "reduce_scatter", writes=False)
    op = _reduce_op(op, a, "reduce_scatter")
    if a.ndim == 0 or a.shape[0] % g.size:
        raise ValueError(
            f"reduce_scatter: the first axis of tensor must split into {g.size} equal blocks "
            f"(one per rank), got shape {a.shape}"
        )
    buf = _contiguous(a)
    g.agree("reduce_scatter", buf, REDUCE_OPS.index(op))
    out = np.empty((a.shape[0] // g.size, *a.shape[1:]), a.dtype)

    def finish():
        if op == "mean":
            np.divide(out, g.size, out=out)
        return from_array(out)

    args = (buf, out, _mpi_op(g, op))
    return _run(g, "reduce_scatter", "Reduce_scatter_block", args, finish, async_op)
