"""A kept run's mailbox: its run directory, where the keeper and whoever
asks of it (``down``, a follower, the controller) meet without a channel.

The keeper is found by its recorded pid and start time, never by name.
Every attached follower holds ``layout.FOLLOWER_LOCK``: the kernel drops it
however the follower ends (``kill -9`` too), so the keeper sees it go.
Files are opened with ``O_NOFOLLOW``: a planted symlink is refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time

from .. import layout
from ..node.procs import running, start_time
from ..wire.runstate import RunState

DOWN_REASON = "stopped by `ddp-orch down`"  # down says from where (its ``why``)


def recorded(run_dir: str) -> dict | None:
    """``keeper.json`` here, or None; OSError or ValueError if unreadable."""
    try:
        fd = os.open(os.path.join(run_dir, layout.KEEPER_STATE), os.O_RDONLY | os.O_NOFOLLOW)
        with open(fd, encoding="utf-8") as fh:
            found = json.load(fh)
    except FileNotFoundError:
        return None
    if not isinstance(found, dict):
        raise ValueError("not a JSON object")
    return found


def _live_pid(record: dict | None) -> int | None:
    """The recorded keeper's pid, if that very process still runs (same start
    time, not a zombie: a container's pid 1 may reap it late or never)."""
    try:
        pid = int(record["pid"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None
    if record.get("start_time") is None or start_time(pid) != record.get("start_time"):
        return None
    return pid if running(pid) else None


def keeper_pid(run_dir: str) -> int | None:
    """The run's keeper here, if it still runs."""
    try:
        return _live_pid(recorded(run_dir))
    except (OSError, ValueError):
        return None


def state(run_dir: str) -> dict:
    """``serve``'s ``keeper``: the record, whether it runs, and ``now`` (its clock)."""
    try:
        record = recorded(run_dir)
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": f"{layout.KEEPER_STATE}: {exc}"}
    return {"ok": True, "keeper": record, "alive": _live_pid(record) is not None,
            "now": time.time()}


def open_lock(run_dir: str) -> int:
    return os.open(os.path.join(run_dir, layout.FOLLOWER_LOCK),
                   os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def follower_present(run_dir: str) -> bool:
    """Does an attached follower (``follow``) run for this run directory now?"""
    try:
        fd = open_lock(run_dir)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True  # a follower holds it
    except OSError:
        return False
    finally:
        os.close(fd)  # and with it the lock, if we took it
    return False


def signal_keeper(run_dir: str, sig: int = signal.SIGTERM, why: str = "") -> int | None:
    """Signal the run's keeper, leaving ``why`` (who asks) for it first."""
    pid = keeper_pid(run_dir)
    if pid is not None:
        if why:
            leave_stop_request(run_dir, why)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return None
    return pid


STOP_REQUEST_MAX = 200  # bytes of a stop request the keeper reads


def leave_stop_request(run_dir: str, why: str) -> None:
    """The first request stays: the stop it explains is the first one."""
    try:
        fd = os.open(os.path.join(run_dir, layout.STOP_REQUEST),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return  # one is there already, or none can be: the keeper says which signal
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(why.encode("utf-8", "replace")[:STOP_REQUEST_MAX])
    except OSError:
        pass  # a full disk: the stop itself (the signal after this) matters, not its words


def stop_request(run_dir: str) -> str:
    """Why the keeper was asked to stop ("" if none): one printable line."""
    try:
        fd = os.open(os.path.join(run_dir, layout.STOP_REQUEST), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as fh:
        text = fh.read(STOP_REQUEST_MAX).decode("utf-8", "replace")
    return "".join(c for c in text.split("\n")[0] if c.isprintable()).strip()


def stop(run_dir: str, wait_s: float, why: str = DOWN_REASON) -> int | None:
    """SIGTERM the keeper and wait for it to tear its node down."""
    pid = signal_keeper(run_dir, why=why)
    deadline = time.monotonic() + wait_s
    while pid is not None and keeper_pid(run_dir) == pid and time.monotonic() < deadline:
        time.sleep(0.1)
    return pid


def ended(run_dir: str) -> bool:
    """Whether the keeper's record says its run has ended here."""
    try:
        return (recorded(run_dir) or {}).get("state") not in (RunState.RUNNING, None)
    except (OSError, ValueError):
        return False
