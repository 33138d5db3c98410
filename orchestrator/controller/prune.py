"""``ddp-orch prune``: remove ended runs, here and on their nodes. Never a live one:
its record must say it ended, a backend that outlives the controller is asked, and
each node's agent checks that no process of it lives there. An unreachable node
keeps the local run directory too, so a later ``prune`` can still find it."""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field

from ..agent.node.prune import tree_bytes
from ..agent.wire.owner import Holder
from ..backends import backend_of
from ..backends.base import PruneResult
from ..engine.options import LaunchOptions
from ..errors import ConfigError, OrchestratorError
from ..records.outcome import RunState
from ..records.rundir import PLAN_FILE
from ..records.store import RunRecord

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?[smhdw])+$")


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w``, or a sum such as ``1d12h``."""
    cleaned = text.strip().lower().replace(" ", "")
    if not _DURATION.match(cleaned):
        raise ConfigError(f"{text!r} is not a duration", path="--older-than",
                          source="command line",
                          hint="a number and a unit (s, m, h, d, w), e.g. 7d, 12h or 1d12h")
    return sum(float(n) * _UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smhdw])",
                                                            cleaned))


@dataclass(frozen=True)
class Pruned:
    """What became of one run."""

    run_id: str
    removed: bool
    why_kept: str = ""  # when not removed
    local_bytes: int = 0
    nodes: tuple[PruneResult, ...] = field(default_factory=tuple)
    left: tuple[str, ...] = ()  # removed here, but what stays on an unreachable node

    @property
    def freed(self) -> int:
        return self.local_bytes + sum(n.freed for n in self.nodes)


def ended_at(record: RunRecord) -> float | None:
    """When the run ended, as recorded, else when its ``state.json`` was last written."""
    since = record.running_since
    if since is not None and record.wall_s is not None and not record.live:
        return since + float(record.wall_s)
    try:
        return os.path.getmtime(record.run.state_file())
    except OSError:
        return None


def still_live(record: RunRecord) -> str:
    """Why ``record`` counts as alive, its backend asked where needed; "" if it ended."""
    scheduled = record.owner.holder is Holder.SCHEDULER
    if record.live and record.owner.ends_with_controller:
        return f"it is {record.state} (its controller runs)"
    if record.live or scheduled:
        try:
            described = backend_of(record, LaunchOptions()).describe(record)
        except OrchestratorError as exc:
            return f"cannot tell whether it has ended ({exc})"
        if described.state.live:
            return f"it is {described.state}" + (
                f" ({described.detail.splitlines()[0]})" if described.detail else "")
    return ""


def prune_run(record: RunRecord, older_than_s: float | None, now: float | None = None, *,
              forget_unreachable: bool = False) -> Pruned:
    """Remove one run here and on its nodes, unless alive or too new. An unreachable node
    keeps it, unless it never started (no ``plan.json``) or ``forget_unreachable`` says so."""
    now = time.time() if now is None else now
    if older_than_s is not None:
        ended = ended_at(record)
        if ended is None or now - ended < older_than_s:
            age = "an unknown time" if ended is None else f"{_age(now - ended)}"
            return Pruned(record.run_id, False, f"ended {age} ago, within --older-than")
    damaged = record.state is RunState.DAMAGED  # its nodes are not known: none is reached
    if damaged and not forget_unreachable:
        return Pruned(record.run_id, False, f"kept for a later prune: {record.error}; "
                                            "--forget-unreachable removes it here")
    live = "" if damaged else still_live(record)
    if live:
        return Pruned(record.run_id, False, f"live: {live}")
    nodes = () if damaged else tuple(backend_of(record, LaunchOptions()).prune(record))
    troubles = [n for n in nodes if n.error]
    never_started = not os.path.exists(record.run.file(PLAN_FILE))
    live_there = any(n.live for n in troubles)
    if troubles and (live_there or not (never_started or forget_unreachable)):
        why = "; ".join(f"node {n.node_rank} ({n.host}): {n.error}" for n in troubles)
        return Pruned(record.run_id, False, ("live on a node: " if live_there
                                             else "kept for a later prune: ") + why, 0, nodes)
    left = () if never_started else tuple(
        f"node {n.node_rank} ({n.host}): {record_dir(record, n.node_rank)} left there "
        f"({n.error})" for n in troubles)
    local = tree_bytes(record.run.path)
    shutil.rmtree(record.run.path, ignore_errors=True)
    removed = not os.path.exists(record.run.path)
    return Pruned(record.run_id, removed, "" if removed else "could not remove it all here",
                  local, nodes, left)


def render_pruned(results: list[Pruned]) -> str:
    lines = []
    for one in results:
        if one.removed:
            where = [f"{human(one.local_bytes)} here"] + [
                f"{human(n.freed)} on node {n.node_rank} ({n.host})" for n in one.nodes
                if n.remote]
            lines.append(f"pruned {one.run_id}: {', '.join(where)}")
            lines += [f"  not reached: {what}" for what in one.left]
        else:
            lines.append(f"kept   {one.run_id}: {one.why_kept}")
    pruned = [r for r in results if r.removed]
    total = sum(r.freed for r in results)
    lines.append(f"freed {human(total)} in all ({len(pruned)} run(s) pruned, "
                 f"{len(results) - len(pruned)} kept)")
    return "\n".join(lines) + "\n"


def record_dir(record: RunRecord, node_rank: int) -> str:
    return next((n.run_dir for n in record.nodes if n.node_rank == node_rank), "?")


def human(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    return f"{n} B"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
