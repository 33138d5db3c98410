"""Which rank holds the gang back (issue #33): the one rule ``top`` and
``status`` share (``report/pace.py``), the step report's times on their way
from a rank's file to a frame, and ``top``'s frame in text and JSON.

The oracles are hand-made: ranks whose numbers say by construction which one
is slow (three times the others' time outside collectives, a third of their
rate, progress that stopped), never the rule's own output."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import jsonschema
import pytest

from conftest import ROOT
from orchestrator.agent.node.outputsteps import OutputSteps
from orchestrator.agent.node.supervisor import Supervisor
from orchestrator.agent.wire.protocol import rank_progress
from orchestrator.agent.worker import progress
from orchestrator.records.outcome import RunDescription, RunState
from orchestrator.records.rundir import RunDir
from orchestrator.records.store import NodeRecord, RunRecord
from orchestrator.report.pace import (OUTSIDE, RATE, STOPPED, PaceWindow, RankPace,
                                      from_step_times, marked, stragglers)
from orchestrator.report.runs import render_status
from orchestrator.report.runsjson import status_json
from orchestrator.report.top import build_frame, render
from workloads import contract


def named(ranks) -> dict[int, str]:
    return {s.rank: s.evidence for s in stragglers(ranks)}


# -- rule 1: time outside collectives -------------------------------------------

def test_the_rank_that_computes_three_times_longer_is_named_and_no_other():
    """In lock-step every rate is the same; rank 2's 150 ms outside
    collectives against the others' 50 ms names it."""
    ranks = [RankPace(r, 2.0, 0.050 * (3 if r == 2 else 1), 0.001, rate=6.4) for r in range(4)]
    assert named(ranks) == {2: OUTSIDE}
    why = stragglers(ranks)[0].why
    assert "151 ms/step outside collectives" in why and "3.0x" in why, why


def test_in_a_gang_of_two_the_slow_rank_is_still_named():
    """Against the median of the *others*: with two ranks, the mean of both
    would halve the gap and name nobody."""
    assert named([RankPace(0, 1.0, 0.05, 0.0), RankPace(1, 1.0, 0.15, 0.0)]) == {1: OUTSIDE}


def test_a_data_bound_rank_says_so_and_tiny_steps_noise_names_nobody():
    slow = named([RankPace(0, 1.0, 0.02, 0.01), RankPace(1, 1.0, 0.02, 0.01),
                  RankPace(2, 1.0, 0.02, 0.08)])
    assert slow == {2: OUTSIDE}
    assert "80% of it waiting for data" in stragglers(
        [RankPace(0, 1.0, 0.02, 0.01), RankPace(1, 1.0, 0.02, 0.01),
         RankPace(2, 1.0, 0.02, 0.08)])[0].why
    # 3 ms against 1 ms is three times, but no gang is held back by 2 ms
    assert named([RankPace(r, 1.0, 0.001 * (3 if r == 1 else 1), 0.0) for r in range(3)]) == {}


def test_rule_one_wins_over_the_rates_when_both_are_known():
    """In DDP the step rate names nobody; a rank that steps slower in the
    window (a late heartbeat) is not a straggler when the times say no."""
    ranks = [RankPace(r, 1.0, 0.05, 0.0, rate=6.0 if r == 1 else 12.0) for r in range(3)]
    assert named(ranks) == {}


# -- rule 2: rates of ranks that report on their own -------------------------------

def test_a_rank_stepping_at_a_third_of_the_others_rate_is_named():
    ranks = [RankPace(r, 1.0, rate=6.7 if r == 2 else 20.0) for r in range(4)]
    assert named(ranks) == {2: RATE}
    assert "3.0x slower" in stragglers(ranks)[0].why


def test_lock_step_rates_name_nobody():
    assert named([RankPace(r, 1.0, rate=6.4 + 0.01 * r) for r in range(4)]) == {}


def test_a_rank_with_no_step_in_the_window_does_not_drag_the_others_median_down():
    """Rank 1 stood still over the window (rate 0): it is named, and rank 2
    at a third of rank 0's rate still is too, against the moving ranks."""
    ranks = [RankPace(0, 1.0, rate=20.0), RankPace(1, 9.0, rate=0.0),
             RankPace(2, 1.0, rate=6.7)]
    assert named(ranks) == {1: RATE, 2: RATE}


# -- rule 3, and the silent ---------------------------------------------------------

def test_a_rank_whose_progress_stopped_while_the_others_go_on_is_marked_first():
    ranks = [RankPace(0, 3.0, rate=20.0), RankPace(1, 25.0), RankPace(2, 4.0, rate=20.0)]
    found = stragglers(ranks)
    assert [(s.rank, s.evidence) for s in found] == [(1, STOPPED)]
    assert "no progress for 25s" in found[0].why


def test_a_gang_that_stopped_together_names_nobody_and_a_silent_rank_is_never_marked():
    assert named([RankPace(0, 40.0), RankPace(1, 41.0), RankPace(2, 39.0)]) == {}
    ranks = [RankPace(0, 2.0, 0.05, 0.0, rate=5.0), RankPace(1, 2.0, 0.05, 0.0, rate=5.0),
             RankPace(2, None)]
    assert named(ranks) == {}


# -- the rates --------------------------------------------------------------------

def test_rates_are_over_the_ranks_report_times_and_a_report_seen_again_is_one_point():
    window = PaceWindow(window_s=10.0)
    window.add(100.0, 0, 10, 40)
    window.add(100.0004, 0, 10, 40)  # the same report, its age read off another clock
    assert window.rate(0) is None
    window.add(105.0, 0, 60, 240)
    assert window.rate(0) == pytest.approx(10.0) and window.samples_rate(0) == pytest.approx(40)
    window.add(120.0, 0, 60, 240)  # stood still: over the last 10 s, no step
    assert window.rate(0) == pytest.approx(0.0)


# -- the step report's times, from the rank's file to the heartbeat ----------------------

@pytest.mark.parametrize("writer", ["step", "heartbeat"])
def test_the_step_reports_times_are_their_means_since_the_last_write(writer, tmp_path,
                                                                    monkeypatch):
    """Both writers (the user's ``ddp_orch_progress.step``, the built-ins'
    heartbeat) write one line at most a second, with the means of the steps
    since the last; the supervisor reads them as [step, age, samples,
    compute_s, data_s] and ``rank_progress`` as the rank's pace."""
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock.now)
    monkeypatch.setattr(progress, "_last", [float("-inf")])
    monkeypatch.setattr(progress, "_pace", [0.0, 0.0, 0])
    monkeypatch.setattr(contract, "_last_heartbeat", [float("-inf")])
    monkeypatch.setattr(contract, "_pace", [0.0, 0.0, 0])
    monkeypatch.setenv("DDP_ORCH_RESULT_FILE", str(tmp_path / "result.json"))
    monkeypatch.setenv("RANK", "2")
    report = progress.step if writer == "step" else contract.heartbeat
    report(1, samples=4, compute_s=0.1, data_s=0.01)  # written now
    clock.now += 0.5
    report(2, samples=8, compute_s=0.3, data_s=0.03)  # within the second: summed
    clock.now += 0.2
    report(3, samples=12, compute_s=0.5, data_s=0.05)
    clock.now += 1.0
    report(4, samples=16, compute_s=0.7, data_s=0.07)  # written: the means of steps 2-4
    words = (tmp_path / "progress" / "rank-2").read_text().split()
    assert words[0] == "4" and words[2] == "16"
    assert float(words[3]) == pytest.approx(0.5) and float(words[4]) == pytest.approx(0.05)
    seen = Supervisor.progress(SimpleNamespace(run_dir=str(tmp_path), output_steps=OutputSteps()))["2"]
    entry = rank_progress(seen)
    assert (entry.step, entry.samples) == (4, 16)
    assert (entry.compute_s, entry.data_s) == pytest.approx((0.5, 0.05))


def test_a_report_without_samples_keeps_its_times_and_bad_times_leave_the_pair_out(tmp_path,
                                                                                monkeypatch):
    monkeypatch.setattr(progress, "_last", [float("-inf")])
    monkeypatch.setattr(progress, "_pace", [0.0, 0.0, 0])
    monkeypatch.setenv("DDP_ORCH_RESULT_FILE", str(tmp_path / "result.json"))
    monkeypatch.setenv("RANK", "0")
    progress.step(7, compute_s=0.2, data_s=0.0)
    assert (tmp_path / "progress" / "rank-0").read_text().split()[2:] == ["-", "0.200000",
                                                                          "0.000000"]
    seen = Supervisor.progress(SimpleNamespace(run_dir=str(tmp_path), output_steps=OutputSteps()))["0"]
    assert seen[:1] == [7] and seen[2:] == [None, 0.2, 0.0]
    monkeypatch.setattr(progress, "_last", [float("-inf")])
    progress.step(8, samples=3, compute_s=-1.0, data_s=0.1)
    assert len((tmp_path / "progress" / "rank-0").read_text().split()) == 3


def test_a_step_file_whose_times_the_controller_refuses_keeps_its_step(tmp_path):
    """A step file written by hand (any program may write one) with a time
    no number of seconds (``fields.is_time``: 1e12 s is past it): the node
    leaves out the pair, as the controller would refuse the whole entry."""
    (tmp_path / "progress").mkdir()
    (tmp_path / "progress" / "rank-0").write_text(f"7 {time.time():.3f} 3 1e12 0.1\n")
    seen = Supervisor.progress(SimpleNamespace(run_dir=str(tmp_path), output_steps=OutputSteps()))["0"]
    assert seen[0] == 7 and seen[2:] == [3]
    assert rank_progress(seen) == (7, seen[1], 3, None, None)


@pytest.mark.parametrize("entry", [[1, 2.0, None, -0.1, 0.0], [1, 2.0, None, 0.1],
                                   [1, 2.0, -3, 0.1, 0.0], [1, 2.0, None, float("nan"), 0.0]])
def test_a_heartbeat_entry_with_bad_times_is_ignored(entry):
    assert rank_progress(entry) is None


# -- status and top ---------------------------------------------------------------------

def live_run(tmp_path, ranks: dict, plan: dict | None = None) -> RunRecord:
    run = RunDir(str(tmp_path / "r1"))
    os.makedirs(run.path)
    run.write_progress({"updated": time.time(), "ranks": ranks})
    with open(os.path.join(run.path, "plan.json"), "w", encoding="utf-8") as fh:
        json.dump(plan or {"world_size": len(ranks), "nodes": []}, fh)
    return RunRecord(run_id="r1", run=run, state=RunState.RUNNING, backend="local",
                     started=time.time() - 60, wall_s=None, ended=None, controller_pid=None,
                     nodes=(NodeRecord(node_rank=0, host="a", run_dir="/w/0", python="python3"),
                            NodeRecord(node_rank=1, host="b", run_dir="/w/1",
                                       python="python3")),
                     outcomes=(), root_cause=None)


def paced(node, step, ago, compute=None, gpu=None) -> dict:
    now = time.time()
    out = {"node_rank": node, "host": "ab"[node], "step": step,
           "samples": None if step is None else step * 4,
           "last_progress": None if ago is None else now - ago, "last_output": None}
    if compute is not None:
        out.update(compute_s=compute, data_s=0.001)
    if gpu is not None:
        out.update(gpu=gpu, gpu_util=97, gpu_mem_mib=2048)
    return out


def test_status_marks_the_slow_rank_in_text_and_json(tmp_path):
    record = live_run(tmp_path, {"0": paced(0, 50, 2, 0.05), "1": paced(0, 50, 2, 0.05),
                                 "2": paced(1, 50, 2, 0.15), "3": paced(1, None, None)})
    described = RunDescription(RunState.RUNNING, (), None)
    text = render_status(record, described)
    assert "rank 2 (node 1, b): step 50 (200 samples), last progress 2s ago; holds the " \
           "gang back: 151 ms/step outside collectives" in text, text
    assert text.count("holds the gang back") == 1
    data = json.loads(json.dumps(status_json(record, described)))
    with open(os.path.join(ROOT, "schema", "status.schema.json"), encoding="utf-8") as fh:
        jsonschema.validate(data, json.load(fh))
    assert [r["rank"] for r in data["progress"] if r["straggler"]] == [2]
    assert marked(data["progress"]).keys() == {2}


def test_a_top_frame_names_the_slow_rank_with_its_gpu_and_validates(tmp_path):
    plan = {"world_size": 4, "nodes": [
        {"node_rank": 0, "gpus": [0, 1], "gpu_models": ["NVIDIA H100", "NVIDIA H100"]},
        {"node_rank": 1, "gpus": [0, 1], "gpu_models": ["NVIDIA A100", "NVIDIA A100"]}]}
    record = live_run(tmp_path, {"0": paced(0, 50, 2, 0.05, 0), "1": paced(0, 50, 2, 0.05, 1),
                                 "2": paced(1, 50, 2, 0.15, 0), "3": paced(1, None, None, None, 1)},
                      plan)
    from orchestrator.report.runs import live_progress

    window = PaceWindow()
    frame = build_frame(record, live_progress(record), window)
    assert frame.slowest.rank == 2 and frame.live
    rows = {r.rank: r for r in frame.ranks}
    assert rows[2].gpu_model == "NVIDIA A100" and rows[2].straggler
    assert rows[3].silent and rows[3].straggler is None
    assert not any(rows[r].straggler for r in (0, 1, 3))
    with open(os.path.join(ROOT, "schema", "top.schema.json"), encoding="utf-8") as fh:
        jsonschema.validate(json.loads(json.dumps(frame.to_json())), json.load(fh))
    wide = render(frame, width=140, height=40)
    assert "RANK" in wide and "STRAGGLER" in wide and "silent" in wide
    assert "slowest: rank 2 (node 1, b, NVIDIA A100): 151 ms/step outside" in wide, wide
    narrow = render(frame, width=60, height=40).splitlines()
    assert any(line.startswith("rank 2 node 1 b GPU 0 NVIDIA A100:") and "STRAGGLER" in line
               for line in narrow), narrow
    short = render(frame, width=140, height=8)  # 4 ranks do not fit: a row per node
    assert "one row per node, its worst rank" in short
    # node 0: its ranks alike, the first; node 1: rank 2, the straggler, over silent rank 3
    assert [line.split()[0] for line in short.splitlines()[3:5]] == ["0", "2"], short


def test_status_shows_a_ranks_sampled_gpu_with_its_memory_in_gib(tmp_path):
    """40960 MiB in use is 40.0 GiB: the MiB the heartbeat carries, divided once."""
    ranks = {"0": {**paced(0, 50, 2), "gpu": 3, "gpu_util": 97, "gpu_mem_mib": 40960},
             "1": {**paced(1, 50, 2), "gpu": 0, "gpu_util": None, "gpu_mem_mib": None}}
    text = render_status(live_run(tmp_path, ranks), RunDescription(RunState.RUNNING, (), None))
    assert "rank 0 (node 0, a): step 50 (200 samples), last progress 2s ago, GPU 3 97% busy, " \
           "40.0 GiB\n" in text, text
    assert "rank 1 (node 1, b): step 50 (200 samples), last progress 2s ago, GPU 0 ? busy\n" \
        in text, text


# -- a finished run's step times (the summary) ------------------------------------------

def test_a_finished_runs_mean_step_times_name_the_rank_whose_steps_take_longest():
    """Without its time outside collectives, a rank's mean step time is a
    rate, one over it: 0.1 s a step is 10 steps/s, and rank 2 at 0.3 s takes
    three times as long, so it is the one named (never the quick ones)."""
    rows = [{"rank": 0, "mean_s": 0.1}, {"rank": 1, "mean_s": 0.1}, {"rank": 2, "mean_s": 0.3},
            {"rank": "3", "mean_s": 0.9}, "not a row", {"rank": 4, "mean_s": 0}]
    paces = from_step_times(rows)
    assert [(p.rank, p.rate) for p in paces] == [(0, pytest.approx(10.0)),
                                                 (1, pytest.approx(10.0)),
                                                 (2, pytest.approx(10 / 3))]
    assert named(paces) == {2: RATE}
    assert "3.33 steps/s, 3.0x slower than the others' median (10.00 steps/s)" in \
        stragglers(paces)[0].why
    timed = from_step_times([{"rank": r, "mean_s": 0.2, "forward_mean_s": 0.15 if r else 0.05,
                              "data_mean_s": 0.002} for r in range(3)])
    assert [(p.compute_s, p.data_s, p.rate) for p in timed] == [(0.05, 0.002, None),
                                                                (0.15, 0.002, None),
                                                                (0.15, 0.002, None)]
    assert from_step_times({"rank": 0}) == []


# -- top's rates and attempt -----------------------------------------------------------

def row(rank: int, step: int, step_ago: float, **more) -> dict:
    return {"rank": rank, "node_rank": 0, "host": "a", "step": step, "samples": step * 4,
            "last_progress_s_ago": step_ago, "last_step_s_ago": step_ago, **more}


def test_tops_rates_are_over_the_times_the_ranks_reported_not_the_times_top_looked(tmp_path):
    """Looked at 10 s apart, rank 0's two reports were made 5 s apart (2 s
    before the first look, 7 s before the second): 50 steps in 5 s is 10
    steps/s; over the looks it would be 5."""
    record = live_run(tmp_path, {})
    window = PaceWindow()
    build_frame(record, [row(0, 10, 2.0)], window, now=1000.0)
    frame = build_frame(record, [row(0, 60, 7.0)], window, now=1010.0)
    assert frame.ranks[0].steps_per_s == pytest.approx(10.0)
    assert frame.ranks[0].samples_per_s == pytest.approx(40.0)
    assert (frame.steps_per_s, frame.samples_per_s) == (10.0, 40.0)


def test_top_of_a_finished_kept_run_shows_the_attempt_it_ended_in(tmp_path):
    """Attempts count from 0: a run that ended in its second attempt (one
    restart) ended in attempt 1; one that never restarted, in attempt 0."""
    import dataclasses

    from orchestrator.agent.wire.owner import Holder, Owner
    from orchestrator.records.outcome import AttemptOutcome

    first = AttemptOutcome(0, 29500, RunState.FAILED, None, "restarting")
    second = AttemptOutcome(1, 29501, RunState.SUCCEEDED, None)
    record = dataclasses.replace(live_run(tmp_path, {}), state=RunState.SUCCEEDED,
                                 ended=time.time(), owner=Owner(Holder.KEEPERS),
                                 attempts=(first, second))
    frame = build_frame(record, [], PaceWindow())
    assert (frame.attempt, frame.ended) == (1, "succeeded")
    assert "owner keepers  attempt 1  elapsed" in render(frame)
    once = dataclasses.replace(record, attempts=(second,))
    assert build_frame(once, [], PaceWindow()).attempt == 0
    assert build_frame(dataclasses.replace(record, attempts=()), [], PaceWindow()).attempt == 0
    # the nodes' word over the record's
    assert build_frame(once, [], PaceWindow(), attempts=(first, second, second)).attempt == 2


def keeper(k: int, attempt: int) -> dict:
    """A live keeper's ``keeper`` reply (``kept/mailbox.state``); only node
    0's keeper counts the attempts, every other says 0."""
    return {"ok": True, "alive": True, "now": time.time(), "keeper": {
        "pid": 100 + k, "start_time": 1, "node_rank": k, "run_id": "r1",
        "owner": {"holder": "keepers", "detached": True}, "state": "running", "code": None,
        "attempt": attempt, "updated": time.time(),
        "progress": {str(k): {"step": 5, "last_progress": time.time() - 1.0}}}}


def test_top_of_a_live_kept_run_after_a_restart_shows_the_attempt_it_is_in(tmp_path):
    """A detached run in its second attempt: node 0's keeper says attempt 1,
    and so does the frame (the attempts' record, kept for the run's end,
    says nothing yet). An attached one: as its controller keeps it in
    ``progress.json``."""
    import dataclasses

    from orchestrator.agent.wire.owner import Holder, Owner
    from orchestrator.engine.keptgang import kept_status
    from orchestrator.report.runs import live_attempt, live_progress

    record = dataclasses.replace(live_run(tmp_path, {}), owner=Owner(Holder.KEEPERS, True))
    described = kept_status(record, None, {0: keeper(0, 1), 1: keeper(1, 0)}, {})
    assert (described.state, described.attempts, described.attempt) == (RunState.RUNNING, (), 1)
    frame = build_frame(record, live_progress(record, described), PaceWindow(),
                        attempts=described.attempts, attempt=live_attempt(record, described))
    assert frame.attempt == 1 and [r.step for r in frame.ranks] == [5, 5]
    assert "  attempt 1  " in render(frame)
    unheard = kept_status(record, None, {1: keeper(1, 0)}, {0: "timed out"})
    assert unheard.attempt is None and live_attempt(record, unheard) is None
    # attached: the controller's progress.json, while the run is live
    attached = dataclasses.replace(record, owner=Owner(Holder.KEEPERS))
    for said, read in ((2, 2), (0, 0), ("2", None), (-1, None), (True, None)):
        attached.run.write_progress({"updated": time.time(), "attempt": said, "ranks": {}})
        assert live_attempt(attached, RunDescription(RunState.RUNNING, (), None)) == read, said
    ended = dataclasses.replace(attached, state=RunState.FAILED)
    assert live_attempt(ended) is None


def test_an_ended_runs_frame_says_when_it_ended_with_its_mean_rates(tmp_path):
    """Issue #45: ``top --once`` on a finished run printed "gang: no rate
    yet". Its frame now has its ranks as last recorded and their means over
    the run's own time (from its start after the wait, 100 s before the last
    step here), and its end; no straggler is judged on means."""
    import dataclasses

    record = live_run(tmp_path, {})
    started, waited, end = 1000.0, 30.0, 1140.0
    stepped = started + waited + 100.0
    ranks = {str(k): {"node_rank": k // 2, "host": "ab"[k // 2], "step": 600,
                      "samples": 2400 + 100 * k, "last_step": stepped, "last_progress": stepped,
                      "last_output": None} for k in range(4)}
    record.run.write_progress({"updated": stepped, "ranks": ranks})
    ended = dataclasses.replace(record, state=RunState.SUCCEEDED, started=started,
                                waited_s=waited, wall_s=end - started - waited, ended=end)
    from orchestrator.report.runs import final_progress

    frame = build_frame(ended, final_progress(ended), PaceWindow(), now=end)
    assert [(r.rank, r.steps_per_s, r.samples_per_s) for r in frame.ranks] == [
        (0, 6.0, 24.0), (1, 6.0, 25.0), (2, 6.0, 26.0), (3, 6.0, 27.0)]
    assert (frame.samples_per_s, frame.steps_per_s, frame.rates) == (102.0, 6.0, "mean")
    assert frame.slowest is None and frame.ended == "succeeded" and frame.ended_at == end
    text = render(frame, width=140, height=40)
    assert "gang: 102 samples/s, 6 steps/s, mean over the run\n" in text, text
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(end))
    assert text.endswith(f"ended {when}: succeeded\n"), text
    with open(os.path.join(ROOT, "schema", "top.schema.json"), encoding="utf-8") as fh:
        jsonschema.validate(json.loads(json.dumps(frame.to_json())), json.load(fh))


def test_an_ended_runs_frame_without_its_ranks_takes_rank_0s_own_timing(tmp_path):
    """A detached run's ranks are its keepers', gone with the run: rank 0's
    result still says the run's throughput."""
    import dataclasses

    record = live_run(tmp_path, {})
    os.unlink(os.path.join(record.run.path, "progress.json"))
    with open(record.run.result_file(), "w", encoding="utf-8") as fh:
        json.dump({"timing": {"samples_per_s": 5660.27, "steps": 313, "train_s": 1.76}}, fh)
    ended = dataclasses.replace(record, state=RunState.FAILED, ended=2000.0)
    frame = build_frame(ended, [], PaceWindow(), now=2000.0)
    assert (frame.samples_per_s, frame.steps_per_s, frame.rates) == (5660.3, 177.841, "result")
    assert "gang: 5660.3 samples/s, 177.841 steps/s, mean over the run (rank 0's result)" in \
        render(frame)
    silent = build_frame(dataclasses.replace(ended, run=RunDir(str(tmp_path / "none"))), [],
                         PaceWindow(), now=2000.0)
    assert "gang: no rate recorded" in render(silent)
