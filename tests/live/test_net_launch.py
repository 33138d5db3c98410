"""Runs on hosts with networks of their own (tests/labs/netlab.py): each host a
network namespace whose host name resolves to loopback, with a docker0 that
reaches nothing and a cluster NIC named differently on each host. Gloo's
own choice fails there; each node's chosen interface must make it work,
with real sshd, real torchrun and gloo."""

from __future__ import annotations

import json
import re

import pytest

from conftest import run_cli
from labhome import lab_job
from procscan import wait_gone

pytestmark = pytest.mark.live


def ranks_seen(out: str) -> list[dict]:
    line = next(l for l in out.splitlines() if "RANKS [" in l)
    return json.loads(line.split("RANKS ", 1)[1])


def up(lab, tmp_path, name: str, nodes: list[str], *extra: str, cluster_extra: str = ""):
    env, cluster = lab_job(lab, tmp_path, name, "rank_table.py", nodes, extra=cluster_extra)
    result = run_cli("up", cluster, "--run-id", name, "--runs-dir", str(tmp_path / "runs"),
                     "--grace", "3", "--start-timeout", "60", *extra, env=env, timeout=240)
    return result, cluster, env


def assert_table_is_the_plan(result, tmp_path, name: str, lab) -> list[dict]:
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "*_SOCKET_IFNAME" not in out
    plan = json.loads((tmp_path / "runs" / name / "plan.json").read_text())
    seen = ranks_seen(result.stdout)
    assert [(r["rank"], r["node_rank"], r["local_rank"]) for r in seen] == \
        [(r["rank"], r["node_rank"], r["local_rank"]) for r in plan["ranks"]]
    for r in seen:  # every rank on its own host's NIC, found there
        host = lab.hosts[r["node_rank"]]
        assert r["hostname"] == host.hostname
        assert (r["gloo"], r["nccl"]) == (host.nic, f"={host.nic}"), r
        env = plan["nodes"][r["node_rank"]]["env"]
        assert env["GLOO_SOCKET_IFNAME"] == host.nic
    return seen


def test_the_seed_layout_runs_where_gloo_alone_fails(net_lab, tmp_path):
    """3 + 4 processes, nothing about interfaces in the cluster file."""
    result, _cluster, _env = up(net_lab, tmp_path, "seed",
                                ["{host: node0, procs: 3}", "{host: node1, procs: 4}"])
    seen = assert_table_is_the_plan(result, tmp_path, "seed", net_lab)
    assert len(seen) == 7 and {r["world_size"] for r in seen} == {7}


def test_ipv6_only_cluster_network(make_net_lab, tmp_path):
    lab = make_net_lab(2, family="ipv6")
    result, _cluster, _env = up(lab, tmp_path, "six",
                                ["{host: node0, procs: 1}", "{host: node1, procs: 2}"])
    assert_table_is_the_plan(result, tmp_path, "six", lab)
    plan = json.loads((tmp_path / "runs" / "six" / "plan.json").read_text())
    assert ":" in plan["master_addr"]


def test_three_hosts_with_three_nic_names(make_net_lab, tmp_path):
    lab = make_net_lab(3, nics=("eth0", "ens5", "enp3s0"))
    result, _cluster, _env = up(lab, tmp_path, "three",
                                [f"{{host: node{k}, procs: 1}}" for k in range(3)])
    seen = assert_table_is_the_plan(result, tmp_path, "three", lab)
    assert [r["gloo"] for r in seen] == ["eth0", "ens5", "enp3s0"]


def test_a_user_set_interface_wins_and_a_missing_one_is_refused_before_start(
        net_lab, tmp_path):
    nic1 = net_lab.hosts[1].nic
    result, _cluster, _env = up(
        net_lab, tmp_path, "user",
        ["{host: node0, procs: 1}",
         f"{{host: node1, procs: 1, env: {{GLOO_SOCKET_IFNAME: {nic1}, "
         f"NCCL_SOCKET_IFNAME: {nic1[:3]}}}}}"])
    assert result.returncode == 0, result.stdout + result.stderr
    seen = ranks_seen(result.stdout)
    assert (seen[1]["gloo"], seen[1]["nccl"]) == (nic1, nic1[:3])  # as set, not "=..."
    assert seen[0]["gloo"] == net_lab.hosts[0].nic  # node 0 still found its own

    refused, _cluster, _env = up(
        net_lab, tmp_path, "missing",
        ["{host: node0, procs: 1}", "{host: node1, procs: 1, env: {GLOO_SOCKET_IFNAME: ib0}}"])
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "node 1 (node1): no interface for GLOO_SOCKET_IFNAME=ib0 on this node" in refused.stderr
    listed = refused.stderr.split("its interfaces are ", 1)[1].split(";", 1)[0].split(", ")
    assert {"lo", "docker0", nic1} <= set(listed), listed
    assert "started" not in refused.stdout and "RANKS" not in refused.stdout
    assert not (tmp_path / "runs" / "missing" / "plan.json").exists()


def test_a_kept_run_uses_the_chosen_interfaces(net_lab, tmp_path):
    """A detached run: its keepers start torchrun with the plan's interfaces.
    (``--max-restarts`` alone starts the same keepers from the same spec;
    only who may end the run differs, ``keeper.py``'s rule.)"""
    name = "kept-detach"
    result, _cluster, env = up(net_lab, tmp_path, name,
                               ["{host: node0, procs: 1}", "{host: node1, procs: 2}"], "--detach")
    assert result.returncode == 0, result.stdout + result.stderr
    attached = run_cli("attach", name, "--from-start", "--runs-dir", str(tmp_path / "runs"),
                       env=env, timeout=180)
    assert attached.returncode == 0, attached.stdout + attached.stderr
    result = attached
    seen = ranks_seen(result.stdout)
    assert [r["gloo"] for r in seen] == [net_lab.hosts[0].nic] + [net_lab.hosts[1].nic] * 2


def test_a_real_rendezvous_that_never_completes_fails_after_the_start_timeout(
        make_net_lab, tmp_path):
    """Node 1 has no route to node 0: both nodes' real torchrun start, node 0's
    waits at its store for the peer whose connects fail, and after
    --start-timeout the run names node 1 as never joined, with the hint."""
    lab = make_net_lab(2, unreachable=[(1, 0)])
    nic1 = lab.hosts[1].nic  # set by hand: no route to the master to choose it by
    env, cluster = lab_job(lab, tmp_path, "rdzv", "rank_table.py", [
        "{host: node0, procs: 1}",
        f"{{host: node1, procs: 1, env: {{GLOO_SOCKET_IFNAME: {nic1}, "
        f"NCCL_SOCKET_IFNAME: {nic1}}}}}"])
    result = run_cli("up", cluster, "--run-id", "rdzv", "--runs-dir", str(tmp_path / "runs"),
                     "--grace", "3", "--start-timeout", "30", env=env, timeout=240)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    # 30 s: node 0's own torchrun joins well within it even with another live
    # module busy beside this one (it took over 15 s there once), so only node 1 is named
    assert ("ddp-orch: the rendezvous did not complete within 30s; not joined: node 1 (node1); "
            "stopping every node") in out
    summary = out.split("\nrun rdzv: ")[1]
    assert re.search(r"^  0\s+node0\s+stopped\s", summary, re.M), summary
    assert re.search(r"^  1\s+node1\s+failed\s+\d+\s+did not join the rendezvous before the "
                     r"start timeout$", summary, re.M), summary
    assert "root cause: node 1 (node1): did not join the rendezvous before the start timeout" \
        in summary
    assert "hint: node 1 (node1) never reached the rendezvous: usually `master.addr` is not " \
           "reachable from that node" in summary
    # A real torchrun on node 1 kept trying the master's store; no rank ever ran.
    node1 = (tmp_path / "runs" / "rdzv" / "node-1.log").read_text()
    assert f"TCP client failed to connect/validate to host {lab.hosts[0].addr}:" in node1
    assert "RANKS [" not in out
    assert wait_gone("rdzv", 15) == set()
