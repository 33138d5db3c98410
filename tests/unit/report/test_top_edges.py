"""The edges of ``top``'s frame and its text (``report/top.py``) that
``test_pace.py`` leaves open: a frame built from rows field by field, its
JSON, and its text word for word in a wide terminal, a narrow one and one
too short for every rank. The expected text is written out here by hand
(the columns two spaces apart, as ``tables.format_table`` sets them)."""

from __future__ import annotations

import dataclasses
import json
import os

from orchestrator.records.outcome import EndReason, NodeOutcome, NodeState, RunState
from orchestrator.records.rundir import RunDir
from orchestrator.records.store import RunRecord
from orchestrator.report.pace import OUTSIDE, PaceWindow, Straggler
from orchestrator.report.top import RankRow, TopFrame, build_frame, render


def record(tmp_path, plan=None, **more) -> RunRecord:
    run = RunDir(str(tmp_path / "r1"))
    os.makedirs(run.path, exist_ok=True)
    with open(os.path.join(run.path, "plan.json"), "w", encoding="utf-8") as fh:
        json.dump(plan, fh)
    fields = dict(run_id="r1", run=run, state=RunState.RUNNING, backend="local", started=1000.0,
                  wall_s=None, ended=None, controller_pid=None, nodes=(), outcomes=(),
                  root_cause=None)
    return RunRecord(**{**fields, **more})


def rank(r: int, **more) -> RankRow:
    fields = dict(rank=r, node_rank=None, host=None, gpu=None, gpu_model=None, step=None,
                  steps_per_s=None, samples_per_s=None, last_progress_s_ago=None,
                  compute_s=None, data_s=None, gpu_util=None, gpu_mem_mib=None, silent=True,
                  straggler=None)
    return RankRow(**{**fields, **more})


# -- a frame from rows ----------------------------------------------------------------------------

PLAN = {"world_size": 2, "nodes": [
    {"node_rank": 0, "gpus": [3], "gpu_models": ["H100"]},
    {"node_rank": 1, "gpus": [0, 1], "gpu_models": ["A100", 7]},  # a model that is no string
    {"node_rank": 2, "gpus": [0]},  # no models recorded
]}


def test_a_frame_holds_each_rows_fields_its_rates_and_the_gangs(tmp_path):
    rows = [{"rank": 0, "node_rank": 0, "host": "a", "gpu": 3, "step": 10, "samples": 40,
             "last_progress_s_ago": 1.0, "last_step_s_ago": 1.0, "compute_s": 0.25,
             "data_s": 0.0, "gpu_util": 97, "gpu_mem_mib": 2048},
            {"rank": 1, "node_rank": 1, "host": "b", "gpu": 1, "step": 8, "samples": 32,
             "last_progress_s_ago": 1.0, "last_step_s_ago": 1.0}]
    window = PaceWindow()
    first = build_frame(record(tmp_path, PLAN), rows, window, now=2000.0)
    assert (first.steps_per_s, first.samples_per_s) == (None, None)
    later = [{**rows[0], "step": 60, "samples": 240}, {**rows[1], "step": 50, "samples": 200}]
    frame = build_frame(record(tmp_path, PLAN), later, window, now=2005.0)
    assert frame.ranks == (
        RankRow(rank=0, node_rank=0, host="a", gpu=3, gpu_model="H100", step=60,
                steps_per_s=10.0, samples_per_s=40.0, last_progress_s_ago=1.0, compute_s=0.25,
                data_s=0.0, gpu_util=97, gpu_mem_mib=2048, silent=False, straggler=None),
        RankRow(rank=1, node_rank=1, host="b", gpu=1, gpu_model=None, step=50, steps_per_s=8.4,
                samples_per_s=33.6, last_progress_s_ago=1.0, compute_s=None, data_s=None,
                gpu_util=None, gpu_mem_mib=None, silent=False, straggler=None))
    assert (frame.run_id, frame.state, frame.owner, frame.attempt) == ("r1", "running",
                                                                      "controller", 0)
    assert (frame.elapsed_s, frame.world_size) == (1005.0, 2)
    # 8.4 steps/s is not 1.5 times slower than 10: nobody is named
    assert (frame.samples_per_s, frame.steps_per_s, frame.slowest, frame.ended) == (
        73.6, 8.4, None, "")


def test_the_gangs_rates_are_rounded_and_its_pace_is_its_slowest_ranks(tmp_path):
    window = PaceWindow()
    for at, steps in ((2000.0, (0, 0)), (2003.0, (10, 20))):
        rows = [{"rank": r, "step": s, "samples": s * 3, "last_step_s_ago": 0.0,
                 "last_progress_s_ago": 0.0} for r, s in enumerate(steps)]
        frame = build_frame(record(tmp_path, {"world_size": 2}), rows, window, now=at)
    # 10/3 and 20/3 steps/s; 10 and 20 samples/s: 30.0 in all
    assert (frame.steps_per_s, frame.samples_per_s) == (3.333, 30.0)
    assert frame.ranks[0].steps_per_s == 10 / 3


def test_an_ended_run_says_how_and_its_elapsed_time_stops_at_its_end(tmp_path):
    cause = NodeOutcome(1, "b", NodeState.FAILED, 1, "torchrun exited 1", None, why=EndReason.FAILED)
    failed = record(tmp_path, None, state=RunState.FAILED, ended=1100.04, root_cause=cause)
    frame = build_frame(failed, [], PaceWindow(), now=5000.0)
    assert (frame.ended, frame.elapsed_s, frame.live) == (
        "failed: node 1 (b) torchrun exited 1", 100.0, False)
    erred = dataclasses.replace(failed, root_cause=None, error="port 29500 is in use")
    assert build_frame(erred, [], PaceWindow()).ended == "failed: port 29500 is in use"
    plain = dataclasses.replace(failed, root_cause=None, state=RunState.INTERRUPTED)
    assert build_frame(plain, [], PaceWindow()).ended == "interrupted"


def test_a_run_not_yet_started_or_with_a_plan_that_is_no_plan_has_dashes(tmp_path):
    starting = record(tmp_path, ["not", "a", "plan"], started=None)
    frame = build_frame(starting, [{"rank": 0, "gpu": 0, "node_rank": 0}], PaceWindow(), 10.0)
    assert (frame.elapsed_s, frame.world_size, frame.ranks[0].gpu_model) == (None, None, None)
    assert frame.ranks[0].silent and frame.ranks[0].steps_per_s is None
    odd = record(tmp_path, {"world_size": "4", "nodes": [{"node_rank": 0, "gpus": [0]}]})
    assert build_frame(odd, [], PaceWindow(), 10.0).world_size is None


def test_the_slowest_rank_is_the_first_straggler_and_only_stragglers_are_marked(tmp_path):
    rows = [{"rank": r, "node_rank": 0, "host": "a", "step": 5, "last_progress_s_ago": 1.0,
             "compute_s": c, "data_s": 0.0} for r, c in enumerate((0.25, 0.25, 0.5, 0.75))]
    frame = build_frame(record(tmp_path, None), rows, PaceWindow(), 10.0)
    assert frame.slowest == Straggler(3, OUTSIDE, 3.0, "750 ms/step outside collectives, 3.0x "
                                                       "the others' median (250 ms)")
    assert [r.rank for r in frame.ranks if r.straggler] == [2, 3]


# -- its JSON -------------------------------------------------------------------------------------

def test_the_json_has_every_field_with_the_ranks_and_the_slowest_as_objects():
    frame = TopFrame("r1", "running", "controller", 0, 1.5, 1, (rank(0),), None, None,
                     Straggler(0, OUTSIDE, 2.0, "why"), "")
    assert frame.to_json() == {
        "run_id": "r1", "state": "running", "owner": "controller", "attempt": 0,
        "elapsed_s": 1.5, "world_size": 1, "samples_per_s": None, "steps_per_s": None,
        "ended": "", "ended_at": None, "rates": "window",
        "slowest": {"rank": 0, "evidence": OUTSIDE, "vs_others": 2.0, "why": "why"},
        "ranks": [{"rank": 0, "node_rank": None, "host": None, "gpu": None, "gpu_model": None,
                   "step": None, "steps_per_s": None, "samples_per_s": None,
                   "last_progress_s_ago": None, "compute_s": None, "data_s": None,
                   "gpu_util": None, "gpu_mem_mib": None, "silent": True, "straggler": None}]}
    assert dataclasses.replace(frame, slowest=None).to_json()["slowest"] is None


# -- its text ---------------------------------------------------------------------------------------

WHY = "152 ms/step outside collectives, 3.0x the others' median (51 ms)"
RANKS = (
    rank(0, node_rank=0, host="a", gpu=0, gpu_model="H100", step=120, steps_per_s=6.37,
         samples_per_s=25.5, last_progress_s_ago=2.4, compute_s=0.05, data_s=0.001,
         gpu_util=97, gpu_mem_mib=81920, silent=False),
    rank(1, node_rank=1),
    rank(2, node_rank=1, host="b", gpu=1, step=118, steps_per_s=6.3, samples_per_s=25.2,
         last_progress_s_ago=12.6, compute_s=0.15, data_s=0.002, gpu_util=30,
         gpu_mem_mib=1536, silent=False, straggler=WHY),
)
FRAME = TopFrame("r1", "running", "controller", 0, 3723.0, 3, RANKS, 50.7, 6.3,
                 Straggler(2, OUTSIDE, 3.0, WHY), "")


def marked(text: str) -> str:
    return f"<{text}>"


def test_a_wide_terminal_gets_a_table_word_for_word():
    assert render(FRAME, width=100, height=9, mark=marked) == (
        "run r1  running  owner controller  attempt 0  elapsed 1:02:03  world size 3\n"
        "RANK  NODE  HOST  GPU     STEP  STEP/S  SAMPLES/S  LAST  OUTSIDE  DATA  UTIL  MEM\n"
        "0     0     a     0 H100  120   6.37    25.5       2s    51ms     1ms   97%   80.0G\n"
        "1     1     -     -       -     -       -          -     -        -     -     -"
        "      silent\n"
        "2     1     b     1       118   6.30    25.2       13s   152ms    2ms   30%   1.5G"
        "   <STRAGGLER>\n"
        "gang: 50.7 samples/s, 6.3 steps/s\n"
        f"<slowest: rank 2 (node 1, b): {WHY}>\n")


def test_a_narrow_terminal_gets_a_line_of_words_per_rank():
    assert render(FRAME, width=99, height=9, mark=marked).splitlines()[1:4] == [
        "rank 0 node 0 a GPU 0 H100: step 120, 6.37 steps/s, last 2s, outside 51ms, 97% busy",
        "rank 1 node 1 - GPU -: silent",
        "rank 2 node 1 b GPU 1: step 118, 6.30 steps/s, last 13s, outside 152ms, 30% busy "
        f"<STRAGGLER: {WHY}>"]


def test_ranks_that_do_not_fit_get_a_row_per_node_its_worst_rank():
    """Three ranks and six lines of frame need 9 rows; in 8, node 1 is shown
    by rank 2, its straggler, not silent rank 1."""
    lines = render(FRAME, width=60, height=8).splitlines()
    assert lines[1] == "3 ranks: one row per node, its worst rank"
    assert [line.split(":")[0] for line in lines[2:4]] == ["rank 0 node 0 a GPU 0 H100",
                                                           "rank 2 node 1 b GPU 1"]


def test_the_default_terminal_is_120_by_50():
    many = tuple(rank(r, node_rank=r // 8) for r in range(45))  # 45 + 6 lines > 50
    frame = dataclasses.replace(FRAME, ranks=many, slowest=None)
    text = render(frame)
    assert "45 ranks: one row per node, its worst rank" in text and "RANK  NODE" in text
    assert "44 ranks" not in render(dataclasses.replace(frame, ranks=many[:44]))


def test_each_nodes_worst_rank_is_a_straggler_else_the_oldest_progress_else_the_first():
    rows = (rank(0, node_rank=1, silent=False, last_progress_s_ago=2.0),
            rank(1, node_rank=1, silent=False, last_progress_s_ago=2.0),
            rank(2, node_rank=0),  # silent: never worse than a rank that made progress
            rank(3, node_rank=0, silent=False, last_progress_s_ago=0.0),
            rank(4, node_rank=None, silent=False, last_progress_s_ago=9.0),
            rank(5, node_rank=2, silent=False, last_progress_s_ago=30.0),
            rank(6, node_rank=2, silent=False, last_progress_s_ago=1.0, straggler="slow"))
    frame = dataclasses.replace(FRAME, ranks=rows, slowest=None)
    text = render(frame, width=60, height=5)
    assert [line.split()[1] for line in text.splitlines()[2:6]] == ["3", "0", "6", "4"]


def test_the_footer_without_rates_or_stragglers_counts_the_silent_ranks():
    def footer(**changes) -> list[str]:
        return render(dataclasses.replace(FRAME, slowest=None, **changes)).splitlines()[-2:]

    assert footer(samples_per_s=None, steps_per_s=None) == [
        "gang: no rate yet", "slowest: none holds the gang back (1 silent rank not judged)"]
    assert footer(steps_per_s=None)[0] == "gang: 50.7 samples/s"
    assert footer(samples_per_s=None)[0] == "gang: 6.3 steps/s"
    two = (RANKS[0], rank(1), rank(2))
    assert footer(ranks=two)[1] == "slowest: none holds the gang back (2 silent ranks not judged)"
    assert footer(ranks=RANKS[:1])[1] == "slowest: none holds the gang back"


def test_a_slowest_rank_no_longer_in_the_rows_is_named_alone_and_an_end_is_said():
    frame = dataclasses.replace(FRAME, slowest=Straggler(9, OUTSIDE, 3.0, "gone"),
                                ended="failed: node 1 (b) torchrun exited 1", elapsed_s=59.9)
    lines = render(frame).splitlines()
    assert lines[0].endswith("elapsed 0:59  world size 3")
    assert lines[-2:] == ["slowest: rank 9: gone", "ended: failed: node 1 (b) torchrun exited 1"]
    unknown = dataclasses.replace(FRAME, elapsed_s=None, world_size=None)
    assert render(unknown).splitlines()[0].endswith("elapsed -  world size -")


def test_times_are_whole_ms_and_a_rank_with_data_time_but_no_compute_has_no_outside():
    from orchestrator.report import top

    assert (top._ms(2.0), top._ms(0.0005), top._ms(None)) == ("2000ms", "0ms", "-")
    row = rank(0, silent=False, data_s=0.002)
    assert (top._outside(row), top._ms(row.data_s)) == (None, "2ms")


def test_a_rank_stepping_at_a_third_of_the_others_rate_is_marked_from_the_window(tmp_path):
    """No times outside collectives: rule 2 on the window's rates names rank 1."""
    window = PaceWindow()
    for at, steps in ((2000.0, (0, 0, 0)), (2005.0, (60, 20, 60))):
        rows = [{"rank": r, "step": s, "last_step_s_ago": 0.0, "last_progress_s_ago": 0.0}
                for r, s in enumerate(steps)]
        frame = build_frame(record(tmp_path, None), rows, window, now=at)
    assert frame.slowest.rank == 1 and frame.slowest.evidence == "step-rate"
    assert [r.rank for r in frame.ranks if r.straggler] == [1]


def test_elapsed_is_to_a_tenth_and_the_gangs_samples_to_a_tenth(tmp_path):
    """A quarter of a second is 0.2 s (to the even tenth); 10 + 0.04
    samples/s is 10.0."""
    assert build_frame(record(tmp_path, None), [], PaceWindow(), now=1000.25).elapsed_s == 0.2
    window = PaceWindow()
    for at, samples in ((2000.0, (0, 0)), (2025.0, (250, 1))):
        rows = [{"rank": r, "step": n, "samples": n, "last_step_s_ago": 0.0,
                 "last_progress_s_ago": 0.0} for r, n in enumerate(samples)]
        frame = build_frame(record(tmp_path, None), rows, window, now=at)
    assert [r.samples_per_s for r in frame.ranks] == [10.0, 0.04]
    assert frame.samples_per_s == 10.0
