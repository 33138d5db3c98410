"""Real torchrun runs on this machine through `ddp-orch up` (local transport)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from bounds import (AT_ONCE_S, TORCHRUN_ENDS_S, assert_gone_within, assert_stopped_at_once,
                    teardowns)
from conftest import ROOT, every_file_holding, local_job, run_cli
from procscan import wait_gone

pytestmark = pytest.mark.live


def test_linear_on_heterogeneous_local_nodes_converges_with_the_planned_ranks(tmp_path):
    """Two nodes of 1 and 2 processes on this machine: the planned rank
    table, a converging run and the run directory it leaves. (`up --local`,
    one node, runs in tests/workloads/test_wl_orchestrated.py.)"""
    cluster = tmp_path / "two-nodes.yaml"
    cluster.write_text("name: hetero\nnodes:\n  - {host: localhost, procs: 1}\n"
                       "  - {host: localhost, procs: 2}\n"
                       "workload:\n  name: linear\n  args: {epochs: 4, samples: 4000}\n")
    result = run_cli("up", str(cluster), "--runs-dir", str(tmp_path / "runs"), "--run-id", "het")
    assert result.returncode == 0, result.stdout + result.stderr
    run = tmp_path / "runs" / "het"
    res = json.loads((run / "result.json").read_text())
    table = sorted((r["rank"], r["node_rank"], r["local_rank"]) for r in res["rank_table"])
    assert table == [(0, 0, 0), (1, 1, 0), (2, 1, 1)]
    assert res["world_size"] == 3
    assert abs(res["metrics"]["w"] - 2) < 0.05 and abs(res["metrics"]["b"] - 3) < 0.05
    assert "SUCCEEDED" in result.stdout and " w=" in result.stdout
    assert {"cluster.yaml", "plan.json", "state.json", "node-0.log", "node-1.log"} \
        <= set(os.listdir(run))
    assert json.loads((run / "state.json").read_text())["state"] == "succeeded"
    assert "[rank0]:" in (run / "node-0.log").read_text()
    assert oct(os.stat(run).st_mode & 0o777) == "0o700"


def test_a_failing_rank_stops_every_node_and_is_named(tmp_path):
    """README: gone within the grace period (3 s here) "once torchrun has
    ended that node's own ranks": node 1's torchrun ends on its own after
    the rank raised (its error record's time), node 0 is stopped at once
    after that and torn down in the grace period."""
    shutil.copy(os.path.join(ROOT, "tests", "programs", "fail_on_rank.py"), tmp_path)
    cluster = tmp_path / "fail.yaml"
    cluster.write_text("nodes:\n  - {host: localhost, procs: 1}\n  - {host: localhost, procs: 2}\n"
                       "workload:\n  script: fail_on_rank.py\n  args: {rank: 2}\n")
    result = run_cli("up", str(cluster), "--runs-dir", str(tmp_path / "runs"),
                     "--run-id", "failrun", "--grace", "3", timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout
    assert "root cause: node 1 (localhost)" in result.stdout
    assert "injected failure on rank 2" in result.stdout
    state = json.loads((tmp_path / "runs" / "failrun" / "state.json").read_text())
    assert state["state"] == "failed"
    # Rank 0 only sleeps: it did not fail, the controller stopped it.
    assert {o["node_rank"]: o["state"] for o in state["outcomes"]}[0] == "stopped"
    failed_at = state["root_cause"]["failures"][0]["timestamp"]
    node0, node1 = records = teardowns(tmp_path / "runs", "failrun")
    assert node1["reason"] == "torchrun exited" and node1["stopped_at"] is None, node1
    assert node1["torn_down_at"] - failed_at < TORCHRUN_ENDS_S, (failed_at, node1)
    ended_at = node1["torn_down_at"]
    assert_stopped_at_once(node0, ended_at, "stopped: node 1 (localhost) failed (exit 1)")
    assert_gone_within([node0], ended_at, 3)
    took = max(r["torn_down_at"] for r in records) - failed_at
    print(f"a failing rank: every node torn down {took:.1f}s after the rank raised")
    assert wait_gone("failrun", 10) == set()


def test_a_node_that_never_joins_is_named_after_the_start_timeout(tmp_path):
    stuck = os.path.join(ROOT, "tests", "programs", "stuck-python")
    cluster = tmp_path / "stuck.yaml"
    cluster.write_text("nodes:\n  - {host: localhost, procs: 1}\n"
                       f"  - {{host: localhost, procs: 1, python: {stuck}}}\n"
                       "workload: {name: noop}\n")
    result = run_cli("up", str(cluster), "--runs-dir", str(tmp_path / "runs"), "--run-id", "stuck",
                     "--start-timeout", "8", "--grace", "1", timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "not joined: node 1 (localhost)" in result.stdout
    assert "root cause: node 1 (localhost): did not join the rendezvous" in result.stdout
    # README: gone within the start timeout; by the run's own record
    state = json.loads((tmp_path / "runs" / "stuck" / "state.json").read_text())
    assert state["ended"] - state["started"] < 8 + AT_ONCE_S, state
    assert wait_gone("stuck", 10) == set()


@pytest.mark.parametrize("fail,spelt", [(False, "hf_s3cr3t_value"),
                                        (True, "hf_s3cr\\u0033t_value")])
def test_no_stored_file_and_no_output_holds_a_secret(tmp_path, fail, spelt):
    """The value is spelt as it is, or with a YAML escape, in a cluster file
    that lies beside the script (so the script's directory, uploaded, holds
    it), printed by the script, and (failing) raised in its error message:
    every file the run leaves (the nodes' own directories and the bundle are
    inside it here) and everything printed show it masked."""
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(os.path.join(ROOT, "tests", "programs", "print_secret.py"), job)
    cluster = job / "secret.yaml"
    cluster.write_text(f'env: {{HF_TOKEN: "{spelt}"}}\n'
                       "nodes:\n  - {host: localhost, procs: 1}\n  - {host: localhost, procs: 1}\n"
                       "workload:\n  script: print_secret.py\n"
                       + ("  args: {fail: true}\n" if fail else ""))
    result = run_cli("up", str(cluster), "--runs-dir", str(tmp_path / "runs"), "--run-id", "sec")
    assert result.returncode == (1 if fail else 0), result.stdout + result.stderr
    run = tmp_path / "runs" / "sec"
    assert "token is ********" in result.stdout
    assert "hf_s3cr3t_value" not in result.stdout + result.stderr
    assert every_file_holding(run, "hf_s3cr3t_value") == []
    assert "token is ********" in (run / "node-0.log").read_text()
    assert '"********"' in (run / "cluster.yaml").read_text()
    shipped = run / "node-0" / "project" / "secret.yaml"  # the uploaded copy, masked
    assert shipped.read_text() == (run / "cluster.yaml").read_text()
    if fail:
        assert "could not log in with ********" in result.stdout
        assert "could not log in with ********" in (run / "state.json").read_text()


def test_settings_that_read_false_are_not_secrets_in_a_kept_run(tmp_path):
    """``TOKENIZERS_PARALLELISM: "false"`` (a secret-looking name, an
    ordinary value) beside a real token, in a kept run (``--max-restarts``):
    the run ends SUCCEEDED with exit 0, node 0's ``finished`` record (JSON
    booleans inside) is read, lines that print ``false`` are shown as
    printed, and the token is still masked everywhere."""
    cluster = local_job(tmp_path, "hf", "hf_style.py",
                        "[{host: localhost, procs: 1}, {host: localhost, procs: 1}]",
                        extra='env: {TOKENIZERS_PARALLELISM: "false", '
                              'HF_TOKEN: hf_realtoken_1234}\n')
    result = run_cli("up", cluster, "--runs-dir", str(tmp_path / "runs"), "--run-id", "hf",
                     "--max-restarts", "1")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "SUCCEEDED" in out and "FAILED" not in out
    assert "rank 0: shuffle=false tokenizers=false" in out
    assert "rank 1: shuffle=false tokenizers=false" in out
    assert "logged in with ********" in out and "hf_realtoken_1234" not in out
    run = tmp_path / "runs" / "hf"
    assert json.loads((run / "state.json").read_text())["state"] == "succeeded"
    assert every_file_holding(run, "hf_realtoken_1234") == []
    assert "TOKENIZERS_PARALLELISM: \"false\"" in (run / "cluster.yaml").read_text()


def test_a_kept_runs_failing_rank_shows_one_rank_prefix_per_line(tmp_path):
    """A kept run (``--max-restarts``) whose rank 2 raises: torch writes the
    traceback as ``[rank2]: ...`` lines, and every worker line reaches the
    console and the node log with exactly one rank prefix."""
    cluster = local_job(tmp_path, "raise", "plain_raise.py", "[{host: localhost, procs: 3}]")
    result = run_cli("up", cluster, "--runs-dir", str(tmp_path / "runs"), "--run-id", "once",
                     "--max-restarts", "1", "--grace", "3", timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    shown = [line for line in result.stdout.splitlines() if "[rank" in line]
    logged = [line for line in (tmp_path / "runs" / "once" / "node-0.log").read_text().splitlines()
              if "[rank" in line]
    assert any("[rank2]: RuntimeError: planned crash on rank 2" in line for line in shown)
    for line in shown + logged:
        assert len(re.findall(r"\[rank\d+\]: ", line)) == 1, line


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_the_originating_rank_is_the_root_cause_not_its_cascade(tmp_path, how):
    """Rank 2 (node 1) crashes; ranks 0-1 (node 0) then fail inside all_reduce
    on their own. Both nodes failed, and node 1 is the root cause."""
    shutil.copy(os.path.join(ROOT, "tests", "programs", "collective_crash.py"), tmp_path)
    cluster = tmp_path / "cascade.yaml"
    cluster.write_text("nodes:\n  - {host: localhost, procs: 2}\n  - {host: localhost, procs: 1}\n"
                       "workload:\n  script: collective_crash.py\n"
                       f"  args: {{rank: 2, how: {how}}}\n")
    run_id = f"cascade-{how}"
    result = run_cli("up", str(cluster), "--runs-dir", str(tmp_path / "runs"),
                     "--run-id", run_id, "--grace", "3", timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    state = json.loads((tmp_path / "runs" / run_id / "state.json").read_text())
    states = {o["node_rank"]: o["state"] for o in state["outcomes"]}
    assert states[1] == "failed"
    assert states[0] == "failed", state["outcomes"][0]  # its own failure, not "stopped"
    assert state["root_cause"]["node_rank"] == 1, state["root_cause"]
    root_line = next(l for l in result.stdout.splitlines() if l.startswith("root cause:"))
    assert root_line.startswith("root cause: node 1 (localhost): ")
    expected = "planned crash on rank 2" if how == "raise" else "SIGKILL"
    assert expected in root_line, root_line
    assert wait_gone(run_id, 10) == set()
