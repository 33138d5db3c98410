"""A DDP job of --steps steps of --sleep seconds, for the long-run tests.

Each step is a barrier, a line and a step heartbeat. With --fail-rank R,
rank R raises (--fail-with: RuntimeError, or ImportError) after
--fail-step steps, on the first --fail-attempts attempts only
(DDP_ORCH_RESTART_COUNT), so a gang restart can recover.
Rank 0 writes its result, with the attempt it finished in.
"""
import argparse
import os
import time

import torch.distributed as dist

from workloads import contract

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--sleep", type=float, default=0.2)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-step", type=int, default=1)
parser.add_argument("--fail-attempts", type=int, default=1)
parser.add_argument("--fail-with", choices=["RuntimeError", "ImportError"],
                    default="RuntimeError")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, attempt = dist.get_rank(), contract.restart_count()
for step in range(args.steps):
    if rank == args.fail_rank and step == args.fail_step and attempt < args.fail_attempts:
        raise {"RuntimeError": RuntimeError, "ImportError": ImportError}[args.fail_with](
            f"planned failure at step {step} of attempt {attempt}")
    dist.barrier()
    print(f"rank {rank} step {step} attempt {attempt}", flush=True)
    contract.heartbeat(step)
    time.sleep(args.sleep)
if rank == 0 and contract.RESULT_FILE_ENV in os.environ:
    contract.write_json_atomic(os.environ[contract.RESULT_FILE_ENV],
                               {"world_size": dist.get_world_size(),
                                "metrics": {"steps": args.steps, "restart_count": attempt}})
dist.destroy_process_group()
