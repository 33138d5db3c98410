"""What a newcomer meets in the first hour (issue 22, first items): errors a
person can act on and listings in the order they promise."""

from __future__ import annotations

import json
import os
import time

import pytest

from conftest import run_cli
from orchestrator.config.loader import load_cluster_text
from orchestrator.errors import ConfigError
from orchestrator.records.rundir import RunDir
from orchestrator.records.store import list_runs


def test_a_run_id_already_taken_is_a_clear_error_not_a_traceback(tmp_path):
    RunDir.create(str(tmp_path), "mine")
    with pytest.raises(ConfigError) as caught:
        RunDir.create(str(tmp_path), "mine")
    assert "run id 'mine' is already taken" in str(caught.value)
    result = run_cli("up", "--local", "--workload", "noop", "--procs", "1",
                     "--runs-dir", str(tmp_path), "--run-id", "mine")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "FileExistsError" not in result.stderr
    assert "--run-id: run id 'mine' is already taken" in result.stderr
    assert "hint: choose another --run-id" in result.stderr
    # The dry-run refuses what `up` refuses, in the same words (issue 32 item 7).
    dry = run_cli("up", "--local", "--workload", "noop", "--procs", "1", "--dry-run",
                  "--runs-dir", str(tmp_path), "--run-id", "mine")
    assert (dry.returncode, dry.stdout, dry.stderr) == (2, "", result.stderr)
    fresh = run_cli("up", "--local", "--workload", "noop", "--procs", "1", "--dry-run",
                    "--runs-dir", str(tmp_path), "--run-id", "other")
    assert fresh.returncode == 0, fresh.stderr
    assert not (tmp_path / "other").exists()  # a dry-run creates nothing


@pytest.mark.parametrize("word", ["gpu", "GPU", "gpus"])
def test_device_gpu_suggests_cuda_not_cpu(word):
    with pytest.raises(ConfigError) as caught:
        load_cluster_text(f"device: {word}\nnodes: [{{host: a, gpus: 0}}]\n"
                          "workload: {name: noop}\n")
    assert "did you mean 'cuda'?" in str(caught.value) and "device" in str(caught.value)


def test_ps_lists_the_newest_run_first_by_start_time_not_by_name(tmp_path):
    """``sleepy-...120647`` started before ``short-...120735``: ids that sort
    the other way must not reorder the listing."""
    now = time.time()
    for run_id, started in (("short-20261124-120735", now), ("sleepy-20261124-120647", now - 48),
                            ("aaa-20261124-120700", now - 20)):
        run = RunDir.create(str(tmp_path), run_id)
        with open(run.file("state.json"), "w", encoding="utf-8") as fh:
            json.dump({"run_id": run_id, "backend": "local", "state": "succeeded",
                       "started": started, "nodes": []}, fh)
    assert [r.run_id for r in list_runs(str(tmp_path))] == [
        "short-20261124-120735", "aaa-20261124-120700", "sleepy-20261124-120647"]
    shown = run_cli("ps", "--runs-dir", str(tmp_path)).stdout.splitlines()
    listed = shown[1:-1]  # between the header and the line naming the runs directory
    assert [line.split()[0] for line in listed] == [
        "short-20261124-120735", "aaa-20261124-120700", "sleepy-20261124-120647"]
    assert os.path.isdir(tmp_path / "short-20261124-120735")
