"""``orchestrator.engine.fanout``: one function on every node at once, every
node's value or error kept, a deadline for the group. Fast: plain functions
on threads, no node, no process."""

from __future__ import annotations

import threading

import pytest

from orchestrator.engine.fanout import GroupResult, on_all
from orchestrator.errors import LaunchError, TransportError


def test_every_node_runs_at_the_same_time():
    # Each call waits until all of them have started: one at a time never gets there.
    everyone = threading.Barrier(4, timeout=10)

    def fn(k: int) -> int:
        everyone.wait()
        return k * 10

    group = on_all(fn, range(4), timeout_s=30)
    assert group.ok and group.succeeded == {0: 0, 1: 10, 2: 20, 3: 30}


def test_each_node_keeps_its_own_value_in_the_order_given():
    group = on_all(lambda host: host.upper(), ["c", "a", "b"])
    assert group.succeeded == {"c": "C", "a": "A", "b": "B"}
    assert list(group.succeeded) == ["c", "a", "b"]
    assert group.ok and group.failed == {}


def test_no_nodes_is_an_empty_success():
    group = on_all(lambda k: k, [])
    assert group.ok and group.succeeded == {} and group.values("nothing") == {}


def test_a_failing_node_is_kept_with_its_error_and_does_not_hide_the_others():
    unreachable = TransportError("node1", "connection refused", "is sshd running there?")

    def fn(k: int) -> str:
        if k == 1:
            raise unreachable
        if k == 3:
            raise OSError("disk full")
        return f"ok{k}"

    group = on_all(fn, range(4))
    assert not group.ok
    assert group.succeeded == {0: "ok0", 2: "ok2"}
    assert group.failed[1] is unreachable
    assert isinstance(group.failed[3], OSError) and set(group.failed) == {1, 3}


def test_a_bug_is_raised_on_the_callers_thread_not_kept_as_a_node_failure():
    def fn(k: int) -> int:
        if k == 2:
            raise KeyError("a bug, not a node")
        return k

    with pytest.raises(KeyError, match="a bug, not a node"):
        on_all(fn, range(3))


def test_a_node_still_busy_at_the_deadline_times_out_and_the_others_keep_their_values():
    release = threading.Event()

    def fn(k: str) -> str:
        if k == "slow":
            release.wait(30)
            return "late"
        return "fast"

    try:
        group = on_all(fn, ["a", "slow", "b"], timeout_s=0.3)
    finally:
        release.set()
    assert group.succeeded == {"a": "fast", "b": "fast"}
    assert list(group.failed) == ["slow"]
    assert isinstance(group.failed["slow"], TimeoutError)
    assert str(group.failed["slow"]) == "no answer within 0.3s"


def test_a_value_arriving_after_the_deadline_does_not_change_the_result():
    release, finished = threading.Event(), threading.Event()

    def fn(k: int) -> int:
        if k == 1:
            release.wait(30)
            finished.set()
        return k

    group = on_all(fn, [0, 1], timeout_s=0.2)
    release.set()
    assert finished.wait(10)
    assert group.succeeded == {0: 0} and list(group.failed) == [1]


def test_values_returns_every_value_when_all_succeeded():
    assert on_all(lambda k: k + 1, [1, 2]).values("probe") == {1: 2, 2: 3}


def test_values_names_every_failed_node_with_its_error_text():
    group = GroupResult(succeeded={"n0": 1}, failed={
        "n2": TransportError("n2", "connection refused", "is sshd running there?"),
        "n1": TimeoutError("no answer within 5s"),
        "n3": LaunchError(""),
        "n4": TransportError("n4", "host key changed"),
    })
    with pytest.raises(LaunchError) as raised:
        group.values("starting the agents", label=lambda key: f"node {key[1:]} ({key})")
    assert str(raised.value) == (
        "starting the agents failed:\n"
        "  node 1 (n1): no answer within 5s\n"
        # a TransportError's own message and hint: the label already names the host
        "  node 2 (n2): connection refused (is sshd running there?)\n"
        "  node 3 (n3): LaunchError\n"  # an error without text: its type
        "  node 4 (n4): host key changed")
