"""Find a run's processes the way an operator would: by its marker in /proc."""

from __future__ import annotations

import os
import time


def marked_pids(run_id: str) -> set[int]:
    """Live (non-zombie) processes whose environment has DDP_ORCH_RUN_ID=run_id."""
    marker = f"DDP_ORCH_RUN_ID={run_id}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2:].split()[0] != "Z":
            found.add(int(entry))
    return found


def wait_gone(run_id: str, timeout: float) -> set[int]:
    """Wait until no process of the run is left; returns what is left after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = marked_pids(run_id)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
