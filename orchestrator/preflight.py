"""``ddp-orch check``: find what would break a launch before launching.

Every check runs on all nodes in parallel with its own timeout, and each
failure names the node and what to do. The order follows what a launch
needs: reach the node, run its Python with torch, see its GPUs, have a
free master port on node 0, and reach that port from every node.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Mapping

from . import ports
from .errors import LaunchError
from .plan import NodePlan, RunPlan
from .spec import AUTO_PORT
from .table import format_table
from .transport.base import Transport, TransportError

# Runs on a node: what Python, torch and GPUs it has, as one JSON line.
_PROBE = r"""
import json, shutil, subprocess, sys
out = {"python": sys.executable, "python_version": sys.version.split()[0]}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
except Exception as exc:
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
if "--gpus" in sys.argv:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        out["gpu_error"] = "nvidia-smi not found"
    else:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
        out["gpus"] = [int(l.split()[1].rstrip(":")) for l in listing.splitlines()
                       if l.startswith("GPU ")]
print("PROBE " + json.dumps(out))
"""

# Runs on node 0 during the check: accepts connections on the master port
# until its stdin closes (or a deadline), so the port is free again at once.
_LISTEN = r"""
import os, socket, sys, threading, time
done = threading.Event()
threading.Thread(target=lambda: (os.read(0, 1), done.set()), daemon=True).start()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", int(sys.argv[1])))
s.listen(256)
s.settimeout(0.2)
print("listening", flush=True)
deadline = time.time() + float(sys.argv[2])
while time.time() < deadline and not done.is_set():
    try:
        conn, _ = s.accept()
        conn.close()
    except socket.timeout:
        pass
"""

_CONNECT = r"""
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
print("connected")
"""


@dataclass(frozen=True)
class CheckResult:
    node_rank: int
    host: str
    check: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Preflight:
    results: tuple[CheckResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def render(self) -> str:
        rows = [("NODE", "HOST", "CHECK", "STATUS", "DETAIL")]
        rows += [(str(r.node_rank), r.host, r.check, "ok" if r.ok else "FAIL", r.detail)
                 for r in self.results]
        verdict = "all checks passed" if self.ok else \
            f"{sum(not r.ok for r in self.results)} check(s) failed"
        return format_table(rows) + "\n" + verdict + "\n"


def run_checks(plan: RunPlan, transports: Mapping[int, Transport], timeout_s: float = 60.0) -> Preflight:
    """All checks; a node that cannot be reached is skipped for the rest."""
    results: list[CheckResult] = []
    probes = _on_all(plan, lambda node: _probe(node, transports[node.node_rank], plan, timeout_s))
    for node in plan.nodes:
        results.extend(probes[node.node_rank])
    results.extend(_torch_versions(plan, probes))
    reachable = all(r.ok for r in results if r.check == "ssh")
    if reachable:
        results.extend(_master_checks(plan, transports, timeout_s))
    return Preflight(tuple(results))


def _on_all(plan: RunPlan, fn: Callable[[NodePlan], list[CheckResult]]) -> dict[int, list[CheckResult]]:
    with ThreadPoolExecutor(max_workers=len(plan.nodes)) as pool:
        futures = {node.node_rank: pool.submit(fn, node) for node in plan.nodes}
    return {k: f.result() for k, f in futures.items()}


def _probe(node: NodePlan, transport: Transport, plan: RunPlan, timeout_s: float) -> list[CheckResult]:
    def result(check: str, ok: bool, detail: str) -> CheckResult:
        return CheckResult(node.node_rank, node.host, check, ok, detail)

    where = "local" if node.is_local else "reachable"
    try:
        home = transport.home()
    except TransportError as exc:
        return [result("ssh", False, exc.message + (f"; {exc.hint}" if exc.hint else ""))]
    out = [result("ssh", True, f"{where}, home {home}")]
    argv = [node.python, "-c", _PROBE] + (["--gpus"] if _wants_gpus(node, plan) else [])
    try:
        ran = transport.run(argv, timeout=timeout_s)
    except TransportError as exc:
        return out + [result("python", False, exc.message)]
    line = next((l for l in ran.output.splitlines() if l.startswith("PROBE ")), None)
    if line is None:
        return out + [result("python", False, f"`{node.python}` failed (exit {ran.exit_code}): "
                             f"{ran.output.strip()[-200:]}; set `python:` for this node")]
    info = json.loads(line[6:])
    out.append(result("python", True, f"{info['python']} ({info['python_version']})"))
    if "torch_error" in info:
        out.append(result("torch", False, f"{info['torch_error']}; install torch for {node.python}"))
    else:
        out.append(result("torch", True, f"torch {info['torch']}, cuda {info['cuda'] or 'none'}"))
    if _wants_gpus(node, plan):
        out.append(_gpu_result(node, info, result))
    return out


def _wants_gpus(node: NodePlan, plan: RunPlan) -> bool:
    return node.gpus is not None and plan.device != "cpu"


def _gpu_result(node: NodePlan, info: dict, result) -> CheckResult:
    if "gpu_error" in info:
        return result("gpus", False, info["gpu_error"] + "; or set `device: cpu` for a CPU rehearsal")
    missing = sorted(set(node.gpus or ()) - set(info.get("gpus", [])))
    if missing:
        return result("gpus", False, f"no GPU {', '.join(map(str, missing))} "
                      f"(nvidia-smi lists {info.get('gpus', [])})")
    return result("gpus", True, f"GPUs {','.join(map(str, node.gpus or ()))} present")


def _torch_versions(plan: RunPlan, probes: Mapping[int, list[CheckResult]]) -> list[CheckResult]:
    versions = {k: r.detail.split(",")[0] for k, rs in probes.items() for r in rs
                if r.check == "torch" and r.ok}
    if len(set(versions.values())) <= 1:
        return []
    listing = "; ".join(f"node {k}: {v}" for k, v in sorted(versions.items()))
    return [CheckResult(-1, "*", "torch-match", False,
                        f"torch differs between nodes ({listing}); use one version everywhere")]


def _master_checks(plan: RunPlan, transports: Mapping[int, Transport],
                   timeout_s: float) -> list[CheckResult]:
    """The master port is free on node 0, and every node can connect to it."""
    node0 = plan.nodes[0]
    t0 = transports[0]
    try:
        if plan.master_port == AUTO_PORT:
            port = ports.pick_free_port(t0, node0.python)
            detail = f"auto: {port} is free"
        else:
            port = int(plan.master_port)
            ports.check_port_free(t0, node0.python, port)
            detail = f"{port} is free"
    except LaunchError as exc:
        return [CheckResult(0, node0.host, "master-port", False, str(exc))]
    results = [CheckResult(0, node0.host, "master-port", True, detail)]
    listener = t0.start([node0.python, "-c", _LISTEN, str(port), str(timeout_s + 30)])
    try:
        if b"listening" not in listener.stdout.readline():
            return results + [CheckResult(0, node0.host, "reach-master", False,
                                          "could not start a test listener on node 0")]
        reach = _on_all(plan, lambda n: [_connect(n, transports[n.node_rank], plan.master_addr,
                                                  port)])
        return results + [r for k in sorted(reach) for r in reach[k]]
    finally:
        listener.close_stdin()
        try:
            listener.wait(10)
        except TimeoutError:
            listener.abort()


def _connect(node: NodePlan, transport: Transport, addr: str, port: int) -> CheckResult:
    try:
        ran = transport.run([node.python, "-c", _CONNECT, addr, str(port), "5"], timeout=30)
        ok = ran.ok and "connected" in ran.output
        why = ran.output.strip().splitlines()[-1:] if not ok else []
    except TransportError as exc:
        ok, why = False, [exc.message]
    detail = f"{addr}:{port} reachable" if ok else \
        f"cannot open TCP to {addr}:{port} ({' '.join(why)}); check master.addr and firewalls"
    return CheckResult(node.node_rank, node.host, "reach-master", ok, detail)
