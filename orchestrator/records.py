"""Runs as recorded on disk: what ``ps``, ``status``, ``logs`` and ``down`` read.

Everything comes from the local run directories (``state.json``,
``plan.json``, the node logs), so it survives a controller restart. A run
recorded as running whose controller process is gone is shown as
``interrupted``: its supervisors saw the controller's connection close and
tore their nodes down.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Iterator

from .errors import ConfigError
from .runs import RunDir, valid_run_id
from .table import format_table

LIVE_STATES = ("starting", "running")


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    run: RunDir
    state: str
    started: float | None
    wall_s: float | None
    hosts: tuple[str, ...]
    exit_codes: tuple[int | None, ...]
    controller_pid: int | None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


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
    state = run.read_json("state.json")
    if not isinstance(state, dict):
        return None
    recorded = state.get("state", "unknown")
    pid = state.get("controller_pid")
    if recorded in LIVE_STATES and not process_alive(pid):
        recorded = "interrupted"
    outcomes = state.get("outcomes") or []
    started = state.get("started")
    wall = state.get("wall_s")
    if wall is None and started and recorded in LIVE_STATES:
        wall = time.time() - started
    return RunRecord(run_id=os.path.basename(run.path), run=run, state=recorded,
                     started=started, wall_s=wall,
                     hosts=tuple(n["host"] for n in state.get("nodes", [])),
                     exit_codes=tuple(o.get("exit_code") for o in outcomes), controller_pid=pid)


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
    matches = [r for r in list_runs(runs_dir) if r.run_id == run_id] or \
        [r for r in list_runs(runs_dir) if r.run_id.startswith(run_id)]
    if len(matches) != 1:
        what = "no run" if not matches else f"{len(matches)} runs"
        raise ConfigError(f"{what} matching {run_id!r} in {runs_dir}", source="command line",
                          hint="`ddp-orch ps` lists the runs; pass --runs-dir if they live elsewhere")
    return matches[0]


def render_ps(records: list[RunRecord]) -> str:
    rows = [("RUN", "STATE", "STARTED", "DURATION", "NODES", "EXIT CODES")]
    for r in records:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started)) if r.started else "-"
        duration = f"{r.wall_s:.1f}s" if r.wall_s is not None else "-"
        codes = ",".join("-" if c is None else str(c) for c in r.exit_codes) or "-"
        rows.append((r.run_id, r.state, started, duration, ",".join(r.hosts) or "-", codes))
    return format_table(rows) + "\n"
