"""The run directory names each of a run's records once and reads it back
(``RunDir.plan()``, ``state()``, ``result()``, ``progress()``, ``outputs()``)."""

from __future__ import annotations

import errno
import os

import pytest

from orchestrator.records import rundir as rundir_module
from orchestrator.records.rundir import RunDir
from orchestrator.records.store import read_record, write_state
from orchestrator.records.outcome import RunState


def test_each_record_reads_back_what_was_written_under_its_one_name(tmp_path):
    run = RunDir.create(str(tmp_path / "runs"), "r1")
    assert (run.plan(), run.state(), run.result(), run.progress(), run.outputs()) == \
        (None, None, None, None, None)  # nothing yet: None, never an error
    run.write_plan({"run_id": "r1"})
    run.write_progress({"ranks": {}})
    run.write_outputs({"files": []})
    with open(run.result_file(), "w", encoding="utf-8") as fh:
        fh.write('{"world_size": 2}')
    assert run.plan() == {"run_id": "r1"} and run.progress() == {"ranks": {}}
    assert run.outputs() == {"files": []} and run.result() == {"world_size": 2}
    assert sorted(os.listdir(run.path)) == [".reserve", "outputs.json", "plan.json",
                                             "progress.json", "result.json"]


def test_the_last_state_is_recorded_on_a_full_disk_in_the_room_kept_for_it(tmp_path,
                                                                            monkeypatch):
    """A run that filled its runs directory (its node logs) still records
    its end: state.json is written in the room ``.reserve`` kept, once."""
    run = RunDir.create(str(tmp_path / "runs"), "r9")
    assert os.path.getsize(run.file(".reserve")) == 256 << 10
    real = rundir_module.write_atomically
    full = {"on": True}

    def write(path, data, mode):
        if full["on"] and os.path.exists(run.file(".reserve")):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, mode)

    monkeypatch.setattr(rundir_module, "write_atomically", write)
    run.write_state({"state": "failed"})
    assert run.state() == {"state": "failed"} and not os.path.exists(run.file(".reserve"))
    with pytest.raises(OSError):  # no room kept any more: said, not hidden
        monkeypatch.setattr(rundir_module, "write_atomically",
                            lambda path, data, mode: (_ for _ in ()).throw(
                                OSError(errno.ENOSPC, "No space left on device")))
        run.write_state({"state": "succeeded"})


def test_the_store_keeps_the_runs_state_in_the_state_record(tmp_path):
    run = RunDir.create(str(tmp_path / "runs"), "r2")
    write_state(run, run_id="r2", backend="local", state=RunState.RUNNING, started=1.0,
                nodes=[])
    assert run.state()["run_id"] == "r2" and os.path.isfile(run.state_file())
    assert read_record(run).run_id == "r2"


def test_an_unreadable_record_is_none(tmp_path):
    run = RunDir.create(str(tmp_path / "runs"), "r3")
    with open(run.file("plan.json"), "w", encoding="utf-8") as fh:
        fh.write("{not json")
    assert run.plan() is None
