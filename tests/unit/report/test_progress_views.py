"""A live run's progress as ``status``, ``status --json`` and ``up
--quiet``'s line show it (issue #32): a step heartbeat or an output line is
progress, and a rank that made none has no output yet, never a stall."""

from __future__ import annotations

import json
import os
import time

import jsonschema
import pytest

from conftest import ROOT
from orchestrator.agent.kept import keeper
from orchestrator.agent.kept.records import clean_progress
from orchestrator.engine.gang import progress_line
from orchestrator.records.outcome import RunDescription, RunState
from orchestrator.records.rundir import RunDir
from orchestrator.records.store import NodeRecord, RunRecord
from orchestrator.report.runs import render_status
from orchestrator.report.runsjson import status_json

NOW = 1_800_000_000.0


def rank(step, last_progress, last_output=None, **extra) -> dict:
    return {"node_rank": 0, "host": "a", "step": step, "last_progress": last_progress,
            "last_output": last_output, **extra}


def test_the_quiet_line_counts_a_rank_that_printed_nothing_as_no_output_not_as_stalled():
    ranks = [rank(None, NOW - 3, NOW - 3), rank(None, None), rank(None, None)]
    assert progress_line(0, "a", ranks, NOW) == (
        "ddp-orch: node 0 (a): 3 rank(s), last progress 3s ago (2 with no output yet)\n")
    assert progress_line(1, "b", [rank(None, None)] * 2, NOW) == (
        "ddp-orch: node 1 (b): 2 rank(s), no output yet\n")


def test_the_quiet_line_gives_the_range_of_steps_and_the_latest_progress():
    ranks = [rank(7, NOW - 9), rank(9, NOW - 2, NOW - 30), rank(8, NOW - 4)]
    assert progress_line(0, "a", ranks, NOW) == (
        "ddp-orch: node 0 (a): 3 rank(s) at step 7-9, last progress 2s ago\n")


def live_run(tmp_path, ranks: dict) -> RunRecord:
    run = RunDir(str(tmp_path / "r1"))
    os.makedirs(run.path)
    run.write_progress({"updated": time.time(), "ranks": ranks})
    return RunRecord(run_id="r1", run=run, state=RunState.RUNNING, backend="local",
                     started=time.time() - 60, wall_s=None, ended=None, controller_pid=None,
                     nodes=(NodeRecord(node_rank=0, host="localhost", run_dir="/w/0",
                                       python="python3"),),
                     outcomes=(), root_cause=None)


def test_status_shows_output_lines_as_progress_and_a_silent_rank_as_no_output(tmp_path):
    """Rank 0 printed 5 s ago, rank 1 reports steps and prints nothing,
    rank 2 did neither: in text and in JSON (against its schema)."""
    now = time.time()
    record = live_run(tmp_path, {
        "0": {"node_rank": 0, "host": "localhost", "step": None, "last_progress": now - 5,
              "last_output": now - 5},
        "1": {"node_rank": 0, "host": "localhost", "step": 12, "last_progress": now - 1,
              "last_output": None},
        "2": {"node_rank": 0, "host": "localhost", "step": None, "last_progress": None,
              "last_output": None}})
    described = RunDescription(RunState.RUNNING, (), None)
    text = render_status(record, described)
    assert "  rank 0 (node 0, localhost): step -, last progress 5s ago\n" in text, text
    assert "  rank 1 (node 0, localhost): step 12, last progress 1s ago\n" in text, text
    assert "  rank 2 (node 0, localhost): no output yet\n" in text, text
    data = json.loads(json.dumps(status_json(record, described)))
    with open(os.path.join(ROOT, "schema", "status.schema.json"), encoding="utf-8") as fh:
        jsonschema.validate(data, json.load(fh))
    seen = {r["rank"]: r for r in data["progress"]}
    assert 4 < seen[0]["last_output_s_ago"] < 30 and 4 < seen[0]["last_progress_s_ago"] < 30
    assert seen[1]["last_output_s_ago"] is None and seen[1]["step"] == 12
    assert seen[2]["last_output_s_ago"] is None and seen[2]["last_progress_s_ago"] is None


def test_a_keeper_records_output_lines_as_progress_and_lists_its_silent_ranks(monkeypatch):
    """What ``status`` of a kept run (--detach, --max-restarts) reads from
    keeper.json: rank 4 printed at NOW - 2 and stepped 10 s ago, rank 5
    stepped only (saying its samples), rank 6 (one of this node's running
    ranks) did neither."""
    monkeypatch.setattr(keeper.time, "time", lambda: NOW)
    written = []
    me = type("Me", (), {})()
    me.progress = {}
    me.write_state = lambda state, unless_over=False: written.append(dict(me.progress))
    keeper.Keeper._record_progress(me, {"4": [3, 10.0], "5": [8, 1.0, 256]}, None,
                                   {4: NOW - 2}, range(4, 7))
    assert written == [{
        "4": {"step": 3, "samples": None, "last_step": NOW - 10, "last_progress": NOW - 2,
              "last_output": NOW - 2},
        "5": {"step": 8, "samples": 256, "last_step": NOW - 1, "last_progress": NOW - 1,
              "last_output": None},
        "6": {"step": None, "samples": None, "last_step": None, "last_progress": None,
              "last_output": None}}]
    notes: list[str] = []
    assert clean_progress(written[0], notes) == written[0] and notes == []


def test_an_older_keepers_record_without_last_output_still_counts():
    notes: list[str] = []
    assert clean_progress({"0": {"step": 1, "last_progress": NOW}}, notes) == {
        "0": {"step": 1, "last_progress": NOW}}
    assert notes == []
    assert clean_progress({"0": {"step": 1, "last_progress": NOW, "last_output": "x"}},
                          notes) == {"0": {"step": 1, "last_progress": NOW}}
    assert notes  # the bad field is named, the rank's record kept


def test_status_shows_a_ranks_samples_after_its_step_in_text_and_json(tmp_path):
    """Rank 0's step heartbeat says 1280 samples, rank 1's one, rank 2's
    none, and rank 3's record has samples that are no count (progress.json
    is a file: not trusted)."""
    now = time.time()
    ranks = {str(r): {"node_rank": 0, "host": "localhost", "step": 40, "samples": samples,
                      "last_progress": now - 2, "last_output": None}
             for r, samples in enumerate((1280, 1, None, -4))}
    record = live_run(tmp_path, ranks)
    described = RunDescription(RunState.RUNNING, (), None)
    text = render_status(record, described)
    assert "  rank 0 (node 0, localhost): step 40 (1280 samples), last progress 2s ago\n" in text
    assert "  rank 1 (node 0, localhost): step 40 (1 sample), last progress 2s ago\n" in text
    assert "  rank 2 (node 0, localhost): step 40, last progress 2s ago\n" in text, text
    assert "  rank 3 (node 0, localhost): step 40, last progress 2s ago\n" in text, text
    data = json.loads(json.dumps(status_json(record, described)))
    with open(os.path.join(ROOT, "schema", "status.schema.json"), encoding="utf-8") as fh:
        schema = json.load(fh)
    jsonschema.validate(data, schema)
    assert [r["samples"] for r in data["progress"]] == [1280, 1, None, None]
    for bad in (-4, 2.5, "1280"):  # the schema holds a promise: a count or null
        data["progress"][0]["samples"] = bad
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(data, schema)
    del data["progress"][0]["samples"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


def test_status_of_a_detached_run_shows_the_samples_its_keepers_recorded(tmp_path):
    """Where no controller keeps progress.json, ``status`` reads what the
    nodes' keepers recorded (``described.progress``), samples included."""
    now = time.time()
    record = live_run(tmp_path, {})
    described = RunDescription(RunState.RUNNING, (), None, progress=(
        {"rank": 0, "node_rank": 0, "host": "localhost", "step": 7, "samples": 224,
         "last_progress": now - 3, "last_output": None},))
    assert "  rank 0 (node 0, localhost): step 7 (224 samples), last progress 3s ago\n" in (
        render_status(record, described))
    assert status_json(record, described)["progress"][0]["samples"] == 224
