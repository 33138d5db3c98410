"""Unit tests of report/summary.py: the run summary's lines, rendered from a
run's outcome (the live run of it stays in tests/live/test_summary.py)."""

from __future__ import annotations

from orchestrator.records.outcome import EndReason, RunOutcome, RunState, WorkerFailure
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


def test_summary_names_each_speed_option_of_a_builtin_after_its_data():
    """(issue 46) resnet on a GPU with the defaults, as its result records
    them (``workloads/harness/speed.py``); the line's words are
    ``catalog.describe_speed``'s, tested with it."""
    speed = {"device": "cuda", "amp": "bf16", "amp_requested": "auto", "tf32": "on",
             "channels_last": True, "cudnn_benchmark": True, "seed_settings": False,
             "loader_workers": 3, "loader_workers_auto": True}
    out = summary_of({**mnist_result("real", "CIFAR-10 from /data"), "speed": speed})
    assert ("data: CIFAR-10 from /data\nspeed: amp bf16 (auto), tf32 on, channels_last on, "
            "cudnn.benchmark on; 3 loader workers per rank (auto)\n") in out
    assert "speed:" not in summary_of(mnist_result("real", "MNIST from /data"))
    assert "speed:" not in summary_of({"world_size": 2, "metrics": {}, "speed": {}})


def test_the_summary_of_a_failed_run_lists_each_nodes_interface():
    plan = {"nodes": [{"node_rank": 0, "env": {"GLOO_SOCKET_IFNAME": "eth0"}},
                      {"node_rank": 1, "env": {"GLOO_SOCKET_IFNAME": "ens5"}},
                      {"node_rank": 2, "env": {"GLOO_SOCKET_IFNAME": "auto"}}, "junk"]}
    assert interfaces_of(plan) == {0: "eth0", 1: "ens5"}
    assert interfaces_of(None) == {} and interfaces_of([1]) == {}


def failed_run(reason: str, failures: tuple = (), why: EndReason = EndReason.FAILED,
               ) -> RunOutcome:
    from orchestrator.records.outcome import NodeOutcome, NodeState

    root = NodeOutcome(1, "gpu-b", NodeState.FAILED, 1, reason, 10.0, failures, why=why)
    other = NodeOutcome(0, "gpu-a", NodeState.STOPPED, None, "stopped by the controller", 10.5, why=EndReason.STOPPED)
    return RunOutcome("r", RunState.FAILED, 12.0, (other, root), root, None)


INTERFACES = {"nodes": [{"node_rank": 0, "env": {"GLOO_SOCKET_IFNAME": "eth0"}},
                        {"node_rank": 1, "env": {"GLOO_SOCKET_IFNAME": "ens5"}}]}


def test_the_interfaces_are_listed_after_a_network_failure_only():
    """Issue #32: under the default interface choice every failure summary
    ended with `network: node 0 eth0, ...` whatever the cause."""
    line = "network: node 0 eth0, node 1 ens5"
    network = [
        failed_run("torchrun exited 1; rank 2 (local rank 0) failed: RuntimeError: Gloo "
                   "connectFullMesh failed with ... remote=[127.0.1.1]:7569"),
        failed_run("nothing from the node for 30s (a silent partition or a frozen node)",
                   why=EndReason.SILENT),
        failed_run("did not join the rendezvous before the start timeout",
                   why=EndReason.START_TIMEOUT),
        failed_run("connection lost without an exit status", why=EndReason.CONNECTION_LOST),
        failed_run("torchrun exited 1", (WorkerFailure(0, "socketStartConnect: Connect to "
                                                          "10.0.0.2<45763> failed", 1.0),)),
    ]
    for outcome in network:
        assert line in render_summary(outcome, "/runs/r", INTERFACES), outcome.root_cause.reason
    for reason in ("torchrun exited 1; rank 2 (local rank 0) failed: ValueError: bad batch",
                   "torchrun exited 1; rank 0 (local rank 0) failed: SIGKILL",
                   "setup failed: pip install exited 1",
                   # our words alone, with no reason to say them, say nothing
                   "nothing from the node for 30s (a silent partition or a frozen node)"):
        assert "network:" not in render_summary(failed_run(reason), "/runs/r", INTERFACES), reason


def test_the_outputs_line_after_a_failure_only_when_it_says_something():
    """Issue #32: every failure summary ended with "outputs: 0 file(s)" (and
    the patterns the crashed program never wrote). After a failure the line
    stays only where files came home or some did not come for a reason; a
    success always says what came home, nothing included."""
    nothing = {"files": [], "unmatched": ["out/*.png"]}
    some = {"files": [{"path": "out/ckpt.pt", "size": 2048}]}
    broken = {"files": [], "error": "node 0 could not be reached"}
    refused = {"files": [], "refused": [{"path": "out/big.bin", "why": "over 256 MiB"}]}
    fail = failed_run("exit 1")
    assert "outputs:" not in render_summary(fail, "/runs/r", outputs=nothing)
    assert "outputs: 1 file(s), 2.0 KiB in /runs/r/outputs/ (out/ckpt.pt)" in \
        render_summary(fail, "/runs/r", outputs=some)
    assert "  not fetched: node 0 could not be reached" in \
        render_summary(fail, "/runs/r", outputs=broken)
    assert "  refused: out/big.bin: over 256 MiB" in render_summary(fail, "/runs/r",
                                                                    outputs=refused)
    ok = RunOutcome("r", RunState.SUCCEEDED, 1.0, (), None, None)
    shown = render_summary(ok, "/runs/r", outputs=nothing)
    assert "outputs: 0 file(s), 0 B in /runs/r/outputs/\n  no match on node 0: out/*.png\n" \
        in shown
