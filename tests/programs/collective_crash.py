"""Ranks all_reduce in a loop until one crashes, so its peers fail in the
collective afterwards: the cascade a root cause must see through.

Usage: collective_crash.py --rank R --how raise|kill [--after S]. No
``@record``: like most user scripts, it leaves torchrun no error file.
"""
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--how", choices=["raise", "kill"], required=True)
    parser.add_argument("--after", type=float, default=1.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    start = time.monotonic()
    tensor = torch.ones(4)
    while True:
        if dist.get_rank() == args.rank and time.monotonic() - start > args.after:
            if args.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"planned crash on rank {args.rank}")
        dist.all_reduce(tensor)
        time.sleep(0.01)


if __name__ == "__main__":
    main()
