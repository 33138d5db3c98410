"""``ddp-orch top`` on real runs (issue #33): real torchrun, real DDP over
gloo, ranks held back on purpose (``tests/programs/paced_ranks.py``).

The oracle is the program's own construction: rank 2 computes three times
longer per step, or steps at a third of the rate; rank 1 stops reporting
after 4 s; rank 3 never reports. Timings differ run to run, the marks may not.
"""

from __future__ import annotations

import json
import os
import signal
import time

import jsonschema

from conftest import ROOT, run_cli, start_cli

PROGRAM = "tests/programs/paced_ranks.py"
with open(os.path.join(ROOT, "schema", "top.schema.json"), encoding="utf-8") as fh:
    SCHEMA = json.load(fh)


def up(tmp_path, run_id: str, *args: str, detach: bool = False):
    argv = ("up", "--local", "--procs", "4", "--device", "cpu", "--run-id", run_id,
            "--runs-dir", str(tmp_path / "runs"), *(("--detach",) if detach else ()),
            "--", PROGRAM, *args)
    return run_cli(*argv, timeout=120) if detach else start_cli(*argv)


def frames(tmp_path, run_id: str, until, timeout: float = 90) -> list[dict]:
    """``top RUN --json --interval 1``'s frames, each checked against the
    schema, until ``until(frames)`` or the run's end (top exits)."""
    recorded = tmp_path / "runs" / run_id / "state.json"
    wait_until = time.monotonic() + 30
    while not recorded.exists() and time.monotonic() < wait_until:  # up has just started
        time.sleep(0.2)
    top = start_cli("top", run_id, "--json", "--interval", "1",
                    "--runs-dir", str(tmp_path / "runs"))
    seen: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        for line in top.stdout:
            if not line.startswith("{"):
                continue
            frame = json.loads(line)
            jsonschema.validate(frame, SCHEMA)
            seen.append(frame)
            if until(seen) or time.monotonic() > deadline:
                break
    finally:
        if top.poll() is None:
            os.killpg(top.pid, signal.SIGTERM)
        top.wait(10)
    return seen


def marks(frame: dict) -> dict[int, str]:
    return {r["rank"]: r["straggler"] for r in frame["ranks"] if r["straggler"]}


def table(frame: dict) -> list[tuple]:
    """What attached and detached frames share: ranks, hosts, GPUs, marks."""
    return [(r["rank"], r["node_rank"], r["host"], r["gpu"], bool(r["straggler"]))
            for r in frame["ranks"]]


def test_the_rank_that_computes_longer_is_named_attached_and_detached_alike(tmp_path):
    """Rule 1 on a DDP gang in lock-step: rank 2 is named within a few
    refreshes, by its time outside collectives, and no other rank ever is;
    a detached run of the same program gives the same frame."""
    attached = up(tmp_path, "att", "--mode", "ddp", "--seconds", "25")
    try:
        seen = frames(tmp_path, "att", lambda fs: bool(marks(fs[-1])) and all(
            r["steps_per_s"] for r in fs[-1]["ranks"]) and len(fs[-1]["ranks"]) == 4)
    finally:
        out = attached.communicate(timeout=120)[0]
    assert attached.returncode == 0, out
    named = [f for f in seen if marks(f)]
    # within a few refreshes of its first step report (every rank reports at once)
    first_report = next(i for i, f in enumerate(seen) if any(r["step"] for r in f["ranks"]))
    assert named and seen.index(named[0]) - first_report <= 3, [marks(f) for f in seen]
    assert all(marks(f).keys() == {2} for f in seen if marks(f)), [marks(f) for f in seen]
    last = seen[-1]
    assert last["slowest"]["rank"] == 2 and last["slowest"]["evidence"] == "outside-collectives"
    rates = [r["steps_per_s"] for r in last["ranks"] if r["steps_per_s"]]
    assert len(rates) == 4 and max(rates) < 1.2 * min(rates), last  # DDP: lock-step

    detached = up(tmp_path, "det", "--mode", "ddp", "--seconds", "25", detach=True)
    assert detached.returncode == 0, detached.stdout + detached.stderr
    det = frames(tmp_path, "det", lambda fs: bool(marks(fs[-1])))
    assert det and det[-1]["owner"].startswith("keepers"), det[-1:]
    assert table(det[-1]) == table(last), (det[-1], last)
    once = run_cli("top", "det", "--once", "--runs-dir", str(tmp_path / "runs"), timeout=60)
    assert once.returncode == 0 and "slowest: rank 2 (node 0, localhost)" in once.stdout, \
        once.stdout + once.stderr
    run_cli("down", "det", "--runs-dir", str(tmp_path / "runs"), timeout=60)


def test_a_slow_free_stepping_rank_a_stopped_rank_and_a_silent_one(tmp_path):
    """Rule 2: ranks that step on their own, rank 2 at a third of the rate;
    rule 3: rank 1 stops reporting after 4 s; rank 3 never reports and is
    shown silent, never marked. top ends with the run, exit 0."""
    run = up(tmp_path, "free", "--mode", "free", "--seconds", "32", "--stop-rank", "1",
             "--silent-rank", "3")
    try:
        seen = frames(tmp_path, "free", lambda fs: False)  # to the run's end
    finally:
        out = run.communicate(timeout=120)[0]
    assert run.returncode == 0, out
    assert seen[-1]["state"] == "succeeded" and seen[-1]["ended"].startswith("succeeded")
    live = [f for f in seen if f["state"] == "running"]
    assert any(marks(f).get(2, "").endswith("steps/s)") and "3.0x slower" in marks(f)[2]
               for f in live), [marks(f) for f in live]
    stopped = [f for f in live if "no progress for" in marks(f).get(1, "")]
    assert stopped, [marks(f) for f in live]
    assert stopped[0]["slowest"]["rank"] == 1  # a stopped rank is named first
    assert all(0 not in marks(f) and 3 not in marks(f) for f in seen), [marks(f) for f in seen]
    assert all(r["silent"] for f in seen for r in f["ranks"] if r["rank"] == 3)
