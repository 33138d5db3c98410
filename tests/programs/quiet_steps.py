"""A healthy run that prints one line, then nothing for a while, but
reports its steps: rank 0 with the built-ins' heartbeat, every other rank
with the step report a user's own script calls (``ddp_orch_progress``)."""
import time

import ddp_orch_progress
import torch.distributed as dist

from workloads.contract import heartbeat

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    print("rank 0 starting", flush=True)
for step in range(100):  # about 20 s, quiet
    time.sleep(0.2)
    if rank == 0:
        heartbeat(step)
    else:
        ddp_orch_progress.step(step)
dist.barrier()
print(f"rank {dist.get_rank()} done", flush=True)
