"""Unit tests of agent/kept/records.py: bad attempt and keeper records are
cleaned, never raised on."""

from __future__ import annotations

from orchestrator.agent.kept.records import clean_attempts, clean_keeper_state
from orchestrator.engine.keptgang import attempt_outcomes
from noderecords import GOOD_PART


def _plan(n: int):
    from orchestrator.config.loader import load_cluster_text
    from orchestrator.plan.build import build_plan

    nodes = "".join("  - {host: localhost, procs: 1}\n" for _ in range(n))
    return build_plan(load_cluster_text(f"nodes:\n{nodes}workload: {{name: linear}}\n"),
                      run_id="r", local_run_dir="/tmp/r")


def test_bad_attempt_records_are_dropped_with_a_note_and_never_raise():
    recorded = [
        "junk",
        {"attempt": "zero", "master_port": 10 ** 9, "state": "failed", "no_restart": 3,
         "nodes": {"0": dict(GOOD_PART), "1": {**GOOD_PART, "code": "1"},
                   "x": dict(GOOD_PART)}},
        {"attempt": 1, "master_port": 29500, "state": "failed", "restart": "",
         "nodes": {"0": {"lost": 5}, "1": {**GOOD_PART, "failures": [{"local_rank": "a"}]},
                   "2": {**GOOD_PART, "stop_asked": "yes"}}},
        {"attempt": 2, "state": "succeeded", "nodes": ["not", "a", "mapping"]},
    ]
    notes: list[str] = []
    cleaned = clean_attempts(recorded, notes)
    assert len(cleaned) == 3
    assert "attempt" not in cleaned[0] and "master_port" not in cleaned[0]
    assert set(cleaned[0]["nodes"]) == {"0"} and set(cleaned[1]["nodes"]) == {"2"}
    assert "stop_asked" not in cleaned[1]["nodes"]["2"] and cleaned[2]["nodes"] == {}
    assert len(notes) == 10, notes
    assert any("'master_port'" in n for n in notes) and any("node 'x'" in n for n in notes)
    outcomes = attempt_outcomes(_plan(3), recorded)  # never raises
    assert [a.attempt for a, _ in outcomes] == [0, 1, 2]
    assert [str(n.state) for n in outcomes[0][1]] == ["failed", "lost", "lost"]


def test_a_bad_keeper_record_keeps_only_its_good_fields():
    notes: list[str] = []
    kept = clean_keeper_state({"pid": "12", "state": "failed", "code": "1", "updated": 1e300,
                               "attempt": -1, "attempts": {"a": 1}}, notes)
    assert kept == {"state": "failed"}
    assert len(notes) == 5
    assert clean_keeper_state([1, 2], notes) is None and clean_keeper_state(None, notes) is None


def test_a_keepers_progress_keeps_each_ranks_gpu_only_whole():
    from orchestrator.agent.kept.records import clean_progress

    notes: list[str] = []
    cleaned = clean_progress({
        "0": {"step": 7, "last_progress": 1e9, "gpu": 3, "gpu_util": 97, "gpu_mem_mib": 4000},
        "1": {"step": None, "last_progress": None, "gpu": 4, "gpu_util": None,
              "gpu_mem_mib": 10},  # a GPU, no step heartbeat
        "2": {"step": 7, "last_progress": 1e9, "gpu": 5, "gpu_util": 250, "gpu_mem_mib": 1},
        "3": {"step": 7, "last_progress": 1e9, "gpu": 6},
    }, notes)
    assert cleaned == {
        "0": {"step": 7, "last_progress": 1e9, "gpu": 3, "gpu_util": 97, "gpu_mem_mib": 4000},
        "1": {"step": None, "last_progress": None, "gpu": 4, "gpu_util": None,
              "gpu_mem_mib": 10},
        "2": {"step": 7, "last_progress": 1e9}, "3": {"step": 7, "last_progress": 1e9}}
    assert notes == ["ignored the keeper's progress of rank '2''s 'gpu_util': 250"]


def test_a_keepers_progress_keeps_a_ranks_good_samples_and_drops_a_bad_one_with_a_note():
    from orchestrator.agent.kept.records import clean_progress

    notes: list[str] = []
    cleaned = clean_progress({
        "0": {"step": 40, "last_progress": 1e9, "samples": 1280},
        "1": {"step": 40, "last_progress": 1e9, "samples": None},  # its heartbeat says none
        "2": {"step": 40, "last_progress": 1e9, "samples": -3},
        "3": {"step": 40, "last_progress": 1e9, "samples": True},
        "4": {"step": 40, "last_progress": 1e9, "samples": "1280"},
        "5": {"step": 40, "last_progress": 1e9},  # an older keeper's record
    }, notes)
    assert cleaned == {
        "0": {"step": 40, "last_progress": 1e9, "samples": 1280},
        "1": {"step": 40, "last_progress": 1e9, "samples": None},
        **{rank: {"step": 40, "last_progress": 1e9} for rank in "2345"}}
    assert notes == ["ignored the keeper's progress of rank '2''s 'samples': -3",
                     "ignored the keeper's progress of rank '3''s 'samples': True",
                     "ignored the keeper's progress of rank '4''s 'samples': '1280'"]


def test_each_rank_of_a_kept_node_is_given_its_gpu_from_a_sample():
    from types import SimpleNamespace

    from orchestrator.agent.kept.keeper import _rank_gpus

    sup = SimpleNamespace(spec=SimpleNamespace(env={"CUDA_VISIBLE_DEVICES": "5,2"},
                                               first_rank=3, nproc=2))
    assert _rank_gpus(sup, {"2": [90, 100], "5": [None, 7], "0": [1, 1]}) == {
        "3": {"gpu": 5, "gpu_util": None, "gpu_mem_mib": 7},
        "4": {"gpu": 2, "gpu_util": 90, "gpu_mem_mib": 100}}
    assert _rank_gpus(sup, None) == {}
