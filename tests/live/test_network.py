"""Each node's interface for its ranks (plan/network.py, agent/node/netroute.py):
the plan's rules, the node's choice, and where the choice shows."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from orchestrator.report.summary import interfaces_of


@pytest.mark.live  # a real local run: seconds
def test_a_local_run_records_the_interface_its_ranks_used(tmp_path):
    result = run_cli("up", "--local", "--workload", "noop", "--procs", "2",
                     "--runs-dir", str(tmp_path), "--run-id", "net")
    assert result.returncode == 0, result.stdout + result.stderr
    plan = json.loads((tmp_path / "net" / "plan.json").read_text())
    assert interfaces_of(plan) == {0: "lo"}
    assert plan["nodes"][0]["env"]["NCCL_SOCKET_IFNAME"] == "=lo"
    dry = run_cli("up", "--local", "--workload", "noop", "--procs", "2", "--dry-run")
    assert "GLOO_SOCKET_IFNAME=auto" in dry.stdout
