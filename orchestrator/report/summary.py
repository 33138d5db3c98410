"""The end-of-run summary: per-node status, wall time, root cause, key metrics."""

from __future__ import annotations

from typing import Any

from ..engine.gpuuse import idle_rank
from ..engine.results import outputs_lines
from ..plan.network import AUTO, GLOO_IFNAME
from ..records.hints import failure_hint, is_network_failure
from ..records.outcome import RunOutcome
from ..tables import format_table
from ..agent.node.gpus import mixed_models
from ..config.catalog import builtin
from .gpus import gpu_lines, node_gpus
from .pace import from_step_times, stragglers

_KEY_METRICS = 8


def render_summary(outcome: RunOutcome, run_path: str, plan: Any = None,
                   outputs: Any = None, progress: Any = None) -> str:
    """The summary; ``plan`` (``plan.json``) names the interfaces after a network
    failure, ``outputs`` what came home, ``progress`` each rank's GPU use."""
    lines = ["", f"run {outcome.run_id}: {outcome.state.value.upper()} in {outcome.wall_s:.1f}s"]
    rows = [("NODE", "HOST", "STATUS", "EXIT", "DETAIL")]
    for node in outcome.nodes:
        rows.append((str(node.node_rank), node.host, node.state,
                     "-" if node.exit_code is None else str(node.exit_code), node.reason))
    lines.append(format_table(rows, indent="  "))
    lines += gpu_summary(plan, progress)
    root = outcome.root_cause
    if root is not None:
        lines.append(f"root cause: node {root.node_rank} ({root.host}): {root.reason}")
        hint = failure_hint(root, outcome.nodes, plan)
        if hint:
            lines.append(f"hint: {hint}")
    lines += flight_recorder_lines(run_path, plan)
    if len(outcome.attempts) > 1 or any(a.note for a in outcome.attempts):
        lines += render_attempts(outcome.attempts)
    used = interfaces_of(plan)
    if used and root is not None and is_network_failure(root):
        lines.append("network: " + ", ".join(f"node {k} {name}" for k, name in sorted(used.items()))
                     + " (the interface of each node's ranks; `ddp-orch check` tests every pair)")
    if outcome.result:
        lines.append("result: " + _metrics_line(outcome.result))
        lines += data_lines(outcome.result)
        lines += speed_lines(outcome.result)
        lines += slowest_rank(outcome.result.get("rank_step_times"), plan)
    if outcome.ok or _outputs_to_tell(outputs):
        lines += outputs_lines(outputs, run_path)
    lines.append(f"run directory: {run_path}")
    return "\n".join(lines) + "\n"


def flight_recorder_lines(run_path: str, plan: Any = None) -> list[str]:
    """What the flight recorder dumps that came home say."""
    from .flightrec import missing_collective, read_run

    dumps = read_run(run_path)
    if not dumps:
        return []
    world = plan.get("world_size") if isinstance(plan, dict) else None
    found = missing_collective(dumps, world if isinstance(world, int) else None)
    return [f"flight recorder: {line}" for line in found] + \
        [f"flight recorder dumps: {run_path}/nccl_trace/"]


def slowest_rank(rows: Any, plan: Any = None) -> list[str]:
    """``slowest rank: ...`` by ``top``'s rule; none if no rank stands out."""
    named = stragglers(from_step_times(rows))
    if not named:
        return []
    slow = named[0]
    row = next(r for r in rows if isinstance(r, dict) and r.get("rank") == slow.rank)
    host = _plan_host(plan, row.get("node_rank")) or row.get("host")
    return [f"slowest rank: rank {slow.rank} (node {row.get('node_rank')}, {host}), "
            f"{_number(float(row.get('mean_s') or 0) * 1000)} ms/step: {slow.why}"]


def _outputs_to_tell(outputs: Any) -> bool:
    """Whether a failed run's ``outputs:`` have anything to tell: "0 files"
    explains nothing after a failure that came before the program wrote them."""
    return isinstance(outputs, dict) and bool(outputs.get("files") or outputs.get("error")
                                              or outputs.get("refused"))


def _plan_host(plan: Any, node_rank: Any) -> str | None:
    """Node ``node_rank``'s host as the cluster file names it, not the machine's own name."""
    for node in (plan or {}).get("nodes", ()) if isinstance(plan, dict) else ():
        if isinstance(node, dict) and node.get("node_rank") == node_rank \
                and isinstance(node.get("host"), str):
            return node["host"]
    return None


def gpu_summary(plan: Any, progress: Any = None) -> list[str]:
    """The GPUs each node's ranks used, a warning when the models differ (the
    slowest paces every step), and a rank whose GPU sat far below the others."""
    lines = [line.strip() for line in gpu_lines(plan)]
    nodes = plan.get("nodes") or () if isinstance(plan, dict) else ()
    mixed = mixed_models([m for node in nodes if isinstance(node, dict)
                          for m in node_gpus(node)["gpu_models"]])
    if mixed:
        lines.append(f"warning: {mixed}")
    ranks = progress.get("ranks") if isinstance(progress, dict) else None
    idle = idle_rank(ranks) if isinstance(ranks, dict) else None
    if idle:
        lines.append(f"GPU use: {idle}")
    return lines


def interfaces_of(plan: Any) -> dict[int, str]:
    """{node rank: interface} from a ``plan.json``'s ``GLOO_SOCKET_IFNAME``; empty if none."""
    out = {}
    for node in (plan or {}).get("nodes", ()) if isinstance(plan, dict) else ():
        env = node.get("env") if isinstance(node, dict) else None
        name = env.get(GLOO_IFNAME) if isinstance(env, dict) else None
        if isinstance(name, str) and name not in ("", AUTO) \
                and isinstance(node.get("node_rank"), int):
            out[node["node_rank"]] = name
    return out


def render_attempts(attempts) -> list[str]:
    out = [f"attempts: {len(attempts)}"]
    for a in attempts:
        cause = (f": node {a.root_cause.node_rank} ({a.root_cause.host}): {a.root_cause.reason}"
                 if a.root_cause is not None else "")
        then = f" -> {a.note}" if a.note else ""
        out.append(f"  attempt {a.attempt} (port {a.master_port}): {a.state.value}{cause}{then}")
    return out


def data_lines(result: dict[str, Any]) -> list[str]:
    """Where the data came from, and a hint when a built-in fell back to synthetic
    data: a relative ``data_dir`` is read from the ranks' working directory."""
    data, source = result.get("data"), result.get("data_source")
    if not isinstance(data, str) or data == "none":  # noop moves no data
        return []
    lines = [f"data: {source if isinstance(source, str) and source else data}"]
    config = result.get("config") if isinstance(result.get("config"), dict) else {}
    if data == "synthetic" and config.get("data", "auto") == "auto":
        given = config.get("data_dir")
        lines.append("hint: the real dataset was not found, so the run trained on synthetic "
                     f"data; data_dir{f' ({given})' if given else ''} is read on each node, "
                     "relative paths from the ranks' working directory: give the dataset's "
                     "absolute path (--arg data_dir=/path/to/data, or workload.args.data_dir "
                     "in the file), and data=real to fail instead of falling back")
    return lines


def speed_lines(result: dict[str, Any]) -> list[str]:
    """``speed: ...``: what a built-in's speed options (amp, TF32, ...) came to."""
    speed = result.get("speed")
    return [f"speed: {builtin().describe_speed(speed)}"] if isinstance(speed, dict) and speed else []


def _metrics_line(result: dict[str, Any]) -> str:
    parts = [f"world_size={result.get('world_size', '?')}"]
    metrics = result.get("metrics") or {}
    for key, value in list(metrics.items())[:_KEY_METRICS]:
        if isinstance(value, float):
            parts.append(f"{key}={_number(value)}")
        elif isinstance(value, (int, str)):
            parts.append(f"{key}={value}")
    timing = result.get("timing") or {}
    if "samples_per_s" in timing:
        parts.append(f"samples/s={_number(timing['samples_per_s'])}")
    return " ".join(parts)


def _number(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
