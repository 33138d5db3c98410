"""Text for recorded runs: ``ps``, ``status``, ``down`` and ``check`` reports."""

from __future__ import annotations

import time

from ..backends.base import CancelResult, Preflight, RunDescription
from ..backends.results import OUTPUTS_RECORD, outputs_lines
from ..records.hints import failure_hint
from ..records.outcome import RunOutcome
from ..records.store import RunRecord
from .table import format_table


def render_ps(records: list[RunRecord]) -> str:
    rows = [("RUN", "BACKEND", "STATE", "STARTED", "DURATION", "NODES", "EXIT CODES")]
    for r in records:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started)) if r.started else "-"
        duration = f"{r.wall_s:.1f}s" if r.wall_s is not None else "-"
        codes = ",".join("-" if c is None else str(c) for c in r.exit_codes) or "-"
        rows.append((r.run_id, r.backend, r.state.value, started, duration,
                     ",".join(r.hosts) or "-", codes))
    return format_table(rows) + "\n"


def render_status(record: RunRecord, described: RunDescription) -> str:
    lines = [render_ps([record]).rstrip("\n")]
    if described.detail:
        lines.append(described.detail)
    for outcome in described.nodes:
        lines.append(f"  node {outcome.node_rank} ({outcome.host}): {outcome.state.value}, "
                     f"exit {outcome.exit_code}: {outcome.reason}")
    progress = record.run.read_json("progress.json") if record.state.live else None
    if isinstance(progress, dict) and isinstance(progress.get("ranks"), dict):
        now = time.time()
        for rank, seen in sorted(progress["ranks"].items(), key=lambda kv: int(kv[0])):
            step = "-" if seen.get("step") is None else seen.get("step")
            lines.append(f"  rank {rank} (node {seen.get('node_rank')}, {seen.get('host')}): "
                         f"step {step}, last progress "
                         f"{now - float(seen.get('last_progress', now)):.0f}s ago")
    root = described.root_cause
    if root:
        lines.append(f"root cause: node {root.node_rank} ({root.host}): {root.reason}")
        hint = failure_hint(root, described.nodes)
        if hint:
            lines.append(f"hint: {hint}")
    if len(described.attempts) > 1 or any(a.note for a in described.attempts):
        from .summary import render_attempts

        lines += render_attempts(described.attempts)
    if record.rule == "detached":
        lines.append("liveness: detached (the nodes' agents keep the run"
                     + (f"; `ddp-orch attach {record.run_id}` follows it)" if described.state.live
                        else ")"))
    result = record.run.read_json("result.json")
    if isinstance(result, dict):
        lines.append(f"result: {record.run.file('result.json')}")
        lines += [f"  {key} = {value}" for key, value in (result.get("metrics") or {}).items()]
    lines += outputs_lines(record.run.read_json(OUTPUTS_RECORD), record.run.path)
    lines.append(f"run directory: {record.run.path}")
    return "\n".join(lines) + "\n"


def render_detached(outcome: RunOutcome, run_path: str) -> str:
    """What ``up --detach`` prints once every node has started (or what
    ``attach`` prints when it leaves a run that goes on)."""
    run = outcome.run_id
    hosts = ", ".join(f"node {n.node_rank} ({n.host})" for n in outcome.nodes)
    return (f"\nrun {run} is running on {hosts}, kept by the nodes' agents; this "
            f"controller can go.\n"
            f"  follow it:   ddp-orch attach {run}   (--lines N: from the last N lines)\n"
            f"  its state:   ddp-orch status {run}\n"
            f"  its logs:    ddp-orch logs {run} --follow\n"
            f"  stop it:     ddp-orch down {run}\n"
            f"run directory: {run_path}\n")


def render_down(record: RunRecord, stopped_controller: bool, nodes: list[CancelResult]) -> str:
    lines = [f"run {record.run_id}:"]
    if stopped_controller:
        lines.append(f"  asked its controller (pid {record.controller_pid}) to stop")
    for node in nodes:
        if node.error:
            lines.append(f"  node {node.node_rank} ({node.host}): could not check: {node.error}")
        elif node.survivors:
            lines.append(f"  node {node.node_rank} ({node.host}): could NOT end "
                         + ", ".join(f"pid {s['pid']} ({s['cmd'][:80]})" for s in node.survivors)
                         + " (uninterruptible, or not ours to signal: check that node)")
        elif node.killed:
            lines.append(f"  node {node.node_rank} ({node.host}): ended {len(node.killed)} "
                         f"process(es): {' '.join(map(str, node.killed))}")
        else:
            lines.append(f"  node {node.node_rank} ({node.host}): nothing left running")
    return "\n".join(lines) + "\n"


def render_check(report: Preflight) -> str:
    """The check table (STATUS ok, warn or FAIL) and its verdict: warnings
    are shown but pass (exit 0); a failure fails (exit 1)."""
    rows = [("NODE", "HOST", "CHECK", "STATUS", "DETAIL")]
    rows += [(str(r.node_rank) if r.node_rank >= 0 else "-", r.host, r.check,
              ("warn" if r.warning else "ok") if r.ok else "FAIL", r.detail)
             for r in report.results]
    warned = f" ({report.warnings} warning(s))" if report.warnings else ""
    verdict = f"all checks passed{warned}" if report.ok else \
        f"{sum(not r.ok for r in report.results)} check(s) failed{warned}"
    return format_table(rows) + "\n" + verdict + "\n"
