"""The attached gang (``engine/gang.py``) on a fake clock, with fake node
channels: no process starts and no test waits for real time to pass.

The gang reads ``time.monotonic`` and sleeps through its module's ``time``,
and waits on its ``_changed`` event; all three are the fake clock's here.
Each time the gang reads the clock, every byte the fake nodes have sent so
far has been relayed first (``settle``), so what the gang sees at fake time
``t`` is exactly what the nodes sent up to ``t``.
"""

from __future__ import annotations

import collections
import io
import re
import textwrap
import threading
import time as real_time

import pytest

from orchestrator.agent.wire.protocol import (HEARTBEAT_S, PEER_TIMEOUT_S, Control, Ended, encode,
                                            exit_event)
from orchestrator.config.loader import load_cluster_text
from orchestrator.console import Console
from orchestrator.engine import gang as gang_module
from orchestrator.engine import nodehandle as nodehandle_module
from orchestrator.agent.wire.owner import Holder, Owner
from orchestrator.engine.gang import Gang
from orchestrator.plan.build import build_plan
from orchestrator.plan.dryrun import DryRun, NodeLaunch
from orchestrator.plan.torchrun import torchrun_argv
from orchestrator.records.outcome import NodeState, RunState
from orchestrator.records.rundir import RunDir
from fakes import FakeClock, QuietChannel


def exit_line(code: int, reason: str, ended: Ended) -> bytes:
    return encode(exit_event(code, reason, ended, duration_s=0.1))


class GangClock(FakeClock):
    """Fake seconds from 0. ``advance`` moves it and lets each node send what
    it has scheduled up to then; ``monotonic`` (the gang's) first waits, in
    real time, until every node's relay has taken in all that was sent."""

    def __init__(self):
        super().__init__()
        self.nodes: list[FakeNode] = []
        self.settle = lambda: None

    def monotonic(self) -> float:
        self.settle()
        return self.now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for node in self.nodes:
            node.due(self.now)


class NodeClock:
    """What the relay threads read (``nodehandle``'s ``time``): the same fake
    time, without waiting on themselves."""

    def __init__(self, clock: GangClock):
        self.clock = clock

    def monotonic(self) -> float:
        return self.clock.now

    def time(self) -> float:
        return self.clock.time()


class FakeEvent:
    """The gang's ``_changed``: its 0.5 s wait is 0.5 fake seconds, at once."""

    def __init__(self, clock: GangClock):
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        self.clock.advance(timeout or 0.0)
        return False

    def set(self) -> None:
        pass

    def clear(self) -> None:
        pass


class FakeNode(QuietChannel):
    """A node's channel (``engine/channel.NodeChannel``). Once told to
    supervise (with ``sets_up``, once told to go, as a supervisor whose
    torchrun waits for its setup), it prints a rank line and says it started; then it sends a
    heartbeat every HEARTBEAT_S while it runs (unless ``frozen``), what
    ``script`` holds at its fake times, and exits with ``exit_at``'s code.
    ``stop`` ends it (exit 143) unless ``ignores_stop``; ``kill`` always
    does (exit 137). Every control word it gets is kept with its fake time."""

    def __init__(self, clock: GangClock, *, exit_at: tuple[float, int] | None = None,
                 script: tuple[tuple[float, bytes], ...] = (), ignores_stop: bool = False,
                 sets_up: bool = False):
        self.clock = clock
        self.sets_up = sets_up  # runs a setup: first (its ``script`` says when it is done)
        self.host = "fake"
        self.exit_at = exit_at
        self.script = list(script)
        self.ignores_stop = ignores_stop
        self.sent: list[tuple[Control, float]] = []
        self.reasons: list[str] = []
        self.ended = False
        self.next_beat = HEARTBEAT_S
        self.cond = threading.Condition()
        self.buffer: collections.deque[bytes] = collections.deque()
        self.asks = self.handed = 0
        self.on_go = b""  # what it says once told to go (a run with setup:)
        self.aborted = False
        clock.nodes.append(self)

    # the node's side
    def emit(self, data: bytes) -> None:
        with self.cond:
            self.buffer.append(data)
            self.cond.notify_all()

    def end(self, code: int, reason: str, ended: Ended = Ended.STOPPED) -> None:
        if not self.ended:
            self.ended = True
            self.emit(exit_line(code, reason, ended))

    def due(self, now: float) -> None:
        if self.ended:
            return
        while self.script and self.script[0][0] <= now:
            self.emit(self.script.pop(0)[1])
        if self.exit_at is not None and self.exit_at[0] <= now:
            self.end(self.exit_at[1], "torchrun exited", Ended.ITSELF)
            return
        while self.next_beat <= now:
            self.emit(encode({"event": "heartbeat"}))
            self.next_beat += HEARTBEAT_S

    def quiet(self) -> bool:
        """Everything sent was taken and the relay waits for more."""
        with self.cond:
            return not self.buffer and self.asks == self.handed + 1

    # the controller's side
    def supervise(self, spec) -> None:
        begun = (f"[rank{spec.first_rank}]: training\n".encode()
                 + encode({"event": "started", "workers": spec.nproc}))
        if self.sets_up:  # as a real supervisor's: its torchrun waits for go
            self.on_go = begun
        else:
            self.emit(begun)
        self.due(self.clock.now)

    def read_chunk(self, size: int) -> bytes:
        with self.cond:
            self.asks += 1
            while not self.buffer:
                self.cond.wait()
            self.handed += 1
            return self.buffer.popleft()

    def send_control(self, word: Control, reason: str = "") -> None:
        self.sent.append((word, self.clock.now))
        self.reasons.append(reason)
        if word is Control.GO and self.on_go:
            self.emit(self.on_go)
            self.on_go = b""
        if word is Control.KILL:
            self.end(137, "killed")
        elif word is Control.STOP and not self.ignores_stop:
            self.end(143, "got SIGTERM", Ended.SIGNAL)

    def at(self, word: Control) -> list[float]:
        return [t for w, t in self.sent if w is word]

    def abort(self) -> None:
        """As an SSH channel's: the channel is cut, and reads as ended (-15)."""
        self.aborted = True
        self.emit(b"")

    def poll(self):
        return -15 if self.aborted else None


@pytest.fixture
def clock(monkeypatch) -> GangClock:
    fake = GangClock()
    monkeypatch.setattr(gang_module, "time", fake)
    monkeypatch.setattr(nodehandle_module, "time", NodeClock(fake))
    return fake


def start_gang(tmp_path, clock: GangClock, nodes: list[FakeNode], *, extra: str = "",
               console: Console | None = None, owner: Owner = Owner(), **kw) -> Gang:
    text = "nodes:\n" + "  - {host: localhost, procs: 1}\n" * len(nodes) + textwrap.dedent("""\
        workload: {script: train.py}
        master: {port: 29500}
        """) + extra
    (tmp_path / "train.py").write_text("")
    spec = load_cluster_text(text, source=str(tmp_path / "c.yaml"), base_dir=str(tmp_path))
    plan = build_plan(spec, run_id="r", local_run_dir=str(tmp_path / "runs" / "r"))
    info = DryRun(backend="fake", plan=plan, owner=owner, nodes=tuple(
        NodeLaunch(node=n, where="nowhere", env=n.env, unset_env=n.unset_env,
                   argv=torchrun_argv(plan, n)) for n in plan.nodes))
    gang = Gang(info, RunDir.create(str(tmp_path / "runs"), "r"), dict(enumerate(nodes)),
                console or Console("quiet"), **kw)
    gang._changed = FakeEvent(clock)

    def settle() -> None:
        deadline = real_time.monotonic() + 10.0
        for handle, node in zip(gang.handles, nodes):
            while handle._relay is not None and handle._relay.is_alive() and not node.quiet():
                assert real_time.monotonic() < deadline, "a relay did not take its bytes"
                real_time.sleep(0.0005)

    clock.settle = settle
    return gang


def test_a_node_that_exited_0_and_then_stays_silent_is_not_lost(tmp_path, clock):
    """Node 0 exits 0 at 1 s and is silent from then on; node 1 runs (heard
    every HEARTBEAT_S) for 4 peer timeouts more, then exits 0 too."""
    early = FakeNode(clock, exit_at=(1.0, 0))
    late = FakeNode(clock, exit_at=(4 * PEER_TIMEOUT_S, 0))
    outcome = start_gang(tmp_path, clock, [early, late]).run()
    assert [n.state for n in outcome.nodes] == [NodeState.SUCCEEDED, NodeState.SUCCEEDED]
    assert outcome.state is RunState.SUCCEEDED
    assert late.at(Control.STOP) == [] and late.at(Control.KILL) == []
    assert clock.now >= 4 * PEER_TIMEOUT_S


def test_a_running_node_silent_past_the_peer_timeout_is_lost(tmp_path, clock):
    """The check above is not blind: a running node that stops being heard
    (a heartbeat every HEARTBEAT_S until 10 s, then nothing) is lost once
    PEER_TIMEOUT_S has passed since it was last heard, not before."""
    frozen = FakeNode(clock)
    other = FakeNode(clock)
    original = frozen.due

    def due(now: float) -> None:
        if now <= 10.0:
            original(now)

    frozen.due = due
    outcome = start_gang(tmp_path, clock, [other, frozen], grace_s=1.0).run()
    assert outcome.nodes[1].state is NodeState.LOST
    assert outcome.nodes[0].state is NodeState.STOPPED
    (stopped,) = other.at(Control.STOP)
    assert 10.0 + PEER_TIMEOUT_S < stopped <= 10.0 + PEER_TIMEOUT_S + 1.0


def test_a_node_silent_just_before_another_fails_is_lost_at_once_as_the_root_cause(
        tmp_path, clock):
    """Issue 43: node 1 froze at 10 s. Its agent gave up on us a moment
    before we gave up on it, tore its ranks down, and node 0's ranks failed
    in the cascade (at 39.5 s, half a second before node 1's silence
    reached the peer timeout here). The gang stopped for node 0's failure,
    then waited the grace period and the kill for node 1, which could hear
    neither, and named it "killed by signal 15". Now node 1 is given up on
    the moment its silence reaches the timeout, named as silent, and is the
    root cause: its silence began before node 0's failure."""
    frozen = FakeNode(clock)
    cascade = encode({"event": "exit", "code": 1, "reason": "torchrun exited", "ended": "itself",
                      "duration_s": 0.1, "last_lines": [], "failures": [
                          {"local_rank": 0, "timestamp": clock.time() + 39.4,
                           "message": "RuntimeError: [../gloo/transport/tcp/pair.cc:534] "
                                      "Connection closed by peer [10.0.0.2]:5301"}]})
    other = FakeNode(clock, script=((10.0 + PEER_TIMEOUT_S - 0.5, cascade),))
    original = frozen.due

    def due(now: float) -> None:
        if now <= 10.0:
            original(now)

    frozen.due = due
    frozen.end = lambda code, reason, ended=None: None  # frozen: it hears no stop, and says nothing
    outcome = start_gang(tmp_path, clock, [other, frozen], grace_s=10.0).run()
    assert outcome.nodes[1].state is NodeState.LOST, outcome.nodes[1]
    assert outcome.nodes[1].reason.startswith(f"nothing from the node for {PEER_TIMEOUT_S:g}s")
    assert outcome.root_cause.node_rank == 1
    assert clock.now < 10.0 + PEER_TIMEOUT_S + 2.0, clock.now  # not the grace and the kill
    assert frozen.at(Control.KILL) == []


def test_a_schedulers_node_silent_past_the_peer_timeout_is_not_lost(tmp_path, clock):
    """A scheduler owns its nodes' liveness (``Owner.pings``):
    the node silent from 10 s on is not lost; the gang waits for its end."""
    frozen = FakeNode(clock, exit_at=(4 * PEER_TIMEOUT_S, 0))
    other = FakeNode(clock, exit_at=(4 * PEER_TIMEOUT_S, 0))
    original = frozen.due

    def due(now: float) -> None:
        if now <= 10.0 or now >= 4 * PEER_TIMEOUT_S:
            original(now)

    frozen.due = due
    outcome = start_gang(tmp_path, clock, [other, frozen], grace_s=1.0,
                         owner=Owner(Holder.SCHEDULER)).run()
    assert [n.state for n in outcome.nodes] == [NodeState.SUCCEEDED, NodeState.SUCCEEDED]
    assert other.at(Control.STOP) == []


class LateNode(FakeNode):
    """A node whose torchrun says it started only at ``at`` (a slow start)."""

    def __init__(self, clock: GangClock, at: float):
        super().__init__(clock)
        self.at = at

    def supervise(self, spec) -> None:
        self.script.append((self.at, f"[rank{spec.first_rank}]: training\n".encode()
                            + encode({"event": "started", "workers": spec.nproc})))
        self.due(self.clock.now)


def test_a_detached_run_is_left_once_started_with_no_progress_file_to_go_stale(tmp_path,
                                                                               clock):
    """``up --detach`` leaves once every node has started; one node that is
    slow to start must not leave a progress.json behind that nothing would
    update (``status`` asks a detached run's nodes)."""
    outcome = start_gang(tmp_path, clock, [FakeNode(clock), LateNode(clock, 6.0)],
                         owner=Owner(Holder.SCHEDULER, detached=True)).run()
    assert outcome.state is RunState.RUNNING
    assert clock.now >= 6.0
    assert not (tmp_path / "runs" / "r" / "progress.json").exists()


@pytest.mark.parametrize("hang_s", [10.0, 25.0])
def test_the_hang_verdict_comes_no_earlier_than_hang_s_and_within_a_second_after(
        tmp_path, clock, hang_s):
    """Both ranks print at 0 s; rank 0 reports progress at 4 s (a heartbeat
    with its step), then neither does anything but heartbeats: the hang
    counts from 4 s, so every node is told to stop between 4 + hang_s and
    4 + hang_s + 1, and the rank that went quiet first (rank 1) is named."""
    progress = encode({"event": "heartbeat", "progress": {"0": [3, 0.0]}})
    nodes = [FakeNode(clock, script=((4.0, progress),)), FakeNode(clock)]
    outcome = start_gang(tmp_path, clock, nodes, hang_timeout_s=hang_s, grace_s=1.0).run()
    for node in nodes:
        (stopped,) = node.at(Control.STOP)
        assert 4.0 + hang_s <= stopped <= 4.0 + hang_s + 1.0, (hang_s, stopped)
    assert outcome.state is RunState.FAILED
    assert outcome.root_cause.node_rank == 1
    assert outcome.root_cause.reason.startswith("hang: no progress for ")
    assert "rank 1 went quiet first" in outcome.root_cause.reason


def test_a_node_that_ignores_stop_gets_kill_after_the_grace_period(tmp_path, clock):
    """Node 1 fails at 2 s; node 0 is told to stop and ignores it: the gang
    sends kill once the grace period (and the supervisor's own margin, 5 s)
    has passed, not before, and the run ends with node 1 its root cause."""
    grace = 7.0
    stubborn = FakeNode(clock, ignores_stop=True)
    failing = FakeNode(clock, exit_at=(2.0, 1))
    outcome = start_gang(tmp_path, clock, [stubborn, failing], grace_s=grace).run()
    (stopped,) = stubborn.at(Control.STOP)
    (killed,) = stubborn.at(Control.KILL)
    assert 2.0 <= stopped <= 3.0
    assert stopped + grace <= killed <= stopped + grace + 5.0 + 0.5, (stopped, killed)
    assert failing.at(Control.STOP) == [] and failing.at(Control.KILL) == []
    assert outcome.state is RunState.FAILED and outcome.root_cause.node_rank == 1
    assert [n.state for n in outcome.nodes] == [NodeState.STOPPED, NodeState.FAILED]


def test_a_node_that_hears_neither_stop_nor_kill_is_cut_off_and_left_alone_after(
        tmp_path, clock):
    """Issue 43 (ssh-attached-teardown-node_frozen): node 1 froze as node 0's
    failure tore the gang down. It heard neither the stop nor the kill, was
    cut off, and is named so, not "killed by signal 15" (the cut channel's
    own code); being unreachable, nothing more is asked of it after the run
    (the fetch and the sweep each waited out 5 s of connect timeout there)."""
    frozen = FakeNode(clock)
    frozen.end = lambda code, reason, ended=None: None  # hears no stop and no kill, says nothing
    failing = FakeNode(clock, exit_at=(2.0, 1))
    gang = start_gang(tmp_path, clock, [failing, frozen], grace_s=3.0)
    outcome = gang.run()
    assert frozen.aborted and len(frozen.at(Control.KILL)) == 1
    assert outcome.nodes[1].state is NodeState.LOST
    assert outcome.nodes[1].reason.startswith("answered neither the stop nor the kill, so it "
                                              "was cut off"), outcome.nodes[1].reason
    assert outcome.root_cause.node_rank == 0
    assert [h.unreachable for h in gang.handles] == [False, True]


def test_a_node_that_obeys_stop_is_not_killed(tmp_path, clock):
    obeying = FakeNode(clock)
    failing = FakeNode(clock, exit_at=(2.0, 1))
    outcome = start_gang(tmp_path, clock, [obeying, failing], grace_s=7.0).run()
    assert len(obeying.at(Control.STOP)) == 1 and obeying.at(Control.KILL) == []
    assert [n.state for n in outcome.nodes] == [NodeState.STOPPED, NodeState.FAILED]


def test_with_setup_the_processes_are_said_started_once_every_nodes_setup_is_done(
        tmp_path, clock):
    """Issue #32: "started 4 processes on 3 node(s)" was printed before
    `setup:` ran, long before any process existed. Node 0's setup ends at
    2 s, node 1's at 6 s: only then are the processes said started, and
    only then does either node get its go."""
    done = encode({"event": "setup", "ok": True})
    first = FakeNode(clock, script=((2.0, done),), exit_at=(20.0, 0), sets_up=True)
    second = FakeNode(clock, script=((6.0, done),), exit_at=(20.0, 0), sets_up=True)
    out = io.StringIO()
    with Console("all", out) as console:
        outcome = start_gang(tmp_path, clock, [first, second], extra="setup: [make]\n",
                             console=console).run()
    assert outcome.state is RunState.SUCCEEDED
    said = [line for line in out.getvalue().splitlines() if line.startswith("ddp-orch: ")]
    assert said[0].startswith("ddp-orch: running setup: on 2 node(s) before their 2 processes "
                              "start; logs in "), said
    assert [line for line in said if "started" in line] == [
        "ddp-orch: setup: done on every node; started 2 processes on 2 node(s)"], said
    assert min(first.at(Control.GO) + second.at(Control.GO)) >= 6.0


class SilentNode(FakeNode):
    """A node whose rank prints nothing and reports no step (most programs
    print on rank 0 only): it only says its workers started."""

    def supervise(self, spec) -> None:
        self.emit(encode({"event": "started", "workers": spec.nproc}))
        self.due(self.clock.now)


def test_a_quiet_own_script_run_says_it_started_and_its_output_lines_are_progress(
        tmp_path, clock):
    """Issue #32: `up --quiet` with a user's own script (no step heartbeats,
    no hang watchdog) showed nothing until the summary. Now it says it
    started, node 0's rank, which printed at 0 s, has made progress then
    (in progress.json, as status reads it, and in the progress line at 15
    s), and node 1's rank, which printed nothing, has no output yet: listed,
    not left out and not stalled."""
    out = io.StringIO()
    nodes = [FakeNode(clock, exit_at=(20.0, 0)), SilentNode(clock, exit_at=(20.0, 0))]
    with Console("quiet", out) as console:
        gang = start_gang(tmp_path, clock, nodes, console=console)
        outcome = gang.run()
    assert outcome.state is RunState.SUCCEEDED
    said = out.getvalue().splitlines()
    assert said[0].startswith("ddp-orch: started 2 processes on 2 node(s); logs in "), said
    assert len(said) == 3 and re.fullmatch(
        r"ddp-orch: node 0 \(localhost\): 1 rank\(s\), last progress 1[56]s ago", said[1]), said
    assert said[2] == "ddp-orch: node 1 (localhost): 1 rank(s), no output yet", said
    last = {int(rank): seen for rank, seen in gang.run_dir.progress()["ranks"].items()}
    printed_at = FakeClock.EPOCH  # fake 0 s, on the wall clock
    assert (last[0]["step"], last[0]["last_progress"], last[0]["last_output"]) == (
        None, printed_at, printed_at)
    assert (last[1]["step"], last[1]["last_progress"], last[1]["last_output"]) == (
        None, None, None)


def test_progress_json_gives_each_ranks_samples_where_its_heartbeat_says_them(tmp_path, clock):
    """Rank 0's step heartbeat carries its samples, rank 1's does not: in
    ``progress.json`` (what ``status`` of a live run reads) rank 0 has them
    and rank 1 null."""
    with_samples = encode({"event": "heartbeat", "progress": {"0": [40, 0.0, 1280]}})
    without = encode({"event": "heartbeat", "progress": {"1": [40, 0.0]}})
    nodes = [FakeNode(clock, script=((4.0, with_samples),), exit_at=(10.0, 0)),
             FakeNode(clock, script=((4.0, without),), exit_at=(10.0, 0))]
    gang = start_gang(tmp_path, clock, nodes)
    assert gang.run().state is RunState.SUCCEEDED
    last = {int(rank): seen for rank, seen in gang.run_dir.progress()["ranks"].items()}
    assert (last[0]["step"], last[0]["samples"]) == (40, 1280)
    assert (last[1]["step"], last[1]["samples"]) == (40, None)


def test_progress_json_of_a_kept_run_says_the_attempt_its_keepers_announced(tmp_path):
    """A kept run's nodes announce each attempt (the keeper's ``attempt``
    event, ``NodeHandle.attempt``); ``progress.json`` carries the latest, so
    ``top`` of a live kept run shows it after a restart. A run the
    controller holds has no attempts, and says none."""
    from types import SimpleNamespace

    from orchestrator.engine.gpuuse import GpuUse

    def handle(node_rank: int, attempt: int) -> SimpleNamespace:
        return SimpleNamespace(
            progress={node_rank: (7, 1.0)}, output_at={}, samples={}, pace={}, step_at={},
            node=SimpleNamespace(ranks=[node_rank], node_rank=node_rank, host=f"h{node_rank}"),
            gpu_use=GpuUse(), started=True, attempt=attempt)

    def written(kept: bool, attempts: tuple[int, ...]) -> dict:
        run = RunDir.create(str(tmp_path / f"runs-{kept}-{len(attempts)}"), "r")
        gang = SimpleNamespace(
            leaves=False, _progress_written=float("-inf"), run_dir=run,
            owner=Owner(Holder.KEEPERS if kept else Holder.CONTROLLER),
            plan=SimpleNamespace(ranks=()), console=SimpleNamespace(view="plain"),
            handles=[handle(k, a) for k, a in enumerate(attempts)])
        Gang._report_progress(gang)
        return run.progress()

    kept = written(True, (2, 1))  # node 1 has not seen attempt 2's announcement yet
    assert kept["attempt"] == 2 and sorted(kept["ranks"]) == ["0", "1"]
    assert "attempt" not in written(False, (0, 0))
