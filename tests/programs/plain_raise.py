"""A user script with no @record: rank 2 raises after a barrier, the others wait."""
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 2:
    time.sleep(0.5)
    raise RuntimeError("planned crash on rank 2")
time.sleep(600)
