"""``ddp-orch check`` (``orchestrator.engine.preflight`` and ``checknet``) driven
with fake agents: the rows it builds from what each node's agent answers (a
node that cannot be reached, no torch, missing GPUs, an interface the node
lacks, a busy master port, a peer nobody reaches). Fast: no agent, no node,
no process; ``open_agents`` is replaced by one that hands out the fakes."""

from __future__ import annotations

import textwrap
import time
from types import SimpleNamespace

import pytest

from orchestrator.config.loader import load_cluster_text
from orchestrator.engine import preflight
from orchestrator.engine.fanout import GroupResult
from orchestrator.engine.netfacts import interface_from, master_port_from, route_request
from orchestrator.engine.preflight import CheckResult, run_checks
from orchestrator.errors import LaunchError, TransportError
from orchestrator.plan.build import build_plan

TWO_NODES = """
nodes:
  - {host: node0, gpus: [0, 1]}
  - {host: node1, gpus: [0]%s}
workload: {name: noop}
"""


def plan_of(text: str = TWO_NODES % "", **extra: str):
    text = textwrap.dedent(text) + "".join(f"{k}: {v}\n" for k, v in extra.items())
    return build_plan(load_cluster_text(text, source="c.yaml"), run_id="r1",
                      local_run_dir="/tmp/runs/r1")


class FakeAgent:
    """A node's agent: each request answered from ``replies`` (a dict, or an
    exception to raise), the rest as a healthy node answers."""

    def __init__(self, k: int, **replies):
        self.k = k
        self.home = f"/home/u{k}"
        self.addr = f"10.0.0.{k + 1}"
        self.replies = replies
        self.calls: list[tuple[str, dict]] = []
        self.unreachable: set[tuple[str, int]] = set()  # targets its connections fail to
        self.closed = False
        self.sent: list[tuple[str, dict]] = []

    def send(self, op: str, **fields) -> None:
        self.sent.append((op, fields))

    def reply(self, op: str) -> dict:
        sent, fields = self.sent.pop(0)
        assert sent == op
        return self.call(op, **fields)

    def call(self, op: str, **fields) -> dict:
        self.calls.append((op, fields))
        reply = self.replies.get(op)
        if isinstance(reply, BaseException):
            raise reply
        if reply is not None:
            return reply
        if op == "probe":
            return {"python": "/usr/bin/python3", "python_version": "3.12.1",
                    "torch": "2.14.1", "cuda": "12.4", "nccl": "2.21.5", "available": True,
                    "count": 2, "hostname": f"node{self.k}", "hostname_addrs": [self.addr]}
        if op == "gpus":
            return {"ok": True, "chosen": fields["want"], "free": [0, 1], "driver": "550",
                    "gpus": [{"index": k, "name": "H100", "uuid": f"GPU-{k}"} for k in (0, 1)],
                    "apps": [], "notes": []}
        if op == "route":
            return {"ok": True, "ifname": "eth0", "addr": self.addr, "via": "route to node0",
                    "interfaces": ["lo", "eth0"]}
        if op == "clock":
            return {"time": time.time()}
        if op == "listen":
            return {"ok": True, "addr": fields.get("addr") or self.addr, "port": 40000 + self.k}
        if op == "bind":
            return {"ok": True, "port": fields["port"] or 29555}
        if op == "connect":
            return {"results": [{"ok": False, "error": "connection refused"}
                                if tuple(t) in self.unreachable else {"ok": True}
                                for t in fields["targets"]]}
        raise AssertionError(f"unexpected request {op}")

    def close(self) -> None:
        self.closed = True


def check(monkeypatch, plan, agents: dict, unreachable: dict | None = None,
          warnings: dict | None = None):
    """``run_checks`` with ``agents`` answering and ``unreachable`` (rank ->
    error) failing to start, each node's transport with its ``warnings``
    (rank -> tuple); returns the rows as (rank, check, status, detail)."""
    unreachable = unreachable or {}
    warnings = warnings or {}

    def fake_open(transports, pythons, timeout_s, run_id=None):
        assert set(transports) == {n.node_rank for n in plan.nodes} and run_id == plan.run_id
        return (GroupResult(succeeded={k: a for k, a in agents.items() if k not in unreachable},
                            failed=dict(unreachable)), dict(agents))

    monkeypatch.setattr(preflight, "open_agents", fake_open)
    report = run_checks(plan, {n.node_rank: SimpleNamespace(warnings=warnings.get(n.node_rank, ()))
                               for n in plan.nodes},
                        lambda node: f"ssh {node.host}", timeout_s=5)
    assert all(agent.closed for agent in agents.values())  # answering or not, all closed
    return report


def rows(report) -> list[tuple[int, str, str]]:
    return [(r.node_rank, r.check, ("warn" if r.warning else "ok") if r.ok else "FAIL")
            for r in report.results]


def detail(report, rank: int, name: str) -> str:
    found = [r.detail for r in report.results if (r.node_rank, r.check) == (rank, name)]
    assert len(found) == 1, (rank, name, report.results)
    return found[0]


def test_a_healthy_cluster_passes_every_check_in_launch_order(monkeypatch):
    agents = {0: FakeAgent(0), 1: FakeAgent(1)}
    report = check(monkeypatch, plan_of(), agents)
    assert rows(report) == [
        (0, "reach", "ok"), (1, "reach", "ok"),
        (0, "python", "ok"), (0, "torch", "ok"), (0, "gpus", "ok"),
        (1, "python", "ok"), (1, "torch", "ok"), (1, "gpus", "ok"),
        (-1, "versions", "ok"),
        (0, "interface", "ok"), (1, "interface", "ok"), (-1, "clock", "ok"),
        (0, "master-port", "ok"), (0, "reach-master", "ok"), (1, "reach-master", "ok"),
        (-1, "data-path", "ok")]
    assert report.ok and report.warnings == 0
    assert detail(report, 1, "reach") == "ssh node1, home /home/u1"
    assert detail(report, 0, "torch") == \
        "torch 2.14.1 (built with CUDA 12.4), sees 2 GPU(s), nccl 2.21.5"
    assert detail(report, 0, "gpus") == "GPUs 0,1 free now"
    assert [(t.node_rank, t.chosen) for t in report.gpus] == [(0, (0, 1)), (1, (0,))]
    assert detail(report, 1, "interface") == "eth0 10.0.0.2 (auto: route to node0)"
    assert detail(report, 0, "master-port") == "auto: 29555 is free"
    assert detail(report, 1, "reach-master") == "node0:29555 reachable"
    # the GPUs are asked for where the node lists some, and each node is probed once
    assert [f for op, f in agents[1].calls if op == "probe"] == [{}]
    assert [f["want"] for op, f in agents[1].calls if op == "gpus"] == [[0]]


def test_a_node_that_cannot_be_reached_fails_its_row_and_is_skipped_for_the_rest(monkeypatch):
    agents = {0: FakeAgent(0), 1: FakeAgent(1)}
    refused = TransportError("node1", "connection refused", "is sshd running there?")
    report = check(monkeypatch, plan_of(), agents, unreachable={1: refused})
    assert detail(report, 1, "reach") == "connection refused; is sshd running there?"
    assert [r for r in rows(report) if r[0] == 1] == [(1, "reach", "FAIL")]
    assert agents[1].calls == []
    # node 0 is still checked; the master port and the pairs need every node
    assert (0, "torch", "ok") in rows(report) and (0, "interface", "ok") in rows(report)
    assert not {"master-port", "reach-master", "data-path"} & {r.check for r in report.results}
    assert not report.ok


def test_what_the_ssh_config_says_but_is_not_used_is_a_warning_row_after_reach(monkeypatch):
    """Issue #32: a keyword of ~/.ssh/config that applies to a node but
    that ddp-orch does not use (the transport's warnings) is shown, reached
    or not, and passes."""
    agents = {0: FakeAgent(0), 1: FakeAgent(1)}
    said = "~/.ssh/config line 4: `CertificateFile ~/.ssh/c.pub` applies to host node1, ..."
    refused = TransportError("node1", "connection refused", "is sshd running there?")
    report = check(monkeypatch, plan_of(), agents, unreachable={1: refused},
                   warnings={1: (said,)})
    assert rows(report)[:3] == [(0, "reach", "ok"), (1, "reach", "FAIL"),
                                (1, "ssh config", "warn")]
    assert detail(report, 1, "ssh config") == said and report.warnings == 1


def test_a_node_without_torch_fails_its_torch_row_and_says_what_to_install(monkeypatch):
    no_torch = {"python": "/usr/bin/python3", "python_version": "3.12.1",
                "torch_error": "ModuleNotFoundError: No module named 'torch'", "gpus": [0]}
    report = check(monkeypatch, plan_of(), {0: FakeAgent(0), 1: FakeAgent(1, probe=no_torch)})
    assert (1, "python", "ok") in rows(report) and (1, "torch", "FAIL") in rows(report)
    assert detail(report, 1, "torch") == \
        "ModuleNotFoundError: No module named 'torch'; install torch for python3"
    assert not any(r.check == "versions" for r in report.results)  # one torch: nothing to compare
    assert not report.ok


def test_torch_differing_between_nodes_fails_the_versions_row(monkeypatch):
    older = dict(FakeAgent(1).call("probe"), torch="2.13.0")
    report = check(monkeypatch, plan_of(), {0: FakeAgent(0), 1: FakeAgent(1, probe=older)})
    assert (-1, "versions", "FAIL") in rows(report)
    assert "node 0 (node0): 2.14.1, node 1 (node1): 2.13.0" in detail(report, -1, "versions")


def test_a_refused_gpu_fails_the_gpus_row_with_the_launchs_words_and_fix(monkeypatch):
    busy = {"ok": False, "reason": "busy", "waitable": True, "free": [0],
            "error": "GPU 1 (H100) is busy: pid 7 python (bob, 40000 MiB); free now: 0"}
    report = check(monkeypatch, plan_of(), {0: FakeAgent(0, gpus=busy), 1: FakeAgent(1)})
    assert (0, "gpus", "FAIL") in rows(report) and (1, "gpus", "ok") in rows(report)
    assert detail(report, 0, "gpus") == (
        "GPU 1 (H100) is busy: pid 7 python (bob, 40000 MiB); free now: 0; launch on those now "
        "(gpus: \"0\"), wait for them (--wait-gpus SECONDS) or go on the busy ones anyway "
        "(--allow-busy-gpus; never on another run's)")


def test_gpus_torch_does_not_see_fail_the_gpus_row(monkeypatch):
    probe = dict(FakeAgent(0).call("probe"), count=1)
    report = check(monkeypatch, plan_of(), {0: FakeAgent(0, probe=probe), 1: FakeAgent(1)})
    assert detail(report, 0, "gpus").startswith(
        "GPUs 0,1: its torch sees 1 GPU(s) (indices 0-0), and GPU 1 is not among them;")
    assert (1, "gpus", "ok") in rows(report)


def test_a_cpu_run_asks_for_its_gpus_but_not_torchs_view(monkeypatch):
    no_cuda = dict(FakeAgent(0).call("probe"), available=False, cuda=None)
    agents = {0: FakeAgent(0, probe=no_cuda), 1: FakeAgent(1)}
    report = check(monkeypatch, plan_of(device="cpu"), agents)
    assert report.ok and detail(report, 0, "gpus") == "GPUs 0,1 free now"
    assert [f["want"] for op, f in agents[0].calls if op == "gpus"] == [[0, 1]]


def test_a_probe_that_fails_is_the_nodes_python_row(monkeypatch):
    gone = TransportError("node1", "the agent on node1 ended", "see its stderr")
    report = check(monkeypatch, plan_of(), {0: FakeAgent(0), 1: FakeAgent(1, probe=gone)})
    assert [r for r in rows(report) if r[0] == 1 and r[1] in ("python", "torch")] == \
        [(1, "python", "FAIL")]
    assert detail(report, 1, "python") == "the agent on node1 ended; see its stderr"


def test_an_interface_the_node_lacks_fails_its_interface_row_and_lists_what_it_has(monkeypatch):
    plan = plan_of(TWO_NODES % ", env: {GLOO_SOCKET_IFNAME: ib0, NCCL_SOCKET_IFNAME: ib0}")
    report = check(monkeypatch, plan, {0: FakeAgent(0), 1: FakeAgent(1)})
    assert (1, "interface", "FAIL") in rows(report) and (0, "interface", "ok") in rows(report)
    text = detail(report, 1, "interface")
    assert text.startswith("no interface for GLOO_SOCKET_IFNAME=ib0 and NCCL_SOCKET_IFNAME=ib0 "
                           "on this node; its interfaces are lo, eth0;")
    assert not report.ok


def test_an_interface_the_user_set_is_listened_on_as_set(monkeypatch):
    plan = plan_of(TWO_NODES % ", env: {GLOO_SOCKET_IFNAME: eth0}")
    agents = {0: FakeAgent(0), 1: FakeAgent(1)}
    report = check(monkeypatch, plan, agents)
    assert detail(report, 1, "interface") == "eth0 10.0.0.2 (GLOO_SOCKET_IFNAME=eth0, as set)"
    assert [f for op, f in agents[1].calls if op == "listen"] == \
        [{"port": 0, "timeout": 35, "ifname": "eth0"}]


def test_no_route_to_the_master_fails_an_auto_interface_and_says_what_to_set(monkeypatch):
    lost = {"ok": False, "error": "no route to node0", "interfaces": ["lo", "eth0"]}
    report = check(monkeypatch, plan_of(), {0: FakeAgent(0), 1: FakeAgent(1, route=lost)})
    assert (1, "interface", "FAIL") in rows(report)
    assert detail(report, 1, "interface").startswith(
        "cannot choose the interface its ranks use: no route to node0; set GLOO_SOCKET_IFNAME")


def test_no_route_with_network_off_is_only_a_warning(monkeypatch):
    lost = {"ok": False, "error": "no route to node0", "interfaces": ["lo"]}
    report = check(monkeypatch, plan_of(network="{interface: off}"),
                   {0: FakeAgent(0), 1: FakeAgent(1, route=lost)})
    assert (1, "interface", "warn") in rows(report)
    assert detail(report, 1, "interface") == \
        "not set (network: off), and no route to the master: no route to node0"


def test_a_listener_on_loopback_warns_that_other_hosts_cannot_reach_it(monkeypatch):
    loop = {"ok": True, "ifname": "lo", "addr": "127.0.0.1", "via": "lo", "interfaces": ["lo"]}
    report = check(monkeypatch, plan_of(), {0: FakeAgent(0), 1: FakeAgent(1, route=loop)})
    assert (1, "interface", "warn") in rows(report)
    assert detail(report, 1, "interface").endswith(
        "; a loopback address, which ranks on other hosts cannot reach")


def test_a_busy_master_port_fails_and_says_to_pick_another(monkeypatch):
    busy = {"ok": False, "error": "[Errno 98] Address already in use"}
    agents = {0: FakeAgent(0, bind=busy), 1: FakeAgent(1)}
    report = check(monkeypatch, plan_of(master="{port: 29500}"), agents)
    assert detail(report, 0, "master-port") == (
        "master port 29500 on node0 (node 0) is already in use ([Errno 98] Address already "
        "in use); pick another `master.port`, or use `port: auto`")
    assert not any(r.check in ("reach-master", "data-path") for r in report.results)
    assert [f for op, f in agents[0].calls if op == "bind"] == [{"port": 29500, "host": "node0", "hold": False}]


def test_a_given_master_port_that_is_free_passes_as_given(monkeypatch):
    report = check(monkeypatch, plan_of(master="{port: 29500}"), {0: FakeAgent(0), 1: FakeAgent(1)})
    assert detail(report, 0, "master-port") == "29500 is free"
    assert detail(report, 1, "reach-master") == "node0:29500 reachable"


def test_a_node_that_cannot_reach_the_master_port_fails_its_row(monkeypatch):
    agents = {0: FakeAgent(0), 1: FakeAgent(1)}
    agents[1].unreachable.add(("node0", 29555))
    report = check(monkeypatch, plan_of(), agents)
    assert [r for r in rows(report) if r[1] == "reach-master"] == \
        [(0, "reach-master", "ok"), (1, "reach-master", "FAIL")]
    assert detail(report, 1, "reach-master") == \
        "cannot open TCP to node0:29555 (connection refused); check master.addr and firewalls"


def test_a_peer_no_other_node_reaches_fails_the_data_path_naming_both_ends(monkeypatch):
    agents = {0: FakeAgent(0), 1: FakeAgent(1)}
    agents[0].unreachable.add(("10.0.0.2", 40001))
    report = check(monkeypatch, plan_of(), agents)
    assert (0, "data-path", "FAIL") in rows(report) and (-1, "data-path", "ok") not in rows(report)
    assert detail(report, 0, "data-path") == \
        "node 0 (node0) -> node 1 (node1) 10.0.0.2:40001: connection refused"


# -- the pure helpers up shares with check -----------------------------------------

def test_master_port_from_takes_the_port_node_0_found():
    assert master_port_from(plan_of(), {"ok": True, "port": 41234}) == 41234


def test_route_request_is_none_when_nothing_waits_for_the_interface():
    plan = plan_of(network="{interface: off}")
    assert route_request(plan, plan.nodes[1]) is None
    auto = plan_of()
    assert route_request(auto, auto.nodes[1]) == {"host": "node0", "port": 0,
                                                  "remote_peers": True}


def test_interface_from_gives_auto_variables_the_routes_interface():
    plan = plan_of()
    assert interface_from(plan.nodes[0], {"ok": True, "ifname": "ens5", "interfaces": []}) == "ens5"
    off = plan_of(network="{interface: off}")
    assert interface_from(off.nodes[0], {"ok": True, "ifname": "ens5"}) is None


def test_interface_from_refuses_a_name_the_node_lacks():
    plan = plan_of(TWO_NODES % ", env: {GLOO_SOCKET_IFNAME: ib0}")
    with pytest.raises(LaunchError, match="its interfaces are lo, eth0"):
        interface_from(plan.nodes[1], {"ok": True, "ifname": "eth0", "interfaces": ["lo", "eth0"]})


def test_a_warning_row_counts_as_a_warning_not_a_failure():
    report = preflight.Preflight((CheckResult(0, "h", "clock", True, "skew", warning=True),
                                  CheckResult(1, "h", "torch", True, "ok")))
    assert report.ok and report.warnings == 1
