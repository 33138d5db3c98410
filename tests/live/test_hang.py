"""The hang watchdog (`up --hang-timeout`) here and under Slurm, the step
heartbeat, and the NCCL flight recorder: its settings, and its dumps brought
home after a failure (written by a stand-in: there is no GPU here)."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from bounds import AT_ONCE_S, assert_gone_within, teardowns
from conftest import local_job, run_cli, start_cli, wait_for_lines
from labhome import lab_job
from procscan import wait_gone
from test_long_runs import TWO_NODES, cli, node_dir, nothing_left, status_until, up

HANG_WORDS = ("ranks 0-1 wait in all_reduce <- hang_rank2.py:8; rank 2 is elsewhere: "
              "<module> (hang_rank2.py:14)")


@pytest.mark.live
def test_a_real_hang_is_caught_and_the_odd_rank_named(ssh_lab, tmp_path):
    """Rank 2 (node 1) sleeps while ranks 0-1 (node 0) wait in gloo's
    all_reduce: after 10 s without progress (``hang_timeout`` in the
    cluster file) every rank's stack is dumped over each host's agent, rank
    2 is named, and the run ends with nothing left. README: gone within the
    timeout, then the dump (about 2 s) and the grace period (3 s here),
    counted from the ranks' last line. On the two SSH lab hosts: this was
    a local run here and the same hang over SSH in test_ssh_launch.py
    (test_a_hang_across_two_hosts_is_caught_and_rank2_named), two gangs for
    one watchdog; local and SSH nodes differ only in how the agent is
    reached (both are backends/agentbackend.py)."""
    env, cluster = lab_job(ssh_lab, tmp_path, "hung", "hang_rank2.py", TWO_NODES,
                           extra="hang_timeout: 10\n")
    proc = start_cli("up", cluster, "--run-id", "hung", "--runs-dir",
                     str(tmp_path / "runs"), "--grace", "3", env=env)
    try:
        wait_for_lines(proc, "training", 3)
        last_line_at = time.time()  # no progress from here on: the hang
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    summary = out.split("\nrun hung: ")[1]
    assert (re.search(r"root cause: node 1 \(node1\): hang: no progress for 1[0-2]s", summary)
            and HANG_WORDS in summary), summary
    records = teardowns(tmp_path / "runs", "hung")
    # each node names the hang that stopped it (issue #45: "stopped by the controller")
    assert all(r["reason"].startswith("stopped: hang: no progress for ") for r in records), \
        records
    took = assert_gone_within(records, last_line_at, 3, stop_within=10 + 2 + AT_ONCE_S)
    print(f"a hang: every node torn down {took:.1f}s after the ranks' last line")
    kept = os.listdir(tmp_path / "runs" / "hung" / "stacks")
    assert sorted(os.listdir(tmp_path / "runs" / "hung" / "stacks" / kept[0])) == [
        "rank-0.txt", "rank-1.txt", "rank-2.txt", "summary.txt"]
    assert wait_gone("hung", 15, labs=[ssh_lab]) == set()


@pytest.mark.live
def test_a_quiet_run_with_step_heartbeats_is_not_a_hang_and_shows_its_progress(tmp_path):
    """No output for 20 s after one line from rank 0, but step heartbeats
    (rank 1's from ``ddp_orch_progress.step``, as a user's own script
    sends them): not a hang; `status` shows each rank's step and `status
    --json` rank 0's output line; `up --quiet` says it started and prints
    a progress line per node."""
    cluster = local_job(tmp_path, "quiet", "quiet_steps.py", "[{host: localhost, procs: 2}]",
                        extra="hang_timeout: 10\n")
    runs = str(tmp_path / "runs")
    proc = start_cli("up", cluster, "--run-id", "quiet", "--runs-dir", runs, "--quiet")
    try:
        deadline = time.monotonic() + 60
        progress = os.path.join(runs, "quiet", "progress.json")
        while not stepped(progress, 2):  # a cheap look: no CLI while the ranks start
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        seen = run_cli("status", "quiet", "--runs-dir", runs, "--json")
        ranks = {r["rank"]: r for r in json.loads(seen.stdout)["progress"]}
        assert sorted(ranks) == [0, 1], ranks
        assert ranks[0]["last_output_s_ago"] is not None, ranks  # "rank 0 starting"
        assert ranks[1]["last_output_s_ago"] is None, ranks  # steps only
        status = run_cli("status", "quiet", "--runs-dir", runs)
        assert "rank 0 (node 0, localhost): step " in status.stdout, status.stdout
        assert "rank 1 (node 0, localhost): step " in status.stdout
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "ddp-orch: started 2 processes on 1 node(s)" in out, out
    assert "node 0 (localhost): 2 rank(s) at step " in out, out
    state = json.loads((tmp_path / "runs" / "quiet" / "state.json").read_text())
    assert state["state"] == "succeeded"


def stepped(path: str, ranks: int) -> bool:
    """Whether ``progress.json`` at ``path`` has a step for ``ranks`` ranks."""
    try:
        with open(path, encoding="utf-8") as fh:
            seen = json.load(fh)["ranks"].values()
    except (OSError, ValueError, KeyError):
        return False  # not written yet, or caught mid-write
    return sum(r.get("step") is not None for r in seen) >= ranks


@pytest.mark.live
def test_the_hang_watchdog_under_slurm_names_the_odd_rank_from_a_step_in_the_job(
        slurm_lab, tmp_path):
    """The same hang on two Slurm nodes: progress reaches the controller
    through the shared run directory, the stacks through a step in the job,
    and the job is cancelled."""
    from test_slurm_launch import cluster, state_of, up

    path = cluster(tmp_path, "shang", "[{host: node1, procs: 2}, {host: node2, procs: 1}]",
                   "workload: {script: hang_rank2.py}\n", program="hang_rank2.py")
    result = up(slurm_lab, tmp_path, path, "shang", "--hang-timeout", "10")
    assert result.returncode == 1, result.stdout + result.stderr
    summary = result.stdout.split("\nrun shang: ")[1]
    assert (re.search(r"root cause: node 1 \(node2\): hang: no progress for 1[0-2]s", summary)
            and "ranks 0-1 wait in all_reduce <- hang_rank2.py:8; rank 2 is elsewhere: "
                "<module> (hang_rank2.py:14)" in summary), summary
    kept = os.listdir(tmp_path / "runs" / "shang" / "stacks")
    assert sorted(os.listdir(tmp_path / "runs" / "shang" / "stacks" / kept[0])) == [
        "rank-0.txt", "rank-1.txt", "rank-2.txt", "summary.txt"]
    assert state_of(tmp_path, "shang")["state"] == "failed"
    assert slurm_lab.wait_queue_empty() == []
    assert wait_gone("shang", 15) == set()


@pytest.mark.live
def test_nccl_dumps_of_a_failed_gpu_run_come_home_into_nccl_trace(ssh_lab, tmp_path):
    """No GPU here: a stand-in writes each rank's dump where the flight
    recorder would (TORCH_NCCL_DEBUG_INFO_TEMP_FILE, which the plan sets for
    a GPU run and a CPU rehearsal's file sets here, as a GPU run on a machine
    without CUDA is refused before it starts), then a rank fails. Every
    node's dumps come home over its agent's channel into
    nccl_trace/node-K/rank-R, the secret masked in them."""
    from labhome import lab_job

    secret = "hf_fl1ght-rec0rder-t0ken"

    def dumps(k: int) -> str:
        return (f"env: {{TORCH_NCCL_DEBUG_INFO_TEMP_FILE: "
                f"{tmp_path}/remote/runs/nccl/node-{k}/nccl_trace_rank_}}")

    env, path = lab_job(ssh_lab, tmp_path, "nccl", "nccl_dump_stand_in.py",
                        [f"{{host: node0, gpus: '0,1', {dumps(0)}}}",
                         f"{{host: node1, gpus: 0, {dumps(1)}}}"],
                        extra=f"device: cpu\nenv: {{HF_TOKEN: {secret}}}\n")
    result = run_cli("up", path, "--run-id", "nccl", "--runs-dir", str(tmp_path / "runs"),
                     "--grace", "3", env=env, timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "collective timed out (stand-in)" in result.stdout
    trace = tmp_path / "runs" / "nccl" / "nccl_trace"
    assert sorted(str(p.relative_to(trace)) for p in trace.rglob("*") if p.is_file()) == [
        "node-0/rank-0", "node-0/rank-1", "node-1/rank-2"]
    assert (trace / "node-1" / "rank-2").read_text() == \
        "flight record of rank 2: all_reduce seq 7 timed out; token ********\n"
    assert wait_gone("nccl", 15, labs=[ssh_lab]) == set()


@pytest.mark.live
def test_a_detached_run_is_found_hung_and_restarted_by_its_keepers_and_status_names_rank_2(
        ssh_lab, tmp_path):
    """`up --detach --max-restarts 1 --hang-timeout 10`: no controller is
    there, so the keepers' head runs the hang rule from the progress they
    relay: every node dumps its ranks' stacks (kept on the node), rank 2 is
    named, and the hang is a failure the keepers restart while restarts
    remain; the second attempt hangs too, and the run ends FAILED after its
    one restart. `attach` (live, and again once it has ended) and `status`
    show the hang as the root cause in an attached run's words.

    Was two tests, each with a gang of its own: this one without restarts,
    and test_a_hang_is_a_failure_the_keepers_restart_while_restarts_remain
    (attached, `up --max-restarts 1`: the keepers judge a kept run either
    way, and attach renders the end as `up` does). It also holds what
    test_long_runs.py's test_a_recurring_failure_stops_after_n_restarts
    checked of a run out of restarts: the attempt count, one restart per
    restart allowed, FAILED."""
    env, cluster = lab_job(ssh_lab, tmp_path, "dhung", "hang_rank2.py", TWO_NODES)
    started = up(env, tmp_path, cluster, "dhung", "--detach", "--max-restarts", "1",
                 "--hang-timeout", "10")
    assert started.returncode == 0, started.stdout + started.stderr
    followed = cli(env, tmp_path, "attach", "dhung", timeout=300)
    out = followed.stdout
    assert followed.returncode == 1, out + followed.stderr
    assert "attempt 1 (master port" in out, out
    assert re.search(r"root cause: node 1 \(node1\): hang: no progress for 1[0-2]s", out), out
    assert HANG_WORDS in out, out
    assert "attempts: 2" in out and out.count("-> restarting") == 1, out
    assert "run dhung: FAILED" in out, out

    status = status_until(env, tmp_path, "dhung", "failed", timeout=120)
    assert re.search(r"root cause: node 1 \(node1\): hang: no progress for 1[0-2]s",
                     status), status
    assert HANG_WORDS in status, status
    for k, ranks in ((0, ["rank-0.txt", "rank-1.txt"]), (1, ["rank-2.txt"])):
        stacks = node_dir(tmp_path, "dhung", k) / "stacks"
        kept = [d for d in os.listdir(stacks) if os.path.isdir(stacks / d)]
        assert len(kept) == 2, kept  # a dump for each attempt's hang
        for dump in kept:
            assert [n for n in sorted(os.listdir(stacks / dump)) if n != "summary.txt"] \
                == ranks, kept
    attached = cli(env, tmp_path, "attach", "dhung")
    assert HANG_WORDS in attached.stdout, attached.stdout + attached.stderr
    nothing_left(ssh_lab, "dhung", 15)
