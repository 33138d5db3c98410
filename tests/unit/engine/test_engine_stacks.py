"""Unit tests of engine/stacks.py: reading py-spy and faulthandler dumps, grouping ranks."""

from __future__ import annotations

from orchestrator.engine.stacks import RankStack, StacksResult
from orchestrator.engine.stacks import groups, main_thread, odd_ranks, rank_span, render_stacks


SITE = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


WAITING = f'''Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1000 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "{SITE}", line 3913 in all_reduce
  File "/run/node-0/script/train.py", line 7 in wait_for_peers
  File "/run/node-0/script/train.py", line 42 in <module>
  File "/run/node-0/code/ddp_orch_shim.py", line 105 in _run_script
'''


SLEEPING = '''Current thread 0x00007f0000000003 (most recent call first):
  File "/run/node-1/script/train.py", line 17 in <module>
  File "/run/node-1/code/ddp_orch_shim.py", line 105 in _run_script
'''


PY_SPY = '''Process 123: python -m ddp_orch_shim train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 123 (idle): "MainThread"
    <module> (train.py:17)
    _run_script (ddp_orch_shim.py:105)
'''


PY_SPY_WAITING = '''Thread 124 (active): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2050)
    wait_for_peers (/run/node-0/script/train.py:7)
    <module> (/run/node-0/script/train.py:42)
'''


def stack(rank, node, text, how="faulthandler"):
    return RankStack(rank, node, f"lab{node}", how, text)


def test_ranks_are_grouped_by_where_their_main_thread_is_and_the_odd_one_is_named():
    result = StacksResult((stack(0, 0, WAITING), stack(1, 0, WAITING), stack(2, 1, SLEEPING)))
    found = groups(result)
    assert [(place, [s.rank for s in members]) for place, members in found] == [
        ("all_reduce <- train.py:7", [0, 1]), ("<module> (train.py:17)", [2])]
    assert [s.rank for s in odd_ranks(result)] == [2]
    text = render_stacks(result, "r1")
    assert "  ranks 0-1 (lab0): all_reduce <- train.py:7" in text
    assert "! rank 2 (lab1): <module> (train.py:17)" in text
    assert "wait_for_peers (train.py:7)" in text


def test_two_ranks_in_two_places_have_no_majority_to_differ_from():
    from orchestrator.engine.stacks import hang_summary

    result = StacksResult((stack(0, 0, WAITING), stack(1, 1, SLEEPING)))
    assert odd_ranks(result) == []
    assert "!" not in render_stacks(result, "r")
    why = hang_summary(result, 12.0, quiet_first=1)
    assert why == ("hang: no progress for 12s; rank 0 waits in all_reduce <- train.py:7; "
                   "rank 1 waits in <module> (train.py:17); rank 1 went quiet first")


def test_py_spy_dumps_are_read_too():
    frames = main_thread(stack(2, 1, PY_SPY, how="py-spy"))
    assert [f.function for f in frames] == ["<module>", "_run_script"]
    result = StacksResult((stack(0, 0, PY_SPY_WAITING, how="py-spy"),
                           stack(1, 0, WAITING), stack(2, 1, PY_SPY, how="py-spy")))
    text = render_stacks(result, "r")
    assert "ranks 0-1 (lab0): all_reduce <- train.py:7" in text  # both tools agree
    assert "! rank 2 (lab1): <module> (train.py:17)" in text


def test_rank_spans_read_like_a_person_writes_them():
    assert rank_span([3]) == "rank 3"
    assert rank_span([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"


def test_a_dump_that_lacks_what_was_asked_says_so_beside_its_place():
    """py-spy read rank 0's Python frames without the C ones, and rank 1
    only faulthandler could: each rank's note is printed under the groups,
    and the ranks still group by where they stand."""
    result = StacksResult((
        RankStack(0, 0, "lab0", "py-spy", PY_SPY_WAITING,
                  "no C/C++ frames: py-spy --native failed: Error: Failed to merge"),
        RankStack(1, 0, "lab0", "faulthandler", WAITING,
                  "py-spy could not read it: Error: Permission denied (os error 13)")))
    lines = render_stacks(result, "r").splitlines()
    assert "  ranks 0-1 (lab0): all_reduce <- train.py:7" in lines
    assert lines[-2:] == [
        "  rank 0 (lab0): no C/C++ frames: py-spy --native failed: Error: Failed to merge",
        "  rank 1 (lab0): py-spy could not read it: Error: Permission denied (os error 13)"]
