"""The supervisor's spec (``orchestrator.agent.node.spec``): typed, the
run's ``owner`` instead of three flags, checked when it arrives, and the
one exit event (``protocol.exit_event``) every sender builds."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from orchestrator.agent.node.spec import SpecError, SupervisorSpec
from orchestrator.agent.wire.owner import Holder, Owner
from orchestrator.agent.wire.protocol import (CONTROL_PREFIX, Control, Ended, ProtocolError,
                                              decode, encode,
                                              exit_event, request)
from orchestrator.config.loader import load_cluster_text
from orchestrator.engine.nodespec import supervisor_spec
from orchestrator.plan.build import build_plan
from orchestrator.plan.dryrun import NodeLaunch
from orchestrator.plan.torchrun import torchrun_argv

GOOD = {"run_id": "r1", "node_rank": 1, "run_dir": "/r/node-1", "argv": ["torchrun", "x.py"],
        "env": {"A": "1"}}


def _launch() -> NodeLaunch:
    spec = load_cluster_text("nodes: [{host: a, procs: 1}, {host: b, procs: 2}]\n"
                             "workload: {name: linear}\nenv: {TOKEN: s3cret}\n", source="c.yaml")
    plan = build_plan(spec, run_id="r1", local_run_dir="/x")
    node = plan.nodes[1]
    return NodeLaunch(node=node, where="x", env=node.env, unset_env=node.unset_env,
                      argv=torchrun_argv(plan, node))


def test_the_controllers_spec_crosses_the_wire_and_back_unchanged():
    spec = supervisor_spec(_launch(), "r1", 29500, 5.0)
    assert spec.owner == Owner(Holder.CONTROLLER) and spec.owner.pings
    wire = json.loads(json.dumps(spec.to_dict()))
    assert wire["owner"] == {"holder": "controller", "detached": False}
    assert SupervisorSpec.from_dict(wire) == spec
    kept = supervisor_spec(_launch(), "r1", 29500, 5.0, Owner(Holder.KEEPERS, detached=True))
    assert json.loads(json.dumps(kept.to_dict()))["owner"] == {"holder": "keepers",
                                                                "detached": True}
    assert SupervisorSpec.from_dict(kept.to_dict()) == kept


@pytest.mark.parametrize("owner, pings, keepers", [
    (Owner(Holder.CONTROLLER), True, False),
    (Owner(Holder.KEEPERS), False, True),
    (Owner(Holder.KEEPERS, detached=True), False, True),
    (Owner(Holder.SCHEDULER), False, False),
    (Owner(Holder.SCHEDULER, detached=True), False, False),
])
def test_the_owner_alone_decides_stdin_signals_and_the_peer_timeout(owner, pings, keepers):
    """The spec carries the owner and nothing derived from it: stdin and the
    peer timeout are the controller's pings, the signals a keeper's."""
    spec = dataclasses.replace(SupervisorSpec.from_dict(GOOD), owner=owner)
    assert (spec.owner.pings, spec.owner.keepers_hold) == (pings, keepers)
    assert not {"watches_stdin", "owns_signals", "peer_timeout_s"} & set(dir(spec))


@pytest.mark.parametrize("change, named", [
    ({"argv": "torchrun x.py"}, "'argv'"),
    ({"argv": []}, "'argv'"),
    ({"node_rank": "1"}, "'node_rank'"),
    ({"env": {"A": 1}}, "'env'"),
    ({"master_port": 70000}, "'master_port'"),
    ({"grace_s": True}, "'grace_s'"),
    ({"owner": "controller"}, "'owner'"),
    ({"owner": {"holder": "nobody", "detached": False}}, "'owner': 'holder' is 'nobody'"),
    ({"owner": {"holder": "controller", "detached": True}}, "'owner': a run the controller"),
    ({"liveness": "controller"}, "unknown field(s) 'liveness'"),  # the word before owners
    ({"setup": {"commands": "make"}}, "'setup'"),
    ({"watch_stdin": False}, "unknown field(s) 'watch_stdin'"),  # the old flags are gone
    ({"run_dir": None}, "'run_dir'"),
])
def test_a_bad_spec_is_a_spec_error_that_names_the_field(change, named):
    with pytest.raises(SpecError, match="^bad supervisor spec: ") as caught:
        SupervisorSpec.from_dict({**GOOD, **change})
    assert named in str(caught.value)


def test_a_spec_without_a_required_field_or_not_an_object_is_refused():
    with pytest.raises(SpecError, match="missing field.*'argv'"):
        SupervisorSpec.from_dict({k: v for k, v in GOOD.items() if k != "argv"})
    with pytest.raises(SpecError, match="not an object"):
        SupervisorSpec.from_dict(["not", "a", "spec"])


def test_an_agent_given_a_bad_spec_ends_the_run_with_an_exit_event_that_says_why():
    """Not a traceback and a dead agent: the controller reads the reason as
    the node's failure, and the channel is the agent's again after ``done``."""
    lines = request("supervise", spec={**GOOD, "argv": 7}) + Control.DONE.encode()
    ran = subprocess.run([sys.executable, "-m", "orchestrator.agent", "serve"], input=lines,
                         capture_output=True, cwd=ROOT, timeout=60)
    events = [decode(line) for line in ran.stdout.splitlines(keepends=True)
              if line.startswith(CONTROL_PREFIX)]
    assert [e["event"] for e in events] == ["hello", "exit"]
    assert events[1]["code"] == 1 and events[1]["reason"].startswith("bad supervisor spec: 'argv'")
    assert events[1]["last_lines"] == [f"ddp-orch: {events[1]['reason']}"]
    assert ran.returncode == 1 and b"Traceback" not in ran.stderr


def test_the_one_exit_event_is_a_valid_protocol_message():
    event = exit_event(3, "torchrun exited", Ended.ITSELF, duration_s=1.5, last_lines=["boom"],
                       failures=[{"local_rank": 0, "message": "x", "timestamp": 5.0,
                                  "error_file": None}],
                       survivors=[{"pid": 12, "cmd": "python x.py"}], setup_failed=False)
    assert decode(encode(event)) == event
    assert exit_event(0, "torchrun exited", Ended.ITSELF, duration_s=0)["stopped_at"] is None
    with pytest.raises(ProtocolError, match="exit message: bad or missing 'ended'"):
        decode(encode({**event, "ended": "torchrun exited"}))  # a cause is a word of Ended
