"""`ddp-orch compare`: the report's numbers, files and reuse of finished runs."""

from __future__ import annotations


import json

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
    """What compare printed before its report's path, less the progress
    lines a quiet run prints every 15 s (a loaded machine reaches them)."""
    head = stdout.split("report:")[0]
    return "".join(line for line in head.splitlines(keepends=True)
                   if not line.startswith("ddp-orch: node "))
