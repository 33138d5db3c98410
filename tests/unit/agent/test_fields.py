"""The one field checker (``agent/wire/fields.py``) and the tables that use it."""

from __future__ import annotations

import dataclasses
import math

import pytest

from orchestrator.agent.kept.spec import KeeperSpec
from orchestrator.agent.node.jobfile import JobSpec
from orchestrator.agent.node.spec import SpecError, SupervisorSpec
from orchestrator.agent.wire import fields
from orchestrator.agent.wire.fields import first_bad, keep_good, of_types

TABLE = {"name": fields.TEXT, "port": fields.PORT, "wait?": fields.seconds(positive=True)}


@pytest.mark.parametrize("data, bad", [
    ({"name": "a", "port": 80}, None),
    ({"name": "a", "port": 80, "wait": 0.5}, None),
    ({"port": 80}, "name"),                      # a required field absent
    ({"name": "a", "port": 65536}, "port"),      # one past the last port
    ({"name": "a", "port": True}, "port"),       # a bool is no number
    ({"name": "a", "port": 80, "wait": 0}, "wait"),  # present, so checked
    ({"name": "a", "port": 80, "wait": None}, "wait"),
    ({"name": 1, "port": -1}, "name"),           # the first bad one, in table order
])
def test_first_bad_names_the_first_field_missing_or_not_what_it_must_be(data, bad):
    found = first_bad(data, TABLE)
    assert (found[0] if found else None) == bad
    if found:
        assert found[1] is TABLE.get(bad) or found[1] is TABLE.get(bad + "?")


def test_of_types_takes_a_bool_only_where_bool_is_listed():
    assert of_types(int).check(3) and not of_types(int).check(True)
    assert of_types(bool).check(False) and of_types(int, bool).check(True)
    assert of_types(str, type(None)).check(None) and not of_types(str).check(None)


@pytest.mark.parametrize("value, ok", [(0, True), (1.5, True), (99999999999.0, True),
                                       (1e11, False), (-1, False), (math.inf, False),
                                       (math.nan, False), (True, False), ("1", False)])
def test_a_time_is_finite_not_negative_and_below_1e11(value, ok):
    assert fields.is_time(value) is ok


def test_keep_good_drops_each_bad_field_with_a_note_and_keeps_the_rest():
    notes: list[str] = []
    out = keep_good({"name": "a", "port": "80", "wait": 2, "other": [1]}, TABLE, "the record",
                    notes)
    assert out == {"name": "a", "wait": 2, "other": [1]}  # unknown fields are the reader's
    assert notes == ["ignored the record's 'port': '80'"]


def test_every_spec_table_declares_exactly_its_records_fields():
    from orchestrator.agent.kept import spec as kept_spec
    from orchestrator.agent.node import jobfile, spec as node_spec

    def names(table: dict) -> set[str]:
        return {name.rstrip("?") for name in table}

    assert names(node_spec._FIELDS) == {f.name for f in dataclasses.fields(SupervisorSpec)}
    assert {"supervisor", *names(kept_spec._FIELDS)} == {
        f.name for f in dataclasses.fields(KeeperSpec)}
    assert names(jobfile._FIELDS) == {f.name for f in dataclasses.fields(JobSpec)}


@pytest.mark.parametrize("change, words", [
    ({"node_rank": -1}, "'node_rank' is '-1': a rank (0 or more)"),
    ({"master_port": 70000}, "'master_port' is '70000': a port (0 to 65535)"),
    ({"heartbeat_s": 0}, "'heartbeat_s' is '0': seconds (more than 0) or null"),
    ({"grace_s": True}, "'grace_s' is 'True': seconds (0 or more)"),
    ({"argv": []}, "'argv' is '[]': a command (a non-empty list of strings)"),
])
def test_a_supervisor_spec_with_a_bad_field_is_refused_in_its_words(change, words):
    good = {"run_id": "r", "node_rank": 0, "run_dir": "/tmp/r", "argv": ["true"], "env": {}}
    SupervisorSpec.from_dict(good)  # the baseline loads
    with pytest.raises(SpecError) as caught:
        SupervisorSpec.from_dict({**good, **change})
    assert str(caught.value) == f"bad supervisor spec: {words}"
