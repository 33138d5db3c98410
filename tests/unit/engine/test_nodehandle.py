"""The controller-agent wire (``orchestrator.agent.wire.protocol``), fast and pure,
and the relay's refusal to trust what a node sends."""

from __future__ import annotations

import io
import json

import pytest

from orchestrator.agent.wire.protocol import CONTROL_PREFIX, ProtocolError, Reader, decode, encode
from orchestrator.engine.nodehandle import NodeHandle
from orchestrator.engine.nodestate import ATTEMPT_FROM, NEXT, Ask, NodePhase
from orchestrator.console import Console
from orchestrator.plan.dryrun import NodeLaunch
from orchestrator.plan.model import NodePlan
from orchestrator.records.outcome import NodeState, WorkerFailure
from orchestrator.records.rundir import RunDir
from orchestrator.engine.nodestate import _failure_reason

EXIT = {"event": "exit", "code": 1, "reason": "torchrun exited", "ended": "itself", "duration_s": 1.5,
        "last_lines": ["boom"], "failures": [
            {"local_rank": 0, "message": "RuntimeError: x", "timestamp": 5, "error_file": None}]}


def test_a_message_survives_the_round_trip():
    assert decode(encode(EXIT)) == EXIT


@pytest.mark.parametrize("line", [
    CONTROL_PREFIX + b"not json\n",
    CONTROL_PREFIX + b"[1, 2]\n",
    CONTROL_PREFIX + b'{"event": "format-disk"}\n',
    encode({"event": "started", "workers": "two"}),
    encode({"event": "started", "workers": True}),  # a bool is not a count
    encode({**EXIT, "code": None}),
    encode({**EXIT, "failures": ["not a record"]}),
    encode({**EXIT, "failures": [{**EXIT["failures"][0], "local_rank": "0"}]}),
    encode({**EXIT, "last_lines": [1]}),
    encode({"event": "reply", "ok": True, "size": -1}),
    encode({"event": "reply", "ok": True, "size": 1 << 40}),
    encode({"event": "hello", "home": "/root", "pid": 1}),
    b"output that is not a control line\n",
])
def test_malformed_messages_are_refused(line):
    with pytest.raises(ProtocolError):
        decode(line)


@pytest.mark.parametrize("line, why", [
    (CONTROL_PREFIX + b"[" * 4000 + b"\n", "RecursionError"),  # the parser's stack exhausted
    (CONTROL_PREFIX + b'{"event": "exit", "failures": ' + b"[" * 100000 + b"\n",
     "RecursionError"),
    (CONTROL_PREFIX + b'{"event": "reply", "ok": true, "n": 1' + b"0" * 5000 + b"}\n",
     "not JSON"),  # a number too long to convert
])
def test_any_parse_failure_is_a_protocol_error(line, why):
    """Whatever a line does to the parser (a stack exhausted by nesting, a
    number too long to convert), the reader sees one malformed line: a
    ProtocolError, never another exception and never a message."""
    with pytest.raises(ProtocolError, match=why):
        decode(line)


def test_a_hello_whose_token_cannot_be_encoded_is_a_protocol_error():
    """A lone surrogate is valid JSON, so the line decodes; the gang's head
    then refuses the hello as a ProtocolError, not a UnicodeEncodeError."""
    from orchestrator.agent.kept.peers import check_hello

    line = CONTROL_PREFIX + b'{"event": "gang-hello", "node_rank": 1, "token": "\\ud800"}\n'
    assert decode(line)["token"] == "\ud800"
    with pytest.raises(ProtocolError, match="not a node of this run"):
        check_hello(line + b"after", "the-token", 2)
    good = encode({"event": "gang-hello", "node_rank": 1, "token": "the-token"})
    assert check_hello(good + b"after", "the-token", 2) == (1, b"after")


def test_reader_keeps_payloads_whole_whatever_the_chunking():
    stream = encode({"event": "reply", "ok": True, "size": 5}) + b"ab\ncd" + b"next line\n"
    chunks = iter([stream[i:i + 3] for i in range(0, len(stream), 3)])
    reader = Reader(lambda n: next(chunks, b""))
    assert decode(reader.readline())["size"] == 5
    assert reader.read_exact(5) == b"ab\ncd"
    assert reader.readline() == b"next line\n"
    assert reader.readline() == b""
    with pytest.raises(ProtocolError, match="ended 3 bytes early"):
        reader.read_exact(3)


class FakeAgent:
    """A node that sends garbage, then an exit event, then closes."""

    def __init__(self, data: bytes):
        self.data = io.BytesIO(data)

    def supervise(self, spec):
        pass

    def poll(self):
        return 1

    def wait(self, timeout=None):
        return 1

    def unread(self, data):
        self.left = data

    def read_chunk(self, size):
        return self.data.read(7)  # tiny reads: framing must not depend on chunking


def test_a_malformed_control_line_is_logged_and_the_relay_goes_on(tmp_path):
    node = NodePlan(node_rank=0, host="h", python="python3", gpus=None, first_rank=0, nproc=1,
                    run_dir="/r", env={}, unset_env=())
    launch = NodeLaunch(node=node, where="local subprocess", env={}, unset_env=(), argv=())
    data = (CONTROL_PREFIX + b'{"event": "exit", "code": "zero"}\n' + b"worker line\n"
            + CONTROL_PREFIX + b"\xff\xfe\n" + encode(EXIT))
    out = io.StringIO()
    console = Console("all", out)
    handle = NodeHandle(launch, FakeAgent(data), RunDir(str(tmp_path)), console)
    handle.start(None)
    outcome = handle.finish(timeout=10)
    console.close()
    log = (tmp_path / "node-0.log").read_text()
    assert log.count("ignored a malformed control line") == 2 and "worker line" in log
    assert outcome.state is NodeState.FAILED and "RuntimeError: x" in outcome.reason
    assert json.dumps(EXIT) not in out.getvalue()


class LyingProcess:
    """A node whose agent says hello, then announces far more than asked."""

    def __init__(self):
        self.data = io.BytesIO(
            encode({"event": "hello", "home": "/h", "pid": 1, "python": "p", "cores": 2})
            + encode({"event": "reply", "ok": True, "size": 50 << 20}) + b"x" * 1000)
        self.aborted = False

    def send(self, data):
        pass

    def read_chunk(self, size):
        return self.data.read(size)

    def abort(self):
        self.aborted = True


class LyingTransport:
    host = "evil"

    def start(self, argv, **kwargs):
        self.process = LyingProcess()
        return self.process


def test_a_node_announcing_more_than_asked_is_cut_off_unread():
    from orchestrator.engine.agentlink import AgentHandle
    from orchestrator.errors import TransportError

    transport = LyingTransport()
    agent = AgentHandle(transport, "python3")
    with pytest.raises(TransportError, match="more than the 100 asked for"):
        agent.get("/r/result.json", 100)
    assert transport.process.aborted


# -- the relay: what a node's stream becomes, whatever its chunking ------------------

SECRET = "hf_s3cr3tValue1234"


class StreamAgent:
    """A node's channel whose supervisor sends ``data`` in reads of ``size``
    bytes, then ends with the channel's own status ``code``; what the relay
    hands back (``unread``) is kept."""

    host = "h1"

    def __init__(self, data: bytes, size: int, code=None):
        self.data = io.BytesIO(data)
        self.size = size
        self.code = code
        self.handed_back: bytes | None = None

    def poll(self):
        return self.code

    def wait(self, timeout=None):
        return self.code

    def supervise(self, spec):
        pass

    def read_chunk(self, size):
        return self.data.read(min(size, self.size))

    def unread(self, data):
        self.handed_back = data


def relay(tmp_path, data: bytes, size: int, code=None, env=None):
    """Relay ``data`` to the end; (outcome, node log, console, agent, on_change calls)."""
    env = env or {}
    node = NodePlan(node_rank=1, host="h1", python="python3", gpus=None, first_rank=2, nproc=2,
                    run_dir="/r", env=env, unset_env=())
    launch = NodeLaunch(node=node, where="local subprocess", env=env, unset_env=(), argv=())
    agent, out, changes = StreamAgent(data, size, code), io.StringIO(), []
    console = Console("all", out)
    handle = NodeHandle(launch, agent, RunDir(str(tmp_path)), console,
                        on_change=lambda: changes.append(1))
    handle.start(None)
    outcome = handle.finish(timeout=10)
    console.close()
    return outcome, (tmp_path / "node-1.log").read_text(), out.getvalue(), agent, changes


@pytest.mark.parametrize("size", [1, 2, 5, 13, 14, 15, 64, 65536])
def test_a_control_line_split_across_reads_is_acted_on_and_never_shown(tmp_path, size):
    data = b"[rank2]: before\n" + encode(EXIT) + b"after\n"
    outcome, log, console, agent, changes = relay(tmp_path, data, size)
    assert outcome.state is NodeState.FAILED
    assert outcome.reason == "torchrun exited 1; rank 2 (local rank 0) failed: RuntimeError: x"
    assert log == "[rank2]: before\n"
    assert "before" in console and "::ddp-orch::" not in console + log and "after" not in console
    assert changes == [1]


@pytest.mark.parametrize("size", [1, 3, 16, 65536])
def test_what_follows_the_exit_event_is_handed_back_to_the_agent_whole(tmp_path, size):
    after = encode({"event": "reply", "ok": True}) + b"no newline yet"
    data = b"line\n" + encode(EXIT) + after
    _outcome, log, _console, agent, _ = relay(tmp_path, data, size)
    assert agent.handed_back is not None
    assert agent.handed_back + agent.data.read() == after  # not a byte lost, none twice
    assert log == "line\n"


@pytest.mark.parametrize("size", [1, 4, 65536])
def test_a_secret_in_the_output_is_masked_in_the_log_and_the_console(tmp_path, size):
    data = f"token is {SECRET}!\n".encode() + encode(dict(EXIT, code=0, failures=[]))
    outcome, log, console, _, _ = relay(tmp_path, data, size, env={"HF_TOKEN": SECRET})
    assert outcome.state is NodeState.SUCCEEDED
    assert SECRET not in log + console
    assert "token is ********!" in log and "token is ********!" in console


def test_a_secret_in_an_event_is_masked_before_the_outcome_says_it(tmp_path):
    failure = {"local_rank": 1, "message": f"ValueError: bad token {SECRET}", "timestamp": 5,
               "error_file": None}
    data = encode(dict(EXIT, failures=[failure], last_lines=[f"auth {SECRET}"]))
    outcome, _log, _console, _, _ = relay(tmp_path, data, 7, env={"HF_TOKEN": SECRET})
    assert outcome.reason == \
        "torchrun exited 1; rank 3 (local rank 1) failed: ValueError: bad token ********"
    assert SECRET not in json.dumps(outcome.to_dict()["failures"])


def test_a_malformed_control_line_quoting_a_secret_is_noted_without_it(tmp_path):
    data = (encode({"event": "no-such-event", "said": SECRET})
            + encode(dict(EXIT, code=0, failures=[])))
    outcome, log, console, _, _ = relay(tmp_path, data, 9, env={"HF_TOKEN": SECRET})
    assert "ignored a malformed control line" in log and "********" in log
    assert SECRET not in log + console and outcome.state is NodeState.SUCCEEDED


def test_a_restart_attempt_is_announced_in_the_log_and_on_the_console(tmp_path):
    data = (encode({"event": "attempt", "attempt": 0, "master_port": 29500})
            + encode({"event": "attempt", "attempt": 2, "master_port": 29517})
            + encode(dict(EXIT, code=0, failures=[])))
    _outcome, log, console, _, _ = relay(tmp_path, data, 11)
    assert log == "ddp-orch: attempt 2 (master port 29517)\n"  # the first attempt is no news
    assert "ddp-orch: attempt 2 (master port 29517)" in console


def test_a_restarted_attempts_progress_starts_afresh(tmp_path):
    """The ranks' lines and step heartbeats are progress; after a gang
    restart (attempt 1), what attempt 0's ranks did no longer is: rank 2,
    which has said nothing since, has no output, and rank 3 no step."""
    node = NodePlan(node_rank=1, host="h1", python="python3", gpus=None, first_rank=2, nproc=2,
                    run_dir="/r", env={}, unset_env=())
    launch = NodeLaunch(node=node, where="local subprocess", env={}, unset_env=(), argv=())
    data = (b"[rank2]: attempt 0\n" + encode({"event": "heartbeat", "progress": {"3": [5, 0.0]}})
            + encode({"event": "attempt", "attempt": 1, "master_port": 29517})
            + b"[rank3]: attempt 1\n" + encode(dict(EXIT, code=0, failures=[])))
    handle = NodeHandle(launch, StreamAgent(data, 13), RunDir(str(tmp_path)),
                        Console("all", io.StringIO()))
    handle.watch_output = True
    handle.start(None)
    handle.finish(timeout=10)
    assert list(handle.output_at) == [3]
    assert list(handle.progress) == [3] and handle.progress[3][0] is None


def test_a_rank_that_prints_keeps_the_step_its_heartbeat_reports(tmp_path):
    """Issue #33: a rank's output lines are progress, but its step is its
    step report's: a heartbeat a few seconds old (its age, 3 s) that
    arrives after a line still moves the step, and its own time is kept
    apart from the line's (``step_at``, what ``top``'s rates are over)."""
    node = NodePlan(node_rank=1, host="h1", python="python3", gpus=None, first_rank=2, nproc=2,
                    run_dir="/r", env={}, unset_env=())
    launch = NodeLaunch(node=node, where="local subprocess", env={}, unset_env=(), argv=())
    data = (encode({"event": "heartbeat", "progress": {"2": [5, 10.0]}}) + b"[rank2]: step 9\n"
            + encode({"event": "heartbeat", "progress": {"2": [12, 3.0, 48, 0.05, 0.01]}})
            + encode(dict(EXIT, code=0, failures=[])))
    handle = NodeHandle(launch, StreamAgent(data, 13), RunDir(str(tmp_path)),
                        Console("all", io.StringIO()))
    handle.watch_output = True
    handle.start(None)
    handle.finish(timeout=10)
    step, progressed = handle.progress[2]
    assert step == 12 and handle.samples[2] == 48 and handle.pace[2] == (0.05, 0.01)
    assert progressed == handle.output_at[2]  # the line is younger than the report
    assert handle.step_at[2] < progressed - 2.5  # the report's own time: 3 s before


def handle_after(tmp_path, data: bytes) -> NodeHandle:
    """Node 1 (ranks 2 and 3)'s handle once its stream ``data`` is relayed."""
    node = NodePlan(node_rank=1, host="h1", python="python3", gpus=None, first_rank=2, nproc=2,
                    run_dir="/r", env={}, unset_env=())
    launch = NodeLaunch(node=node, where="local subprocess", env={}, unset_env=(), argv=())
    handle = NodeHandle(launch, StreamAgent(data + encode(dict(EXIT, code=0, failures=[])), 13),
                        RunDir(str(tmp_path)), Console("all", io.StringIO()))
    handle.start(None)
    handle.finish(timeout=10)
    return handle


def test_a_heartbeat_carries_a_ranks_samples_where_it_has_them(tmp_path):
    """[step, age] and [step, age, samples] are a rank's progress; a fourth
    item, samples that are no count or an age that is none is not, and is
    ignored whole."""
    beat = {"2": [40, 0.5, 1280], "3": [41, 0.5], "4": [42, 0.5, 10, 1], "5": [43, 0.5, -1],
            "6": [44, 0.5, True], "7": [45, 0.5, 2.0], "8": [46, True, 1], "9": [47, -1.0, 1]}
    handle = handle_after(tmp_path, encode({"event": "heartbeat", "progress": beat}))
    assert {rank: step for rank, (step, _at) in handle.progress.items()} == {2: 40, 3: 41}
    assert handle.samples == {2: 1280}


def test_a_later_heartbeat_without_samples_forgets_them_and_an_attempt_starts_afresh(tmp_path):
    first = encode({"event": "heartbeat", "progress": {"2": [5, 9.0, 160], "3": [5, 9.0, 160]}})
    later = encode({"event": "heartbeat", "progress": {"2": [6, 0.0]}})
    handle = handle_after(tmp_path, first + later)
    assert handle.samples == {3: 160} and handle.progress[2][0] == 6
    restarted = encode({"event": "attempt", "attempt": 1, "master_port": 29517})
    handle = handle_after(tmp_path, first + restarted)
    assert handle.samples == {} and handle.progress == {}


@pytest.mark.parametrize("code, state, reason", [
    (255, NodeState.LOST, "connection lost without an exit status"),
    (-9, NodeState.LOST, "the node agent ended without reporting (killed by signal 9); "
                         "its guardian tears the run down there"),
])
def test_a_stream_that_ends_without_an_exit_event_is_a_lost_node(tmp_path, code, state, reason):
    outcome, log, console, agent, changes = relay(tmp_path, b"working\nhalf a li", 4, code=code)
    assert (outcome.state, outcome.reason, outcome.exit_code) == (state, reason, code)
    assert log == "working\nhalf a li"  # the unfinished last line is kept too
    assert "half a li" in console
    assert agent.handed_back is None and changes == [1]


MESSAGE = "WorkloadError: --data real: no MNIST at /r/code/data/MNIST/raw (datasets.py:134)"


def failure(local_rank: int, message: str = MESSAGE, at: float = 1.0) -> WorkerFailure:
    return WorkerFailure(local_rank, message, at, f"torchrun/x/attempt_0/{local_rank}/error.json")


def test_the_reason_names_the_first_failure_and_the_ranks_that_failed_the_same_way():
    failures = (failure(2, at=1.0), failure(0, at=1.1), failure(1, "RuntimeError: other", 1.2),
                failure(3, at=1.3))
    assert _failure_reason(1, failures, 4, []) == (
        f"torchrun exited 1; rank 6 (local rank 2) failed: {MESSAGE}; the same on ranks 4, 7")
    assert _failure_reason(1, failures[:2], 0, []).endswith(f"{MESSAGE}; the same on rank 0")
    assert _failure_reason(1, failures[2:3], 0, []) == \
        "torchrun exited 1; rank 1 (local rank 1) failed: RuntimeError: other"


# A node's phase (``NodePhase``): one value, forward only ------------------------------

def _streamed(tmp_path, *events: dict) -> NodeHandle:
    """A handle that relayed ``events`` (and then an exit), as its node sent them."""
    node = NodePlan(node_rank=0, host="h", python="python3", gpus=None, first_rank=0, nproc=1,
                    run_dir="/r", env={}, unset_env=())
    launch = NodeLaunch(node=node, where="local subprocess", env={}, unset_env=(), argv=())
    data = b"".join(encode(e) for e in events) + encode({**EXIT, "code": 0, "failures": []})
    handle = NodeHandle(launch, FakeAgent(data), RunDir(str(tmp_path)), Console("quiet"))
    assert handle.phase is NodePhase.NEW and not handle.supervising
    handle.start(None)
    handle.finish(timeout=10)
    return handle


SETUP_OK, JOINED, STARTED = ({"event": "setup", "ok": True}, {"event": "joined"},
                             {"event": "started", "workers": 1})


def test_a_phase_is_reached_once_and_a_late_or_repeated_event_never_moves_it_back(tmp_path):
    handle = _streamed(tmp_path, SETUP_OK, JOINED, STARTED, JOINED, SETUP_OK)
    assert handle.phase is NodePhase.STARTED
    assert handle.joined and handle.started and handle.setup_ok
    # an ended node keeps the phase it reached: the gang rule asks whether it had started
    assert handle.poll() == 0 and handle.started


def test_a_run_without_setup_skips_to_joined_and_a_failed_setup_is_no_phase(tmp_path):
    assert _streamed(tmp_path, JOINED).phase is NodePhase.JOINED
    assert _streamed(tmp_path, STARTED).phase is NodePhase.STARTED  # started: joined too
    failed = _streamed(tmp_path, {"event": "setup", "ok": False})
    assert failed.phase is NodePhase.SUPERVISED and not failed.setup_ok


def test_go_only_after_the_nodes_setup_and_never_once_torchrun_runs(tmp_path):
    handle = _streamed(tmp_path)
    assert not handle.advance(NodePhase.GO)  # supervised, setup not done
    assert handle.advance(NodePhase.SET_UP) and handle.advance(NodePhase.GO)
    assert handle.go_sent and not handle.advance(NodePhase.GO)
    ran = _streamed(tmp_path, JOINED)
    assert not ran.advance(NodePhase.GO) and not ran.advance(NodePhase.SET_UP)


def test_a_kept_runs_next_attempt_starts_torchrun_again_after_its_setup(tmp_path):
    handle = _streamed(tmp_path, SETUP_OK, STARTED,
                       {"event": "attempt", "attempt": 1, "master_port": 29501})
    assert handle.phase is NodePhase.SET_UP
    assert handle.setup_ok and not handle.joined and not handle.started
    first = _streamed(tmp_path, {"event": "attempt", "attempt": 0, "master_port": 29500}, JOINED)
    assert first.phase is NodePhase.JOINED  # attempt 0 is the first: nothing to undo


def test_what_the_controller_asked_is_apart_from_the_phase_it_reached(tmp_path):
    handle = _streamed(tmp_path, STARTED)
    handle.asked = Ask.STOP
    assert handle.stop_sent and not handle.killed and handle.started
    handle.asked = Ask.KILL
    assert handle.stop_sent and handle.killed and handle.phase is NodePhase.STARTED


def test_every_move_of_the_table_goes_forward_and_only_an_attempt_goes_back():
    for phase, moves in NEXT.items():
        assert all(to > phase for to in moves), (phase, moves)
    assert set(NEXT) == set(NodePhase) and NEXT[NodePhase.STARTED] == frozenset()
    assert min(ATTEMPT_FROM) == NodePhase.SET_UP
