"""Under Slurm the job is Slurm's, not the controller's (docs/slurm.md,
"Liveness is Slurm's"): it runs on when the `up` that submitted it is killed, and `status`,
`logs --follow` and `attach` still give its output and its end, from Slurm
(`squeue`, then `sacct`) and from the agents' own records in the shared run
directory. On the real Slurm lab (tests/labs/slurmlab.py)."""

from __future__ import annotations

import json
import os
import signal
import stat
import time

import pytest

from conftest import run_cli, wait_for_lines
from procscan import wait_gone
from test_slurm_launch import cluster, start_up, state_of, up

pytestmark = pytest.mark.live
STEPS = "workload: {script: steps.py, args: {steps: 30, sleep: 0.3}}\n"
LONGER = "workload: {script: steps.py, args: {steps: 60, sleep: 0.3}}\n"
TWO = "[{host: node1, procs: 1}, {host: node2, procs: 1}]"


def cli(slurm_lab, tmp_path, *args: str, env: dict | None = None, timeout: float = 120):
    return run_cli(*args, "--runs-dir", str(tmp_path / "runs"),
                   env={**slurm_lab.env(), **(env or {})}, timeout=timeout)


def test_logs_follow_streams_a_slurm_run_to_its_end(slurm_lab, tmp_path):
    path = cluster(tmp_path, "flw", TWO, STEPS, program="steps.py")
    proc = start_up(slurm_lab, tmp_path, path, "flw")
    try:
        wait_for_lines(proc, "step 1 attempt 0", 2)
        follow = cli(slurm_lab, tmp_path, "logs", "flw", "--follow")
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert follow.returncode == 0, follow.stdout + follow.stderr
    # It returned once the run had ended, with the last lines in it.
    assert "[node0] [rank0]: rank 0 step 29 attempt 0" in follow.stdout
    assert "[node1] [rank1]: rank 1 step 29 attempt 0" in follow.stdout
    assert slurm_lab.wait_queue_empty() == []


def test_a_slurm_job_outlives_its_killed_controller_and_status_and_attach_give_its_end(
        slurm_lab, tmp_path):
    path = cluster(tmp_path, "orph", TWO, LONGER, program="steps.py")
    proc = start_up(slurm_lab, tmp_path, path, "orph")
    wait_for_lines(proc, "step 2 attempt 0", 2)
    os.killpg(proc.pid, signal.SIGKILL)  # the machine that ran `up` is gone, as far as we know
    proc.wait()
    job = state_of(tmp_path, "orph")["nodes"][0]["connection"]["slurm_job"]
    assert job in slurm_lab.queue()

    status = cli(slurm_lab, tmp_path, "status", "orph")
    assert status.returncode == 0, status.stderr
    assert " running " in status.stdout.splitlines()[1], status.stdout  # not "interrupted"
    assert f"Slurm job {job}: RUNNING on node[1-2]" in status.stdout
    # No controller keeps progress.json now: each rank's step comes from the
    # last heartbeat in its node's stream, for status and top alike (issue #33).
    deadline = time.monotonic() + 30
    while True:
        progress = json.loads(cli(slurm_lab, tmp_path, "status", "orph", "--json").stdout)[
            "progress"]
        steps = {r["rank"]: r["step"] for r in progress}
        if (len(steps) == 2 and all(steps.values()) and max(steps.values()) > 3) \
                or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert [(r["rank"], r["node_rank"]) for r in progress] == [(0, 0), (1, 1)], progress
    assert max(steps.values()) > 3 and all(r["last_progress_s_ago"] < 30 for r in progress)
    top = cli(slurm_lab, tmp_path, "top", "orph", "--once", "--json", "--interval", "0.5")
    assert top.returncode == 0, top.stdout + top.stderr
    frame = json.loads(top.stdout)
    assert [(r["rank"], r["node_rank"], r["silent"]) for r in frame["ranks"]] == [
        (0, 0, False), (1, 1, False)], frame
    # The controller's node logs stopped at the kill; --follow reads the job's streams.
    follow = cli(slurm_lab, tmp_path, "logs", "orph", "--follow")
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert "[node1 node2] [rank1]: rank 1 step 59 attempt 0" in follow.stdout
    assert slurm_lab.wait_queue_empty() == []

    attached = cli(slurm_lab, tmp_path, "attach", "orph")
    assert attached.returncode == 0, attached.stdout + attached.stderr
    assert "run orph: SUCCEEDED" in attached.stdout
    assert "result: world_size=2 restart_count=0 steps=60" in attached.stdout
    assert json.loads((tmp_path / "runs" / "orph" / "result.json").read_text())["world_size"] == 2
    status = cli(slurm_lab, tmp_path, "status", "orph")
    assert " succeeded " in status.stdout.splitlines()[1], status.stdout
    assert state_of(tmp_path, "orph")["state"] == "succeeded"
    assert wait_gone("orph", 15) == set()


def test_status_of_a_job_slurm_forgot_falls_back_to_sacct_then_to_the_agents_records(
        slurm_lab, tmp_path):
    """Slurm keeps an ended job for MinJobAge (30 s here, then up to a minute
    until its purge runs); standing in for that wait, the record names a job
    id Slurm never had. The lab keeps no accounting, so the real `sacct`
    fails and the agents' records answer; then a stand-in `sacct` (first on
    PATH) answers as a cluster with accounting does."""
    path = cluster(tmp_path, "gone", TWO,
                   "workload: {script: steps.py, args: {steps: 2, sleep: 0.1}}\n",
                   program="steps.py")
    started = up(slurm_lab, tmp_path, path, "gone", "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    assert slurm_lab.wait_queue_empty() == []
    record = state_of(tmp_path, "gone")
    assert record["state"] == "running"  # nobody has asked since it ended
    forgotten = "999999"
    for node in record["nodes"]:
        node["connection"]["slurm_job"] = forgotten
    (tmp_path / "runs" / "gone" / "state.json").write_text(json.dumps(record))

    from_agents = cli(slurm_lab, tmp_path, "status", "gone")
    assert from_agents.returncode == 0, from_agents.stderr
    assert f"Slurm job {forgotten}: no longer listed by Slurm" in from_agents.stdout
    assert " succeeded " in from_agents.stdout.splitlines()[1], from_agents.stdout
    for k, host in enumerate(["node1", "node2"]):  # each from its node-K/supervisor.json
        assert f"node {k} ({host}): succeeded, exit 0: torchrun exited 0" in from_agents.stdout
    assert state_of(tmp_path, "gone")["state"] == "succeeded"  # written down once

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sacct = bin_dir / "sacct"
    sacct.write_text(f"#!/bin/sh\necho '{forgotten}|COMPLETED|0:0'\n")
    sacct.chmod(sacct.stat().st_mode | stat.S_IXUSR)
    from_sacct = cli(slurm_lab, tmp_path, "status", "gone",
                     env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert f"Slurm job {forgotten}: COMPLETED (exit 0:0, from sacct)" in from_sacct.stdout, \
        from_sacct.stdout + from_sacct.stderr
