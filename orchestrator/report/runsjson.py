"""``ps --json`` and ``status --json``: recorded runs for scripts. The shape is a
promise (``schema/ps.schema.json``, ``schema/status.schema.json``): keys may be
added; renaming, removing or changing one raises ``VERSION``. Times are seconds
since the epoch. A run's ``exit_code`` is what ``up`` exits with (null while it
runs); a node's, torchrun's."""

from __future__ import annotations

from typing import Any

from ..records.hints import failure_hint
from ..records.outcome import AttemptOutcome, NodeOutcome, RunDescription, RunState
from ..records.runsdir import RunsDir
from ..records.store import RunRecord
from .gpus import node_gpus
from .pace import marked
from .runs import live_progress, next_step

VERSION = 2
_EXIT_CODES = {RunState.SUCCEEDED: 0, RunState.FAILED: 1, RunState.INTERRUPTED: 130}


def ps_json(records: list[RunRecord], where: RunsDir) -> dict[str, Any]:
    """``ps --json``: the runs directory read, and why, then its runs, newest first."""
    return {"version": VERSION, "runs_dir": where.shown, "runs_dir_source": where.source,
            "runs": [run_json(r, RunDescription(r.state, r.outcomes, r.root_cause,
                                                attempts=r.attempts)) for r in records]}


def status_json(record: RunRecord, described: RunDescription) -> dict[str, Any]:
    """``status --json``: a run as ``ps --json`` shows it, and what ``status`` adds."""
    root = described.root_cause
    return {"version": VERSION, **run_json(record, described),
            "detail": described.detail or None,
            "attempts": [_attempt(a) for a in described.attempts],
            "progress": _with_marks(live_progress(record, described)),
            "hint": (failure_hint(root, described.nodes, record.run.plan()) or None)
            if root else None}


def run_json(record: RunRecord, described: RunDescription) -> dict[str, Any]:
    """One run: its record, with each node's outcome as ``described``."""
    plan = record.run.plan()
    plan = plan if isinstance(plan, dict) else {}
    outcomes = {o.node_rank: o for o in described.nodes}
    placed = {n.get("node_rank"): n for n in plan.get("nodes") or () if isinstance(n, dict)}
    nodes = [{**_node(n.node_rank, n.host, outcomes.pop(n.node_rank, None)),
              **node_gpus(placed.get(n.node_rank))} for n in record.nodes]
    nodes += [{**_node(o.node_rank, o.host, o), **node_gpus(None)} for o in outcomes.values()]
    world = plan.get("world_size")
    return {
        "run_id": record.run_id,
        "name": plan.get("name") if isinstance(plan.get("name"), str) else None,
        "state": record.state.value,
        "backend": record.backend or None,
        "owner": record.owner.to_json(),
        "started": record.started,
        "ended": record.ended,
        "waited_s": record.waited_s,
        "duration_s": record.wall_s,
        "exit_code": _EXIT_CODES.get(record.state),
        "world_size": world if isinstance(world, int) and not isinstance(world, bool) else None,
        "hosts": list(record.hosts),
        "nodes": sorted(nodes, key=lambda n: n["node_rank"]),
        "root_cause": _outcome(described.root_cause),
        "error": record.error or None,
        "run_dir": record.run.path,
        "results_home": record.results_home,
        "next": next_step(record, described) or None,
        "result": _result(record),
    }


def _node(node_rank: int, host: str, outcome: NodeOutcome | None) -> dict[str, Any]:
    return {"node_rank": node_rank, "host": host,
            "state": outcome.state.value if outcome else None,
            "exit_code": outcome.exit_code if outcome else None,
            "reason": outcome.reason if outcome else None,
            "why": outcome.why.value if outcome else None}


def _outcome(outcome: NodeOutcome | None) -> dict[str, Any] | None:
    return _node(outcome.node_rank, outcome.host, outcome) if outcome else None


def _attempt(attempt: AttemptOutcome) -> dict[str, Any]:
    return {"attempt": attempt.attempt, "master_port": attempt.master_port,
            "state": attempt.state.value, "note": attempt.note,
            "root_cause": _outcome(attempt.root_cause)}


def _result(record: RunRecord) -> dict[str, Any] | None:
    """Rank 0's ``result.json`` as brought home; null until it is home."""
    result = record.run.result()
    if not isinstance(result, dict):
        return None
    world = result.get("world_size")
    return {"file": record.run.result_file(),
            "world_size": world if isinstance(world, int) and not isinstance(world, bool)
            else None,
            "metrics": result["metrics"] if isinstance(result.get("metrics"), dict) else {},
            "timing": result["timing"] if isinstance(result.get("timing"), dict) else {}}


def _with_marks(ranks: list[dict]) -> list[dict]:
    """Each rank with ``straggler``: why it holds the gang back (``marked``), or null."""
    slow = marked(ranks)
    return [{**rank, "straggler": slow.get(rank["rank"])} for rank in ranks]
