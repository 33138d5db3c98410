"""The controller-agent wire (``orchestrator.agent.wire.protocol``), fast and pure,
and the relay's refusal to trust what a node sends."""

from __future__ import annotations

import io
import json

import pytest

from orchestrator.agent.wire.protocol import CONTROL_PREFIX, ProtocolError, Reader, decode, encode
from orchestrator.engine.nodehandle import NodeHandle
from orchestrator.console import Console
from orchestrator.plan.dryrun import NodeLaunch
from orchestrator.plan.model import NodePlan
from orchestrator.records.outcome import NodeState
from orchestrator.records.rundir import RunDir

EXIT = {"event": "exit", "code": 1, "reason": "torchrun exited", "duration_s": 1.5,
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


@pytest.mark.parametrize("line", [
    CONTROL_PREFIX + b"[" * 4000 + b"\n",  # RecursionError in the parser
    CONTROL_PREFIX + b'{"event": "exit", "failures": ' + b"[" * 100000 + b"\n",
    CONTROL_PREFIX + b'{"event": "gang-hello", "node_rank": 1, "token": "\\ud800"}\n',
    CONTROL_PREFIX + b'{"event": "reply", "ok": true, "n": 1' + b"0" * 5000 + b"}\n",
])
def test_any_parse_failure_is_a_protocol_error(line):
    """Whatever a line does to the parser (a stack exhausted by nesting, a
    number too long to convert), the reader sees one malformed line."""
    try:
        decode(line)
    except ProtocolError:
        pass  # or it decodes: never another exception


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
    handle = NodeHandle(launch, FakeAgent(data), RunDir(str(tmp_path)), Console("all", out))
    handle.start({})
    outcome = handle.finish(timeout=10)
    log = (tmp_path / "node-0.log").read_text()
    assert log.count("ignored a malformed control line") == 2 and "worker line" in log
    assert outcome.state is NodeState.FAILED and "RuntimeError: x" in outcome.reason
    assert json.dumps(EXIT) not in out.getvalue()


class LyingProcess:
    """A node whose agent says hello, then announces far more than asked."""

    def __init__(self):
        self.data = io.BytesIO(
            encode({"event": "hello", "home": "/h", "pid": 1, "python": "p"})
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
