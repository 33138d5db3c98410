"""Unit tests of report/compare.py: what `ddp-orch compare` reports from two
runs' results (warnings, speedup, the table, the plot note)."""

from __future__ import annotations

import pytest

from orchestrator.report.compare import (comparison, render_markdown, render_table, summarize,
                                         write_report)


SYNTHETIC = "SYNTHETIC CIFAR-10-shaped data, no cifar-10-batches-py under /n0/code/data"


def fake_result(world: int, train_s: float, per_s: float, samples: int = 1000, *,
                lr: float = 0.01, lr_scaling: str = "none", data: str = "synthetic",
                source: str = SYNTHETIC, **config) -> dict:
    """A resnet-like result.json: what compare reads of it."""
    return {"world_size": world, "workload": "resnet", "data": data, "data_source": source,
            "config": {"lr": 0.01, "lr_scaling": lr_scaling, "global_batch_size": 512,
                       "epochs": 1, "data": "auto", "result_file": f"/n0/w{world}.json",
                       **config},
            "timing": {"train_s": train_s, "total_s": train_s + 1, "avg_batch_s": 0.1,
                       "avg_data_s": 0.02, "avg_compute_s": 0.08, "samples_per_s": per_s,
                       "steps": 10, "samples": samples},
            "metrics": {"final_loss": 0.5, "test_accuracy": 0.9, "lr": lr},
            "loss_curve": [[1, 2.0], [10, 0.5]]}


def report_of(base_result: dict, ddp_result: dict) -> dict:
    return comparison(summarize("baseline", "b", base_result), summarize("ddp", "d", ddp_result))


def test_same_problem_shows_each_sides_lr_batch_and_data_and_says_same():
    report = report_of(fake_result(1, 20.0, 100.0), fake_result(2, 12.0, 170.0))
    assert report["differences"] == []
    table = render_table(report)
    assert "| learning rate | 0.01 | 0.01 |" in table
    assert "| global batch | 512 | 512 |" in table and "| data | synthetic | synthetic |" in table
    assert f"data of baseline (1 process): {SYNTHETIC}" in table
    assert f"data of DDP: {SYNTHETIC}" in table and "warning" not in table
    assert "Same workload arguments, learning rate and data" in render_markdown(report, [])


def test_linear_lr_scaling_is_shown_and_warned_about_not_called_the_same_arguments():
    """The misleading case: resnet with lr_scaling=linear trains the baseline
    at 0.01 and 2 ranks at 0.02 on the same global batch."""
    report = report_of(fake_result(1, 20.0, 100.0, lr=0.01, lr_scaling="linear"),
                       fake_result(2, 12.0, 170.0, lr=0.02, lr_scaling="linear"))
    assert len(report["differences"]) == 1
    assert report["differences"][0].startswith(
        "learning rate: 0.01 vs 0.02: lr_scaling=linear multiplies lr by the world size (1 vs 2)")
    table = render_table(report)
    assert "| learning rate | 0.01 | 0.02 |" in table
    assert "warning: the sides differ in learning rate: 0.01 vs 0.02" in table
    assert "set lr_scaling=none" in table
    markdown = render_markdown(report, [])
    assert "Same workload arguments" not in markdown and "**The sides differ**" in markdown
    assert "warning: the sides differ in learning rate" in markdown


def test_real_data_on_one_side_and_synthetic_on_the_other_is_warned_about():
    report = report_of(fake_result(1, 20.0, 100.0, data="real", source="CIFAR-10 from /data"),
                       fake_result(2, 12.0, 170.0))
    table = render_table(report)
    assert "| data | real | synthetic |" in table
    assert "data of baseline (1 process): CIFAR-10 from /data" in table
    assert (f"warning: the sides differ in data: real (CIFAR-10 from /data) vs synthetic "
            f"({SYNTHETIC})") in table


def test_reused_runs_with_other_arguments_are_warned_about():
    report = report_of(fake_result(1, 20.0, 100.0), fake_result(2, 12.0, 170.0, epochs=3))
    assert report["differences"] == ["argument epochs: 1 vs 3"]
    assert "warning: the sides differ in argument epochs: 1 vs 3" in render_table(report)


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


def test_a_reused_dataparallel_run_is_labelled_and_compared_per_device():
    dp = {**fake_result(1, 20.0, 100.0), "mode": "dp"}
    dp["metrics"]["dp_gpus"] = 2
    report = report_of(dp, {**fake_result(2, 10.0, 200.0), "mode": "ddp"})
    table = render_table(report)
    assert table.startswith("| metric | DataParallel (1 process, 2 GPUs) | DDP |")
    assert report["scaling_efficiency"] == pytest.approx(2.0)  # 2x on the same 2 GPUs
    assert "DDP on 2 processes vs DataParallel on 2 GPUs, efficiency per device 200%" in table


def test_without_matplotlib_the_note_says_exactly_how_to_install_it(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    report = report_of(fake_result(1, 20.0, 100.0), fake_result(2, 12.0, 170.0))
    plots, note = write_report(report, str(tmp_path))
    assert plots == [] and sorted(p.name for p in tmp_path.iterdir()) == ["report.json",
                                                                          "report.md"]
    assert f"`{sys.executable} -m pip install 'matplotlib>=3.7'`" in note
    assert "pip install -e '.[report]'" in note
    assert "`ddp-orch compare --baseline-run b --ddp-run d` draws them" in note
