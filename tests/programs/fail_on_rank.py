"""A user script that fails on one global rank, the way real bugs do.

Usage: fail_on_rank.py --rank R [--after S]. Other ranks block in a
collective, so they only end when ddp-orch tears the run down.
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--after", type=float, default=0.5)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == args.rank:
        time.sleep(args.after)
        raise RuntimeError(f"injected failure on rank {args.rank}")
    time.sleep(600)  # stand-in for a long training step that never gets its peer


if __name__ == "__main__":
    main()
