"""The keepers of a kept run (agent/keeper.py, peers.py, daemon.py, restarts.py),
with real daemons, real sockets and real child processes, but plain Python
commands instead of torchrun, so they run in seconds.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import time

import pytest

from orchestrator.agent import daemon, peers
from orchestrator.agent.keeper import attempt_spec
from orchestrator.agent.protocol import ProtocolError, decode, encode
from orchestrator.agent.restarts import will_recur
from orchestrator.backends.keptgang import attempt_outcomes
from orchestrator.records.outcome import NodeState, RunState

# A node's "torchrun": says its attempt, and exits after 0.5 s with the code
# the test asks for on that node and attempt (CODES="node:attempt:code,...")
# (the half second lets every node say its line before the gang is stopped),
# or with 0 after SLEEP seconds.
PROGRAM = """
import os, sys, time
k, attempt = sys.argv[1], os.environ["DDP_ORCH_RESTART_COUNT"]
print(f"node {k} attempt {attempt} port {sys.argv[3]} secret {os.environ.get('TOKEN')}", flush=True)
codes = dict((c.rsplit(":", 1)[0], int(c.rsplit(":", 1)[1]))
             for c in os.environ.get("CODES", "").split(",") if c)
if f"{k}:{attempt}" in codes:
    time.sleep(0.5)
    sys.exit(codes[f"{k}:{attempt}"])
time.sleep(float(os.environ.get("SLEEP", "2")))
"""


def keeper_specs(tmp_path, nnodes: int, *, restarts: int = 0, env: dict | None = None,
                 token: str | None = None) -> list[dict]:
    token = token or secrets.token_hex(16)
    run_id = f"kt-{os.getpid()}-{time.monotonic_ns()}"
    out = []
    for k in range(nnodes):
        run_dir = str(tmp_path / f"node-{k}")
        node_env = {"DDP_ORCH_RUN_ID": run_id, "DDP_ORCH_NODE_RANK": str(k),
                    "DDP_ORCH_RESTART_COUNT": "0", **(env or {})}
        out.append({
            "nnodes": nnodes, "max_restarts": restarts, "start_timeout_s": 20,
            "rule": "detached", "gang": {"addr": "127.0.0.1", "port": 0, "token": token},
            "supervisor": {
                "run_id": run_id, "node_rank": k, "run_dir": run_dir, "first_rank": k,
                "nproc": 1, "master_port": 29500,
                "argv": [sys.executable, "-c", PROGRAM, str(k), "--master-port", "29500",
                         "--log-dir", f"{run_dir}/torchrun"],
                "env": node_env, "unset_env": [], "grace_s": 2, "heartbeat_s": 1,
                "peer_timeout_s": None,
                "secrets": [node_env["TOKEN"]] if "TOKEN" in node_env else []}})
    return out


def start_all(specs: list[dict]) -> list[dict]:
    head = daemon.start(specs[0], listen=True)
    assert head["ok"] and head["gang_port"]
    replies = [head]
    for spec in specs[1:]:
        spec["gang"]["port"] = head["gang_port"]
        replies.append(daemon.start(spec, listen=False))
    return replies


def wait_ended(specs: list[dict], timeout: float = 30) -> list[dict]:
    deadline = time.monotonic() + timeout
    states = []
    for spec in specs:
        run_dir = spec["supervisor"]["run_dir"]
        while True:
            state = daemon.state(run_dir)
            if state["keeper"] and state["keeper"]["state"] != "running" and not state["alive"]:
                states.append(state["keeper"])
                break
            assert time.monotonic() < deadline, f"{run_dir}: {state}"
            time.sleep(0.05)
    return states


def stream(spec: dict) -> str:
    with open(os.path.join(spec["supervisor"]["run_dir"], "agent.out"), encoding="utf-8") as fh:
        return fh.read()


@pytest.mark.live  # real daemons: seconds each
def test_a_gang_restart_recovers_and_every_node_runs_each_attempt_on_the_new_port(tmp_path):
    specs = keeper_specs(tmp_path, 3, restarts=1, env={"CODES": "2:0:3"})
    start_all(specs)
    states = wait_ended(specs)
    assert [s["state"] for s in states] == ["succeeded"] * 3
    attempts = states[0]["attempts"]
    assert [a["state"] for a in attempts] == ["failed", "succeeded"]
    assert attempts[0]["nodes"]["2"]["code"] == 3 and attempts[0]["restart"] == "restarting"
    port = attempts[1]["master_port"]
    assert port != 29500
    for k, spec in enumerate(specs):
        out = stream(spec)
        assert f"node {k} attempt 0 port 29500" in out and f"node {k} attempt 1 port {port}" in out
        assert out.rstrip().splitlines()[-1].startswith("::ddp-orch:: {\"event\":\"finished\"")
    outcomes = attempt_outcomes(_plan(3), attempts)
    assert outcomes[0][0].state is RunState.FAILED and outcomes[0][0].root_cause.node_rank == 2
    assert {o.state for o in outcomes[0][1][:2]} == {NodeState.STOPPED}  # stopped by the head
    assert outcomes[1][0].state is RunState.SUCCEEDED


@pytest.mark.live  # real daemons: seconds each
def test_restarts_stop_at_max_and_the_head_records_every_attempt(tmp_path):
    specs = keeper_specs(tmp_path, 2, restarts=2,
                         env={"CODES": "1:0:5,1:1:5,1:2:5", "SLEEP": "0.2"})
    start_all(specs)
    states = wait_ended(specs)
    assert [s["state"] for s in states] == ["failed", "failed"]
    attempts = states[0]["attempts"]
    assert len(attempts) == 3 and [a["restart"] for a in attempts] == \
        ["restarting", "restarting", ""]
    assert len({a["master_port"] for a in attempts}) == 3


@pytest.mark.live  # real daemons: seconds each
def test_a_killed_keeper_stops_the_other_nodes_at_once(tmp_path):
    specs = keeper_specs(tmp_path, 3, env={"SLEEP": "60"})
    replies = start_all(specs)
    time.sleep(1.5)  # the gang has formed and the attempt runs
    began = time.monotonic()
    os.kill(replies[1]["pid"], signal.SIGKILL)
    states = [s for i, s in enumerate(wait_ended([specs[0], specs[2]], timeout=20))]
    assert time.monotonic() - began < 12
    attempt = states[0]["attempts"][0]
    assert "lost" in attempt["nodes"]["1"] and attempt["nodes"]["2"]["stop_asked"]
    assert attempt["no_restart"] == "" and attempt["state"] == "failed"


@pytest.mark.live  # real daemons: seconds each
def test_signalling_a_keeper_stops_the_gang_for_good(tmp_path):
    specs = keeper_specs(tmp_path, 2, restarts=3, env={"SLEEP": "60"})
    start_all(specs)
    time.sleep(1.5)
    assert daemon.signal_keeper(specs[1]["supervisor"]["run_dir"]) is not None  # `down`
    states = wait_ended(specs, timeout=20)
    assert [s["state"] for s in states] == ["interrupted", "interrupted"]
    assert len(states[0]["attempts"]) == 1  # no restart after a stop on purpose


@pytest.mark.live  # real daemons: seconds each
def test_secret_values_never_reach_the_stream_or_the_records(tmp_path):
    secret = "hunter2-" + secrets.token_hex(4)
    specs = keeper_specs(tmp_path, 2, env={"TOKEN": secret, "CODES": "0:0:1", "SLEEP": "0.2"})
    start_all(specs)
    wait_ended(specs)
    for spec in specs:
        run_dir = spec["supervisor"]["run_dir"]
        for name in ("agent.out", "keeper.json"):
            with open(os.path.join(run_dir, name), encoding="utf-8") as fh:
                text = fh.read()
            assert secret not in text and "********" in text or name == "keeper.json"
            assert secret not in text


@pytest.mark.live  # real daemons: seconds each
def test_the_gang_port_refuses_a_stranger_and_a_wrong_token(tmp_path):
    specs = keeper_specs(tmp_path, 2, env={"SLEEP": "3"})
    head = daemon.start(specs[0], listen=True)
    with socket.create_connection(("127.0.0.1", head["gang_port"])) as sock:
        sock.sendall(encode({"event": "gang-hello", "node_rank": 1, "token": "wrong"}))
        sock.settimeout(5)
        assert sock.recv(100) == b""  # hung up on
    with socket.create_connection(("127.0.0.1", head["gang_port"])) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(100) == b""
    specs[1]["gang"]["port"] = head["gang_port"]
    daemon.start(specs[1], listen=False)  # the real node 1 still joins
    assert [s["state"] for s in wait_ended(specs)] == ["succeeded", "succeeded"]


@pytest.mark.live  # real daemons: seconds each
def test_a_peer_that_never_joins_fails_the_run_after_the_start_timeout(tmp_path):
    specs = keeper_specs(tmp_path, 2)
    specs[0]["start_timeout_s"] = 1
    daemon.start(specs[0], listen=True)
    (state,) = wait_ended(specs[:1], timeout=10)
    assert state["state"] == "failed"
    assert "node(s) 1 never joined the gang's port" in stream(specs[0])


def test_accept_hello_checks_the_token_and_the_rank():
    a, b = socket.socketpair()
    with a, b:
        b.sendall(encode({"event": "gang-hello", "node_rank": 5, "token": "t"}))
        with pytest.raises(ProtocolError, match="not in this run"):
            peers.accept_hello(a, "t", 3)
    a, b = socket.socketpair()
    with a, b:
        b.sendall(encode({"event": "gang-hello", "node_rank": 1, "token": "t"}) + b"rest")
        assert peers.accept_hello(a, "t", 3) == (1, b"rest")


def test_attempt_spec_swaps_the_port_and_log_dir_and_counts_the_attempt():
    spec = keeper_specs(__import__("pathlib").Path("/r"), 1)[0]["supervisor"]
    first = attempt_spec(spec, 0, 29500)
    assert first["argv"] == spec["argv"] and first["env"]["DDP_ORCH_RESTART_COUNT"] == "0"
    later = attempt_spec(spec, 2, 41000)
    assert later["argv"][-3:] == ["41000", "--log-dir", "/r/node-0/torchrun.attempt-2"]
    assert later["log_dir"] == "/r/node-0/torchrun.attempt-2"
    assert later["env"]["DDP_ORCH_RESTART_COUNT"] == "2" and later["master_port"] == 41000
    assert spec["env"]["DDP_ORCH_RESTART_COUNT"] == "0"  # the dry-run's spec is untouched


@pytest.mark.parametrize("message, stepped, recurs", [
    ("ModuleNotFoundError: No module named 'x' (train.py:1)", False, True),
    ("SyntaxError: invalid syntax (train.py:3)", False, True),
    ("NameError: name 'x' is not defined", False, True),
    ("exitcode 2", False, True),
    ("ModuleNotFoundError: No module named 'x'", True, False),  # after a step: maybe data
    ("RuntimeError: CUDA error: an illegal memory access", False, False),
    ("torch.OutOfMemoryError: CUDA out of memory", False, False),
    ("exitcode -9", False, False),
])
def test_the_recurrence_rule(message, stepped, recurs):
    ended = {0: {"failures": []}, 1: {"failures": [{"message": message}]}}
    why = will_recur(ended, stepped)
    assert bool(why) is recurs, why
    if recurs:
        assert why.startswith("node 1 ")


def test_gang_messages_are_checked_like_every_control_line():
    with pytest.raises(ProtocolError):
        decode(encode({"event": "gang-start", "attempt": "1", "master_port": 1}))
    with pytest.raises(ProtocolError):
        decode(encode({"event": "gang-stop", "attempt": 0, "reason": "x"}))
    assert decode(encode({"event": "gang-ended", "attempt": 0, "exit": {}}))["exit"] == {}


def test_follow_streams_from_the_last_lines(tmp_path):
    with open(tmp_path / "f", "wb") as fh:
        fh.write(b"a\nb\nc\nd\n")
    with open(tmp_path / "f", "rb") as fh:
        assert daemon.offset_of_last_lines(fh, 2) == 4
        assert daemon.offset_of_last_lines(fh, 0) == 8
        assert daemon.offset_of_last_lines(fh, 10) == 0


def _plan(nnodes: int):
    from orchestrator.plan.model import Entrypoint, NodePlan, RunPlan

    nodes = tuple(NodePlan(k, f"h{k}", "python3", None, k, 1, f"/r/{k}", {}, ())
                  for k in range(nnodes))
    return RunPlan("r", "r", "ssh", nnodes, "h0", 29500, "cpu", "x", None,
                   Entrypoint(None, "x.py", ()), nodes, ())


def test_the_recorded_attempts_read_back_as_outcomes():
    recorded = [{"attempt": 0, "master_port": 1, "state": "failed", "restart": "",
                 "no_restart": "node 0 failed with ImportError before the first step",
                 "nodes": {"0": {"code": 1, "reason": "torchrun exited", "failures": [
                     {"local_rank": 0, "message": "ImportError: x", "timestamp": 1.0,
                      "error_file": None}], "last_lines": []},
                     "1": {"lost": "the link closed"}}}]
    ((attempt, nodes),) = attempt_outcomes(_plan(2), recorded)
    assert attempt.note.startswith("no restart: node 0 failed with ImportError")
    assert nodes[1].state is NodeState.LOST and "the link closed" in nodes[1].reason
    assert attempt.root_cause.node_rank == 0
    assert json.loads(json.dumps(attempt.to_dict()))["root_cause"]["node_rank"] == 0


@pytest.mark.live  # real daemons; about 12 s: the link timeout is the point
def test_a_frozen_keeper_is_given_up_on_after_the_link_timeout(tmp_path):
    """SIGSTOP: the keeper's socket stays open (no FIN, no RST), so only the
    missing heartbeats tell; once thawed, it finds its head gone and stops."""
    specs = keeper_specs(tmp_path, 3, env={"SLEEP": "60"})
    replies = start_all(specs)
    time.sleep(1.5)
    os.kill(replies[2]["pid"], signal.SIGSTOP)
    began = time.monotonic()
    try:
        wait_ended(specs[:2], timeout=peers.GANG_TIMEOUT_S + 10)
        took = time.monotonic() - began
        assert peers.GANG_TIMEOUT_S - 1 < took < peers.GANG_TIMEOUT_S + 8, took
    finally:
        os.kill(replies[2]["pid"], signal.SIGCONT)
    (thawed,) = wait_ended(specs[2:], timeout=15)
    assert thawed["state"] in ("failed", "interrupted")
    attempt = daemon.state(specs[0]["supervisor"]["run_dir"])["keeper"]["attempts"][0]
    assert attempt["nodes"]["2"]["lost"] == f"nothing on the link for {peers.GANG_TIMEOUT_S:g}s"
