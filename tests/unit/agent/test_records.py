"""The keeper's record as read back (``agent/kept/records.py``): each rank's
progress is kept whole or dropped with a note, never trusted."""

from orchestrator.agent.kept.records import clean_keeper_state


def test_a_keepers_progress_keeps_only_whole_rank_records_and_notes_the_rest():
    notes: list[str] = []
    kept = clean_keeper_state({"state": "running", "progress": {
        "0": {"step": 7, "last_progress": 1795000000.5},
        "1": {"step": "7", "last_progress": 1795000000.5},
        "2": {"step": 3, "last_progress": 1e300},
        "3": {"step": True, "last_progress": 1795000000.5},
        "x": {"step": 1, "last_progress": 1795000000.5},
        "4": [1, 2]}}, notes)
    assert kept == {"state": "running",
                    "progress": {"0": {"step": 7, "last_progress": 1795000000.5}}}
    assert len([n for n in notes if "lacks" in n]) == 3 and len(notes) == 8, notes


def test_a_keepers_progress_that_is_not_a_mapping_is_dropped():
    notes: list[str] = []
    assert clean_keeper_state({"progress": [1]}, notes) == {} and len(notes) == 1
