"""A run's ``setup:`` on one node: its commands, in the code root, before torchrun.

Every path (attached, kept, a Slurm job's node) runs it here alike. Each
command runs in a session of its own, so a timeout or a stop ends all it
started. The first command that fails, or outlasts the node's setup
timeout, ends the setup; the report names it with its last lines.
"""

from __future__ import annotations

import os
import select
import shlex
import signal
import subprocess
import time
from typing import Callable

PREFIX = b"[setup]: "
TAIL_BYTES = 65536  # of a command's output, kept for its failure report
LAST_LINES = 5  # of them in the report
TIMEOUT_CODE = 124  # as timeout(1) exits
KILL_GRACE_S = 2.0  # SIGTERM, then SIGKILL, for a command that is stopped or timed out
REPORT_CHARS = 300  # the failure message: the most one line of a kept run's record keeps


def shown(argv: list[str]) -> str:
    """A command as one line of shell text (``sh -c 'pip install ...'``)."""
    text = shlex.join(argv)
    return text if len(text) <= 100 else text[:97] + "..."


def run_setup(commands: list[list[str]], cwd: str, env: dict[str, str], timeout_s: float,
              write: Callable[[bytes], None], stopped: Callable[[], bool],
              on_start: Callable[[int], None] = lambda pid: None) -> dict:
    """Run ``commands`` in ``cwd``; ``write`` gets their output, prefixed, and
    ``stopped()`` (asked every 0.2 s at most) ends the command running."""
    began = time.monotonic()
    deadline = began + timeout_s
    for i, argv in enumerate(commands):
        write(f"ddp-orch: setup {i + 1}/{len(commands)} in {cwd}: {shown(argv)}\n".encode())
        code, tail, why = _run_one(argv, cwd, env, deadline, write, stopped, on_start,
                                   timeout_s)
        if code == 0 and not why:
            continue
        lines = [line for line in tail.decode("utf-8", "replace").splitlines() if line.strip()]
        last = lines[-LAST_LINES:]
        return {"ok": False, "stopped": why == "stopped", "code": code,
                "command": shown(argv), "last_lines": last,
                "message": failure_message(shown(argv), why or f"exited {code}", last),
                "duration_s": round(time.monotonic() - began, 3)}
    took = time.monotonic() - began
    write(f"ddp-orch: setup done in {took:.1f}s\n".encode())
    return {"ok": True, "duration_s": round(took, 3)}


def failure_message(command: str, how: str, last: list[str]) -> str:
    """``setup failed: `CMD` exited 1; last lines: a | b``, ``REPORT_CHARS`` at most."""
    head = f"setup failed: `{command}` {how}"
    if not last:
        return head[:REPORT_CHARS]
    rest = " | ".join(line.strip() for line in last)
    room = REPORT_CHARS - len(head) - len("; last lines: ")
    if room < 20:
        return head[:REPORT_CHARS]
    if len(rest) > room:
        rest = "..." + rest[-(room - 3):]
    return f"{head}; last lines: {rest}"


def _run_one(argv: list[str], cwd: str, env: dict[str, str], deadline: float,
             write: Callable[[bytes], None], stopped: Callable[[], bool],
             on_start: Callable[[int], None], timeout_s: float) -> tuple[int, bytes, str]:
    """(exit code, the output's tail, "" or why it was ended)."""
    try:
        child = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    except OSError as exc:  # no such program, not executable, no such directory
        message = f"cannot run it: {exc.strerror or exc}"
        write(PREFIX + message.encode() + b"\n")
        return 127, message.encode(), f"could not start ({exc.strerror or exc})"
    on_start(child.pid)
    fd = child.stdout.fileno()
    pending, tail, why = b"", b"", ""
    exited_at = None
    while True:
        if why == "" and stopped():
            why = "stopped"
            _end(child)
        elif why == "" and time.monotonic() >= deadline:
            why = f"timed out after {timeout_s:g}s (setup_timeout)"
            _end(child)
        if exited_at is None and child.poll() is not None:
            exited_at = time.monotonic()
        # A command that left a child holding the pipe (``cmd &``) is done
        # once it has exited and the pipe is quiet for a moment.
        if exited_at is not None and time.monotonic() - exited_at > 0.5:
            break
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data = pending + chunk
        cut = data.rfind(b"\n") + 1
        pending = data[cut:]
        if len(pending) > TAIL_BYTES:  # a line that never ends: pass it on as is
            cut, pending = len(data), b""
        if cut:
            block = data[:cut]
            write(b"".join(PREFIX + line for line in block.splitlines(keepends=True)))
            tail = (tail + block)[-TAIL_BYTES:]
    if pending:
        write(PREFIX + pending + b"\n")
        tail = (tail + pending + b"\n")[-TAIL_BYTES:]
    child.stdout.close()
    code = child.wait()
    if why:
        return (TIMEOUT_CODE if why.startswith("timed out") else code or 1), tail, why
    return code, tail, ""


def _end(child: subprocess.Popen) -> None:
    """SIGTERM the command's session, a grace period, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            child.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
