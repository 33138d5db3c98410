"""A user script for the SSH tests: reports what it received, exactly."""
import json
import os
import sys

import torch.distributed as dist

from workloads.contract import write_json_atomic

dist.init_process_group("gloo")
seen = {"rank": dist.get_rank(), "argv": sys.argv[1:], "hostile": os.environ.get("HOSTILE"),
        "node_rank": os.environ.get("GROUP_RANK"), "cwd_name": os.path.basename(os.getcwd()),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, seen)
if dist.get_rank() == 0:
    write_json_atomic(os.environ["DDP_ORCH_RESULT_FILE"],
                      {"world_size": dist.get_world_size(), "ranks": gathered})
print(f"rank {dist.get_rank()} done", flush=True)
dist.destroy_process_group()
