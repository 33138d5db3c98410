"""Unit tests of engine/keptgang.py: a kept run's recorded attempts read back as outcomes."""

from __future__ import annotations

import json

from orchestrator.engine.keptgang import attempt_outcomes
from orchestrator.records.outcome import NodeState
from keepers import _plan


def test_the_recorded_attempts_read_back_as_outcomes():
    recorded = [{"attempt": 0, "master_port": 1, "state": "failed", "restart": "",
                 "no_restart": "node 0 failed with ImportError before the first step",
                 "nodes": {"0": {"code": 1, "reason": "torchrun exited", "failures": [
                     {"local_rank": 0, "message": "ImportError: x", "timestamp": 1.0,
                      "error_file": None}], "last_lines": []},
                     "1": {"lost": "the link closed"}}}]
    ((attempt, nodes),) = attempt_outcomes(_plan(2), recorded)
    assert attempt.note.startswith("no restart: node 0 failed with ImportError")
    assert nodes[1].state is NodeState.LOST and "the link closed" in nodes[1].reason
    assert attempt.root_cause.node_rank == 0
    assert json.loads(json.dumps(attempt.to_dict()))["root_cause"]["node_rank"] == 0
