"""A healthy run that prints nothing for a while but reports its steps."""
import time

import torch.distributed as dist

from workloads.contract import heartbeat

dist.init_process_group("gloo")
for step in range(100):  # about 20 s, quiet
    time.sleep(0.2)
    heartbeat(step)
dist.barrier()
print(f"rank {dist.get_rank()} done", flush=True)
