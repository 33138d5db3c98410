"""``records/outcome.py`` value by value (expected values written by hand):
the words of each state, the records' round trip, and the root-cause order."""

from __future__ import annotations

import pytest

from orchestrator.engine.nodestate import STATE_OF
from orchestrator.records.outcome import (AttemptOutcome, EndReason, NodeOutcome, NodeState,
                                          RunState, WorkerFailure, gang_outcome, is_cascade)


def fail(at: float, message: str = "m") -> WorkerFailure:
    return WorkerFailure(0, message, at)


def node(rank: int, state: NodeState = NodeState.FAILED, *, ended=None, failures=(), code=1):
    return NodeOutcome(node_rank=rank, host=f"h{rank}", state=state, exit_code=code, reason="r",
                       ended_at=ended, failures=tuple(failures),
                       why=next(w for w, s in STATE_OF.items() if s is state))


def test_the_state_words():
    assert [str(s) for s in RunState] == ["starting", "pending", "running", "succeeded", "failed",
                                          "interrupted", "damaged"]
    assert [s for s in RunState if s.live] == [RunState.STARTING, RunState.PENDING,
                                               RunState.RUNNING]
    assert [str(s) for s in NodeState] == ["succeeded", "failed", "stopped", "lost", "not-started"]
    assert [s for s in NodeState if s.failed] == [NodeState.FAILED, NodeState.LOST]


def test_the_first_failure_is_the_earliest_stamped_one_else_the_end():
    assert node(0, ended=50.0, failures=[fail(30.0), fail(20.0), fail(0.0)]
                ).first_failure_ts == 20.0
    assert node(0, ended=50.0, failures=[fail(0.0)]).first_failure_ts == 50.0
    assert node(0, ended=None).first_failure_ts is None


def test_a_node_outcome_round_trips_through_its_dict():
    outcome = node(2, NodeState.LOST, ended=7.5, failures=[fail(1.0, "m")], code=None)
    data = outcome.to_dict()
    assert data == {"node_rank": 2, "host": "h2", "state": "lost", "exit_code": None, "reason": "r",
                    "ended_at": 7.5, "failures": [{"local_rank": 0, "message": "m", "timestamp": 1.0,
                                                  "error_file": None}],
                    "why": "silent"}
    assert NodeOutcome.from_dict(data) == outcome
    assert NodeOutcome.from_dict({"node_rank": "1", "host": "h", "state": "stopped",
                                  "why": "stopped"}) == NodeOutcome(
        1, "h", NodeState.STOPPED, None, "", None, (), why=EndReason.STOPPED)


def test_an_attempt_round_trips_through_its_dict():
    attempt = AttemptOutcome(2, 29501, RunState.FAILED, node(1, ended=3.0), "restarting")
    data = attempt.to_dict()
    assert data["attempt"] == 2 and data["master_port"] == 29501 and data["state"] == "failed"
    assert data["note"] == "restarting" and data["root_cause"]["node_rank"] == 1
    assert AttemptOutcome.from_dict(data) == attempt
    bare = AttemptOutcome.from_dict({"attempt": "1", "master_port": "5", "state": "succeeded"})
    assert bare == AttemptOutcome(1, 5, RunState.SUCCEEDED, None, "")
    assert bare.to_dict()["root_cause"] is None


@pytest.mark.parametrize("messages,expected", [
    ([], False),
    (["Connection closed by peer"], True),
    (["broken PIPE", "NCCL communicator was aborted"], True),
    (["Connection reset by peer", "CUDA out of memory"], False),
    (["Signal 15 (SIGTERM) received"], True),
    (["Signal 15 SIGTERM"], False),
    (["SystemExit: 143"], True),  # the program's own SIGTERM handler: sys.exit(128 + 15)
    (["SystemExit: 143 (train.py:66)"], True),  # as collected: the place appended
    (["SystemExit: 1430"], False),
    (["SystemExit: 1"], False),
])
def test_a_cascade_is_every_failure_a_peer_loss(messages, expected):
    assert is_cascade(node(0, failures=[fail(1.0, m) for m in messages])) is expected


def test_the_root_cause_is_the_original_failure_then_the_earliest_then_the_lowest_rank():
    cascade = node(0, ended=1.0, failures=[fail(1.0, "Broken pipe")])
    original = node(1, ended=9.0, failures=[fail(5.0, "boom")])
    assert gang_outcome("r", (cascade, original), 3.0, interrupted=False).root_cause == original
    early, late = node(3, ended=2.0), node(1, ended=4.0)
    assert gang_outcome("r", (late, early), 3.0, interrupted=False).root_cause == early
    a, b = node(2, ended=None), node(1, ended=None)
    assert gang_outcome("r", (a, b), 3.0, interrupted=False).root_cause == b
    timed, untimed = node(2, ended=5.0), node(1, ended=None)
    assert gang_outcome("r", (untimed, timed), 3.0, interrupted=False).root_cause == timed


def test_a_lost_node_is_the_cause_of_a_rank_the_schedulers_teardown_stopped():
    """Slurm's step teardown (a node's agent SIGKILLed, --kill-on-bad-exit)
    SIGTERMs node 0's rank, whose program exits 143, before node 0's agent
    hears of the stop: the lost node came first (a loaded CI, once)."""
    stopped = node(0, ended=5.0, failures=[fail(4.0, "SystemExit: 143 (faultable.py:66)")])
    lost = node(1, NodeState.LOST, ended=None, code=None)
    assert gang_outcome("r", (stopped, lost), 3.0, interrupted=False).root_cause == lost


def test_the_run_state_from_the_nodes():
    ok = node(0, NodeState.SUCCEEDED, code=0)
    won = gang_outcome("r", (ok, node(1, NodeState.SUCCEEDED, code=0)), 2.5, interrupted=False)
    assert (won.state, won.root_cause, won.ok, won.wall_s, won.run_id, won.result) == (
        RunState.SUCCEEDED, None, True, 2.5, "r", None)
    stopped = gang_outcome("r", (ok, node(1, NodeState.STOPPED)), 1.0, interrupted=False)
    assert (stopped.state, stopped.root_cause, stopped.ok) == (RunState.FAILED, None, False)
    assert gang_outcome("r", (ok, node(1)), 1.0, interrupted=True).state is RunState.INTERRUPTED
    assert gang_outcome("r", (ok, node(1, NodeState.LOST)), 1.0, interrupted=False).state is RunState.FAILED
