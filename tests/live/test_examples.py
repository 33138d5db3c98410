"""The examples under ``examples/`` run as their READMEs say.

``examples/accelerate``: a Hugging Face Accelerate script (``Accelerator.prepare``,
``accelerator.backward``) launched by ``ddp-orch up examples/accelerate/cluster.yaml``
as the file stands, only smaller (``--arg``): Accelerate must find its place
in the job from torchrun's environment alone (2 processes, MULTI_CPU), train
(the loss falls), keep the replicas identical, and the main process's result
must come home. accelerate comes with the test tools (pyproject's ``test``
extra); without it the test skips, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from conftest import ROOT, run_cli
from procscan import wait_gone
from sshlab import lacking

pytestmark = pytest.mark.live
ACCELERATE_EXAMPLE = os.path.join(ROOT, "examples", "accelerate", "cluster.yaml")


def test_the_accelerate_example_trains_on_two_processes_and_its_result_comes_home(tmp_path):
    # localhost ranks run under the Python running ddp-orch: this one
    if importlib.util.find_spec("accelerate") is None:
        lacking(f"accelerate is not installed in {sys.prefix}: scripts/bootstrap --test "
                "installs it")
    result = run_cli("up", ACCELERATE_EXAMPLE, "--runs-dir", str(tmp_path / "runs"),
                     "--run-id", "accel", "--arg", "epochs=3", "--arg", "samples=512",
                     timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    res = json.loads((tmp_path / "runs" / "accel" / "result.json").read_text())
    # Accelerate saw the job torchrun started: 2 processes, gloo on the CPU
    assert res["world_size"] == 2 and res["distributed_type"] == "MULTI_CPU"
    assert sorted((p["process_index"], p["local_process_index"], p["num_processes"])
                  for p in res["processes"]) == [(0, 0, 2), (1, 1, 2)]
    assert res["replicas_identical"] is True
    losses = res["epoch_loss"]
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.05, losses
    assert res["metrics"]["final_loss"] == losses[-1]
    # batch_size 32 per process, 2 processes: each takes half of every step's 64
    assert res["metrics"]["global_batch"] == 64 and res["steps_per_epoch"] == 512 // 64
    # the summary reads the example's result as it reads a built-in's
    assert "world_size=2 first_epoch_loss=" in result.stdout
    assert "data: 512 generated 3x32x32 images in 10 classes (seed 0)" in result.stdout
    # only the main process printed its lines (accelerator.print)
    log = (tmp_path / "runs" / "accel" / "node-0.log").read_text()
    assert "[rank0]: accelerate: 2 process(es), MULTI_CPU" in log
    assert "[rank1]: epoch" not in log and "[rank0]: epoch 3/3 loss" in log
    assert wait_gone("accel", 15) == set()
