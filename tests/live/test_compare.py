"""`ddp-orch compare`: the report's numbers, files and reuse of finished runs."""

from __future__ import annotations

import dataclasses

import json
import re

import pytest

from conftest import run_cli
from orchestrator.config.localmode import local_spec
from orchestrator.errors import ConfigError
from orchestrator.plan.build import build_plan
from orchestrator.controller.compare import baseline_spec, ddp_spec
from orchestrator.report.compare import (comparison, render_markdown, render_table, summarize,
                                         write_report)
from orchestrator.config.loader import load_cluster_file

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


def test_baseline_is_one_process_on_node0_first_gpu():
    spec = load_cluster_file("cluster.yaml.example")
    base = baseline_spec(spec)
    assert len(base.nodes) == 1 and base.nodes[0].gpus == (3,) and base.world_size == 1
    assert base.workload == spec.workload and base.name == "resnet-demo-baseline"


def test_cpu_processes_of_both_sides_run_one_thread_each_unless_the_file_says():
    """The speed-up compares processes, not threads: torchrun would give the
    1-process baseline every core and each DDP process one thread."""
    spec = local_spec(None, workload="linear", args={}, gpus=None, procs=2, device=None)
    for side in (baseline_spec(spec), ddp_spec(spec)):
        assert [dict(node.env).get("OMP_NUM_THREADS") for node in side.nodes] == ["1"]
    mine = dataclasses.replace(spec, nodes=tuple(
        dataclasses.replace(node, env={**node.env, "OMP_NUM_THREADS": "2"})
        for node in spec.nodes))
    for side in (baseline_spec(mine), ddp_spec(mine)):
        assert [dict(node.env)["OMP_NUM_THREADS"] for node in side.nodes] == ["2"]
    gpu = load_cluster_file("cluster.yaml.example")
    assert all("OMP_NUM_THREADS" not in node.env
               for side in (baseline_spec(gpu), ddp_spec(gpu)) for node in side.nodes)


def mlp_spec(**kw):
    options = {"gpus": None, "procs": None, "device": None, **kw}
    return local_spec(None, workload=options.pop("workload", "mlp"), args={}, **options)


def test_dp_baseline_is_one_process_seeing_all_of_node0s_gpus_in_mode_dp():
    """The commands compare --baseline dp runs (not run on GPUs here): mlp
    --mode dp as one process with every GPU of node 0 visible, against
    mlp --mode ddp, one process per GPU."""
    spec = mlp_spec(gpus="0,1")
    base, ddp = baseline_spec(spec, "dp"), ddp_spec(spec, "dp")
    plan = build_plan(base, run_id="b", local_run_dir="/r/b")
    assert plan.world_size == 1 and plan.nodes[0].nproc == 1
    assert plan.nodes[0].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert plan.entrypoint.module == "workloads.mlp"
    assert plan.entrypoint.args[-2:] == ("--mode", "dp")
    ddp_plan = build_plan(ddp, run_id="d", local_run_dir="/r/d")
    assert ddp_plan.world_size == 2 and ddp_plan.entrypoint.args[-2:] == ("--mode", "ddp")
    assert ddp_plan.nodes[0].env["CUDA_VISIBLE_DEVICES"] == "0,1"


@pytest.mark.parametrize("kw,message", [
    ({"procs": 2}, "needs at least 2 GPUs on node 0 (localhost), which has procs: 2"),
    ({"gpus": "1"}, "needs at least 2 GPUs on node 0 (localhost), which has 1 GPU"),
    ({"gpus": "0,1", "device": "cpu"}, "which has device: cpu"),
    ({"gpus": "0,1", "workload": "resnet"}, "mlp workload's --mode dp, but the workload here "
                                            "is resnet"),
])
def test_dp_baseline_is_refused_without_two_gpus_or_on_another_workload(kw, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        baseline_spec(mlp_spec(**kw), "dp")
    assert str(caught.value).startswith("command line: --baseline dp: ")
    assert "ddp-orch compare --local --workload mlp --gpus 0,1 --baseline dp" in \
        str(caught.value).split("hint: ")[1]


def test_compare_baseline_dp_on_cpu_processes_exits_2_before_running(tmp_path):
    proc = run_cli("compare", "--local", "--workload", "mlp", "--procs", "2", "--baseline", "dp",
                   "--runs-dir", str(tmp_path / "runs"), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--baseline dp: nn.DataParallel needs at least 2 GPUs on node 0" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


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
