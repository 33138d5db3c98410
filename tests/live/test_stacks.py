"""`ddp-orch stacks`: the grouping (unit) and live runs on this machine."""

from __future__ import annotations

import json
import os
import pytest

from conftest import local_job, run_cli, start_cli, wait_for_lines
from orchestrator.engine.stacks import RankStack, StacksResult
from orchestrator.engine.stacks import groups, main_thread, odd_ranks, rank_span, render_stacks
from procscan import wait_gone

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


def start_hang(tmp_path, run_id: str):
    """``up`` of a 3-rank local run whose rank 2 hangs away from the others,
    returned once every rank trains."""
    cluster = local_job(tmp_path, "hang", "hang_rank2.py",
                        "[{host: localhost, procs: 2}, {host: localhost, procs: 1}]")
    proc = start_cli("up", cluster, "--run-id", run_id, "--runs-dir", str(tmp_path / "runs"),
                     "--grace", "3")
    try:
        wait_for_lines(proc, "training", 3)
    except BaseException:
        proc.send_signal(2)  # Ctrl-C: the run tears itself down, as the tests' finally does
        proc.communicate(timeout=60)
        raise
    return proc


@pytest.mark.live
def test_stacks_of_a_real_hang_name_the_rank_that_went_elsewhere(tmp_path):
    runs = str(tmp_path / "runs")
    proc = start_hang(tmp_path, "hang")
    try:
        result = run_cli("stacks", "hang", "--runs-dir", runs, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "ranks 0-1 (localhost): all_reduce <- hang_rank2.py:" in result.stdout
        assert "! rank 2 (localhost): <module> (hang_rank2.py:" in result.stdout
        raw = json.loads(run_cli("stacks", "hang", "--json", "--runs-dir", runs).stdout)
        assert sorted(r["rank"] for r in raw["ranks"]) == [0, 1, 2]
        assert all("hang_rank2.py" in r["text"] for r in raw["ranks"])
        kept = os.listdir(os.path.join(runs, "hang", "stacks"))
        assert len(kept) >= 1
        assert sorted(os.listdir(os.path.join(runs, "hang", "stacks", kept[0]))) == [
            "rank-0.txt", "rank-1.txt", "rank-2.txt", "summary.txt"]
    finally:
        proc.send_signal(2)
        proc.communicate(timeout=60)
    assert wait_gone("hang", 15) == set()
    done = run_cli("stacks", "hang", "--runs-dir", runs)
    assert done.returncode == 2 and "no rank is running" in done.stderr


@pytest.mark.live
def test_stacks_native_reads_every_rank_with_py_spy_and_its_c_frames(tmp_path):
    """py-spy on the PATH (it comes with the test tools: pyproject's `test`
    extra) dumps every rank; `--native` adds the C/C++ frames gloo waits in."""
    import shutil
    import sys

    bin_dir = os.path.dirname(sys.executable)
    if shutil.which("py-spy", path=bin_dir) is None:
        message = f"no py-spy in {bin_dir}: scripts/bootstrap --test installs it"
        if os.environ.get("CI", "").lower() == "true":  # CI never skips it silently
            pytest.fail(message)
        pytest.skip(message)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    runs = str(tmp_path / "runs")
    proc = start_hang(tmp_path, "spy")
    try:
        native = run_cli("stacks", "spy", "--native", "--json", "--runs-dir", runs, env=env,
                         timeout=60)
        assert native.returncode == 0, native.stdout + native.stderr
        ranks = {r["rank"]: r for r in json.loads(native.stdout)["ranks"]}
        assert {rank: r["how"] for rank, r in ranks.items()} == {0: "py-spy", 1: "py-spy",
                                                                 2: "py-spy"}
        for waiting in (0, 1):
            assert "c10d::Work::wait" in ranks[waiting]["text"], ranks[waiting]["text"]
            assert "wait_for_peers (hang_rank2.py:8)" in ranks[waiting]["text"]
        assert "<module> (hang_rank2.py:14)" in ranks[2]["text"]
        grouped = run_cli("stacks", "spy", "--native", "--runs-dir", runs, env=env, timeout=60)
        assert "3 rank(s), 2 node(s), by py-spy" in grouped.stdout, grouped.stdout
        assert "ranks 0-1 (localhost): all_reduce <- hang_rank2.py:8" in grouped.stdout
        assert "! rank 2 (localhost): <module> (hang_rank2.py:14)" in grouped.stdout
        python_only = run_cli("stacks", "spy", "--json", "--runs-dir", runs, env=env, timeout=60)
        texts = [r["text"] for r in json.loads(python_only.stdout)["ranks"]]
        assert all("wait_for_peers" in t or "hang_rank2.py:14" in t for t in texts)
        assert not any("c10d::" in t for t in texts)  # no C frames without --native
    finally:
        proc.send_signal(2)
        proc.communicate(timeout=60)
    assert wait_gone("spy", 15) == set()
