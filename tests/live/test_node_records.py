"""What the controller reads from nodes is checked, never trusted: a kept
run's records (``agent/kept/records.py``), the exit events (``protocol``), and
the text it prints (control characters shown, not obeyed)."""

from __future__ import annotations

import json
import math
import time

import pytest

from conftest import local_job, run_cli
from orchestrator.agent.wire.protocol import ProtocolError, validate
from orchestrator.agent.kept.records import clean_attempts, clean_keeper_state
from orchestrator.engine.keptgang import attempt_outcomes
from orchestrator.console import visible

GOOD_PART = {"code": 1, "reason": "torchrun exited", "duration_s": 1.5, "last_lines": ["x"],
             "failures": [{"local_rank": 0, "message": "RuntimeError: boom",
                           "timestamp": 1795000000.5, "error_file": None}],
             "stop_asked": False, "stepped": True}


def _plan(n: int):
    from orchestrator.config.loader import load_cluster_text
    from orchestrator.plan.build import build_plan

    nodes = "".join("  - {host: localhost, procs: 1}\n" for _ in range(n))
    return build_plan(load_cluster_text(f"nodes:\n{nodes}workload: {{name: linear}}\n"),
                      run_id="r", local_run_dir="/tmp/r")


@pytest.mark.parametrize("bad", [
    {"timestamp": 1e300}, {"timestamp": math.nan}, {"timestamp": math.inf},
    {"timestamp": True}, {"local_rank": "0"}, {"local_rank": -1}, {"message": 7},
])
def test_an_exit_event_with_a_bad_failure_record_is_malformed(bad):
    failure = {**GOOD_PART["failures"][0], **bad}
    with pytest.raises(ProtocolError):
        validate({"event": "exit", **GOOD_PART, "failures": [failure]})


@pytest.mark.parametrize("field,value", [("duration_s", 1e300), ("stopped_at", -5),
                                         ("stopped_at", "now")])
def test_an_exit_event_with_a_time_that_is_no_time_is_malformed(field, value):
    with pytest.raises(ProtocolError):
        validate({"event": "exit", **GOOD_PART, field: value})


def test_bad_attempt_records_are_dropped_with_a_note_and_never_raise():
    recorded = [
        "junk",
        {"attempt": "zero", "master_port": 10 ** 9, "state": "failed", "no_restart": 3,
         "nodes": {"0": dict(GOOD_PART), "1": {**GOOD_PART, "code": "1"},
                   "x": dict(GOOD_PART)}},
        {"attempt": 1, "master_port": 29500, "state": "failed", "restart": "",
         "nodes": {"0": {"lost": 5}, "1": {**GOOD_PART, "failures": [{"local_rank": "a"}]},
                   "2": {**GOOD_PART, "stop_asked": "yes"}}},
        {"attempt": 2, "state": "succeeded", "nodes": ["not", "a", "mapping"]},
    ]
    notes: list[str] = []
    cleaned = clean_attempts(recorded, notes)
    assert len(cleaned) == 3
    assert "attempt" not in cleaned[0] and "master_port" not in cleaned[0]
    assert set(cleaned[0]["nodes"]) == {"0"} and set(cleaned[1]["nodes"]) == {"2"}
    assert "stop_asked" not in cleaned[1]["nodes"]["2"] and cleaned[2]["nodes"] == {}
    assert len(notes) == 10, notes
    assert any("'master_port'" in n for n in notes) and any("node 'x'" in n for n in notes)
    outcomes = attempt_outcomes(_plan(3), recorded)  # never raises
    assert [a.attempt for a, _ in outcomes] == [0, 1, 2]
    assert [str(n.state) for n in outcomes[0][1]] == ["failed", "lost", "lost"]


def test_a_bad_keeper_record_keeps_only_its_good_fields():
    notes: list[str] = []
    kept = clean_keeper_state({"pid": "12", "state": "failed", "code": "1", "updated": 1e300,
                               "attempt": -1, "attempts": {"a": 1}}, notes)
    assert kept == {"state": "failed"}
    assert len(notes) == 5
    assert clean_keeper_state([1, 2], notes) is None and clean_keeper_state(None, notes) is None


def test_control_characters_are_shown_not_obeyed():
    assert visible("a\x1b]0;pwned\x07b\tc\nd\x9b") == "a\\x1b]0;pwned\\x07b\tc\nd\\x9b"


@pytest.mark.live  # a real detached run on this machine: seconds
def test_ps_and_status_survive_a_bad_keeper_record_and_show_what_was_ignored(tmp_path):
    """A detached run ends while nobody watches; then node 0's keeper.json
    is rewritten with values of the wrong type, a time of 1e300 and a
    terminal escape. ``ps`` and ``status`` settle the run without a
    traceback, note what they ignored, and print no raw escape."""
    cluster = local_job(tmp_path, "bad", "steps.py",
                        "[{host: localhost, procs: 1}, {host: localhost, procs: 1}]")
    runs = str(tmp_path / "runs")
    started = run_cli("up", cluster, "--runs-dir", runs, "--run-id", "bad", "--detach",
                      "--arg", "steps=2")
    assert started.returncode == 0, started.stdout + started.stderr
    record = tmp_path / "runs" / "bad" / "node-0" / "keeper.json"
    deadline = time.monotonic() + 60
    while json.loads(record.read_text()).get("state") == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(0.5)  # its keeper exits right after its last write
    kept = json.loads(record.read_text())
    kept.update(updated=1e300, code="x", state="failed\x1b[2J",
                attempts=[{"attempt": 0, "master_port": "p", "state": "failed",
                           "nodes": {"0": {"lost": 1}, "1": {"code": 1}}}])
    record.write_text(json.dumps(kept))
    status = run_cli("status", "bad", "--runs-dir", runs)  # asks the nodes, settles the run
    ps = run_cli("ps", "--runs-dir", runs)
    for result in (ps, status):
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Traceback" not in result.stderr and "\x1b" not in result.stdout
    assert " failed " in status.stdout.splitlines()[1], status.stdout
    assert "ignored the keeper's record's 'updated': 1e+300" in status.stdout
    assert "ended at an unknown time" in status.stdout
    assert "ignored the keeper's record's 'updated'" in (tmp_path / "runs" / "bad" / "node-0.log"
                                                         ).read_text()
    assert " failed " in ps.stdout.splitlines()[1], ps.stdout
