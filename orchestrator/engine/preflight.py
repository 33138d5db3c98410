"""``ddp-orch check`` for backends that reach nodes through an agent (local, ssh):
every check on all nodes in parallel, each with a deadline, in the order a
launch needs them. Warnings are shown and pass."""

from __future__ import annotations

from typing import Callable, Mapping

from ..agent.node.gpus import describe_holder, mixed_models
from ..config.spec import ClusterSpec
from ..errors import TransportError
from ..plan.model import NodePlan, RunPlan
from ..transport.base import Transport
from . import gpuplan
from .agentlink import AgentHandle, open_agents
from .checknet import network_rows, version_rows
# a backend's own check makes these rows too (a plugin imports them from here)
from .checkresult import CheckResult, NodeGpus, Preflight  # noqa: F401
from .fanout import on_all


def run_checks(plan: RunPlan, transports: Mapping[int, Transport],
               reach_label: Callable[[NodePlan], str], timeout_s: float = 60.0,
               spec: ClusterSpec | None = None) -> Preflight:
    """All checks; a node that cannot be reached is skipped for the rest."""
    agents: dict[int, AgentHandle] = {}
    started: dict[int, AgentHandle] = {}  # answering or not: all are closed at the end
    results: list[CheckResult] = []
    try:
        opened, opening = open_agents(transports, {n.node_rank: n.python for n in plan.nodes},
                                      timeout_s, run_id=plan.run_id)
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
            results.extend(CheckResult(k, node.host, "ssh config", True, warning, warning=True)
                           for warning in transports[k].warnings)
        probes = on_all(lambda k: _probe(plan.nodes[k], agents[k], plan, spec), agents,
                        timeout_s=timeout_s + 5)
        infos = {k: info for k, (_rows, info, _gpus) in probes.succeeded.items()}
        tables = tuple(table for k, (_rows, _info, table) in sorted(probes.succeeded.items())
                       if table is not None)
        for k in sorted(agents):
            results.extend(probes.succeeded[k][0] if k in probes.succeeded else [CheckResult(
                k, plan.nodes[k].host, "python", False, _describe(probes.failed[k]))])
        results.extend(version_rows(infos, {n.node_rank: n.host for n in plan.nodes},
                                    plan.device))
        results.extend(_mixed_rows(tables))
        results.extend(network_rows(plan, agents, infos, timeout_s))
    finally:
        on_all(lambda k: started[k].close(), list(started))
    return Preflight(tuple(results), tables if agents else ())


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TransportError):
        return exc.message + (f"; {exc.hint}" if exc.hint else "")
    return str(exc) or type(exc).__name__


def _probe(node: NodePlan, agent: AgentHandle, plan: RunPlan, spec: ClusterSpec | None
           ) -> tuple[list[CheckResult], dict, NodeGpus | None]:
    """The node's python, torch and GPU rows, its ``probe`` reply and its GPUs."""
    def result(check: str, ok: bool, detail: str, warning: bool = False) -> CheckResult:
        return CheckResult(node.node_rank, node.host, check, ok, detail, warning)

    asked = gpuplan.gpu_request(plan, node, spec, allow_busy=False)
    agent.send("probe")
    if asked is not None:  # what the run would get now; nothing is held
        agent.send("gpus", **asked, hold=False)
    info = agent.reply("probe")
    out = [result("python", True, f"{info.get('python')} ({info.get('python_version')})")]
    if "torch_error" in info:
        out.append(result("torch", False, f"{info['torch_error']}; install torch for {node.python}"))
    else:
        nccl = f", nccl {info['nccl']}" if info.get("nccl") else ""
        sees = f", sees {info['count']} GPU(s)" if info.get("available") else \
            (", sees no GPU" if info.get("cuda") else "")
        out.append(result("torch", True, f"torch {info.get('torch')} (built with CUDA "
                                         f"{info.get('cuda') or 'none'}){sees}{nccl}"))
    if asked is None:
        return out, info, None
    answer = agent.reply("gpus")
    out.append(_gpu_row(node, plan, answer, info, result))
    if answer.get("ok") and gpuplan.wants_torch(plan, node) and "torch_error" not in info:
        for check, fatal, words in gpuplan.node_findings(info, list(answer.get("chosen") or ()),
                                                         info.get("limits"), plan.device):
            fix = f"; {gpuplan.arch_fix(words, node.host)}" if fatal else ""
            out.append(result(check, not fatal, words + fix, warning=not fatal))
    return out, info, NodeGpus(node.node_rank, node.host, answer.get("driver"),
                               tuple(answer.get("gpus") or ()), tuple(answer.get("apps") or ()),
                               tuple(answer.get("chosen") or ()), tuple(answer.get("free") or ()),
                               info.get("count") if info.get("available") else None,
                               answer.get("lock_dir"), tuple(answer.get("smi_notes") or ()),
                               tuple(answer.get("unreported") or ()),
                               tuple(asked.get("ignore") or ()),
                               tuple(asked.get("exclude") or ()))


def _gpu_row(node: NodePlan, plan: RunPlan, answer: dict, info: dict, result) -> CheckResult:
    """The ``gpus`` row: what a launch would get now, or ``up``'s refusal, and
    whether the node's torch sees them (``device: auto`` is decided on that)."""
    if not answer.get("ok"):
        return result("gpus", False,
                      f"{answer.get('error')}; {gpuplan.hint({node.node_rank: answer})}")
    chosen = ",".join(map(str, answer["chosen"]))
    asked = f" ({node.gpu_request})" if node.gpu_request else ""
    if gpuplan.wants_torch(plan, node) and "torch_error" not in info:
        seen = {"ok": True, **info}
        problem = gpuplan.torch_problem(seen, answer)
        if problem:
            return result("gpus", False, f"GPUs {chosen}: {problem}; {gpuplan.torch_fix(seen)}")
    notes = "; ".join(gpuplan.node_notes(plan, answer))
    return result("gpus", True, f"GPUs {chosen}{asked} free now" + (f"; {notes}" if notes else ""),
                  warning=bool(notes))


def _mixed_rows(tables: tuple[NodeGpus, ...]) -> list[CheckResult]:
    """A warning when the GPUs the run would get are of different models."""
    models = [gpu["name"] for table in tables for gpu in table.gpus
              if gpu["index"] in table.chosen]
    mixed = mixed_models(models)
    return [CheckResult(-1, "*", "gpu models", True, mixed, warning=True)] if mixed else []


def holder_text(holder: dict | None) -> str:
    """Who holds a GPU, for the table."""
    return describe_holder(holder) if holder else "-"
