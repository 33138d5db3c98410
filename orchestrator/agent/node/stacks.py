"""Stack dumps of a run's ranks on this node (``ddp-orch stacks``).

By ``py-spy`` where it is on the PATH, else by the shim's ``faulthandler``,
which works while the rank is blocked in a collective.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import threading
import time

from . import procs
from ..layout import SHIM_MODULE
from ..worker.shim import (STACK_SIGNAL, flight_recorder_fifo, flight_recorder_target,
                           stacks_file)

SETTLE_S = 0.2  # a complete-looking dump that has not grown for this long is done
# faulthandler writes a dump a few bytes per write() from a signal handler, and
# on a loaded node a rank can be descheduled mid-dump for longer than SETTLE_S
# (three ranks importing torch's compiler for their flight recorders on two
# cores). A dump that does not end as a whole one does is waited for this long.
PARTIAL_SETTLE_S = 1.5
MAX_DUMP = 1 << 20  # bytes kept of one rank's dump
# ``py-spy --native`` reads the symbols of every library a rank has loaded
# (libtorch's run to hundreds of MB): seconds per rank, more on a node whose
# cores the training keeps busy, so a native dump gets this many times the
# budget of a Python one before the rank falls back to faulthandler.
NATIVE_SLOWER = 3
# py-spy cannot always merge a rank's native frames with its Python ones (a
# thread caught between the two: "Failed to merge native and python frames");
# a second look, a moment later, usually can.
NATIVE_TRIES = 2


def environ_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            entries = fh.read().split(b"\0")
    except OSError:
        return {}
    out = {}
    for entry in entries:
        name, sep, value = entry.partition(b"=")
        if sep:
            out[name.decode(errors="replace")] = value.decode(errors="replace")
    return out


def workers(run_id: str) -> dict[int, tuple[int, int]]:
    """{global rank: (pid, node rank)} here. A rank's DataLoader workers share
    its environment: the rank is the candidate whose parent is no candidate."""
    candidates: dict[int, tuple[int, int]] = {}
    parents = {}
    for pid, ppid, state in procs.proc_table():  # one scan: the parents and the candidates
        parents[pid] = ppid
        if state == "Z":
            continue
        env = environ_of(pid)
        rank, node = env.get("RANK", ""), env.get("DDP_ORCH_NODE_RANK", "")
        if env.get("DDP_ORCH_RUN_ID") == run_id and rank.isdigit() and node.isdigit() \
                and SHIM_MODULE in procs.command_line(pid):
            candidates[pid] = (int(rank), int(node))
    return {rank: (pid, node) for pid, (rank, node) in candidates.items()
            if parents.get(pid) not in candidates}


def armed(pid: int) -> bool:
    """Does ``pid`` catch STACK_SIGNAL (the shim's faulthandler is in place)?
    Sent to a process that does not, the signal would end it."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            caught = next((int(line.split()[1], 16) for line in fh
                           if line.startswith("SigCgt:")), 0)
    except (OSError, ValueError):
        return False
    return bool(caught >> (int(STACK_SIGNAL) - 1) & 1)


def dump(run_id: str, run_dirs: dict[int, str], native: bool = False,
         timeout_s: float = 5.0) -> list[dict]:
    """Every rank here; ``run_dirs``: node rank -> run directory (a host may hold several)."""
    found = {rank: v for rank, v in workers(run_id).items() if v[1] in run_dirs}
    recorded: dict[int, str] = {}
    asked = threading.Thread(target=lambda: recorded.update(
        dump_flight_recorders(found, run_dirs)), daemon=True)
    asked.start()
    try:
        stacks = _dump_stacks(run_id, found, run_dirs, native, timeout_s)
    finally:
        asked.join(FLIGHT_RECORDER_WAIT_S + 1)
    return [{**r, **({"flight_recorder": recorded[r["rank"]]} if r["rank"] in recorded else {})}
            for r in stacks]


# How long a rank's flight recorder may take to dump once asked: NCCL's
# monitor thread reads its pipe about once a second, the shim's thread at once,
# but a process's first dump imports torch's compiler modules, which takes
# over 10 s with three ranks importing at once on a busy two-core machine.
# Only a rank that does not dump makes the stop wait this long.
FLIGHT_RECORDER_WAIT_S = 20.0
NCCL_PIPE = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"  # torch's own trigger, <stem><rank>.pipe


def dump_flight_recorders(found: dict[int, tuple[int, int]], run_dirs: dict[int, str],
                          wait_s: float = FLIGHT_RECORDER_WAIT_S) -> dict[int, str]:
    """{rank: "dumped" or why not} for each rank whose flight recorder is on.
    A hang's dumps are what the watchdog's stop would lose."""
    asked: dict[int, tuple[str, float]] = {}
    out: dict[int, str] = {}
    for rank, (pid, node) in found.items():
        env = environ_of(pid)
        target = flight_recorder_target(env, str(rank))
        if target is None:
            continue
        pokes = [flight_recorder_fifo(run_dirs.get(node, ""), str(rank))]
        if env.get(NCCL_PIPE):
            pokes.append(f"{env[NCCL_PIPE]}{rank}.pipe")
        before = _mtime(target)
        if any(_poke(path) for path in pokes):
            asked[rank] = (target, before)
        else:
            out[rank] = "not asked: no flight recorder trigger in place (still starting?)"
    deadline = time.monotonic() + wait_s
    pending = set(asked)
    while pending and time.monotonic() < deadline:
        time.sleep(0.1)
        for rank in list(pending):
            target, before = asked[rank]
            if _mtime(target) > before and time.time() - _mtime(target) > SETTLE_S:
                pending.discard(rank)
                out[rank] = "dumped"
    out.update({rank: f"no dump within {wait_s:g}s" for rank in pending})
    return out


def _poke(path: str) -> bool:
    """Write to a FIFO without blocking; False where nobody reads it."""
    try:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            return False
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader
        return False
    try:
        os.write(fd, b"dump\n")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _dump_stacks(run_id: str, found: dict[int, tuple[int, int]], run_dirs: dict[int, str],
                 native: bool, timeout_s: float) -> list[dict]:
    """Every rank's stack by py-spy where it can, else by the shim's faulthandler."""
    py_spy = shutil.which("py-spy")
    if not py_spy:
        return _faulthandler(run_id, found, run_dirs, timeout_s)
    results: dict[int, dict] = {}
    spy_s = timeout_s * (NATIVE_SLOWER + 1 if native else 1)  # its Python frames after

    def spy(rank: int) -> None:
        pid, node = found[rank]
        text, error = _spied(py_spy, pid, native, timeout_s)
        results[rank] = {"rank": rank, "node_rank": node, "pid": pid, "how": "py-spy",
                         "text": text, "error": error}

    threads = [threading.Thread(target=spy, args=(rank,)) for rank in found]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(spy_s + 5)
    spied = {rank: r for rank, r in results.items() if r["text"]}
    rest = {rank: v for rank, v in found.items() if rank not in spied}
    # the ranks py-spy could not read (ptrace not allowed): faulthandler's, and why
    fallen = [{**r, "error": "; ".join(filter(None, [
                  r["error"], f"py-spy could not read it: {results[r['rank']]['error']}"]))}
              if r["rank"] in results else r
              for r in _faulthandler(run_id, rest, run_dirs, timeout_s)]
    return sorted([*spied.values(), *fallen], key=lambda r: r["rank"])


def _spied(py_spy: str, pid: int, native: bool, timeout_s: float) -> tuple[str, str]:
    """(dump, note) of ``pid`` by py-spy, ``--native`` first where asked; ("", why) if none."""
    errors: list[str] = []
    if native:
        deadline = time.monotonic() + timeout_s * NATIVE_SLOWER
        for _ in range(NATIVE_TRIES):
            text, error = _py_spy_dump(py_spy, pid, ["--native"], deadline - time.monotonic())
            if text:
                return text, ""
            errors.append(error)
            if time.monotonic() >= deadline:
                break
    text, error = _py_spy_dump(py_spy, pid, [], timeout_s)
    if text:
        return text, f"no C/C++ frames: py-spy --native failed: {errors[-1]}" if errors else ""
    return "", "; ".join(dict.fromkeys([*errors, error]))


def _py_spy_dump(py_spy: str, pid: int, flags: list[str], timeout_s: float) -> tuple[str, str]:
    if timeout_s <= 0:
        return "", "no time left"
    try:
        done = subprocess.run([py_spy, "dump", "--pid", str(pid), *flags], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "", f"{' '.join(['py-spy', *flags])} took more than {timeout_s:.3g}s"
    if done.returncode == 0 and done.stdout.strip():
        return done.stdout[-MAX_DUMP:], ""
    return "", (done.stderr.strip() or f"exit {done.returncode}")[-500:]


def _faulthandler(run_id: str, found: dict[int, tuple[int, int]], run_dirs: dict[int, str],
                  timeout_s: float) -> list[dict]:
    """STACK_SIGNAL to every armed rank at once; their dumps, once they settle."""
    unarmed = {rank for rank, (pid, _node) in found.items() if not armed(pid)}
    paths, sizes = {}, {}
    for rank, (pid, node) in found.items():
        paths[rank] = stacks_file(run_dirs.get(node, ""), str(rank))
        sizes[rank] = _size(paths[rank])
    procs.signal_all({pid for rank, (pid, _node) in found.items() if rank not in unarmed},
                     STACK_SIGNAL,
                     still_ours=lambda pid: procs.has_marker(pid, (f"DDP_ORCH_RUN_ID={run_id}",))
                     and armed(pid))
    deadline = time.monotonic() + timeout_s
    pending = set(found) - unarmed
    last_growth = {rank: time.monotonic() for rank in found}
    seen = dict(sizes)
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        for rank in list(pending):
            size = _size(paths[rank])
            if size != seen[rank]:
                seen[rank], last_growth[rank] = size, time.monotonic()
                continue
            quiet = time.monotonic() - last_growth[rank]
            if size > sizes[rank] and quiet > SETTLE_S and (
                    quiet > PARTIAL_SETTLE_S
                    or dump_looks_whole(_read_from(paths[rank], sizes[rank]))):
                pending.discard(rank)
    out = []
    for rank in sorted(found):
        pid, node = found[rank]
        text = "" if rank in unarmed else _read_from(paths[rank], sizes[rank])
        error = ("its stack dump handler is not in place (still starting, or its stacks "
                 "file could not be opened): not signalled" if rank in unarmed else
                 "" if text else f"no dump within {timeout_s:g}s (the rank may be stopped)")
        out.append({"rank": rank, "node_rank": node, "pid": pid, "how": "faulthandler",
                    "text": text, "error": error})
    return out


def dump_looks_whole(text: str) -> bool:
    """Does a faulthandler dump end where a whole one does: in runpy's frame
    (the main thread, listed last), or in the ``...`` of a deep stack?"""
    last = text.rstrip("\n").rpartition("\n")[2]
    return text.endswith("\n") and (last.endswith(" in _run_module_as_main")
                                     or last.strip() == "...")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(MAX_DUMP).decode("utf-8", "replace")
    except OSError:
        return ""
