"""``agent/gangrule.py``'s verdicts field by field (expected values by hand)."""

from __future__ import annotations

from orchestrator.agent.gangrule import Clock, NodeView, Stop, Timeouts, hang_words, judge, tick


def node(k: int, **kw) -> NodeView:
    kw.setdefault("joined", True)
    kw.setdefault("started", True)
    return NodeView(k, f"node {k}", **kw)


def test_a_lost_link_blames_that_node():
    v = judge([node(0), node(1, lost="link closed")], Timeouts(start_s=1e9), Clock(0.0), 1.0)
    assert (v.stop, v.why, v.nodes) == (Stop.LOST, "lost node 1 (link closed)", (1,))


def test_every_silent_node_is_named_and_blamed():
    nodes = [node(0, heard_s=31.0), node(1, heard_s=5.0), node(2, heard_s=40.0)]
    v = judge(nodes, Timeouts(start_s=1e9, peer_s=30.0), Clock(0.0), 1.0)
    assert (v.stop, v.why, v.nodes) == (Stop.LOST, "node 0, node 2 silent for 30s", (0, 2))


def test_a_hang_s_odd_rank_on_a_node_with_no_ranks_listed_blames_the_others():
    t = Timeouts(start_s=1e9, hang_s=10.0)
    nodes = [node(0, progress=((0, 1.0),)), node(1, progress=((1, 3.0),))]
    v = judge(nodes, t, tick(Clock(0.0), nodes, 0.0), 20.0)
    places = {0: "all_reduce (x.py:1)", 1: "all_reduce (x.py:1)", 2: "sleep (x.py:9)"}
    # rank 2 is odd; no node is listed with it, node 1 is not listed at all
    assert hang_words(v, places, {0: [0]})[1] == (0, 1)
    assert hang_words(v, places, {0: [0], 1: [2]})[1] == (1,)
