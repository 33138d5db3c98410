"""Every built-in workload through `ddp-orch up --local --procs 2`, tiny sizes.

test_wl_live.py drives the workloads with plain torchrun; this is the same
programs as users start them, through the orchestrator, with its result
contract, records and summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from wl_support import ROOT, check_complete

pytestmark = pytest.mark.live

TINY = {
    "noop": [],
    "linear": ["epochs=2", "samples=1000"],
    "toy": [],
    "mlp": ["epochs=1", "global_batch_size=8", "num_workers=0", "data_dir={data}"],
    "mnist": ["epochs=1", "global_batch_size=8", "num_workers=0", "data_dir={data}"],
    "resnet": ["epochs=1", "image_size=32", "train_samples=32", "test_samples=8",
               "global_batch_size=16", "num_workers=0", "data_dir={empty}"],
}


@pytest.mark.parametrize("workload", sorted(TINY))
def test_workload_under_ddp_orch_up_local(workload, tmp_path, tiny_data):
    (tmp_path / "empty").mkdir()
    args = [a.format(data=tiny_data, empty=tmp_path / "empty") for a in TINY[workload]]
    cmd = [sys.executable, "-m", "orchestrator", "up", "--local", "--workload", workload,
           "--procs", "2", "--runs-dir", str(tmp_path / "runs"), "--run-id", workload, "--quiet",
           *[w for a in args for w in ("--arg", a)]]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCEEDED" in proc.stdout
    result = json.loads((tmp_path / "runs" / workload / "result.json").read_text())
    if workload == "noop":
        assert result["world_size"] == 2 and len(result["rank_table"]) == 2
        return
    check_complete(result, workload, 2)
    assert result["run_id"] == workload
    assert {r["device"] for r in result["rank_table"]} == {"cpu"}
    if workload in ("mlp", "mnist"):
        assert result["data"] == "real"
    if workload == "resnet":
        assert result["data"] == "synthetic"
