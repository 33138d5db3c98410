"""A submitted job as the gang sees it: its state, and each node's stream, read
from the shared run directory as it grows (the controller holds no channel to a
node). No pings: the scheduler owns the nodes' liveness."""

from __future__ import annotations

import posixpath
import threading
import time
from typing import TYPE_CHECKING, Protocol

from ...agent.layout import STREAM
from ...agent.wire.protocol import (CONTROL_PREFIX, Control, Event, ProtocolError, decode,
                                    is_time, pace_fields, rank_progress)
from ...engine.nodestate import LOST
from ...errors import OrchestratorError

if TYPE_CHECKING:
    from ...records.store import RunRecord

POLL_S = 0.05  # how often a quiet stream file is looked at (an open and a read)
# After a stream gave something, the next looks come sooner, doubling back to
# POLL_S: a node's exit event follows its last lines within a few ms, and the
# launch waits for it.
STREAM_SOON_S = 0.01
STATE_POLL_S = 1.0  # how often the scheduler is asked
END_POLL_FIRST_S, END_POLL_S = 0.02, 0.1  # while waiting for the job to leave the queue
# After the job has ended, how long a stream still waits for bytes to show up:
# a network file system may show a file's last writes to other hosts late.
SETTLE_S = 5.0
# How much of the end of a node's stream ``stream_progress`` reads for its last
# heartbeat (one comes every 5 s; a chatty program's lines sit between them).
TAIL_BYTES = 256 * 1024


class JobState(Protocol):
    """A job as its scheduler lists it (``SchedulerBackend.job_state``)."""

    state: str  # the scheduler's own word (RUNNING, PENDING, COMPLETED)
    reason: str  # why it waits or ended, in the scheduler's words ("" if none)
    nodelist: str  # its nodes as the scheduler writes them ("" until it has them)

    @property
    def queued(self) -> bool:
        """Waiting for its nodes."""

    @property
    def running(self) -> bool: ...

    @property
    def ended(self) -> bool: ...

    @property
    def cancelled(self) -> bool:
        """Ended by a cancel (someone's, or ours)."""

    @property
    def hosts(self) -> tuple[str, ...]:
        """The allocation's hosts in node order, once it has them (else ())."""


class Scheduler(Protocol):
    """What a ``Job`` asks of its scheduler (the backend, ``SchedulerBackend``)."""

    def job_state(self, job_id: str) -> JobState | None:
        """The job as listed now; None once the scheduler no longer lists it."""

    def cancel_job(self, job_id: str, signal: str | None = None) -> None:
        """End the job (``signal``: KILL, else the scheduler's plain cancel)."""


class Job:
    """One job id; ``state`` is refreshed in the background until ``close``."""

    def __init__(self, job_id: str, scheduler: Scheduler, *, poll: bool = True):
        self.job_id = job_id
        self.scheduler = scheduler
        self.state: JobState | None = None
        self.gone = False  # the scheduler no longer lists it
        self.error = ""  # the last failure to ask, while asking keeps failing
        self._failing_since: float | None = None
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        if poll:
            self.start_polling()

    def start_polling(self) -> None:
        self.refresh()
        self._thread = threading.Thread(target=self._poll, daemon=True,
                                        name=f"job-{self.job_id}")
        self._thread.start()

    @property
    def failing_for(self) -> float:
        """Seconds asking has failed in a row (0 when the last answer was good)."""
        since = self._failing_since
        return 0.0 if since is None else time.monotonic() - since

    @property
    def ended(self) -> bool:
        return self.gone or (self.state is not None and self.state.ended)

    def refresh(self) -> JobState | None:
        try:
            state = self.scheduler.job_state(self.job_id)
        except OrchestratorError as exc:
            self.error = str(exc)
            if self._failing_since is None:
                self._failing_since = time.monotonic()
            return self.state
        self.error, self._failing_since = "", None
        if state is None:
            self.gone = True
        else:
            self.state = state
        return state

    def _poll(self) -> None:
        while not self._closed.wait(STATE_POLL_S):
            self.refresh()

    def wait_ended(self, timeout_s: float) -> bool:
        """Ask at once, then 20 ms later, then at doubling pauses up to
        ``END_POLL_S``: a run's job leaves the queue a few ms after its last
        agent's exit, which is when this is asked."""
        deadline = time.monotonic() + timeout_s
        pause = END_POLL_FIRST_S
        while not self.ended:
            self.refresh()
            now = time.monotonic()
            if self.ended or now >= deadline:
                break
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, END_POLL_S)
        return self.ended

    def cancel(self, signal: str | None = None) -> None:
        """Cancel once per kind (plain, or a signal), whoever asks."""
        kind = signal or "TERM"
        with self._lock:  # held across the cancel: a second caller waits, then skips
            if kind in self._cancelled or self.ended:
                return
            self.scheduler.cancel_job(self.job_id, signal)
            self._cancelled.add(kind)  # only once it was sent

    @property
    def cancelled(self) -> bool:
        return bool(self._cancelled)

    def close(self) -> None:
        self._closed.set()


class JobStream:
    """A node's ``agent.out``, read as it grows: the node's channel, mapped onto the job."""

    def __init__(self, path: str, job: Job, host: str):
        self.path = path
        self.host = host
        self.job = job
        self.seen = False  # the node has written its stream at all
        self.offset = 0
        self._closed = False
        self._pause = POLL_S  # the next quiet look's pause

    def supervise(self, spec: object) -> None:
        """The agent was started by the scheduler with its spec (``job.json``)."""

    def send_control(self, word: Control, reason: str = "") -> None:
        """A stop is the job's cancel; the scheduler carries no reason."""
        if word is Control.STOP:
            self.job.cancel()
        elif word is Control.KILL:
            self.job.cancel("KILL")
        # ping, go and done: nothing to do; the scheduler owns liveness, the nodes
        # their barrier

    def poll(self) -> int | None:
        """None while the job runs; LOST once it ended with no word from the node."""
        return LOST if self.job.ended else None

    def wait(self, timeout: float) -> int:
        if not self.job.wait_ended(timeout):
            raise TimeoutError(f"job {self.job.job_id} still runs")
        return LOST

    def hang_up(self) -> None:
        """Nothing to close: ``kill`` was the cancel."""

    def abort(self) -> None:
        """Nothing to cut: the job is the scheduler's (its cancel ends it)."""

    def release(self) -> None:
        """No agent to give back: the run's files are in the shared run directory."""
        return None

    def read_chunk(self, size: int) -> bytes:
        """The next bytes; b"" once closed, or once the job is over and nothing came for
        SETTLE_S. Opened afresh each look: on NFS an open makes other hosts' writes visible."""
        quiet_since = None
        while not self._closed:
            data = self._read(size)
            if data:
                self._pause = STREAM_SOON_S
                return data
            if self.job.ended:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > SETTLE_S:
                    return b""
            time.sleep(self._pause)
            self._pause = min(self._pause * 2, POLL_S)
        return b""

    def _read(self, size: int) -> bytes:
        try:
            with open(self.path, "rb") as fh:
                self.seen = True
                fh.seek(self.offset)
                data = fh.read(size)
        except FileNotFoundError:
            return b""
        self.offset += len(data)
        return data

    def unread(self, data: bytes) -> None:
        """Nothing reads the stream after the exit event."""

    def close(self) -> None:
        """A reader still in ``read_chunk`` gets b"" at its next look."""
        self._closed = True


def stream_progress(record: RunRecord) -> tuple[dict, ...]:
    """Each rank's last step from its stream's last heartbeat, for a job no controller
    follows (none keeps its ``progress.json``); ``last_progress`` is the node's clock."""
    ranks = []
    for node in record.nodes:
        beat = _last_heartbeat(posixpath.join(node.run_dir, STREAM))
        sent = None if beat is None else beat.get("now")
        progress = None if beat is None else beat.get("progress")
        for key, value in list(progress.items())[:4096] if isinstance(progress, dict) else ():
            entry = rank_progress(value) if isinstance(key, str) and key.isdigit() else None
            if entry is None or not (entry.step is None or isinstance(entry.step, int)):
                continue
            stepped = sent - entry.age_s if is_time(sent) else None
            ranks.append({"rank": int(key), "node_rank": node.node_rank, "host": node.host,
                          "step": entry.step, "samples": entry.samples,
                          "last_progress": stepped, "last_step": stepped,
                          "last_output": None, **pace_fields(entry.pace)})
    return tuple(sorted(ranks, key=lambda r: r["rank"]))


def _last_heartbeat(path: str) -> dict | None:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - TAIL_BYTES))
            data = fh.read(TAIL_BYTES)
    except OSError:
        return None
    for line in reversed(data.split(b"\n")):
        if line.startswith(CONTROL_PREFIX) and Event.HEARTBEAT.value.encode() in line:
            try:
                message = decode(line)
            except ProtocolError:
                continue
            if message["event"] == Event.HEARTBEAT:
                return message
    return None
