"""The end-of-run summary says where the training data came from."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from orchestrator.records.outcome import RunOutcome, RunState
from orchestrator.report.summary import render_summary


def summary_of(result: dict) -> str:
    return render_summary(RunOutcome("r", RunState.SUCCEEDED, 1.0, (), None, result), "/runs/r")


def mnist_result(data: str, source: str, data_mode: str = "auto") -> dict:
    """What mnist's result.json holds about its data (harness.datasets.load)."""
    return {"world_size": 1, "metrics": {"final_loss": 2.3}, "data": data,
            "data_source": source, "config": {"data": data_mode, "data_dir": "./data"}}


def test_summary_says_a_builtin_fell_back_to_synthetic_data_and_why():
    out = summary_of(mnist_result(
        "synthetic", "SYNTHETIC MNIST-shaped data, no MNIST/raw under /w/runs/r/node-0/data"))
    assert "data: SYNTHETIC MNIST-shaped data, no MNIST/raw under /w/runs/r/node-0/data\n" in out
    assert "hint: the real dataset was not found, so the run trained on synthetic data; " \
           "data_dir (./data) is read on each node" in out
    assert "--arg data_dir=/path/to/data" in out and "data=real" in out


def test_summary_names_real_data_and_asked_for_synthetic_data_without_a_hint():
    real = summary_of(mnist_result("real", "MNIST from /data"))
    assert "data: MNIST from /data\n" in real and "hint:" not in real
    asked = summary_of(mnist_result("synthetic", "SYNTHETIC MNIST-shaped data, --data synthetic",
                                    data_mode="synthetic"))
    assert "data: SYNTHETIC MNIST-shaped data, --data synthetic\n" in asked
    assert "hint:" not in asked


def test_summary_has_no_data_line_for_results_that_do_not_say():
    assert "data:" not in summary_of({"world_size": 2, "metrics": {}})
    assert "data:" not in summary_of({"world_size": 2, "metrics": {}, "data": "none"})  # noop
    assert "data: generated\n" in summary_of({"world_size": 2, "metrics": {}, "data": "generated"})


@pytest.mark.live
def test_up_summary_of_mnist_without_its_data_dir_says_synthetic(tmp_path):
    """The newcomer's case: mnist's default ./data is not in the ranks'
    working directory, so it trains on synthetic data; the summary says so."""
    runs = str(tmp_path / "runs")
    proc = run_cli("up", "--local", "--workload", "mnist", "--procs", "1", "--runs-dir", runs,
                   "--run-id", "mn", "--quiet", "--arg", "epochs=1", "--arg", "train_samples=32",
                   "--arg", "test_samples=16", "--arg", "global_batch_size=16",
                   "--arg", "num_workers=0", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "runs" / "mn" / "result.json").read_text())
    assert result["data"] == "synthetic"
    assert f"data: {result['data_source']}\n" in proc.stdout
    assert "no MNIST/raw under" in result["data_source"]
    assert "hint: the real dataset was not found" in proc.stdout
