"""The collective smoke test's rows (``controller/collective.py``) from the
``collective`` workload's result, and the spec it runs: the run's layout
and env, the built-in in place of the program, NCCL at INFO into files."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

from orchestrator.records.outcome import EndReason
from orchestrator.config.loader import load_cluster_text
from orchestrator.controller.collective import smoke_options, smoke_rows, smoke_spec
from orchestrator.engine.options import LaunchOptions

HOSTS = {0: "gpu-a", 1: "gpu-b", 2: "gpu-c"}


def pair(a, b, **said):
    return {"nodes": [a, b], "ranks": [a * 4, b * 4], **said}


def result(pairs, gang, backend="nccl"):
    return {"workload": "collective", "backend": backend, "world_size": 12, "bound_s": 10.0,
            "nodes": [{"node": k, "host": h, "ranks": [k * 4]} for k, h in HOSTS.items()],
            "pairs": pairs, "gang": gang}


def test_every_pair_and_the_gang_with_their_time_bandwidth_and_transport():
    rows = smoke_rows(result([pair(0, 1, ok=True, seconds=0.0123, busbw_gbps=11.5),
                              pair(0, 2, ok=True, seconds=0.02, busbw_gbps=None)],
                             {"ok": True, "seconds": 0.5, "busbw_gbps": 42.0,
                              "transports": ["IB", "P2P"]}), HOSTS)
    assert [(r.node_rank, r.check, r.ok, r.detail) for r in rows] == [
        (0, "collective", True, "node 0 (gpu-a) <-> node 1 (gpu-b): all-reduce in 0.012s, "
                                "bus 11.50 GB/s"),
        (0, "collective", True, "node 0 (gpu-a) <-> node 2 (gpu-c): all-reduce in 0.020s"),
        (-1, "collective", True, "the whole gang (12 ranks on 3 node(s), nccl): all-reduce in "
                                 "0.500s, bus 42.00 GB/s (IB, P2P)")]


def test_a_pair_that_hangs_is_named_with_the_likely_cause_and_the_gang_not_tried():
    rows = smoke_rows(result([pair(0, 1, ok=True, seconds=0.01, busbw_gbps=1.0),
                              pair(1, 2, ok=False, hang=True,
                                   error="no answer within 10s from node 2")],
                             {"ok": None, "error": "not tried: a pair of nodes failed, and the "
                                                   "whole gang's all-reduce would wait on it"}),
                      HOSTS)
    failed = [r for r in rows if not r.ok]
    assert len(failed) == 1 and failed[0].node_rank == 1
    assert failed[0].detail.startswith("node 1 (gpu-b) <-> node 2 (gpu-c): no answer within 10s "
                                       "from node 2 (a hang); likely a firewall between these "
                                       "two hosts: NCCL's connections use ports of their own")
    assert "NCCL_SOCKET_IFNAME" in failed[0].detail and "ibstat" in failed[0].detail
    assert rows[-1].warning and rows[-1].detail.endswith("not tried: a pair of nodes failed, "
                                                         "and the whole gang's all-reduce would "
                                                         "wait on it")


def test_a_gang_that_fails_after_every_pair_passed_is_within_a_node():
    rows = smoke_rows(result([pair(0, 1, ok=True, seconds=0.01)],
                             {"ok": False, "hang": True,
                              "error": "no answer within 10s from rank(s) 5"}), HOSTS)
    assert not rows[-1].ok
    assert "so it is within a node: GPU peer-to-peer (NCCL_P2P_DISABLE=1" in rows[-1].detail
    gloo = smoke_rows(result([], {"ok": False, "error": "boom"}, backend="gloo"), HOSTS)
    assert "P2P" not in gloo[-1].detail


def test_a_smoke_run_with_no_result_says_its_root_cause_and_hint():
    root = SimpleNamespace(node_rank=1, host="gpu-b", failures=(), why=EndReason.FAILED,
                           reason="torchrun exited 1; rank 4 (local rank 0) failed: "
                                  "RuntimeError: CUDA error: no kernel image is available for "
                                  "execution on the device")
    outcome = SimpleNamespace(root_cause=root, nodes=(root,), state="failed")
    [row] = smoke_rows(None, HOSTS, outcome, "/runs/x")
    assert not row.ok and row.detail.startswith("the smoke run failed: node 1 (gpu-b): torchrun "
                                                "exited 1")
    assert "no kernel built for its GPU" in row.detail and row.detail.endswith("(its run: "
                                                                               "/runs/x)")


def test_the_smoke_run_is_the_runs_layout_and_env_with_the_builtin_and_no_extras():
    spec = load_cluster_text(textwrap.dedent("""\
        name: train
        env: {NCCL_DEBUG: WARN, FOO: bar}
        max_restarts: 2
        hang_timeout: 600
        nodes:
          - {host: gpu-a, gpus: free:2}
          - {host: gpu-b, gpus: '0,1'}
        setup: [pip install -r requirements.txt]
        outputs: [out/]
        workload: {name: linear, args: {epochs: 5}}
        """), source="c.yaml")
    smoke = smoke_spec(spec, 12)
    assert smoke.nodes == spec.nodes and smoke.device == spec.device
    assert (smoke.workload.name, dict(smoke.workload.args)) == ("collective", {"bound": 12})
    assert smoke.env == {"NCCL_DEBUG": "INFO", "FOO": "bar", "NCCL_DEBUG_SUBSYS": "INIT,NET",
                         "NCCL_DEBUG_FILE": "nccl-debug.%h.%p"}
    assert (smoke.setup, smoke.outputs, smoke.max_restarts, smoke.hang_timeout) == \
        ((), (), 0, None)
    assert smoke.name == "train-collective"
    options = smoke_options(LaunchOptions(detach=True, max_restarts=3, wait_gpus_s=60), 12)
    assert (options.detach, options.max_restarts, options.hang_timeout_s,
            options.wait_gpus_s) == (False, 0, 96.0, 60)


def test_a_smoke_run_that_cannot_start_is_a_row_not_an_error():
    from orchestrator.controller.collective import run_smoke
    from orchestrator.errors import LaunchError

    spec = load_cluster_text("nodes: [{host: a, procs: 1}, {host: b, procs: 1}]\n"
                             "workload: {name: noop}\n", source="c.yaml")

    def refused(_spec):
        raise LaunchError("connecting to the nodes failed: node 1 (b): unreachable")

    [row] = run_smoke(spec, refused)
    assert not row.ok and row.detail == ("the smoke run could not start: connecting to the "
                                         "nodes failed: node 1 (b): unreachable")
