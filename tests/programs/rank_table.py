"""Each rank reports where it runs and which interface its collectives use,
gathered over the real data path (gloo's all_gather), and rank 0 prints
the table as one line: ``RANKS [...]``. ``--timeout``: gloo's, so a run
meant to fail (its peers unreachable) fails in seconds."""
import argparse
import datetime
import json
import os
import socket

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--timeout", type=float, default=60.0, help="gloo's, in seconds")
timeout = datetime.timedelta(seconds=parser.parse_args().timeout)
dist.init_process_group("gloo", timeout=timeout)
me = {"rank": dist.get_rank(), "local_rank": int(os.environ["LOCAL_RANK"]),
      "node_rank": int(os.environ["DDP_ORCH_NODE_RANK"]), "world_size": dist.get_world_size(),
      "hostname": socket.gethostname(), "cwd": os.getcwd(),
      "gloo": os.environ.get("GLOO_SOCKET_IFNAME"), "nccl": os.environ.get("NCCL_SOCKET_IFNAME")}
table = [None] * dist.get_world_size()
dist.all_gather_object(table, me)
if dist.get_rank() == 0:
    print("RANKS " + json.dumps(table), flush=True)
dist.destroy_process_group()
