"""`ddp-orch compare`: the report's numbers, files and reuse of finished runs."""

from __future__ import annotations


import json
import os

import pytest

from conftest import run_cli


@pytest.mark.live
def test_local_compare_writes_report_and_plots_and_reuses_runs(tmp_path):
    runs = str(tmp_path / "runs")
    args = ("--arg", "epochs=2", "--arg", "samples=2000", "--arg", "global_batch_size=40")
    result = run_cli("compare", "--local", "--workload", "linear", "--procs", "2", *args,
                     "--runs-dir", runs, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "speed-up:" in result.stdout and "| samples | 4000 | 4000 |" in result.stdout
    report_md = result.stdout.strip().splitlines()[-1].split("report: ")[1]
    out = tmp_path / "runs" / report_md.split("/runs/")[1].split("/")[0]
    report = json.loads((out / "report.json").read_text())
    assert report["baseline"]["world_size"] == 1 and report["ddp"]["world_size"] == 2
    assert report["speedup"] == pytest.approx(report["baseline"]["train_s"] / report["ddp"]["train_s"])
    assert [r["rank"] for r in report["ddp"]["rank_step_times"]] == [0, 1]
    for name in ("time_and_throughput.png", "time_breakdown.png", "loss_curves.png",
                 "rank_step_times.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{name}]({name})" in (out / "report.md").read_text()
    again = run_cli("compare", "--baseline-run", report["baseline"]["run_id"],
                    "--ddp-run", report["ddp"]["run_id"], "--runs-dir", runs, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert report_of(again.stdout) == report_of(result.stdout)


def report_of(stdout: str) -> str:
    """What compare printed before its report's path, less ddp-orch's lines
    about the runs it starts: each one's start and the progress lines a
    quiet run prints every 15 s (a loaded machine reaches them)."""
    head = stdout.split("report:")[0]
    return "".join(line for line in head.splitlines(keepends=True)
                   if not line.startswith("ddp-orch: "))


@pytest.mark.live
def test_compare_of_a_script_that_writes_no_result_says_so_after_one_side(tmp_path):
    """(issue 32) A user's script without a result file: one short run of
    the baseline, then the real reason, with the file the script should
    have written; the DDP side never starts."""
    (tmp_path / "train.py").write_text("print('trained')\n")
    (tmp_path / "c.yaml").write_text("nodes: [{host: localhost, procs: 1}]\ndevice: cpu\n"
                                     "workload: {script: train.py}\n")
    runs = tmp_path / "runs"
    result = run_cli("compare", str(tmp_path / "c.yaml"), "--runs-dir", str(runs), timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    ran = [p for p in os.listdir(runs) if not p.startswith(".")]
    assert len(ran) == 1 and ran[0].startswith("train-baseline-"), ran
    assert (f"error: the baseline run {ran[0]} succeeded, but `train.py` wrote no result: "
            "compare reads the JSON object that rank 0 writes to the path in "
            f"$DDP_ORCH_RESULT_FILE (for this run {runs}/{ran[0]}/node-0/result.json on node "
            "0, localhost)") in result.stderr
    assert "hint: at the end of training, on rank 0: `from workloads.contract import" \
        in result.stderr


@pytest.mark.live
def test_compare_on_two_nodes_runs_one_process_then_node_0_then_both(tmp_path):
    """(issue 46) Seed 001's experiment at three sizes, on CPU processes
    (gloo) with a tiny ResNet-18: 1 process, node 0's 2, both nodes' 4; the
    report gives each one's speed-up, efficiency and step split (data,
    compute, the all-reduce's exposed wait, from DDP's hook), and the
    scaling plot. The figures mean nothing on 2 shared cores; that they are
    each run's own is what is checked."""
    (tmp_path / "c.yaml").write_text(
        "nodes:\n  - {host: localhost, procs: 2}\n  - {host: localhost, procs: 2}\n"
        "device: cpu\nworkload:\n  name: resnet\n  args: {data: synthetic, image_size: 16, "
        "train_samples: 64, test_samples: 8, global_batch_size: 16, epochs: 1, eval: false, "
        "num_workers: 0}\n")
    runs = str(tmp_path / "runs")
    result = run_cli("compare", str(tmp_path / "c.yaml"), "--runs-dir", runs, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    report_md = result.stdout.strip().splitlines()[-1].split("report: ")[1]
    out = tmp_path / "runs" / report_md.split("/runs/")[1].split("/")[0]
    report = json.loads((out / "report.json").read_text())
    rows = report["scaling"]
    assert [(r["label"], r["world_size"], r["nodes"]) for r in rows] == [
        ("baseline", 1, 1), ("node", 2, 1), ("ddp", 4, 2)]
    sides = [report["baseline"], report["node"], report["ddp"]]
    for row, side in zip(rows, sides):
        assert row["run_id"] == side["run_id"] and side["samples"] == 64
        assert row["speedup"] == pytest.approx(report["baseline"]["train_s"] / side["train_s"])
        assert row["efficiency"] == pytest.approx(row["speedup"] / side["world_size"])
        assert side["avg_allreduce_s"] is not None and 0 <= side["avg_allreduce_s"] \
            <= side["avg_compute_s"]
        assert row["data_share"] + row["compute_share"] + row["allreduce_share"] \
            == pytest.approx(1.0)
    node_plan = json.loads((tmp_path / "runs" / report["node"]["run_id"] / "plan.json")
                           .read_text())
    assert len(node_plan["nodes"]) == 1 and node_plan["world_size"] == 2
    assert "on node 0 alone: speed-up" in result.stdout
    assert "| run | world size | nodes | speed-up | efficiency | data | compute | all-reduce |" \
        in result.stdout
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = run_cli("compare", "--baseline-run", rows[0]["run_id"], "--node-run",
                    rows[1]["run_id"], "--ddp-run", rows[2]["run_id"], "--runs-dir", runs,
                    timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert report_of(again.stdout) == report_of(result.stdout)
