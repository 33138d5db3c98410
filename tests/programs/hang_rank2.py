"""A real distributed hang: rank 2 stops calling collectives, the others wait in all_reduce."""
import time
import torch
import torch.distributed as dist

def wait_for_peers():
    t = torch.ones(1)
    dist.all_reduce(t)

dist.init_process_group("gloo")
dist.barrier()
print(f"rank {dist.get_rank()} training", flush=True)
if dist.get_rank() == 2:
    time.sleep(600)
wait_for_peers()
