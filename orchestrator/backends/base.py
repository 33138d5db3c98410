"""The launch backend interface: one per way of starting nodes.

torchx's ``Scheduler`` is the model: ``submit = schedule(submit_dryrun(...))``.
A backend turns a plan into a ``DryRun`` with no I/O (what ``--dry-run``
prints), and ``launch`` runs exactly that object. Everything a backend does
goes through these methods, so the controller, the CLI and the run
records never know which backend they hold.

=================================  ===========================================
``dryrun(plan) -> DryRun``         pure: each node's env and exact command
``launch(info, run, console)``     blocks; owns gang teardown; brings results home
``cancel(record)``                 ``ddp-orch down``: end what still runs
``check(plan) -> Preflight``       ``ddp-orch check``: what would break a launch
``describe(record)``               ``ddp-orch status``: the run as it is now
``stacks(record)``                 ``ddp-orch stacks``: every rank's stack now
``attach(record, console)``        ``ddp-orch attach``: follow a kept run to its end
=================================  ===========================================
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar

from ..config.spec import ClusterSpec
from ..console import Console
from ..engine.preflight import Preflight
from ..engine.stacks import StacksResult
from ..errors import LaunchError
from ..plan.build import build_plan
from ..plan.dryrun import DryRun
from ..plan.render import dryrun_from_dict
from ..plan.model import RunPlan
from ..records.outcome import AttemptOutcome, NodeOutcome, RunOutcome, RunState
from ..records.rundir import RunDir
from ..records.store import NodeRecord, RunRecord


@dataclass(frozen=True)
class LaunchOptions:
    """How to launch, from the command line; the same for every backend."""

    grace_s: float = 10.0  # SIGTERM to SIGKILL on the nodes
    start_timeout_s: float = 300.0  # for every node to join the rendezvous
    accept_new_host_keys: bool = False
    check_timeout_s: float = 60.0
    queue_timeout_s: float | None = None  # a scheduler's queue: how long a job may wait
    hang_timeout_s: float | None = None  # no rank's progress this long: a hang (off: None)
    detach: bool = False  # the nodes keep the run; launch returns once every node started
    max_restarts: int = 0  # whole-gang restarts after a failure (agent/kept/restarts.py's rule)

    @property
    def kept(self) -> bool:
        """Do the nodes' keepers hold the gang (agent/kept/keeper.py), not the controller?"""
        return self.detach or self.max_restarts > 0


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


@dataclass(frozen=True)
class RunDescription:
    """A run as its backend sees it now (``ddp-orch status``)."""

    state: RunState
    nodes: tuple[NodeOutcome, ...]
    root_cause: NodeOutcome | None
    detail: str = ""
    attempts: tuple[AttemptOutcome, ...] = ()
    ended: float | None = None  # when the nodes say the run ended (time.time())


def recorded_dryrun(record: RunRecord) -> DryRun:
    """The resolved dry-run a recorded run was launched with (``plan.json``)."""
    data = record.run.plan()
    try:
        return dryrun_from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise LaunchError(f"run {record.run_id} has no readable plan.json ({exc}); it never "
                          f"started, or its directory is damaged") from None


OnRunning = Callable[[DryRun], None]


class LaunchBackend(ABC):
    """One way of starting a run's nodes. ``spec`` is None when the backend
    only serves a recorded run (``cancel``, ``describe``)."""

    name: ClassVar[str]

    def __init__(self, options: LaunchOptions, spec: ClusterSpec | None = None):
        self.options = options
        self.spec = spec

    def plan(self, run_id: str, local_run_dir: str) -> RunPlan:
        """The rank plan of ``self.spec`` under this backend (pure)."""
        return build_plan(self.require_spec(), run_id=run_id, local_run_dir=local_run_dir,
                          master_addr=self.default_master_addr())

    def default_master_addr(self) -> str | None:
        """The master address for a file that gives none (None: node 0's host)."""
        return None

    def require_spec(self) -> ClusterSpec:
        if self.spec is None:
            raise LaunchError(f"the {self.name} backend needs a cluster file for this")
        return self.spec

    @abstractmethod
    def dryrun(self, plan: RunPlan) -> DryRun:
        """Each node's environment and exact command; no I/O."""

    @abstractmethod
    def node_records(self, plan: RunPlan) -> tuple[NodeRecord, ...]:
        """What ``state.json`` keeps so that ``cancel`` can find the nodes again."""

    @abstractmethod
    def launch(self, info: DryRun, run: RunDir, console: Console,
               on_running: OnRunning = lambda info: None) -> RunOutcome:
        """Run ``info`` to its end; ``on_running`` gets the resolved dry-run
        once every node has its launch-time facts (port, home)."""

    @abstractmethod
    def cancel(self, record: RunRecord) -> list[CancelResult]:
        """End whatever of a recorded run still runs; harmless when repeated."""

    @abstractmethod
    def check(self, plan: RunPlan) -> Preflight:
        """Every check a launch depends on, on every node, without launching."""

    def stacks(self, record: RunRecord, native: bool = False) -> StacksResult:
        """Every live rank's stack, from every node at once (``ddp-orch stacks``)."""
        raise LaunchError(f"the {self.name} backend cannot dump stacks")

    def attach(self, record: RunRecord, console: Console, *, lines: int | None = None
               ) -> RunOutcome:
        """Follow a detached run from its nodes until it ends (or Ctrl-C),
        bringing its results home; ``lines``: from the last N lines (None:
        from the start)."""
        raise LaunchError(f"the {self.name} backend cannot attach to a run")

    def prune(self, record: RunRecord) -> list[PruneResult]:
        """Remove an ended run's node directories (``ddp-orch prune``). Here:
        nodes whose directory lies inside the local run directory (local
        nodes, a Slurm job's shared one) go with it; a backend that reaches
        other nodes removes theirs (``AgentBackend.prune``)."""
        return [PruneResult(n.node_rank, n.host, remote=False) for n in record.nodes
                if in_local_run_dir(record, n)] + [
            PruneResult(n.node_rank, n.host, error=f"the {self.name} backend cannot reach it")
            for n in record.nodes if not in_local_run_dir(record, n)]

    def describe(self, record: RunRecord) -> RunDescription:
        """The run's state from its records; backends with a scheduler ask it."""
        return RunDescription(record.state, record.outcomes, record.root_cause,
                              attempts=record.attempts)


def in_local_run_dir(record: RunRecord, node: NodeRecord) -> bool:
    """Whether a node's run directory lies inside the local run directory
    (a node on this machine, or a Slurm job's shared directory)."""
    import os

    local = os.path.realpath(record.run.path)
    return os.path.realpath(node.run_dir).startswith(local + os.sep)

