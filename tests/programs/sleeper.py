"""A rank that "trains" forever, for the tests of what happens around a run
(faults, teardown, Ctrl-C, GPU holds): it says it is training and sleeps.
--stubborn ignores SIGTERM like a hung rank; --load S first spends S
seconds "loading data" (the start phase, when hosts often hang).

It imports no torch and joins no process group: these tests kill, freeze
and stop the processes torchrun, the supervisors and the keepers manage,
and none of them looks inside a rank. A torch import costs a rank about
4 s of CPU here; the tests of real collectives (a cascade, a hang, the
network) run programs that use them (fail_on_rank.py, hang_rank2.py,
rank_table.py, steps.py).
"""
import os
import signal
import sys
import time

rank = os.environ["RANK"]  # torchrun's: the global rank
if "--load" in sys.argv:
    print(f"rank {rank} loading", flush=True)
    time.sleep(float(sys.argv[sys.argv.index("--load") + 1]))
if "--stubborn" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"rank {rank} training", flush=True)
time.sleep(600)
