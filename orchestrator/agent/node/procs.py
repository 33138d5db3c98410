"""The processes of a run on one node, found through /proc and signalled.

torchrun puts each worker in a session of its own, so a process group does
not reach them: they are found as descendants of the supervisor (a child
subreaper, so orphans stay its descendants) and by marker variables. Linux.
"""

from __future__ import annotations

import os
import signal
import threading
import time

PR_SET_CHILD_SUBREAPER = 36


def terminate(find, grace_s: float, hurry: threading.Event | None = None,
              still_ours=None) -> tuple[set[int], dict[int, str]]:
    """SIGTERM what ``find()`` returns, then SIGKILL after ``grace_s`` (sooner
    once ``hurry`` is set); the pids signalled and the survivors' commands."""
    seen = set(find())
    signal_all(seen, signal.SIGTERM, still_ours)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not (hurry and hurry.is_set()):
        left = find()
        seen |= left
        if not left:
            return seen, {}
        time.sleep(0.05)
    for _ in range(100):
        left = find()
        if not left:
            return seen, {}
        seen |= left
        signal_all(left, signal.SIGKILL, still_ours)
        time.sleep(0.02)
    return seen, {pid: command_line(pid) for pid in sorted(find())}


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot): tells a process
    from a later one that got the same pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return "?"


def run_marker(run_id: str, node_rank: int | str) -> tuple[str, str]:
    """The variables the plan sets on a node's processes of a run, to find them."""
    return (f"DDP_ORCH_RUN_ID={run_id}", f"DDP_ORCH_NODE_RANK={node_rank}")


# ddp-orch's own processes of a run (each agent the controller starts for it,
# and so the supervisor it becomes, its guardian, a keeper, a follower; under
# Slurm each job's agent) carry ``DDP_ORCH_RUN=<run id>``, and pass it on to
# everything they start. A variable of its own, not ``run_marker``'s: the
# teardown (supervisor, guardian, ``down``, ``prune``) ends what carries the
# run marker, and must never end the supervisor or agent doing it. One scan
# for either name finds every process of the run (``tests/labs/procscan.py``).
OWN_MARKER = "DDP_ORCH_RUN"


def own_marker(run_id: str | None) -> dict[str, str]:
    """The environment that marks a process ddp-orch starts for ``run_id``."""
    return {OWN_MARKER: run_id} if run_id else {}


def running(pid: int) -> bool:
    """Whether ``pid`` still runs: not gone, and not an unreaped zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def marked_processes(marker: tuple[str, ...]) -> set[int]:
    """Live processes whose environment carries every ``NAME=value`` of ``marker``."""
    me = os.getpid()
    return {pid for pid, _ppid, state in proc_table()
            if state != "Z" and pid != me and has_marker(pid, marker)}


def connected_to(pid: int, port: int) -> bool:
    """Does ``pid`` hold an ESTABLISHED TCP connection to remote ``port``?
    The kernel's TCP tables are read only once it holds a socket: a read
    walks every hash bucket (10 ms here, more on a big node), and torchrun
    opens none while it imports torch."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return False
    for table in ("/proc/net/tcp", "/proc/net/tcp6") if inodes else ():
        try:
            with open(table, encoding="ascii") as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and remote_port == port and fields[9] in inodes:
                return True
    return False


def become_subreaper() -> None:
    """Orphaned descendants re-parent to us instead of init (Linux only)."""
    try:
        import ctypes  # here: its import is a good part of the agent's start

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the marker scan still finds the run's processes


def children_of(pid: int) -> list[int]:
    """``pid``'s live children, from its threads' ``children`` files: a scan
    of every process (``proc_table``) only where the kernel has none."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        found = []
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as fh:
                found += [int(child) for child in fh.read().split()]
    except FileNotFoundError:  # no CONFIG_PROC_CHILDREN, or pid is gone
        return [p for p, ppid, state in proc_table() if ppid == pid and state != "Z"]
    except OSError:
        return []
    return [child for child in found if running(child)]


def proc_table():
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        yield int(entry), int(fields[1]), fields[0]


def has_marker(pid: int, marker: tuple[str, ...]) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            entries = set(fh.read().split(b"\0"))
    except OSError:
        return False
    return all(m.encode() in entries for m in marker)


def signal_all(pids: set[int], sig: int, still_ours=None) -> None:
    """Send ``sig`` to ``pids``; with pidfds each is pinned, then checked with
    ``still_ours(pid)``, so a pid reused since the /proc scan is never hit."""
    for pid in pids:
        fd = None
        try:
            if hasattr(os, "pidfd_open"):
                fd = os.pidfd_open(pid)
            if still_ours is not None and not still_ours(pid):
                continue
            if fd is not None:
                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        except OSError:  # pidfds unsupported here (ENOSYS): plain kill
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        finally:
            if fd is not None:
                os.close(fd)


def descends_from(pid: int, ancestor: int) -> bool:
    """Is ``ancestor`` on ``pid``'s parent chain (read now, from /proc)?"""
    for _ in range(64):
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            return False
        pid = int(stat[stat.rfind(")") + 2:].split()[1])
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def reap(pid: int, block: bool = False) -> int | None:
    """Our child ``pid``'s exit code once it has exited, reaping it (signal N: 128 + N)."""
    try:
        done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return None
    if not done:
        return None
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code
