"""The edges of a scheduler's job as the gang sees it
(``backends/scheduler/job.py``) that ``test_slurm_plan.py``,
``test_channel.py`` and ``test_stream_progress.py`` leave open: asking the
scheduler (its failures, the poller), cancelling once per kind, waiting
for the end, a node stream read as it grows, and the last heartbeat of a
stream. A fake clock stands for time where a wait is measured; every
expected value is worked out by hand."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from fakesched import Clock, FakeScheduler, FakeState, fake_time
from orchestrator.agent.wire.protocol import Event, encode, message
from orchestrator.backends.scheduler import job as jobmod
from orchestrator.backends.scheduler.job import TAIL_BYTES, Job, JobStream, stream_progress
from orchestrator.engine.nodestate import LOST
from orchestrator.errors import OrchestratorError
from orchestrator.records.outcome import RunState
from orchestrator.records.rundir import RunDir
from orchestrator.records.store import NodeRecord, RunRecord

RUNNING, DONE = FakeState("RUNNING"), FakeState("COMPLETED")


@pytest.fixture
def clock(monkeypatch) -> Clock:
    return fake_time(monkeypatch, jobmod)


# -- asking the scheduler ----------------------------------------------------------------------

def test_a_new_job_knows_nothing_yet_and_asks_at_once_unless_told_not_to():
    quiet = Job("7", FakeScheduler(states=[RUNNING]), poll=False)
    assert (quiet.state, quiet.gone, quiet.error, quiet.failing_for) == (None, False, "", 0.0)
    assert not quiet.ended and not quiet.cancelled
    quiet.close()
    polled = Job("7", FakeScheduler(states=[RUNNING]))  # polls by default
    try:
        assert polled.state == RUNNING
        assert polled._thread.daemon and polled._thread.name == "job-7"
    finally:
        polled.close()


def test_the_poller_asks_again_and_again_until_closed(monkeypatch):
    monkeypatch.setattr(jobmod, "STATE_POLL_S", 0.01)
    backend = FakeScheduler(states=[FakeState("PENDING"), FakeState("PENDING"), RUNNING])
    job = Job("7", backend)
    try:
        deadline = time.monotonic() + 5
        while job.state != RUNNING and time.monotonic() < deadline:
            time.sleep(0.01)
        assert job.state == RUNNING
    finally:
        job.close()
    job._thread.join(5)
    assert not job._thread.is_alive()


def test_failures_to_ask_are_counted_from_the_first_and_cleared_by_an_answer(clock):
    backend = FakeScheduler(states=[OrchestratorError("squeue: timed out"),
                                    OrchestratorError("squeue: refused"), RUNNING, None])
    job = Job("7", backend, poll=False)
    assert job.refresh() is None and job.error == "squeue: timed out"
    clock.sleep(5.0)
    job.refresh()
    assert (job.error, job.failing_for) == ("squeue: refused", 5.0)
    assert job.refresh() == RUNNING and (job.error, job.failing_for) == ("", 0.0)
    assert job.refresh() is None and job.gone and job.state == RUNNING  # its last listing kept
    assert job.ended


def test_a_job_listed_as_over_has_ended():
    job = Job("7", FakeScheduler(states=[DONE]), poll=False)
    assert job.refresh() == DONE and job.ended and not job.gone
    assert job.scheduler.asked == [("state", "7")]


# -- cancel and the end ----------------------------------------------------------------------------

def test_a_cancel_is_sent_once_per_kind_and_a_plain_one_is_term():
    backend = FakeScheduler(states=[RUNNING])
    job = Job("7", backend, poll=False)
    job.cancel()
    job.cancel("TERM")  # the plain cancel is the TERM one
    job.cancel("KILL")
    job.cancel("KILL")
    assert backend.cancels == [("7", None), ("7", "KILL")] and job.cancelled
    over = Job("8", FakeScheduler(states=[DONE]), poll=False)
    over.refresh()
    over.cancel()
    assert over.scheduler.cancels == []  # nothing left to cancel


def test_waiting_for_the_end_looks_at_once_then_soon_then_every_tenth_of_a_second(clock):
    """The wait is asked as the last agent exits, and the job leaves the queue
    a few ms later: the second look comes 20 ms after the first (not 0.1 s,
    which every launch would pay), the pauses double to 0.1 s, and the
    timeout is kept to the ms."""
    backend = FakeScheduler(states=[RUNNING])
    job = Job("7", backend, poll=False)
    assert job.wait_ended(1.0) is False and clock.now == pytest.approx(1001.0)
    assert len(backend.asked) == 13  # at 0, .02, .06, .14, then every 0.1 s, and at 1.0
    clock.now = 1000.0
    job = Job("7", FakeScheduler(states=[RUNNING, RUNNING, DONE]), poll=False)
    assert job.wait_ended(1.0) is True and clock.now == pytest.approx(1000.06)  # third look
    assert job.wait_ended(1.0) is True and clock.now == pytest.approx(1000.06)  # over: no look
    ended = Job("7", FakeScheduler(states=[DONE]), poll=False)
    assert ended.wait_ended(1.0) is True and clock.now == pytest.approx(1000.06)  # gone at once


def test_a_streams_wait_is_the_jobs_and_its_end_is_lost_without_a_word(clock):
    stream = JobStream("/nowhere", Job("7", FakeScheduler(states=[RUNNING]), poll=False), "n1")
    assert stream.poll() is None
    with pytest.raises(TimeoutError, match="^job 7 still runs$"):
        stream.wait(0.5)
    ended = JobStream("/nowhere", Job("7", FakeScheduler(states=[DONE]), poll=False), "n1")
    assert ended.wait(0.5) == LOST and ended.poll() == LOST


# -- a node's stream ------------------------------------------------------------------------------

def test_a_stream_is_read_in_chunks_of_the_size_asked_and_knows_when_it_was_seen(tmp_path):
    path = tmp_path / "agent.out"
    stream = JobStream(str(path), Job("7", FakeScheduler(), poll=False), "n1")
    assert (stream.host, stream.seen, stream.offset, stream._closed) == ("n1", False, 0, False)
    assert stream._read(3) == b"" and stream.seen is False  # not there yet
    path.write_bytes(b"abcdef")
    assert stream.read_chunk(4) == b"abcd" and stream.seen is True
    assert stream.read_chunk(4) == b"ef" and stream.offset == 6


def test_an_ended_jobs_stream_waits_settle_s_of_quiet_then_ends(tmp_path, clock, monkeypatch):
    """Looks every POLL_S (1/8 s here); quiet for more than SETTLE_S (1/2 s)
    after the job ended: the end, at the fifth look."""
    monkeypatch.setattr(jobmod, "POLL_S", 0.125)
    monkeypatch.setattr(jobmod, "SETTLE_S", 0.5)
    job = Job("7", FakeScheduler(states=[DONE]), poll=False)
    job.refresh()
    stream = JobStream(str(tmp_path / "agent.out"), job, "n1")
    assert stream.read_chunk(10) == b"" and clock.now == 1000.625


def test_a_stream_that_just_gave_lines_is_looked_at_again_soon(tmp_path, clock):
    """A node's exit event comes a few ms after its last lines: after data
    the pauses are 10, 20 and 40 ms, then POLL_S (50 ms) while it stays
    quiet, and soon again after the next data."""
    path = tmp_path / "agent.out"
    path.write_bytes(b"last line\n")
    stream = JobStream(str(path), Job("7", FakeScheduler(states=[RUNNING]), poll=False), "n1")
    looks = []

    def write_after(n: int, data: bytes):
        def on_sleep():
            looks.append(clock.now)
            if len(looks) == n:
                with open(path, "ab") as fh:
                    fh.write(data)
        return on_sleep

    assert stream.read_chunk(64) == b"last line\n" and clock.now == 1000.0  # there: no pause
    clock.on_sleep = write_after(6, b"exit\n")
    assert stream.read_chunk(64) == b"exit\n"
    assert looks == [1000.01, 1000.03, 1000.07, 1000.12, 1000.17, 1000.22]
    looks.clear()
    clock.on_sleep = write_after(2, b"more\n")
    assert stream.read_chunk(64) == b"more\n"
    assert looks == [1000.23, 1000.25]


# -- the last heartbeat of a stream --------------------------------------------------------------

def node_record(where: Path, k: int, data: bytes) -> NodeRecord:
    (where / f"node-{k}").mkdir()
    (where / f"node-{k}" / "agent.out").write_bytes(data)
    return NodeRecord(k, f"n{k}", str(where / f"node-{k}"), "python3")


def progress_of(tmp_path, *streams: bytes) -> tuple[dict, ...]:
    where = Path(tempfile.mkdtemp(dir=tmp_path))
    nodes = tuple(node_record(where, k, data) for k, data in enumerate(streams))
    record = RunRecord(run_id="j", run=RunDir(str(tmp_path / "runs" / "j")),
                       state=RunState.RUNNING, backend="testqueue", started=1.0, wall_s=None,
                       ended=None, controller_pid=None, nodes=nodes, outcomes=(),
                       root_cause=None)
    return stream_progress(record)


def beat(progress, **more) -> bytes:
    return encode(message(Event.HEARTBEAT, progress=progress, **more))


def test_each_good_entry_of_the_last_heartbeat_is_a_row_and_the_bad_ones_are_skipped(tmp_path):
    progress = {"x": [1, 0.0], "-1": [1, 0.0], "0": "bad", "1": [2.5, 0.0], "2": ["5", 0.0],
                "3": [None, 2.0], "4": [12, 1.0, 48, 0.25, 0.0]}
    rows = progress_of(tmp_path, beat(progress, now=2000.0))
    assert rows == (
        {"rank": 3, "node_rank": 0, "host": "n0", "step": None, "samples": None,
         "last_progress": 1998.0, "last_step": 1998.0, "last_output": None},
        {"rank": 4, "node_rank": 0, "host": "n0", "step": 12, "samples": 48,
         "last_progress": 1999.0, "last_step": 1999.0, "last_output": None,
         "compute_s": 0.25, "data_s": 0.0})


def test_a_heartbeat_without_the_nodes_time_gives_no_times(tmp_path):
    rows = progress_of(tmp_path, beat({"0": [3, 1.0]}))
    assert [(r["step"], r["last_progress"], r["last_step"]) for r in rows] == [(3, None, None)]


def test_at_most_4096_ranks_of_a_heartbeat_are_read(tmp_path):
    rows = progress_of(tmp_path, beat({str(r): [1, 0.0] for r in range(4097)}, now=5.0))
    assert len(rows) == 4096 and rows[-1]["rank"] == 4095


def test_a_broken_heartbeat_line_after_the_last_good_one_is_passed_over(tmp_path):
    broken = b'::ddp-orch:: {"event": "heartbeat", "progress": \n'
    rows = progress_of(tmp_path, beat({"0": [7, 0.0]}, now=5.0) + broken)
    assert [r["step"] for r in rows] == [7]


def test_the_tail_read_reaches_back_exactly_tail_bytes(tmp_path):
    """A stream of exactly TAIL_BYTES whose first line is the heartbeat:
    read whole, from its first byte."""
    first = beat({"0": [9, 0.0]}, now=5.0)
    filler = b"x" * (TAIL_BYTES - len(first) - 1) + b"\n"
    assert len(first + filler) == TAIL_BYTES
    assert [r["step"] for r in progress_of(tmp_path, first + filler)] == [9]
    # one byte more, and the heartbeat's first byte falls out of the tail
    assert progress_of(tmp_path, first + filler + b"y") == ()
