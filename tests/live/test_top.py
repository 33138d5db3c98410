"""``ddp-orch top`` on real runs (issue #33): real torchrun, real DDP over
gloo, ranks held back on purpose (``tests/programs/paced_ranks.py``).

The oracle is the program's own construction: rank 2 computes three times
longer per step, or steps at a third of the rate; rank 1 stops reporting
after 4 s; rank 3 never reports. Timings differ run to run, the marks may not.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import sys
import time

import jsonschema
import pytest

from conftest import ROOT, run_cli, start_cli

pytestmark = pytest.mark.live
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


def test_a_rank_that_only_prints_its_steps_is_named_by_its_rate_and_status_shows_them(
        tmp_path):
    """Rule 2 for a program that makes no step report (issue 43): the step
    each rank prints (``rank 2 step 17``) is its step, so the rank at a
    third of the others' rate is named, and ``status`` shows every step."""
    run = up(tmp_path, "printed", "--mode", "free", "--seconds", "20", "--print-only")
    try:
        seen = frames(tmp_path, "printed", lambda fs: any(
            "3.0x slower" in marks(f).get(2, "") for f in fs))
        status = run_cli("status", "printed", "--json", "--runs-dir", str(tmp_path / "runs"))
    finally:
        out = run.communicate(timeout=120)[0]
    assert run.returncode == 0, out
    assert any("3.0x slower" in marks(f).get(2, "") for f in seen), [marks(f) for f in seen]
    assert all(set(marks(f)) <= {2} for f in seen), [marks(f) for f in seen]
    steps = {r["rank"]: r["step"] for r in json.loads(status.stdout)["progress"]}
    assert sorted(steps) == [0, 1, 2, 3] and all(steps.values()), steps


@pytest.mark.parametrize("detach", [False, True], ids=["attached", "detached"])
def test_top_of_a_kept_run_shows_the_attempt_it_is_in_after_a_restart(tmp_path, detach):
    """``--max-restarts 1``: rank 1 raises at step 8 of attempt 0, the gang
    restarts, and while attempt 1 runs ``top`` says attempt 1 (node 0's
    keeper's count when detached, the controller's in ``progress.json`` when
    attached), never attempt 0 again, and its last frame too (issue #43)."""
    from procscan import wait_gone

    run_id = "kept-" + ("det" if detach else "att")
    argv = ("up", "--local", "--procs", "2", "--device", "cpu", "--run-id", run_id,
            "--runs-dir", str(tmp_path / "runs"), "--max-restarts", "1",
            *(("--detach",) if detach else ()), "--", "tests/programs/steps.py", "--steps",
            "40", "--sleep", "0.25", "--fail-rank", "1", "--fail-step", "8")
    started = run_cli(*argv, timeout=120) if detach else start_cli(*argv)
    try:
        seen = frames(tmp_path, run_id, lambda fs: False, timeout=150)  # to the run's end
    finally:
        if not detach:
            out = started.communicate(timeout=120)[0]
            assert started.returncode == 0, out
    attempts = [f["attempt"] for f in seen if f["state"] == "running"]
    assert 1 in attempts and attempts == sorted(attempts), attempts  # 0 ... 0, 1 ... 1
    assert seen[-1]["state"] == "succeeded" and seen[-1]["attempt"] == 1, seen[-1]
    assert wait_gone(run_id, 10) == set()


def test_q_quits_top_on_a_terminal_and_the_run_goes_on(tmp_path):
    """On a terminal ``top`` redraws in place until ``q``: it exits 0 at once,
    and the run it watched is untouched (``down`` ends it after)."""
    # the sleeper (no torch): a run that goes on until it is ended
    started = run_cli("up", "--local", "--procs", "2", "--device", "cpu", "--run-id", "keys",
                      "--runs-dir", str(tmp_path / "runs"), "--detach", "--",
                      "tests/programs/sleeper.py", timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    pid, fd = pty.fork()
    if pid == 0:  # the child: top on the pty's terminal
        os.chdir(ROOT)
        os.execvpe(sys.executable, [sys.executable, "-m", "orchestrator", "top", "keys",
                                    "--interval", "0.5", "--runs-dir", str(tmp_path / "runs")],
                   {**os.environ, "PYTHONPATH": ROOT})
    done = (0, 0)
    try:
        shown, deadline = b"", time.monotonic() + 60
        while shown.count(b"\x1b[H\x1b[2J") < 2 and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                shown += os.read(fd, 65536)
        assert shown.count(b"\x1b[H\x1b[2J") >= 2, shown  # redrawn in place, twice
        os.write(fd, b"q")
        deadline = time.monotonic() + 10
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert done[0] == pid, "top did not quit on q"
        assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        if done[0] != pid:  # not reaped: it never quit
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    status = run_cli("status", "keys", "--runs-dir", str(tmp_path / "runs"), timeout=60)
    assert " running " in status.stdout.splitlines()[1], status.stdout
    assert run_cli("down", "keys", "--runs-dir", str(tmp_path / "runs"),
                   timeout=60).returncode == 0


def test_top_of_a_detached_ssh_run_keeps_one_session_per_node(ssh_lab, tmp_path):
    """A detached run's ranks come from its nodes' keepers: ``top`` asks them
    through one agent per node, kept for its life, not one SSH login per
    refresh. The sshd sessions of the run seen at the 3rd and the 8th frame
    are the same two."""
    from labhome import lab_job
    from procscan import lab_sessions

    env, cluster = lab_job(ssh_lab, tmp_path, "watched", "steps.py",
                           ["{host: node0, procs: 1}", "{host: node1, procs: 1}"],
                           args="{steps: 4000, sleep: 0.1}")
    runs = str(tmp_path / "runs")
    started = run_cli("up", cluster, "--run-id", "watched", "--detach", "--runs-dir", runs,
                      env=env, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    before = lab_sessions(ssh_lab, "watched")  # none: the keepers are daemons
    top = start_cli("top", "watched", "--json", "--interval", "0.5", "--runs-dir", runs,
                    env=env)
    seen, count = [], 0
    try:
        for line in top.stdout:
            if line.startswith("{"):
                count += 1
                if count in (3, 8):
                    seen.append(lab_sessions(ssh_lab, "watched") - before)
                if count == 8:
                    break
    finally:
        os.killpg(top.pid, signal.SIGTERM)
        top.wait(10)
    assert count == 8 and len(seen[0]) >= 2 and seen[0] == seen[1], seen  # two nodes
    assert run_cli("down", "watched", "--runs-dir", runs, env=env, timeout=120).returncode == 0



@pytest.mark.parametrize("owner", ["attached", "kept"])
def test_a_run_shorter_than_a_heartbeat_ends_with_every_ranks_last_step(tmp_path, owner):
    """Ranks that step for 1.5 s, less than a node's heartbeat period (5 s):
    the ended run's ``top`` gives each rank the last step it reported (its
    ``progress/rank-N`` file, as the program's ``ddp_orch_progress`` left
    it) and a mean rate. Steps travelled only in heartbeats, so a run that
    ended between two lost them ("gang: no rate recorded", CI). A detached
    run's ended frame has no ranks: docs/long-runs.md says so."""
    run_id = f"short-{owner}"
    runs = tmp_path / "runs"
    ran = run_cli("up", "--local", "--procs", "2", "--device", "cpu", "--run-id", run_id,
                  "--runs-dir", str(runs), *(("--max-restarts", "1") if owner == "kept" else ()),
                  "--", PROGRAM, "--mode", "free", "--seconds", "1.5", "--slow-rank", "-1",
                  "--compute", "0.1", timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    reported = {rank: int((runs / run_id / "node-0" / "progress" / f"rank-{rank}")
                          .read_text().split()[0]) for rank in (0, 1)}
    printed = {int(rank): int(step) for rank, step in
               re.findall(r"rank (\d) step (\d+)$", ran.stdout, re.M)}  # the last of each
    assert all(0 < reported[rank] <= printed[rank] for rank in (0, 1)), (reported, printed)
    top = run_cli("top", run_id, "--once", "--json", "--runs-dir", str(runs))
    assert top.returncode == 0, top.stdout + top.stderr
    frame = json.loads(top.stdout)
    assert frame["state"] == "succeeded", frame
    assert {r["rank"]: r["step"] for r in frame["ranks"]} == reported, frame
    assert frame["steps_per_s"] > 0, frame
