"""Unit tests of engine/keptgang.py: a kept run's recorded attempts read back as outcomes."""

from __future__ import annotations

import json

from orchestrator.engine.keptgang import attempt_outcomes
from orchestrator.records.outcome import NodeState
from keepers import _plan


def test_the_recorded_attempts_read_back_as_outcomes():
    recorded = [{"attempt": 0, "master_port": 1, "state": "failed", "restart": "",
                 "no_restart": "node 0 failed with ImportError before the first step",
                 "nodes": {"0": {"code": 1, "reason": "torchrun exited", "ended": "itself", "failures": [
                     {"local_rank": 0, "message": "ImportError: x", "timestamp": 1.0,
                      "error_file": None}], "last_lines": []},
                     "1": {"lost": "the link closed"}}}]
    ((attempt, nodes),) = attempt_outcomes(_plan(2), recorded)
    assert attempt.note.startswith("no restart: node 0 failed with ImportError")
    assert nodes[1].state is NodeState.LOST and "the link closed" in nodes[1].reason
    assert attempt.root_cause.node_rank == 0
    assert json.loads(json.dumps(attempt.to_dict()))["root_cause"]["node_rank"] == 0


def _record(nnodes: int):
    """What ``kept_status`` reads of a run's record: its id, its nodes' hosts,
    and where a note about a node goes."""
    from types import SimpleNamespace

    noted: list[tuple[int, str]] = []
    run = SimpleNamespace(note=lambda k, text: noted.append((k, text)))
    return SimpleNamespace(run_id="r", run=run, noted=noted,
                           nodes=[SimpleNamespace(host=f"h{k}") for k in range(nnodes)])


def _keeper(k: int, state: str = "running", **more) -> dict:
    return {"pid": 100 + k, "start_time": 1, "node_rank": k, "run_id": "r",
            "owner": {"holder": "keepers", "detached": True},
            "state": state, "code": None, "attempt": 0, "updated": 1.7e9, **more}


def test_a_live_detached_run_is_running_while_a_node_cannot_be_asked(monkeypatch):
    """Not over on shaky ground: an unreachable node keeps the run RUNNING.
    Each rank's last step comes with its time moved onto this clock."""
    import time

    from orchestrator.engine.keptgang import kept_status
    from orchestrator.records.outcome import RunState

    monkeypatch.setattr(time, "time", lambda: 2000.0)
    seen = {"0": {"step": 40, "last_progress": 995.0, "samples": 1280}}
    replies = {0: {"ok": True, "alive": True, "now": 1000.0,  # node 0's clock is 1000 s behind
                   "keeper": _keeper(0, progress=seen)}}
    record = _record(2)
    described = kept_status(record, _plan(2), replies, {1: "timed out"})
    assert described.state is RunState.RUNNING
    assert described.detail.splitlines() == ["the nodes say:", "  node 0 (h0): running, attempt 0",
                                             "  node 1 (h1): cannot be reached: timed out"]
    assert described.progress == ({"step": 40, "samples": 1280, "rank": 0, "node_rank": 0,
                                   "host": "h0", "last_progress": 1995.0, "last_output": None,
                                   "last_step": None},)
    # node 0's keeper gone too: still not over while node 1 cannot say
    gone = {0: {**replies[0], "alive": False}}
    assert kept_status(record, _plan(2), gone, {1: "timed out"}).state is RunState.RUNNING
    assert kept_status(record, _plan(2), gone, {}).state is RunState.FAILED


def test_a_finished_detached_run_is_what_node_0_recorded_and_bad_fields_are_noted():
    from orchestrator.engine.keptgang import kept_status
    from orchestrator.records.outcome import RunState

    attempts = [{"attempt": 0, "master_port": 1, "state": "failed", "restart": "",
                 "no_restart": "", "stop_reason": "", "nodes": {
                     "0": {"code": 143, "reason": "stopped", "failures": [], "last_lines": [],
                           "duration_s": 1.0, "stop_asked": True},
                     "1": {"code": 1, "reason": "torchrun exited", "ended": "itself", "failures": [
                         {"local_rank": 0, "message": "ValueError: boom", "timestamp": 5.0,
                          "error_file": None}], "last_lines": [], "duration_s": 1.0}}}]
    replies = {0: {"ok": True, "alive": False, "now": 1.0,
                   "keeper": _keeper(0, "failed", code=143, attempts=attempts)},
               1: {"ok": True, "alive": False, "now": 1.0,
                   "keeper": _keeper(1, "failed", code=1, pid="x")}}
    record = _record(2)
    described = kept_status(record, _plan(2), replies, {})
    assert described.state is RunState.FAILED and described.root_cause.node_rank == 1
    assert described.detail.startswith("ended at ") and "as node 0's keeper recorded" in \
        described.detail
    assert [a.master_port for a in described.attempts] == [1]
    assert record.noted == [(1, "ignored the keeper's record's 'pid': 'x'")]


def test_a_node_recorded_running_whose_keeper_is_gone_is_lost():
    from orchestrator.engine.keptgang import kept_status
    from orchestrator.records.outcome import NodeState, RunState

    replies = {0: {"ok": True, "alive": False, "now": 1.0, "keeper": _keeper(0, "failed", code=1)},
               1: {"ok": True, "alive": False, "now": 1.0, "keeper": _keeper(1)}}
    described = kept_status(_record(2), _plan(2), replies, {})
    assert described.state is RunState.FAILED
    assert [(n.node_rank, n.state) for n in described.nodes] == [(1, NodeState.LOST)]
    assert "node 1 (h1): its keeper is gone without finishing" in described.detail
    assert "node 0 (h0): failed (exit 1)" in described.detail
