"""The network half of ``ddp-orch check``. Reaching node 0's master port is not
enough: after the rendezvous every rank connects to every other over the
interface its node chose, so each node chooses it as ``up`` does and listens
there, and every other connects."""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..agent.wire.addr import hostport
from ..config.spec import AUTO_PORT
from ..errors import LaunchError, TransportError
from ..plan.model import NodePlan, RunPlan
from ..plan.network import GLOO_IFNAME, named_interfaces
from .agentlink import AgentHandle
from .checkresult import CheckResult
from .fanout import on_all
from .netfacts import interface_from, master_port, slow_link

CLOCK_SKEW_S = 2.0  # more between two nodes' clocks is a warning
CONNECT_TIMEOUT_S = 5.0  # each test connection
CLOCK_SAMPLES = 3  # the one with the shortest round trip counts
CLUSTER = (-1, "*")  # the node and host columns of a row about the whole cluster


@dataclass
class NodeNet:
    """What one node's agent said about its network."""

    row: CheckResult  # its interface row
    endpoint: tuple[str, int] | None = None  # where it listens for its peers
    ifname: str | None = None  # the interface its ranks use (None: the libraries choose)
    addr: str | None = None
    clock: tuple[float, float] | None = None  # (offset from this machine, round trip)


# -- pure rules --------------------------------------------------------------

def version_rows(versions: Mapping[int, Mapping[str, object]], hosts: Mapping[int, str],
                 device: str = "auto") -> list[CheckResult]:
    """Rows for what differs between nodes: torch fails; CUDA or NCCL warn (not on CPU)."""
    known = {k: v for k, v in versions.items() if "torch_error" not in v and v.get("torch")}
    if len(known) < 2:
        return []
    rows = []
    libraries = [("torch", "torch", False)]
    if device != "cpu":
        libraries += [("cuda", "CUDA", True), ("nccl", "NCCL", True)]
    for key, name, warning in libraries:
        seen = {k: str(v.get(key) or "none") for k, v in sorted(known.items())}
        if key == "nccl" and set(seen.values()) <= {"none"}:
            continue
        if len(set(seen.values())) > 1:
            listing = ", ".join(f"node {k} ({hosts[k]}): {v}" for k, v in seen.items())
            what = "use one version everywhere" if not warning else \
                "ranks with different versions may fail to connect or hang; use one everywhere"
            rows.append(CheckResult(*CLUSTER, "versions", warning,
                                    f"{name} differs between nodes ({listing}); {what}",
                                    warning=warning))
    if not rows:
        first = known[min(known)]
        same = f"torch {first.get('torch')}, cuda {first.get('cuda') or 'none'}" + (
            f", nccl {first['nccl']}" if first.get("nccl") else "")
        rows.append(CheckResult(*CLUSTER, "versions", True, f"{same} on every node"))
    return rows


def clock_offset(t_sent: float, node_time: float, t_received: float) -> tuple[float, float]:
    """(the node's clock minus ours, the round trip): the offset is known to
    within half the round trip."""
    return node_time - (t_sent + t_received) / 2, t_received - t_sent


def clock_rows(clocks: Mapping[int, tuple[float, float]], hosts: Mapping[int, str],
               bound_s: float = CLOCK_SKEW_S) -> list[CheckResult]:
    """One row on the nodes' clocks: a warning when two are surely (round
    trips taken off) more than ``bound_s`` apart."""
    if len(clocks) < 2:
        return []
    ahead = max(clocks, key=lambda k: clocks[k][0])
    behind = min(clocks, key=lambda k: clocks[k][0])
    spread = clocks[ahead][0] - clocks[behind][0]
    surely = spread - clocks[ahead][1] / 2 - clocks[behind][1] / 2
    offsets = ", ".join(f"node {k} {off:+.2f}s" for k, (off, _rtt) in sorted(clocks.items()))
    if surely > bound_s:
        return [CheckResult(
            *CLUSTER, "clock", True,
            f"node {ahead} ({hosts[ahead]})'s clock is {spread:.1f}s ahead of node {behind} "
            f"({hosts[behind]})'s (more than {bound_s:g}s; against this machine: {offsets}): "
            "times in the logs and the order of failures across nodes (the root cause) "
            "may mislead; synchronise the clocks (chrony, systemd-timesyncd)", warning=True)]
    return [CheckResult(*CLUSTER, "clock", True,
                        f"clocks within {bound_s:g}s of each other (against this machine: "
                        f"{offsets})")]


def pair_rows(hosts: Mapping[int, str], endpoints: Mapping[int, tuple[str, int]],
              results: Mapping[tuple[int, int], str | None]) -> list[CheckResult]:
    """Rows for the node-to-node connections: one per failing pair, one per node none reaches."""
    if not results:
        return []
    failing = {pair: err for pair, err in results.items() if err is not None}
    if not failing:
        untested = sorted(set(hosts) - set(endpoints))
        if untested:
            return [CheckResult(*CLUSTER, "data-path", True,
                                f"the {len(results)} TCP connection(s) that could be tried all "
                                f"connect (not to {_nodes(untested, hosts)}: no listener)")]
        return [CheckResult(*CLUSTER, "data-path", True,
                            f"every node reaches every other on its ranks' address "
                            f"({len(results)} TCP connections among {len(hosts)} nodes)")]
    rows = []
    for k in sorted({k for _, k in failing}):
        tried = [j for (j, dest) in results if dest == k]
        failed = sorted(j for (j, dest) in failing if dest == k)
        where = f"node {k} ({hosts[k]}) {hostport(*endpoints[k])}"
        if len(tried) > 1 and len(failed) == len(tried):
            errors = "; ".join(dict.fromkeys(failing[(j, k)] for j in failed))
            rows.append(CheckResult(k, hosts[k], "data-path", False,
                                    f"no other node reaches {where}: {errors}"))
            continue
        rows += [CheckResult(j, hosts[j], "data-path", False,
                             f"node {j} ({hosts[j]}) -> {where}: {failing[(j, k)]}")
                 for j in failed]
    return sorted(rows, key=lambda r: (r.node_rank, r.detail))


def _nodes(ranks: Sequence[int], hosts: Mapping[int, str]) -> str:
    return ", ".join(f"node {k} ({hosts[k]})" for k in ranks)


def hostname_row(node: NodePlan, info: Mapping[str, object], net: NodeNet | None,
                 remote_peers: bool) -> CheckResult | None:
    """A warning for a host name that resolves to loopback (Debian's
    127.0.1.1): Gloo would advertise it, and other hosts cannot reach it."""
    addrs = info.get("hostname_addrs") or []
    if not remote_peers or not addrs or not _is_loopback(str(addrs[0])):
        return None
    said = f"its host name {info.get('hostname')} resolves to {addrs[0]} (loopback), which " \
           "Gloo would advertise to its peers"
    if net is not None and net.ifname is not None:
        at = f" ({net.addr})" if net.addr else ""
        detail = f"{said}; its ranks use {net.ifname}{at} instead"
    else:
        detail = (f"{said}, and nothing overrides it here (network: off): set network: "
                  "{interface: auto}, or GLOO_SOCKET_IFNAME=<its NIC> in its `env:`")
    return CheckResult(node.node_rank, node.host, "hostname", True, detail, warning=True)


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


# -- measurements ------------------------------------------------------------

def route_fields(plan: RunPlan) -> dict:
    """The ``route`` request ``up`` sends, asked of every node."""
    port = plan.master_port if isinstance(plan.master_port, int) else 0
    return {"host": plan.master_addr, "port": port,
            "remote_peers": not all(n.is_local for n in plan.nodes)}


def node_network(plan: RunPlan, node: NodePlan, agent: AgentHandle,
                 listen_s: float) -> NodeNet:
    """One node's interface as ``up`` would choose it, its clock, and a test
    listener on the address its ranks will advertise."""
    k = node.node_rank

    def row(ok: bool, detail: str, warning: bool = False) -> CheckResult:
        return CheckResult(k, node.host, "interface", ok, detail, warning)

    reply = agent.call("route", **route_fields(plan))
    clock = _clock(agent)
    try:
        chosen = interface_from(node, reply)
    except LaunchError as exc:
        return NodeNet(row(False, str(exc)), clock=clock)
    named = named_interfaces(node.env)
    listen: dict = {}
    if named and (GLOO_IFNAME in named or chosen is None):  # the user's, which exists
        var = GLOO_IFNAME if GLOO_IFNAME in named else next(iter(named))
        present = [str(n) for n in reply.get("interfaces") or ()]
        exact = var == GLOO_IFNAME or node.env[var].startswith("=")
        chosen = next((p for n in named[var] for p in present
                       if p == n or (not exact and p.startswith(n))), named[var][0])
        listen, how = {"ifname": chosen}, f"{var}={node.env[var]}, as set"
    elif chosen is not None:  # auto: the route's interface and address
        listen, how = {"addr": reply["addr"]}, f"auto: {reply.get('via') or 'its route'}"
    elif reply.get("ok"):  # network: off: the libraries choose; test the route's address
        listen = {"addr": reply["addr"]}
        how = f"not set (network: off): Gloo and NCCL choose; the route to the master " \
              f"leaves by {reply['ifname']}"
    else:
        return NodeNet(row(True, f"not set (network: off), and no route to the master: "
                                 f"{reply.get('error')}", warning=True), clock=clock)
    got = agent.call("listen", port=0, timeout=listen_s, **listen)
    if not got.get("ok"):
        return NodeNet(row(False, f"{chosen or reply.get('ifname')}: cannot listen there "
                                  f"({got.get('error')})"), clock=clock)
    addr, port = str(got["addr"]), int(got["port"])
    detail = f"{chosen} {addr} ({how})" if chosen else f"{addr} ({how})"
    loopback = _is_loopback(addr) and route_fields(plan)["remote_peers"]
    if loopback:
        detail += "; a loopback address, which ranks on other hosts cannot reach"
    slower = slow_link(node, reply)
    if slower:
        detail += f"; {slower}"
    return NodeNet(row(True, detail, warning=loopback or bool(slower)), (addr, port), chosen,
                   addr, clock)


def _clock(agent: AgentHandle) -> tuple[float, float]:
    """The node's clock offset, from the sample with the shortest round trip."""
    best: tuple[float, float] | None = None
    for _ in range(CLOCK_SAMPLES):
        sent = time.time()
        node_time = float(agent.call("clock")["time"])
        sample = clock_offset(sent, node_time, time.time())
        if best is None or sample[1] < best[1]:
            best = sample
    assert best is not None
    return best


def master_rows(plan: RunPlan, agents: Mapping[int, AgentHandle], nets: Mapping[int, NodeNet],
                timeout_s: float) -> list[CheckResult]:
    """The master port (free on node 0) and every node's TCP connections to it and its peers."""
    host0 = plan.nodes[0].host
    try:
        port = master_port(plan, agents[0])
    except (LaunchError, TransportError) as exc:
        return [CheckResult(0, host0, "master-port", False, str(exc))]
    detail = f"auto: {port} is free" if plan.master_port == AUTO_PORT else f"{port} is free"
    rows = [CheckResult(0, host0, "master-port", True, detail)]
    held = agents[0].call("listen", port=port, host=plan.master_addr, timeout=timeout_s + 30)
    if not held.get("ok"):
        return rows + [CheckResult(0, host0, "reach-master", False,
                                   f"could not start a test listener on node 0: "
                                   f"{held.get('error')}")]
    endpoints = {k: net.endpoint for k, net in nets.items() if net.endpoint is not None}
    master = (plan.master_addr, port)

    def connect(j: int) -> list[dict]:
        targets = [master] + [endpoints[k] for k in sorted(endpoints) if k != j]
        reply = agents[j].call("connect", targets=[list(t) for t in targets],
                               timeout=CONNECT_TIMEOUT_S)
        return list(reply["results"])

    done = on_all(connect, range(len(plan.nodes)), timeout_s=CONNECT_TIMEOUT_S + 30)
    hosts = {n.node_rank: n.host for n in plan.nodes}
    pairs: dict[tuple[int, int], str | None] = {}
    for node in plan.nodes:
        j = node.node_rank
        if j not in done.succeeded:
            rows.append(CheckResult(j, node.host, "reach-master", False,
                                    _describe(done.failed[j])))
            continue
        first, *others = done.succeeded[j]
        rows.append(_reach_master(plan, node, master, first))
        for k, result in zip([k for k in sorted(endpoints) if k != j], others):
            pairs[(j, k)] = None if result.get("ok") else str(result.get("error"))
    return rows + pair_rows(hosts, endpoints, pairs)


def _reach_master(plan: RunPlan, node: NodePlan, master: tuple[str, int],
                  result: dict) -> CheckResult:
    where = hostport(*master)
    if result.get("ok"):
        return CheckResult(node.node_rank, node.host, "reach-master", True, f"{where} reachable")
    why = "check master.addr and firewalls"
    if _is_loopback(master[0]) and not node.is_local:
        why = f"{master[0]} is loopback: set master.addr to an address of node 0 that the " \
              f"other hosts reach"
    return CheckResult(node.node_rank, node.host, "reach-master", False,
                       f"cannot open TCP to {where} ({result.get('error')}); {why}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TransportError):
        return exc.message + (f"; {exc.hint}" if exc.hint else "")
    return str(exc) or type(exc).__name__


def network_rows(plan: RunPlan, agents: Mapping[int, AgentHandle],
                 infos: Mapping[int, Mapping[str, object]], timeout_s: float) -> list[CheckResult]:
    """Every network row of ``check``; master port and pairs only when all nodes answer."""
    hosts = {n.node_rank: n.host for n in plan.nodes}
    done = on_all(lambda k: node_network(plan, plan.nodes[k], agents[k], timeout_s + 30),
                  sorted(agents), timeout_s=timeout_s)
    nets: dict[int, NodeNet] = dict(done.succeeded)
    remote = route_fields(plan)["remote_peers"]
    rows: list[CheckResult] = []
    for k in sorted(agents):
        node = plan.nodes[k]
        if k not in nets:
            rows.append(CheckResult(k, node.host, "interface", False, _describe(done.failed[k])))
            continue
        rows.append(nets[k].row)
        warned = hostname_row(node, infos.get(k) or {}, nets[k], remote)
        if warned is not None:
            rows.append(warned)
    rows += clock_rows({k: n.clock for k, n in nets.items() if n.clock is not None}, hosts)
    if len(agents) == len(plan.nodes):
        rows += master_rows(plan, agents, nets, timeout_s)
    return rows
