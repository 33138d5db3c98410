"""What every rank saw (working directory, argv, ``__name__``, the config read
by its relative path), gathered over gloo; rank 0 writes them as the result.

Arguments follow PyTorch's DDP tutorial series (``multinode.py 50 10``):
``total_epochs save_every``, positional, then ``--config PATH`` and any
flags, which are echoed as given.
"""

import argparse
import json
import os
import sys

import torch.distributed as dist


def report(name: str, entry: str) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--config", default="configs/x.yaml")
    args, rest = parser.parse_known_args()
    with open(args.config, encoding="utf-8") as fh:  # relative: from the project root
        config = fh.read()
    dist.init_process_group("gloo")
    seen = {"rank": dist.get_rank(), "cwd": os.getcwd(), "argv": sys.argv, "name": name,
            "entry": entry, "config": config, "total_epochs": args.total_epochs,
            "save_every": args.save_every, "rest": rest}
    print("seen " + json.dumps(seen, sort_keys=True), flush=True)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, seen)
    if dist.get_rank() == 0:
        with open(os.environ["DDP_ORCH_RESULT_FILE"] + ".tmp", "w", encoding="utf-8") as fh:
            json.dump({"world_size": dist.get_world_size(), "ranks": gathered}, fh)
        os.replace(os.environ["DDP_ORCH_RESULT_FILE"] + ".tmp",
                   os.environ["DDP_ORCH_RESULT_FILE"])
    dist.destroy_process_group()
