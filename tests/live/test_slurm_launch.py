"""`ddp-orch up` with backend: slurm, against a real slurmctld and slurmd (tests/labs/slurmlab.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time

import pytest

from conftest import ROOT, every_file_holding, run_cli, start_cli, wait_for_lines
from procscan import run_pids, wait_gone, worker_pids

pytestmark = pytest.mark.live
PROGRAMS = os.path.join(ROOT, "tests", "programs")
PYTHON = sys.executable


def cluster(tmp_path, name: str, nodes: str, workload: str, extra: str = "",
            program: str = "") -> str:
    """``NAME.yaml`` for the lab's Slurm; ``program``: copy it from tests/programs too."""
    if program:
        shutil.copy(os.path.join(PROGRAMS, program), tmp_path)
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nbackend: slurm\npython: {PYTHON}\n{extra}"
                    f"nodes: {nodes}\n{workload}")
    return str(path)


def up(slurm_lab, tmp_path, cluster_file: str, run_id: str, *extra: str, timeout: float = 180):
    return run_cli("up", cluster_file, "--run-id", run_id, "--runs-dir", str(tmp_path / "runs"),
                   "--grace", "3", *extra, env=slurm_lab.env(), timeout=timeout)


def start_up(slurm_lab, tmp_path, cluster_file: str, run_id: str, *extra: str):
    return start_cli("up", cluster_file, "--run-id", run_id, "--runs-dir",
                     str(tmp_path / "runs"), "--grace", "3", *extra, env=slurm_lab.env())


def state_of(tmp_path, run_id: str) -> dict:
    return json.loads((tmp_path / "runs" / run_id / "state.json").read_text())


def state_of_or_none(tmp_path, run_id: str) -> str | None:
    """The recorded state, or None before the record exists."""
    try:
        return state_of(tmp_path, run_id)["state"]
    except (OSError, ValueError):
        return None


SEED_SECRET = "hf_s33d-layout-t0ken"


def test_seed_layout_on_two_slurm_nodes(slurm_lab, tmp_path):
    """3,4,5 + 0,1,2,3: world size 7, the ranks where the plan puts them, and
    CUDA_VISIBLE_DEVICES in the user's order inside Slurm's GRES allocation."""
    path = cluster(tmp_path, "seed", "[{host: node1, gpus: '3,4,5'}, {host: node2, gpus: [0, 1, 2, 3]}]",
                   "workload: {name: linear, args: {epochs: 1, samples: 560, "
                   "global_batch_size: 28}}\n",
                   extra=f"device: cpu\n"
                         f"env: {{HF_TOKEN: {SEED_SECRET}, WANDB_PROJECT: seed-layout}}\n")
    result = up(slurm_lab, tmp_path, path, "seed", timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    run = tmp_path / "runs" / "seed"
    res = json.loads((run / "result.json").read_text())
    plan = json.loads((run / "plan.json").read_text())
    table = sorted(res["rank_table"], key=lambda r: r["rank"])
    assert res["world_size"] == 7 == plan["world_size"]
    assert [(r["rank"], r["node_rank"], r["local_rank"]) for r in table] == [
        (p["rank"], p["node_rank"], p["local_rank"]) for p in plan["ranks"]]
    assert [p["host"] for p in plan["ranks"]] == ["node1"] * 3 + ["node2"] * 4
    assert {r["cuda_visible_devices"] for r in table[:3]} == {"3,4,5"}
    assert {r["cuda_visible_devices"] for r in table[3:]} == {"0,1,2,3"}
    assert "[node0 node1] [rank0]:" in result.stdout
    assert "sbatch" not in result.stderr
    assert slurm_lab.wait_queue_empty() == []
    # The secret reached the job through sbatch's environment: named in
    # job.json, its value in no file of the shared run directory.
    job = json.loads((run / "job.json").read_text())
    assert [n["secret_env"] for n in job["nodes"]] == [["HF_TOKEN"], ["HF_TOKEN"]]
    assert [n["spec"]["env"]["WANDB_PROJECT"] for n in job["nodes"]] == ["seed-layout"] * 2
    assert every_file_holding(run, SEED_SECRET) == []


def test_count_mode_with_cpu_processes(slurm_lab, tmp_path):
    """nodes: {count: 2, procs: 2}: Slurm picks the hosts; the record names them."""
    path = cluster(tmp_path, "count", "{count: 2, procs: 2}", "workload: {name: noop}\n",
                   extra="env: {API_TOKEN: s3cr3t-t0ken-value}\n")
    dry = run_cli("up", path, "--dry-run", "--run-id", "count-dry", env=slurm_lab.env())
    assert "<slurm node 0>" in dry.stdout and "chosen by Slurm" in dry.stdout
    result = up(slurm_lab, tmp_path, path, "count")
    assert result.returncode == 0, result.stdout + result.stderr
    run = tmp_path / "runs" / "count"
    plan = json.loads((run / "plan.json").read_text())
    hosts = [n["host"] for n in plan["nodes"]]
    assert len(set(hosts)) == 2 and all(h in slurm_lab.nodes for h in hosts)
    assert plan["world_size"] == 4
    assert isinstance(plan["master_port"], int)
    assert json.loads((run / "result.json").read_text())["world_size"] == 4
    assert [n["host"] for n in state_of(tmp_path, "count")["nodes"]] == hosts
    # The secret reached the job through sbatch's environment, not the shared disk.
    for name in ("job.json", "job.sbatch", "plan.json", "state.json"):
        assert "s3cr3t-t0ken-value" not in (run / name).read_text(), name


def test_each_ranks_threads_are_the_cpus_slurm_allocated_not_the_whole_node(slurm_lab, tmp_path):
    """The lab binds no task to its CPUs (task/none), as many sites don't: a
    one-rank node was given one CPU (``--cpus-per-task=1``), so its rank runs
    one thread, not one per core of the machine it shares with other jobs."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core here: the whole node and the allocation are the same")
    path = cluster(tmp_path, "slurm-omp", "[{host: node1, procs: 1}, {host: node2, procs: 1}]",
                   "workload: {script: echo_env.py}\n", program="echo_env.py")
    result = up(slurm_lab, tmp_path, path, "slurm-omp")
    assert result.returncode == 0, result.stdout + result.stderr
    res = json.loads((tmp_path / "runs" / "slurm-omp" / "result.json").read_text())
    assert [r["omp_num_threads"] for r in res["ranks"]] == ["1", "1"]


def test_a_rank_that_raises_is_the_root_cause_and_nothing_stays_queued(slurm_lab, tmp_path):
    path = cluster(tmp_path, "slurm-raise", "[{host: node1, procs: 1}, {host: node2, procs: 2}]",
                   "workload: {script: fail_on_rank.py, args: {rank: 2}}\n",
                   program="fail_on_rank.py")
    result = up(slurm_lab, tmp_path, path, "slurm-raise")
    assert result.returncode == 1, result.stdout + result.stderr
    summary = result.stdout.split("\nrun slurm-raise: ")[1]
    assert summary.startswith("FAILED")
    assert "root cause: node 1 (node2)" in summary
    assert "rank 2" in summary and "injected failure on rank 2" in summary
    assert slurm_lab.wait_queue_empty() == []
    assert wait_gone("slurm-raise", 15) == set()
    assert (tmp_path / "runs" / "slurm-raise" / "errors" / "node-1" / "rank-2.json").exists()


def test_ctrl_c_cancels_the_job_and_leaves_nothing(slurm_lab, tmp_path):
    path = cluster(tmp_path, "slurm-ctrlc", "[{host: node1, procs: 1}, {host: node2, procs: 1}]",
                   "workload: {script: sleeper.py}\n", program="sleeper.py")
    proc = start_up(slurm_lab, tmp_path, path, "slurm-ctrlc")
    try:
        wait_for_lines(proc, "training", 2)
        # the job's agents are the run's too
        assert run_pids("slurm-ctrlc") > worker_pids("slurm-ctrlc")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    # The controller's own words, not a node's line that happens to hold them.
    ours = [line for line in out.splitlines() if not line.startswith("[node")]
    assert "ddp-orch: interrupted by Ctrl-C on the controller; stopping every node (press Ctrl-C " \
           "again to kill at once)" in ours, out
    summary = out.split("\nrun slurm-ctrlc: ")[1]
    assert summary.startswith("INTERRUPTED")
    for k, host in enumerate(["node1", "node2"]):
        assert re.search(rf"^  {k}\s+{host}\s+stopped\s", summary, re.M), summary
    # Cancelled (scancel), not a job that ended by itself: Slurm keeps the
    # ended job's state for MinJobAge (30 s in the lab).
    job = state_of(tmp_path, "slurm-ctrlc")["nodes"][0]["connection"]["slurm_job"]
    assert "JobState=CANCELLED" in slurm_lab.run("scontrol", "show", "job", job)
    assert slurm_lab.wait_queue_empty() == []
    assert wait_gone("slurm-ctrlc", 15) == set()
    assert state_of(tmp_path, "slurm-ctrlc")["state"] == "interrupted"


def test_down_of_a_running_job_and_status_and_logs(slurm_lab, tmp_path):
    path = cluster(tmp_path, "down", "[{host: node1, procs: 1}, {host: node2, procs: 1}]",
                   "workload: {script: sleeper.py}\n", program="sleeper.py")
    proc = start_up(slurm_lab, tmp_path, path, "down")
    runs = str(tmp_path / "runs")
    try:
        wait_for_lines(proc, "training", 2)
        status = run_cli("status", "down", "--runs-dir", runs, env=slurm_lab.env())
        assert status.returncode == 0, status.stderr
        assert "RUNNING" in status.stdout and "Slurm job" in status.stdout
        logs = run_cli("logs", "down", "--runs-dir", runs, env=slurm_lab.env())
        assert "training" in logs.stdout
        ps = run_cli("ps", "--runs-dir", runs, env=slurm_lab.env())
        assert "down" in ps.stdout and "slurm" in ps.stdout
        down = run_cli("down", "down", "--runs-dir", runs, env=slurm_lab.env(), timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        assert slurm_lab.wait_queue_empty() == []
        assert wait_gone("down", 15) == set()
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (1, 130), out  # down stops the controller too
    assert run_pids("down") == set()


def test_pending_job_shows_its_reason_and_the_queue_timeout_ends_it(slurm_lab, tmp_path):
    """The one-node partition is full: the job waits (Resources). While it
    waits, its run is PENDING in ps, ps --json and status (issue #31: it was
    recorded as running), a live run that prune keeps and down ends; a second
    job waits until its queue timeout cancels it."""
    blocker = slurm_lab.run("sbatch", "--parsable", "--partition=solo", "--exclusive",
                            "--output=/dev/null", "--wrap=sleep 120").strip()
    runs = str(tmp_path / "runs")
    try:
        path = cluster(tmp_path, "pending", "[{host: node1, procs: 1}]",
                       "workload: {name: noop}\n", extra="slurm: {partition: solo}\n")
        queued = start_up(slurm_lab, tmp_path, path, "queued", "--queue-timeout", "120")
        try:
            deadline = time.monotonic() + 60
            while state_of_or_none(tmp_path, "queued") != "pending":
                assert time.monotonic() < deadline and queued.poll() is None, \
                    state_of_or_none(tmp_path, "queued")
                time.sleep(0.3)
            listed = json.loads(run_cli("ps", "--json", "--runs-dir", runs,
                                        env=slurm_lab.env()).stdout)
            assert [r["state"] for r in listed["runs"] if r["run_id"] == "queued"] == \
                ["pending"], listed
            assert " pending " in run_cli("ps", "--runs-dir", runs, env=slurm_lab.env()).stdout
            status = run_cli("status", "queued", "--runs-dir", runs, env=slurm_lab.env())
            assert " pending " in status.stdout.splitlines()[1], status.stdout
            assert "PENDING" in status.stdout and "Slurm job" in status.stdout, status.stdout
            pruned = run_cli("prune", "queued", "--runs-dir", runs, env=slurm_lab.env())
            assert "live: it is pending" in pruned.stdout + pruned.stderr, pruned.stdout
            assert os.path.isdir(os.path.join(runs, "queued"))
            down = run_cli("down", "queued", "--runs-dir", runs, env=slurm_lab.env(),
                           timeout=120)
            assert down.returncode == 0, down.stdout + down.stderr
            out, _ = queued.communicate(timeout=60)
        finally:
            if queued.poll() is None:
                queued.kill()
        assert queued.returncode in (1, 130), out
        assert state_of(tmp_path, "queued")["state"] in ("interrupted", "failed")
        started = time.monotonic()
        result = up(slurm_lab, tmp_path, path, "pending", "--queue-timeout", "4")
        assert result.returncode == 1, result.stdout + result.stderr
        assert time.monotonic() - started < 60
        assert "pending (Resources)" in result.stdout + result.stderr or \
            "pending (Priority)" in result.stdout + result.stderr
        assert "queue timeout" in result.stdout
        assert slurm_lab.wait_queue_empty(keep=(blocker,)) == []
        assert state_of(tmp_path, "pending")["state"] == "failed"
    finally:
        slurm_lab.run("scancel", blocker, check=False)


@pytest.mark.parametrize("problem, needle", [
    ("nodes: [{host: node9, procs: 1}]\n", "Slurm has no node 'node9'"),
    ("slurm: {partition: nosuch}\nnodes: [{host: node1, procs: 1}]\n", "no partition 'nosuch'"),
    ("nodes: [{host: node1, gpus: '7,8'}]\n", "GPU 8 is not on node1"),
    ("nodes: [{host: node1, procs: 9}]\n", "9 processes but node1 has 8 CPUs"),
])
def test_bad_input_is_named_and_nothing_is_queued(slurm_lab, tmp_path, problem, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(f"backend: slurm\npython: {PYTHON}\n{problem}workload: {{name: noop}}\n")
    before = slurm_lab.queue()
    result = up(slurm_lab, tmp_path, str(path), "bad")
    assert result.returncode == 1
    assert needle in result.stderr and "nothing was submitted" in result.stderr
    assert "Traceback" not in result.stderr
    assert set(slurm_lab.queue()) <= set(before)  # nothing new (an old job may be ending)
    check = run_cli("check", str(path), env=slurm_lab.env())
    assert check.returncode == 1 and needle in check.stdout


def test_slurm_rejection_is_shown_and_check_passes_on_a_good_file(slurm_lab, tmp_path):
    path = cluster(tmp_path, "reject", "[{host: node1, procs: 1}]", "workload: {name: noop}\n",
                   extra="slurm: {extra: ['--constraint=nosuchfeature']}\n")
    result = up(slurm_lab, tmp_path, path, "reject")
    assert result.returncode == 1
    assert "Slurm rejected the job" in result.stderr and "Traceback" not in result.stderr
    good = cluster(tmp_path, "good", "[{host: node1, gpus: '0,1'}, {host: node2, procs: 2}]",
                   "workload: {name: noop}\n", extra="device: cpu\nslurm: {partition: debug}\n")
    check = run_cli("check", good, env=slurm_lab.env())
    assert check.returncode == 0, check.stdout + check.stderr
    assert "partition" in check.stdout and "run directory" in check.stdout


def test_sbatch_missing_is_named(tmp_path):
    path = cluster(tmp_path, "nosbatch", "[{host: node1, procs: 1}]", "workload: {name: noop}\n")
    env = {"PATH": "/nonexistent"}
    result = run_cli("up", path, "--runs-dir", str(tmp_path / "runs"), env=env)
    assert result.returncode == 1
    assert "sbatch is not found" in result.stderr and "login or submit host" in result.stderr


def test_pinned_gpus_that_another_job_holds_are_refused_by_name(slurm_lab, tmp_path):
    """Another job holds GPUs 0-1 of node1, so Slurm gives this job 2-4 there:
    the pinned GPU 1 is not ours, and the node says so instead of using it."""
    blocker = slurm_lab.run("sbatch", "--parsable", "--nodelist=node1", "--gres=gpu:2",
                            "--output=/dev/null", "--wrap=sleep 120").strip()
    try:
        path = cluster(tmp_path, "held", "[{host: node1, gpus: '1,2'}, {host: node2, gpus: 0}]",
                       "workload: {name: noop}\n", extra="device: cpu\n")
        result = up(slurm_lab, tmp_path, path, "held")
        assert result.returncode == 1, result.stdout + result.stderr
        summary = result.stdout.split("\nrun held: ")[1]
        assert "root cause: node 0 (node1): GPU 1 is not among the GPUs Slurm allocated" in summary
        assert "node2  stopped" in summary
        assert slurm_lab.wait_queue_empty(keep=(blocker,)) == []
        assert wait_gone("held", 15) == set()
    finally:
        slurm_lab.run("scancel", blocker, check=False)


def test_stacks_of_a_slurm_run_come_from_a_step_in_the_job(slurm_lab, tmp_path):
    path = cluster(tmp_path, "slurm-stk", "[{host: node1, procs: 2}, {host: node2, procs: 1}]",
                   "workload: {script: hang_rank2.py}\n", program="hang_rank2.py")
    proc = start_up(slurm_lab, tmp_path, path, "slurm-stk")
    try:
        wait_for_lines(proc, "training", 3)
        result = run_cli("stacks", "slurm-stk", "--runs-dir", str(tmp_path / "runs"),
                         env=slurm_lab.env(), timeout=90)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "ranks 0-1 (node1): all_reduce <- hang_rank2.py:" in result.stdout
        assert "! rank 2 (node2): <module> (hang_rank2.py:" in result.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=90)
    assert slurm_lab.wait_queue_empty() == []
    assert wait_gone("slurm-stk", 15) == set()


def test_detach_leaves_the_job_to_slurm_and_attach_follows_it_to_the_result(slurm_lab, tmp_path):
    path = cluster(tmp_path, "sdet", "[{host: node1, procs: 2}, {host: node2, procs: 1}]",
                   "workload: {script: steps.py, args: {steps: 40, sleep: 0.25}}\n",
                   program="steps.py")
    started = up(slurm_lab, tmp_path, path, "sdet", "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    assert "run sdet is running on node 0 (node1), node 1 (node2)" in started.stdout
    assert slurm_lab.queue(), "the job was cancelled with its controller"
    assert state_of(tmp_path, "sdet")["owner"] == {"holder": "scheduler", "detached": True}
    status = run_cli("status", "sdet", "--runs-dir", str(tmp_path / "runs"), env=slurm_lab.env())
    assert " running " in status.stdout.splitlines()[1], status.stdout
    attached = run_cli("attach", "sdet", "--runs-dir", str(tmp_path / "runs"),
                       env=slurm_lab.env(), timeout=120)
    assert attached.returncode == 0, attached.stdout + attached.stderr
    assert "[node0 node1] [rank0]: rank 0 step 0 attempt 0" in attached.stdout
    assert "[node1 node2] [rank2]: rank 2 step 39 attempt 0" in attached.stdout
    assert "run sdet: SUCCEEDED" in attached.stdout
    assert "result: world_size=3 restart_count=0 steps=40" in attached.stdout
    assert slurm_lab.wait_queue_empty() == []
    state = state_of(tmp_path, "sdet")
    assert state["state"] == "succeeded"
    # its end as the nodes' agents recorded it (the last exit code written), not attach's
    assert state["ended"] == max(os.path.getmtime(os.path.join(n["run_dir"], "supervisor.json"))
                                 for n in state["nodes"])


def test_a_home_python_is_the_nodes_own_in_check_and_up(slurm_lab, tmp_path):
    """``python: ~/venv/bin/python`` under Slurm (issue 43): the batch script's
    shell fills in the job's home (the submitter's, exported), and each
    node's agent the same for torchrun."""
    home = tmp_path.parent / f"{tmp_path.name}-home"  # beside the code directory, not in it
    home.mkdir()
    os.symlink(os.path.dirname(os.path.dirname(PYTHON)), home / "venv")
    path = cluster(tmp_path, "slurm-homepy", "[{host: node1, procs: 1}, {host: node2, procs: 1}]",
                   "workload: {script: steps.py, args: [--steps, 2, --sleep, '0.1']}\n",
                   program="steps.py")
    with open(path, encoding="utf-8") as fh:
        text = fh.read().replace(f"python: {PYTHON}", "python: ~/venv/bin/python")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    env = slurm_lab.env({**os.environ, "HOME": str(home)})
    checked = run_cli("check", path, env=env, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    result = run_cli("up", path, "--run-id", "slurm-homepy", "--runs-dir",
                     str(tmp_path / "runs"), "--grace", "3", env=env, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 1 step 1 attempt 0" in result.stdout
    assert slurm_lab.wait_queue_empty() == []
    assert wait_gone("slurm-homepy", 15) == set()


def test_ctrl_c_while_sbatch_answers_cancels_the_job_it_queued(slurm_lab, tmp_path):
    """Ctrl-C (or `ddp-orch down`'s SIGTERM) between the job's submission and
    the controller's first record of its id (issue 43): the signal waits
    until sbatch has answered and the id is recorded, then the job is
    cancelled like any interrupted run's; none stays queued."""
    slow = tmp_path / "bin"
    slow.mkdir()
    marker = tmp_path / "submitted"
    (slow / "sbatch").write_text(f"#!/bin/sh\nout=$({shutil.which('sbatch')} \"$@\") || exit $?\n"
                                 f"touch {marker}\nsleep 3\necho \"$out\"\n")
    (slow / "sbatch").chmod(0o755)
    path = cluster(tmp_path, "slurm-early", "[{host: node1, procs: 1}, {host: node2, procs: 1}]",
                   "workload: {script: sleeper.py}\n", program="sleeper.py")
    env = {**slurm_lab.env(), "PATH": f"{slow}:{os.environ['PATH']}"}
    proc = start_cli("up", path, "--run-id", "slurm-early", "--runs-dir", str(tmp_path / "runs"),
                     "--grace", "3", env=env)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.05)
        assert len(slurm_lab.queue()) == 1  # queued, and sbatch has not answered yet
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert slurm_lab.wait_queue_empty() == [], out
    assert wait_gone("slurm-early", 15) == set()
    assert state_of(tmp_path, "slurm-early")["state"] == "interrupted"
