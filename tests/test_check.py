"""`ddp-orch check` against the SSH lab: a healthy cluster, a dead host, a busy port."""

from __future__ import annotations

import socket

import pytest

from conftest import run_cli
from labhome import lab_cluster, lab_home

pytestmark = pytest.mark.live


def rows(stdout: str) -> dict[tuple[str, str], str]:
    """{(node, check): 'ok'|'FAIL'} from the check table."""
    out = {}
    for line in stdout.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 4 and parts[3] in ("ok", "FAIL"):
            out[(parts[0], parts[2])] = parts[3]
    return out


def test_healthy_cluster_passes_every_check(ssh_lab, tmp_path):
    env = lab_home(ssh_lab, tmp_path)
    cluster = lab_cluster(ssh_lab, tmp_path, ["{host: node0, procs: 1}", "{host: node1, procs: 2}"],
                          "workload: {name: noop}\n", name="healthy")
    result = run_cli("check", cluster, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    table = rows(result.stdout)
    for node in ("0", "1"):
        for check in ("reach", "python", "torch", "reach-master"):
            assert table[(node, check)] == "ok"
    assert table[("0", "master-port")] == "ok"
    assert "all checks passed" in result.stdout


def test_dead_host_and_busy_port_are_reported(make_ssh_lab, tmp_path):
    lab = make_ssh_lab(3)
    env = lab_home(lab, tmp_path)
    busy = socket.socket()
    busy.bind(("", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    lab.stop_host("node2")
    cluster = lab_cluster(lab, tmp_path, ["{host: node0, procs: 1}", "{host: node1, procs: 1}",
                                          "{host: node2, procs: 1}"],
                          "workload: {name: noop}\n", extra=f"master: {{port: {port}}}\n",
                          name="sick")
    try:
        result = run_cli("check", cluster, env=env, timeout=120)
    finally:
        busy.close()
    assert result.returncode == 1, result.stdout + result.stderr
    table = rows(result.stdout)
    assert table[("2", "reach")] == "FAIL" and table[("0", "reach")] == "ok"
    assert "unreachable" in result.stdout or "refused" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr

    lab.start_host("node2")
    busy = socket.socket()
    busy.bind(("", port))
    busy.listen(1)
    try:
        result = run_cli("check", cluster, env=env, timeout=120)
    finally:
        busy.close()
    assert result.returncode == 1, result.stdout + result.stderr
    table = rows(result.stdout)
    assert table[("0", "master-port")] == "FAIL"
    assert f"master port {port}" in result.stdout and "already in use" in result.stdout
