"""The seed's 3 + 4 layout (world size 7) with the built-in workloads' defaults.

World size 7 divides none of the default global batches (32, 4, 64, ...).
The batch rule (harness.data.BatchSplit) deals a global batch over any
world size and weights each rank's loss by its share, so these run as
shipped: ``cluster.yaml.example`` itself, with its two hosts made local,
and the same layout with ``mnist`` at its default batch (``toy``'s batch of
4 over 7 ranks: test_ssh_launch.py's test_seed_layout_over_two_ssh_hosts).
On one machine two nodes may not list the same GPU index, so each node's
``gpus:`` becomes as many CPU processes (``procs:``); the layout, world size
and rank numbering are the example's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from wl_support import ROOT, check_complete
from workloads.catalog import CATALOG

pytestmark = pytest.mark.live

EXAMPLE = os.path.join(ROOT, "cluster.yaml.example")
SPLITS = {"linear": [5, 5, 5, 5, 4, 4, 4],   # 32 over 7
          "mnist": [10, 9, 9, 9, 9, 9, 9]}   # 64 over 7


def local_example(tmp_path, workload: dict | None = None) -> str:
    """cluster.yaml.example on this machine: hosts localhost, device cpu, this
    Python, master port auto, no workdir; ``workload`` replaces its workload if given."""
    with open(EXAMPLE, encoding="utf-8") as fh:
        spec = yaml.safe_load(fh)
    for node in spec["nodes"]:
        gpus = node.pop("gpus")
        node.update(host="localhost",
                    procs=len(gpus.split(",") if isinstance(gpus, str) else gpus))
    spec.pop("master")  # node 0's host, a free port
    spec.pop("workdir", None)  # remote nodes' run place: refused when every node is localhost
    spec.update(device="cpu", python=sys.executable)
    if workload is not None:
        spec["workload"] = workload
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def up(tmp_path, cluster: str, run_id: str, *args: str) -> tuple[str, dict]:
    """``ddp-orch up CLUSTER ARGS``; (its output, rank 0's result)."""
    cmd = [sys.executable, "-m", "orchestrator", "up", cluster, "--runs-dir",
           str(tmp_path / "runs"), "--run-id", run_id, *args]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"run {run_id}: SUCCEEDED" in proc.stdout
    return proc.stdout, json.loads((tmp_path / "runs" / run_id / "result.json").read_text())


def check_seed_layout(result: dict, workload: str, run_id: str) -> None:
    """(Also what test_wl_orchestrated.py checked of linear, toy and mnist
    under ``up --local --procs 2``: the run id and CPU ranks.)"""
    check_complete(result, workload, 7)
    assert result["run_id"] == run_id
    assert {r["device"] for r in result["rank_table"]} == {"cpu"}
    assert [r["node_rank"] for r in result["rank_table"]] == [0, 0, 0, 1, 1, 1, 1]
    assert result["config"]["global_batch_size"] == CATALOG[workload].arg(
        "global_batch_size").default
    assert result["batch_split"] == SPLITS[workload]


def test_example_cluster_file_runs_as_shipped_on_localhost(tmp_path):
    """linear, epochs 10, global batch 32 on 3 + 4 ranks; one epoch of it
    (the steps of a one-process run: ceil(10000 / 32) = 313 per epoch)."""
    out, result = up(tmp_path, local_example(tmp_path), "example", "--arg", "max_steps=313")
    check_seed_layout(result, "linear", "example")
    assert "global batch 32 = 4 x 5 + 3 x 4" in out
    assert "] epoch 1/10 step 313 loss " in out
    assert result["timing"]["samples"] == 10000  # each sample once, no padding
    assert result["config"]["epochs"] == 10


def test_mnist_at_its_default_batch_runs_on_the_3_plus_4_layout(tmp_path, tiny_data):
    """mnist at its default global batch (64 over 7 ranks), reading the tiny
    MNIST (48 train samples: one step an epoch) without workers. (toy's
    batch of 4 over 7 ranks, with three empty shares, runs on this layout
    over two SSH hosts: test_ssh_launch.py's test_seed_layout_over_two_ssh_hosts.)"""
    args = {"data_dir": tiny_data, "num_workers": 0}
    cluster = local_example(tmp_path, {"name": "mnist", "args": args})
    _, result = up(tmp_path, cluster, "mnist", "--quiet")
    check_seed_layout(result, "mnist", "mnist")
    assert result["data"] == "real" and result["metrics"]["end_step"] == 3
    assert result["timing"]["samples"] == 3 * 48


def test_a_global_batch_below_one_is_refused_before_launch(tmp_path):
    """What every rank would refuse, the dry-run refuses (exit 2, the field)."""
    cluster = local_example(tmp_path, {"name": "toy", "args": {"global_batch_size": 0}})
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "up", cluster, "--dry-run"],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "workload.args.global_batch_size: 0 is below the minimum 1" in proc.stderr
