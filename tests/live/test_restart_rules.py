"""Which failures `--max-restarts` restarts, live on the SSH lab (README,
"Long runs"): no restart once a node's keeper is lost, even with restarts
left; none for a usage error (exit 2) before the first step; a restart for
an ImportError after the first step (it may depend on the data). The
built-in workloads resuming from their checkpoints are in
tests/live/test_long_runs.py. The rule itself:
orchestrator/agent/kept/restarts.py; other kept-run cases: tests/live/test_long_runs.py."""

from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import run_cli
from labhome import lab_job
from procscan import wait_gone
from test_long_runs import TWO_NODES, keeper, up  # the kept-run suite's own helpers

pytestmark = pytest.mark.live


def test_a_lost_keeper_is_not_restarted_while_restarts_remain(ssh_lab, tmp_path):
    env, cluster = lab_job(ssh_lab, tmp_path, "lost", "steps.py", TWO_NODES,
                           args="{steps: 4000, sleep: 0.1}")
    started = up(env, tmp_path, cluster, "lost", "--detach", "--max-restarts", "2")
    assert started.returncode == 0, started.stdout + started.stderr
    os.kill(keeper(tmp_path, "lost", 1)["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while keeper(tmp_path, "lost", 0)["state"] == "running":
        assert time.monotonic() < deadline, keeper(tmp_path, "lost", 0)
        time.sleep(0.2)
    head = keeper(tmp_path, "lost", 0)
    assert head["state"] == "failed"
    assert [(a["restart"], a["no_restart"]) for a in head["attempts"]] == [
        ("", "node(s) 1 lost: a restart needs every node")]  # 2 restarts were left
    status = run_cli("status", "lost", "--runs-dir", str(tmp_path / "runs"), env=env).stdout
    assert "root cause: node 1 (node1): its keeper could not be heard: the link closed" in status
    assert "-> no restart: node(s) 1 lost: a restart needs every node" in status, status
    assert wait_gone("lost", 30, labs=[ssh_lab]) == set()


def test_a_usage_error_before_the_first_step_is_not_restarted(ssh_lab, tmp_path):
    env, cluster = lab_job(ssh_lab, tmp_path, "usage", "steps.py", TWO_NODES,
                           args="{no-such-flag: 1}")
    done = up(env, tmp_path, cluster, "usage", "--max-restarts", "2")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "failed: exitcode 2: steps.py: error: unrecognized arguments: --no-such-flag 1" in out
    assert "attempts: 1" in out, out
    assert "exited with a usage error (exit 2) before the first step, which a restart meets " \
           "again" in out
    assert wait_gone("usage", 15, labs=[ssh_lab]) == set()


def test_an_import_error_after_the_first_step_is_restarted(ssh_lab, tmp_path):
    env, cluster = lab_job(ssh_lab, tmp_path, "impl", "steps.py", TWO_NODES,
                           args="{steps: 4, fail_rank: 1, fail_step: 2, fail_with: ImportError}")
    done = up(env, tmp_path, cluster, "impl", "--max-restarts", "1")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "attempts: 2" in out, out
    assert "ImportError: planned failure at step 2 of attempt 0" in out
    assert "-> restarting" in out
    assert "result: world_size=3 restart_count=1 steps=4" in out
    assert wait_gone("impl", 15, labs=[ssh_lab]) == set()
