"""The flight recorder's dumps read back (``report/flightrec.py``): which
rank, and which collective by its sequence number, was missing.

``flightrec/gloo_rank_{0,1}`` are real dumps, written by torch 2.14.1's
``torch._C._distributed_c10d._dump_fr_trace()`` in a 2-rank gloo job
(``TORCH_FR_BUFFER_SIZE=100``) where both ranks ran three all_reduces and
rank 0 issued a fourth (async) that rank 1 never did. The NCCL-shaped ones
are built here with the fields torch's writer gives each entry.
"""

from __future__ import annotations

import os
import pickle

import pytest

from orchestrator.report.flightrec import missing_collective, read_dump, read_run
from orchestrator.report.summary import flight_recorder_lines

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flightrec")


def real(rank: int) -> bytes:
    with open(os.path.join(HERE, f"gloo_rank_{rank}"), "rb") as fh:
        return fh.read()


def test_a_real_dump_is_read_and_names_the_rank_and_collective_that_was_missing():
    dumps = {0: read_dump(real(0)), 1: read_dump(real(1))}
    assert dumps[0]["pg_status"]["0"]["last_enqueued_collective"] == 4
    assert [e["profiling_name"] for e in dumps[0]["entries"]] == ["gloo:all_reduce"] * 4
    assert missing_collective(dumps, 2) == [
        "rank 1 never issued collective #4 (gloo:all_reduce) of process group 0 (default_pg), "
        "which rank 0 issued"]


class Evil:
    def __reduce__(self):
        return (os.system, ("true",))


@pytest.mark.parametrize("data", [
    pickle.dumps(Evil()), pickle.dumps({"entries": [Evil()]}), b"not a pickle",
    pickle.dumps(["a list"]), pickle.dumps({"version": "2.10"}), real(0)[:200],
])
def test_what_is_not_a_plain_dump_is_not_read_and_builds_no_object(data):
    """A dump crossed from a node: a pickle that names a class (os.system
    here) is refused before anything is called."""
    assert read_dump(data) is None


def entry(seq: int, state: str, name: str = "nccl:all_reduce", pg: int = 0) -> dict:
    return {"record_id": seq, "pg_id": pg, "process_group": (str(pg), "default_pg"),
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": name,
            "state": state, "is_p2p": False, "retired": state == "completed",
            "time_created_ns": seq}


def dump(*entries: dict) -> dict:
    return {"version": "2.4", "pg_config": {}, "entries": list(entries)}


def test_a_collective_every_rank_issued_and_none_completed_hangs_inside_it():
    dumps = {r: dump(entry(1, "completed"), entry(2, "started")) for r in range(4)}
    assert missing_collective(dumps, 4) == [
        "collective #2 (nccl:all_reduce) of process group 0 (default_pg) was issued by every "
        "rank that dumped and completed on none: it hangs inside the collective (the network "
        "between the nodes, or P2P within one)"]


def test_ranks_behind_are_named_in_ranges_and_silent_ranks_said():
    ahead = dump(entry(1, "completed"), entry(2, "completed"), entry(3, "started",
                                                                    "nccl:allgather"))
    behind = dump(entry(1, "completed"), entry(2, "completed"))
    dumps = {0: ahead, 1: behind, 2: behind, 3: ahead, 5: ahead, 6: None}
    assert missing_collective(dumps, 7) == [
        "ranks 1-2 never issued collective #3 (nccl:allgather) of process group 0 "
        "(default_pg), which ranks 0, 3, 5 issued",
        "ranks 4, 6 left no readable dump (gone, or never in a process group)"]
    assert missing_collective({r: dump(entry(1, "completed")) for r in range(2)}, 2) == []


def test_the_summary_reads_the_dumps_that_came_home(tmp_path):
    for rank in (0, 1):
        node = tmp_path / "nccl_trace" / f"node-{rank}"
        node.mkdir(parents=True)
        (node / f"rank-{rank}").write_bytes(real(rank))
    assert set(read_run(str(tmp_path))) == {0, 1}
    assert flight_recorder_lines(str(tmp_path), {"world_size": 2}) == [
        "flight recorder: rank 1 never issued collective #4 (gloo:all_reduce) of process group "
        "0 (default_pg), which rank 0 issued",
        f"flight recorder dumps: {tmp_path}/nccl_trace/"]
    assert flight_recorder_lines(str(tmp_path / "none"), {}) == []
