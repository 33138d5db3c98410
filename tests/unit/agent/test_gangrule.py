"""The gang's one stop rule (``agent/gangrule.py``): each rule, its words,
and which wins when several hold at once."""

from __future__ import annotations

import pytest

from orchestrator.agent.gangrule import (Clock, NodeView, Stop, Timeouts, hang_words, judge,
                                         tick)

T = Timeouts(start_s=300.0, peer_s=30.0, hang_s=None)


def node(k: int, **kw) -> NodeView:
    kw.setdefault("joined", True)
    kw.setdefault("started", True)
    return NodeView(k, f"node {k} (h{k})", **kw)


def test_a_running_gang_goes_on():
    assert judge([node(0), node(1)], T, Clock(0.0), 10.0) is None


def test_the_first_failed_node_stops_all_and_is_named():
    v = judge([node(0), node(1, code=3), node(2, code=1)], T, Clock(0.0), 1.0)
    assert v.stop is Stop.FAILED and v.nodes == (1,)
    assert v.why == "node 1 (h1) failed (exit 3)"


def test_a_gang_that_has_ended_is_not_judged():
    assert judge([node(0, code=0), node(1, code=1)], T, Clock(0.0), 1.0) is None


def test_a_node_silent_past_the_peer_timeout_is_lost_and_named():
    v = judge([node(0, heard_s=1.0), node(1, heard_s=31.0)], T, Clock(0.0), 1.0)
    assert v.stop is Stop.LOST and v.nodes == (1,) and v.why == "node 1 (h1) silent for 30s"


def test_silence_is_no_loss_where_liveness_is_someone_elses():
    slurm = Timeouts(start_s=300.0, peer_s=None)
    assert judge([node(0, heard_s=999.0)], slurm, Clock(0.0), 1.0) is None
    assert judge([node(0, heard_s=None)], T, Clock(0.0), 1.0) is None


def test_a_lost_link_is_named_with_its_reason_and_an_ended_node_is_no_loss():
    v = judge([NodeView(0, "node 0"), NodeView(1, "node 1", lost="the link closed")],
              T, Clock(0.0), 1.0)
    assert v.stop is Stop.LOST and v.why == "lost node 1 (the link closed)"
    assert judge([NodeView(0, "node 0"), NodeView(1, "node 1", code=0, lost="closed")],
                 T, Clock(0.0), 1.0) is None


def test_loss_wins_over_failure_and_failure_over_the_start_timeout():
    nodes = [node(0, code=1, started=False), node(1, heard_s=40.0, started=False)]
    assert judge(nodes, T, Clock(0.0), 1000.0).stop is Stop.LOST
    nodes = [node(0, code=1), node(1, joined=False, started=False)]
    assert judge(nodes, T, Clock(0.0), 1000.0).stop is Stop.FAILED


def test_the_start_timeout_names_the_nodes_not_joined_else_not_started():
    nodes = [node(0, started=False), node(1, joined=False, started=False)]
    assert judge(nodes, T, Clock(0.0), 300.0) is None
    v = judge(nodes, T, Clock(0.0), 300.5)
    assert v.stop is Stop.START_TIMEOUT and v.nodes == (1,)
    assert v.why == "the rendezvous did not complete within 300s; not joined: node 1 (h1)"
    v = judge([node(0, started=False), node(1, started=False)], T, Clock(0.0), 301.0)
    assert v.nodes == (0, 1) and v.why.endswith("not joined: node 0 (h0), node 1 (h1)")


def test_the_keepers_words_for_an_attempts_start_timeout():
    t = Timeouts(start_s=5.0, attempt=1)
    v = judge([NodeView(0, "node 0", joined=True, started=True), NodeView(1, "node 1")], t,
              Clock(0.0), 6.0)
    assert v.why == "attempt 1 did not start within 5s on node 1 (a node of the gang is missing)"


def test_the_start_timeout_counts_only_once_every_setup_is_done():
    clock = Clock(0.0)
    setting_up = [node(0, started=False, setup_done=False), node(1, started=False)]
    clock = tick(clock, setting_up, 500.0)
    assert clock.start_from == 500.0
    ready = [node(0, started=False), node(1, started=False)]
    assert judge(ready, T, tick(clock, ready, 700.0), 700.0) is None
    assert judge(ready, T, tick(clock, ready, 801.0), 801.0).stop is Stop.START_TIMEOUT


def test_no_hang_before_every_node_has_started_nor_within_the_timeout():
    t = Timeouts(start_s=1e9, hang_s=10.0)
    nodes = [node(0), node(1, started=False)]
    clock = tick(Clock(0.0), nodes, 0.0)
    assert clock.all_started_at is None and judge(nodes, t, clock, 100.0) is None
    nodes = [node(0, progress=((0, 5.0),)), node(1, progress=((1, 8.0),))]
    clock = tick(Clock(0.0), nodes, 1.0)
    assert judge(nodes, t, clock, 18.0) is None


def test_a_hang_names_the_rank_that_went_quiet_first_and_counts_running_nodes_only():
    t = Timeouts(start_s=1e9, hang_s=10.0)
    nodes = [node(0, progress=((0, 5.0), (1, 6.0))), node(1, progress=((2, 2.0),)),
             node(2, code=0, progress=((3, 100.0),))]  # ended: not hung, not counted
    clock = tick(Clock(0.0), nodes, 1.0)
    v = judge(nodes, t, clock, 17.0)
    assert v.stop is Stop.HANG and v.nodes == (0, 1) and v.quiet_first == 2
    assert v.why == "hang: no progress for 11s; rank 2 went quiet first; no stacks could be dumped"


def test_failure_wins_over_a_hang_and_a_hang_over_the_start_timeout():
    t = Timeouts(start_s=1.0, hang_s=10.0)
    nodes = [node(0, code=1), node(1)]
    assert judge(nodes, t, tick(Clock(0.0), nodes, 0.0), 50.0).stop is Stop.FAILED
    nodes = [node(0), node(1)]
    assert judge(nodes, t, tick(Clock(0.0), nodes, 0.0), 50.0).stop is Stop.HANG


def test_the_stacks_name_the_odd_rank_and_its_node():
    t = Timeouts(start_s=1e9, hang_s=10.0)
    nodes = [node(0, progress=((0, 1.0), (1, 1.0))), node(1, progress=((2, 3.0),))]
    v = judge(nodes, t, tick(Clock(0.0), nodes, 0.0), 20.0)
    places = {0: "all_reduce <- t.py:8", 1: "all_reduce <- t.py:8", 2: "sleep (t.py:14)"}
    why, blamed = hang_words(v, places, {0: [0, 1], 1: [2]})
    assert why == ("hang: no progress for 17s; ranks 0-1 wait in all_reduce <- t.py:8; "
                   "rank 2 is elsewhere: sleep (t.py:14)")
    assert blamed == (1,)


def test_without_an_odd_group_the_quiet_rank_names_the_node_else_every_running_one():
    t = Timeouts(start_s=1e9, hang_s=10.0)
    nodes = [node(0, progress=((0, 1.0),)), node(1, progress=((1, 3.0),))]
    v = judge(nodes, t, tick(Clock(0.0), nodes, 0.0), 20.0)
    same = {0: "all_reduce (x.py:1)", 1: "all_reduce (x.py:1)"}
    assert hang_words(v, same, {0: [0], 1: [1]}) == (
        "hang: no progress for 17s; ranks 0-1 wait in all_reduce (x.py:1); "
        "rank 0 went quiet first", (0,))
    quiet = [node(0), node(1)]
    v = judge(quiet, t, tick(Clock(0.0), quiet, 0.0), 20.0)
    assert hang_words(v, None, {0: [0], 1: [1]})[1] == (0, 1)


def test_a_node_that_exited_0_and_then_stays_silent_is_not_lost():
    """Once a node's torchrun has exited 0 nothing more comes from it (its
    relay ended): its silence is no loss, however long the others run."""
    for heard in (31.0, 1000.0, 1e6):
        ended = [node(0, code=0, heard_s=heard), node(1, heard_s=1.0)]
        assert judge(ended, T, Clock(0.0), 5000.0) is None
    # a silent running node is still named, and alone
    v = judge([node(0, code=0, heard_s=1000.0), node(1, heard_s=31.0), node(2, heard_s=2.0)],
              T, Clock(0.0), 5000.0)
    assert (v.stop, v.nodes, v.why) == (Stop.LOST, (1,), "node 1 (h1) silent for 30s")
    # a node that failed and then went silent failed: it is not lost
    v = judge([node(0, code=1, heard_s=1000.0), node(1, heard_s=1.0)], T, Clock(0.0), 5000.0)
    assert (v.stop, v.nodes, v.why) == (Stop.FAILED, (0,), "node 0 (h0) failed (exit 1)")


def test_silence_is_a_loss_only_past_the_peer_timeout():
    assert judge([node(0, heard_s=30.0)], T, Clock(0.0), 1.0) is None
    assert judge([node(0, heard_s=30.01)], T, Clock(0.0), 1.0).stop is Stop.LOST


def first_hang(nodes_at, hang_s: float, until: float, step: float = 0.05) -> float:
    """Snapshot the gang every ``step`` seconds of a fake clock from 0, as a
    follower does; the time of the first hang verdict (``nodes_at(now)``:
    the snapshot then)."""
    t = Timeouts(start_s=1e9, peer_s=30.0, hang_s=hang_s)
    clock = Clock(0.0)
    for i in range(int(until / step) + 1):
        now = i * step
        nodes = nodes_at(now)
        clock = tick(clock, nodes, now)
        verdict = judge(nodes, t, clock, now)
        if verdict is not None:
            assert verdict.stop is Stop.HANG, verdict
            return now
    raise AssertionError(f"no hang verdict within {until}s")


def test_the_hang_verdict_comes_no_earlier_than_hang_s_and_within_a_second_after():
    # every node started at 2 s, no progress since: the hang counts from then
    def quiet(now):
        return [node(0, started=now >= 2.0), node(1, started=now >= 2.0)]

    for hang_s in (10.0, 30.0, 60.0):
        at = first_hang(quiet, hang_s, 200.0)
        assert 2.0 + hang_s <= at <= 2.0 + hang_s + 1.0, (hang_s, at)

    # progress until 7.5 s (rank 1's last), then none: the hang counts from 7.5 s
    def progressing(now):
        return [node(0, progress=((0, min(now, 5.0)),)), node(1, progress=((1, min(now, 7.5)),))]

    at = first_hang(progressing, 10.0, 100.0)
    assert 17.5 <= at <= 18.5, at


@pytest.mark.parametrize("phase", [
    dict(setup_done=False, joined=False, started=False),  # setup: runs, or waits for the others'
    dict(joined=False, started=False),  # torchrun started, not yet at the rendezvous
    dict(started=False),  # at the rendezvous, the others not yet
    dict(),  # workers started: loading data, initialising NCCL
    dict(progress=((1, 0.0),)),  # training
], ids=["setup", "start", "rendezvous", "workers-start", "training"])
def test_a_silent_node_is_lost_in_every_phase_of_a_run(phase):
    """Issue #32: the peer timeout holds whatever the node is doing, and
    wins over the start timeout and the hang rule of that phase."""
    timeouts = Timeouts(start_s=10.0, peer_s=30.0, hang_s=10.0)
    quiet = [node(0, heard_s=1.0, **phase), node(1, heard_s=30.0, **phase)]
    assert judge(quiet, Timeouts(start_s=1e9, peer_s=30.0), Clock(0.0), 5.0) is None
    silent = [node(0, heard_s=1.0, **phase), node(1, heard_s=30.5, **phase)]
    clock = Clock(0.0, all_started_at=0.0 if phase.get("started") else None)
    v = judge(silent, timeouts, clock, 60.0)
    assert v.stop is Stop.LOST and v.nodes == (1,) and v.why == "node 1 (h1) silent for 30s"


def test_a_stopped_nodes_reason_names_why_its_gang_stopped():
    """Each node the gang stops records why (issue #45: "stopped by the
    controller", "stopped by the gang: ..."); a reason that names its
    stopper already stays as it is."""
    from orchestrator.agent.gangrule import stop_reason

    assert stop_reason("node 1 (b) failed (exit 1)") == "stopped: node 1 (b) failed (exit 1)"
    assert stop_reason("stopped by Ctrl-C on the controller") == \
        "stopped by Ctrl-C on the controller"
