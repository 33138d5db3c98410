"""Text for recorded runs: ``ps``, ``status``, ``down`` and ``check`` reports."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..agent.wire.owner import Holder
from ..agent.wire.protocol import is_count, is_time
from ..records.hints import failure_hint
from ..records.outcome import RunDescription, RunOutcome
from ..records.runsdir import RunsDir
from ..records.store import RunRecord
from ..tables import format_table
from .gpus import GPU_KEYS, gpu_lines, gpu_words
from .pace import marked, pace_of

if TYPE_CHECKING:  # `ps` and `status` read records; `check` loads the preflight
    from ..backends.base import CancelResult
    from ..engine.checkresult import NodeGpus, Preflight


PS_WHY_WIDTH = 70  # the ROOT CAUSE column of ``ps``: status shows it whole


def render_ps(records: list[RunRecord], where: RunsDir | None = None) -> str:
    """The ``ps`` table, newest first, then which runs directory it read and why."""
    text = _runs_table(records, why=True)
    if where is not None:
        text += f"runs directory: {where.shown} ({where.source})\n"
    return text


def _runs_table(records: list[RunRecord], why: bool) -> str:
    """A row per run; WAITED (for its nodes) and DURATION add up to its end."""
    rows = [("RUN", "BACKEND", "STATE", "STARTED", "WAITED", "DURATION", "NODES", "EXIT CODES")
            + (("ROOT CAUSE",) if why else ())]
    for r in records:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started)) if r.started else "-"
        waited = f"{r.waited_s:.1f}s" if r.waited_s is not None else "-"
        duration = f"{r.wall_s:.1f}s" if r.wall_s is not None else "-"
        codes = ",".join("-" if c is None else str(c) for c in r.exit_codes) or "-"
        rows.append((r.run_id, r.backend or "-", r.state.value, started, waited, duration,
                     ",".join(r.hosts) or "-", codes)
                    + ((_brief(why_failed(r), PS_WHY_WIDTH) or "-",) if why else ()))
    return format_table(rows) + "\n"


def why_failed(record: RunRecord) -> str:
    """Why an ended run did not succeed, on one line: its error or root cause; "" if none."""
    if record.error:
        return " ".join(line.strip() for line in record.error.splitlines() if line.strip())
    root = record.root_cause
    return f"node {root.node_rank} ({root.host}): {root.reason}" if root else ""


def _brief(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def next_step(record: RunRecord, described: RunDescription) -> str:
    """What to run next for a detached run: follow it while live, ``attach`` once it ended."""
    if not record.owner.detached:
        return ""
    if described.state.live:
        return f"`ddp-orch attach {record.run_id}` follows it"
    if not record.results_home:
        return (f"`ddp-orch attach {record.run_id}` brings its results home and prints "
                f"the summary")
    return ""


def render_status(record: RunRecord, described: RunDescription) -> str:
    lines = [_runs_table([record], why=False).rstrip("\n")]
    if described.detail:
        lines.append(described.detail)
    for outcome in described.nodes:
        lines.append(f"  node {outcome.node_rank} ({outcome.host}): {outcome.state.value}, "
                     f"exit {outcome.exit_code}: {outcome.reason}")
    lines += gpu_lines(record.run.plan())
    ranks = live_progress(record, described)
    slow = marked(ranks)
    for rank in ranks:
        why = slow.get(rank["rank"])
        lines.append(f"  rank {rank['rank']} (node {rank['node_rank']}, {rank['host']}): "
                     f"{progress_words(rank)}{gpu_words(rank)}"
                     + (f"; holds the gang back: {why}" if why else ""))
    if record.error:
        text = record.error.replace("\n", "\n  ")
        lines.append(f"error: {text}")
    root = described.root_cause
    if root:
        lines.append(f"root cause: node {root.node_rank} ({root.host}): {root.reason}")
        hint = failure_hint(root, described.nodes, record.run.plan())
        if hint:
            lines.append(f"hint: {hint}")
    if len(described.attempts) > 1 or any(a.note for a in described.attempts):
        from .summary import render_attempts

        lines += render_attempts(described.attempts)
    then = next_step(record, described)
    if record.owner.detached:
        keep, kept = ("the nodes' keepers keep", "the nodes' keepers kept") \
            if record.owner.holder is Holder.KEEPERS else (f"{record.backend} keeps",
                                                           f"{record.backend} kept")
        lines.append(f"owner: {record.owner} ({keep} the run; {then})"
                     if described.state.live else
                     f"owner: {record.owner} ({kept} the run to its end)")
    result = record.run.result()
    if isinstance(result, dict):
        lines.append(f"result: {record.run.result_file()}")
        lines += [f"  {key} = {value}" for key, value in (result.get("metrics") or {}).items()]
    elif then and not described.state.live:
        lines.append(f"result: not brought home yet: {then}")
    from ..engine.results import outputs_lines

    lines += outputs_lines(record.run.outputs(), record.run.path)
    lines.append(f"run directory: {record.run.path}")
    return "\n".join(lines) + "\n"


def progress_words(rank: dict) -> str:
    """A rank's progress; one with none is "no output yet", never a stall (most print on rank 0)."""
    ago = rank["last_progress_s_ago"]
    if ago is None:
        return "no output yet"
    step = "-" if rank["step"] is None else rank["step"]
    samples = rank.get("samples")
    seen = "" if samples is None else f" ({samples} sample{'s' if samples != 1 else ''})"
    return f"step {step}{seen}, last progress {ago:.0f}s ago"


def live_progress(record: RunRecord, described: RunDescription | None = None) -> list[dict]:
    """Each rank's last step of a live run, from its nodes (a detached run) or its
    controller (``progress.json``)."""
    if not record.state.live:
        return []
    if described is not None and described.progress:
        progress = {"ranks": {str(r["rank"]): r for r in described.progress}}
    else:
        progress = record.run.progress()
    if not (isinstance(progress, dict) and isinstance(progress.get("ranks"), dict)):
        return []
    now = time.time()
    out = []
    for rank, seen in sorted(progress["ranks"].items(), key=lambda kv: int(kv[0])):
        last, line, samples, stepped = seen.get("last_progress"), seen.get("last_output"), \
            seen.get("samples"), seen.get("last_step")
        out.append({"rank": int(rank), "node_rank": seen.get("node_rank"),
                    "host": seen.get("host"), "step": seen.get("step"),
                    "samples": samples if is_count(samples) else None,
                    "last_progress_s_ago": now - float(last) if is_time(last) else None,
                    "last_output_s_ago": now - float(line) if is_time(line) else None,
                    "last_step_s_ago": now - float(stepped) if is_time(stepped) else None,
                    **{key: seen[key] for key in GPU_KEYS if key in seen},
                    **pace_of(seen)})
    return out


def live_attempt(record: RunRecord, described: RunDescription | None = None) -> int | None:
    """The attempt a live kept run is in (0, then 1 more per gang restart); None if unknown."""
    if not record.state.live:
        return None
    if described is not None and described.attempt is not None:
        return described.attempt
    progress = record.run.progress()
    attempt = progress.get("attempt") if isinstance(progress, dict) else None
    return attempt if is_count(attempt) else None


def final_progress(record: RunRecord) -> list[dict]:
    """An ended run's ranks as its controller last recorded them, with mean rates
    over the run's own time; [] for a live run, or where no controller kept them."""
    progress = record.run.progress()
    since = record.running_since
    if record.state.live or since is None or not (
            isinstance(progress, dict) and isinstance(progress.get("ranks"), dict)):
        return []
    end = record.ended or time.time()
    out = []
    for rank, seen in sorted(progress["ranks"].items(), key=lambda kv: int(kv[0])):
        if not (isinstance(seen, dict) and str(rank).isdigit()):
            continue
        last, stepped = seen.get("last_progress"), seen.get("last_step")
        span = float(stepped) - since if is_time(stepped) else 0.0
        step, samples = seen.get("step"), seen.get("samples")
        out.append({"rank": int(rank), "node_rank": seen.get("node_rank"),
                    "host": seen.get("host"), "step": step,
                    "samples": samples if is_count(samples) else None,
                    "last_progress_s_ago": end - float(last) if is_time(last) else None,
                    "last_step_s_ago": None,  # no window: the rates are the run's means
                    "mean_steps_per_s": step / span if is_count(step) and span > 0 else None,
                    "mean_samples_per_s": samples / span if is_count(samples) and span > 0
                    else None,
                    **{key: seen[key] for key in ("gpu",) if key in seen},
                    **pace_of(seen)})
    return out


def render_detached(outcome: RunOutcome, run_path: str) -> str:
    """What ``up --detach`` (or ``attach``, leaving) prints once every node started."""
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
    """The check table and its verdict: warnings pass (exit 0), a failure fails (exit 1)."""
    rows = [("NODE", "HOST", "CHECK", "STATUS", "DETAIL")]
    rows += [(str(r.node_rank) if r.node_rank >= 0 else "-", r.host, r.check,
              ("warn" if r.warning else "ok") if r.ok else "FAIL", r.detail)
             for r in report.results]
    warned = f" ({report.warnings} warning(s))" if report.warnings else ""
    verdict = f"all checks passed{warned}" if report.ok else \
        f"{sum(not r.ok for r in report.results)} check(s) failed{warned}"
    return format_table(rows) + "\n" + "".join(map(render_gpus, report.gpus)) + verdict + "\n"


def render_gpus(node: NodeGpus) -> str:
    """One node's GPUs for ``check``, and whether the run would take each now."""
    from ..engine.preflight import holder_text

    from ..agent.node.gpus import health_cell

    torch = f"; torch sees {node.torch_sees}" if node.torch_sees is not None else ""
    locks = f"; locks in {node.lock_dir}" if node.lock_dir else ""
    head = (f"\nnode {node.node_rank} ({node.host}) GPUs, driver {node.driver or '?'}{torch}"
            f"{locks}\n")
    if not node.gpus:
        return head + "  (nvidia-smi lists none, or did not answer)\n\n"
    rows = [("GPU", "MODEL", "MEMORY", "UTIL", "HEALTH", "PROCESSES", "HELD BY", "STATE")]
    for gpu in node.gpus:
        procs = [app for app in node.apps if app.get("gpu_uuid") == gpu.get("uuid")]
        rows.append((str(gpu["index"]), gpu.get("name") or "?", _memory(gpu),
                     "-" if gpu.get("utilization") is None else f"{gpu['utilization']}%",
                     health_cell(gpu, node.ignore),
                     ", ".join(_process(app) for app in procs) or "-",
                     holder_text(gpu.get("held_by")), _gpu_state(gpu, node)))
    said = [f"  {note}\n" for note in node.notes]
    if node.unreported:
        said.append(f"  not reported by this nvidia-smi (unknown, not held against a GPU): "
                    f"{', '.join(node.unreported)}\n")
    return head + format_table(rows) + "\n" + "".join(said) + "\n"


def _memory(gpu: dict) -> str:
    used, total = gpu.get("memory_used_mib"), gpu.get("memory_total_mib")
    if used is None or total is None:
        return "?"
    return f"{used / 1024:.1f}/{total / 1024:.1f} GiB"


def _process(app: dict) -> str:
    used = f", {app['used_mib']} MiB" if app.get("used_mib") is not None else ""
    return f"{app.get('pid')} {app.get('name') or '?'} ({app.get('user') or '?'}{used})"


def _gpu_state(gpu: dict, node: NodeGpus) -> str:
    from ..agent.node.gpus import health

    if gpu["index"] in node.chosen:
        return "the run's" if gpu["index"] in node.free else "the run's (busy)"
    if gpu.get("mig"):
        return "MIG"
    if health(gpu, node.ignore):
        return "unfit"
    if gpu["index"] in node.exclude:
        return "excluded"
    if gpu.get("held_by"):
        return "held"
    return "free" if gpu["index"] in node.free else "busy"
