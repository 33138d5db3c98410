"""`ddp-orch up` across real sshd hosts on loopback (the SSH lab)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, every_file_holding, run_cli, start_cli, wait_for_lines
from labhome import lab_cluster, lab_home, lab_job
from procscan import wait_gone

pytestmark = pytest.mark.live
PROGRAMS = os.path.join(ROOT, "tests", "programs")
TWO_NODES = ["{host: node0, procs: 2}", "{host: node1, procs: 1}"]
HOSTILE = "it's \"quoted\" $(touch /tmp/ddp-orch-pwned) `id` ; rm -rf / \n second line \\ $HOME"


def toy_alone(tmp_path) -> dict:
    """``python -m workloads.toy`` at its defaults in one process: the
    oracle for the same workload dealt over many ranks."""
    result_file = tmp_path / "alone.json"
    env = {**os.environ, "PYTHONPATH": ROOT, "DDP_ORCH_DEVICE": "cpu",
           "OMP_NUM_THREADS": "1", "DDP_ORCH_RESULT_FILE": str(result_file)}
    proc = subprocess.run([sys.executable, "-m", "workloads.toy"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(result_file.read_text())


@pytest.mark.parametrize("ssh_lab", [3], indirect=True)
def test_seed_layout_over_two_ssh_hosts(ssh_lab, tmp_path):
    """gpus 3,4,5 + 0,1,2,3 with device cpu: 7 processes, ranks as planned,
    running toy at its defaults. Its global batch of 4 over 7 ranks leaves
    three ranks an empty share each step (harness.data.BatchSplit), and the
    gang still takes the one-process run's steps and ends at its losses.
    (This was also test_wl_seed_layout.py's toy case, a second 7-rank gang
    on localhost; the layout itself is the same there for mnist.)"""
    env = lab_home(ssh_lab, tmp_path)
    cluster = lab_cluster(ssh_lab, tmp_path, ["{host: node0, gpus: '3,4,5'}",
                                              "{host: node1, gpus: [0, 1, 2, 3]}"],
                          "workload: {name: toy}\n", extra="device: cpu\n", name="seed")
    result = run_cli("up", cluster, "--run-id", "seed-layout", "--runs-dir", str(tmp_path / "runs"),
                     env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    res = json.loads((tmp_path / "runs" / "seed-layout" / "result.json").read_text())
    assert res["world_size"] == 7 and res["run_id"] == "seed-layout"
    table = sorted(res["rank_table"], key=lambda r: r["rank"])
    assert [(r["rank"], r["node_rank"], r["local_rank"]) for r in table] == [
        (0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 1, 0), (4, 1, 1), (5, 1, 2), (6, 1, 3)]
    assert {r["cuda_visible_devices"] for r in table[:3]} == {"3,4,5"}
    assert {r["cuda_visible_devices"] for r in table[3:]} == {"0,1,2,3"}
    assert {r["device"] for r in table} == {"cpu"}
    assert len(set(res["checksums"])) == 1 and res["replicas_identical"] is True
    assert "[node1 node1] [rank3]:" in result.stdout or "[node0 node0] [rank0]:" in result.stdout
    node1 = tmp_path / "remote" / "runs" / "seed-layout" / "node-1"
    assert (node1 / "code" / "workloads").is_dir()
    for private in (node1.parent, node1):
        assert private.stat().st_mode & 0o777 == 0o700
    # toy's global batch 4 over 7 ranks: the first four take one sample each
    assert res["config"]["global_batch_size"] == 4
    assert res["batch_split"] == [1, 1, 1, 1, 0, 0, 0]
    single = toy_alone(tmp_path)
    assert res["timing"]["steps"] == single["timing"]["steps"] == 6
    assert res["timing"]["samples"] == single["timing"]["samples"] == 15
    for key in ("final_loss", "train_loss", "test_loss"):
        assert res["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5), key
    assert (res["metrics"]["train_total"], res["metrics"]["test_total"]) == (5, 2)


def test_a_plain_run_prints_no_c10d_hostname_line_nor_torchruns_thread_banner(make_ssh_lab,
                                                                            tmp_path):
    """Issue #45: on hosts without reverse DNS every store connection made
    c10d print "The hostname of the client socket cannot be retrieved"
    (nine lines for 7 ranks), and every node printed torchrun's
    OMP_NUM_THREADS banner. Neither is on the console now; c10d's lines are
    still in the node's log, and each rank's threads are its node's cores
    over its ranks (here: node 0 runs 2, node 1 one)."""
    lab = make_ssh_lab(2, reverse_dns=False)
    shutil.copy(os.path.join(PROGRAMS, "echo_env.py"), tmp_path / "echo_env.py")
    env = lab_home(lab, tmp_path)
    cluster = lab_cluster(lab, tmp_path, TWO_NODES, "workload: {script: echo_env.py}\n",
                          name="plain")
    result = run_cli("up", cluster, "--run-id", "plain-console", "--runs-dir",
                     str(tmp_path / "runs"), env=env, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "[c10d] The hostname of the client socket cannot be retrieved" not in out, out
    assert "Setting OMP_NUM_THREADS" not in out and "*****" not in out, out
    log = (tmp_path / "runs" / "plain-console" / "node-0.log").read_text()
    assert "[c10d] The hostname of the client socket cannot be retrieved. err=-3" in log
    cores = len(os.sched_getaffinity(0))  # the lab's hosts are this machine
    res = json.loads((tmp_path / "runs" / "plain-console" / "result.json").read_text())
    assert sorted((r["rank"], r["omp_num_threads"]) for r in res["ranks"]) == [
        (0, str(max(1, cores // 2))), (1, str(max(1, cores // 2))), (2, str(cores))]
    assert wait_gone("plain-console", 15, labs=[lab]) == set()


@pytest.mark.parametrize("ssh_lab", [3], indirect=True)
def test_three_nodes_user_script_and_hostile_values_arrive_verbatim(ssh_lab, tmp_path):
    shutil.copy(os.path.join(PROGRAMS, "echo_env.py"), tmp_path / "echo_env.py")
    env = lab_home(ssh_lab, tmp_path)
    cluster = lab_cluster(
        ssh_lab, tmp_path, ["{host: node0, procs: 1}", "{host: node1, procs: 1}",
                            "{host: node2, procs: 1}"],
        "workload:\n  script: echo_env.py\n  args: {tag: " + json.dumps(HOSTILE) + "}\n",
        extra="env:\n  HOSTILE: " + json.dumps(HOSTILE) + "\n", name="three")
    if os.path.exists("/tmp/ddp-orch-pwned"):
        os.unlink("/tmp/ddp-orch-pwned")
    result = run_cli("up", cluster, "--run-id", "three", "--runs-dir", str(tmp_path / "runs"),
                     env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    res = json.loads((tmp_path / "runs" / "three" / "result.json").read_text())
    assert res["world_size"] == 3
    for seen in res["ranks"]:
        assert seen["hostile"] == HOSTILE
        assert seen["argv"] == ["--tag", HOSTILE]
        assert seen["node_rank"] == str(seen["rank"])
    assert not os.path.exists("/tmp/ddp-orch-pwned")
    summary = result.stdout.split("\nrun three: ")[1]
    assert summary.startswith("SUCCEEDED")
    for k in range(3):
        assert f"  {k}     node{k}" in summary


def test_unknown_host_key_is_refused_with_the_fix(ssh_lab, tmp_path):
    env = lab_home(ssh_lab, tmp_path, omit_known=("node1",))
    cluster = lab_cluster(ssh_lab, tmp_path, ["{host: node0, procs: 1}", "{host: node1, procs: 1}"],
                          "workload: {name: noop}\n", name="hostkey")
    result = run_cli("up", cluster, "--run-id", "hostkey", "--runs-dir", str(tmp_path / "runs"),
                     env=env, timeout=120)
    assert result.returncode == 1
    assert "node 1 (node1)" in result.stderr and "host key" in result.stderr.lower()
    assert "accept-new" in result.stderr and "Traceback" not in result.stderr
    # Nothing started anywhere: node 0's run directory (sent right behind its
    # agent, so it may have been made) is discarded with the launch.
    remote = tmp_path / "remote" / "runs" / "hostkey"
    assert (sorted(p.name for p in remote.iterdir()) if remote.exists() else []) == []
    state = json.loads((tmp_path / "runs" / "hostkey" / "state.json").read_text())
    assert state["state"] == "failed"


def test_a_worker_crash_on_node1_tears_down_node0(ssh_lab, tmp_path):
    env, cluster = lab_job(ssh_lab, tmp_path, "crash", "fail_on_rank.py", TWO_NODES,
                           args="{rank: 2}")
    result = run_cli("up", cluster, "--run-id", "crash", "--runs-dir", str(tmp_path / "runs"),
                     "--grace", "3", env=env, timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "root cause: node 1 (node1)" in result.stdout
    assert "rank 2 (local rank 0) failed: RuntimeError: injected failure on rank 2" in result.stdout
    assert wait_gone("crash", 15, labs=[ssh_lab]) == set()
    state = json.loads((tmp_path / "runs" / "crash" / "state.json").read_text())
    assert state["state"] == "failed"
    assert (tmp_path / "runs" / "crash" / "node-0.log").stat().st_size > 0
    error = json.loads((tmp_path / "runs" / "crash" / "errors" / "node-1" / "rank-2.json").read_text())
    assert "injected failure on rank 2" in json.dumps(error)


@pytest.mark.parametrize("fail", [False, True])
def test_no_file_on_the_controller_or_the_nodes_holds_a_secret(ssh_lab, tmp_path, fail):
    """Over SSH: the run directory here and each node's own, searched file by
    file (see the local twin in test_local_launch.py)."""
    shutil.copy(os.path.join(PROGRAMS, "print_secret.py"), tmp_path)
    env = lab_home(ssh_lab, tmp_path)
    cluster = lab_cluster(ssh_lab, tmp_path, ["{host: node0, procs: 1}", "{host: node1, procs: 1}"],
                          "workload:\n  script: print_secret.py\n"
                          + ("  args: {fail: true}\n" if fail else ""),
                          extra='env: {HF_TOKEN: "hf_s3cr\\u0033t_value"}\n', name="sshsec")
    run_id = f"sshsec-{fail}".lower()
    result = run_cli("up", cluster, "--run-id", run_id, "--runs-dir", str(tmp_path / "runs"),
                     env=env, timeout=180)
    assert result.returncode == (1 if fail else 0), result.stdout + result.stderr
    assert "hf_s3cr3t_value" not in result.stdout + result.stderr
    assert every_file_holding(tmp_path / "runs" / run_id, "hf_s3cr3t_value") == []
    assert every_file_holding(tmp_path / "remote" / "runs" / run_id, "hf_s3cr3t_value") == []
    assert "token is ********" in (tmp_path / "runs" / run_id / "node-1.log").read_text()
    if fail:
        assert "could not log in with ********" in result.stdout


@pytest.mark.parametrize("ssh_lab", [2], indirect=True)
def test_an_exception_without_record_is_quoted_as_the_root_cause(ssh_lab, tmp_path):
    """No @record in the script: the worker shim writes torchrun's error file,
    so the root cause quotes the exception with its file and line."""
    env, cluster = lab_job(ssh_lab, tmp_path, "plain", "plain_raise.py",
                           ["{host: node0, procs: 1}", "{host: node1, procs: 2}"])
    result = run_cli("up", cluster, "--run-id", "plain", "--runs-dir", str(tmp_path / "runs"),
                     "--grace", "3", env=env, timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    summary = result.stdout.split("\nrun plain: ")[1]
    assert ("root cause: node 1 (node1): torchrun exited 1; rank 2 (local rank 1) failed: "
            "RuntimeError: planned crash on rank 2 (plain_raise.py:10)") in summary
    fetched = json.loads((tmp_path / "runs" / "plain" / "errors" / "node-1" / "rank-2.json")
                         .read_text())
    assert fetched["message"]["message"] == "RuntimeError: planned crash on rank 2"


@pytest.mark.parametrize("ssh_lab", [2], indirect=True)
def test_stacks_of_a_live_run_on_two_hosts_list_every_rank(ssh_lab, tmp_path):
    """Three ranks on two lab hosts, one of them hung elsewhere: every rank is
    listed with a frame of the user's script, and rank 2 is marked."""
    env, cluster = lab_job(ssh_lab, tmp_path, "stk", "hang_rank2.py", TWO_NODES)
    runs = str(tmp_path / "runs")
    proc = start_cli("up", cluster, "--run-id", "stk", "--runs-dir", runs, "--grace", "3", env=env)
    try:
        wait_for_lines(proc, "training", 3)
        # Twice: a dump leaves every rank where it was (the first one races the
        # flight recorders' first dumps, which import torch's compiler in a
        # thread of each rank; reading that thread once killed a rank).
        for _ in range(2):
            result = run_cli("stacks", "stk", "--runs-dir", runs, env=env, timeout=60)
            assert result.returncode == 0, result.stdout + result.stderr
            assert "ranks 0-1 (node0): all_reduce <- hang_rank2.py:" in result.stdout, \
                result.stdout
            assert "! rank 2 (node1): <module> (hang_rank2.py:" in result.stdout
        assert proc.poll() is None
    finally:
        proc.send_signal(2)
        proc.communicate(timeout=60)
    assert wait_gone("stk", 15, labs=[ssh_lab]) == set()


# A hang across two hosts, caught and rank 2 named: test_hang.py's
# test_a_real_hang_is_caught_and_the_odd_rank_named runs it on two SSH lab
# hosts, with every check this test made (and the teardown bound).


@pytest.fixture
def venv_in_the_nodes_home():
    """``~/<name>/bin/python`` in the lab hosts' home (the SSH login's: this
    user's own, from passwd), a link to this venv, so that a ``~/`` python
    is the node's and nothing else; removed afterwards."""
    name = f".ddp-orch-lab-venv-{os.getpid()}"
    link = os.path.join(os.path.expanduser("~"), name)
    os.symlink(os.path.dirname(os.path.dirname(sys.executable)), link)
    try:
        yield f"~/{name}/bin/python"
    finally:
        os.unlink(link)


def test_a_home_python_is_the_nodes_own_in_check_up_a_kept_run_and_its_agents(
        ssh_lab, tmp_path, venv_in_the_nodes_home):
    """``python: ~/venv/bin/python`` over SSH (issue 43): the node's shell
    fills in its home for every agent of the run: `check`'s, `up`'s, the
    keepers' of a detached run, and `status`'s, which asks them."""
    env, cluster = lab_job(ssh_lab, tmp_path, "homepy", "steps.py",
                           ["{host: node0, procs: 1}", "{host: node1, procs: 1}"],
                           args="[--steps, 3, --sleep, '0.1']")
    text = open(cluster).read().replace(f"python: {sys.executable}",
                                        f"python: {venv_in_the_nodes_home}")
    open(cluster, "w").write(text)
    runs = str(tmp_path / "runs")
    checked = run_cli("check", cluster, env=env, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "cannot run" not in checked.stdout + checked.stderr
    attached = run_cli("up", cluster, "--run-id", "homepy", "--runs-dir", runs, env=env,
                       timeout=180)
    assert attached.returncode == 0, attached.stdout + attached.stderr
    assert "rank 1 step 2 attempt 0" in attached.stdout
    detached = run_cli("up", cluster, "--run-id", "homepy-kept", "--runs-dir", runs,
                       "--detach", env=env, timeout=180)
    assert detached.returncode == 0, detached.stdout + detached.stderr
    followed = run_cli("attach", "homepy-kept", "--runs-dir", runs, env=env, timeout=120)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    status = run_cli("status", "homepy-kept", "--runs-dir", runs, "--json", env=env,
                     timeout=60)
    assert json.loads(status.stdout)["state"] == "succeeded", status.stdout
    assert wait_gone("homepy", 15, labs=[ssh_lab]) == set()
    assert wait_gone("homepy-kept", 15, labs=[ssh_lab]) == set()
