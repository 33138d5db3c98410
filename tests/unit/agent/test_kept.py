"""Unit tests of agent/kept/ (keeper, daemon, peers, restarts): attempt specs,
the recurrence rule, gang messages, attempt records, following a stream, the
keeper's pid; no keeper is started."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest

from orchestrator.agent.kept import daemon, mailbox, peers
from orchestrator.agent.node import stream
from orchestrator.agent.kept.keeper import attempt_spec
from orchestrator.agent.kept.spec import KeeperSpec
from orchestrator.agent.node.spec import SupervisorSpec
from orchestrator.agent.wire.protocol import Event, ProtocolError, decode, encode, message
from orchestrator.agent.kept.restarts import will_recur
from orchestrator.engine.keptgang import attempt_outcomes
from orchestrator.records.outcome import NodeState, RunState
from fakes import FakeClock
from keepers import keeper_specs, wait_until, _plan


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
    spec = SupervisorSpec.from_dict(keeper_specs(__import__("pathlib").Path("/r"), 1)[0]["supervisor"])
    first = attempt_spec(spec, 0, 29500)
    assert first.argv == spec.argv and first.env["DDP_ORCH_RESTART_COUNT"] == "0"
    later = attempt_spec(spec, 2, 41000)
    assert later.argv[-3:] == ("41000", "--log-dir", "/r/node-0/torchrun.attempt-2")
    assert later.log_dir == "/r/node-0/torchrun.attempt-2"
    assert later.env["DDP_ORCH_RESTART_COUNT"] == "2" and later.master_port == 41000
    assert spec.env["DDP_ORCH_RESTART_COUNT"] == "0"  # the dry-run's spec is untouched


@pytest.mark.parametrize("message, stepped, recurs", [
    ("ModuleNotFoundError: No module named 'x' (train.py:1)", False, True),
    ("SyntaxError: invalid syntax (train.py:3)", False, True),
    ("NameError: name 'x' is not defined", False, True),
    ("exitcode 2", False, True),
    ("exitcode 2: train.py: error: unrecognized arguments: --x", False, True),  # argparse
    ("exitcode 21: done", False, False),
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


def test_a_rank_that_exits_2_without_a_traceback_is_known_by_its_exit_code(tmp_path):
    """torchrun's summary of a rank without ``@record`` holds only a pointer to
    its docs; the failure is the exit code and the rank's last stderr line,
    which the recurrence rule reads as a usage error."""
    from orchestrator.agent.node import failures

    rank_dir = tmp_path / "torchrun" / "none_x" / "attempt_0" / "0"
    rank_dir.mkdir(parents=True)
    (rank_dir / "stderr.log").write_text(
        "[rank2]:usage: steps.py [-h] [--steps STEPS]\n"
        "[rank2]:steps.py: error: unrecognized arguments: --x 1\n")
    summary = ["Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-24_16:00:00",
               "  host      : node1", "  rank      : 2 (local_rank: 0)",
               "  exitcode  : 2 (pid: 123)", "  error_file: <N/A>",
               "  traceback : To enable traceback see: "
               "https://pytorch.org/docs/stable/elastic/errors.html"]
    (found,) = failures.collect(str(tmp_path), summary)
    assert found["message"] == "exitcode 2: steps.py: error: unrecognized arguments: --x 1"
    assert will_recur({1: {"failures": [found]}}, stepped=False).startswith(
        "node 1 exited with a usage error (exit 2) before the first step")


def test_gang_messages_are_checked_like_every_control_line():
    with pytest.raises(ProtocolError):
        decode(encode({"event": "gang-start", "attempt": "1", "master_port": 1}))
    with pytest.raises(ProtocolError):
        decode(encode({"event": "gang-stop", "attempt": 0, "reason": "x"}))
    assert decode(encode({"event": "gang-ended", "attempt": 0, "exit": {}}))["exit"] == {}


def test_a_zombie_keeper_is_not_counted_as_running(tmp_path):
    """A keeper that has exited but is not reaped yet (its reaper, a
    container's pid 1 say, is late or never does) has ended: a zombie keeps
    its pid and start time, and must not count as the run's keeper."""
    import subprocess

    from orchestrator.agent.node.procs import start_time

    process = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "keeper.json").write_text(json.dumps(
            {"pid": process.pid, "start_time": start_time(process.pid), "state": "running"}))
        assert mailbox.keeper_pid(str(tmp_path)) == process.pid
        os.kill(process.pid, signal.SIGKILL)  # not reaped: a zombie until we wait
        wait_until(lambda: open(f"/proc/{process.pid}/stat").read().rsplit(")", 1)[1].split()[0]
                   == "Z", "the keeper is a zombie", timeout=5)
        assert mailbox.keeper_pid(str(tmp_path)) is None
        assert mailbox.state(str(tmp_path))["alive"] is False
    finally:
        process.kill()
        process.wait()


def test_follow_streams_from_the_last_lines(tmp_path):
    with open(tmp_path / "f", "wb") as fh:
        fh.write(b"a\nb\nc\nd\n")
    with open(tmp_path / "f", "rb") as fh:
        assert stream.offset_of_last_lines(fh, 2) == 4
        assert stream.offset_of_last_lines(fh, 0) == 8
        assert stream.offset_of_last_lines(fh, 10) == 0


def test_the_gang_port_takes_the_master_address_or_says_why_not():
    sock, note = peers.listener("127.0.0.1", avoid=None)
    with sock:
        assert sock.getsockname()[0] == "127.0.0.1" and note == ""
    sock, note = peers.listener("localhost", avoid=None)
    with sock:
        assert ipaddress_is_loopback(sock.getsockname()[0]) and note == ""
    sock, note = peers.listener("192.0.2.1", avoid=None)  # TEST-NET: not this host's
    with sock:
        assert sock.getsockname()[0] == "0.0.0.0"
        assert "every interface" in note and "192.0.2.1" in note


def ipaddress_is_loopback(addr: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(addr).is_loopback


def realistic_exit(k: int, attempt: int, own: bool) -> dict:
    """A failed node's exit event as a supervisor sends it: 8 ranks'
    failures with long, non-ASCII messages (JSON escapes them 6 bytes a
    character), long error file paths, torchrun's last lines, survivors."""
    text = "RuntimeError: CUDA error: an illegal memory access — ünïcödé 数据 " * 40
    return {"event": "exit", "code": 1 if own else 143,
            "reason": "torchrun exited" if own else "stopped by the gang: node 5 failed (exit 1)",
            "ended": "itself" if own else "stopped",
            "failures": [{"local_rank": r, "message": text + f" (train.py:{88 + r})",
                          "timestamp": 1.7e9 + attempt * 100 + (0 if own else 5) + r,
                          "error_file": f"/home/u/.ddp-orch/runs/r/node-{k}/" + "d" * 300}
                         for r in range(8)],
            "stopped_at": None if own else 1.7e9 + attempt * 100 + 1,
            "last_lines": [f"[rank{r}]: " + text for r in range(5)],
            "survivors": [], "duration_s": 12.5, "stepped": True}


def test_attempt_records_of_128_nodes_by_10_attempts_fit_one_control_line(tmp_path):
    from orchestrator.agent.kept.attempts import compact
    from orchestrator.agent.kept.head import Head
    from orchestrator.agent.wire.protocol import MAX_CONTROL_LINE

    nnodes, attempts = 128, 10
    spec = keeper_specs(tmp_path, nnodes)[0]
    os.makedirs(spec["supervisor"]["run_dir"])
    keeper = Head(KeeperSpec.from_dict(spec))
    for a in range(attempts):
        # every node is asked to stop, node 5 too (its torchrun failed first)
        nodes = {str(k): {**compact(realistic_exit(k, a, k == 5)), "stop_asked": True}
                 for k in range(nnodes)}
        keeper.attempts.append({
            "attempt": a, "master_port": 40000 + a, "stop_reason": "node 5 failed (exit 1)",
            "nodes": nodes, "state": "failed",
            "restart": "restarting" if a < attempts - 1 else "", "no_restart": ""})
        keeper._compact_old_attempts()
    # keeper.json, and the `keeper` reply that carries it (status, ps)
    keeper.write_state("failed", 1)
    reply = encode({"event": "reply", **mailbox.state(spec["supervisor"]["run_dir"])})
    assert len(reply) < MAX_CONTROL_LINE, len(reply)
    recorded = decode(reply)["keeper"]["attempts"]
    # the `finished` line (attach)
    line = encode(keeper.masked(keeper.finished_message(1, "failed")))
    assert len(line) < MAX_CONTROL_LINE, len(line)
    finished = decode(line)
    for kept in (recorded, finished["attempts"]):
        assert [a["attempt"] for a in kept] == list(range(attempts))
        outcomes = attempt_outcomes(_plan(nnodes), kept)
        for attempt, nodes in outcomes:
            assert attempt.state is RunState.FAILED and attempt.root_cause.node_rank == 5
            assert "RuntimeError: CUDA error" in attempt.root_cause.reason
        last_nodes = outcomes[-1][1]  # the last attempt keeps every node
        assert {n.state for n in last_nodes} == {NodeState.FAILED, NodeState.STOPPED}


def test_a_very_long_run_drops_its_oldest_attempts_first():
    from orchestrator.agent.kept.attempts import fit_attempts

    records = [{"attempt": a, "master_port": a, "state": "failed", "stop_reason": "x" * 400,
                "nodes": {"0": {"code": 1, "reason": "torchrun exited", "ended": "itself", "failures": []}}}
               for a in range(5000)]
    kept, omitted = fit_attempts(records, budget=100_000)
    assert len(json.dumps(kept, separators=(",", ":"))) <= 100_000
    assert omitted == 5000 - len(kept) and kept[-1]["attempt"] == 4999
    assert [a["attempt"] for a in kept] == list(range(omitted, 5000))


def test_the_restart_backoff_is_short_and_bounded():
    from orchestrator.agent.kept.head import restart_backoff

    assert [restart_backoff(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [1, 2, 4, 8, 16, 30, 30]


def test_the_last_n_lines_are_the_programs_not_the_agents_control_lines(tmp_path):
    path = tmp_path / "agent.out"
    beat = encode({"event": "heartbeat", "progress": {}})
    path.write_bytes(b"one\ntwo\n" + beat + b"three\n" + beat + beat + b"four\n"
                       + encode({"event": "exit", "code": 0, "reason": "torchrun exited", "ended": "itself",
                                 "failures": [], "last_lines": [], "duration_s": 1.0})
                       + encode({"event": "finished", "code": 0, "state": "succeeded"}))
    with open(path, "rb") as fh:
        data = path.read_bytes()
        shown = data[stream.offset_of_last_lines(fh, 2):]
        assert [line for line in shown.splitlines() if not line.startswith(b"::")] == \
            [b"three", b"four"]
        assert shown.startswith(b"three\n")
        assert stream.offset_of_last_lines(fh, 0) == len(data)
        assert stream.offset_of_last_lines(fh, 9) == 0


# -- a restart waits for what the last attempt left (fake clock) ---------------------------

SURVIVORS = [{"pid": 4242, "cmd": "python train.py --rank 1"}]


@pytest.fixture
def fake_keeper(tmp_path, monkeypatch):
    """Node 1's keeper (nothing started), its module on a fake clock, and the
    processes the last attempt left there: present until ``gone_at[0]``."""
    from orchestrator.agent.kept import keeper as keeper_module
    from orchestrator.agent.kept.member import Member

    clock = FakeClock()
    gone_at = [float("inf")]
    monkeypatch.setattr(keeper_module, "time", clock)
    monkeypatch.setattr(keeper_module, "_still_there",
                        lambda survivor: survivor["pid"] == 4242 and clock.now < gone_at[0])
    keeper = daemon.keeper_for(KeeperSpec.from_dict(keeper_specs(tmp_path, 2)[1]))
    assert type(keeper) is Member
    return keeper, clock, gone_at


def a_head(tmp_path):
    """Node 0's keeper of two nodes (nothing started): what decides a restart."""
    from orchestrator.agent.kept.head import Head

    head = daemon.keeper_for(KeeperSpec.from_dict(keeper_specs(tmp_path, 2)[0]))
    assert type(head) is Head
    return head


class LeftOver:
    """A supervisor whose attempt ended with processes that would not die."""

    def __init__(self, spec=None, holdings=None):
        import threading

        self.spec = spec
        self.exited = threading.Event()
        self.exited.set()
        self.workers_started = False
        self.last_exit = {"code": 1, "reason": "torchrun exited", "ended": "itself", "failures": [],
                          "last_lines": [], "duration_s": 3.0, "survivors": list(SURVIVORS)}

    def run(self) -> None:
        pass

    def progress(self) -> dict:
        return {}


def test_the_keeper_waits_for_survivors_until_they_are_gone(fake_keeper):
    from orchestrator.agent.kept.keeper import SURVIVOR_WAIT_S

    keeper, clock, gone_at = fake_keeper
    gone_at[0] = 12.0
    sup = LeftOver()
    keeper._await_survivors(sup)
    assert 12.0 <= clock.now <= 12.5 < SURVIVOR_WAIT_S  # waited, and no longer than needed
    assert sup.last_exit["survivors"] == [] and sup.last_exit["survivors_gone"] is True


def test_the_keeper_waits_survivor_wait_s_for_survivors_that_stay_and_reports_them(fake_keeper,
                                                                                  tmp_path):
    from orchestrator.agent.kept.keeper import SURVIVOR_WAIT_S

    keeper, clock, _gone_at = fake_keeper
    sup = LeftOver()
    keeper._await_survivors(sup)
    assert SURVIVOR_WAIT_S <= clock.now <= SURVIVOR_WAIT_S + 0.5
    assert sup.last_exit["survivors"] == SURVIVORS and "survivors_gone" not in sup.last_exit
    # so the head does not restart on top of them
    assert a_head(tmp_path)._why_no_restart({0: {"failures": []}, 1: sup.last_exit}) == (
        "node 1: 1 process(es) of the attempt would not die (pid 4242 (python train.py "
        "--rank 1)); a restart would start on top of them")


def test_an_attempt_reports_only_once_its_survivors_are_gone(fake_keeper, monkeypatch):
    """``run_attempt`` itself waits: the exit record it returns (what the
    head decides a restart on) is written after the survivors went."""
    from orchestrator.agent.kept import keeper as keeper_module

    keeper, clock, gone_at = fake_keeper
    gone_at[0] = 6.0
    monkeypatch.setattr(keeper_module, "Supervisor", LeftOver)
    event = keeper.run_attempt(0, 29500)
    assert clock.now >= 6.0
    assert event["survivors"] == [] and event["survivors_gone"] is True


def test_survivors_or_a_failed_setup_rule_out_a_restart_that_would_otherwise_come(tmp_path):
    keeper = a_head(tmp_path)
    transient = {"failures": [{"message": "RuntimeError: CUDA error: an illegal memory access",
                               "local_rank": 0, "timestamp": 1.0}], "stepped": True}
    assert keeper._why_no_restart({0: transient, 1: {"failures": []}}) == ""  # would restart
    assert keeper._why_no_restart({0: transient, 1: {"failures": [], "survivors": SURVIVORS}}) \
        .startswith("node 1: 1 process(es) of the attempt would not die (pid 4242 ")
    assert keeper._why_no_restart({0: {**transient, "survivors": []}, 1: {"failures": []}}) == ""
    assert keeper._why_no_restart({0: transient, 1: {"failures": [], "setup_failed": True}}) \
        .startswith("node 1's setup failed")


def test_the_head_decides_a_restart_only_once_every_surviving_node_has_ended(tmp_path,
                                                                             monkeypatch):
    """Node 0 (the head) of three: its own attempt ended, node 1's too; node
    2 still tears down. ``_await_ended`` (what ``Head.keep`` decides a restart on)
    must wait for node 2's end, not restart on top of it."""
    import threading

    from orchestrator.agent.kept import head as head_module

    monkeypatch.setattr(head_module, "time", FakeClock())
    head = head_module.Head(KeeperSpec.from_dict(keeper_specs(tmp_path, 3)[0]))
    stopped = {"code": 143, "reason": "got SIGTERM", "ended": "signal", "failures": []}
    head.ended = {1: stopped}
    late = {"code": 1, "reason": "torchrun exited", "ended": "itself", "failures": []}

    def node_2_reports() -> None:
        with head.lock:  # held by the head until it waits for the others
            while 0 not in head.ended:  # (the head notifies no one of its own end)
                head.lock.wait(0.01)
            head.ended.setdefault(2, late)
            head.lock.notify_all()

    reporter = threading.Thread(target=node_2_reports, daemon=True)
    reporter.start()
    ended = head._await_ended(0, {"code": 0, "reason": "torchrun exited", "ended": "itself", "failures": []})
    reporter.join(10)
    assert ended == {0: {"code": 0, "reason": "torchrun exited", "ended": "itself", "failures": []},
                     1: stopped, 2: late}


def test_who_stops_a_keeper_is_left_for_it_and_the_first_reason_stays(tmp_path):
    """A SIGTERM does not say who sent it (issue #32: "got SIGTERM" after
    `down`): its sender leaves its reason first; the first one explains the
    stop, and what the keeper reads is one printable line, capped."""
    run_dir = str(tmp_path)
    assert mailbox.stop_request(run_dir) == ""  # nobody said: the keeper names the signal
    mailbox.leave_stop_request(run_dir, mailbox.DOWN_REASON)
    mailbox.leave_stop_request(run_dir, daemon.SILENT_CONTROLLER)
    assert mailbox.stop_request(run_dir) == "stopped by `ddp-orch down`"
    os.unlink(tmp_path / "stop.request")
    mailbox.leave_stop_request(run_dir, "lost\x1b[2J the controller\nsecond line" + "x" * 500)
    read = mailbox.stop_request(run_dir)
    assert read.startswith("lost[2J the controller") and "second" not in read
    assert len(read) <= mailbox.STOP_REQUEST_MAX


def test_a_stop_request_is_never_written_or_read_through_a_symlink(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("planted reason")
    (tmp_path / "run").mkdir()
    os.symlink(target, tmp_path / "run" / "stop.request")
    mailbox.leave_stop_request(str(tmp_path / "run"), mailbox.DOWN_REASON)
    assert target.read_text() == "planted reason"
    assert mailbox.stop_request(str(tmp_path / "run")) == ""


def test_a_nodes_gang_progress_counts_ranks_with_samples_for_the_hang_rule(monkeypatch):
    """A node tells the head its ranks' [step, age] or [step, age, samples]
    (``_progress_of``: its heartbeats, with its output lines' times, keeping
    the samples); the head counts both as progress (``_progress_from``) and
    ignores any other entry."""
    import threading
    from types import SimpleNamespace

    from orchestrator.agent.kept import keeper
    from orchestrator.agent.kept.head import Head

    clock = FakeClock()
    monkeypatch.setattr(keeper.time, "time", clock.time)
    monkeypatch.setattr(keeper.time, "monotonic", clock.monotonic)
    clock.now = 100.0
    sup = SimpleNamespace(progress=lambda: {"0": [40, 5.0, 1280], "1": [40, 5.0]},
                          line_seen={0: clock.time() - 1.0, 2: clock.time() - 3.0})
    sent = keeper._progress_of(sup)
    assert sent == {"0": [40, 1.0, 1280], "1": [40, 5.0], "2": [None, 3.0]}
    head = SimpleNamespace(lock=threading.Lock(), current=0, reported={}, judged=[])
    head._judge = lambda: head.judged.append(1)
    Head._progress_from(head, 1, 0, True,
                        {**sent, "3": [40, 1.0, -1], "4": [40, 1.0, 1, 2]})
    assert head.reported == {1: (True, {0: 99.0, 1: 95.0, 2: 97.0})} and head.judged == [1]


def test_node_0_is_the_head_and_only_the_head_records_attempts(tmp_path):
    """``keeper_for``: node 0's keeper is the head, every other node's a
    member. Both write keeper.json (``status`` reads every node's); only the
    head's carries the attempts and their count, in the record and in the
    ``finished`` line."""
    from orchestrator.agent.kept.head import Head
    from orchestrator.agent.kept.member import Member

    specs = keeper_specs(tmp_path, 3)
    keepers = [daemon.keeper_for(KeeperSpec.from_dict(spec)) for spec in specs]
    assert [type(k) for k in keepers] == [Head, Member, Member]
    head = keepers[0]
    head.attempts.append({"attempt": 0, "master_port": 29500, "stop_reason": "", "state":
                          "failed", "restart": "restarting", "no_restart": "", "nodes": {}})
    for keeper, spec in zip(keepers, specs):
        os.makedirs(spec["supervisor"]["run_dir"])
        keeper.write_state("running")
    recorded = [mailbox.state(spec["supervisor"]["run_dir"])["keeper"] for spec in specs]
    assert [(r["node_rank"], r["attempt"], "attempts" in r) for r in recorded] == [
        (0, 1, True), (1, 0, False), (2, 0, False)]
    assert recorded[0]["attempts"][0]["master_port"] == 29500
    assert [sorted(k.finished_message(1, "failed")) for k in keepers] == [
        ["attempts", "code", "event", "state"]] + [["code", "event", "state"]] * 2


def test_a_send_to_a_peer_that_reads_nothing_never_waits():
    """Issue 43: the head sends while it holds its lock (a stop to every
    node), and a frozen peer's full window held it for the link's 10 s
    timeout per frozen link, with every verdict behind it. A send goes to
    the link's outbox and returns at once; a peer that never reads is lost
    by its own silence, not by holding the sender."""
    ours, frozen = socket.socketpair()
    with frozen:
        link = peers.Link(ours, lambda message: None, lambda why: None).start()
        big = message(Event.GANG_STOP, attempt=0, reason="x" * 60000, final=False)
        started = time.monotonic()
        for _ in range(40):  # far more than the kernel's buffers hold
            link.send(big)
        took = time.monotonic() - started
        link.close()
    assert took < 1.0, took


def test_a_keeper_signalled_names_who_stopped_the_run_once_not_per_node():
    """Issue #45: after `down`, node 0 said "stopped by ddp-orch down on node 1":
    down (and the controller's own stop, through each follower) names the
    stopper, the same on every node; a follower that lost the controller is
    its node's; a bare signal names itself and the node it hit."""
    from orchestrator.agent.kept.keeper import signalled

    down = "stopped by `ddp-orch down` from box1"
    assert signalled(down, "SIGTERM", 1) == down
    assert signalled("stopped by Ctrl-C on the controller", "SIGTERM", 0) == \
        "stopped by Ctrl-C on the controller"
    assert signalled(daemon.CLOSED_CONTROLLER, "SIGTERM", 1) == \
        "lost the controller (its connection closed) on node 1"
    assert signalled("", "SIGINT", 2) == "stopped by SIGINT to node 2's keeper"


def test_the_heads_last_word_is_written_to_every_link_before_the_keeper_can_exit(tmp_path):
    """The head's "finished" went to each link's outbox, and the keeper
    exited: sockets closed with the word unsent, and a member ended
    "interrupted" ("lost the gang's head"). ``_finish`` returns only once
    each link has written it (its writer held back here, as a loaded
    machine does)."""
    import socket
    import threading

    from orchestrator.agent.kept import peers
    from orchestrator.agent.kept.head import Head

    head = Head(KeeperSpec.from_dict(keeper_specs(tmp_path, 2)[0]))
    ours, theirs = socket.socketpair()
    release = threading.Event()

    class SlowSocket:  # the writer's sendall waits until released
        def __init__(self, sock):
            self.sock = sock

        def sendall(self, data):
            release.wait(5)
            return self.sock.sendall(data)

        def __getattr__(self, name):
            return getattr(self.sock, name)

    link = peers.Link(SlowSocket(ours), lambda msg: None, lambda why: None)
    threading.Thread(target=link._write, daemon=True).start()
    head.links = {1: link}
    threading.Timer(0.3, release.set).start()
    head._finish("succeeded")
    try:  # the keeper's exit: its sockets close with it
        ours.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    ours.close()
    theirs.settimeout(5)
    got = theirs.recv(65536)
    assert b"finish" in got, got
    assert head.finishing and link.closed.is_set()
