"""The node supervisor's own rules (``agent/node/supervisor.py``), with no
torchrun: how long it goes on without hearing from its controller, on a fake
clock. (``tests/live/test_supervisor.py`` runs real ones.)"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from orchestrator.agent.node import supervisor as supervisor_module
from orchestrator.agent.node.spec import SupervisorSpec
from orchestrator.agent.wire.owner import Holder, Owner
from orchestrator.agent.node.supervisor import Supervisor
from fakes import FakeClock

SILENCE_S = 30.0  # docs/failures.md: a supervisor stops its run after 30 s without its controller


class FakeWakeup:
    """The supervisor's wait: ``timeout`` fake seconds at once, and the
    controller's pings (each one a line on stdin: ``last_heard`` now) at
    the fake times in ``pings``."""

    def __init__(self, clock: FakeClock, sup: Supervisor, pings: list[float]):
        self.clock, self.sup, self.pings = clock, sup, sorted(pings)

    def wait(self, timeout: float | None) -> None:
        self.clock.now += timeout or 0.0
        while self.pings and self.pings[0] <= self.clock.now:
            self.sup.last_heard = self.pings.pop(0)

    def set(self) -> None:
        pass

    def close(self) -> None:
        pass


class Stdin:
    eof = False


def supervisor(tmp_path, monkeypatch, holder: Holder, pings: list[float],
               started: bool = False):
    """A supervisor on a fake clock whose torchrun (no process: pid 999999)
    has joined and started a worker (``started``), else never does."""
    clock = FakeClock()
    monkeypatch.setattr(supervisor_module, "time", clock)
    monkeypatch.setattr(supervisor_module.procs, "connected_to", lambda pid, port: started)
    monkeypatch.setattr(supervisor_module.procs, "children_of",
                        lambda pid: [1000] if started and pid == 999999 else [])
    spec = SupervisorSpec(run_id="r", node_rank=0, run_dir=str(tmp_path), first_rank=0, nproc=1,
                          master_port=29500, argv=("torchrun",), env={}, unset_env=(),
                          bundle=None, grace_s=3.0, heartbeat_s=5.0, owner=Owner(holder))
    sup = Supervisor(spec, stdin=Stdin())
    sup.wakeup.close()  # its pipe: the fake below waits instead
    sup.wakeup = FakeWakeup(clock, sup, pings)
    return sup, clock


@pytest.mark.parametrize("pings, last", [
    ([], 0.0),  # never heard after the start
    ([5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0], 40.0),  # pinged, then silent
    ([29.0, 58.0], 58.0),  # pings just inside the timeout keep it going
])
@pytest.mark.parametrize("started", [False, True], ids=["starting", "running"])
def test_the_run_stops_once_the_controller_is_silent_for_the_timeout_not_later(
        tmp_path, monkeypatch, pings, last, started):
    sup, clock = supervisor(tmp_path, monkeypatch, Holder.CONTROLLER, pings, started)
    assert sup.wait(pid=999999) is None  # a stop, not torchrun's exit
    assert last + SILENCE_S < clock.now <= last + SILENCE_S + 1.0, clock.now
    assert sup.controller_lost and sup.stop_requested
    assert sup.stop_reason == "lost the controller (nothing from it for 30s)"
    assert sup.stopped_at == pytest.approx(1_700_000_000.0 + clock.now)
    assert sup.workers_started is started


def test_a_keepers_supervisor_does_not_watch_for_a_controller(tmp_path, monkeypatch):
    """No controller to hear (a keeper, a scheduler): silence stops nothing;
    torchrun's exit ends the wait."""
    sup, clock = supervisor(tmp_path, monkeypatch, Holder.KEEPERS, [])
    wakeup = sup.wakeup

    class ExitLater(FakeWakeup):
        def wait(self, timeout):
            wakeup.wait(timeout)
            if clock.now >= 10 * SILENCE_S:
                sup.exit_code = 0
                sup.exited.set()

    sup.wakeup = ExitLater(clock, sup, [])
    assert sup.wait(pid=999999) == 0
    assert clock.now >= 10 * SILENCE_S and not sup.controller_lost and not sup.stop_requested


@pytest.mark.parametrize("pings, last", [([], 0.0), ([10.0, 20.0, 30.0], 30.0)])
def test_waiting_for_every_nodes_setup_ends_once_the_controller_is_silent(
        tmp_path, monkeypatch, pings, last):
    """The setup phase (issue #32): after its own ``setup:`` a node waits for
    the controller's ``go``; a frozen link sends neither ``go`` nor pings,
    and the wait ends 30 s after the last one, not never."""
    sup, clock = supervisor(tmp_path, monkeypatch, Holder.CONTROLLER, pings)
    wait = sup.wakeup.wait

    def bounded(timeout):
        assert clock.now < 10 * SILENCE_S, "still waiting for go long after the silence"
        wait(timeout)

    sup.wakeup.wait = bounded
    supervisor_module._await_go(sup)
    assert last + SILENCE_S < clock.now <= last + SILENCE_S + 1.0, clock.now
    assert sup.controller_lost and not sup.go.is_set()
    assert sup.stop_reason == "lost the controller (nothing from it for 30s)"


def test_a_setup_command_is_stopped_once_the_controller_is_silent(tmp_path, monkeypatch):
    """The same while a ``setup:`` command runs: what ``run_setup`` asks
    between reads (``stopped``) says stop 30 s into the silence, and the
    node's exit says why."""
    sup, clock = supervisor(tmp_path, monkeypatch, Holder.CONTROLLER, [12.0])
    asked_at: list[float] = []

    def run_setup(commands, cwd, env, timeout_s, write, stopped):
        while not stopped():  # a command that never ends: `pip install` on a hung mirror
            assert clock.now < 10 * SILENCE_S, "setup went on long after the silence"
            sup.wakeup.wait(0.2)  # time passes; the pings up to now arrive
        asked_at.append(clock.now)
        return {"ok": False, "stopped": True}

    monkeypatch.setattr(supervisor_module.nodesetup, "run_setup", run_setup)
    monkeypatch.setattr(supervisor_module.guardian, "release", lambda guardian: None)
    monkeypatch.setattr(sup, "teardown", lambda pid, grace_s=None: 0)
    sup.out = open(tmp_path / "out", "wb")
    sup.spec = dataclasses.replace(sup.spec, setup={"commands": [["pip", "install", "x"]],
                                                    "cwd": str(tmp_path), "timeout_s": 1800})
    assert sup.prepare({}, 0.0) is False
    assert 12.0 + SILENCE_S < asked_at[0] <= 12.0 + SILENCE_S + 1.0, asked_at
    assert sup.last_exit["reason"] == "lost the controller (nothing from it for 30s)"
    assert sup.last_exit["code"] == 128 + 15 and not sup.last_exit.get("setup_failed")


def test_a_ranks_step_report_gives_its_step_age_and_samples_where_it_has_them(
        tmp_path, monkeypatch):
    """``progress/rank-N`` as the step reports write it: ``"<step> <time>"``
    gives [step, age]; ``"<step> <time> <samples>"`` [step, age, samples].
    Samples that are no count, or a line cut at the read bound, keep the
    step without them; a line of four fields is no step report."""
    sup, clock = supervisor(tmp_path, monkeypatch, Holder.CONTROLLER, [])
    clock.now = 10.0
    stamp = f"{FakeClock.EPOCH + 8.0:.3f}"  # 2 s before now
    reports = {"0": f"40 {stamp}\n", "1": f"40 {stamp} 1280\n", "2": f"40 {stamp} -3\n",
               "3": f"40 {stamp} 12.5\n", "4": f"40 {stamp} 7 9\n",
               "5": f"40 {stamp} " + "1" * supervisor_module.PROGRESS_READ + "\n"}
    (tmp_path / "progress").mkdir()
    for rank, text in reports.items():
        (tmp_path / "progress" / f"rank-{rank}").write_text(text)
    assert sup.progress() == {"0": [40, 2.0], "1": [40, 2.0, 1280], "2": [40, 2.0],
                              "3": [40, 2.0], "5": [40, 2.0]}


class SlowPipe:
    """The supervisor's stdout to a controller that reads slowly: the first
    write (a burst of output) blocks for ``stall_s``; everything is kept."""

    def __init__(self, stall_s: float):
        self.stall_s, self.written, self.first = stall_s, [], True

    def write(self, data: bytes) -> None:
        if self.first:
            self.first = False
            time.sleep(self.stall_s)
        self.written.append(data)

    def flush(self) -> None:
        pass


def test_a_control_line_waits_behind_output_on_a_slow_pipe_and_is_never_dropped(
        tmp_path, monkeypatch):
    """Issue 43: a write that waited 5 s for the output lock gave up, so an
    exit event behind a burst of output on a slow link was lost, and the
    node's real exit code read as a lost node. It waits its turn while the
    controller lives; to a controller given up on (gone, or only paused) it
    is offered for a moment, and the teardown goes on."""
    sup, _ = supervisor(tmp_path, monkeypatch, Holder.CONTROLLER, pings=[])
    sup.out = SlowPipe(stall_s=5.5)
    burst = threading.Thread(target=sup.write_out, args=(b"x" * 65536 + b"\n",))
    burst.start()
    time.sleep(0.2)  # the burst holds the pipe
    sup.emit({"event": "exit", "code": 3})
    burst.join()
    assert len(sup.out.written) == 2 and b'"code":3' in sup.out.written[1]
    sup.out = SlowPipe(stall_s=3.0)
    burst = threading.Thread(target=sup.write_out, args=(b"y\n",))
    burst.start()
    time.sleep(0.2)
    sup.controller_lost = True  # silent past the peer timeout: maybe gone, maybe paused
    started = time.monotonic()
    sup.emit({"event": "exit", "code": 4})
    assert time.monotonic() - started < 1.5  # offered for a moment, not waited for
    burst.join()
    time.sleep(0.2)
    assert b'"code":4' in sup.out.written[-1]  # a paused controller finds it on waking


class ScriptedLogs:
    """Worker logs that give ``script``'s chunks, one per look; b"" once it is spent."""

    def __init__(self, script: list[bytes]):
        self.script = list(script)

    def read(self, final: bool = False) -> bytes:
        return self.script.pop(0) if self.script and not final else b""


class CountedWait:
    """``workers_done``: records each wait's timeout; set after ``waits`` waits."""

    def __init__(self, waits: int):
        self.waits, self.timeouts = waits, []

    def is_set(self) -> bool:
        return len(self.timeouts) >= self.waits

    def wait(self, timeout: float) -> bool:
        self.timeouts.append(timeout)
        return self.is_set()


def test_quiet_workers_are_looked_at_less_often_and_never_later_than_a_tenth_of_a_second(
        tmp_path, monkeypatch):
    """Each look at the log files is CPU taken from ranks that may share the
    node's cores: while the ranks are quiet, the looks thin out from 20 ms to
    0.1 s (torchrun's own tailer's pace), and the first look after output
    comes 20 ms later again, so a burst of lines is not relayed in 0.1 s steps."""
    sup, _ = supervisor(tmp_path, monkeypatch, Holder.CONTROLLER, pings=[])
    sup.out = SlowPipe(stall_s=0.0)
    script = [b""] * 6 + [b"[rank0]: a\n"] + [b""] * 3
    monkeypatch.setattr(supervisor_module, "WorkerLogs",
                        lambda *a: ScriptedLogs(script))
    sup.workers_done = CountedWait(waits=9)
    sup.follow_workers()
    assert sup.workers_done.timeouts == pytest.approx(
        [0.02, 0.04, 0.08, 0.1, 0.1, 0.1, 0.02, 0.04, 0.08])
    assert b"[rank0]: a\n" in b"".join(sup.out.written)
