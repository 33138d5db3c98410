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

An attached follower holds the run directory's follower lock while it
runs, and signals the keeper with its reason (the controller's own "stopped
by Ctrl-C on the controller", or "lost the controller (nothing from it for
30s)"); both go through the run directory, ``mailbox.py``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import signal
import sys
import threading
import time

from . import mailbox, peers
from .head import Head
from .member import Member
from .spec import KeeperSpec
from ..node import probes
from ..node.holdings import Holdings
from ..node.spec import SpecError
from .. import layout
from ..node.stream import offset_of_last_lines
from ..wire.protocol import (HEARTBEAT_S, PEER_TIMEOUT_S, Control, Reader,
                             controller_silent_for)

FOLLOW_POLL_S = 0.05
FIND_KEEPER_S = 10.0  # a keeper just started writes keeper.json within this


def start(asked: dict, listen: bool, holdings: Holdings | None = None) -> dict:
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
    holdings = holdings or Holdings()
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
            # The run's GPU locks and port stay with the keeper, across restarts.
            _become_daemon(run_dir, keep={write_end, sock.fileno() if sock else -1,
                                          *holdings.fds()})
            os.write(write_end, str(os.getpid()).encode())
            os.close(write_end)
            code = keeper_for(spec, sock, holdings).run()
        except BaseException as exc:  # noqa: BLE001 (a daemon reports, then ends)
            os.write(2, f"ddp-orch: keeper failed to start: {exc!r}\n".encode())
        os._exit(code)
    os.close(write_end)
    holdings.release_ports()  # the keeper holds the master port now, for its torchrun
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


def keeper_for(spec: KeeperSpec, listener=None, holdings: Holdings | None = None):
    """The keeper of ``spec``'s node: node 0's is the head (listening on
    ``listener``, the gang's port), every other node's a member; it takes
    over what the agent held for the run (``holdings``)."""
    if spec.node_rank == 0:
        return Head(spec, listener, holdings)
    return Member(spec, holdings)


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


SILENT_CONTROLLER = controller_silent_for(PEER_TIMEOUT_S)
CLOSED_CONTROLLER = "lost the controller (its connection closed)"


def follow(run_dir: str, stdin: Reader, *, offset: int = 0, lines: int | None = None,
           attached: bool = False) -> None:
    """Stream ``agent.out`` from ``offset`` (or its last ``lines`` lines)
    until the keeper is gone and the file is drained, or the controller goes."""
    path = os.path.join(run_dir, layout.STREAM)
    held = None
    if attached:  # the keeper watches this lock: it goes with us, however we go
        try:
            held = mailbox.open_lock(run_dir)
            fcntl.flock(held, fcntl.LOCK_SH)
        except OSError:
            pass
    deadline = time.monotonic() + FIND_KEEPER_S
    pid = mailbox.keeper_pid(run_dir)
    while pid is None and time.monotonic() < deadline and not mailbox.ended(run_dir):
        time.sleep(FOLLOW_POLL_S)
        pid = mailbox.keeper_pid(run_dir)
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
                    mailbox.signal_keeper(run_dir, why=CLOSED_CONTROLLER)
                gone.set()
                return
            word = Control.parse(line)
            if word is Control.STOP:  # the controller's reason for the stop, for the keeper
                mailbox.signal_keeper(run_dir, why=Control.reason(line))
            elif word is Control.KILL:  # a second signal: the keeper skips the grace period
                mailbox.signal_keeper(run_dir)
                time.sleep(0.1)
                mailbox.signal_keeper(run_dir)

    def watchdog() -> None:
        """A controller silent for PEER_TIMEOUT_S (a frozen link: a write to it
        may block forever) ends this follower, and under the attached rule
        its keeper too."""
        while not gone.wait(1.0):
            if time.monotonic() - heard[0] > PEER_TIMEOUT_S:
                if attached:
                    mailbox.signal_keeper(run_dir, why=SILENT_CONTROLLER)
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
            alive = mailbox.keeper_pid(run_dir) is not None
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
                        mailbox.signal_keeper(run_dir, why=CLOSED_CONTROLLER)
                    return
                sent_at, whole = time.monotonic(), data.endswith(b"\n")
                continue
            if not alive:
                return
            gone.wait(FOLLOW_POLL_S * 4)


