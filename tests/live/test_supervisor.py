"""The node supervisor tears down every process of a run, including workers
that put themselves in sessions of their own (as torchrun's do)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import ROOT
from orchestrator.agent.wire.protocol import CONTROL_PREFIX, decode
from orchestrator.transport.local import LocalTransport
from orchestrator.agent.node.procs import own_marker
from procscan import wait_gone, worker_pids

pytestmark = pytest.mark.live
PROGRAM = os.path.join(ROOT, "tests", "programs", "escaping_workers.py")


def start(tmp_path, run_id: str, *extra: str, grace_s: float = 1.0):
    spec = {"run_id": run_id, "node_rank": 0, "run_dir": str(tmp_path / "node-0"),
            "argv": [sys.executable, PROGRAM, *extra],
            "env": {"DDP_ORCH_RUN_ID": run_id, "DDP_ORCH_NODE_RANK": "0"},
            "unset_env": ["TORCH_ELASTIC_WORKER_IDENTICAL"], "bundle": None, "grace_s": grace_s}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    handle = supervise(spec_path, run_id)
    seen = b""
    while seen.count(b"worker up") < 2:  # counted, not matched per line: robust to interleaving
        line = handle.stdout.readline()
        assert line, seen
        seen += line
    return handle


def supervise(spec_path, run_id: str = ""):
    """The agent's supervisor, run from a spec file as one would by hand,
    marked as ddp-orch marks its own processes of a run (``own_marker``):
    the "nothing left" scan sees it, and its guardian, too."""
    return LocalTransport().start([sys.executable, "-m", "orchestrator.agent", "supervise",
                                   str(spec_path)], env={"PYTHONPATH": ROOT, **own_marker(run_id)})


def control_of(handle) -> dict:
    """The exit event: the control line after the node's last heartbeat."""
    rest = handle.stdout.read()
    events = [decode(l) for l in rest.splitlines(keepends=True) if l.startswith(CONTROL_PREFIX)]
    return next(e for e in events if e["event"] == "exit")


@pytest.mark.parametrize("line, reason", [
    (b"stop\n", "stopped by the controller"),
    (b"stop stopped: node 1 (b) failed (exit 1)\n", "stopped: node 1 (b) failed (exit 1)")])
def test_stop_kills_workers_in_their_own_sessions(tmp_path, line, reason):
    """A ``stop`` carries who stopped the run, which the node records as its
    reason (issue #45); a bare one is the controller's."""
    run_id = f"sup-stop-{os.getpid()}-{len(line)}"
    handle = start(tmp_path, run_id)
    assert len(worker_pids(run_id)) == 3  # the program and its two workers
    handle.send(line)
    code = handle.wait(timeout=20)
    assert code == 128 + 9  # the program ignores SIGTERM, so it is killed
    control = control_of(handle)
    assert (control["reason"], control["ended"]) == (reason, "stopped")
    assert wait_gone(run_id, 5) == set()


def test_controller_gone_means_teardown(tmp_path):
    """stdin EOF is what a killed controller or a dropped SSH link looks like."""
    run_id = f"sup-eof-{os.getpid()}"
    handle = start(tmp_path, run_id)
    handle.close_stdin()
    handle.wait(timeout=20)
    control = control_of(handle)
    assert (control["reason"], control["ended"]) == ("lost the controller (stdin closed)",
                                                     "controller-lost")
    assert wait_gone(run_id, 5) == set()


def test_orphans_are_removed_when_the_launcher_exits(tmp_path):
    run_id = f"sup-orphans-{os.getpid()}"
    handle = start(tmp_path, run_id, "--exit")
    assert handle.wait(timeout=20) == 3
    control = control_of(handle)
    assert (control["code"], control["reason"], control["ended"]) == (3, "torchrun exited",
                                                                      "itself")
    assert wait_gone(run_id, 5) == set()
    state = json.loads((tmp_path / "node-0" / "supervisor.json").read_text())
    assert state["exit_code"] == 3


def test_sigterm_to_the_supervisor_tears_down(tmp_path):
    run_id = f"sup-term-{os.getpid()}"
    handle = start(tmp_path, run_id)
    os.kill(handle.pid, 15)
    handle.wait(timeout=20)
    control = control_of(handle)
    assert (control["reason"], control["ended"]) == ("got SIGTERM", "signal")
    assert wait_gone(run_id, 5) == set()


def test_control_line_starts_a_line_even_after_a_partial_one(tmp_path):
    """The program's last line has no newline; the exit event must still be
    a line of its own, or the controller would relay it as output."""
    run_id = f"sup-partial-{os.getpid()}"
    spec = {"run_id": run_id, "node_rank": 0, "run_dir": str(tmp_path / "node-0"),
            "argv": [sys.executable, "-c", "import sys; sys.stdout.write('one\\ntwo, no newline')"],
            "env": {}, "unset_env": [], "bundle": None, "grace_s": 1.0}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    handle = supervise(spec_path)
    assert handle.wait(timeout=20) == 0
    lines = handle.stdout.read().splitlines(keepends=True)
    assert lines[:2] == [b"one\n", b"two, no newline\n"]
    assert all(line.startswith(CONTROL_PREFIX) for line in lines[2:]) and len(lines) == 4
    assert [decode(line)["event"] for line in lines[2:]] == ["heartbeat", "exit"]  # the last steps
    assert decode(lines[3])["code"] == 0
