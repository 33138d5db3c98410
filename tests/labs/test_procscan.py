"""The "nothing left" scan itself (``procscan``): what it counts as a run's.

Its use on real runs (a supervisor leaked on purpose is seen) is in
test_faults.py, ``test_the_nothing_left_check_sees_a_leaked_supervisor``.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from orchestrator.agent.node.procs import OWN_MARKER, own_marker, run_marker
from procscan import RUN_IDS_ENV, claim, run_pids, wait_gone, worker_pids

pytestmark = pytest.mark.live


def sleeper(env: dict) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               env={"PATH": "/usr/bin:/bin", **env})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until exec is done and its environment shows
        with open(f"/proc/{process.pid}/cmdline", "rb") as fh:
            if b"time.sleep" in fh.read():
                return process
        time.sleep(0.02)
    raise AssertionError("the sleeper did not start")


def test_a_run_id_is_one_modules_and_a_second_module_scanning_it_fails(tmp_path, monkeypatch):
    """Live modules run side by side: the same id in two of them would make
    one test's scan count the other's processes. The second module to scan
    an id fails, with both names; the first may scan it again."""
    monkeypatch.setenv(RUN_IDS_ENV, str(tmp_path))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/live/test_a.py::test_one (call)")
    claim("toy")
    run_pids("a/b")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/live/test_a.py::test_two (call)")
    claim("toy")
    worker_pids("a/b")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/live/test_b.py::test_three (call)")
    claim("other")
    for scan in (lambda: claim("toy"), lambda: run_pids("toy"), lambda: wait_gone("a/b", 0)):
        with pytest.raises(AssertionError) as failed:
            scan()
        assert "tests/live/test_a.py and tests/live/test_b.py" in str(failed.value)


def test_both_markers_are_the_run_and_only_the_worker_marker_is_a_worker():
    run_id = f"scan-{time.time_ns()}"
    own = sleeper(own_marker(run_id))  # an agent, a supervisor, a keeper
    worker = sleeper(dict(entry.split("=", 1) for entry in run_marker(run_id, 0)))
    other = sleeper(own_marker(run_id + "-other"))
    try:
        assert OWN_MARKER == "DDP_ORCH_RUN"
        assert run_pids(run_id) == {own.pid, worker.pid}
        assert worker_pids(run_id) == {worker.pid}
    finally:
        for process in (own, worker, other):
            process.kill()
            process.wait()
    assert wait_gone(run_id, 5) == set()


def test_a_session_left_open_on_a_lab_host_is_the_run_s_unless_it_runs_another_run(ssh_lab):
    """An SSH session nothing of the run runs in any more still counts (the
    scan is the check that a run closed its connections); one whose
    command carries another run is that run's."""
    run_id = f"scan-{time.time_ns()}"
    left_open, another = ssh_lab.client("node0"), ssh_lab.client("node1")
    try:
        left_open.exec_command("sleep 60")
        another.exec_command(f"env {OWN_MARKER}={run_id}-other sleep 60")
        deadline = time.monotonic() + 10
        while not (ssh_lab.session_pids("node0") and run_pids(f"{run_id}-other")):
            assert time.monotonic() < deadline  # both sessions up, the other run's command too
            time.sleep(0.05)
        found = run_pids(run_id, labs=[ssh_lab])
        assert set(ssh_lab.session_pids("node0")) <= found, found
        assert not set(ssh_lab.session_pids("node1")) & found, found
    finally:
        left_open.close()
        another.close()
    assert wait_gone(run_id, 10, labs=[ssh_lab]) == set()
