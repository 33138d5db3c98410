"""Unit tests of report/compare.py: what `ddp-orch compare` reports from two
runs' results (warnings, speedup, the table, the plot note)."""

from __future__ import annotations

import json

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


def three_runs() -> dict:
    """1 GPU, node 0's 4 GPUs, 8 GPUs over two nodes: seed 001's experiment
    at three sizes (train times 40, 11 and 6 s over the same samples)."""
    def run(label, world, nodes, train_s, data_s, compute_s, allreduce_s):
        result = fake_result(world, train_s, 1000 * 40 / train_s)
        result["nodes"] = nodes
        result["timing"].update(avg_batch_s=data_s + compute_s, avg_data_s=data_s,
                                avg_compute_s=compute_s, avg_allreduce_s=allreduce_s)
        return summarize(label, label[0], result)

    return comparison(run("baseline", 1, 1, 40.0, 0.02, 0.38, 0.001),
                      run("ddp", 8, 2, 6.0, 0.004, 0.056, 0.012),
                      run("node", 4, 1, 11.0, 0.005, 0.105, 0.005))


def test_three_runs_give_speed_up_efficiency_and_the_steps_split_per_size():
    report = three_runs()
    rows = report["scaling"]
    assert [(r["label"], r["world_size"], r["nodes"]) for r in rows] == [
        ("baseline", 1, 1), ("node", 4, 1), ("ddp", 8, 2)]
    assert [r["speedup"] for r in rows] == pytest.approx([1.0, 40 / 11, 40 / 6])
    assert [r["efficiency"] for r in rows] == pytest.approx([1.0, 40 / 11 / 4, 40 / 6 / 8])
    node = rows[1]  # the step: 0.005 data + 0.105 compute, of it 0.005 all-reduce
    assert (node["data_s"], node["compute_s"], node["allreduce_s"]) == pytest.approx(
        (0.005, 0.100, 0.005))
    assert (node["data_share"], node["compute_share"], node["allreduce_share"]) == \
        pytest.approx((0.005 / 0.11, 0.1 / 0.11, 0.005 / 0.11))
    assert report["speedup"] == pytest.approx(40 / 6) and report["same_samples"]
    table = render_table(report)
    assert table.startswith("| metric | baseline (1 process) | node 0 alone (4 processes) "
                            "| DDP |\n| --- | ---: | ---: | ---: |\n")
    assert "| training time (s) | 40.00 | 11.00 | 6.00 |" in table
    assert "|     of it the all-reduce's wait (s) | 0.0010 | 0.0050 | 0.0120 |" in table
    assert "| node 0 alone (4 processes) | 4 | 1 | 3.64x | 91% | 5% | 91% | 5% |" in table
    assert "| DDP | 8 | 2 | 6.67x | 83% | 7% | 73% | 20% |" in table
    assert "on node 0 alone: speed-up 3.64x, scaling efficiency 91% on 4 processes" in table
    markdown = render_markdown(report, ["scaling.png"])
    assert "node 0 alone (4 processes) `n`" in markdown and "![scaling.png](scaling.png)" in markdown
    assert "- on node 0 alone: speed-up 3.64x" in markdown
    assert "\n| run | world size | nodes | speed-up | efficiency | data | compute | all-reduce |\n" \
        in markdown


def test_a_run_without_the_all_reduce_measured_shows_none():
    """A result from before the all-reduce was measured, or a user's script."""
    report = report_of(fake_result(1, 20.0, 100.0), fake_result(2, 12.0, 170.0))
    assert [r["allreduce_share"] for r in report["scaling"]] == [None, None]
    assert "| DDP | 2 | 1 | 1.67x | 83% | 20% | 80% | - |" in render_table(report)
    assert "|     of it the all-reduce's wait (s) | - | - |" in render_table(report)


def test_the_plots_show_every_run_and_the_scaling(tmp_path):
    pytest.importorskip("matplotlib")
    report = three_runs()
    plots, note = write_report(report, str(tmp_path))
    assert note == "" and plots == ["time_and_throughput.png", "time_breakdown.png",
                                    "scaling.png", "loss_curves.png"]
    for name in plots:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "report.json").read_text())["node"]["world_size"] == 4


def test_without_matplotlib_the_note_names_the_run_on_node_0_too(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    _, note = write_report(three_runs(), str(tmp_path))
    assert "`ddp-orch compare --baseline-run b --node-run n --ddp-run d` draws them" in note
