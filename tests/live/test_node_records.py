"""What the controller reads from nodes is checked, never trusted: a kept
run's records (``agent/kept/records.py``), the exit events (``protocol``), and
the text it prints (control characters shown, not obeyed)."""

from __future__ import annotations

import json
import time

import pytest

from conftest import local_job, run_cli


@pytest.mark.live  # a real detached run on this machine: seconds
def test_ps_and_status_survive_a_bad_keeper_record_and_show_what_was_ignored(tmp_path):
    """A detached run ends while nobody watches; then node 0's keeper.json
    is rewritten with values of the wrong type, a time of 1e300 and a
    terminal escape. ``ps`` and ``status`` settle the run without a
    traceback, note what they ignored, and print no raw escape."""
    cluster = local_job(tmp_path, "bad", "steps.py",
                        "[{host: localhost, procs: 1}, {host: localhost, procs: 1}]")
    runs = str(tmp_path / "runs")
    started = run_cli("up", cluster, "--runs-dir", runs, "--run-id", "bad", "--detach",
                      "--arg", "steps=2")
    assert started.returncode == 0, started.stdout + started.stderr
    record = tmp_path / "runs" / "bad" / "node-0" / "keeper.json"
    deadline = time.monotonic() + 60
    while json.loads(record.read_text()).get("state") == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(0.5)  # its keeper exits right after its last write
    kept = json.loads(record.read_text())
    kept.update(updated=1e300, code="x", state="failed\x1b[2J",
                attempts=[{"attempt": 0, "master_port": "p", "state": "failed",
                           "nodes": {"0": {"lost": 1}, "1": {"code": 1}}}])
    record.write_text(json.dumps(kept))
    status = run_cli("status", "bad", "--runs-dir", runs)  # asks the nodes, settles the run
    ps = run_cli("ps", "--runs-dir", runs)
    for result in (ps, status):
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Traceback" not in result.stderr and "\x1b" not in result.stdout
    assert " failed " in status.stdout.splitlines()[1], status.stdout
    assert "ignored the keeper's record's 'updated': 1e+300" in status.stdout
    assert "ended at an unknown time" in status.stdout
    assert "ignored the keeper's record's 'updated'" in (tmp_path / "runs" / "bad" / "node-0.log"
                                                         ).read_text()
    assert " failed " in ps.stdout.splitlines()[1], ps.stdout
