"""``status`` and ``top`` of a scheduler's job that no controller follows
(issue #33): each rank's step from the last heartbeat in its node's stream,
``node-K/agent.out`` in the shared run directory, dated by the node's clock."""

from __future__ import annotations

import time

from orchestrator.agent.wire.protocol import Event, encode, message
from orchestrator.backends.scheduler.job import TAIL_BYTES, stream_progress
from orchestrator.records.outcome import RunState
from orchestrator.records.rundir import RunDir
from orchestrator.records.store import NodeRecord, RunRecord


def job(tmp_path, streams: dict[int, bytes]) -> RunRecord:
    nodes = []
    for k, data in streams.items():
        node_dir = tmp_path / f"node-{k}"
        node_dir.mkdir()
        (node_dir / "agent.out").write_bytes(data)
        nodes.append(NodeRecord(node_rank=k, host=f"n{k}", run_dir=str(node_dir),
                                python="python3"))
    return RunRecord(run_id="j", run=RunDir(str(tmp_path / "runs" / "j")),
                     state=RunState.RUNNING, backend="slurm", started=time.time() - 60,
                     wall_s=None, ended=None, controller_pid=None, nodes=tuple(nodes),
                     outcomes=(), root_cause=None)


def beat(now: float, progress: dict) -> bytes:
    return encode(message(Event.HEARTBEAT, progress=progress, now=now))


def test_each_rank_comes_from_the_last_heartbeat_of_its_node_not_an_earlier_one(tmp_path):
    now = 1_800_000_000.0
    node0 = (beat(now - 10, {"0": [5, 0.5], "1": [5, 0.5]}) + b"[rank0]: step 9\n"
             + beat(now, {"0": [12, 1.0, 48, 0.05, 0.001], "1": [11, 2.0]})
             + b"[rank1]: a line after the last heartbeat\n")
    node1 = beat(now, {"2": [12, 0.0, None, 0.15, 0.002]}) + b"::ddp-orch:: {broken\n"
    rows = stream_progress(job(tmp_path, {0: node0, 1: node1}))
    assert [(r["rank"], r["node_rank"], r["host"], r["step"]) for r in rows] == [
        (0, 0, "n0", 12), (1, 0, "n0", 11), (2, 1, "n1", 12)]
    assert rows[0]["last_progress"] == now - 1.0 and rows[0]["samples"] == 48
    assert (rows[0]["compute_s"], rows[0]["data_s"]) == (0.05, 0.001)
    assert "compute_s" not in rows[1] and rows[1]["samples"] is None
    assert rows[2]["compute_s"] == 0.15


def test_a_node_without_a_stream_or_a_heartbeat_gives_no_rows_and_only_the_tail_is_read(
        tmp_path):
    now = time.time()
    old = beat(now, {"0": [3, 0.1]})
    chatter = b"[rank0]: " + b"x" * 200 + b"\n"
    record = job(tmp_path, {0: old + chatter * (TAIL_BYTES // len(chatter) + 10),
                            1: b"[rank1]: no heartbeat yet\n"})
    assert stream_progress(record) == ()  # the heartbeat lies before the tail read


def test_status_of_a_running_job_whose_controller_died_reads_each_rank_from_the_streams(
        tmp_path):
    """An attached job (the scheduler owns it, the controller follows): once
    its controller is gone nobody keeps ``progress.json``, so ``describe``
    reads each rank from its node's stream; while the controller lives, it
    keeps them (no rows here), unless the job is detached."""
    import dataclasses
    import os

    from fakesched import FakeScheduler, FakeState

    from orchestrator.agent.wire.owner import Holder, Owner

    now = time.time()
    record = job(tmp_path, {0: beat(now, {"0": [12, 1.0]}), 1: beat(now, {"1": [11, 2.0]})})
    record = dataclasses.replace(
        record, owner=Owner(Holder.SCHEDULER), controller_pid=None,
        nodes=tuple(dataclasses.replace(n, connection={"testqueue_job": "7"}) for n in record.nodes))
    running = FakeScheduler(states=[FakeState("RUNNING", nodelist="n0,n1")])
    described = running.describe(record)
    assert described.state is RunState.RUNNING
    assert described.detail == "TestQueue job 7: RUNNING on n0,n1"
    assert [(r["rank"], r["step"], r["last_progress"]) for r in described.progress] == [
        (0, 12, now - 1.0), (1, 11, now - 2.0)]
    followed = dataclasses.replace(record, controller_pid=os.getpid())
    assert running.describe(followed).progress == ()
    detached = dataclasses.replace(followed, owner=Owner(Holder.SCHEDULER, detached=True))
    assert [r["rank"] for r in running.describe(detached).progress] == [0, 1]
    queued = FakeScheduler(states=[FakeState("PENDING", reason="Resources")])
    described = queued.describe(record)
    assert (described.state, described.progress) == (RunState.PENDING, ())
    assert described.detail == "TestQueue job 7: PENDING (Resources)"
