"""The node channel (``orchestrator.engine.channel``): a NodeHandle steers a node
with typed control words through the channel's declared methods only, and
each implementation maps the words onto its own means (a Slurm stream's
``stop`` and ``kill`` are scancels)."""

from __future__ import annotations

import io
import threading
import time

import pytest

from orchestrator.agent.wire.protocol import Control, Ended, encode, exit_event
from orchestrator.backends.slurm import ctl as slurmctl
from orchestrator.backends.scheduler import job as slurmjob
from orchestrator.backends.slurm import Backend as SlurmBackend
from orchestrator.engine.options import LaunchOptions
from orchestrator.console import Console
from orchestrator.engine.channel import KeeperFollower, NodeChannel
from orchestrator.engine.nodehandle import NodeHandle
from orchestrator.engine.nodespec import supervisor_spec
from orchestrator.plan.dryrun import NodeLaunch
from orchestrator.plan.model import NodePlan
from orchestrator.records.outcome import NodeState
from orchestrator.records.rundir import RunDir


class FakeChannel:
    """Exactly the methods of ``NodeChannel`` (no ``process``, no requests):
    output that arrives when ``feed`` says, and a record of what was sent."""

    def __init__(self):
        self.host = "fake"
        self.sent: list[Control] = []
        self.reasons: list[str] = []
        self.spec = None
        self.hung_up = self.aborted = False
        self.left_over = b""
        self._chunks: list[bytes] = []
        self._more = threading.Condition()

    def feed(self, data: bytes) -> None:
        with self._more:
            self._chunks.append(data)
            self._more.notify_all()

    def supervise(self, spec) -> None:
        self.spec = spec

    def send_control(self, word: Control, reason: str = "") -> None:
        self.sent.append(word)
        self.reasons.append(reason)

    def read_chunk(self, size: int) -> bytes:
        with self._more:
            self._more.wait_for(lambda: self._chunks, timeout=10)
            return self._chunks.pop(0) if self._chunks else b""

    def unread(self, data: bytes) -> None:
        self.left_over = data + self.left_over

    def poll(self):
        return None

    def wait(self, timeout: float) -> int:
        raise TimeoutError

    def hang_up(self) -> None:
        self.hung_up = True

    def abort(self) -> None:
        self.aborted = True

    def release(self):
        return "the agent"


def _handle(channel: NodeChannel, tmp_path) -> NodeHandle:
    node = NodePlan(node_rank=0, host="h", python="python3", gpus=None, first_rank=0, nproc=1,
                    run_dir="/r", env={}, unset_env=())
    launch = NodeLaunch(node=node, where="local subprocess", env={}, unset_env=(),
                        argv=("torchrun",))
    return NodeHandle(launch, channel, RunDir(str(tmp_path)), Console("all", io.StringIO()))


def test_a_node_handle_steers_its_node_with_control_words_through_the_channel(tmp_path):
    channel = FakeChannel()
    handle = _handle(channel, tmp_path)
    spec = supervisor_spec(handle.launch, "r1", 29500, 5.0)
    handle.start(spec)
    assert channel.spec is spec
    handle.ping()
    handle.go()  # its setup: is not done: no go yet
    assert channel.sent == [Control.PING]
    channel.feed(encode({"event": "setup", "ok": True}))
    deadline = time.monotonic() + 10
    while not handle.setup_ok:
        assert time.monotonic() < deadline, "the relay did not take the setup event"
        time.sleep(0.01)
    handle.go()
    handle.go()  # once only
    handle.stop()
    handle.stop()  # once only
    handle.kill()
    assert channel.sent == [Control.PING, Control.GO, Control.STOP, Control.KILL]
    assert channel.hung_up  # kill closes the way to the node: nothing more is sent
    handle.ping()
    assert channel.sent[-1] is Control.KILL
    channel.feed(b"a line\n" + encode(exit_event(137, "killed by the controller",
                                                 Ended.STOPPED, duration_s=1.0)) + b"after the exit\n")
    outcome = handle.finish(timeout=10)
    assert outcome.state is NodeState.STOPPED and outcome.exit_code == 137
    assert channel.left_over == b"after the exit\n"  # the agent's again, unread
    assert (tmp_path / "node-0.log").read_text() == "a line\n"


def test_after_the_exit_event_the_channel_is_released_with_done_by_the_channel(tmp_path):
    channel = FakeChannel()
    handle = _handle(channel, tmp_path)
    handle.start(supervisor_spec(handle.launch, "r1", 29500, 5.0))
    assert handle.release() is None  # no exit event yet: the run is not over
    channel.feed(encode(exit_event(0, "torchrun exited", Ended.ITSELF, duration_s=2.0)))
    assert handle.finish(timeout=10).state is NodeState.SUCCEEDED
    assert handle.release() == "the agent"
    handle.abort()  # the run is over: nothing to cut
    assert not channel.aborted


def test_a_node_that_goes_quiet_is_aborted_through_the_channel(tmp_path):
    channel = FakeChannel()
    handle = _handle(channel, tmp_path)
    handle.start(supervisor_spec(handle.launch, "r1", 29500, 5.0))
    handle.abort()
    assert channel.aborted
    channel.feed(b"")  # the stream ends with no exit event
    assert handle.finish(timeout=10).state is NodeState.LOST


class FakeAgent:
    host = "n1"

    def __init__(self):
        self.requests, self.words = [], []

    def send(self, op, payload=b"", **fields):
        self.requests.append((op, fields))

    def send_control(self, word, reason=""):
        self.words.append((word, reason) if reason else word)


def test_a_keeper_follower_sends_follow_instead_of_supervise_and_gives_nothing_back():
    agent = FakeAgent()
    follower = KeeperFollower(agent, {"run_dir": "/r", "offset": 0})
    follower.supervise()
    follower.send_control(Control.STOP)
    assert agent.requests == [("follow", {"run_dir": "/r", "offset": 0})]
    assert agent.words == [Control.STOP] and follower.release() is None


def test_a_slurm_stream_turns_stop_and_kill_into_scancel_and_ignores_the_rest(monkeypatch,
                                                                                tmp_path):
    calls = []
    monkeypatch.setattr(slurmctl, "cancel", lambda job_id, signal=None: calls.append(
        (job_id, signal)))
    stream = slurmjob.JobStream(str(tmp_path / "agent.out"),
                                slurmjob.Job("42", SlurmBackend(LaunchOptions()),
                                             poll=False), "n1")
    for word in (Control.PING, Control.GO, Control.DONE):
        stream.send_control(word)
    assert calls == []  # Slurm owns liveness; the nodes hold their own barrier
    stream.send_control(Control.STOP)
    stream.send_control(Control.KILL)
    assert calls == [("42", None), ("42", "KILL")]
    assert stream.poll() is None and stream.release() is None


@pytest.mark.parametrize("word", list(Control))
def test_a_control_word_reads_back_as_itself(word):
    assert word.encode().endswith(b"\n")
    assert Control.parse(word.encode()) is word


@pytest.mark.parametrize("line", [b"", b"\n", b"STOP\n", b"stopp\n", b"\xff\n", b"{}\n"])
def test_anything_else_is_no_control_word(line):
    assert Control.parse(line) is None
