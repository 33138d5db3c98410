"""The failure hints (orchestrator/records/hints.py) on real runs: a real Gloo
loopback failure in the network lab, and a host name that does not resolve.
The rules themselves are unit-tested on real error lines in
tests/unit/records/test_records_hints.py.
"""

from __future__ import annotations

import pytest

from conftest import run_cli
from labhome import lab_cluster, lab_home

# The same failure towards a peer with a routable address (the line above, its address changed)
# Node 0 of three, where nodes 1 and 2 could not reach each other: a peer never took part


@pytest.mark.live
def test_the_summary_of_a_real_loopback_failure_carries_the_hint(net_lab, tmp_path):
    """Gloo left to itself on hosts whose names resolve to 127.0.1.1 (network: off)."""
    env = lab_home(net_lab, tmp_path)
    cluster = lab_cluster(net_lab, tmp_path,
                          ["{host: node0, procs: 1}", "{host: node1, procs: 1}"],
                          "workload: {name: noop}\n", extra="network: {interface: off}\n",
                          name="gloo-alone")
    result = run_cli("up", cluster, "--run-id", "gloo-alone", "--runs-dir", str(tmp_path / "runs"),
                     "--grace", "3", "--start-timeout", "60", env=env, timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    root = next(i for i, line in enumerate(lines) if line.startswith("root cause: "))
    assert "Gloo connectFullMesh failed" in lines[root] and "remote=[127.0.1.1]" in lines[root]
    hint = lines[root + 1]
    assert hint.startswith("hint: node ") and "advertised a loopback address (127.0.1.1:" in hint
    assert "network: {interface: auto}" in hint and "GLOO_SOCKET_IFNAME=<its NIC>" in hint
    status = run_cli("status", "gloo-alone", "--runs-dir", str(tmp_path / "runs"))
    assert hint in status.stdout.splitlines()


@pytest.mark.live
def test_a_host_name_that_does_not_resolve_is_not_blamed_on_python(tmp_path):
    cluster = tmp_path / "typo.yaml"
    cluster.write_text("nodes:\n  - {host: nosuchhost.invalid, procs: 1}\n"
                       "workload: {name: noop}\n")
    home = tmp_path / "home"
    home.mkdir()
    result = run_cli("up", str(cluster), "--runs-dir", str(tmp_path / "runs"),
                     env={"HOME": str(home)}, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cannot resolve host name 'nosuchhost.invalid'" in result.stderr
    assert "check the host name for a typo" in result.stderr
    assert "set `python:`" not in result.stderr and "Traceback" not in result.stderr
