"""The launch backend interface: one per way of starting nodes. As torchx's
``Scheduler``, ``dryrun`` turns a plan into a ``DryRun`` with no I/O and ``submit``
starts exactly that object. Following a run is the engine's, never a backend's.

A backend implements ``dryrun``, ``submit``, ``reconnect``, ``cancel`` and
``check``; it may override ``describe``, ``stacks`` and ``prune``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, ClassVar

from ..agent.wire.owner import Owner
from ..errors import LaunchError
from ..plan.dryrun import owner_words

if TYPE_CHECKING:  # the engine loads when a run starts, not for a dry-run or --help
    from ..config.spec import ClusterSpec
    from ..console import Console
    from ..engine.options import LaunchOptions
    from ..engine.checkresult import Preflight
    from ..engine.run import RunHandle
    from ..engine.stacks import StacksResult
    from ..plan.dryrun import DryRun
    from ..plan.model import RunPlan
    from ..records.outcome import RunDescription, RunOutcome
    from ..records.rundir import RunDir
    from ..records.store import NodeRecord, RunRecord


@dataclass(frozen=True)
class CancelResult:
    """What ``down`` did on one node."""

    node_rank: int
    host: str
    killed: tuple[int, ...]
    error: str = ""
    survivors: tuple[dict, ...] = ()  # {pid, cmd} of what would not die


@dataclass(frozen=True)
class PruneResult:
    """What ``prune`` did with one node's run directory."""

    node_rank: int
    host: str
    freed: int = 0  # bytes
    error: str = ""
    live: bool = False  # refused: the run is alive there
    remote: bool = True  # False: the node's directory lies in the local run directory


def recorded_dryrun(record: RunRecord) -> DryRun:
    """The resolved dry-run a recorded run was launched with (``plan.json``)."""
    from ..plan.render import dryrun_from_dict

    data = record.run.plan()
    try:  # the owner as the run's record says it (the plan's says the same)
        return replace(dryrun_from_dict(data), owner=record.owner)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise LaunchError(f"run {record.run_id} has no readable plan.json ({exc}); it never "
                          f"started, or its directory is damaged") from None


OnRunning = Callable[["RunHandle"], None]


class Watch:
    """One run looked at again and again (``top``): what it opens stays open until ``close``."""

    def __init__(self, backend: "LaunchBackend"):
        self.backend = backend

    def look(self, record: RunRecord) -> RunDescription:
        return self.backend.describe(record)

    def close(self) -> None:
        """Nothing held here."""

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, asked instead of its name; a fact a user is told
    about must carry its words beside it."""

    # A scheduler's job owns the run (``Owner``), and what it does with it.
    scheduler: bool = False
    scheduler_does: str = ""  # "Slurm keeps the job"
    # Runs wait in a queue: ``--queue-timeout`` bounds that wait.
    queue: bool = False
    queue_wait: str = ""  # "how long a job may wait in Slurm's queue"
    # Gang restarts (``--max-restarts``) by the nodes' keepers; if not, why
    # not and what to do instead.
    restarts: bool = True
    instead_of_restarts: str = ""
    # Every node runs here: a file with remote hosts cannot use it (``--backend``).
    this_machine: bool = False

    def __post_init__(self) -> None:
        for fact, words, name in ((self.scheduler, self.scheduler_does, "scheduler_does"),
                                  (self.queue, self.queue_wait, "queue_wait"),
                                  (not self.restarts, self.instead_of_restarts,
                                   "instead_of_restarts")):
            if fact and not words:
                raise TypeError(f"Capabilities: say {name} for this capability")


class LaunchBackend(ABC):
    """One way of starting a run's nodes; ``spec`` is None when it serves a recorded run."""

    name: ClassVar[str]
    can: ClassVar[Capabilities] = Capabilities()

    def __init__(self, options: LaunchOptions, spec: ClusterSpec | None = None):
        self.options = options
        self.spec = spec

    def plan(self, run_id: str, local_run_dir: str) -> RunPlan:
        """The rank plan of ``self.spec`` under this backend (pure)."""
        from ..plan.build import build_plan

        return build_plan(self.require_spec(), run_id=run_id, local_run_dir=local_run_dir,
                          master_addr=self.default_master_addr())

    def default_master_addr(self) -> str | None:
        """The master address for a file that gives none (None: node 0's host)."""
        return None

    def owner(self) -> tuple[Owner, str]:
        """Who owns this run, and in words: decided once; later steps read the dry-run's."""
        owner = Owner.decide(scheduler=self.can.scheduler, detach=self.options.detach,
                             max_restarts=self.options.max_restarts)
        return owner, owner_words(owner, self.can.scheduler_does)

    def require_spec(self) -> ClusterSpec:
        if self.spec is None:
            raise LaunchError(f"the {self.name} backend needs a cluster file for this")
        return self.spec

    @abstractmethod
    def dryrun(self, plan: RunPlan) -> DryRun:
        """Each node's environment and exact command; no I/O."""

    @abstractmethod
    def submit(self, info: DryRun, run: RunDir, console: Console) -> RunHandle:
        """Start ``info``'s nodes (or submit its job) and hand them over; if it
        fails half-way, whatever it started is ended before it raises."""

    @abstractmethod
    def reconnect(self, record: RunRecord, *, lines: int | None = None) -> RunHandle:
        """A handle on a detached run, to observe (never stop); ``lines``:
        follow each node from its last N lines (None: from the start)."""

    @abstractmethod
    def cancel(self, record: RunRecord) -> list[CancelResult]:
        """End whatever of a recorded run still runs; harmless when repeated."""

    @abstractmethod
    def check(self, plan: RunPlan) -> Preflight:
        """Every check a launch depends on, on every node, without launching."""

    def stacks(self, record: RunRecord, native: bool = False) -> StacksResult:
        """Every live rank's stack, from every node at once. Optional."""
        raise LaunchError(f"the {self.name} backend cannot dump stacks")

    def prune(self, record: RunRecord) -> list[PruneResult]:
        """Remove an ended run's node directories. Optional: by default only those
        inside the local run directory go; a backend that reaches its nodes removes theirs."""
        return [PruneResult(n.node_rank, n.host, remote=False) for n in record.nodes
                if in_local_run_dir(record, n)] + [
            PruneResult(n.node_rank, n.host, error=f"the {self.name} backend cannot reach it")
            for n in record.nodes if not in_local_run_dir(record, n)]

    def describe(self, record: RunRecord) -> RunDescription:
        """The run's state from its records; a backend whose nodes outlive the controller
        asks them."""
        from ..records.outcome import RunDescription

        return RunDescription(record.state, record.outcomes, record.root_cause,
                              attempts=record.attempts)

    def watch(self) -> Watch:
        """``describe`` again and again, for ``top``; see ``Watch``."""
        return Watch(self)

    # -- the same for every backend ----------------------------------------

    def launch(self, info: DryRun, run: RunDir, console: Console,
               on_running: OnRunning = lambda handle: None) -> RunOutcome:
        """Submit + follow + collect. The handle is closed whatever happens,
        so a run not left to its nodes is ended; not meant to be overridden."""
        from ..engine.run import collect, follow
        from ..records.outcome import RunState

        handle = self.submit(info, run, console)
        outcome = None
        try:
            outcome = collect(handle, follow(handle, console, self.options, on_running), console)
            return outcome
        finally:
            handle.close(left=outcome is not None and outcome.state is RunState.RUNNING)

    def attach(self, record: RunRecord, console: Console, *, lines: int | None = None
               ) -> RunOutcome:
        """Reconnect + follow + collect; Ctrl-C leaves the run going."""
        from ..engine.run import collect, follow

        handle = self.reconnect(record, lines=lines)
        try:
            return collect(handle, follow(handle, console, self.options), console)
        finally:
            handle.close(left=True)  # attach never ends the run it follows


def in_local_run_dir(record: RunRecord, node: NodeRecord) -> bool:
    import os

    local = os.path.realpath(record.run.path)
    return os.path.realpath(node.run_dir).startswith(local + os.sep)

