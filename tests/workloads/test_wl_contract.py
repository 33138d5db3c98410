"""Unit tests of workloads/contract.py: the ranks' heartbeat the hang watchdog reads."""

from __future__ import annotations

import time

from workloads import contract


def test_the_heartbeat_writes_the_ranks_step_at_most_once_a_second(tmp_path, monkeypatch):
    monkeypatch.setenv(contract.RESULT_FILE_ENV, str(tmp_path / "result.json"))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setattr(contract, "_last_heartbeat", [0.0])
    contract.heartbeat(7)
    contract.heartbeat(8)  # within the second: not written
    step, stamp = (tmp_path / "progress" / "rank-3").read_text().split()
    assert step == "7" and abs(float(stamp) - time.time()) < 5
    monkeypatch.delenv(contract.RESULT_FILE_ENV)
    monkeypatch.setattr(contract, "_last_heartbeat", [0.0])
    contract.heartbeat(9)  # not under ddp-orch: nothing happens
    assert (tmp_path / "progress" / "rank-3").read_text().split()[0] == "7"
