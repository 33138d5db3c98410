"""The keepers of a kept run (agent/kept/keeper.py, peers.py, daemon.py, restarts.py),
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

from orchestrator.agent.kept import daemon, mailbox, peers
from orchestrator.agent.wire.protocol import encode
from orchestrator.engine.keptgang import attempt_outcomes
from orchestrator.records.outcome import NodeState, RunState
from procscan import worker_pids
from keepers import keeper_specs, wait_until, _plan

# A node's "torchrun": says its attempt, starts a "worker" (a child, as
# torchrun does once every node has joined; not on the node:attempt pairs in
# NO_WORKERS), and exits after 0.5 s with the code the test asks for on that
# node and attempt (CODES="node:attempt:code,..."), saying when (the half
# second lets every node say its line before the gang is stopped), or with 0
# after SLEEP seconds. UNKILLABLE="node:attempt,..." adds a worker that
# ignores SIGTERM and lives until the test creates RELEASE_FILE, then writes
# the time to GONE_FILE (tests make SIGKILL miss it).


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
            state = mailbox.state(run_dir)
            if state.get("keeper") and state["keeper"]["state"] != "running" \
                    and not state["alive"]:
                states.append(state["keeper"])
                break
            assert time.monotonic() < deadline, f"{run_dir}: {state}"
            time.sleep(0.05)
    return states


def stream(spec: dict) -> str:
    with open(os.path.join(spec["supervisor"]["run_dir"], "agent.out"), encoding="utf-8") as fh:
        return fh.read()


def said_at(spec: dict, k: int, attempt: int, what: str = "port") -> float:
    """When node ``k``'s "torchrun" of ``attempt`` said its line (its own
    clock): its start (``port``), or its exit (``exits``)."""
    line = next(line for line in stream(spec).splitlines()
                if line.startswith(f"node {k} attempt {attempt} {what} "))
    return float(line.rsplit(" at ", 1)[1])


def wait_running(specs: list[dict], attempt: int = 0) -> None:
    """Every node's "torchrun" of ``attempt`` has said its line: the gang
    has formed and the attempt runs everywhere."""
    for k, spec in enumerate(specs):
        wait_until(lambda: f"node {k} attempt {attempt} port" in stream(spec),
                   f"node {k} runs attempt {attempt}")


def teardown(spec: dict) -> dict:
    """The node's supervisor record of its last attempt, with its teardown."""
    with open(os.path.join(spec["supervisor"]["run_dir"], "supervisor.json"),
              encoding="utf-8") as fh:
        return json.load(fh)


AT_ONCE_S = 3.0  # "at once" on a loaded 2-core machine: well under any timeout


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
    # README: the grace period (2 s here), a backoff (1 s before the first
    # restart), then the new attempt: by each node's own line of attempt 1,
    # from node 2's failure (the line its attempt 0 says as it exits)
    failed_at = said_at(specs[2], 2, 0, "exits")
    for k, spec in enumerate(specs):
        waited = said_at(spec, k, 1) - failed_at
        assert 1.0 <= waited < 1.0 + 2 + AT_ONCE_S, (k, waited)
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
    """The kernel closes a SIGKILLed keeper's link: node 0 loses it at once,
    not after the link timeout (10 s) it would otherwise fall back to, and
    every other node is torn down a grace period (2 s here) later. Measured
    on the records: node 0's loss and each supervisor's teardown."""
    specs = keeper_specs(tmp_path, 3, env={"SLEEP": "60"})
    replies = start_all(specs)
    wait_running(specs)
    killed_at = time.time()
    os.kill(replies[1]["pid"], signal.SIGKILL)
    states = wait_ended([specs[0], specs[2]], timeout=20)
    attempt = states[0]["attempts"][0]
    lost = attempt["nodes"]["1"]
    # Stopped because node 1's link closed, not after the heartbeat timeout
    # ("nothing on the link for 10s"): the reason, and a bound well under it.
    assert lost["lost"] == "the link closed", lost
    assert attempt["stop_reason"] == "lost node 1 (the link closed)"
    print(f"a killed keeper: lost {lost['lost_at'] - killed_at:.2f}s after the kill")
    assert lost["lost_at"] - killed_at < AT_ONCE_S < peers.GANG_TIMEOUT_S, lost
    grace = specs[0]["supervisor"]["grace_s"]
    for spec in (specs[0], specs[2]):
        record = teardown(spec)
        assert "lost node 1 (the link closed)" in record["reason"], record
        assert record["torn_down_at"] - killed_at < AT_ONCE_S + grace, record
    assert attempt["nodes"]["2"]["stop_asked"] and attempt["state"] == "failed"
    run, _ = attempt_outcomes(_plan(3), states[0]["attempts"])[0]
    assert (run.root_cause.node_rank, run.root_cause.reason) == \
        (1, "its keeper could not be heard: the link closed")


@pytest.mark.live  # real daemons: seconds each
def test_signalling_a_keeper_stops_the_gang_for_good(tmp_path):
    specs = keeper_specs(tmp_path, 2, restarts=3, env={"SLEEP": "60"})
    start_all(specs)
    wait_running(specs)
    assert mailbox.signal_keeper(specs[1]["supervisor"]["run_dir"]) is not None  # `down`
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
            assert secret not in text, name
        assert "********" in stream(spec)  # the line with the secret was said, masked


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


@pytest.mark.live  # real daemons; about 12 s: the link timeout is the point
def test_a_frozen_keeper_is_given_up_on_after_the_link_timeout(tmp_path):
    """SIGSTOP: the keeper's socket stays open (no FIN, no RST), so only the
    missing heartbeats tell; once thawed, it finds its head gone and stops.

    The silence counts from the last heartbeat heard, which came up to a
    heartbeat period before the freeze: measured on node 0's record of the
    loss (when it last heard node 2, when it gave up), not on the clock
    around it."""
    specs = keeper_specs(tmp_path, 3, env={"SLEEP": "60"})
    replies = start_all(specs)
    wait_running(specs)
    frozen_at = time.time()
    os.kill(replies[2]["pid"], signal.SIGSTOP)
    try:
        wait_ended(specs[:2], timeout=peers.GANG_TIMEOUT_S + 20)
    finally:
        os.kill(replies[2]["pid"], signal.SIGCONT)
    (thawed,) = wait_ended(specs[2:], timeout=15)
    assert thawed["state"] in ("failed", "interrupted")
    attempt = mailbox.state(specs[0]["supervisor"]["run_dir"])["keeper"]["attempts"][0]
    lost = attempt["nodes"]["2"]
    assert lost["lost"] == "nothing on the link for 10s", lost
    silence = lost["lost_at"] - lost["heard_at"]
    print(f"a frozen keeper: lost {lost['lost_at'] - frozen_at:.2f}s after the freeze, "
          f"{silence:.2f}s after it was last heard")
    # README: 10 s without a heartbeat, and a heartbeat every 2 s: the last
    # thing heard came at most a period (and a margin) before the freeze
    assert 10 - 0.1 <= silence < 10 + 2, lost
    assert -0.5 < frozen_at - lost["heard_at"] < 2 + 1.5, (frozen_at, lost)
    record = teardown(specs[0])  # node 0 stopped on the loss, a grace period at most
    assert record["torn_down_at"] - lost["lost_at"] < AT_ONCE_S + specs[0]["supervisor"][
        "grace_s"], record


# -- the gang port (issue 19, item 2) -------------------------------------------

def fds(pid: int) -> list[str]:
    out = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            pass
    return out


def refused(addr: str, port: int) -> bool:
    try:
        socket.create_connection((addr, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.live  # real daemons: seconds each
def test_the_gang_port_listens_on_the_master_address_caps_a_flood_and_closes_once_joined(
        tmp_path):
    specs = keeper_specs(tmp_path, 3, env={"SLEEP": "4"})
    head = daemon.start(specs[0], listen=True)
    port = head["gang_port"]
    assert refused("127.0.0.2", port)  # not every interface: only 127.0.0.1, the gang's addr
    flood = []
    for i in range(300):  # idle connections, and garbage that would crash a parser
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 10 == 0:
            sock.sendall(b"::ddp-orch:: " + b"[" * 4000 + b"\n")
        flood.append(sock)

    def held() -> list[str]:
        return [f for f in fds(head["pid"]) if f.startswith("socket:")]

    # the port, the cap, a wake-up pair: the gate closes what is over the cap
    wait_until(lambda: len(held()) <= 16 + 3, f"the flood capped: {held()}",  # README: 16
               timeout=10)
    for spec in specs[1:]:  # the real nodes still join, behind the flood
        spec["gang"]["port"] = port
        daemon.start(spec, listen=False)
    deadline = time.monotonic() + 15
    while "node 2 attempt 0" not in stream(specs[2]):
        assert time.monotonic() < deadline, stream(specs[0])
        time.sleep(0.1)
    # every node has joined: no port any more
    wait_until(lambda: refused("127.0.0.1", port), "the gang port closed", timeout=5)
    states = wait_ended(specs)
    for sock in flood:
        sock.close()
    assert [s["state"] for s in states] == ["succeeded"] * 3
    assert "Traceback" not in stream(specs[0])


@pytest.mark.live  # real daemons: seconds each
def test_a_run_of_one_node_opens_no_gang_port(tmp_path):
    (spec,) = keeper_specs(tmp_path, 1, env={"SLEEP": "2"})
    head = daemon.start(spec, listen=True)
    assert head["ok"] and head["gang_port"] is None
    wait_running([spec])  # past the joining, where node 0 would listen
    assert not [f for f in fds(head["pid"]) if f.startswith("socket:")]
    assert [s["state"] for s in wait_ended([spec])] == ["succeeded"]


def fake_node(port: int, token: str, node_rank: int) -> socket.socket:
    """A node of the gang played by the test: it says its hello, and reads
    until the head starts attempt 0."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(encode({"event": "gang-hello", "node_rank": node_rank, "token": token}))
    data = b""
    while b"gang-start" not in data:
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    return sock


@pytest.mark.live  # real daemons: seconds each
def test_a_malformed_line_on_a_link_is_that_node_lost_not_a_dead_reader(tmp_path):
    specs = keeper_specs(tmp_path, 2, env={"SLEEP": "60"})
    head = daemon.start(specs[0], listen=True)
    with fake_node(head["gang_port"], specs[0]["gang"]["token"], 1) as sock:
        sock.sendall(b"::ddp-orch:: " + b"[" * 4000 + b"\n")
        (state,) = wait_ended(specs[:1], timeout=20)
    assert state["state"] == "failed"
    lost = state["attempts"][0]["nodes"]["1"]["lost"]
    assert lost.startswith("a malformed message"), lost
    assert "Traceback" not in stream(specs[0])


# -- records that fit their lines (item 4) ------------------------------------------


# -- an attached kept run watches its follower (item 5) ------------------------------

FOLLOWER = ("import sys; from orchestrator.agent.kept import daemon; "
            "from orchestrator.agent.wire.protocol import Reader; "
            "daemon.follow(sys.argv[1], Reader(0), attached=True)")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.live  # real daemons and followers: seconds each
def test_an_attached_kept_run_stops_when_its_follower_is_killed(tmp_path):
    import subprocess

    specs = keeper_specs(tmp_path, 2, restarts=2, env={"SLEEP": "60"})
    for spec in specs:
        spec["supervisor"]["owner"] = {"holder": "keepers", "detached": False}
        spec["start_timeout_s"] = 8  # a keeper that never saw its follower stops then
    start_all(specs)
    followers = [subprocess.Popen([sys.executable, "-c", FOLLOWER, spec["supervisor"]["run_dir"]],
                                  cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
                 for spec in specs]
    try:
        deadline = time.monotonic() + 10
        while not all(mailbox.follower_present(s["supervisor"]["run_dir"]) for s in specs):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        for spec in specs:  # each keeper has seen its follower (it looks every second)
            wait_until(lambda: mailbox.state(spec["supervisor"]["run_dir"])["keeper"].get(
                "followed"), "the keeper saw its follower", timeout=10)
        killed_at = time.time()
        for follower in followers:  # kill -9: nobody tells the keepers anything
            follower.kill()
            follower.wait()
        states = wait_ended(specs, timeout=20)
    finally:
        for follower in followers:
            follower.kill()
    assert [s["state"] for s in states] == ["interrupted", "interrupted"]
    assert len(states[0]["attempts"]) == 1  # and no restart
    said = stream(specs[0]) + stream(specs[1])
    assert "the controller's follower on node" in said, said  # not "no controller followed"
    # README: within 1 s (and a margin), not the start timeout (8 s); then
    # the grace period
    grace = specs[0]["supervisor"]["grace_s"]
    for spec in specs:
        record = teardown(spec)
        assert record["stopped_at"] - killed_at < 1 + 1.5, record
        assert record["torn_down_at"] - killed_at < 1 + 1.5 + grace, record


SMALL_PEER_TIMEOUT = ("import sys; from orchestrator.agent.kept import daemon; "
                      "from orchestrator.agent.wire.protocol import Reader; "
                      "daemon.PEER_TIMEOUT_S = float(sys.argv[2]); "
                      "daemon.follow(sys.argv[1], Reader(0), attached=True)")


@pytest.mark.live  # a real daemon and follower: about 12 s
def test_pings_keep_a_follower_past_the_peer_timeout_and_their_silence_ends_the_run(tmp_path):
    """The controller's pings keep an attached run's follower content past
    the peer timeout (made 3 s here, from the README's 30 s, so that three
    of them fit in 9 s); once the pings stop, the follower gives up after
    the timeout and about a second, and stops its keeper."""
    import subprocess

    from orchestrator.agent.wire.protocol import Control

    timeout = 3.0
    specs = keeper_specs(tmp_path, 1, env={"SLEEP": "60"})
    assert daemon.start(specs[0], listen=False)["ok"]  # one node: no gang port
    run_dir = specs[0]["supervisor"]["run_dir"]
    follower = subprocess.Popen([sys.executable, "-c", SMALL_PEER_TIMEOUT, run_dir, str(timeout)],
                                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: mailbox.follower_present(run_dir), "the follower follows")
        pinged_until = time.monotonic() + 3 * timeout
        while time.monotonic() < pinged_until:  # a ping a second, as a controller's
            follower.stdin.write(Control.PING.encode())
            follower.stdin.flush()
            last_ping = time.monotonic()
            time.sleep(1.0)
            assert follower.poll() is None, "the follower gave up while pings flowed"
        assert mailbox.state(run_dir)["alive"]
        follower.wait(timeout=timeout + 1 + AT_ONCE_S)
        gave_up_s = time.monotonic() - last_ping
        (state,) = wait_ended(specs, timeout=20)
    finally:
        follower.kill()
    assert timeout <= gave_up_s <= timeout + 1 + AT_ONCE_S, gave_up_s
    assert state["state"] == "interrupted"


# -- restarts and what would not die (item 7) ---------------------------------------

def _sigkill_misses_the_unkillable(monkeypatch):
    """SIGKILL does not end a process in uninterruptible sleep (a GPU driver
    still releasing it, a hung file system): here, the keepers' SIGKILL
    skips the worker named ``unkillable-rank`` (the keepers are forked from
    this process, so they inherit the patch); it ignores SIGTERM itself."""
    from orchestrator.agent.node import procs

    real = procs.signal_all

    def signal_all(pids, sig, still_ours=None):
        if sig == signal.SIGKILL:
            pids = {p for p in pids if "unkillable-rank" not in procs.command_line(p)}
        real(pids, sig, still_ours)

    monkeypatch.setattr(procs, "signal_all", signal_all)


@pytest.mark.live  # real daemons: about 10 s
def test_a_restart_waits_until_what_would_not_die_is_gone(tmp_path, monkeypatch):
    """The survivor lives until the test lets it go, once node 1 says it is
    waiting for it: attempt 1 must start after it is gone, never beside it."""
    _sigkill_misses_the_unkillable(monkeypatch)
    gone_file, release = tmp_path / "gone", tmp_path / "release"
    specs = keeper_specs(tmp_path, 2, restarts=1, env={
        "CODES": "1:0:3", "UNKILLABLE": "1:0", "GONE_FILE": str(gone_file),
        "RELEASE_FILE": str(release), "SLEEP": "0.5"})
    start_all(specs)
    try:
        wait_until(lambda: "would not die; waiting" in stream(specs[1]),
                   "node 1 waiting for its survivor", timeout=30)
    finally:
        release.touch()
    states = wait_ended(specs, timeout=40)
    assert [s["state"] for s in states] == ["succeeded", "succeeded"]
    gone_at = float(gone_file.read_text())
    started = said_at(specs[1], 1, 1)
    assert started > gone_at  # not on top of the survivor
    attempts = states[0]["attempts"]
    assert attempts[0]["restart"] == "restarting"
    assert attempts[0]["nodes"]["1"].get("survivors_gone") is True  # there were some


@pytest.mark.live  # real daemons: about 10 s
def test_no_restart_on_top_of_what_would_not_die(tmp_path, monkeypatch):
    from orchestrator.agent.kept import keeper

    _sigkill_misses_the_unkillable(monkeypatch)
    monkeypatch.setattr(keeper, "SURVIVOR_WAIT_S", 2.0)
    specs = keeper_specs(tmp_path, 2, restarts=2, env={
        "CODES": "1:0:3", "UNKILLABLE": "1:0", "GONE_FILE": str(tmp_path / "gone"),
        "RELEASE_FILE": str(tmp_path / "release"), "SLEEP": "0.5"})
    start_all(specs)
    try:
        states = wait_ended(specs, timeout=30)
    finally:
        (tmp_path / "release").touch()
        for pid in worker_pids(specs[0]["supervisor"]["run_id"]):
            os.kill(pid, signal.SIGKILL)
    assert [s["state"] for s in states] == ["failed", "failed"]
    (attempt,) = states[0]["attempts"]
    assert attempt["restart"] == ""
    assert attempt["no_restart"].startswith("node 1: 1 process(es) of the attempt would not die")
    assert "unkillable-rank" in attempt["no_restart"]
    outcome = attempt_outcomes(_plan(2), states[0]["attempts"])[0][0]
    assert outcome.note.startswith("no restart: node 1: 1 process(es)")


# -- every attempt has a start timeout; a node lost between attempts (item 8) ----------

@pytest.mark.live  # real daemons: about 10 s
def test_a_later_attempt_that_never_starts_is_stopped_by_the_start_timeout(tmp_path):
    specs = keeper_specs(tmp_path, 2, restarts=1, env={
        "CODES": "1:0:3", "NO_WORKERS": "0:1,1:1", "SLEEP": "60"})
    for spec in specs:
        spec["start_timeout_s"] = 5
    start_all(specs)
    states = wait_ended(specs, timeout=25)
    assert [s["state"] for s in states] == ["failed", "failed"]
    attempts = states[0]["attempts"]
    assert len(attempts) == 2
    assert attempts[1]["stop_reason"].startswith("attempt 1 did not start within 5s")
    for spec in specs:  # README: the start timeout, counted on every attempt
        record = teardown(spec)  # attempt 1's: it started, then was stopped
        assert "did not start within 5s" in record["reason"], record
        assert 5 - 0.1 <= record["stopped_at"] - record["started"] < 5 + 1 + AT_ONCE_S, record


@pytest.mark.live  # real daemons: about 8 s
def test_a_node_lost_between_attempts_ends_the_run_without_starting_the_next(
        tmp_path, monkeypatch):
    from orchestrator.agent.kept import head

    monkeypatch.setattr(head, "restart_backoff", lambda n: 5.0)  # a window to lose it in
    specs = keeper_specs(tmp_path, 3, restarts=1, env={"CODES": "1:0:3", "SLEEP": "60"})
    replies = start_all(specs)
    deadline = time.monotonic() + 20
    while "restarting the whole gang in" not in stream(specs[0]):
        assert time.monotonic() < deadline, stream(specs[0])
        time.sleep(0.05)
    killed_at = time.time()
    os.kill(replies[2]["pid"], signal.SIGKILL)  # after the decision, before the restart
    states = wait_ended(specs[:2], timeout=15)
    # at once, by node 0's own record of the end: not after the 5 s backoff
    assert states[0]["updated"] - killed_at < AT_ONCE_S < 5.0, states[0]
    assert [s["state"] for s in states] == ["failed", "failed"]
    (attempt,) = states[0]["attempts"]  # attempt 1 never started
    assert attempt["restart"] == "" and "lost before the restart" in attempt["no_restart"]
    assert "node 0 attempt 1" not in stream(specs[0])


# -- file descriptors and symlinks (item 10) ----------------------------------------

SUPERVISE_THRICE = """
import json, os, sys
from orchestrator.agent.node.supervisor import Supervisor
spec = json.loads(sys.argv[1])
counts = []
for i in range(4):
    Supervisor(dict(spec)).run()
    counts.append(len(os.listdir("/proc/self/fd")))
print("FDS", json.dumps(counts))
"""


@pytest.mark.live  # real supervisors: a few seconds
def test_a_supervisor_leaves_no_file_descriptor_behind(tmp_path):
    import subprocess

    spec = keeper_specs(tmp_path, 1)[0]["supervisor"]
    spec.update(argv=[sys.executable, "-c", "pass"],
                owner={"holder": "keepers", "detached": False})
    ran = subprocess.run([sys.executable, "-c", SUPERVISE_THRICE, json.dumps(spec)], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    counts = json.loads(ran.stdout.rsplit("FDS ", 1)[1])
    assert counts[1:] == counts[:1] * 3, counts  # one run per attempt: none grows


@pytest.mark.live  # real daemons: seconds each
def test_the_keeper_writes_through_no_symlink(tmp_path):
    (spec,) = keeper_specs(tmp_path, 1, env={"SLEEP": "0.2"})
    run_dir = spec["supervisor"]["run_dir"]
    os.makedirs(run_dir)
    target = tmp_path / "target"
    target.write_text("mine\n")
    for name in ("keeper.json", "supervisor.json"):  # written beside, then renamed over
        os.symlink(target, os.path.join(run_dir, name))
    daemon.start(spec, listen=True)
    wait_ended([spec])
    assert target.read_text() == "mine\n"
    assert not os.path.islink(os.path.join(run_dir, "keeper.json"))
    assert not os.path.islink(os.path.join(run_dir, "supervisor.json"))
    (other,) = keeper_specs(tmp_path / "b", 1, env={"SLEEP": "0.2"})
    os.makedirs(other["supervisor"]["run_dir"])
    os.symlink(target, os.path.join(other["supervisor"]["run_dir"], "agent.out"))
    reply = daemon.start(other, listen=True)
    assert not reply["ok"]  # refused, not written through
    assert target.read_text() == "mine\n"
