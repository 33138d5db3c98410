"""What a node's network answers mean for a run: its master port and its
ranks' interface. Read alike by ``up`` and ``check``, so that ``check``
proves the choice the launch makes."""

from __future__ import annotations

from ..config.spec import AUTO_PORT
from ..errors import LaunchError
from ..plan.model import NodePlan, RunPlan
from ..plan.network import named_interfaces, needs_interface, unknown_interfaces
from .agentlink import AgentHandle


def bind_request(plan: RunPlan, hold: bool = False) -> dict:
    """Node 0's ``bind`` request (port 0: any free one); ``hold``: keep it bound
    until torchrun's store takes it."""
    return {"port": 0 if plan.master_port == AUTO_PORT else int(plan.master_port),
            "host": plan.master_addr, "hold": hold}


def master_port(plan: RunPlan, agent: AgentHandle) -> int:
    """A free master port on node 0 (``auto``), or the given one if it is free."""
    return master_port_from(plan, agent.call("bind", **bind_request(plan)))


def master_port_from(plan: RunPlan, reply: dict) -> int:
    """The port node 0's ``bind`` reply found, or why the given one is not free."""
    if reply["ok"]:
        return int(reply["port"])
    raise LaunchError(
        f"master port {plan.master_port} on {plan.nodes[0].host} (node 0) is already in use "
        f"({reply.get('error')}); pick another `master.port`, or use `port: auto`")


def route_request(plan: RunPlan, node: NodePlan) -> dict | None:
    """The ``route`` request for ``node``'s agent; None when its env needs nothing of it."""
    if not (needs_interface(node.env) or named_interfaces(node.env)):
        return None
    port = plan.master_port if isinstance(plan.master_port, int) else 0
    return {"host": plan.master_addr, "port": port,
            "remote_peers": not all(n.is_local for n in plan.nodes)}


def slow_link(node: NodePlan, reply: dict) -> str | None:
    """A warning where ``auto`` chose an interface much slower than another
    link the node has up; None where the user named it or none is faster."""
    faster = reply.get("faster")
    if not needs_interface(node.env) or not isinstance(faster, dict) or not reply.get("ok"):
        return None
    return (f"its ranks use {reply.get('ifname')} ({_speed(reply.get('speed'))}, "
            f"{reply.get('via') or 'the route to the master'}), while {faster.get('ifname')} "
            f"({_speed(faster.get('speed'))}, {faster.get('addr')}) is up: if the nodes reach "
            f"each other there, set network: {{interface: {faster.get('ifname')}}} (or "
            f"GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME={faster.get('ifname')} in this node's "
            f"`env:`)")


def _speed(mbps: object) -> str:
    """``1 Gb/s``, ``100 Gb/s``, ``2.5 Gb/s``, ``100 Mb/s``."""
    if not isinstance(mbps, int) or mbps <= 0:
        return "speed unknown"
    return f"{mbps} Mb/s" if mbps < 1000 else f"{mbps / 1000:g} Gb/s"


def interface_from(node: NodePlan, reply: dict) -> str | None:
    """The interface ``node``'s ``auto`` variables get; LaunchError for a set
    interface the node lacks, or no route to the rendezvous."""
    present = [str(n) for n in reply.get("interfaces") or ()]
    unknown = unknown_interfaces(node.env, present)
    if unknown:
        raise LaunchError(
            f"no interface for {' and '.join(unknown)} on this node; its interfaces are "
            f"{', '.join(present) or 'unknown'}; "
            "set the node's own name in its `env:` (names differ between hosts), or "
            "remove the variable and let each node find its own (network: {interface: auto})")
    if not needs_interface(node.env):
        return None
    if not reply.get("ok"):
        raise LaunchError(
            f"cannot choose the interface its ranks use: {reply.get('error')}; set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME in "
            f"its `env:` (its interfaces: {', '.join(present) or 'unknown'})")
    return str(reply["ifname"])
