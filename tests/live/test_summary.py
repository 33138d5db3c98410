"""The end-of-run summary says where the training data came from."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli


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
    # (issue 46) and how fast it ran: the speed options, on the CPU
    assert ("speed: on the CPU: amp off (auto) (TF32, channels_last and cuDNN's benchmark are "
            "GPU options); 0 loader workers per rank\n") in proc.stdout
    assert result["speed"]["amp"] == "off" and result["amp"] == "off"
