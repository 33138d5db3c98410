"""Built-in workloads through `ddp-orch up --local --procs 2`, tiny sizes.

test_wl_live.py drives the workloads with plain torchrun; this is the same
programs as users start them, through the orchestrator, with its result
contract, records and summary. linear, toy and mnist go through ``ddp-orch
up`` on the seed's 3 + 4 layout in test_wl_seed_layout.py (with the checks
made here: the run id, CPU ranks, the full result, mnist's real data), so
they are not run here again; noop's result is test_wl_live.py's
test_noop_across_two_simulated_nodes_with_static_rendezvous (the launch
ddp-orch makes) and its `up --local --procs 2` is test_network.py's
test_a_local_run_records_the_interface_its_ranks_used. mlp's and resnet's
runs here also carry what test_wl_live.py checked of them.
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
    "mlp": ["epochs=2", "global_batch_size=8", "num_workers=0", "data_dir={data}"],
    "resnet": ["epochs=1", "image_size=32", "train_samples=64", "test_samples=16",
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
    check_complete(result, workload, 2)
    assert result["run_id"] == workload
    assert {r["device"] for r in result["rank_table"]} == {"cpu"}
    if workload == "mlp":  # was test_wl_live.py's test_mlp_on_tiny_real_cifar10
        assert result["data"] == "real" and result["data_verified"] is False
        assert result["mode"] == "ddp" and result["versions"]["torchvision"]
        assert result["metrics"]["test_total"] == 20
        assert len(result["test_curve"]) == 2
        return
    # resnet: was test_wl_live.py's test_resnet_on_synthetic_data_reports_the_time_breakdown
    assert result["data"] == "synthetic"
    log = (tmp_path / "runs" / workload / "node-0.log").read_text()
    first = next(line for line in log.splitlines() if "[resnet resnet] " in line)  # + run id
    assert "data=synthetic" in first and "SYNTHETIC" in first
    t = result["timing"]
    assert t["steps"] == 4 and t["samples"] == 64
    assert t["avg_batch_s"] == pytest.approx(t["avg_data_s"] + t["avg_compute_s"])
    assert len(t["series"]["rows"]) == 4
    assert result["metrics"]["lr"] == pytest.approx(0.01)  # lr_scaling none: as given
    assert result["metrics"]["test_total"] == 16 and len(result["test_curve"]) == 1
    assert result["accuracy_curve"] and result["loss_curve"]
