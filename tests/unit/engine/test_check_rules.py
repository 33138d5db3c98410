"""The rules of `ddp-orch check` without a cluster: address formatting, the
node-pair summary, clock skew, version differences, the host-name warning,
the verdict, and IPv6 addresses in the loader and the agent's port probe."""

from __future__ import annotations

import socket

import pytest
from netlab import require_ipv6_loopback

from orchestrator.agent.node import probes
from orchestrator.agent.wire.addr import hostport
from orchestrator.engine.preflight import CheckResult, Preflight
from orchestrator.engine.checknet import (NodeNet, clock_offset, clock_rows,
                                            hostname_row, pair_rows, version_rows)
from orchestrator.config.loader import load_cluster_text
from orchestrator.errors import ConfigError
from orchestrator.plan.model import NodePlan
from orchestrator.report.runs import render_check


# -- hostport ----------------------------------------------------------------

@pytest.mark.parametrize("addr, port, shown", [
    ("10.0.0.1", 29500, "10.0.0.1:29500"),
    ("node0", 22, "node0:22"),
    ("gpu-a.example.com", "auto", "gpu-a.example.com:auto"),
    ("fd77::10", 36451, "[fd77::10]:36451"),
    ("::1", 1, "[::1]:1"),
    ("[fd77::10]", 36451, "[fd77::10]:36451"),  # never doubled
    ("fe80::1%eth0", 80, "[fe80::1%eth0]:80"),
])
def test_hostport(addr, port, shown):
    assert hostport(addr, port) == shown


# -- the node pairs ----------------------------------------------------------

HOSTS = {0: "a", 1: "b", 2: "c", 3: "d"}
ENDS = {0: ("10.0.0.1", 41234), 1: ("10.0.0.2", 41000), 2: ("fd77::12", 40000),
        3: ("10.0.0.4", 40404)}


def all_pairs(n: int, failing: dict | None = None) -> dict:
    failing = failing or {}
    return {(j, k): failing.get((j, k)) for j in range(n) for k in range(n) if j != k}


def test_every_pair_passing_is_one_row():
    rows = pair_rows(HOSTS, ENDS, all_pairs(4))
    assert len(rows) == 1 and rows[0].ok and rows[0].node_rank == -1
    assert "12 TCP connections among 4 nodes" in rows[0].detail


def test_failing_pairs_are_named_not_n_squared_rows():
    rows = pair_rows(HOSTS, ENDS, all_pairs(4, {(1, 0): "Connection refused",
                                                (3, 2): "No route to host"}))
    assert [r.detail for r in rows] == [
        "node 1 (b) -> node 0 (a) 10.0.0.1:41234: Connection refused",
        "node 3 (d) -> node 2 (c) [fd77::12]:40000: No route to host"]
    assert not any(r.ok for r in rows) and [r.node_rank for r in rows] == [1, 3]


def test_a_node_no_other_reaches_is_one_row():
    failing = {(j, 2): "timed out" for j in (0, 1, 3)}
    failing[(0, 1)] = "Connection refused"
    rows = pair_rows(HOSTS, ENDS, all_pairs(4, failing))
    assert [r.detail for r in rows] == [
        "node 0 (a) -> node 1 (b) 10.0.0.2:41000: Connection refused",
        "no other node reaches node 2 (c) [fd77::12]:40000: timed out"]


def test_two_nodes_show_each_failing_direction():
    rows = pair_rows(HOSTS, ENDS, {(0, 1): "timed out", (1, 0): "No route to host"})
    assert [r.detail for r in rows] == [
        "node 0 (a) -> node 1 (b) 10.0.0.2:41000: timed out",
        "node 1 (b) -> node 0 (a) 10.0.0.1:41234: No route to host"]


def test_a_node_without_a_listener_is_not_claimed_reached():
    rows = pair_rows({0: "a", 1: "b"}, {0: ENDS[0]}, {(1, 0): None})
    assert rows[0].ok and "not to node 1 (b)" in rows[0].detail
    assert pair_rows({0: "a"}, {0: ENDS[0]}, {}) == []


# -- clocks --------------------------------------------------------------------

def test_clock_offset_takes_the_middle_of_the_round_trip():
    assert clock_offset(100.0, 105.5, 101.0) == (5.0, 1.0)


def test_clocks_within_the_bound_pass():
    rows = clock_rows({0: (0.01, 0.002), 1: (-0.3, 0.002)}, HOSTS)
    assert len(rows) == 1 and rows[0].ok and not rows[0].warning
    assert "node 1 -0.30s" in rows[0].detail


def test_skew_beyond_the_bound_warns_and_names_both_nodes():
    rows = clock_rows({0: (0.0, 0.01), 1: (5.2, 0.01), 2: (0.1, 0.01)}, HOSTS)
    assert rows[0].ok and rows[0].warning
    assert rows[0].detail.startswith("node 1 (b)'s clock is 5.2s ahead of node 0 (a)'s")
    assert "more than 2s" in rows[0].detail  # docs/check.md: a warning beyond 2 s


def test_a_slow_round_trip_is_not_taken_for_skew():
    # 2.5 s apart, but each reading is only known within 1 s either way
    rows = clock_rows({0: (0.0, 2.0), 1: (2.5, 2.0)}, HOSTS)
    assert not rows[0].warning
    assert clock_rows({0: (0.0, 0.0)}, HOSTS) == []


# -- versions ------------------------------------------------------------------

def test_same_versions_are_one_ok_row():
    info = {"torch": "2.14.1+cu130", "cuda": "13.0", "nccl": "2.27.3"}
    rows = version_rows({0: info, 1: dict(info)}, HOSTS)
    assert len(rows) == 1 and rows[0].ok and not rows[0].warning
    assert rows[0].detail == "torch 2.14.1+cu130, cuda 13.0, nccl 2.27.3 on every node"


def test_torch_differing_fails_cuda_and_nccl_differing_warn():
    rows = version_rows({0: {"torch": "2.14.1", "cuda": "13.0", "nccl": "2.27.3"},
                         1: {"torch": "2.13.0", "cuda": "12.8", "nccl": "2.26.2"}}, HOSTS)
    by = {r.detail.split()[0]: r for r in rows}
    assert not by["torch"].ok
    assert "node 0 (a): 2.14.1, node 1 (b): 2.13.0" in by["torch"].detail
    assert by["CUDA"].ok and by["CUDA"].warning and by["NCCL"].ok and by["NCCL"].warning


def test_cuda_and_nccl_do_not_matter_on_a_cpu_run_and_broken_torch_is_left_out():
    rows = version_rows({0: {"torch": "2.14.1", "cuda": "13.0"},
                         1: {"torch": "2.14.1", "cuda": None},
                         2: {"torch_error": "No module named 'torch'"}}, HOSTS, device="cpu")
    assert len(rows) == 1 and rows[0].ok and not rows[0].warning
    assert version_rows({0: {"torch": "2.14.1"}}, HOSTS) == []


# -- the host name ---------------------------------------------------------------

def node(k: int, host: str) -> NodePlan:
    return NodePlan(node_rank=k, host=host, python="python3", gpus=None, first_rank=k, nproc=1,
                    run_dir="/r", env={}, unset_env=())


def test_a_host_name_on_loopback_warns_and_names_the_interface_used_instead():
    info = {"hostname": "node1", "hostname_addrs": ["127.0.1.1", "10.0.0.2"]}
    net = NodeNet(CheckResult(1, "node1", "interface", True, ""), ("10.0.0.2", 1), "ens5",
                  "10.0.0.2")
    row = hostname_row(node(1, "node1"), info, net, remote_peers=True)
    assert row.ok and row.warning and row.check == "hostname"
    assert row.detail == ("its host name node1 resolves to 127.0.1.1 (loopback), which Gloo "
                          "would advertise to its peers; its ranks use ens5 (10.0.0.2) instead")


def test_a_host_name_on_loopback_without_an_interface_says_what_to_set():
    info = {"hostname": "node1", "hostname_addrs": ["127.0.1.1"]}
    net = NodeNet(CheckResult(1, "node1", "interface", True, ""), ("10.0.0.2", 1))
    row = hostname_row(node(1, "node1"), info, net, remote_peers=True)
    assert "network: {interface: auto}" in row.detail


def test_no_host_name_warning_when_it_cannot_matter():
    loop = {"hostname": "box", "hostname_addrs": ["127.0.1.1"]}
    assert hostname_row(node(0, "localhost"), loop, None, remote_peers=False) is None
    real = {"hostname": "box", "hostname_addrs": ["10.0.0.1", "127.0.1.1"]}
    assert hostname_row(node(0, "box"), real, None, remote_peers=True) is None


# -- the verdict -------------------------------------------------------------------

def test_a_warning_passes_a_failure_fails():
    warned = Preflight((CheckResult(0, "a", "reach", True, "fine"),
                        CheckResult(-1, "*", "clock", True, "5s apart", warning=True)))
    assert warned.ok and warned.warnings == 1
    text = render_check(warned)
    assert "warn" in text.splitlines()[2] and text.endswith("all checks passed (1 warning(s))\n")
    failed = Preflight(warned.results + (CheckResult(1, "b", "data-path", False, "no"),))
    assert not failed.ok and render_check(failed).endswith("1 check(s) failed (1 warning(s))\n")


# -- IPv6 in the loader and the port probe --------------------------------------------

@pytest.mark.parametrize("given, kept", [("fd77::10", "fd77::10"), ("'[fd77::10]'", "fd77::10"),
                                         ("'::1'", "::1"), ("10.0.0.1", "10.0.0.1"),
                                         ("node0", "node0")])
def test_loader_takes_ipv6_literals_bare(given, kept):
    spec = load_cluster_text(f"master: {{addr: {given}}}\nnodes:\n  - {{host: {given}, procs: 1}}"
                             "\nworkload: {name: noop}\n")
    assert spec.master_addr == kept and spec.nodes[0].host == kept


@pytest.mark.parametrize("given", ["node0:22", "'[node0]'", "'fd77::10]'", "'10.0.0.1:29500'"])
def test_loader_refuses_a_port_or_brackets_on_a_name(given):
    with pytest.raises(ConfigError, match="is not a host name or address"):
        load_cluster_text(f"master: {{addr: {given}}}\nnodes:\n  - {{host: h, procs: 1}}\n"
                          "workload: {name: noop}\n")


def test_family_of_follows_the_master_address():
    assert probes.family_of("fd77::10") == socket.AF_INET6
    assert probes.family_of("[::1]") == socket.AF_INET6
    assert probes.family_of("10.0.0.1") == socket.AF_INET
    assert probes.family_of("localhost") in (socket.AF_INET, socket.AF_INET6)


def test_bind_and_listen_use_the_masters_family():
    require_ipv6_loopback()
    free = probes.bind(0, "::1")
    assert free["ok"]
    sock = probes.listener(free["port"], host="::1")
    try:
        assert sock.family == socket.AF_INET6
        busy = probes.bind(free["port"], "::1")
        assert not busy["ok"] and "in use" in busy["error"]
        assert probes.connect("::1", free["port"], 2)["ok"]
    finally:
        sock.close()
    mine = probes.listener(0, addr="::1")
    try:
        port = mine.getsockname()[1]
        assert probes.connect_all([["::1", port], ["127.0.0.1", port]], 2)[0] == {"ok": True}
    finally:
        mine.close()


@pytest.mark.parametrize("available, version, expected", [
    (True, (2, 27, 3), {"nccl": "2.27.3", "available": True, "count": 3}),
    (True, 2708, {"nccl": "2708", "available": True, "count": 3}),  # older torch: one number
    (False, None, {"available": False}),  # no GPU here: NCCL and the count are not asked
])
def test_the_probe_reports_nccl_only_where_cuda_works(tmp_path, available, version, expected):
    import json
    import subprocess
    import sys

    stub = tmp_path / "torch"
    (stub / "cuda").mkdir(parents=True)
    (stub / "__init__.py").write_text("from . import cuda, version\n__version__ = '2.14.1'\n")
    (stub / "version.py").write_text("cuda = '13.0'\n")
    (stub / "cuda" / "__init__.py").write_text(
        f"from . import nccl\ndef is_available():\n    return {available}\n"
        "def device_count():\n    return 3\ndef get_arch_list():\n    return ['sm_80', "
        "'sm_90']\n")
    (stub / "cuda" / "nccl.py").write_text(f"def version():\n    return {version!r}\n")
    ran = subprocess.run([sys.executable, "-c", probes._TORCH], capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path)}, timeout=60)
    got = json.loads(ran.stdout)
    # the driver's own answer, here: this machine has no libcuda
    assert got.pop("why").startswith("no CUDA driver here")
    assert got == {"torch": "2.14.1", "cuda": "13.0", "arch": ["sm_80", "sm_90"], **expected}


def plan_for(text: str):
    from orchestrator.plan.build import build_plan

    spec = load_cluster_text(text, source="c.yaml")
    return spec, build_plan(spec, run_id="r1", local_run_dir="/tmp/runs/r1")


def test_a_slow_chosen_link_is_said_with_the_override_unless_the_user_chose_it():
    from orchestrator.engine.netfacts import slow_link

    _spec, plan = plan_for("nodes: [{host: a, procs: 1}, {host: b, procs: 1}]\n"
                           "workload: {name: linear}\n")
    reply = {"ok": True, "ifname": "eno1", "addr": "10.0.0.5", "speed": 1000,
             "via": "the route to 10.0.0.1",
             "faster": {"ifname": "ens5f0", "addr": "10.1.0.5", "speed": 100000}}
    node = plan.nodes[1]
    assert slow_link(node, reply) == (
        "its ranks use eno1 (1 Gb/s, the route to 10.0.0.1), while ens5f0 (100 Gb/s, 10.1.0.5) "
        "is up: if the nodes reach each other there, set network: {interface: ens5f0} (or "
        "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME=ens5f0 in this node's `env:`)")
    assert slow_link(node, {**reply, "faster": None}) is None
    _spec, named = plan_for("network: {interface: eno1}\nnodes: [{host: a, procs: 1}, "
                            "{host: b, procs: 1}]\nworkload: {name: linear}\n")
    assert slow_link(named.nodes[1], reply) is None  # the user's choice
