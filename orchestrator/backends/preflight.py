"""``ddp-orch check`` for backends that reach nodes through an agent (local, ssh).

Every check runs on all nodes in parallel, each node with a deadline, and
each failure names the node and what to do. The order follows what a
launch needs: reach the node and start the agent, run its Python with
torch, see its GPUs, have a free master port on node 0, and reach that
port from every node.
"""

from __future__ import annotations

from typing import Callable, Mapping

from ..config.spec import AUTO_PORT
from ..errors import LaunchError, TransportError
from ..plan.model import NodePlan, RunPlan
from ..transport.base import Transport
from .agentlink import AgentHandle, open_agents
from .base import CheckResult, Preflight
from .fanout import on_all

def run_checks(plan: RunPlan, transports: Mapping[int, Transport],
               reach_label: Callable[[NodePlan], str], timeout_s: float = 60.0) -> Preflight:
    """All checks; a node that cannot be reached is skipped for the rest."""
    agents: dict[int, AgentHandle] = {}
    started: dict[int, AgentHandle] = {}  # answering or not: all are closed at the end
    results: list[CheckResult] = []
    try:
        opened, opening = open_agents(transports, {n.node_rank: n.python for n in plan.nodes},
                                      timeout_s)
        started.update(opening)
        agents.update(opened.succeeded)
        for node in plan.nodes:
            k = node.node_rank
            if k in agents:
                results.append(CheckResult(k, node.host, "reach", True,
                                           f"{reach_label(node)}, home {agents[k].home}"))
            else:
                results.append(CheckResult(k, node.host, "reach", False,
                                           _describe(opened.failed[k])))
        probes = on_all(lambda k: _probe(plan.nodes[k], agents[k], plan), agents,
                        timeout_s=timeout_s + 5)
        for k in sorted(agents):
            results.extend(probes.succeeded.get(k) or [CheckResult(
                k, plan.nodes[k].host, "python", False, _describe(probes.failed[k]))])
        results.extend(_torch_versions(results))
        if len(agents) == len(plan.nodes):
            results.extend(_master_checks(plan, agents, transports, timeout_s))
    finally:
        on_all(lambda k: started[k].close(), list(started))
    return Preflight(tuple(results))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TransportError):
        return exc.message + (f"; {exc.hint}" if exc.hint else "")
    return str(exc) or type(exc).__name__


def _probe(node: NodePlan, agent: AgentHandle, plan: RunPlan) -> list[CheckResult]:
    def result(check: str, ok: bool, detail: str) -> CheckResult:
        return CheckResult(node.node_rank, node.host, check, ok, detail)

    wants_gpus = node.gpus is not None and plan.device != "cpu"
    info = agent.call("probe", gpus=wants_gpus)
    out = [result("python", True, f"{info.get('python')} ({info.get('python_version')})")]
    if "torch_error" in info:
        out.append(result("torch", False, f"{info['torch_error']}; install torch for {node.python}"))
    else:
        out.append(result("torch", True, f"torch {info.get('torch')}, "
                                         f"cuda {info.get('cuda') or 'none'}"))
    if wants_gpus:
        out.append(_gpu_result(node, info, result))
    return out


def _gpu_result(node: NodePlan, info: dict, result) -> CheckResult:
    if "gpu_error" in info:
        return result("gpus", False, f"{info['gpu_error']}; or set `device: cpu` for a CPU rehearsal")
    listed = info.get("gpus", [])
    missing = sorted(set(node.gpus or ()) - set(listed))
    if missing:
        return result("gpus", False, f"no GPU {', '.join(map(str, missing))} "
                                     f"(nvidia-smi lists {listed})")
    return result("gpus", True, f"GPUs {','.join(map(str, node.gpus or ()))} present")


def _torch_versions(results: list[CheckResult]) -> list[CheckResult]:
    versions = {r.node_rank: r.detail.split(",")[0] for r in results
                if r.check == "torch" and r.ok}
    if len(set(versions.values())) <= 1:
        return []
    listing = "; ".join(f"node {k}: {v}" for k, v in sorted(versions.items()))
    return [CheckResult(-1, "*", "torch-match", False,
                        f"torch differs between nodes ({listing}); use one version everywhere")]


def master_port(plan: RunPlan, agent: AgentHandle) -> int:
    """A free master port on node 0 (``auto``), or the given one if it is free."""
    return master_port_from(plan, agent.call("bind", port=0 if plan.master_port == AUTO_PORT
                                             else int(plan.master_port)))


def master_port_from(plan: RunPlan, reply: dict) -> int:
    """The port node 0's ``bind`` reply found, or why the given one is not free."""
    if reply["ok"]:
        return int(reply["port"])
    raise LaunchError(
        f"master port {plan.master_port} on {plan.nodes[0].host} (node 0) is already in use "
        f"({reply.get('error')}); pick another `master.port`, or use `port: auto`")


def _master_checks(plan: RunPlan, agents: dict[int, AgentHandle],
                   transports: Mapping[int, Transport], timeout_s: float) -> list[CheckResult]:
    """The master port is free on node 0, and every node can connect to it."""
    host0 = plan.nodes[0].host
    try:
        port = master_port(plan, agents[0])
    except (LaunchError, TransportError) as exc:
        return [CheckResult(0, host0, "master-port", False, str(exc))]
    detail = f"auto: {port} is free" if plan.master_port == AUTO_PORT else f"{port} is free"
    results = [CheckResult(0, host0, "master-port", True, detail)]
    listener = agents.pop(0)  # the listen request holds node 0's agent until it closes
    try:
        if not listener.call("listen", port=port, timeout=timeout_s + 30)["ok"]:
            return results + [CheckResult(0, host0, "reach-master", False,
                                          "could not start a test listener on node 0")]
        reach = on_all(lambda k: _connect(plan, k, agents, transports, port),
                       range(len(plan.nodes)),
                       timeout_s=timeout_s)
        return results + [reach.succeeded.get(k) or CheckResult(
            k, plan.nodes[k].host, "reach-master", False, _describe(reach.failed[k]))
            for k in range(len(plan.nodes))]
    finally:
        listener.close()


def _connect(plan: RunPlan, k: int, agents: Mapping[int, AgentHandle],
             transports: Mapping[int, Transport], port: int) -> CheckResult:
    node, addr = plan.nodes[k], plan.master_addr
    agent = agents.get(k)
    if agent is None:  # node 0: its first agent holds the listener; ask a second one
        second = AgentHandle(transports[k], node.python)
        try:
            reply = second.call("connect", addr=addr, port=port, timeout=5)
        finally:
            second.close()
    else:
        reply = agent.call("connect", addr=addr, port=port, timeout=5)
    detail = f"{addr}:{port} reachable" if reply["ok"] else \
        f"cannot open TCP to {addr}:{port} ({reply.get('error')}); check master.addr and firewalls"
    return CheckResult(k, node.host, "reach-master", reply["ok"], detail)
