"""The node agent over a real channel: bootstrap from memory, requests and
replies, checked file transfer, and nothing left behind by a failed launch."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from orchestrator.agent.node.procs import proc_table
from orchestrator.agent.wire.protocol import CONTROL_PREFIX
from orchestrator.engine.agentlink import AgentHandle
from orchestrator.config.loader import load_cluster_file
from orchestrator.console import Console
from orchestrator.controller.session import up
from orchestrator.errors import LaunchError, TransportError
from orchestrator.transport.local import LocalTransport
from sshlab import lacking

pytestmark = pytest.mark.live


@pytest.fixture
def agent():
    handle = AgentHandle(LocalTransport(), sys.executable)
    yield handle
    handle.close()


def test_the_agent_starts_from_memory_and_says_hello(agent):
    assert agent.home == os.path.expanduser("~")
    assert agent.hello["pid"] == agent.process.pid  # BOOT itself serves: no extra process
    assert agent.hello["python"] == sys.executable


def test_put_and_get_move_bytes_exactly_with_their_mode(agent, tmp_path):
    data = bytes(range(256)) * 1000 + CONTROL_PREFIX + b"\n not a control line\n"
    path = tmp_path / "deep" / "er" / "file.bin"
    assert agent.put(data, str(path), mode=0o640) == str(path)
    assert path.read_bytes() == data
    assert (path.stat().st_mode & 0o777) == 0o640
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    assert agent.get(str(path), 1 << 20) == data
    assert agent.get(str(tmp_path / "missing"), 100) is None
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert agent.get(str(empty), 10) == b""


def test_a_corrupted_upload_is_refused_and_not_written(agent, tmp_path):
    path = tmp_path / "f"
    reply = agent.call("put", b"abcd", path=str(path), size=4, sha256="0" * 64)
    assert reply["ok"] is False and "corrupted" in reply["error"]
    assert not path.exists() and os.listdir(tmp_path) == []
    agent.put(b"still serving", str(path))  # the channel is still in step
    assert path.read_bytes() == b"still serving"


def test_get_refuses_symlinks_devices_and_oversized_files(agent, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("key")
    (tmp_path / "link").symlink_to(secret)
    with pytest.raises(TransportError, match="not fetched"):
        agent.get(str(tmp_path / "link"), 100)
    with pytest.raises(TransportError, match="not a regular file"):
        agent.get("/dev/zero", 100)
    with pytest.raises(TransportError, match="more than the 2 accepted"):
        agent.get(str(secret), 2)


def test_no_such_python_names_the_fix():
    with pytest.raises(TransportError, match=r"cannot start '/no/such/python'") as err:
        AgentHandle(LocalTransport(), "/no/such/python")
    assert "set `python:`" in err.value.hint


def test_eof_before_the_agent_arrives_exits_having_done_nothing():
    from orchestrator.agent.wire.bootstrap import command

    handle = LocalTransport().start(command(sys.executable))
    handle.close_stdin()
    assert handle.wait(timeout=30) == 0
    assert handle.stdout.read() == b""


def _agents_of_this_process() -> list[int]:
    found = []
    for pid, ppid, _state in proc_table():  # zombies too: an agent must be reaped
        if ppid != os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"ddp_orch_agent" in fh.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def test_a_launch_that_fails_before_starting_releases_its_agents(tmp_path):
    busy = socket.socket()
    busy.bind(("", 0))
    busy.listen(1)
    try:
        cluster = tmp_path / "c.yaml"
        cluster.write_text(f"master: {{port: {busy.getsockname()[1]}}}\n"
                           "nodes:\n  - {host: localhost, procs: 1}\n"
                           "  - {host: localhost, procs: 1}\n"
                           "workload: {name: noop}\n")
        with pytest.raises(LaunchError, match="already in use"):
            up(load_cluster_file(str(cluster)), runs_dir=str(tmp_path / "runs"),
               console=Console(stream=io.StringIO()))
    finally:
        busy.close()
    assert _agents_of_this_process() == []


def test_the_run_directory_is_new_and_its_root_ours_alone(agent, tmp_path):
    root = tmp_path / "work"
    made = agent.call("mkrun", run_dir=str(root / "runs" / "r1" / "node-0"), root=str(root))
    assert made["ok"], made
    for d in (root, root / "runs", root / "runs" / "r1", root / "runs" / "r1" / "node-0"):
        assert (d.stat().st_mode & 0o777) == 0o700
    again = agent.call("mkrun", run_dir=str(root / "runs" / "r1" / "node-0"), root=str(root))
    assert again["ok"] is False and "already exists" in again["error"]
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)  # a workdir anyone could have prepared
    refused = agent.call("mkrun", run_dir=str(shared / "runs" / "r2" / "node-0"), root=str(shared))
    assert refused["ok"] is False and "not ours alone" in refused["error"]
    assert "chmod go-w" in refused["error"] and not (shared / "runs").exists()
    (tmp_path / "w2").mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "w2" / "runs").symlink_to(tmp_path / "elsewhere")  # planted on the way
    planted = agent.call("mkrun", run_dir=str(tmp_path / "w2" / "runs" / "r3" / "node-0"),
                         root=str(tmp_path / "w2"))
    assert planted["ok"] is False and "a link or a file" in planted["error"]
    assert os.listdir(tmp_path / "elsewhere") == []


@contextlib.contextmanager
def frozen(pid: int):
    """``pid`` frozen by the cgroup (v1) freezer, as a process in
    uninterruptible sleep is: in state D, SIGKILL does not end it until it
    is thawed. Thawed (and so killable) on the way out."""
    group = f"/sys/fs/cgroup/freezer/ddp-orch-test-{os.getpid()}-{pid}"
    if not os.path.isdir("/sys/fs/cgroup/freezer"):
        # cgroup v2's cgroup.freeze lets a fatal signal through: only v1's
        # freezer makes a process SIGKILL cannot end, as state D does
        pytest.skip("no cgroup v1 freezer here (cgroup v2's freezer lets SIGKILL through)")
    if not os.access("/sys/fs/cgroup/freezer", os.W_OK):
        lacking("the cgroup v1 freezer (/sys/fs/cgroup/freezer) is not writable")
    os.mkdir(group)
    try:
        with open(f"{group}/tasks", "w") as fh:
            fh.write(str(pid))
        with open(f"{group}/freezer.state", "w") as fh:
            fh.write("FROZEN")
        deadline = time.monotonic() + 10
        while open(f"{group}/freezer.state").read().strip() != "FROZEN":
            assert time.monotonic() < deadline, "the freezer did not freeze it"
            time.sleep(0.05)
        yield
    finally:
        with open(f"{group}/freezer.state", "w") as fh:
            fh.write("THAWED")
        with open(f"{group}/tasks") as fh:  # move it back before the group goes
            left = fh.read().split()
        for task in left:
            with open("/sys/fs/cgroup/freezer/tasks", "w") as fh:
                fh.write(task)
        os.rmdir(group)


def test_what_teardown_cannot_end_is_reported_by_pid_and_command(agent):
    """A process of the run that SIGKILL cannot end (here frozen, in state D,
    as in uninterruptible sleep) is named by the agent's ``down`` with its
    pid and command line, and ``ddp-orch down`` shows it; once it can die
    again, it does, and a second ``down`` finds nothing."""
    from orchestrator.backends.base import CancelResult
    from orchestrator.report.runs import render_down

    run_id = f"stuck-{os.getpid()}"
    stuck = subprocess.Popen(["sleep", "300"], env={**os.environ, "DDP_ORCH_RUN_ID": run_id,
                                                    "DDP_ORCH_NODE_RANK": "0"})
    try:
        with frozen(stuck.pid):
            reply = agent.call("down", run_id=run_id, node_rank=0, grace_s=0)
            assert reply["ok"], reply
            assert reply["survivors"] == [{"pid": stuck.pid, "cmd": "sleep 300"}]
            assert stuck.pid in reply["killed"]
            assert stuck.poll() is None  # SIGKILL was sent, and it is still there
            shown = render_down(SimpleNamespace(run_id=run_id), False, [CancelResult(
                0, "localhost", tuple(reply["killed"]), "", tuple(reply["survivors"]))])
            assert f"node 0 (localhost): could NOT end pid {stuck.pid} (sleep 300)" in shown
        assert stuck.wait(10) < 0  # thawed, it dies of the signals it was sent
        again = agent.call("down", run_id=run_id, node_rank=0, grace_s=0)
        assert again == {**again, "ok": True, "killed": [], "survivors": []}
    finally:
        stuck.kill()
        stuck.wait()


def test_uploads_pipelined_behind_a_refused_run_directory_do_not_land(tmp_path):
    """The controller sends mkrun and the bundle in one go; when mkrun is
    refused, the bundle behind it must not be written."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    agent = AgentHandle(LocalTransport(), sys.executable, wait=False)
    try:
        run_dir = shared / "runs" / "r" / "node-0"
        agent.send("mkrun", run_dir=str(run_dir), root=str(shared))
        agent.send_put(b"code", str(run_dir / "bundle.tar.gz"))
        assert agent.reply("mkrun")["ok"] is False
        with pytest.raises(TransportError, match="run directory was refused"):
            agent.put_done(str(run_dir / "bundle.tar.gz"))
        assert not (shared / "runs").exists()
    finally:
        agent.close()
