"""How a run and its nodes ended: ``RunState`` and ``NodeState`` are the only
words for states, from the backends through ``state.json`` to every command.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from ..agent.wire.runstate import RunState

__all__ = ["RunState"]  # a run's states, which the keepers on the nodes record too


class NodeState(str, Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # stopped by the controller because another node failed
    LOST = "lost"  # the connection or the agent went away without a status
    NOT_STARTED = "not-started"

    @property
    def failed(self) -> bool:
        return self in (NodeState.FAILED, NodeState.LOST)

    def __str__(self) -> str:
        return self.value


class EndReason(str, Enum):
    """Why a node ended: the typed cause every outcome carries. Its words
    (the outcome's ``reason``) are rendered from it, never parsed back."""

    __str__ = str.__str__

    EXITED = "exited"  # torchrun exited 0
    FAILED = "failed"  # torchrun failed on its own: a rank, its setup, or the node refused it
    STOPPED = "stopped"  # asked to stop, or signalled, before it failed itself
    HUNG = "hung"  # the hang rule named one of its ranks
    START_TIMEOUT = "start-timeout"  # did not join the rendezvous before the start timeout
    NO_ANSWER = "no-answer"  # its agent never answered within the start timeout
    NOT_RUN = "not-run"  # its scheduler's job ended before any rendezvous
    SILENT = "silent"  # nothing heard from it for the peer timeout
    PAUSED = "paused"  # it stopped because the controller was paused past the peer timeout
    CUT_OFF = "cut-off"  # it answered neither the stop nor the kill
    CONNECTION_LOST = "connection-lost"  # the connection died without an exit status
    AGENT_DIED = "agent-died"  # its agent ended without reporting
    GIVEN_UP = "given-up"  # still running when the controller gave up on it
    KEEPER_UNHEARD = "keeper-unheard"  # a kept run's node its keepers could not hear
    KEEPER_GONE = "keeper-gone"  # a kept run's keeper ended without finishing
    FOLLOWER_LOST = "follower-lost"  # the controller lost a kept run's node
    SCHEDULER_ENDED = "scheduler-ended"  # its scheduler's job ended without its report
    SCHEDULER_STOPPED = "scheduler-stopped"  # its scheduler ended it when another node failed
    NEVER_STARTED = "never-started"
    RUNNING = "running"  # still runs: the controller left it to its keeper


# Reasons that say the network, or a node out of reach, ended the run.
NETWORK_REASONS = frozenset({EndReason.START_TIMEOUT, EndReason.NO_ANSWER, EndReason.SILENT,
                             EndReason.CONNECTION_LOST})


@dataclass(frozen=True)
class WorkerFailure:
    """One rank's failure as its node's agent reported it (checked on arrival
    by the protocol's ``FAILURES``): ``timestamp`` is the worker's error file's
    time, or torchrun's, a whole second rounded down."""

    local_rank: int
    message: str
    timestamp: float
    error_file: str | None = None  # the worker's error file on its node, if it wrote one

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WorkerFailure":
        error_file = data.get("error_file")
        return cls(int(data["local_rank"]), str(data["message"]), float(data["timestamp"]),
                   None if error_file is None else str(error_file))


@dataclass(frozen=True)
class NodeOutcome:
    """How one node ended, why, and the worker failures its agent reported."""

    node_rank: int
    host: str
    state: NodeState
    exit_code: int | None
    reason: str
    ended_at: float | None  # time.time() when the controller saw it end
    failures: tuple[WorkerFailure, ...] = ()
    why: EndReason = field(kw_only=True)

    @property
    def first_failure_ts(self) -> float | None:
        stamps = [f.timestamp for f in self.failures if f.timestamp]
        return min(stamps) if stamps else self.ended_at

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["state"] = self.state.value
        out["why"] = self.why.value
        out["failures"] = list(out["failures"])  # each a dict (``asdict``)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NodeOutcome":
        return cls(node_rank=int(data["node_rank"]), host=str(data["host"]),
                   state=NodeState(data["state"]), exit_code=data.get("exit_code"),
                   reason=str(data.get("reason", "")), ended_at=data.get("ended_at"),
                   failures=tuple(WorkerFailure.from_dict(f) for f in data.get("failures") or ()),
                   why=EndReason(data["why"]))


@dataclass(frozen=True)
class AttemptOutcome:
    """One attempt of a run with gang restarts (``--max-restarts``)."""

    attempt: int
    master_port: int
    state: RunState
    root_cause: NodeOutcome | None
    note: str = ""  # "restarting", or why there was no restart

    def to_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "master_port": self.master_port,
                "state": self.state.value, "note": self.note,
                "root_cause": self.root_cause.to_dict() if self.root_cause else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AttemptOutcome":
        root = data.get("root_cause")
        return cls(int(data["attempt"]), int(data["master_port"]), RunState(data["state"]),
                   NodeOutcome.from_dict(root) if root else None, str(data.get("note", "")))


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    state: RunState
    wall_s: float
    nodes: tuple[NodeOutcome, ...]
    root_cause: NodeOutcome | None
    result: dict | None
    attempts: tuple[AttemptOutcome, ...] = ()  # a kept run's attempts, first to last

    @property
    def ok(self) -> bool:
        return self.state is RunState.SUCCEEDED


# What a rank says when it fails because a peer went away, or because the
# teardown of a failure elsewhere stopped it: the cascade of a failure
# elsewhere, never its cause while an original failure is on record. A rank
# SIGTERM ended says so to torchrun ("Signal 15 (SIGTERM)"), or, where the
# program answers SIGTERM itself with ``sys.exit(128 + signum)`` as many
# training scripts do, the shim records "SystemExit: 143": under Slurm the
# step's teardown (--kill-on-bad-exit) can reach a rank before its node's
# agent hears of the stop, and the node then seems to have failed first.
# (A pattern, compiled on first use by ``re``'s own cache: ``ps`` and a
# dry run never ask.)
CASCADE = (r"Connection closed by peer|Connection reset by peer|Broken pipe|"
           r"remote process exited|NCCL communicator was aborted|DistNetworkError|"
           r"Socket Timeout|Signal 15 \(SIGTERM\)|^SystemExit: 143\b")


def is_cascade(outcome: NodeOutcome) -> bool:
    """Every worker failure the node reported is a peer-loss cascade."""
    return bool(outcome.failures) and all(
        re.search(CASCADE, f.message, re.IGNORECASE) for f in outcome.failures)


def gang_outcome(run_id: str, nodes: tuple[NodeOutcome, ...], wall_s: float, *,
                 interrupted: bool) -> RunOutcome:
    """The run's state and root cause from its nodes' outcomes.

    The root cause is the originating failure, by the best evidence there is:
    a node whose failures are not all peer-loss cascades (``CASCADE``) first,
    then the earliest failure time (the worker's error file, sub-second; else
    torchrun's, a whole second rounded down; else, for a node with no worker
    failure, when the controller last heard from it), then the lower node rank.
    """
    failed = [o for o in nodes if o.state.failed]
    root = min(failed, key=lambda o: (is_cascade(o), o.first_failure_ts or float("inf"),
                                      o.node_rank), default=None)
    if interrupted:
        state = RunState.INTERRUPTED
    elif root is not None or any(o.state is not NodeState.SUCCEEDED for o in nodes):
        state = RunState.FAILED
    else:
        state = RunState.SUCCEEDED
    return RunOutcome(run_id, state, wall_s, nodes, root, None)


@dataclass(frozen=True)
class RunDescription:
    """A run as its backend sees it now (``ddp-orch status``)."""

    state: RunState
    nodes: tuple[NodeOutcome, ...]
    root_cause: NodeOutcome | None
    detail: str = ""
    attempts: tuple[AttemptOutcome, ...] = ()
    ended: float | None = None  # when the nodes say the run ended (time.time())
    # A live run's ranks as its nodes recorded them, where no controller keeps
    # ``progress.json``: each {"rank", "node_rank", "host", "step", "last_progress",
    # "last_output"}, and "samples" where its keeper recorded them.
    progress: tuple[dict, ...] = ()
    # A live kept run's attempt now (0, then 1, 2 ... after each gang
    # restart), as node 0's keeper counts them; None where no keeper says.
    attempt: int | None = None
