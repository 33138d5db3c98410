"""`ddp-orch stacks`: live runs on this machine (the grouping's unit tests are
in tests/unit/engine/test_engine_stacks.py)."""

from __future__ import annotations

import json
import os
import pytest

from conftest import local_job, run_cli, start_cli, wait_for_lines
from procscan import wait_gone
from sshlab import lacking


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
        lacking(f"no py-spy in {bin_dir}: scripts/bootstrap --test installs it")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    runs = str(tmp_path / "runs")
    proc = start_hang(tmp_path, "spy")
    try:
        native = run_cli("stacks", "spy", "--native", "--json", "--runs-dir", runs, env=env,
                         timeout=60)
        assert native.returncode == 0, native.stdout + native.stderr
        ranks = {r["rank"]: r for r in json.loads(native.stdout)["ranks"]}
        assert {rank: r["how"] for rank, r in ranks.items()} == {0: "py-spy", 1: "py-spy",
                                                                 2: "py-spy"}, ranks
        assert not any(r["error"] for r in ranks.values()), ranks  # every C frame was read
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


@pytest.mark.live
def test_the_hang_watchdog_has_every_rank_dump_its_flight_recorder_before_it_stops_them(
        tmp_path):
    """Rank 2 never calls the all_reduce ranks 0-1 wait in (gloo). At the
    hang verdict every rank is asked for its flight recorder's dump (torch
    >= 2.8 records gloo's collectives; the worker shim dumps them when the
    node's agent writes to its FIFO), within a short bound, before the stop;
    the dumps come home under nccl_trace/, and the summary reads them: which
    rank, and which collective by its sequence number, was missing."""
    cluster = local_job(tmp_path, "frhang", "hang_rank2.py",
                        "[{host: localhost, procs: 2}, {host: localhost, procs: 1}]")
    runs = str(tmp_path / "runs")
    ran = run_cli("up", cluster, "--run-id", "frhang", "--runs-dir", runs, "--grace", "3",
                  "--hang-timeout", "20", timeout=240)
    out = ran.stdout + ran.stderr
    assert ran.returncode == 1, out
    assert ("flight recorder: rank 2 never issued collective #2 (gloo:all_reduce) of process "
            "group 0 (default_pg), which ranks 0-1 issued") in ran.stdout, out
    traces = os.path.join(runs, "frhang", "nccl_trace")
    assert sorted(os.listdir(traces)) == ["node-0", "node-1"]
    assert sorted(os.listdir(os.path.join(traces, "node-0"))) == ["rank-0", "rank-1"]
    assert os.listdir(os.path.join(traces, "node-1")) == ["rank-2"]
    assert wait_gone("frhang", 15) == set()
