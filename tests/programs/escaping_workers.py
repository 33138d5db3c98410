"""Behaves like torchrun at its worst: workers in sessions of their own.

Starts two children with start_new_session=True that ignore SIGTERM, prints
their pids, then sleeps (or exits at once with --exit, orphaning them).
"""
import os
import signal
import subprocess
import sys
import time

# One os.write per line: with PYTHONUNBUFFERED, print() issues the text and the
# newline as two writes, and two workers' lines can interleave on the pipe.
STUBBORN = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "os.write(1, b'worker up\\n'); time.sleep(600)")

children = [subprocess.Popen([sys.executable, "-c", STUBBORN], start_new_session=True)
            for _ in range(2)]
print("children", " ".join(str(c.pid) for c in children), flush=True)
if "--exit" in sys.argv:
    time.sleep(1.0)
    os._exit(3)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(600)
