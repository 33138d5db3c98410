"""Follow a running run to its end and bring its results home: the half of
a launch that every backend shares, given a ``RunHandle``."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..console import Console
from ..errors import LaunchError
from ..plan.dryrun import DryRun
from ..records.outcome import RunOutcome, RunState
from ..records.rundir import RunDir
from ..records.store import NodeRecord
from .options import LaunchOptions

if TYPE_CHECKING:  # a scheduler's job is submitted before the gang that follows it is loaded
    from .gang import Gang
    from .stacks import StacksResult


def node_records(info: DryRun, connection: Mapping[str, Any] | None = None
                 ) -> tuple[NodeRecord, ...]:
    """What ``state.json`` keeps of each node so that ``cancel`` finds it again."""
    return tuple(NodeRecord(n.node_rank, n.host, n.run_dir, n.node.python,
                            {**n.connection, **(connection or {})}) for n in info.nodes)


class RunHandle(ABC):
    """A running run, as ``submit`` or ``reconnect`` hands it to the engine.
    ``dryrun`` and ``records`` are final once ``running`` has returned None;
    a ``pending`` run's records are kept before ``running`` waits."""

    def __init__(self, dryrun: DryRun, run: RunDir, *, watching: bool = False,
                 channels: Mapping[int, Any] | None = None,
                 records: tuple[NodeRecord, ...] = (),
                 lines: int | None = None,
                 dump_stacks: Callable[[], StacksResult] | None = None):
        self.dryrun = dryrun
        self.run = run
        self.watching = watching
        self.channels: Mapping[int, Any] = channels if channels is not None else {}
        self.records = records or node_records(dryrun)
        self.lines = lines  # observed: follow from each node's last N lines (None: the start)
        self.dump_stacks = dump_stacks  # the hang watchdog's dump of every rank
        self.pending = False
        self.ended: RunOutcome | None = None
        self.gang: Gang | None = None

    def running(self, console: Console) -> RunOutcome | None:
        """Wait until every node runs and ``dryrun`` has its launch-time facts;
        None then, else the outcome of a run that ended first."""
        return self.ended

    def settle(self, outcome: RunOutcome) -> RunOutcome:
        """The outcome once the gang is over, in the backend's words."""
        return outcome

    @abstractmethod
    def fetch(self, outcome: RunOutcome) -> dict | None:
        """Bring ``results.wanted_files`` into the run directory; rank 0's result."""

    def tidy(self, outcome: RunOutcome) -> None:
        """After the results are home: clean up what the run left behind."""

    @abstractmethod
    def close(self, left: bool = False) -> None:
        """Let go of the nodes, and unless ``left`` end what this handle started; repeatable."""


def new_gang(handle: RunHandle, console: Console, options: LaunchOptions) -> Gang:
    """The gang that follows ``handle``'s channels: the one place a gang is built."""
    from .gang import Gang

    info, run, channels = handle.dryrun, handle.run, handle.channels
    if handle.watching:  # ``attach``: follow what runs, start and stop nothing
        return Gang(info, run, channels, console, watching=True, grace_s=options.grace_s,
                    lines=handle.lines)
    return Gang(info, run, channels, console, grace_s=options.grace_s,
                start_timeout_s=options.start_timeout_s, hang_timeout_s=options.hang_timeout_s,
                dump_stacks=handle.dump_stacks)


def follow(handle: RunHandle, console: Console, options: LaunchOptions,
           on_running: Callable[[RunHandle], None] = lambda handle: None) -> RunOutcome:
    """Run ``handle``'s gang to its end, or until it is left to its nodes.
    ``on_running`` gets the handle whenever its records are worth keeping."""
    if handle.pending:
        on_running(handle)
        # The gang's modules load while the scheduler queues the job, not as
        # its ranks start, when every CPU-ms is taken from them.
        from . import gang  # noqa: F401
    ended = handle.running(console)
    if ended is not None:
        return ended
    on_running(handle)
    gang = handle.gang = new_gang(handle, console, options)
    outcome = gang.run()
    lost = gang.lost_contact
    if handle.watching and lost:
        run_id = handle.dryrun.plan.run_id
        raise LaunchError(f"{lost}; run {run_id} goes on there (`ddp-orch status {run_id}` "
                          f"asks the nodes; attach again once they are reachable)")
    if outcome.state is RunState.RUNNING:  # left: the nodes (or the scheduler) own it now
        return outcome
    return handle.settle(outcome)


def collect(handle: RunHandle, outcome: RunOutcome, console: Console) -> RunOutcome:
    """``outcome`` with rank 0's result, once the run's files are home. A full
    run directory leaves them on the nodes: the run's end stands."""
    if handle.gang is None or outcome.state is RunState.RUNNING:
        return outcome
    try:
        result = handle.fetch(outcome)
    except OSError as exc:
        result = None
        console.always(f"ddp-orch: could not bring the run's results into {handle.run.path}: "
                       f"{exc.strerror or exc}; they stay on the nodes")
    handle.tidy(outcome)
    return dataclasses.replace(outcome, result=result)
