"""``ddp-orch down RUN``: SIGTERM to a live controller first, then the backend
cancels what is left, never by process name. The controller is signalled only
while it still is the recorded process, pinned by a pidfd where the kernel can,
so its pid cannot be reused between the check and the signal."""

from __future__ import annotations

import os
import select
import signal
import time
from typing import Callable

from ..backends import backend_of
from ..backends.base import CancelResult
from ..engine.options import LaunchOptions
from ..records.store import RunRecord, controller_alive, recorded_elsewhere

Note = Callable[[str], None]


def stopper() -> str:
    """Who stops a run with ``down``, as its nodes and its summary say it."""
    return f"`ddp-orch down` from {os.uname().nodename}"


def down(record: RunRecord, grace_s: float = 5.0,
         note: Note | None = None) -> tuple[bool, list[CancelResult]]:
    """Stop the run's controller (if alive) and its processes on every node; ``note``
    gets a line for what could not be done about the controller."""
    stopped_controller = _stop_controller(record, grace_s + 15, note or (lambda _: None))
    backend = backend_of(record, LaunchOptions(grace_s=grace_s,
                                               stopped_by=f"stopped by {stopper()}"))
    return stopped_controller, backend.cancel(record)


def _stop_controller(record: RunRecord, timeout_s: float, note: Note = lambda _: None) -> bool:
    """SIGTERM the run's controller if it still is the recorded process, then wait
    up to ``timeout_s`` for it to end. True if it was signalled."""
    pid = record.controller_pid
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    if recorded_elsewhere(record):
        if record.live:
            note(f"its controller (pid {pid}) runs on {record.controller.get('host')}, "
                 "not here: stop it there, or run `ddp-orch down` on that host")
        return False
    pidfd = _pidfd_open(pid)
    try:
        # with a pidfd, the check is about the very process the signal goes to
        if not controller_alive(record):
            return False
        record.run.leave_stop_request(stopper())  # the signal does not say who sent it
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signal.SIGTERM)
            else:
                os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return False  # it ended meanwhile
        except PermissionError:
            note(f"not allowed to signal its controller (pid {pid}, another user's "
                 "process): stop it as that user")
            return False
        _wait_gone(record, pidfd, timeout_s)
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid``, or None (no such process, or no pidfd support)."""
    if not (hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:  # gone (then the check says so), or ENOSYS / a seccomp filter
        return None


def _wait_gone(record: RunRecord, pidfd: int | None, timeout_s: float) -> None:
    if pidfd is not None:
        poller = select.poll()  # a pidfd turns readable when its process ends
        poller.register(pidfd, select.POLLIN)
        poller.poll(max(0, int(timeout_s * 1000)))
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and controller_alive(record):
        time.sleep(0.1)

