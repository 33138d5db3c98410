"""A rank that prints a few steps and ends: exit 3 on the rank that
--fail-rank names (after its first step), else 0 after --seconds S. It
imports no torch: the scheduler-backend tests look at what the gang does
with its nodes, not inside a rank."""
import os
import sys
import time

rank = int(os.environ["RANK"])  # torchrun's: the global rank
args = sys.argv[1:]
fail = int(args[args.index("--fail-rank") + 1]) if "--fail-rank" in args else -1
seconds = float(args[args.index("--seconds") + 1]) if "--seconds" in args else 1.0
print(f"rank {rank} step 1", flush=True)
if rank == fail:
    print(f"rank {rank} fails", flush=True)
    sys.exit(3)
time.sleep(seconds)
print(f"rank {rank} done", flush=True)
