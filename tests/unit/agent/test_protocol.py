"""Unit tests of agent/wire/protocol.py: the declared messages, malformed exit events."""

from __future__ import annotations

import json
import math

import pytest

from orchestrator.agent.wire.protocol import MESSAGES, Event, ProtocolError, decode, encode, \
    message, validate
from noderecords import GOOD_PART


def test_every_message_is_declared_by_its_event_and_every_event_a_declared_message():
    assert list(MESSAGES) == list(Event)  # keyed by the enum, one entry each
    with pytest.raises(ProtocolError, match="unknown control message"):
        validate({"event": "EXIT"})  # a member's name is not its word


def test_a_message_is_built_as_its_receiver_checks_it():
    """``message``: what every sender builds; a missing, mistyped or bool-for-int
    field is the sender's bug, refused where it is made, not dropped by the
    receiver; extra fields ride along."""
    stop = message(Event.GANG_STOP, attempt=2, reason="node 1 failed", final=False)
    assert decode(encode(stop)) == {"event": "gang-stop", "attempt": 2,
                                    "reason": "node 1 failed", "final": False}
    assert message(Event.FINISHED, code=0, state="succeeded", attempts=[])["attempts"] == []
    for bad in ({"attempt": 2, "reason": "x"}, {"attempt": "2", "reason": "x", "final": True},
                {"attempt": True, "reason": "x", "final": True}):
        with pytest.raises(ProtocolError, match="gang-stop message: bad or missing"):
            message(Event.GANG_STOP, **bad)


@pytest.mark.parametrize("bad", [
    {"timestamp": 1e300}, {"timestamp": math.nan}, {"timestamp": math.inf},
    {"timestamp": True}, {"local_rank": "0"}, {"local_rank": -1}, {"message": 7},
])
def test_an_exit_event_with_a_bad_failure_record_is_malformed(bad):
    failure = {**GOOD_PART["failures"][0], **bad}
    with pytest.raises(ProtocolError):
        validate({"event": "exit", **GOOD_PART, "failures": [failure]})


@pytest.mark.parametrize("field,value", [("duration_s", 1e300), ("stopped_at", -5),
                                         ("stopped_at", "now")])
def test_an_exit_event_with_a_time_that_is_no_time_is_malformed(field, value):
    with pytest.raises(ProtocolError):
        validate({"event": "exit", **GOOD_PART, field: value})


def test_every_request_the_agent_serves_is_declared_once_and_described():
    """``OPS`` is the one list of ops: ``serve`` binds one handler to each
    (``supervise`` and ``follow`` too), and its docstring's table describes
    each of them."""
    import re

    from orchestrator.agent.wire import serve
    from orchestrator.agent.wire.protocol import OPS

    assert sorted(serve.ANSWERS) == sorted(OPS)
    described = re.findall(r"^``(\w+)``  ", serve.__doc__, re.M)
    assert sorted(described) == sorted(OPS)


def test_a_handler_binds_only_to_a_declared_op_and_only_once():
    from orchestrator.agent.wire import serve

    for op in ("rm", "put"):  # undeclared; declared and bound already
        with pytest.raises(LookupError, match=repr(op)):
            serve.answers(op)(lambda session, request, stdin: None)
    assert serve.ANSWERS["put"].__name__ == "_put"


def test_a_request_is_built_as_the_agent_checks_it():
    from orchestrator.agent.wire.protocol import check_request, request

    line = request("put", path="/r/x", size=3, sha256="ab", mode=0o600)
    assert check_request(json.loads(line)) == {"op": "put", "path": "/r/x", "size": 3,
                                                "sha256": "ab", "mode": 0o600}
    request("bind", port=0, host=None)  # "host?" may be null, or absent
    request("bind", port=0)
    for op, fields, named in [("put", {"path": "/x", "size": "3", "sha256": "ab"}, "'size'"),
                              ("put", {"path": "/x", "size": 3}, "'sha256'"),
                              ("get", {"path": "/x", "max": True}, "'max'"),
                              ("down", {"run_id": "r", "node_rank": 0, "grace_s": "5"},
                               "'grace_s'"),
                              ("gpus", {"want": 3, "run_id": "r", "busy_mib": 1}, "'want'")]:
        with pytest.raises(ProtocolError, match=f"^{op} request: bad or missing {named}"):
            request(op, **fields)
    with pytest.raises(ProtocolError, match="unknown request 'rm'"):
        request("rm", path="/")


def test_an_ok_reply_without_its_declared_fields_is_refused_and_a_failed_one_is_not():
    from orchestrator.agent.wire.protocol import check_reply

    assert check_reply("bind", {"ok": True, "port": 29500})["port"] == 29500
    assert check_reply("bind", {"ok": False, "error": "in use"})["error"] == "in use"
    with pytest.raises(ProtocolError, match="bind reply: bad or missing 'port'"):
        check_reply("bind", {"ok": True, "port": "29500"})
    with pytest.raises(ProtocolError, match="down reply: bad or missing 'killed'"):
        check_reply("down", {"ok": True, "survivors": []})


def test_the_agent_answers_a_malformed_request_and_goes_on_serving():
    """A request the table refuses gets an error reply naming the field, not a
    traceback; a refused ``put``'s payload is skipped, not read as requests."""
    import subprocess
    import sys

    from orchestrator.agent.wire.protocol import CONTROL_PREFIX

    root = __file__.rsplit("/tests/", 1)[0]
    lines = (json.dumps({"op": "put", "path": "/nowhere/x", "size": 5, "sha256": 7}).encode()
             + b"\n" + b'{"op"' + b"\n" + json.dumps({"op": "clock", "extra": 1}).encode()
             + b"\n" + json.dumps({"op": "route", "host": "h"}).encode() + b"\n")
    ran = subprocess.run([sys.executable, "-m", "orchestrator.agent", "serve"], input=lines,
                         capture_output=True, cwd=root, timeout=60)
    replies = [decode(line) for line in ran.stdout.splitlines(keepends=True)
               if line.startswith(CONTROL_PREFIX)][1:]
    assert [(r["ok"], r.get("error", "")) for r in replies[:1] + replies[2:]] == [
        (False, "put request: bad or missing 'sha256'"),
        (True, ""), (False, "route request: bad or missing 'port'")]
    assert replies[1]["ok"] is False and replies[1]["error"].startswith("bad request")
    assert ran.returncode == 0 and b"Traceback" not in ran.stderr
