"""``ddp-orch down RUN``: end whatever of a run still runs, on every node.

It works from the run's records, never from process names: plan.json says
where each node's run directory is, and the supervisor shipped there finds
the run's processes by their marker environment variables
(``supervisor.py --down``). A live controller of the run is asked to stop
first (SIGTERM, which ``up`` turns into its graceful teardown). Running it
twice is harmless: the second time there is nothing left to end.
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .errors import LaunchError
from .records import RunRecord, process_alive
from .spec import SshSpec
from .transport import make_transport
from .transport.base import TransportError


@dataclass(frozen=True)
class NodeDown:
    node_rank: int
    host: str
    killed: tuple[int, ...]
    error: str = ""


def down(record: RunRecord, grace_s: float = 5.0) -> tuple[bool, list[NodeDown]]:
    """Stop the run's controller (if alive) and its processes on every node."""
    plan = record.run.read_json("plan.json")
    if not isinstance(plan, dict):
        raise LaunchError(f"run {record.run_id} has no plan.json: it never got as far as "
                          "starting anything")
    stopped_controller = _stop_controller(record.controller_pid, grace_s + 15)
    with ThreadPoolExecutor(max_workers=len(plan["nodes"])) as pool:
        results = list(pool.map(lambda n: _down_node(plan["run_id"], n, grace_s), plan["nodes"]))
    return stopped_controller, results


def _stop_controller(pid: int | None, timeout_s: float) -> bool:
    if pid is None or pid == os.getpid() or not process_alive(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process_alive(pid):
        time.sleep(0.1)
    return True


def _down_node(run_id: str, node: dict, grace_s: float) -> NodeDown:
    k, host = node["node_rank"], node["host"]
    transport = make_transport(host, node["local"], SshSpec(**node["ssh"]))
    try:
        script = f"{node['run_dir']}/supervisor.py"
        result = transport.run([node["python"], "-c", _RUN_IF_PRESENT, script, run_id, str(k),
                                str(grace_s)], timeout=grace_s + 60)
    except TransportError as exc:
        return NodeDown(k, host, (), exc.message)
    finally:
        transport.close()
    lines = [l for l in result.output.splitlines() if l.startswith("{")]
    if not result.ok or not lines:
        return NodeDown(k, host, (), f"exit {result.exit_code}: {result.output.strip()[-200:]}")
    return NodeDown(k, host, tuple(json.loads(lines[-1]).get("killed", ())))


# The node may never have received the supervisor (the run failed early):
# then there is nothing of the run there to end.
_RUN_IF_PRESENT = r"""
import os, runpy, sys
script = sys.argv[1]
if not os.path.isfile(script):
    print('{"killed": []}')
    sys.exit(0)
sys.argv = [script, "--down"] + sys.argv[2:]
sys.path.insert(0, os.path.dirname(script))  # the modules shipped next to it
runpy.run_path(script, run_name="__main__")
"""


def render_down(record: RunRecord, stopped_controller: bool, nodes: list[NodeDown]) -> str:
    lines = [f"run {record.run_id}:"]
    if stopped_controller:
        lines.append(f"  asked its controller (pid {record.controller_pid}) to stop")
    for node in nodes:
        if node.error:
            lines.append(f"  node {node.node_rank} ({node.host}): could not check: {node.error}")
        elif node.killed:
            lines.append(f"  node {node.node_rank} ({node.host}): ended {len(node.killed)} "
                         f"process(es): {' '.join(map(str, node.killed))}")
        else:
            lines.append(f"  node {node.node_rank} ({node.host}): nothing left running")
    return "\n".join(lines) + "\n"
