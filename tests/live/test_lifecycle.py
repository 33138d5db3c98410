"""Run lifecycle: Ctrl-C on up, ps/status/logs from records, down by records."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from bounds import AT_ONCE_S, assert_gone_within, assert_stopped_at_once, teardowns
from conftest import ROOT, run_cli, wait_for_lines
from procscan import wait_gone, worker_pids

pytestmark = pytest.mark.live
PROGRAMS = os.path.join(ROOT, "tests", "programs")


def start_up(tmp_path, run_id: str, *script_args: str, grace: float = 10.0) -> subprocess.Popen:
    """`ddp-orch up` on 2 local nodes running sleeper.py, in the background."""
    shutil.copy(os.path.join(PROGRAMS, "sleeper.py"), tmp_path)
    args = "{" + ", ".join(f"{a}: true" for a in script_args) + "}"
    (tmp_path / "c.yaml").write_text(
        "nodes:\n  - {host: localhost, procs: 1}\n  - {host: localhost, procs: 1}\n"
        f"workload: {{script: sleeper.py, args: {args}}}\n")
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "up", str(tmp_path / "c.yaml"), "--run-id", run_id,
         "--runs-dir", str(tmp_path / "runs"), "--grace", str(grace)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_for_training(proc: subprocess.Popen, lines: int = 2) -> list[str]:
    seen = []
    while sum("training" in l for l in seen) < lines:
        line = proc.stdout.readline()
        assert line, "".join(seen)
        seen.append(line)
    return seen


def test_ctrl_c_tears_down_every_node_and_keeps_the_logs(tmp_path):
    """README: gone within the grace period (the default, 10 s): every node
    is asked to stop at once, and torn down within the grace period."""
    proc = start_up(tmp_path, "ctrlc")
    wait_for_training(proc)
    assert len(worker_pids("ctrlc")) >= 4  # two torchrun agents, two workers
    interrupted_at = time.time()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted by Ctrl-C on the controller; stopping every node" in out
    assert "INTERRUPTED" in out
    records = teardowns(tmp_path / "runs", "ctrlc")
    for record in records:  # each node says who stopped it (issue #45)
        assert_stopped_at_once(record, interrupted_at, "stopped by Ctrl-C on the controller")
    took = assert_gone_within(records, interrupted_at, 10)
    print(f"Ctrl-C: every node torn down {took:.1f}s later")
    assert wait_gone("ctrlc", 10) == set()
    run = tmp_path / "runs" / "ctrlc"
    assert json.loads((run / "state.json").read_text())["state"] == "interrupted"
    assert "training" in (run / "node-0.log").read_text()


def test_second_ctrl_c_kills_at_once(tmp_path):
    proc = start_up(tmp_path, "ctrlc2", "stubborn", grace=60)
    wait_for_training(proc)
    proc.send_signal(signal.SIGINT)
    wait_for_lines(proc, "; stopping every node")
    again_at = time.time()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "second interrupt; killing now" in out
    # the ranks ignore SIGTERM: only the SIGKILL the second Ctrl-C sends at
    # once ends them, well within the 60 s grace period
    for record in teardowns(tmp_path / "runs", "ctrlc2"):
        assert record["torn_down_at"] - again_at < AT_ONCE_S, record
    assert wait_gone("ctrlc2", 15) == set()


def test_ps_status_logs_and_down_work_from_the_records(tmp_path):
    proc = start_up(tmp_path, "lifecycle")
    try:
        wait_for_training(proc)
        runs = ["--runs-dir", str(tmp_path / "runs")]
        ps = run_cli("ps", *runs)
        assert "lifecycle" in ps.stdout and "running" in ps.stdout
        logs = run_cli("logs", "lifecycle", "--node", "1", *runs)
        assert "training" in logs.stdout
        down = run_cli("down", "life", *runs, timeout=120)  # a unique prefix is enough
        assert down.returncode == 0, down.stdout + down.stderr
        assert "asked its controller" in down.stdout
        assert wait_gone("lifecycle", 15) == set()
        proc.wait(timeout=30)
        again = run_cli("down", "lifecycle", *runs, timeout=120)
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.count("nothing left running") == 2
        status = run_cli("status", "lifecycle", *runs)
        assert "interrupted" in status.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
