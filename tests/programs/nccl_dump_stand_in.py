"""Stands in for NCCL's flight recorder on a machine without GPUs: each rank
writes the dump a collective timeout would leave (at the path ddp-orch set
in TORCH_NCCL_DEBUG_INFO_TEMP_FILE, plus its rank), with the run's secret in
it, as a dump may hold any string; then the last rank fails the run. The
path by torch 2.8's name first, as torch reads it (the worker shim drops the
old name where torch knows the new)."""
import os

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
with open(f"{prefix}{rank}", "wb") as fh:
    fh.write(f"flight record of rank {rank}: all_reduce seq 7 timed out; "
             f"token {os.environ['HF_TOKEN']}\n".encode())
dist.barrier()  # every dump is written
if rank == dist.get_world_size() - 1:
    raise RuntimeError("collective timed out (stand-in)")
dist.barrier()
