"""A node's outcome is made in one function, from its phase, what was asked
and its facts; its reason is typed and its words are rendered from it."""

from __future__ import annotations

import ast
import json
import os

import pytest

from conftest import ROOT
from orchestrator.agent.wire.protocol import Ended
from orchestrator.engine.nodestate import (DECISIVE, FINDINGS, LOST, STATE_OF, WORDS, Ask,
                                           NodeFacts, NodePhase, NodePlace, node_outcome)
from orchestrator.records.outcome import EndReason, NodeOutcome, NodeState, WorkerFailure

NODE = NodePlace(1, "h1", first_rank=4)
FAILURE = {"local_rank": 1, "message": "ValueError: bad batch", "timestamp": 100.0,
           "error_file": None}


def outcome(facts: NodeFacts, phase=NodePhase.STARTED, asked=Ask.NOTHING) -> NodeOutcome:
    return node_outcome(NODE, facts, phase, asked)


def test_every_reason_has_a_state_and_words_of_its_own_or_given():
    assert set(STATE_OF) == set(EndReason)
    given = {EndReason.FAILED, EndReason.HUNG, EndReason.NO_ANSWER, EndReason.NOT_RUN,
             EndReason.PAUSED, EndReason.AGENT_DIED, EndReason.KEEPER_UNHEARD,
             EndReason.SCHEDULER_ENDED, EndReason.SCHEDULER_STOPPED, EndReason.RUNNING}
    assert set(WORDS) == set(EndReason) - given


@pytest.mark.parametrize("name", ["ps", "status"])
def test_the_json_schemas_list_every_reason(name):
    with open(os.path.join(ROOT, "schema", f"{name}.schema.json"), encoding="utf-8") as fh:
        node = json.load(fh)["$defs"]["node"]["properties"]
    assert node["why"]["enum"] == [r.value for r in EndReason] + [None]


def test_what_the_node_said_decides_unless_the_controller_found_more():
    ok = outcome(NodeFacts({"code": 0}))
    assert (ok.state, ok.why, ok.reason) == (NodeState.SUCCEEDED, EndReason.EXITED, "exited 0")
    failed = outcome(NodeFacts({"code": 1, "failures": [FAILURE], "ended": Ended.ITSELF}))
    assert (failed.state, failed.why) == (NodeState.FAILED, EndReason.FAILED)
    assert failed.reason == "torchrun exited 1; rank 5 (local rank 1) failed: ValueError: bad batch"
    assert failed.failures == (WorkerFailure(1, "ValueError: bad batch", 100.0),)
    # asked to stop, it stopped: its own words; but a failure of its own stays one
    stopped = outcome(NodeFacts({"code": 143, "reason": "stopped: node 0 failed"}),
                      asked=Ask.STOP)
    assert (stopped.why, stopped.reason) == (EndReason.STOPPED, "stopped: node 0 failed")
    assert outcome(NodeFacts({"code": 1, "ended": Ended.ITSELF}), asked=Ask.STOP).why \
        is EndReason.FAILED
    # a scheduler's signal is a stop nobody here asked for
    assert outcome(NodeFacts({"code": 143, "ended": Ended.SIGNAL})).why is EndReason.STOPPED


def test_a_node_that_said_nothing_is_lost_by_what_is_known():
    assert outcome(NodeFacts(code=None)).why is EndReason.GIVEN_UP
    assert outcome(NodeFacts(code=LOST)).why is EndReason.CONNECTION_LOST
    died = outcome(NodeFacts(code=-9))
    assert (died.state, died.why) == (NodeState.LOST, EndReason.AGENT_DIED)
    assert "killed by signal 9" in died.reason
    never = outcome(NodeFacts(), phase=NodePhase.NEW)
    assert (never.state, never.why, never.reason) == (
        NodeState.NOT_STARTED, EndReason.NEVER_STARTED, "never started")


def test_findings_keep_the_strongest_and_the_weak_ones_yield_to_an_exit_0():
    facts = NodeFacts(code=LOST)
    facts.find(EndReason.CUT_OFF)
    facts.find(EndReason.SILENT)  # stronger: replaces the cut
    facts.find(EndReason.CUT_OFF)  # weaker: the silence stays
    assert outcome(facts).why is EndReason.SILENT
    facts.find(EndReason.HUNG, "rank 5 hung in all_reduce")
    assert (outcome(facts).why, outcome(facts).reason) == (EndReason.HUNG,
                                                          "rank 5 hung in all_reduce")
    assert FINDINGS[0] is EndReason.HUNG and not set(FINDINGS[2:]) & DECISIVE
    late = NodeFacts({"code": 0})
    late.find(EndReason.START_TIMEOUT)
    assert outcome(late).why is EndReason.EXITED  # it did join after all, and succeeded
    late.event = {"code": 1}
    assert outcome(late).why is EndReason.START_TIMEOUT


def test_a_pause_explains_only_the_nodes_that_stopped_for_it():
    words = "stopped its run after 30s without hearing from ddp-orch, which was paused"
    for event, why in (({"code": 143, "ended": Ended.CONTROLLER_LOST}, EndReason.PAUSED),
                       ({"code": 1, "ended": Ended.ITSELF}, EndReason.FAILED),
                       ({"code": 0}, EndReason.EXITED), (None, EndReason.PAUSED)):
        facts = NodeFacts(event, code=None if event else LOST)
        facts.find(EndReason.PAUSED, words)
        assert outcome(facts).why is why, event
    silent = NodeFacts(code=LOST)
    silent.find(EndReason.SILENT)
    silent.find(EndReason.PAUSED, words)
    assert outcome(silent).why is EndReason.SILENT


def test_survivors_are_said_whatever_the_end():
    event = {"code": 1, "survivors": [{"pid": 12, "cmd": "python x.py"}]}
    assert outcome(NodeFacts(event)).reason.endswith(
        "; 1 process(es) survived the teardown: pid 12 (python x.py)")


def test_an_outcome_is_made_in_one_place():
    """The five builders went; a sixth would bring back words beside the reason."""
    made = []
    for where, _dirs, files in os.walk(os.path.join(ROOT, "orchestrator")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(where, name)
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
            made += [os.path.relpath(path, ROOT) for node in ast.walk(tree)
                     if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "NodeOutcome"]
    assert sorted(set(made)) == ["orchestrator/engine/nodestate.py"]


def test_a_kept_runs_node_left_running_is_not_started_until_supervised():
    """``ps`` of a run the controller left: a node it never reached has not
    started, one it follows is running (a stop is not asked of it)."""
    facts = NodeFacts(found=EndReason.RUNNING, words="running (attempt 0, starting)")
    never = outcome(facts, phase=NodePhase.NEW)
    assert (never.state, never.why, never.reason) == (
        NodeState.NOT_STARTED, EndReason.RUNNING, "running (attempt 0, starting)")
    for phase in (NodePhase.SUPERVISED, NodePhase.GO, NodePhase.STARTED):
        assert outcome(facts, phase=phase).state is NodeState.STOPPED
