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
