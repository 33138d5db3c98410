"""A submitted Slurm job as the gang sees it: its state, and each node's stream.

Under Slurm the controller holds no channel to a node. Each node's agent
writes its output and control lines to ``node-K/agent.out`` in the shared
run directory (``agent/jobnode.py``), and ``JobStream`` reads that file as
it grows, so ``NodeHandle`` relays and judges a Slurm node exactly as it
does an SSH one. What the handle would send down a channel becomes Slurm's
own controls: ``stop`` is ``scancel`` (SIGTERM to every task, then Slurm's
KillWait), ``kill`` is ``scancel --signal=KILL --full``, and pings are not
needed, because Slurm owns the nodes' liveness.

``SlurmJob`` polls ``squeue`` on one thread for the whole job; a stream
ends when its file has no more bytes and the job is over.
"""

from __future__ import annotations

import os
import threading
import time

from . import slurmctl
from .nodehandle import LOST

POLL_S = 0.1  # how often a quiet stream file is looked at
STATE_POLL_S = 1.0  # how often squeue is asked


class SlurmJob:
    """One job id; ``state`` is refreshed in the background until ``close``."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        self.state: slurmctl.JobState | None = None
        self.gone = False  # Slurm no longer lists it
        self.error = ""  # the last squeue failure, if it keeps failing
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.refresh()
        self._thread = threading.Thread(target=self._poll, daemon=True,
                                        name=f"slurm-job-{job_id}")
        self._thread.start()

    @property
    def ended(self) -> bool:
        return self.gone or (self.state is not None and self.state.ended)

    def refresh(self) -> slurmctl.JobState | None:
        try:
            state = slurmctl.job_state(self.job_id)
        except slurmctl.SlurmError as exc:
            self.error = str(exc)
            return self.state
        self.error = ""
        if state is None:
            self.gone = True
        else:
            self.state = state
        return state

    def _poll(self) -> None:
        while not self._closed.wait(STATE_POLL_S):
            self.refresh()

    def wait_ended(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.ended and time.monotonic() < deadline:
            time.sleep(0.1)
            self.refresh()
        return self.ended

    def cancel(self, signal: str | None = None) -> None:
        """``scancel`` once per kind (plain, or a signal), whoever asks."""
        kind = signal or "TERM"
        with self._lock:
            if kind in self._cancelled or self.ended:
                return
            self._cancelled.add(kind)
        slurmctl.cancel(self.job_id, signal)

    @property
    def cancelled(self) -> bool:
        return bool(self._cancelled)

    def close(self) -> None:
        self._closed.set()


class JobProcess:
    """The part of a channel ``NodeHandle`` talks to, mapped onto the job."""

    def __init__(self, job: SlurmJob):
        self.job = job

    def send(self, data: bytes) -> None:
        if data == b"stop\n":
            self.job.cancel()
        elif data == b"kill\n":
            self.job.cancel("KILL")
        # ping and done: nothing to do; Slurm owns liveness

    def poll(self) -> int | None:
        """None while the job runs; LOST once it ended with no word from the node."""
        return LOST if self.job.ended else None

    def wait(self, timeout: float) -> int:
        if not self.job.wait_ended(timeout):
            raise TimeoutError(f"job {self.job.job_id} still runs")
        return LOST

    def close_stdin(self) -> None:
        pass

    def abort(self) -> None:
        pass


class JobStream:
    """A node's ``agent.out``, read as it grows; what ``NodeHandle`` calls its agent."""

    def __init__(self, path: str, job: SlurmJob, host: str):
        self.path = path
        self.host = host
        self.job = job
        self.process = JobProcess(job)
        self.seen = False  # the node has written its stream at all
        self._fh = None

    def supervise(self, spec: dict) -> None:
        """The agent was started by srun with its spec (``job.json``)."""

    def read_chunk(self, size: int) -> bytes:
        """The next bytes of the file; b"" once the job is over and all is read."""
        while True:
            if self._fh is None and os.path.exists(self.path):
                self._fh = open(self.path, "rb")
                self.seen = True
            if self._fh is not None:
                data = self._fh.read(size)
                if data:
                    return data
            if self.job.ended:
                if self._fh is not None:
                    return self._fh.read(size)  # written just before the end
                return b""
            time.sleep(POLL_S)

    def unread(self, data: bytes) -> None:
        """Nothing reads the stream after the exit event."""

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
