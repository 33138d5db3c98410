"""Unit tests of issue 29's reports: each node's GPUs as ``plan.json`` has
them (status, the summary, ``status --json`` against its schema) and
``check``'s GPU table."""

from __future__ import annotations

import json
import os

import jsonschema

from conftest import ROOT
from orchestrator.engine.preflight import NodeGpus
from orchestrator.records.outcome import RunDescription, RunState
from orchestrator.records.rundir import RunDir
from orchestrator.records.store import NodeRecord, RunRecord
from orchestrator.report.gpus import gpu_lines, node_gpus, rank_lines
from orchestrator.report.runs import render_gpus
from orchestrator.report.runsjson import status_json
from orchestrator.report.summary import gpu_summary

H100 = "NVIDIA H100 80GB HBM3"
PLAN = {"device": "cuda", "world_size": 6, "name": "demo", "nodes": [
    {"node_rank": 0, "host": "gpu01", "gpus": [3, 4, 5], "gpu_request": "free:3",
     "gpu_models": [H100, H100, H100], "gpu_uuids": ["GPU-3", "GPU-4", "GPU-5"]},
    {"node_rank": 1, "host": "gpu02", "gpus": [1, 0], "gpu_models": ["NVIDIA A100", H100]},
    {"node_rank": 2, "host": "cpu01", "gpus": None},
]}


def test_node_gpus_reads_a_plan_node_and_nulls_what_is_not_there():
    assert node_gpus(PLAN["nodes"][0]) == {"gpus": [3, 4, 5], "gpu_request": "free:3",
                                           "gpu_models": [H100] * 3,
                                           "gpu_uuids": ["GPU-3", "GPU-4", "GPU-5"]}
    assert node_gpus(None) == {"gpus": None, "gpu_request": None, "gpu_models": [],
                               "gpu_uuids": []}
    assert node_gpus({"gpus": [1, True], "gpu_request": 3, "gpu_models": ["x", 2],
                      "gpu_uuids": "GPU-1"}) == \
        {"gpus": None, "gpu_request": None, "gpu_models": ["x"], "gpu_uuids": []}


def test_gpu_lines_name_each_gpu_node_its_request_and_models():
    assert gpu_lines(PLAN) == [
        f"  node 0 (gpu01): GPUs 3,4,5 (free:3), 3x {H100}",
        f"  node 1 (gpu02): GPUs 1,0, 1x NVIDIA A100, 1x {H100}"]


def test_a_cpu_rehearsals_plain_list_says_nothing_but_a_request_does():
    plan = {"device": "cpu", "nodes": [{"node_rank": 0, "host": "a", "gpus": [0, 1]},
                                       {"node_rank": 1, "host": "b", "gpus": [2],
                                        "gpu_request": "free:1"}]}
    assert gpu_lines(plan) == ["  node 1 (b): GPUs 2 (free:1)"]
    assert gpu_lines(None) == [] and gpu_lines([1]) == []


def test_rank_lines_say_which_ranks_went_to_which_node_gpus_and_models():
    """What ``up`` prints once the nodes have chosen (issue #45: the rank
    table was only in plan.json and status): rank i of a node on its i-th
    GPU, a CPU node's processes, a rehearsal's indices said to be CPU ones."""
    plan = {**PLAN, "nodes": [{**node, "ranks": span} for node, span in
                              zip(PLAN["nodes"][:2], ([0, 2], [3, 4]))]}
    assert rank_lines(plan) == [
        f"ranks 0-2: node 0 (gpu01), GPUs 3,4,5 (free:3), 3x {H100}",
        f"ranks 3-4: node 1 (gpu02), GPUs 1,0, 1x NVIDIA A100, 1x {H100}"]
    cpu = {"device": "cpu", "nodes": [{"node_rank": 0, "host": "c", "gpus": None, "ranks": [0, 1]},
                                      {"node_rank": 1, "host": "d", "gpus": None, "ranks": [2, 2]}]}
    assert rank_lines(cpu) == ["ranks 0-1: node 0 (c), 2 CPU processes",
                               "rank 2: node 1 (d), 1 CPU process"]
    rehearsal = {"device": "cpu", "nodes": [{"node_rank": 0, "host": "a", "gpus": [2, 3],
                                             "gpu_request": "free:2", "ranks": [0, 1]}]}
    assert rank_lines(rehearsal) == ["ranks 0-1: node 0 (a), GPUs 2,3 (free:2), as CPU processes"]
    assert rank_lines(None) == [] and rank_lines({"nodes": [{"ranks": "0-1"}]}) == []
    slurm = {"device": "auto", "nodes": [{"node_rank": 0, "host": "n1", "gpus": None,
                                          "ranks": [0, 3]}]}  # nodes: {count: 1, gpus: 4}
    assert rank_lines(slurm) == ["ranks 0-3: node 0 (n1), 4 processes, one per GPU the "
                                 "scheduler allocates"]


def test_the_summary_warns_once_of_mixed_models_for_the_whole_gang():
    assert gpu_summary(PLAN) == [
        f"node 0 (gpu01): GPUs 3,4,5 (free:3), 3x {H100}",
        f"node 1 (gpu02): GPUs 1,0, 1x NVIDIA A100, 1x {H100}",
        f"warning: mixed GPU models: 4x {H100}, 1x NVIDIA A100: the slowest paces every step"]
    same = {"nodes": [PLAN["nodes"][0]]}
    assert not any(line.startswith("warning") for line in gpu_summary(same))


def test_status_json_has_each_nodes_gpus_and_fits_its_schema(tmp_path):
    run = RunDir(str(tmp_path / "r1"))
    os.makedirs(run.path)
    run.write_plan(PLAN)
    record = RunRecord(run_id="r1", run=run, state=RunState.SUCCEEDED, backend="ssh",
                       started=1.0, wall_s=2.0, ended=3.0, controller_pid=None,
                       nodes=tuple(NodeRecord(node_rank=n["node_rank"], host=n["host"],
                                              run_dir=f"/w/{k}", python="python3")
                                   for k, n in enumerate(PLAN["nodes"])),
                       outcomes=(), root_cause=None)
    data = json.loads(json.dumps(status_json(record, RunDescription(RunState.SUCCEEDED, (),
                                                                    None))))
    with open(os.path.join(ROOT, "schema", "status.schema.json"), encoding="utf-8") as fh:
        jsonschema.validate(data, json.load(fh))
    assert [(n["gpus"], n["gpu_request"], n["gpu_models"]) for n in data["nodes"]] == [
        ([3, 4, 5], "free:3", [H100] * 3), ([1, 0], None, ["NVIDIA A100", H100]),
        (None, None, [])]
    assert data["world_size"] == 6


def gpu(index: int, **extra) -> dict:
    return {"index": index, "uuid": f"GPU-{index}", "name": "H100", "memory_used_mib": 512,
            "memory_total_mib": 81920, "utilization": 0, **extra}


def test_checks_gpu_table_says_which_gpus_the_run_would_take_and_who_holds_the_rest():
    node = NodeGpus(node_rank=1, host="gpu02", driver="550.54", torch_sees=4,
                    gpus=(gpu(0), gpu(1, memory_used_mib=40960, utilization=97),
                          gpu(2, held_by={"run_id": "other", "user": "ann", "pid": 77,
                                          "host": "gpu02"}),
                          gpu(3, mig=True), gpu(4)),
                    apps=({"gpu_uuid": "GPU-1", "pid": 9, "name": "python", "user": "bob",
                           "used_mib": 40000},),
                    chosen=(0, 1), free=(0, 4))
    out = render_gpus(node)
    assert out.startswith("\nnode 1 (gpu02) GPUs, driver 550.54; torch sees 4\n")
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip()}
    assert rows["GPU"].split() == ["GPU", "MODEL", "MEMORY", "UTIL", "HEALTH", "PROCESSES",
                                   "HELD", "BY", "STATE"]
    assert rows["0"].split()[-2:] == ["the", "run's"] and "0.5/80.0 GiB" in rows["0"]
    assert "9 python (bob, 40000 MiB)" in rows["1"] and rows["1"].endswith("the run's (busy)")
    assert "40.0/80.0 GiB" in rows["1"] and "97%" in rows["1"]
    assert "run other of ann (pid 77 on gpu02)" in rows["2"] and rows["2"].endswith("held")
    assert rows["3"].endswith("MIG") and rows["4"].endswith("free")
    assert [rows[k].split()[5] for k in "01234"] == ["ok"] * 5
    empty = NodeGpus(0, "a", None, (), (), (), (), None)
    assert render_gpus(empty) == ("\nnode 0 (a) GPUs, driver ?\n  (nvidia-smi lists none, or "
                                  "did not answer)\n\n")


def test_checks_gpu_table_has_each_gpus_health_the_lock_directory_and_what_smi_said():
    node = NodeGpus(node_rank=0, host="gpu01", driver="470.82", torch_sees=None,
                    gpus=(gpu(0, ecc_errors=3), gpu(1, compute_mode="Exclusive_Process"),
                          gpu(2, reset_required=True), gpu(3), gpu(4, ecc_errors=1)),
                    apps=(), chosen=(4,), free=(0, 1, 4),
                    lock_dir="/run/lock/ddp-orch-gpus",
                    notes=("nvidia-smi: WARNING: infoROM is corrupted at gpu 0000:1B:00.0",),
                    unreported=("reset_status.reset_required",), ignore=("ecc",), exclude=(3,))
    out = render_gpus(node)
    assert out.startswith("\nnode 0 (gpu01) GPUs, driver 470.82; locks in "
                          "/run/lock/ddp-orch-gpus\n")
    lines = out.splitlines()
    rows = {line.split()[0]: line for line in lines[3:8]}
    cells = {k: row[row.index("0%") + 2:].split("  -")[0].strip() for k, row in rows.items()}
    assert cells == {"0": "3 ECC errors (ignored)", "1": "exclusive mode", "2": "needs reset",
                     "3": "ok", "4": "1 ECC error (ignored)"}
    assert [rows[k].split()[-1] for k in "0123"] == ["free", "free", "unfit", "excluded"]
    assert rows["4"].endswith("the run's")
    assert lines[8:10] == [
        "  nvidia-smi: WARNING: infoROM is corrupted at gpu 0000:1B:00.0",
        "  not reported by this nvidia-smi (unknown, not held against a GPU): "
        "reset_status.reset_required"]
