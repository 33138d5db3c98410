"""One node of a running launch: its supervisor, output relay and outcome."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from . import supervisor
from .console import Console
from .plan import NodePlan
from .render import scrub, secret_values
from .runs import RunDir
from .transport.base import ProcessHandle, Transport

BUNDLE_NAME = "bundle.tar.gz"
# Exit code ProcessHandle.poll gives when the connection died without a status.
LOST = 255

# What a node runs first, while the controller still asks for its home and
# uploads: it waits for one line, the supervisor's argv as JSON, then becomes
# the supervisor (exec: same pid, a fresh interpreter). So the remote
# command's start (over SSH: a session, the login shell, its ~/.bashrc)
# overlaps that work instead of following it. EOF before that line means the
# launch was abandoned; it exits having started nothing.
STANDBY = """import json, os, sys
line = b""
while not line.endswith(b"\\n"):
    byte = os.read(0, 1)  # unbuffered: the supervisor reads the rest of stdin
    if not byte:
        sys.exit(0)
    line += byte
os.execv(sys.executable, [sys.executable, *json.loads(line)])
"""


def open_standby(transport: Transport, python: str) -> ProcessHandle:
    """Start a node's STANDBY; ``NodeHandle.start`` turns it into the supervisor."""
    return transport.start([python, "-c", STANDBY])


def discard_standby(standby: ProcessHandle) -> None:
    """EOF to a standby that was never told to start: it exits at once."""
    standby.close_stdin()
    try:
        standby.wait(timeout=5.0)
    except TimeoutError:
        standby.abort()


@dataclass(frozen=True)
class NodeOutcome:
    """How one node ended. ``state``: succeeded, failed, stopped, lost, not-started."""

    node_rank: int
    host: str
    state: str
    exit_code: int | None
    reason: str
    ended_at: float | None  # time.time() when the controller saw it end
    failures: tuple[dict, ...] = ()

    @property
    def first_failure_ts(self) -> float | None:
        stamps = [f["timestamp"] for f in self.failures if f.get("timestamp")]
        return min(stamps) if stamps else self.ended_at


def supervisor_spec(node: NodePlan, run_id: str, grace_s: float) -> dict:
    """The JSON the node supervisor reads: the plan's env and argv, verbatim."""
    return {"run_id": run_id, "node_rank": node.node_rank, "run_dir": node.run_dir,
            "first_rank": node.first_rank, "nproc": node.nproc,
            "master_port": node.argv[node.argv.index("--master-port") + 1],
            "argv": list(node.argv), "env": dict(node.env),
            "unset_env": list(node.unset_env), "bundle": BUNDLE_NAME, "grace_s": grace_s}


class NodeHandle:
    """Starts a node's supervisor through its transport and relays its output."""

    def __init__(self, node: NodePlan, transport: Transport, run: RunDir, console: Console,
                 on_change: Callable[[], None] = lambda: None,
                 standby: ProcessHandle | None = None):
        self.node = node
        self.on_change = on_change  # called once the node's command has ended
        self.standby = standby  # from open_standby, if the caller started it early
        self.transport = transport
        self.run = run
        self.console = console
        self.process: ProcessHandle | None = None
        self.control: dict | None = None
        self.stop_sent = False
        self.joined = False  # torchrun reached the rendezvous store on node 0
        self.started = False  # torchrun spawned workers: the rendezvous completed
        self.timed_out = False
        self.ended_at: float | None = None
        self._relay: threading.Thread | None = None

    def prepare(self, bundle_path: str, run_id: str, grace_s: float) -> None:
        """Upload the supervisor, the code bundle and the node's spec."""
        spec_local = self.run.file(f"node-{self.node.node_rank}.spec.json")
        fd = os.open(spec_local, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(supervisor_spec(self.node, run_id, grace_s), fh)
        put = self.transport.put_file
        here = os.path.dirname(supervisor.__file__)
        for name in supervisor.SHIPPED:
            put(os.path.join(here, name), f"{self.node.run_dir}/{name}", 0o600)
        put(bundle_path, f"{self.node.run_dir}/{BUNDLE_NAME}", 0o600)
        put(spec_local, f"{self.node.run_dir}/spec.json", 0o600)
        os.unlink(spec_local)  # it holds env values in clear; the node keeps its copy

    def start(self) -> None:
        """Turn the standby into the supervisor. A standby that already died
        (say, no such python) fails the node through the usual outcome."""
        process = self.standby or open_standby(self.transport, self.node.python)
        run_dir = self.node.run_dir
        argv = [f"{run_dir}/supervisor.py", f"{run_dir}/spec.json"]
        process.send((json.dumps(argv) + "\n").encode())
        self.process = process
        self._relay = threading.Thread(target=self._relay_output, daemon=True,
                                       name=f"relay-node{self.node.node_rank}")
        self._relay.start()

    def _relay_output(self) -> None:
        """Copy what the node prints to its log and the console; take out the
        supervisor's control lines.

        Whole blocks of lines at a time: one log write and one console write
        per read, not per line. Per-line relaying cost seconds of controller
        CPU on a chatty job (bench/log_relay.py). Control lines always start
        a line of their own (the supervisor sees to it).
        """
        assert self.process is not None
        prefix = supervisor.CONTROL_PREFIX.encode()
        secrets = secret_values(self.node.env)
        with open(self.run.node_log(self.node.node_rank), "ab") as log:
            for block in _line_blocks(self.process.read_chunk):
                if prefix in block:
                    block = self._take_events(block, prefix)
                if secrets:
                    block = scrub(block, secrets)
                if block:
                    log.write(block)
                    log.flush()
                    self.console.node_lines(self.node.node_rank, self.node.host,
                                            block.decode("utf-8", "replace"))
        try:  # output ends just before the exit status arrives
            self.process.wait(timeout=10.0)
        except TimeoutError:
            pass
        self.on_change()

    def _take_events(self, block: bytes, prefix: bytes) -> bytes:
        kept = []
        for line in block.splitlines(keepends=True):
            if line.startswith(prefix):
                self._on_event(line[len(prefix):])
            else:
                kept.append(line)
        return b"".join(kept)

    def _on_event(self, payload: bytes) -> None:
        try:
            event = json.loads(payload)
        except ValueError:
            return
        if event.get("event") == "joined":
            self.joined = True
        elif event.get("event") == "started":
            self.joined = self.started = True
        elif event.get("event") == "exit":
            self.control = event

    def poll(self) -> int | None:
        if self.process is None:
            return None
        code = self.process.poll()
        if code is not None and self.ended_at is None:
            self.ended_at = time.time()
        return code

    def stop(self) -> None:
        """Ask the supervisor for a graceful teardown (SIGTERM, grace, SIGKILL)."""
        if self.process is not None and self.poll() is None and not self.stop_sent:
            self.stop_sent = True
            self.process.send(b"stop\n")

    def kill(self) -> None:
        """Ask the supervisor to SIGKILL the run now; closing stdin backs it up."""
        if self.process is not None and self.poll() is None:
            self.stop_sent = True
            self.process.send(b"kill\n")
            self.process.close_stdin()

    def discard_standby(self) -> None:
        """The launch ended before this node started: let its standby go."""
        if self.process is None and self.standby is not None:
            standby, self.standby = self.standby, None
            discard_standby(standby)

    def abort(self) -> None:
        """Cut the supervisor off. Last resort: only it can reach the workers."""
        if self.process is not None and self.poll() is None:
            self.process.abort()

    def finish(self, timeout: float = 5.0) -> NodeOutcome:
        """Drain the relay and describe how the node ended."""
        if self._relay is not None:
            self._relay.join(timeout)
        code = self.poll()
        control = self.control or {}
        failures = tuple(control.get("failures", ()))
        if self.process is None:
            state, reason = "not-started", "never started"
        elif code is None:
            state, reason = "lost", "still running when the controller gave up on it"
        elif code == 0:
            state, reason = "succeeded", "exited 0"
        elif self.timed_out:
            state, reason = "failed", "did not join the rendezvous before the start timeout"
        elif not control and code == LOST:
            state, reason = "lost", "connection lost without an exit status"
        elif not control and code in (126, 127):
            state, reason = "failed", (f"cannot run {self.node.python!r} on the node (exit {code}); "
                                       "set `python:` to an interpreter that has torch")
        elif self.stop_sent:
            state, reason = "stopped", control.get("reason", "stopped by the controller")
        else:
            state, reason = "failed", _failure_reason(code, failures, self.node.first_rank,
                                                      control.get("last_lines") or [])
        return NodeOutcome(self.node.node_rank, self.node.host, state, code, reason,
                           self.ended_at, failures)


def _failure_reason(code: int, failures: tuple[dict, ...], first_rank: int,
                    last_lines: list[str]) -> str:
    """``torchrun exited 1; rank 2 (local rank 1) failed: RuntimeError: ...``, or
    with no worker failure on record, torchrun's own last line (say, no torch)."""
    if not failures:
        return f"torchrun exited {code}" + (f": {last_lines[-1].strip()[-300:]}" if last_lines else "")
    first = failures[0]
    rank = first_rank + first["local_rank"]
    message = first["message"].strip().splitlines()
    return (f"torchrun exited {code}; rank {rank} (local rank {first['local_rank']}) failed: "
            f"{message[-1] if message else '?'}")


def _line_blocks(read: Callable[[int], bytes], size: int = 65536,
                 max_line: int = 1 << 20) -> Iterator[bytes]:
    """Blocks of complete lines from ``read(size)``; at EOF, whatever is left.

    A "line" longer than ``max_line`` without a newline is passed on as is.
    """
    pending = b""
    while chunk := read(size):
        data = pending + chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < max_line:
            pending = data
            continue
        cut = cut or len(data)
        pending = data[cut:]
        yield data[:cut]
    if pending:
        yield pending
