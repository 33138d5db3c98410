"""``state.json``: the one module that writes and reads a run's state.

Everything about recorded runs (``ps``, ``status``, ``logs``, ``down``,
``compare --baseline-run``) reads through ``read_record``, so it survives a
controller restart and there is one vocabulary (``outcome.RunState``). A run
recorded as live whose controller process is gone is shown as
``interrupted``: its agents saw the controller's connection close and tore
their nodes down.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from ..errors import ConfigError
from .outcome import NodeOutcome, RunOutcome, RunState
from .rundir import RunDir, valid_run_id

STATE_FILE = "state.json"


@dataclass(frozen=True)
class NodeRecord:
    """Where a node of the run lives, enough for its backend to find it again."""

    node_rank: int
    host: str
    run_dir: str
    python: str
    connection: Mapping[str, Any] = field(default_factory=dict)  # the backend's own


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    run: RunDir
    state: RunState
    backend: str
    started: float | None
    wall_s: float | None
    nodes: tuple[NodeRecord, ...]
    outcomes: tuple[NodeOutcome, ...]
    root_cause: NodeOutcome | None
    controller_pid: int | None

    @property
    def live(self) -> bool:
        return self.state.live

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(n.host for n in self.nodes)

    @property
    def exit_codes(self) -> tuple[int | None, ...]:
        return tuple(o.exit_code for o in self.outcomes)


def write_state(run: RunDir, *, run_id: str, backend: str, state: RunState, started: float,
                nodes: Sequence[NodeRecord], outcome: RunOutcome | None = None) -> None:
    payload: dict[str, Any] = {
        "run_id": run_id, "backend": backend, "state": state.value, "started": started,
        "controller_pid": os.getpid(), "ended": time.time() if outcome else None,
        "wall_s": outcome.wall_s if outcome else None,
        "nodes": [{"node_rank": n.node_rank, "host": n.host, "run_dir": n.run_dir,
                   "python": n.python, "connection": dict(n.connection)} for n in nodes],
    }
    if outcome is not None:
        payload["outcomes"] = [o.to_dict() for o in outcome.nodes]
        payload["root_cause"] = outcome.root_cause.to_dict() if outcome.root_cause else None
    run.write_json(STATE_FILE, payload)


def process_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_record(run: RunDir) -> RunRecord | None:
    """The run's record, or None when ``state.json`` is missing or unreadable."""
    data = run.read_json(STATE_FILE)
    if not isinstance(data, dict):
        return None
    try:
        state = RunState(data.get("state"))
        pid = data.get("controller_pid")
        if state.live and not process_alive(pid):
            state = RunState.INTERRUPTED
        started = data.get("started")
        wall = data.get("wall_s")
        if wall is None and started and state.live:
            wall = time.time() - started
        root = data.get("root_cause")
        return RunRecord(
            run_id=os.path.basename(run.path), run=run, state=state,
            backend=str(data.get("backend", "ssh")), started=started, wall_s=wall,
            nodes=tuple(NodeRecord(int(n["node_rank"]), str(n["host"]), str(n["run_dir"]),
                                   str(n.get("python", "python3")), n.get("connection") or {})
                        for n in data.get("nodes", [])),
            outcomes=tuple(NodeOutcome.from_dict(o) for o in data.get("outcomes") or []),
            root_cause=NodeOutcome.from_dict(root) if root else None,
            controller_pid=pid)
    except (KeyError, TypeError, ValueError):
        return None


def list_runs(runs_dir: str) -> Iterator[RunRecord]:
    """Every recorded run under ``runs_dir``, newest first."""
    if not os.path.isdir(runs_dir):
        return
    for name in sorted(os.listdir(runs_dir), reverse=True):
        record = read_record(RunDir(os.path.join(os.path.abspath(runs_dir), name)))
        if record is not None:
            yield record


def find_run(runs_dir: str, run_id: str) -> RunRecord:
    """The run ``run_id`` (a unique prefix is enough), or a ConfigError."""
    if not valid_run_id(run_id):
        raise ConfigError(f"{run_id!r} is not a run id", source="command line",
                          hint="`ddp-orch ps` lists the runs")
    records = list(list_runs(runs_dir))
    matches = [r for r in records if r.run_id == run_id] or \
        [r for r in records if r.run_id.startswith(run_id)]
    if len(matches) != 1:
        what = "no run" if not matches else f"{len(matches)} runs"
        raise ConfigError(f"{what} matching {run_id!r} in {runs_dir}", source="command line",
                          hint="`ddp-orch ps` lists the runs; pass --runs-dir if they live elsewhere")
    return matches[0]
