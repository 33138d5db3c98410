"""``ddp-orch down RUN``: end whatever of a run still runs, from its records.

A live controller of the run is asked to stop first (SIGTERM, which ``up``
turns into its graceful teardown); then the run's backend cancels what is
left on the nodes (``LaunchBackend.cancel``), never by process name.
Running it twice is harmless: the second time there is nothing left.
"""

from __future__ import annotations

import os
import signal
import time

from ..backends import get_backend
from ..backends.base import CancelResult, LaunchOptions
from ..records.store import RunRecord, process_alive


def down(record: RunRecord, grace_s: float = 5.0) -> tuple[bool, list[CancelResult]]:
    """Stop the run's controller (if alive) and its processes on every node."""
    stopped_controller = _stop_controller(record.controller_pid, grace_s + 15)
    backend = get_backend(record.backend, LaunchOptions(grace_s=grace_s))
    return stopped_controller, backend.cancel(record)


def _stop_controller(pid: int | None, timeout_s: float) -> bool:
    if pid is None or pid == os.getpid() or not process_alive(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process_alive(pid):
        time.sleep(0.1)
    return True
