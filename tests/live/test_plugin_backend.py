"""A backend from outside the tree, end to end: ``tests/plugins/testqueue``.

It is a distribution on ``PYTHONPATH`` (never installed into the venv, so
visible to these tests alone) whose ``ddp_orch.backends`` entry point names
a scheduler backend that fills the scheduler base with a queue in a
directory (``ddp_orch_testqueue``): its jobs wait while held (PENDING),
then run one node agent per node on this machine with its placement
variables set. Through it: the dry-run, PENDING in ``ps``, the output
streamed, the first failure stopping every node, ``down``, ``status``,
``--detach`` and ``attach``. And what a broken or outdated plugin does: it
breaks neither ``--help`` nor ``ps``, and is named when it is used.

The ranks run ``tests/programs/rank_exit.py`` (no torch): the gang and the
queue are the subject, not a rank.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from conftest import ROOT, run_cli, start_cli

PLUGIN = os.path.join(ROOT, "tests", "plugins", "testqueue")
PROGRAM = os.path.join(ROOT, "tests", "programs", "rank_exit.py")

pytestmark = pytest.mark.live


def queue_env(tmp_path, *more: str) -> dict[str, str]:
    """The plugin on PYTHONPATH (and any ``more``), the queue's directory."""
    return {"PYTHONPATH": os.pathsep.join([ROOT, PLUGIN, *more]),
            "TESTQUEUE_DIR": str(tmp_path / "queue")}


def cluster(tmp_path, *args: str, name: str = "tq", block: str = "") -> str:
    """A cluster file for the plugin; ``block``: its own top-level block's lines."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nbackend: testqueue\n{block}python: {sys.executable}\n"
                    "master: {addr: 127.0.0.1}\n"
                    "nodes: [{host: tq0, procs: 1}, {host: tq1, procs: 1}]\n"
                    f"workload: {{script: {PROGRAM}, args: {json.dumps(list(args))}}}\n")
    return str(path)


def queued(tmp_path, job: str = "1") -> dict:
    with open(tmp_path / "queue" / job / "state.json", encoding="utf-8") as fh:
        return json.load(fh)


def wait_state(tmp_path, states: tuple[str, ...], job: str = "1", timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = queued(tmp_path, job)
            if state["state"] in states:
                return state
        except (FileNotFoundError, ValueError):
            pass
        assert time.monotonic() < deadline, f"job {job} never reached {states}"
        time.sleep(0.1)


def status(tmp_path, run_id: str, env: dict) -> dict:
    done = run_cli("status", run_id, "--json", "--runs-dir", str(tmp_path / "runs"), env=env)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def test_the_plugin_is_listed_and_planned_only_where_it_is_installed(tmp_path):
    env = queue_env(tmp_path)
    listed = run_cli("backends", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "testqueue  ddp-orch-testqueue 0.1 (ddp_orch_testqueue:Backend)" in listed.stdout
    assert "a run is its scheduler's job (the test queue keeps the job)" in listed.stdout
    dry = run_cli("up", cluster(tmp_path), "--dry-run", "--run-id", "tq-dry", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "owner      scheduler: the test queue keeps the job; Ctrl-C on `up` cancels it" \
        in dry.stdout.splitlines()
    assert "node 1  tq1  rank 1 (1 process, TestQueue task on node tq1)" in dry.stdout
    assert "--master-port '<free port on testqueue node 0>'" in dry.stdout
    schema = json.loads(run_cli("schema", env=env).stdout)
    assert schema["properties"]["backend"]["enum"] == ["local", "ssh", "slurm", "testqueue"]
    # its own block of the cluster file: in the schema, and checked by the loader
    assert schema["properties"]["testqueue"] == {"$ref": "#/$defs/testqueue"}
    assert schema["$defs"]["testqueue"]["properties"]["hold"]["type"] == "boolean"
    for block, said in [("testqueue: {hold: 3}\n", "hold is 3: true or false"),
                        ("testqueue: {hol: true}\n", "did you mean 'hold'")]:
        bad = run_cli("up", cluster(tmp_path, block=block), "--dry-run", env=env)
        assert bad.returncode == 2 and said in bad.stderr, bad.stderr
    held = run_cli("up", cluster(tmp_path, block="testqueue: {hold: true}\n"), "--dry-run",
                   env=env)
    assert held.returncode == 0, held.stderr
    # Without the distribution on the path there is no such backend: said, exit 2.
    bare = run_cli("backends")
    assert "testqueue" not in bare.stdout
    unknown = run_cli("up", cluster(tmp_path), "--dry-run")
    assert unknown.returncode == 2 and "'testqueue' is not one of local, ssh, slurm" \
        in unknown.stderr, unknown.stderr
    stray = tmp_path / "stray.yaml"  # a plugin's block, with no plugin to read it
    stray.write_text("testqueue: {hold: true}\nnodes: [{host: a, procs: 1}]\n"
                     "workload: {name: noop}\n")
    unread = run_cli("up", str(stray), "--dry-run")
    assert unread.returncode == 2 and "testqueue" in unread.stderr, unread.stderr
    assert "Traceback" not in unknown.stderr


def test_a_broken_or_outdated_plugin_breaks_nothing_until_it_is_named(tmp_path):
    """Entry points load only when a backend is named: `--help`, `ps` and a
    local dry-run never touch them. Named, each fault is one clear line."""
    broken = tmp_path / "broken"
    (broken / "ddp_orch_broken-1.0.dist-info").mkdir(parents=True)
    (broken / "ddp_orch_broken-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: ddp-orch-broken\nVersion: 1.0\n")
    (broken / "ddp_orch_broken-1.0.dist-info" / "entry_points.txt").write_text(
        "[ddp_orch.backends]\nbroken = ddp_orch_no_such_module:Backend\n"
        "oldqueue = ddp_orch_oldqueue:Backend\n")
    (broken / "ddp_orch_oldqueue.py").write_text(
        "from ddp_orch_testqueue import Backend as Queue\n\n\n"
        "class Backend(Queue):\n    name = 'oldqueue'\n    interface = 0\n")
    env = queue_env(tmp_path, str(broken))
    for argv in (["--help"], ["ps", "--runs-dir", str(tmp_path / "runs")],
                 ["up", "--local", "--workload", "noop", "--dry-run"]):
        done = run_cli(*argv, env=env)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (argv, done.stderr)
    listed = run_cli("backends", env=env)
    assert listed.returncode == 0 and "testqueue  ddp-orch-testqueue 0.1" in listed.stdout
    assert "backend 'broken' (ddp-orch-broken 1.0 (ddp_orch_no_such_module:Backend)) could " \
           "not be loaded: ModuleNotFoundError" in listed.stdout, listed.stdout
    for name, said in [("broken", "could not be loaded: ModuleNotFoundError"),
                       ("oldqueue", "was built for backend interface 0; this ddp-orch has "
                                    "interface 2")]:
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"backend: {name}\nnodes: [{{host: a, procs: 1}}]\n"
                        "workload: {name: noop}\n")
        done = run_cli("up", str(path), "--dry-run", env=env)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_a_queued_job_is_pending_then_streams_its_output_and_succeeds(tmp_path):
    env = queue_env(tmp_path)
    runs = str(tmp_path / "runs")
    # the plugin's own block of the cluster file holds the job
    up = start_cli("up", cluster(tmp_path, "--seconds", "1", block="testqueue: {hold: true}\n"),
                   "--run-id", "tq-ok",
                   "--runs-dir", runs, env=env)
    try:
        wait_state(tmp_path, ("PENDING",))
        deadline = time.monotonic() + 30
        while True:  # recorded as pending once submitted: ps and status say so
            ps = json.loads(run_cli("ps", "--json", "--runs-dir", runs, env=env).stdout)
            if ps["runs"] and ps["runs"][0]["state"] == "pending":
                break
            assert time.monotonic() < deadline, ps
            time.sleep(0.2)
        held = status(tmp_path, "tq-ok", env)
        assert held["owner"] == {"holder": "scheduler", "detached": False}
        assert held["detail"] == "TestQueue job 1: PENDING (Held)"
        os.unlink(tmp_path / "queue" / "1" / "hold")  # the queue lets it run
        out, _ = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, out
    assert "ddp-orch: TestQueue job 1 pending (Held)" in out
    for rank in (0, 1):
        assert f"[node{rank} tq{rank}] [rank{rank}]: rank {rank} done" in out
    assert "run tq-ok: SUCCEEDED" in out
    assert queued(tmp_path)["state"] == "COMPLETED"
    assert status(tmp_path, "tq-ok", env)["state"] == "succeeded"


def test_the_first_failure_stops_every_node_through_the_queues_cancel(tmp_path):
    env = queue_env(tmp_path)
    started = time.monotonic()
    done = run_cli("up", cluster(tmp_path, "--fail-rank", "1", "--seconds", "120"),
                   "--run-id", "tq-fail", "--runs-dir", str(tmp_path / "runs"), env=env,
                   timeout=180)
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 90  # not rank 0's 120 s
    assert "root cause: node 1 (tq1)" in done.stdout + done.stderr
    assert queued(tmp_path)["state"] == "CANCELLED"  # the gang's stop was the queue's cancel
    ended = status(tmp_path, "tq-fail", env)
    assert ended["state"] == "failed"
    assert [n["state"] for n in ended["nodes"]] == ["stopped", "failed"]


def test_detach_then_status_attach_and_down(tmp_path):
    env = queue_env(tmp_path)
    runs = str(tmp_path / "runs")
    left = run_cli("up", cluster(tmp_path, "--seconds", "6"), "--detach", "--run-id", "tq-det",
                   "--runs-dir", runs, env=env)
    assert left.returncode == 0, left.stderr
    assert queued(tmp_path)["state"] == "RUNNING"  # up left once every node ran
    live = status(tmp_path, "tq-det", env)
    assert (live["state"], live["owner"]) == ("running", {"holder": "scheduler",
                                                          "detached": True})
    followed = run_cli("attach", "tq-det", "--runs-dir", runs, env=env, timeout=120)
    assert followed.returncode == 0, followed.stderr
    assert "run tq-det: SUCCEEDED" in followed.stdout
    # down: a job still waiting in the queue is cancelled there
    held = cluster(tmp_path, name="held", block="testqueue: {hold: true}\n")
    left = start_cli("up", held, "--detach", "--run-id", "tq-down",
                     "--runs-dir", runs, env=env)  # waits in the queue: nothing runs yet
    try:
        wait_state(tmp_path, ("PENDING",), job="2")
        deadline = time.monotonic() + 30
        while status(tmp_path, "tq-down", env)["state"] != "pending":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        down = run_cli("down", "tq-down", "--runs-dir", runs, env=env, timeout=120)
        assert down.returncode == 0, down.stderr
        assert wait_state(tmp_path, ("CANCELLED",), job="2")["reason"] == \
            "cancelled while queued"
        left.communicate(timeout=60)
    finally:
        if left.poll() is None:
            left.kill()
    assert status(tmp_path, "tq-down", env)["state"] not in ("pending", "running")
