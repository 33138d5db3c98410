"""`ddp-orch check` against the SSH lab and this machine: a healthy cluster,
a dead host, a busy port, an interface a node lacks, an IPv6 master."""

from __future__ import annotations

import os
import socket

import pytest

from conftest import run_cli
from labhome import lab_cluster, lab_home
from procscan import wait_gone
from netlab import require_ipv6_loopback

pytestmark = pytest.mark.live


def rows(stdout: str) -> dict[tuple[str, str], str]:
    """{(node, check): 'ok'|'warn'|'FAIL'} from the check table."""
    out = {}
    for line in stdout.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 4 and parts[3] in ("ok", "warn", "FAIL"):
            out[(parts[0], parts[2])] = parts[3]
    return out


def details(stdout: str, node: str, check: str) -> list[str]:
    """The DETAIL texts of the rows for (node, check)."""
    found = []
    for line in stdout.splitlines()[1:]:
        parts = line.split(None, 4)
        if len(parts) == 5 and parts[0] == node and parts[2] == check:
            found.append(parts[4])
    return found


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
    # the interface each node's ranks will use, chosen as `up` chooses it, and its address
    for node in ("0", "1"):
        assert table[(node, "interface")] in ("ok", "warn")
        (chosen,) = details(result.stdout, node, "interface")
        ifname, addr = chosen.split()[:2]
        assert ifname in [name for _index, name in socket.if_nameindex()] and "auto:" in chosen
        socket.inet_pton(socket.AF_INET6 if ":" in addr else socket.AF_INET, addr)
    # every node reached every other's listener on that address: one row for all pairs
    assert table[("-", "data-path")] == "ok"
    assert "2 TCP connections among 2 nodes" in details(result.stdout, "-", "data-path")[0]
    assert table[("-", "versions")] == "ok" and table[("-", "clock")] == "ok"


FAKE_TORCH = """__version__ = "2.0.0+other"
class version:
    cuda = None
class cuda:
    @staticmethod
    def is_available():
        return False
"""


def test_a_torch_version_that_differs_between_nodes_fails_check(ssh_lab, tmp_path):
    """Node 1's python is a virtualenv whose torch (a stand-in module: no
    second torch is installed here) says another version."""
    import subprocess
    import sys

    venv = tmp_path.parent / f"{tmp_path.name}-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(FAKE_TORCH)
    env = lab_home(ssh_lab, tmp_path)
    nodes = ["{host: node0, procs: 1}", f"{{host: node1, procs: 1, python: {venv}/bin/python}}"]
    cluster = lab_cluster(ssh_lab, tmp_path, nodes, "workload: {name: noop}\n", name="versions")
    result = run_cli("check", cluster, env=env, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    table = rows(result.stdout)
    assert table[("0", "torch")] == table[("1", "torch")] == "ok"
    assert details(result.stdout, "1", "torch")[0].startswith("torch 2.0.0+other")
    real = details(result.stdout, "0", "torch")[0].split()[1].rstrip(",")  # this venv's
    assert table[("-", "versions")] == "FAIL"
    assert details(result.stdout, "-", "versions") == [
        f"torch differs between nodes (node 0 (node0): {real}, node 1 (node1): 2.0.0+other); "
        "use one version everywhere"]
    assert "1 check(s) failed" in result.stdout


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


def test_an_interface_a_node_lacks_fails_check_and_up_starts_nothing(ssh_lab, tmp_path):
    env = lab_home(ssh_lab, tmp_path)
    cluster = lab_cluster(ssh_lab, tmp_path, [
        "{host: node0, procs: 1}",
        "{host: node1, procs: 1, env: {GLOO_SOCKET_IFNAME: nic9}}"],
        "workload: {name: noop}\n", name="noif")
    result = run_cli("check", cluster, env=env, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    table = rows(result.stdout)
    assert table[("1", "interface")] == "FAIL" and table[("0", "interface")] == "ok"
    (why,) = details(result.stdout, "1", "interface")
    present = [name for _index, name in socket.if_nameindex()]
    assert "GLOO_SOCKET_IFNAME=nic9" in why and f"its interfaces are {', '.join(present)}" in why
    assert "1 check(s) failed" in result.stdout

    up = run_cli("up", cluster, "--run-id", "noif", "--runs-dir", str(tmp_path / "runs"),
                 "--start-timeout", "60", env=env, timeout=120)
    assert up.returncode == 1, up.stdout + up.stderr
    assert "connecting to the nodes failed" in up.stderr
    assert "node 1 (node1): no interface for GLOO_SOCKET_IFNAME=nic9" in up.stderr
    assert f"its interfaces are {', '.join(present)}" in up.stderr
    assert "Traceback" not in up.stderr and "started" not in up.stdout
    assert wait_gone("noif", 15, labs=[ssh_lab]) == set()
    assert not list((tmp_path / "remote").rglob("torchrun"))  # no torchrun ran anywhere


def test_ipv6_loopback_master_works_in_check_and_up(tmp_path):
    require_ipv6_loopback()
    cluster = tmp_path / "v6.yaml"
    cluster.write_text('master: {addr: "::1"}\n'
                       "nodes:\n  - {host: localhost, procs: 1}\n  - {host: localhost, procs: 1}\n"
                       "workload: {name: noop}\n")
    dry = run_cli("up", str(cluster), "--dry-run", timeout=60)
    assert "master     [::1]:auto (a free port on node 0" in dry.stdout
    assert "--master-addr ::1 " in dry.stdout  # torchrun takes the address bare
    result = run_cli("check", str(cluster), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    table = rows(result.stdout)
    assert table[("0", "master-port")] == "ok"
    for node in ("0", "1"):
        assert table[(node, "reach-master")] == "ok"
        assert details(result.stdout, node, "reach-master")[0].startswith("[::1]:")
        assert details(result.stdout, node, "interface")[0].startswith("lo ::1 ")
    assert table[("-", "data-path")] == "ok"
    up = run_cli("up", str(cluster), "--run-id", "v6up", "--runs-dir", str(tmp_path / "runs"),
                 timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "all_reduce_ok=True" in up.stdout
    assert wait_gone("v6up", 15) == set()
    assert os.path.exists(tmp_path / "runs" / "v6up" / "result.json")


# -- on hosts with networks of their own (tests/labs/netlab.py) ---------------------

def lab_check(lab, tmp_path, name: str, extra: str = "") -> tuple:
    env = lab_home(lab, tmp_path)
    cluster = lab_cluster(lab, tmp_path, [f"{{host: node{k}, procs: 1}}"
                                          for k in range(lab.n_hosts)],
                          "workload: {name: noop}\n", extra=extra, name=name)
    result = run_cli("check", cluster, env=env, timeout=180)
    return result, rows(result.stdout)


def test_healthy_net_lab_passes_and_warns_of_host_names_on_loopback(net_lab, tmp_path):
    result, table = lab_check(net_lab, tmp_path, "netok")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed (2 warning(s))" in result.stdout
    for host in net_lab.hosts:
        k = str(host.index)
        assert table[(k, "interface")] == "ok"
        assert details(result.stdout, k, "interface")[0].startswith(f"{host.nic} {host.addr} ")
        assert table[(k, "hostname")] == "warn"
        assert details(result.stdout, k, "hostname") == [
            f"its host name {host.hostname} resolves to 127.0.1.1 (loopback), which Gloo would "
            f"advertise to its peers; its ranks use {host.nic} ({host.addr}) instead"]
        assert table[(k, "reach-master")] == "ok"
    assert table[("-", "data-path")] == "ok"


def test_an_unreachable_pair_is_named_and_fails(make_net_lab, tmp_path):
    lab = make_net_lab(3, unreachable=[(1, 2)])
    result, table = lab_check(lab, tmp_path, "netpair")
    assert result.returncode == 1, result.stdout + result.stderr
    a1, a2 = lab.hosts[1].addr, lab.hosts[2].addr
    failing = details(result.stdout, "1", "data-path") + details(result.stdout, "2", "data-path")
    # node 1 has an unreachable route to node 2: refused at once; node 2's SYN
    # reaches node 1, whose answer has no route back: a timeout
    assert any(f.startswith(f"node 1 (node1) -> node 2 (node2) {a2}:") and
               f.endswith("No route to host") for f in failing), failing
    assert any(f.startswith(f"node 2 (node2) -> node 1 (node1) {a1}:") for f in failing), failing
    assert len(failing) == 2  # the pairs with node 0 pass and are not listed
    assert all(table[(str(k), "reach-master")] == "ok" for k in range(3))
    assert "2 check(s) failed" in result.stdout


def test_ipv6_net_lab_probes_and_shows_addresses_in_brackets(make_net_lab, tmp_path):
    lab = make_net_lab(2, family="ipv6")
    result, table = lab_check(lab, tmp_path, "netsix")
    assert result.returncode == 0, result.stdout + result.stderr
    master = lab.hosts[0].addr
    for k in ("0", "1"):
        assert details(result.stdout, k, "reach-master")[0].startswith(f"[{master}]:")
        assert table[(k, "interface")] == "ok"
    assert table[("-", "data-path")] == "ok"


def test_a_node_that_cannot_reach_the_master_fails_reach_master(make_net_lab, tmp_path):
    lab = make_net_lab(2, unreachable=[(1, 0)])
    result, table = lab_check(lab, tmp_path, "nomaster")
    assert result.returncode == 1, result.stdout + result.stderr
    assert table[("0", "reach-master")] == "ok" and table[("1", "reach-master")] == "FAIL"
    (why,) = details(result.stdout, "1", "reach-master")
    assert why.startswith(f"cannot open TCP to {lab.hosts[0].addr}:") and \
        "(No route to host); check master.addr and firewalls" in why, why


# -- the collective smoke test -----------------------------------------------------------

def test_the_collective_smoke_test_names_a_pair_a_firewall_blocks(make_net_lab, tmp_path):
    """Three hosts, one CPU process each (gloo); an nftables rule in node 2's
    namespace drops what node 1 sends: SSH and the master port on node 0
    stay open, as on a host whose firewall opens only those. `check
    --collective` runs the all-reduce of every pair of nodes on the run's own
    layout and env: pairs 0-1 and 0-2 complete, timed, pair 1-2 is named
    with the likely cause, and the gang's all-reduce is not tried. `up
    --preflight collective` refuses to launch on it, and nothing is left."""
    lab = make_net_lab(3, blocked=[(1, 2)])
    env = lab_home(lab, tmp_path)
    nodes = [f"{{host: {h.alias}, procs: 1}}" for h in lab.hosts]
    cluster = lab_cluster(lab, tmp_path, nodes, "workload: {name: noop}\n", name="smoke")
    runs = str(tmp_path / "runs")
    result = run_cli("check", cluster, "--collective", "--bound", "10", "--runs-dir", runs,
                     env=env, timeout=300)
    print(result.stdout)
    assert result.returncode == 1, result.stdout + result.stderr
    smoke = [line.split(None, 4)[4] for line in result.stdout.splitlines()
             if len(line.split()) > 4 and line.split()[2] == "collective"]
    assert len(smoke) == 4, result.stdout
    assert smoke[0].startswith("node 0 (node0) <-> node 1 (node1): all-reduce in "), smoke
    assert smoke[1].startswith("node 0 (node0) <-> node 2 (node2): all-reduce in "), smoke
    assert " GB/s" in smoke[0] and " GB/s" in smoke[1]
    assert smoke[2].startswith("node 1 (node1) <-> node 2 (node2): "), smoke
    assert "likely a firewall between these two hosts: Gloo's connections use ports of " \
           "their own" in smoke[2]
    assert smoke[3].startswith("the whole gang (3 ranks on 3 node(s), gloo): not tried: a pair "
                               "of nodes failed"), smoke
    table = rows(result.stdout)
    assert table[("1", "collective")] == "FAIL" and table[("0", "collective")] == "ok"

    up = run_cli("up", cluster, "--preflight", "collective", "--run-id", "smoke-up",
                 "--runs-dir", runs, env=env, timeout=300)
    out = up.stdout + up.stderr
    print(out)
    assert up.returncode == 1, out
    assert "node 1 (node1) <-> node 2 (node2): " in up.stdout
    assert "the collective smoke test failed: nothing launched" in up.stdout
    assert not os.path.exists(os.path.join(runs, "smoke-up")), os.listdir(runs)
    for run in os.listdir(runs):
        assert wait_gone(run, 20, labs=[lab]) == set()
