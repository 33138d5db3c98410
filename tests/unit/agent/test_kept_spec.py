"""Unit tests of agent/kept/spec.py: a keeper's spec, typed and checked on arrival."""

from __future__ import annotations

import json

import pytest

from orchestrator.agent.kept import daemon
from orchestrator.agent.kept.spec import GangPort, KeeperSpec
from orchestrator.agent.node.spec import SpecError
from orchestrator.agent.wire.owner import Holder, Owner
from keepers import keeper_specs


def test_a_keeper_spec_survives_the_wire_and_says_its_fields_typed(tmp_path):
    sent = keeper_specs(tmp_path, 2)[1]
    spec = KeeperSpec.from_dict(json.loads(json.dumps(sent)))
    assert spec.node_rank == 1 and spec.nnodes == 2
    assert spec.owner == Owner(Holder.KEEPERS, detached=True)
    assert spec.gang == GangPort("127.0.0.1", 0, sent["gang"]["token"])
    assert spec.start_timeout_s == 20.0 and spec.hang_timeout_s is None
    assert KeeperSpec.from_dict(spec.to_dict()) == spec
    hung = KeeperSpec.from_dict({**sent, "hang_timeout_s": 10, "max_restarts": 2})
    assert (hung.hang_timeout_s, hung.max_restarts) == (10.0, 2)


@pytest.mark.parametrize("change, named", [
    ({"nnodes": 0}, "'nnodes'"), ({"nnodes": True}, "'nnodes'"),
    ({"rule": "detached"}, "unknown field(s) 'rule'"),
    ({"start_timeout_s": 0}, "'start_timeout_s'"),
    ({"max_restarts": -1}, "'max_restarts'"), ({"hang_timeout_s": "10"}, "'hang_timeout_s'"),
    ({"gang": {"addr": "h", "port": 70000, "token": "t"}}, "'gang'"),
    ({"gang": {"addr": "h", "port": 1}}, "'gang'"),
    ({"restarts": 1}, "unknown field(s) 'restarts'"),
    ({"supervisor": {"run_id": "r"}}, "bad supervisor spec: missing field(s)"),
])
def test_a_bad_keeper_spec_is_refused_naming_the_field(tmp_path, change, named):
    with pytest.raises(SpecError, match="^bad (keeper|supervisor) spec: ") as refused:
        KeeperSpec.from_dict({**keeper_specs(tmp_path, 2)[0], **change})
    assert named in str(refused.value)


def test_detach_refuses_a_bad_spec_before_anything_forks(tmp_path):
    """``serve``'s ``detach``: the reply says why, and no keeper (nor its run
    directory) comes to be."""
    spec = keeper_specs(tmp_path, 2)[0]
    reply = daemon.start({**spec, "nnodes": 0}, listen=True)
    assert reply["ok"] is False and reply["error"].startswith("bad keeper spec: 'nnodes'")
    assert not (tmp_path / "node-0").exists()


@pytest.mark.parametrize("owner, named", [
    ({"holder": "controller", "detached": False}, "the run's owner is controller, not the keepers"),
    ({"holder": "scheduler", "detached": True}, "the run's owner is scheduler, detached, not"),
    ({"holder": "keeper", "detached": True}, "'holder' is 'keeper'"),
    ({"holder": "keepers"}, "an owner is {holder, detached}"),
])
def test_a_keeper_runs_only_what_its_keepers_own(tmp_path, owner, named):
    """The owner travels in the supervisor spec as the dry-run decided it; a
    keeper spec whose run is someone else's is refused, never re-derived."""
    sent = keeper_specs(tmp_path, 2)[0]
    sent["supervisor"]["owner"] = owner
    with pytest.raises(SpecError) as refused:
        KeeperSpec.from_dict(sent)
    assert named in str(refused.value)
