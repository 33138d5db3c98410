"""The backend interface (``backends/base.py``) and the engine behind it
(``engine/run.py``): a backend only submits or reconnects; every backend's
``launch`` is submit + follow + collect and its ``attach`` reconnect +
follow + collect. A fake backend whose nodes are fake agent channels,
followed by the real gang; no process is started."""

from __future__ import annotations

import os
import queue
import textwrap
import threading

import pytest

from fakes import QuietChannel
from orchestrator.agent.wire.owner import Holder, Owner
from orchestrator.agent.wire.protocol import Control, Ended, encode, exit_event
from orchestrator.backends.base import Capabilities, LaunchBackend
from orchestrator.engine.options import LaunchOptions
from orchestrator.errors import Signalled
from orchestrator.config.loader import load_cluster_text
from orchestrator.console import Console
from orchestrator.engine.run import RunHandle, collect, follow, node_records
from orchestrator.plan.dryrun import DryRun, NodeLaunch
from orchestrator.plan.torchrun import torchrun_argv
from orchestrator.records.outcome import EndReason, NodeState, RunState
from orchestrator.records.rundir import RunDir

RESULT = {"loss": 0.25}


def exit_line(code: int, reason: str = "torchrun exited", ended: Ended = Ended.ITSELF) -> bytes:
    return encode(exit_event(code, reason, ended, duration_s=0.1))


class FakeAgent(QuietChannel):
    """A node's channel (``engine/channel.NodeChannel``): once told to
    supervise, it prints a line, says it started, and (unless ``code`` is
    None: it runs until stopped) exits; ``stop`` and ``kill`` end the fake
    run with the supervisor's exit event."""

    host = "fake"

    def __init__(self, code: int | None, after_s: float = 0.0):
        self.code = code
        self.after_s = after_s  # how long it runs before it exits with ``code``
        self.chunks: queue.Queue[bytes] = queue.Queue()
        self.sent: list[Control] = []
        self.spec = None
        self.ended = False

    def emit(self, data: bytes) -> None:
        self.ended = self.ended or b'"exit"' in data
        self.chunks.put(data)

    def supervise(self, spec) -> None:
        self.spec = spec
        self.emit(f"[rank{spec.first_rank}]: training\n".encode()
                  + encode({"event": "started", "workers": spec.nproc}))
        if self.code is not None:
            threading.Timer(self.after_s, self.emit, (exit_line(self.code),)).start()

    def send_control(self, word: Control, reason: str = "") -> None:
        self.sent.append(word)
        if word in (Control.STOP, Control.KILL) and not self.ended:
            self.emit(exit_line(143, reason or "stopped by the controller", Ended.STOPPED))

    def read_chunk(self, size: int) -> bytes:
        return self.chunks.get(timeout=10)

    def abort(self) -> None:
        self.chunks.put(b"")


class FakeRun(RunHandle):
    def __init__(self, backend: "FakeBackend", info: DryRun, run: RunDir, **kw):
        super().__init__(info, run, **kw)
        self.backend = backend

    def fetch(self, outcome):
        self.backend.calls.append("fetch")
        self.run.write_json("result.json", RESULT)
        return self.run.read_json("result.json")

    def tidy(self, outcome):
        self.backend.calls.append("tidy")

    def close(self, left: bool = False) -> None:
        self.backend.calls.append(f"close(left={left})")
        for agent in self.channels.values():  # the links close, as a real handle's do
            agent.chunks.put(b"")


class FakeBackend(LaunchBackend):
    """Nodes are ``FakeAgent``s exiting with ``codes`` (None: until stopped)."""

    name = "fake"

    def __init__(self, options: LaunchOptions, codes: tuple[int | None, ...], *,
                 scheduled: bool = False):
        super().__init__(options, None)
        self.codes = codes
        self.after_s = 0.0
        if scheduled:  # a scheduler's backend: its job owns the run (``owner``)
            self.can = Capabilities(scheduler=True, scheduler_does="the fake queue keeps the job")
        self.calls: list[str] = []
        self.agents: dict[int, FakeAgent] = {}

    def dryrun(self, plan):
        owner, words = self.owner()
        return DryRun(backend=self.name, plan=plan, owner=owner, owner_words=words, nodes=tuple(
            NodeLaunch(node=n, where="nowhere", env=n.env, unset_env=n.unset_env,
                       argv=torchrun_argv(plan, n), connection={"fake": n.node_rank})
            for n in plan.nodes))

    def _handle(self, info, run, watching):
        self.agents = {k: FakeAgent(code, self.after_s) for k, code in enumerate(self.codes)}
        return FakeRun(self, info, run, watching=watching, channels=self.agents)

    def submit(self, info, run, console):
        self.calls.append("submit")
        return self._handle(info, run, False)

    def reconnect(self, record, *, lines=None):
        self.calls.append("reconnect")
        return self._handle(record.dryrun, record.run, True)

    def cancel(self, record):
        raise AssertionError("not called")

    def check(self, plan):
        raise AssertionError("not called")


class Recorded:
    """What ``reconnect`` reads of a recorded run, here: its dry-run and directory."""

    def __init__(self, dryrun: DryRun, run: RunDir):
        self.dryrun, self.run = dryrun, run


@pytest.fixture
def job(tmp_path):
    """A two-node dry-run (one process each) and a fresh run directory."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = load_cluster_text(textwrap.dedent("""\
        nodes:
          - {host: localhost, procs: 1}
          - {host: localhost, procs: 1}
        workload: {script: train.py}
        master: {port: 29500}
    """), source=str(tmp_path / "c.yaml"), base_dir=str(tmp_path))
    from orchestrator.plan.build import build_plan

    def make(name: str, backend: FakeBackend | None = None):
        plan = build_plan(spec, run_id=name, local_run_dir=str(tmp_path / "runs" / name))
        return (backend or FakeBackend(LaunchOptions(), ())).dryrun(plan), RunDir.create(
            str(tmp_path / "runs"), name)

    return make


def quiet() -> Console:
    return Console("quiet")


def test_launch_is_submit_then_follow_then_collect(job):
    info, run = job("by-launch")
    backend = FakeBackend(LaunchOptions(grace_s=1.0), (0, 0))
    seen = []
    launched = backend.launch(info, run, quiet(), on_running=lambda h: seen.append(h.records))
    assert backend.calls == ["submit", "fetch", "tidy", "close(left=False)"]
    assert seen == [node_records(info)]  # once: the nodes ran at once
    by_hand_info, by_hand_run = job("by-hand")
    by_hand = FakeBackend(LaunchOptions(grace_s=1.0), (0, 0))
    handle = by_hand.submit(by_hand_info, by_hand_run, quiet())
    composed = collect(handle, follow(handle, quiet(), by_hand.options), quiet())
    assert (launched.state, launched.result) == (composed.state, composed.result) \
        == (RunState.SUCCEEDED, RESULT)
    assert [n.state for n in launched.nodes] == [n.state for n in composed.nodes]
    # the gang started each node with the dry-run's own argv
    assert [list(a.spec.argv) for a in backend.agents.values()] == [list(n.argv)
                                                                    for n in info.nodes]


def test_a_failing_node_stops_the_gang_and_launch_ends_the_run(job):
    info, run = job("fails")
    backend = FakeBackend(LaunchOptions(grace_s=1.0), (None, 1))  # node 0 runs until stopped
    outcome = backend.launch(info, run, quiet())
    assert outcome.state is RunState.FAILED
    assert outcome.root_cause.node_rank == 1
    assert Control.STOP in backend.agents[0].sent
    assert outcome.nodes[0].state is NodeState.STOPPED
    # the node is told why, and says it (issue #45: "stopped by the controller")
    assert outcome.nodes[0].reason == "stopped: node 1 (localhost) failed (exit 1)"
    assert backend.calls[-1] == "close(left=False)"


@pytest.mark.parametrize("left, interrupt, why", [
    ("", KeyboardInterrupt(), "stopped by Ctrl-C on the controller"),
    ("", Signalled(15), "stopped by SIGTERM to the controller (pid {pid})"),
    ("`ddp-orch down` from box1", Signalled(15), "stopped by `ddp-orch down` from box1")],
    ids=["ctrl-c", "sigterm", "down"])  # stable ids: xdist's workers must collect the same
def test_every_node_is_told_who_stopped_the_run(job, monkeypatch, left, interrupt, why):
    """Issue #45: the stopper named as it was: Ctrl-C, a signal, or ``down``
    (which leaves its words in the run directory before its signal)."""
    from orchestrator.engine.gang import Gang

    info, run = job(f"stopped-{len(left)}-{type(interrupt).__name__}")
    if left:
        run.leave_stop_request(left)
    calls = []

    def interrupted(gang, final: bool = False) -> None:  # the signal lands while it watches
        calls.append(1)
        if len(calls) == 1:
            raise interrupt

    monkeypatch.setattr(Gang, "_report_progress", interrupted)
    backend = FakeBackend(LaunchOptions(grace_s=1.0), (None, None))
    outcome = backend.launch(info, run, quiet())
    assert outcome.state is RunState.INTERRUPTED
    assert [(n.state, n.reason) for n in outcome.nodes] == \
        [(NodeState.STOPPED, why.format(pid=os.getpid()))] * 2


def test_attach_is_reconnect_then_follow_then_collect_and_leaves_the_run(job):
    backend = FakeBackend(LaunchOptions(grace_s=1.0), (0, 0), scheduled=True)
    info, run = job("attached-later", backend)
    outcome = backend.attach(Recorded(info, run), quiet())
    assert backend.calls == ["reconnect", "fetch", "tidy", "close(left=True)"]
    assert (outcome.state, outcome.result) == (RunState.SUCCEEDED, RESULT)
    # observed: the gang never stopped a node
    assert not any(Control.STOP in a.sent for a in backend.agents.values())


def test_attach_follows_a_detached_job_to_its_end_rather_than_leaving_it_again(job):
    """Detached is ``up``'s to leave once every node has started; ``attach``
    to that run watches it to its end and brings its results home."""
    backend = FakeBackend(LaunchOptions(grace_s=1.0, detach=True), (0, 0), scheduled=True)
    info, run = job("detached-then-attached", backend)
    backend.after_s = 1.0  # every node has started well before it ends
    outcome = backend.attach(Recorded(info, run), quiet())
    assert (outcome.state, outcome.result) == (RunState.SUCCEEDED, RESULT)
    assert backend.calls == ["reconnect", "fetch", "tidy", "close(left=True)"]


def test_a_run_left_to_its_nodes_is_not_ended_and_brings_nothing_home(job):
    backend = FakeBackend(LaunchOptions(grace_s=1.0, detach=True), (None, None), scheduled=True)
    info, run = job("detached", backend)
    assert info.owner == Owner(Holder.SCHEDULER, detached=True)
    outcome = backend.launch(info, run, quiet())
    assert outcome.state is RunState.RUNNING
    assert backend.calls == ["submit", "close(left=True)"]


def test_a_run_that_raises_while_followed_is_ended(job):
    info, run = job("raises")
    backend = FakeBackend(LaunchOptions(grace_s=1.0), (0, 0))

    def refuse(handle):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        backend.launch(info, run, quiet(), on_running=refuse)
    assert backend.calls == ["submit", "close(left=False)"]


class QueuedRun(FakeRun):
    """A job that is submitted (pending) and never runs: its queue timeout."""

    def running(self, console):
        self.backend.calls.append("running")
        return self.backend.never_ran


def test_a_pending_job_is_recorded_when_submitted_and_one_that_never_runs_brings_nothing(job):
    from orchestrator.records.outcome import NodeOutcome, gang_outcome

    info, run = job("queued")
    backend = FakeBackend(LaunchOptions(grace_s=1.0), (0, 0))
    backend.never_ran = gang_outcome(info.plan.run_id, tuple(
        NodeOutcome(n.node_rank, n.host, NodeState.FAILED, None, "queue timeout", None, why=EndReason.FAILED)
        for n in info.plan.nodes), 0.0, interrupted=False)

    def submit(info, run, console):
        backend.calls.append("submit")
        handle = QueuedRun(backend, info, run, records=node_records(info, {"job": "42"}))
        handle.pending = True
        return handle

    backend.submit = submit
    seen = []
    outcome = backend.launch(info, run, quiet(), on_running=lambda h: seen.append(h.records))
    assert outcome is backend.never_ran
    assert [[dict(n.connection) for n in records] for records in seen] == \
        [[{"fake": 0, "job": "42"}, {"fake": 1, "job": "42"}]]
    assert backend.calls == ["submit", "running", "close(left=False)"]
