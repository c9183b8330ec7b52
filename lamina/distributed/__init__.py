"""``lamina.distributed``: data-parallel training on several processes or machines,
over MPI (mpi4py; ``pip install 'lamina[distributed]'``).

Start a script with ``python -m lamina.distributed.run -n N script.py``; in it,
``init_process_group()`` joins the job, ``DistributedDataParallel(model)`` averages the
gradients over the processes during backward, and ``DistributedSampler`` gives each
process its share of the data. The collectives (``all_reduce``, ``broadcast``,
``all_gather``, ``reduce_scatter``, ``barrier``) work on tensors' own memory, blocking
or, with ``async_op=True``, returning a handle with ``wait()``. Importing this module
does not import MPI: ``init_process_group`` does.
"""

from .collectives import (
    DistributedTimeoutError,
    RankFailedError,
    ReduceOp,
    Work,
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    destroy_process_group,
    get_rank,
    get_world_size,
    init_process_group,
    is_available,
    is_initialized,
    reduce_scatter,
)
from .ddp import DistributedDataParallel
from .sampler import DistributedSampler

__all__ = [
    "DistributedDataParallel",
    "DistributedSampler",
    "DistributedTimeoutError",
    "RankFailedError",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "destroy_process_group",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_available",
    "is_initialized",
    "reduce_scatter",
]
