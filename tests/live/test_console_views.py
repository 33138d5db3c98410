"""What `up` shows of a run's output, end to end with real torchrun
(the views themselves: tests/unit/engine/test_relay.py). The run directory's node logs
keep every line, whatever the view."""

from __future__ import annotations

import re

import pytest

from conftest import local_job, run_cli
from procscan import wait_gone

pytestmark = pytest.mark.live


def test_rank0_only_shows_rank_0s_lines_and_ddp_orchs_and_the_logs_keep_every_rank(tmp_path):
    cluster = local_job(tmp_path, "views", "steps.py",
                        "[{host: localhost, procs: 2}, {host: localhost, procs: 1}]")
    result = run_cli("up", cluster, "--run-id", "views", "--runs-dir", str(tmp_path / "runs"),
                     "--rank0-only", timeout=180)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    workers = [line for line in out.splitlines() if re.search(r"\[rank\d+\]:", line)]
    assert workers == [f"[node0 localhost] [rank0]: rank 0 step {s} attempt 0" for s in range(5)]
    assert "run views: SUCCEEDED" in out and "result: world_size=3" in out  # ddp-orch's own
    run = tmp_path / "runs" / "views"
    assert "[rank1]: rank 1 step 4 attempt 0" in (run / "node-0.log").read_text()
    assert "[rank2]: rank 2 step 4 attempt 0" in (run / "node-1.log").read_text()
    assert wait_gone("views", 10) == set()
