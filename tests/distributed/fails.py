"""Run by tests/test_distributed.py on two processes: ``fails.py raise`` has rank 1
raise while rank 0 waits in a collective, ``fails.py stuck`` has rank 1 never reach
the collective rank 0 waits in. Both must end every rank with an error, not hang."""

import sys
import time

import lamina as lm
import lamina.distributed as dist

dist.init_process_group(timeout=float(sys.argv[2]))
rank = dist.get_rank()
dist.barrier()
print(f"rank {rank} started", flush=True)
if rank == 1:
    if sys.argv[1] == "raise":
        raise ValueError("a failure on purpose")
    time.sleep(600)  # stuck: never reaches the all_reduce
dist.all_reduce(lm.ones(3))
print(f"rank {rank} finished", flush=True)  # never printed
