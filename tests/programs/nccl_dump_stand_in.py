"""Stands in for NCCL's flight recorder on a machine without GPUs: each rank
writes the dump a collective timeout would leave (at the path ddp-orch set
in TORCH_NCCL_DEBUG_INFO_TEMP_FILE, plus its rank), with the run's secret in
it, as a dump may hold any string; then the last rank fails the run."""
import os

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
with open(f"{os.environ['TORCH_NCCL_DEBUG_INFO_TEMP_FILE']}{rank}", "wb") as fh:
    fh.write(f"flight record of rank {rank}: all_reduce seq 7 timed out; "
             f"token {os.environ['HF_TOKEN']}\n".encode())
dist.barrier()  # every dump is written
if rank == dist.get_world_size() - 1:
    raise RuntimeError("collective timed out (stand-in)")
dist.barrier()
