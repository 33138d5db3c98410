"""Unit tests of records/runsdir.py: finding the runs directory."""

from __future__ import annotations

from orchestrator.records.runsdir import locate


def test_a_runs_directory_from_before_the_marker_is_found_by_its_runs(tmp_path):
    old = tmp_path / "runs" / "old-run"
    old.mkdir(parents=True)
    (old / "state.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "runs").mkdir()  # a runs/ of someone else's: no marker, no runs
    found = locate(None, cwd=str(tmp_path / "sub"), env={"HOME": str(tmp_path)})
    assert found.path == str(tmp_path / "runs")
