"""`ddp-orch compare`: the report's numbers, files and reuse of finished runs."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from orchestrator.report.compare import baseline_spec, comparison, render_table, summarize
from orchestrator.config.loader import load_cluster_file


def fake_result(world: int, train_s: float, per_s: float, samples: int = 1000) -> dict:
    return {"world_size": world,
            "timing": {"train_s": train_s, "total_s": train_s + 1, "avg_batch_s": 0.1,
                       "avg_data_s": 0.02, "avg_compute_s": 0.08, "samples_per_s": per_s,
                       "steps": 10, "samples": samples},
            "metrics": {"final_loss": 0.5, "test_accuracy": 0.9},
            "loss_curve": [[1, 2.0], [10, 0.5]]}


def test_speedup_efficiency_and_table_from_the_seed_numbers():
    # seed 001: 26.91 s on one GPU, 15.74 s with DDP on two
    base = summarize("baseline", "b", fake_result(1, 26.91, 1869.15))
    ddp = summarize("ddp", "d", fake_result(2, 15.74, 3202.33))
    report = comparison(base, ddp)
    assert report["speedup"] == pytest.approx(1.71, abs=0.005)
    assert report["throughput_ratio"] == pytest.approx(1.71, abs=0.005)
    assert report["scaling_efficiency"] == pytest.approx(0.855, abs=0.003)
    assert report["same_samples"]
    table = render_table(report)
    assert "speed-up: **1.71x**" in table and "scaling efficiency 85% on 2 processes" in table
    assert "| training time (s) | 26.91 | 15.74 |" in table


def test_a_result_without_training_timing_is_refused():
    with pytest.raises(Exception, match="compare needs a training workload"):
        summarize("ddp", "noop-run", {"world_size": 2, "timing": {"total_s": 1.0}})


def test_baseline_is_one_process_on_node0_first_gpu():
    spec = load_cluster_file("cluster.yaml.example")
    base = baseline_spec(spec)
    assert len(base.nodes) == 1 and base.nodes[0].gpus == (3,) and base.world_size == 1
    assert base.workload == spec.workload and base.name == "resnet-demo-baseline"


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
    assert again.stdout.split("report:")[0] == result.stdout.split("report:")[0]
