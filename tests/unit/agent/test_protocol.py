"""Unit tests of agent/wire/protocol.py: malformed exit events."""

from __future__ import annotations

import math

import pytest

from orchestrator.agent.wire.protocol import ProtocolError, validate
from noderecords import GOOD_PART


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
