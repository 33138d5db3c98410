"""Fault injection on the SSH lab: every fault ends with a clear message,
the right exit code, nothing of the run left on any host, and the logs kept.

(Faults 1 and 5, a raising worker and Ctrl-C, live in test_ssh_launch.py
and test_lifecycle.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from bounds import (AT_ONCE_S, MARGIN_S, assert_gone_within, assert_stopped_at_once,
                    guardian_record, node_dirs, teardowns)
from conftest import ROOT, run_cli
from labhome import lab_cluster, lab_home
from procscan import agent, environ_of, run_pids, wait_gone, worker_pids, workers

pytestmark = pytest.mark.live
PROGRAMS = os.path.join(ROOT, "tests", "programs")
GRACE_S = 3.0  # start_up's --grace
# a node the gang stopped names why (issue #45: it said "stopped by the controller")
STOPPED = "stopped: "
STDIN_CLOSED = "lost the controller (stdin closed)"
# One rank a node: every fault here is about a node and its processes; the
# worker test kills a local rank 1. The ranks are sleeper.py, which imports
# no torch: no fault here looks inside a rank (the collectives' cascades are
# test_local_launch.py's and test_ssh_launch.py's, with real gloo).
ONE_EACH = ["{host: node0, procs: 1}", "{host: node1, procs: 1}"]
TWO_ON_NODE0 = ["{host: node0, procs: 2}", "{host: node1, procs: 1}"]
SLEEPER = "workload: {script: sleeper.py}\n"


def setup_run(lab, tmp_path, name: str, nodes=ONE_EACH, workload=SLEEPER, extra=""):
    shutil.copy(os.path.join(PROGRAMS, "sleeper.py"), tmp_path)
    env = lab_home(lab, tmp_path)
    return env, lab_cluster(lab, tmp_path, nodes, workload, extra=extra, name=name)


def start_up(cluster: str, env: dict, tmp_path, run_id: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "up", cluster, "--run-id", run_id,
         "--runs-dir", str(tmp_path / "runs"), "--grace", f"{GRACE_S:g}", *extra],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, **env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_training(proc: subprocess.Popen, ranks: int = 2) -> str:
    seen = ""
    while seen.count("training") < ranks:
        line = proc.stdout.readline()
        assert line, seen
        seen += line
    return seen


def finish(proc: subprocess.Popen, timeout: float = 90) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


def state_of(tmp_path, run_id: str) -> dict:
    return json.loads((tmp_path / "runs" / run_id / "state.json").read_text())


def test_worker_sigkilled_on_node0(ssh_lab, tmp_path):
    """README: gone within the grace period. Node 0's torchrun ends on its
    own; node 1 is stopped at once and torn down a grace period later."""
    env, cluster = setup_run(ssh_lab, tmp_path, "w9", nodes=TWO_ON_NODE0)
    proc = start_up(cluster, env, tmp_path, "w9")
    wait_training(proc, 3)
    killed_at = time.time()
    os.kill(workers("w9", 0)[1], signal.SIGKILL)
    out = finish(proc)
    assert proc.returncode == 1, out
    assert "root cause: node 0 (node0)" in out and "rank 1 (local rank 1) failed" in out
    assert "SIGKILL" in out
    node0, node1 = records = teardowns(tmp_path / "runs", "w9")
    assert node0["reason"] == "torchrun exited" and node0["stopped_at"] is None, node0
    assert_stopped_at_once(node1, killed_at, f"{STOPPED}node 0 (node0) failed (exit 1)")
    took = assert_gone_within(records, killed_at, GRACE_S)
    print(f"a SIGKILLed worker: every node torn down {took:.1f}s after the kill")
    assert wait_gone("w9", 15, labs=[ssh_lab]) == set()
    assert "training" in (tmp_path / "runs" / "w9" / "node-1.log").read_text()


def test_torchrun_agent_sigkilled_on_node1(ssh_lab, tmp_path):
    env, cluster = setup_run(ssh_lab, tmp_path, "a9")
    proc = start_up(cluster, env, tmp_path, "a9")
    wait_training(proc)
    os.kill(agent("a9", 1), signal.SIGKILL)
    out = finish(proc)
    assert proc.returncode == 1, out
    assert "root cause: node 1 (node1): torchrun exited 137" in out
    assert wait_gone("a9", 15, labs=[ssh_lab]) == set()  # its orphaned worker too


def test_ssh_connection_to_node1_drops(ssh_lab, tmp_path):
    """README: its supervisor sees EOF at once (not the 30 s of silence it
    would otherwise wait for), and the controller stops node 0 at once."""
    env, cluster = setup_run(ssh_lab, tmp_path, "drop")
    proc = start_up(cluster, env, tmp_path, "drop")
    wait_training(proc)
    dropped_at = time.time()
    assert ssh_lab.kill_sessions("node1")
    out = finish(proc)
    assert proc.returncode == 1, out
    assert "root cause: node 1 (node1)" in out and "connection lost" in out
    node0, node1 = records = teardowns(tmp_path / "runs", "drop")
    assert_stopped_at_once(node1, dropped_at, STDIN_CLOSED)
    assert_stopped_at_once(node0, dropped_at, f"{STOPPED}node 1 (node1) failed (exit 255)")
    took = assert_gone_within(records, dropped_at, GRACE_S)
    print(f"a dropped connection: every node torn down {took:.1f}s after the drop")
    assert wait_gone("drop", 20, labs=[ssh_lab]) == set()


def supervisor_pid(tmp_path, run_id: str, node_rank: int) -> int:
    state = tmp_path / "remote" / "runs" / run_id / f"node-{node_rank}" / "supervisor.json"
    return json.loads(state.read_text())["supervisor_pid"]


def test_supervisor_sigkilled_on_node1_leaves_nothing_within_30s(ssh_lab, tmp_path):
    """Nothing of the supervisor runs to tear down: its guardian does, on node
    1, and the controller sees the agent vanish and stops node 0."""
    env, cluster = setup_run(ssh_lab, tmp_path, "sup9")
    proc = start_up(cluster, env, tmp_path, "sup9")
    wait_training(proc)
    killed_at, killed_mono = time.time(), time.monotonic()
    os.kill(supervisor_pid(tmp_path, "sup9", 1), signal.SIGKILL)
    out = finish(proc)
    assert proc.returncode == 1, out
    assert "root cause: node 1 (node1): the node agent ended without reporting " \
           "(killed by signal 9)" in out
    assert wait_gone("sup9", 30 - (time.monotonic() - killed_mono), labs=[ssh_lab]) == set()
    print(f"supervisor SIGKILL: every process of the run gone "
          f"{time.monotonic() - killed_mono:.1f}s after the kill")
    # "at once" on node 1, by its guardian (not the controller's sweep): it
    # ended torchrun and the worker there, within the grace period
    guarded = guardian_record(node_dirs(tmp_path / "runs", "sup9")[1])
    assert guarded is not None and len(guarded["ended"]) >= 2, guarded
    assert guarded["torn_down_at"] - killed_at < AT_ONCE_S + GRACE_S + MARGIN_S, guarded
    node0 = teardowns(tmp_path / "runs", "sup9")[0]
    assert node0["reason"].startswith(f"{STOPPED}node 1 (node1) failed (exit "), node0
    assert node0["stopped_at"] - killed_at < AT_ONCE_S
    assert "leftover process" in (tmp_path / "runs" / "sup9" / "node-1.log").read_text()


def test_losing_node0_ends_with_the_summary_not_a_traceback(make_ssh_lab, tmp_path):
    """Node 0 holds rank 0's result; when its host goes away, fetching it
    fails, and that must be a line in the summary, not a crash. README (as a
    lost connection): node 0's supervisor sees EOF at once, the controller
    stops node 1 at once, each is torn down in the grace period."""
    lab = make_ssh_lab(2)
    env, cluster = setup_run(lab, tmp_path, "lost0")
    proc = start_up(cluster, env, tmp_path, "lost0")
    wait_training(proc)
    gone_at = time.time()
    lab.stop_host("node0")  # its sshd and every session: the host is gone
    out = finish(proc)
    assert proc.returncode == 1, out
    ours = [line for line in out.splitlines() if not line.startswith("[node")]  # not relayed
    assert not [line for line in ours if "Traceback" in line], out
    assert "root cause: node 0 (node0)" in out and "FAILED" in out
    assert "cannot be reached to clean up" in (tmp_path / "runs" / "lost0" / "node-0.log").read_text()
    assert wait_gone("lost0", 20, labs=[lab]) == set()  # node 0's supervisor saw its channel close
    node0, node1 = records = teardowns(tmp_path / "runs", "lost0")
    assert_stopped_at_once(node0, gone_at, STDIN_CLOSED)
    assert_stopped_at_once(node1, gone_at, f"{STOPPED}node 0 (node0) failed (exit 255)")
    assert_gone_within(records, gone_at, GRACE_S)


def test_a_frozen_link_is_over_on_both_sides_within_45s(make_ssh_lab, tmp_path):
    """node1's sshd is frozen (SIGSTOP), listener and sessions alike: no FIN,
    no RST, the kernel still ACKs, so TCP alone would notice nothing for
    minutes. The controller notices the missing heartbeats and stops the
    rest; node1's supervisor notices the missing pings and tears its run
    down by itself (no one can reach it to help). With the default grace
    period (10 s), both are over within the README's 45 s: 30 s of silence,
    then the teardown, which never waits on the frozen link."""
    lab = make_ssh_lab(2)
    env, cluster = setup_run(lab, tmp_path, "frz")
    proc = start_up(cluster, env, tmp_path, "frz", "--grace", "10")  # the default
    wait_training(proc)
    freeze_node1_and_see_both_sides_over_within_45s(lab, proc, tmp_path, "frz", (SILENCE,))


SILENT_CONTROLLER = "lost the controller (nothing from it for 30s)"
SILENCE = f"{STOPPED}node 1 (node1) silent for 30s"


def freeze_node1_and_see_both_sides_over_within_45s(lab, proc, tmp_path, run_id: str,
                                                    node0_reasons: tuple[str, ...]) -> None:
    """Freeze node1's sshd (listener and sessions) now; the run must end as
    a silent node 1 (FAILED, its root cause), noticed on both sides within
    30 s of silence (plus the watch's 1 s look, measured on the nodes'
    records), every process gone and the controller done within 45 s."""
    frozen = [lab.listener_pid("node1"), *lab.session_pids("node1")]
    frozen_at = time.time()
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        # node 0 by the controller, node 1 by itself; the frozen sshd
        # sessions themselves can only go once thawed (below)
        assert wait_gone(run_id, 60) == set()
        out = finish(proc, timeout=120)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    assert proc.returncode == 1, out
    assert "node 1 (node1) silent for 30s; stopping every node" in out
    assert "root cause: node 1 (node1): nothing from the node for 30s" in out
    assert "INTERRUPTED" not in out and "got SIGTERM" not in out, out
    node0, node1 = records = teardowns(tmp_path / "runs", run_id)
    assert node1["reason"] == SILENT_CONTROLLER, node1
    assert node0["reason"] in node0_reasons, node0
    for record in records:
        assert record["stopped_at"] - frozen_at < 30 + MARGIN_S, (frozen_at, record)
    gone_s = assert_gone_within(records, frozen_at, 10, stop_within=30 + MARGIN_S)
    assert gone_s < 45, gone_s
    exited_s = state_of(tmp_path, run_id)["ended"] - frozen_at
    assert exited_s < 45, exited_s
    print(f"frozen link ({run_id}): every process of the run gone {gone_s:.1f}s after the "
          f"freeze; the controller done after {exited_s:.1f}s")
    assert wait_gone(run_id, 15, labs=[lab]) == set()  # thawed, the sessions see the EOF


def test_a_link_frozen_as_a_kept_runs_workers_start_is_over_within_45s_as_silence(
        make_ssh_lab, tmp_path):
    """The same freeze in the start phase of a run with --max-restarts, kept
    by its nodes' keepers (issue #32): node1's workers have started and are
    loading data (when hosts often hang). The same
    45 s and the same root cause as an attached run in training; it took
    84 s, INTERRUPTED, with "got SIGTERM on node 1" as the root cause. (An
    attached run in that phase held already; the phases of either rule are
    test_gangrule.py's test_a_silent_node_is_lost_in_every_phase_of_a_run
    and the node side's are test_node_supervisor.py's.)"""
    lab = make_ssh_lab(2)
    env, cluster = setup_run(lab, tmp_path, "frz0",
                             workload="workload: {script: sleeper.py, args: [--load, '60']}\n")
    proc = start_up(cluster, env, tmp_path, "frz0", "--grace", "10", "--max-restarts", "1")
    seen = ""
    while "rank 1 loading" not in seen:
        line = proc.stdout.readline()
        assert line, seen
        seen += line
    # node 0 stops for whichever of the two 30 s timers fired first: ours, or
    # node 1's follower's, through the keepers' gang
    freeze_node1_and_see_both_sides_over_within_45s(
        lab, proc, tmp_path, "frz0", (SILENCE, f"{STOPPED}{SILENT_CONTROLLER} on node 1"))


def test_controller_sigkilled_nodes_clean_themselves_up(ssh_lab, tmp_path):
    """README: at once, each supervisor sees EOF (not the 30 s of silence)."""
    env, cluster = setup_run(ssh_lab, tmp_path, "ctl9")
    proc = start_up(cluster, env, tmp_path, "ctl9")
    wait_training(proc)
    killed_at = time.time()
    proc.kill()
    proc.wait()
    assert wait_gone("ctl9", 20, labs=[ssh_lab]) == set()
    records = teardowns(tmp_path / "runs", "ctl9")
    for record in records:
        assert_stopped_at_once(record, killed_at, STDIN_CLOSED)
    took = assert_gone_within(records, killed_at, GRACE_S)
    print(f"a SIGKILLed controller: every node torn down {took:.1f}s after the kill")
    status = run_cli("status", "ctl9", "--runs-dir", str(tmp_path / "runs"))
    assert "interrupted" in status.stdout


def test_the_nothing_left_check_sees_a_leaked_supervisor(ssh_lab, tmp_path):
    """The check every live test ends with (``procscan.wait_gone``) must see
    ddp-orch's own processes, not only torchrun and the workers, which are
    all the worker marker finds. Node 1's supervisor is leaked on purpose:
    frozen (SIGSTOP), it never sees its controller go (SIGKILL), and its
    torchrun and worker are then killed by hand. Nothing with the worker
    marker is left, and the check still fails: it sees the supervisor (and
    its guardian, which waits for it)."""
    env, cluster = setup_run(ssh_lab, tmp_path, "leak")
    proc = start_up(cluster, env, tmp_path, "leak")
    wait_training(proc)
    leaked = supervisor_pid(tmp_path, "leak", 1)
    os.kill(leaked, signal.SIGSTOP)
    try:
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20
        while worker_pids("leak"):  # node 0 tears down by itself; node 1's by hand
            for pid in worker_pids("leak"):
                if environ_of(pid).get("DDP_ORCH_NODE_RANK") == "1":
                    os.kill(pid, signal.SIGKILL)
            assert time.monotonic() < deadline, worker_pids("leak")
            time.sleep(0.1)
        left = wait_gone("leak", 5, labs=[ssh_lab])
        assert leaked in left, left  # the check fails, as it must
    finally:
        os.kill(leaked, signal.SIGKILL)
    assert wait_gone("leak", 15, labs=[ssh_lab]) == set()  # its guardian went with it


def test_node_with_a_wrong_python_fails_fast_and_is_named(ssh_lab, tmp_path):
    env, cluster = setup_run(ssh_lab, tmp_path, "nopy",
                             nodes=["{host: node0, procs: 1}",
                                    "{host: node1, procs: 1, python: /nonexistent/python3}"],
                             workload="workload: {name: noop}\n")
    result = run_cli("up", cluster, "--run-id", "nopy", "--runs-dir", str(tmp_path / "runs"),
                     "--grace", "3", "--start-timeout", "60", env=env, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    # Found while connecting, before anything starts anywhere (the agent needs it too).
    assert "connecting to the nodes failed" in result.stderr
    assert "node 1 (node1): cannot run '/nonexistent/python3' on the node (exit 127)" \
        in result.stderr
    assert "set `python:`" in result.stderr and "Traceback" not in result.stderr
    assert "started" not in result.stdout
    assert wait_gone("nopy", 15, labs=[ssh_lab]) == set()


def test_busy_master_port_auto_moves_explicit_fails_fast(ssh_lab, tmp_path):
    busy = socket.socket()
    busy.bind(("", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    nodes = ["{host: node0, procs: 1}", "{host: node1, procs: 1}"]
    noop = "workload: {name: noop}\n"
    try:
        env, explicit = setup_run(ssh_lab, tmp_path, "port", nodes, noop,
                                  extra=f"master: {{port: {port}}}\n")
        started = time.monotonic()
        result = run_cli("up", explicit, "--run-id", "port", "--runs-dir", str(tmp_path / "runs"),
                         env=env, timeout=120)
        assert result.returncode == 1
        failed_s = time.monotonic() - started
        assert f"master port {port} on node0 (node 0) is already in use" in result.stderr
        assert wait_gone("port", 10, labs=[ssh_lab]) == set()
        _, auto = setup_run(ssh_lab, tmp_path, "port-auto", nodes, noop)
        started = time.monotonic()
        result = run_cli("up", auto, "--run-id", "port-auto", "--runs-dir", str(tmp_path / "runs"),
                         "--quiet", env=env, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        # README: "fails at once": before any torchrun starts, so sooner than
        # the same gang's whole noop run beside it (a bound the box's load
        # moves with both)
        assert failed_s < time.monotonic() - started, failed_s
        plan = json.loads((tmp_path / "runs" / "port-auto" / "plan.json").read_text())
        assert plan["master_port"] != port
    finally:
        busy.close()


def test_unreachable_node_fails_before_anything_starts(make_ssh_lab, tmp_path):
    lab = make_ssh_lab(2)
    env, cluster = setup_run(lab, tmp_path, "unreach", workload="workload: {name: noop}\n")
    lab.stop_host("node1")
    result = run_cli("up", cluster, "--run-id", "unreach", "--runs-dir", str(tmp_path / "runs"),
                     env=env, timeout=120)
    assert result.returncode == 1
    assert "node 1 (node1): unreachable" in result.stderr
    assert not (tmp_path / "remote" / "runs" / "unreach" / "node-0").exists()
    assert state_of(tmp_path, "unreach")["state"] == "failed"


def test_two_runs_on_the_same_hosts_and_down_of_one(ssh_lab, tmp_path):
    env, cluster = setup_run(ssh_lab, tmp_path, "pair",
                             nodes=["{host: node0, procs: 1}", "{host: node1, procs: 1}"])
    first = start_up(cluster, env, tmp_path, "pair-a")
    second = start_up(cluster, env, tmp_path, "pair-b")
    try:
        wait_training(first, 2)
        wait_training(second, 2)
        down = run_cli("down", "pair-a", "--runs-dir", str(tmp_path / "runs"), env=env, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        # pair-b's sessions run pair-b's processes: not pair-a's leftovers
        assert wait_gone("pair-a", 15, labs=[ssh_lab]) == set()
        finish(first)
        assert len(worker_pids("pair-b")) == 4  # 2 torchrun agents + 2 workers, untouched
        assert run_pids("pair-b") > worker_pids("pair-b")  # and its supervisors
        assert second.poll() is None
    finally:
        second.send_signal(signal.SIGINT)
        finish(second)
    assert wait_gone("pair-b", 15, labs=[ssh_lab]) == set()
