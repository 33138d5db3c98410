"""Unit tests of records/store.py: finding a run by its id."""

from __future__ import annotations

import time

import pytest

from orchestrator.errors import ConfigError
from orchestrator.records.store import find_run
from runrecords import record


def test_an_ambiguous_run_id_prefix_lists_the_newest_matches_with_their_start(tmp_path):
    now = time.time()
    for k in range(12):
        record(tmp_path, f"linear-{k:02d}", now - 60 * k)
    record(tmp_path, "other", now)
    with pytest.raises(ConfigError) as caught:
        find_run(str(tmp_path), "linear")
    text = str(caught.value)
    assert text.startswith(f"command line: 12 runs matching 'linear' in {tmp_path}, newest "
                           "first:\n")
    listed = [line.split()[0] for line in text.splitlines()[1:11]]
    assert listed == [f"linear-{k:02d}" for k in range(10)]
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now - 60))
    assert f"    linear-01  started {started}\n" in text
    assert "    ... and 2 more\n" in text
    assert text.endswith("hint: give more characters of the run id, enough for one run")
    assert find_run(str(tmp_path), "linear-03").run_id == "linear-03"


def _state(tmp_path, name: str, **kwargs):
    from orchestrator.records.rundir import RunDir
    from orchestrator.records.store import read_record, write_state

    run = RunDir.create(str(tmp_path), name)
    write_state(run, run_id=name, backend="ssh", nodes=[], **kwargs)
    return read_record(run)


def test_a_runs_wait_is_kept_apart_from_its_own_time(tmp_path):
    """Issue #45: ps showed STARTED including the wait for GPUs and DURATION
    without it, so the two did not add up to the end. Now the wait is its
    own figure: started + waited + duration is the end."""
    from orchestrator.records.outcome import RunOutcome, RunState

    outcome = RunOutcome("gpu", RunState.SUCCEEDED, 20.0, (), None, None)
    done = _state(tmp_path, "gpu", state=RunState.SUCCEEDED, started=1000.0,
                  running_since=1130.0, outcome=outcome, ended=1151.0)
    assert (done.waited_s, done.wall_s, done.running_since) == (130.0, 20.0, 1130.0)
    # refused after waiting: it waited until it ended, and never ran
    refused = _state(tmp_path, "refused", state=RunState.FAILED, started=1000.0, ended=1600.0,
                     error="GPUs held")
    assert (refused.waited_s, refused.wall_s) == (600.0, None)
    # still waiting (for its GPUs, in a queue): waited so far, no time of its own
    waiting = _state(tmp_path, "waiting", state=RunState.PENDING, started=time.time() - 90)
    assert waiting.waited_s == pytest.approx(90, abs=5) and waiting.wall_s is None
    running = _state(tmp_path, "running", state=RunState.RUNNING, started=time.time() - 100,
                     running_since=time.time() - 60)
    assert running.waited_s == pytest.approx(40, abs=1)
    assert running.wall_s == pytest.approx(60, abs=5)


def test_a_detached_runs_end_learnt_later_keeps_its_wait(tmp_path):
    from orchestrator.records.outcome import RunOutcome, RunState
    from orchestrator.records.store import read_record, record_end

    live = _state(tmp_path, "kept", state=RunState.RUNNING, started=1000.0,
                  running_since=1045.0)
    record_end(live, RunOutcome("kept", RunState.SUCCEEDED, 300.0, (), None, None),
               ended=1345.0, results_home=False)
    ended = read_record(live.run)
    assert (ended.waited_s, ended.wall_s, ended.ended) == (45.0, 300.0, 1345.0)
