"""Long runs on the SSH lab: ``up --detach``, ``attach``, ``status``, ``down``,
and whole-gang restarts (``--max-restarts``), with real processes and faults.

The bound the keepers promise (agent/kept/keeper.py, README "Long runs"): once
one node fails or its keeper is lost, every other node starts its teardown
within 10 s (at once when a rank fails or a link closes), and is gone a
grace period later: 20 s at most with the default grace. Measured on the
nodes' own records (``bounds``); the process scan waits up to ``BOUND_S``.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from bounds import AT_ONCE_S, assert_gone_within, teardowns
from conftest import run_cli, start_cli, wait_for_lines
from labhome import lab_cluster, lab_home, lab_job
from procscan import run_pids, wait_gone

pytestmark = pytest.mark.live
TWO_NODES = ["{host: node0, procs: 2}", "{host: node1, procs: 1}"]
BOUND_S = 30.0


def setup(lab, tmp_path, name: str, args: str, program: str = "steps.py",
          nodes=TWO_NODES, extra: str = ""):
    return lab_job(lab, tmp_path, name, program, nodes, args=args, extra=extra)


def cli(env: dict, tmp_path, *args: str, timeout: float = 180):
    return run_cli(*args, "--runs-dir", str(tmp_path / "runs"), env=env, timeout=timeout)


def up(env: dict, tmp_path, cluster: str, run_id: str, *extra: str, timeout: float = 180,
       grace: str = "3"):
    """``up``, with ``--grace 3`` unless ``grace`` says otherwise ("": the default)."""
    return cli(env, tmp_path, "up", cluster, "--run-id", run_id,
               *(("--grace", grace) if grace else ()), *extra, timeout=timeout)


def node_dir(tmp_path, run_id: str, k: int):
    return tmp_path / "remote" / "runs" / run_id / f"node-{k}"


def keeper(tmp_path, run_id: str, k: int) -> dict:
    return json.loads((node_dir(tmp_path, run_id, k) / "keeper.json").read_text())


def nothing_left(lab, run_id: str, timeout: float) -> None:
    """Wait until no process of the run is left (keepers and followers
    included) and no SSH session of it on the lab."""
    assert wait_gone(run_id, timeout, labs=[lab]) == set()


def status_until(env, tmp_path, run_id: str, word: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        out = cli(env, tmp_path, "status", run_id).stdout
        if f" {word} " in out.splitlines()[1] or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def test_detach_returns_then_status_and_attach_follow_it_to_the_result(ssh_lab, tmp_path):
    env, cluster = setup(ssh_lab, tmp_path, "det", "{steps: 40, sleep: 0.25}")
    started = up(env, tmp_path, cluster, "det", "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    assert "run det is running on node 0 (node0), node 1 (node1)" in started.stdout
    assert "ddp-orch attach det" in started.stdout
    assert run_pids("det"), "the run ended with its controller"
    state = json.loads((tmp_path / "runs" / "det" / "state.json").read_text())
    assert state["rule"] == "detached" and state["state"] == "running"
    assert json.loads((tmp_path / "runs" / "det" / "plan.json").read_text())["liveness"] \
        == "detached"

    status = cli(env, tmp_path, "status", "det")
    assert " running " in status.stdout.splitlines()[1], status.stdout
    assert "node 1 (node1): running, attempt 0" in status.stdout

    attached = cli(env, tmp_path, "attach", "det")
    assert attached.returncode == 0, attached.stdout + attached.stderr
    assert "[node0 node0] [rank0]: rank 0 step 0 attempt 0" in attached.stdout  # from the start
    assert "[node1 node1] [rank2]: rank 2 step 39 attempt 0" in attached.stdout
    assert "run det: SUCCEEDED" in attached.stdout
    assert "result: world_size=3 restart_count=0 steps=40" in attached.stdout
    assert json.loads((tmp_path / "runs" / "det" / "result.json").read_text())["world_size"] == 3
    nothing_left(ssh_lab, "det", 15)
    assert " succeeded " in cli(env, tmp_path, "ps").stdout


def test_detached_run_whose_rank_raises_stops_everywhere_within_the_bound(ssh_lab, tmp_path):
    """README: with the default grace, every node's teardown starts within
    10 s of the failure (at once here) and is over within 20 s."""
    env, cluster = setup(ssh_lab, tmp_path, "raise",
                         "{steps: 400, sleep: 0.1, fail_rank: 2, fail_step: 30}")
    assert up(env, tmp_path, cluster, "raise", "--detach", grace="").returncode == 0
    nothing_left(ssh_lab, "raise", BOUND_S)
    failed_at = keeper(tmp_path, "raise", 0)["attempts"][0]["nodes"]["1"]["failures"][0][
        "timestamp"]
    node0, node1 = records = teardowns(tmp_path / "runs", "raise")
    assert node1["reason"] == "torchrun exited" and "node 1 failed" in node0["reason"], node0
    assert node0["stopped_at"] - failed_at < 10, (failed_at, node0)
    took = assert_gone_within(records, failed_at, 10, stop_within=10)
    assert took < 20, took
    for k in (0, 1):  # each keeper's end, as it recorded it
        assert keeper(tmp_path, "raise", k)["updated"] - failed_at < 20
    print(f"a raising rank: every node of the detached run torn down {took:.1f}s later "
          f"(node 0 asked to stop after {node0['stopped_at'] - failed_at:.1f}s)")
    out = status_until(env, tmp_path, "raise", "failed")
    assert " failed " in out.splitlines()[1], out
    assert "root cause: node 1 (node1): torchrun exited 1; rank 2 (local rank 0) failed: " \
           "RuntimeError: planned failure at step 30 of attempt 0" in out
    node0 = [line for line in out.splitlines() if "node 0 (node0):" in line][0]
    assert "stopped" in node0 or "Connection closed by peer" in node0, out  # or its cascade
    recorded = json.loads((tmp_path / "runs" / "raise" / "state.json").read_text())
    assert recorded["state"] == "failed"  # status wrote down what the nodes said


def test_detached_run_survives_nothing_of_a_sigkilled_keeper(ssh_lab, tmp_path):
    """README: at once when its link closes (not the 10 s link timeout),
    then the grace period (3 s here). Measured on node 0's records."""
    env, cluster = setup(ssh_lab, tmp_path, "k9", "{steps: 4000, sleep: 0.1}")
    assert up(env, tmp_path, cluster, "k9", "--detach").returncode == 0
    killed_at = time.time()
    os.kill(keeper(tmp_path, "k9", 1)["pid"], signal.SIGKILL)
    nothing_left(ssh_lab, "k9", BOUND_S)
    lost = keeper(tmp_path, "k9", 0)["attempts"][0]["nodes"]["1"]
    assert lost["lost"] == "the link closed", lost
    assert lost["lost_at"] - killed_at < AT_ONCE_S < 10, (killed_at, lost)
    node0 = teardowns(tmp_path / "runs", "k9")[0]
    assert "lost node 1 (the link closed)" in node0["reason"], node0
    took = assert_gone_within([node0], killed_at, 3)
    print(f"a SIGKILLed keeper: lost {lost['lost_at'] - killed_at:.1f}s after the kill, "
          f"node 0 torn down {took:.1f}s after it")
    out = status_until(env, tmp_path, "k9", "failed")
    assert "root cause: node 1 (node1): its keeper could not be heard" in out, out
    assert "node 0 (node0): stopped" in out and "lost node 1" in out


def test_down_stops_a_detached_run(ssh_lab, tmp_path):
    env, cluster = setup(ssh_lab, tmp_path, "dd", "{steps: 4000, sleep: 0.1}")
    assert up(env, tmp_path, cluster, "dd", "--detach").returncode == 0
    down = cli(env, tmp_path, "down", "dd")
    assert down.returncode == 0, down.stdout + down.stderr
    nothing_left(ssh_lab, "dd", 5)  # down waited for the keepers
    out = status_until(env, tmp_path, "dd", "interrupted")
    assert " interrupted " in out.splitlines()[1], out
    assert "-> stopped on purpose" not in out  # one attempt: no restart line


def test_status_of_a_live_detached_run_shows_each_ranks_step(ssh_lab, tmp_path):
    """No controller keeps progress.json for a detached run: each node's keeper
    records its ranks' last step, and status reads it from the nodes."""
    env, cluster = setup(ssh_lab, tmp_path, "prog", "{steps: 4000, sleep: 0.1}")
    assert up(env, tmp_path, cluster, "prog", "--detach").returncode == 0
    deadline = time.monotonic() + 60
    while True:
        out = cli(env, tmp_path, "status", "prog").stdout
        shown = [line for line in out.splitlines() if line.startswith("  rank ")]
        if len(shown) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert " running " in out.splitlines()[1], out
    assert [line.split(": step")[0] for line in shown] == [
        "  rank 0 (node 0, node0)", "  rank 1 (node 0, node0)", "  rank 2 (node 1, node1)"], out
    assert all(line.split(": step ")[1].split(",")[0].isdigit() for line in shown), out
    assert not (tmp_path / "runs" / "prog" / "progress.json").exists()  # from the nodes
    progress = json.loads(cli(env, tmp_path, "status", "prog", "--json").stdout)["progress"]
    assert [(r["rank"], r["node_rank"], r["host"]) for r in progress] == [
        (0, 0, "node0"), (1, 0, "node0"), (2, 1, "node1")], progress
    assert all(r["step"] >= 0 and r["last_progress_s_ago"] < 30 for r in progress), progress
    assert cli(env, tmp_path, "down", "prog").returncode == 0
    nothing_left(ssh_lab, "prog", 15)


def up_with_restarts(lab, tmp_path, run_id: str, args: str, restarts: int, code: int) -> str:
    """``up --max-restarts`` of steps.py to its end; its output."""
    env, cluster = setup(lab, tmp_path, run_id, args)
    done = up(env, tmp_path, cluster, run_id, "--max-restarts", str(restarts))
    assert done.returncode == code, done.stdout + done.stderr
    return done.stdout


def test_max_restarts_recovers_a_failure_of_the_first_attempt(ssh_lab, tmp_path):
    out = up_with_restarts(ssh_lab, tmp_path, "re1", "{steps: 4, fail_rank: 1, fail_step: 1}",
                           1, 0)
    assert "attempts: 2" in out
    assert "attempt 0 (port " in out and "RuntimeError: planned failure at step 1 of attempt " \
           "0 (steps.py:" in out and "-> restarting" in out
    assert "attempt 1 (port " in out and "): succeeded" in out
    assert "result: world_size=3 restart_count=1 steps=4" in out  # from attempt 1
    ports = [line.split("(port ")[1].split(")")[0] for line in out.splitlines()
             if line.strip().startswith("attempt ") and "(port " in line]
    assert len(set(ports)) == 2, ports  # a fresh rendezvous port
    for k in (0, 1):  # both attempts' logs are kept, on the node and here
        assert (node_dir(tmp_path, "re1", k) / "torchrun").is_dir()
        assert (node_dir(tmp_path, "re1", k) / "torchrun.attempt-1").is_dir()
        log = (tmp_path / "runs" / "re1" / f"node-{k}.log").read_text()
        assert "attempt 0" in log and "ddp-orch: attempt 1 (master port" in log
    recorded = json.loads((tmp_path / "runs" / "re1" / "state.json").read_text())
    assert [a["state"] for a in recorded["attempts"]] == ["failed", "succeeded"]
    assert wait_gone("re1", 10, labs=[ssh_lab]) == set()


def test_a_recurring_failure_stops_after_n_restarts(ssh_lab, tmp_path):
    out = up_with_restarts(ssh_lab, tmp_path, "re3",
                           "{steps: 4, fail_rank: 2, fail_step: 1, fail_attempts: 9}", 2, 1)
    assert "attempts: 3" in out, out
    assert out.count("-> restarting") == 2
    assert "attempt 2 (port " in out and "planned failure at step 1 of attempt 2" in out
    assert "run re3: FAILED" in out
    assert wait_gone("re3", 10, labs=[ssh_lab]) == set()


def test_an_import_error_is_not_restarted(ssh_lab, tmp_path):
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    env = lab_home(ssh_lab, tmp_path)
    cluster = lab_cluster(ssh_lab, tmp_path, TWO_NODES, "workload: {script: broken.py}\n",
                          name="imp")
    done = up(env, tmp_path, cluster, "imp", "--max-restarts", "3")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "attempts: 1" in out, out
    assert "ModuleNotFoundError before the first step, which a restart meets again" in out


def tiny_data(workload: str, root) -> tuple[str, str]:
    """A tiny dataset of ``workload``'s in the real format, and its arguments."""
    from workloads.make_tiny_datasets import write_cifar10, write_mnist

    data = root / "data"
    if workload == "mnist":
        write_mnist(str(data), train=48, test=16)
        return (f"{{epochs: 2, global_batch_size: 12, num_workers: 0, data_dir: {data}, "
                "log_every: 100}")
    write_cifar10(str(data), train=8, test=4)
    return (f"{{epochs: 2, global_batch_size: 4, image_size: 8, num_workers: 0, eval: false, "
            f"data_dir: {data}, log_every: 100}}")


@pytest.mark.parametrize("workload", ["mnist", "resnet"])
def test_a_workload_resumed_after_a_restart_ends_where_an_uninterrupted_run_does(
        ssh_lab, tmp_path, workload):
    """Tiny sizes on CPU, two ranks, one per host: bit for bit. (With three
    or more, gloo's ring sums each element in an order set by its place in
    DDP's buckets, which DDP rebuilds after a process's first step, so a
    resumed run can differ from a straight one in the last bit of a few
    values.)"""
    args = tiny_data(workload, tmp_path)
    nodes = ["{host: node0, procs: 1}", "{host: node1, procs: 1}"]
    env, cluster = setup(ssh_lab, tmp_path, "fo", args, program="fault_once.py", nodes=nodes,
                         extra=f"env: {{FAULT_WORKLOAD: {workload}}}\n")
    # (no run without restarts first: the restarted run's own output shows
    # attempt 0's planned fault, and a third run cost 20-40 s)
    restarted = up(env, tmp_path, cluster, "fo1", "--max-restarts", "1", timeout=300)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert "planned fault after epoch 1" in restarted.stdout and "-> restarting" in restarted.stdout
    assert "restart 1: resuming from checkpoint.pt (epoch 1, step" in restarted.stdout
    resumed = json.loads((tmp_path / "runs" / "fo1" / "result.json").read_text())
    assert resumed["restart_count"] == 1 and resumed["resumed"] is True
    assert resumed["metrics"]["start_epoch"] == 1 and resumed["metrics"]["end_epoch"] == 2

    whole = lab_cluster(ssh_lab, tmp_path, nodes,
                        f"workload: {{name: {workload}, args: {args}}}\n", name="fow")
    uninterrupted = up(env, tmp_path, whole, "fow", timeout=300)
    assert uninterrupted.returncode == 0, uninterrupted.stdout + uninterrupted.stderr
    reference = json.loads((tmp_path / "runs" / "fow" / "result.json").read_text())
    assert reference["resumed"] is False
    assert resumed["checksum"] == reference["checksum"]
    assert resumed["replicas_identical"] and reference["replicas_identical"]


def test_a_sigkilled_controller_still_ends_an_attached_run_with_restarts(ssh_lab, tmp_path):
    """--max-restarts alone keeps the attached rule: the followers lose their
    controller, and each stops its keeper."""

    env, cluster = setup(ssh_lab, tmp_path, "att", "{steps: 4000, sleep: 0.1}")
    proc = start_cli("up", cluster, "--run-id", "att", "--runs-dir", str(tmp_path / "runs"),
                     "--grace", "3", "--max-restarts", "2", env=env)
    wait_for_lines(proc, "step 3 attempt 0", 3)
    assert json.loads((tmp_path / "runs" / "att" / "plan.json").read_text())["liveness"] \
        == "attached"
    # (that the controller's pings keep a follower content past the peer
    # timeout: test_keeper.py's test_pings_keep_a_follower_past_the_peer_timeout...)
    assert keeper(tmp_path, "att", 0)["state"] == "running" and run_pids("att")
    killed_at = time.time()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    nothing_left(ssh_lab, "att", BOUND_S)
    # at once: each follow agent sees its controller's EOF and signals its
    # keeper (not the followers' 30 s of silence); then the grace period
    records = teardowns(tmp_path / "runs", "att")
    for record in records:
        assert "got SIGTERM" in record["reason"], record
    assert_gone_within(records, killed_at, 3)
    assert keeper(tmp_path, "att", 0)["state"] == "interrupted"
    assert len(keeper(tmp_path, "att", 0)["attempts"]) == 1  # and no restart


def test_ctrl_c_on_attach_leaves_the_run_and_logs_follow_it(ssh_lab, tmp_path):

    env, cluster = setup(ssh_lab, tmp_path, "cc", "{steps: 60, sleep: 0.2}")
    assert up(env, tmp_path, cluster, "cc", "--detach").returncode == 0
    proc = start_cli("attach", "cc", "--lines", "2", "--runs-dir", str(tmp_path / "runs"),
                     env=env)
    wait_for_lines(proc, "attempt 0", 4)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert "left run cc; it goes on on its nodes" in out
    assert run_pids("cc")
    follow = cli(env, tmp_path, "logs", "cc", "--follow")
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert "[node1 node1] [rank2]: rank 2 step 59 attempt 0" in follow.stdout
    nothing_left(ssh_lab, "cc", 15)
    assert "rank 2 step 59" in (tmp_path / "runs" / "cc" / "node-1.log").read_text()


def test_restarts_happen_without_a_controller_and_attach_shows_them(ssh_lab, tmp_path):
    env, cluster = setup(ssh_lab, tmp_path, "dre",
                         "{steps: 30, sleep: 0.2, fail_rank: 2, fail_step: 3}")
    assert up(env, tmp_path, cluster, "dre", "--detach", "--max-restarts", "1").returncode == 0
    assert json.loads((tmp_path / "runs" / "dre" / "plan.json").read_text())["max_restarts"] == 1
    attached = cli(env, tmp_path, "attach", "dre", "--from-start")
    out = attached.stdout
    assert attached.returncode == 0, out + attached.stderr
    assert "ddp-orch: attempt 1 (master port" in out and "rank 2 step 29 attempt 1" in out
    assert "attempts: 2" in out and "-> restarting" in out
    assert "result: world_size=3 restart_count=1 steps=30" in out
    nothing_left(ssh_lab, "dre", 15)
