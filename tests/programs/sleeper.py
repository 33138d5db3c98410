"""A DDP job that trains "forever"; --stubborn ignores SIGTERM like a hung rank."""
import signal
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
if "--stubborn" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"rank {dist.get_rank()} training", flush=True)
time.sleep(600)
