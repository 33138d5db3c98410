"""A DDP job that trains "forever"; --stubborn ignores SIGTERM like a hung rank;
--load S first spends S seconds "loading data" before the process group
exists (the start phase, when hosts often hang)."""
import os
import signal
import sys
import time

if "--load" in sys.argv:
    print(f"rank {os.environ['RANK']} loading", flush=True)
    time.sleep(float(sys.argv[sys.argv.index("--load") + 1]))

import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
if "--stubborn" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"rank {dist.get_rank()} training", flush=True)
time.sleep(600)
