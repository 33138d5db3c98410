"""Run records for tests: a run's state as ddp-orch writes it, and the run schemas."""

from __future__ import annotations

import json
import os

from conftest import ROOT
from orchestrator.records.rundir import RunDir
from orchestrator.records.store import RECORD_VERSION


SCHEMAS = os.path.join(ROOT, "schema")


def schema(name: str) -> dict:
    with open(os.path.join(SCHEMAS, f"{name}.schema.json"), encoding="utf-8") as fh:
        return json.load(fh)


def record(runs_dir, run_id: str, started: float, state: str = "succeeded") -> None:
    run = RunDir.create(str(runs_dir), run_id)
    with open(run.file("state.json"), "w", encoding="utf-8") as fh:
        json.dump({"version": RECORD_VERSION, "run_id": run_id, "backend": "local", "state": state,
                   "owner": {"holder": "controller", "detached": False}, "started": started,
                   "ended": started + 2, "wall_s": 2.0, "nodes": []}, fh)


def state(runs: str, run_id: str) -> dict:
    with open(os.path.join(runs, run_id, "state.json"), encoding="utf-8") as fh:
        return json.load(fh)
