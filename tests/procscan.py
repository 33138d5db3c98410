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


def environ_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    return dict(entry.decode("utf-8", "replace").partition("=")[::2]
                for entry in raw.split(b"\0") if entry)


def workers(run_id: str, node_rank: int) -> dict[int, int]:
    """{global rank: pid} of the run's worker processes on node ``node_rank``."""
    out = {}
    for pid in marked_pids(run_id):
        env = environ_of(pid)
        if env.get("DDP_ORCH_NODE_RANK") == str(node_rank) and "RANK" in env:
            out[int(env["RANK"])] = pid
    return out


def agent(run_id: str, node_rank: int) -> int:
    """The pid of the torchrun agent of ``node_rank`` (marked, but no RANK)."""
    for pid in marked_pids(run_id):
        env = environ_of(pid)
        if env.get("DDP_ORCH_NODE_RANK") == str(node_rank) and "RANK" not in env:
            return pid
    raise LookupError(f"no torchrun agent of {run_id} node {node_rank}")
