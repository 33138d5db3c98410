"""Who owns a run (``agent/wire/owner.py``): decided once, from the backend's
capabilities and the options, and what each layer reads off it. The oracle
is the table of rules in docs/long-runs.md ("Who keeps a run alive"),
written out here by hand."""

from __future__ import annotations

import json

import pytest

from orchestrator.agent.wire.owner import Holder, Owner, OwnerError
from orchestrator.backends import backend_class
from orchestrator.engine.options import LaunchOptions

C, K, S = Holder.CONTROLLER, Holder.KEEPERS, Holder.SCHEDULER


@pytest.mark.parametrize("scheduler, detach, restarts, owner", [
    (False, False, 0, Owner(C)),
    (False, False, 3, Owner(K)),  # restarts need keepers, attached
    (False, True, 0, Owner(K, detached=True)),
    (False, True, 3, Owner(K, detached=True)),
    (True, False, 0, Owner(S)),
    (True, True, 0, Owner(S, detached=True)),
])
def test_the_owner_is_decided_from_the_scheduler_and_the_options(scheduler, detach, restarts,
                                                                 owner):
    assert Owner.decide(scheduler=scheduler, detach=detach, max_restarts=restarts) == owner


@pytest.mark.parametrize("name, options, owner", [
    ("local", LaunchOptions(), Owner(C)),
    ("ssh", LaunchOptions(max_restarts=1), Owner(K)),
    ("ssh", LaunchOptions(detach=True), Owner(K, detached=True)),
    ("slurm", LaunchOptions(), Owner(S)),
    ("slurm", LaunchOptions(detach=True), Owner(S, detached=True)),
])
def test_each_backend_decides_through_the_one_function(name, options, owner):
    assert backend_class(name)(options).owner()[0] == owner


@pytest.mark.parametrize("owner, ends, silence", [
    (Owner(C), True, True),
    (Owner(K), True, False),
    (Owner(K, detached=True), False, False),
    (Owner(S), False, False),
    (Owner(S, detached=True), False, False),
])
def test_what_each_owner_means(owner, ends, silence):
    """Whether the run stops with its controller, and whether a node's
    silence is a loss."""
    assert (owner.ends_with_controller, owner.pings) == (ends, silence)


def test_an_owner_crosses_the_wire_unchanged_and_a_bad_one_is_named():
    for holder in Holder:
        for detached in (False, True):
            if holder is C and detached:
                continue
            owner = Owner(holder, detached)
            assert Owner.from_json(json.loads(json.dumps(owner.to_json()))) == owner
    for bad, named in [({"holder": "keeper", "detached": True}, "'holder' is 'keeper'"),
                       ({"holder": "keepers", "detached": "yes"}, "'detached' is 'yes'"),
                       ({"holder": "keepers"}, "{holder, detached}"),
                       ("keepers", "{holder, detached}"),
                       ({"holder": "controller", "detached": True}, "cannot be detached")]:
        with pytest.raises(OwnerError, match=named.replace("{", r"\{").replace("}", r"\}")):
            Owner.from_json(bad)
