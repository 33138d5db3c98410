"""The agent's side of a kept run's channel: start the keeper, follow it, stop it.

``start`` (``serve``'s ``detach``) makes the node's keeper (``keeper.py``)
a daemon: forked twice, in a session of its own, stdin from /dev/null and
everything it writes going to ``agent.out`` in its run directory, so no
SSH channel, terminal or controller holds it. Forked, not started afresh:
the agent package lives only in this process's memory (``bootstrap``).

``follow`` (``serve``'s ``follow``) streams ``agent.out`` to the
controller from an offset, or its last N lines, until the keeper has
ended and every byte is sent. On the same channel the controller sends
``ping``, ``stop`` (SIGTERM to the keeper: the gang stops) and ``kill``
(a second SIGTERM: no grace period). Losing the controller (EOF, or no
ping for ``PEER_TIMEOUT_S``) ends the follower; for a run whose rule is
``attached`` it stops the keeper first, for a ``detached`` one it just
leaves. The stream is never quiet while the keeper lives: its supervisor
beats every ``HEARTBEAT_S``, and between attempts the keeper itself does.
So a stream that goes quiet is a keeper that stopped (SIGSTOP, a hung
host) and the controller's silence rule sees it, which a heartbeat of the
follower's own would hide.

An attached follower holds a shared lock on ``follower.lock`` in the run
directory for as long as it runs; the kernel drops it however the follower
ends (``kill -9`` included), so the keeper of an attached run sees its
follower go (``follower_present``) and stops the gang itself.

``signal_keeper`` is ``down``'s way in, and a follower's: the keeper is found
by the pid and start time it records in ``keeper.json``, never by name. A
signal does not say who sent it, so the sender first leaves its reason in
the run directory (``STOP_REQUEST``; the first one stays), and the keeper
records "stopped by `ddp-orch down` from HOST", the controller's own
reason for a stop ("stopped by Ctrl-C on the controller"), or "lost the
controller (nothing from it for 30s)" where it would say only "got
SIGTERM".

Files here are opened with ``O_NOFOLLOW``: a symlink planted in the run
directory is refused, never written through.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import sys
import threading
import time

from . import peers
from .spec import KeeperSpec
from ..node import gpuclaim, probes
from ..node.spec import SpecError
from .. import layout
from ..node.procs import running, start_time
from ..wire.protocol import (CONTROL_PREFIX, HEARTBEAT_S, PEER_TIMEOUT_S, Control, Reader,
                             controller_silent_for)

FOLLOW_POLL_S = 0.05
FIND_KEEPER_S = 10.0  # a keeper just started writes keeper.json within this


def start(asked: dict, listen: bool) -> dict:
    """Fork the keeper off as a daemon; its pid, and node 0's gang port
    (none for a run of one node: there is nobody to link to it). The port
    listens on the address the other nodes reach node 0 at, the gang's
    ``addr`` (the run's master address; ``peers.listener``). ``asked`` is the
    controller's spec (``KeeperSpec.to_dict``), checked before anything
    forks: a bad one is refused, naming the field."""
    try:
        spec = KeeperSpec.from_dict(asked)
    except SpecError as exc:
        return {"ok": False, "error": str(exc)}
    run_dir = spec.supervisor.run_dir
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    sock = None
    if listen and spec.nnodes > 1:
        sock, note = peers.listener(spec.gang.addr, avoid=spec.supervisor.master_port)
        spec = dataclasses.replace(spec, gang=dataclasses.replace(spec.gang, listen_note=note))
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    child = os.fork()
    if child == 0:  # pragma: no cover (runs in the forked children)
        code = 1
        try:
            os.close(read_end)
            os.setsid()
            if os.fork() > 0:
                os._exit(0)
            # The run's GPU locks stay with the keeper, across restarts (``gpuclaim``).
            _become_daemon(run_dir, keep={write_end, sock.fileno() if sock else -1,
                                          *gpuclaim.held_fds(), *probes.held_fds()})
            os.write(write_end, str(os.getpid()).encode())
            os.close(write_end)
            code = keeper_for(spec, sock).run()
        except BaseException as exc:  # noqa: BLE001 (a daemon reports, then ends)
            os.write(2, f"ddp-orch: keeper failed to start: {exc!r}\n".encode())
        os._exit(code)
    os.close(write_end)
    probes.release_ports()  # the keeper holds the master port now, for its torchrun
    os.waitpid(child, 0)
    with os.fdopen(read_end, "rb") as fh:
        said = fh.read()
    if sock is not None:
        port = sock.getsockname()[1]
        sock.close()  # the keeper holds its own copy
    else:
        port = None
    if not said.isdigit():
        return {"ok": False, "error": "the keeper did not start; see agent.out in the run "
                                      "directory"}
    return {"ok": True, "pid": int(said), "gang_port": port}


def keeper_for(spec: KeeperSpec, listener=None):
    """The keeper of ``spec``'s node: node 0's is the head (listening on
    ``listener``, the gang's port), every other node's a member. (Imported
    here, not at the top: the keepers import this module.)"""
    from .head import Head
    from .member import Member

    if spec.node_rank == 0:
        return Head(spec, listener)
    return Member(spec)


def _become_daemon(run_dir: str, keep: set[int]) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    out = os.open(os.path.join(run_dir, layout.STREAM),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    # Whatever sys.stdout was (a test harness's capture, say), it is fd 1 now.
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the keeper installs its own


def _recorded(run_dir: str) -> dict | None:
    """The keeper's ``keeper.json`` here (None: there is none); OSError or
    ValueError when it cannot be read."""
    try:
        fd = os.open(os.path.join(run_dir, layout.KEEPER_STATE), os.O_RDONLY | os.O_NOFOLLOW)
        with open(fd, encoding="utf-8") as fh:
            recorded = json.load(fh)
    except FileNotFoundError:
        return None
    if not isinstance(recorded, dict):
        raise ValueError("not a JSON object")
    return recorded


def _live_pid(recorded: dict | None) -> int | None:
    """The recorded keeper's pid, if that very process still runs (pid and
    start time as recorded, and not a zombie: a daemon's reaper, a
    container's pid 1 say, may reap it late or never)."""
    try:
        pid = int(recorded["pid"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None
    if recorded.get("start_time") is None or start_time(pid) != recorded.get("start_time"):
        return None
    return pid if running(pid) else None


def keeper_pid(run_dir: str) -> int | None:
    """The run's keeper here, if it still runs."""
    try:
        return _live_pid(_recorded(run_dir))
    except (OSError, ValueError):
        return None


def state(run_dir: str) -> dict:
    """``serve``'s ``keeper``: the keeper's record here, whether it still runs,
    and this node's clock (``now``: its record's times are on it)."""
    try:
        recorded = _recorded(run_dir)
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": f"{layout.KEEPER_STATE}: {exc}"}
    return {"ok": True, "keeper": recorded, "alive": _live_pid(recorded) is not None,
            "now": time.time()}


def _open_lock(run_dir: str) -> int:
    return os.open(os.path.join(run_dir, layout.FOLLOWER_LOCK),
                   os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def follower_present(run_dir: str) -> bool:
    """Does an attached follower (``follow``) run for this run directory now?"""
    try:
        fd = _open_lock(run_dir)
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
    """Signal the run's keeper; ``why`` (who asks, and why) is left for it
    first (``stop_request``)."""
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
    """Why the keeper was asked to stop, as its sender left it ("" if none):
    one line of printable text, capped."""
    try:
        fd = os.open(os.path.join(run_dir, layout.STOP_REQUEST), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as fh:
        text = fh.read(STOP_REQUEST_MAX).decode("utf-8", "replace")
    return "".join(c for c in text.split("\n")[0] if c.isprintable()).strip()


DOWN_REASON = "stopped by `ddp-orch down`"  # down says from where (its ``why``)
SILENT_CONTROLLER = controller_silent_for(PEER_TIMEOUT_S)
CLOSED_CONTROLLER = "lost the controller (its connection closed)"


def stop(run_dir: str, wait_s: float, why: str = DOWN_REASON) -> int | None:
    """SIGTERM the keeper and wait for it to tear its node down (``down``;
    ``why``: who asks, which the keeper records)."""
    pid = signal_keeper(run_dir, why=why)
    deadline = time.monotonic() + wait_s
    while pid is not None and keeper_pid(run_dir) == pid and time.monotonic() < deadline:
        time.sleep(0.1)
    return pid


def follow(run_dir: str, stdin: Reader, *, offset: int = 0, lines: int | None = None,
           attached: bool = False) -> None:
    """Stream ``agent.out`` from ``offset`` (or its last ``lines`` lines)
    until the keeper is gone and the file is drained, or the controller goes."""
    path = os.path.join(run_dir, layout.STREAM)
    held = None
    if attached:  # the keeper watches this lock: it goes with us, however we go
        try:
            held = _open_lock(run_dir)
            fcntl.flock(held, fcntl.LOCK_SH)
        except OSError:
            pass
    deadline = time.monotonic() + FIND_KEEPER_S
    pid = keeper_pid(run_dir)
    while pid is None and time.monotonic() < deadline and not _ended(run_dir):
        time.sleep(FOLLOW_POLL_S)
        pid = keeper_pid(run_dir)
    gone = threading.Event()
    heard = [time.monotonic()]

    def listen() -> None:
        while True:
            try:
                line = stdin.readline().strip()
            except (OSError, ValueError):
                line = b""
            heard[0] = time.monotonic()
            if not line and stdin.eof:
                if attached:
                    signal_keeper(run_dir, why=CLOSED_CONTROLLER)
                gone.set()
                return
            word = Control.parse(line)
            if word is Control.STOP:  # the controller's reason for the stop, for the keeper
                signal_keeper(run_dir, why=Control.reason(line))
            elif word is Control.KILL:  # a second signal: the keeper skips the grace period
                signal_keeper(run_dir)
                time.sleep(0.1)
                signal_keeper(run_dir)

    def watchdog() -> None:
        """A controller silent for PEER_TIMEOUT_S (a frozen link: a write to it
        may block forever) ends this follower, and under the attached rule
        its keeper too."""
        while not gone.wait(1.0):
            if time.monotonic() - heard[0] > PEER_TIMEOUT_S:
                if attached:
                    signal_keeper(run_dir, why=SILENT_CONTROLLER)
                os._exit(0)

    threading.Thread(target=listen, daemon=True).start()
    threading.Thread(target=watchdog, daemon=True).start()
    out = sys.stdout.buffer
    sent_at, whole = time.monotonic(), True  # whole: what was sent ends a line
    try:
        fh = open(path, "rb")
    except OSError as exc:  # the channel ends without a finished event: "lost contact"
        out.write(f"ddp-orch: no stream to follow here: {exc}\n".encode())
        out.flush()
        return
    full_said = False
    with fh:
        fh.seek(offset_of_last_lines(fh, lines) if lines is not None else offset)
        while not gone.is_set():
            alive = keeper_pid(run_dir) is not None
            data = fh.read(1 << 20)
            if not data and not full_said and time.monotonic() - sent_at > 2 * HEARTBEAT_S:
                full = probes.disk_full(run_dir)  # the keeper cannot write the stream we follow
                if full:
                    data, full_said = f"ddp-orch: {full}\n".encode(), True
            if data:
                try:
                    out.write(data)
                    out.flush()
                except (BrokenPipeError, ValueError):
                    if attached:
                        signal_keeper(run_dir, why=CLOSED_CONTROLLER)
                    return
                sent_at, whole = time.monotonic(), data.endswith(b"\n")
                continue
            if not alive:
                return
            gone.wait(FOLLOW_POLL_S * 4)


def _ended(run_dir: str) -> bool:
    try:
        return (_recorded(run_dir) or {}).get("state") not in ("running", None)
    except (OSError, ValueError):
        return False


def offset_of_last_lines(fh, lines: int) -> int:
    """Where the node's last ``lines`` lines of output begin in the stream
    (looking back 8 MiB at most). Only output counts: the control lines
    among it (``CONTROL_PREFIX``: heartbeats every few seconds, a
    worker's exit, the keeper's end) are streamed, never shown, so they
    are not among the N (``attach --lines N``)."""
    end = fh.seek(0, os.SEEK_END)
    start = max(0, end - (8 << 20))
    fh.seek(start)
    data = fh.read()
    parts = data.split(b"\n")  # the last one: what follows the last newline
    offset = len(data) - len(parts[-1])
    counted = 0
    for part in reversed(parts[:-1]):
        if counted >= lines:
            break
        offset -= len(part) + 1
        if not part.startswith(CONTROL_PREFIX):
            counted += 1
    return start + offset
