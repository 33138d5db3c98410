"""Unit tests of report/summary.py: the run summary's lines, rendered from a
run's outcome (the live run of it stays in tests/live/test_summary.py)."""

from __future__ import annotations

from orchestrator.records.outcome import RunOutcome, RunState
from orchestrator.report.summary import render_summary
from orchestrator.report.summary import interfaces_of


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


def test_the_summary_of_a_failed_run_lists_each_nodes_interface():
    plan = {"nodes": [{"node_rank": 0, "env": {"GLOO_SOCKET_IFNAME": "eth0"}},
                      {"node_rank": 1, "env": {"GLOO_SOCKET_IFNAME": "ens5"}},
                      {"node_rank": 2, "env": {"GLOO_SOCKET_IFNAME": "auto"}}, "junk"]}
    assert interfaces_of(plan) == {0: "eth0", 1: "ens5"}
    assert interfaces_of(None) == {} and interfaces_of([1]) == {}
