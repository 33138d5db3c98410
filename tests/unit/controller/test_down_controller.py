"""``ddp-orch down`` and ``ps`` judge a run's controller by its identity, not its pid.

A recorded controller pid can belong to an unrelated process after a reboot
or once the controller is gone, or to another machine sharing the runs
directory. Only the recorded process (same host, boot, start time and
command line) may be signalled, or keep a run "live". Fast: a ``sleep``
child stands in for the controller; nothing here uses SSH.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from orchestrator.agent.wire.owner import Holder, Owner  # noqa: E402
from orchestrator.controller import down as down_mod  # noqa: E402
from orchestrator.records.outcome import RunState  # noqa: E402
from orchestrator.records.rundir import RunDir  # noqa: E402
from orchestrator.records.store import (  # noqa: E402
    STATE_FILE, controller_alive, kept_without_controller, process_identity, read_record,
    write_state)

HAS_PIDFD = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")


@pytest.fixture
def sleeper():
    child = subprocess.Popen(["sleep", "60"])
    deadline = time.monotonic() + 10  # until it has exec'd: before, it is a copy of us
    while (process_identity(child.pid) or {}).get("cmdline") != ["sleep", "60"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield child
    if child.poll() is None:
        child.kill()
    child.wait()


@pytest.fixture(params=["pidfd", "kill"])
def how(request, monkeypatch):
    """Run a test both with pidfds (where the kernel has them) and with os.kill."""
    if request.param == "pidfd":
        if not HAS_PIDFD:
            pytest.skip("no os.pidfd_open here")
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:
            pytest.skip("the kernel has no pidfd_open")
    else:
        monkeypatch.setattr(down_mod, "_pidfd_open", lambda pid: None)
    return request.param


def recorded_run(tmp_path, pid=None, **changes):
    """A run recorded as live by ``write_state``, then its controller made
    ``pid`` (with that process's real identity), edited by ``changes``;
    ``controller=None`` removes the identity, as in old records."""
    run = RunDir.create(str(tmp_path / "runs"), "run-1")
    write_state(run, run_id="run-1", backend="local", state=RunState.RUNNING,
                started=time.time(), nodes=())
    path = run.file(STATE_FILE)
    with open(path) as fh:
        data = json.load(fh)
    if pid is not None:
        data["controller_pid"] = pid
        data["controller"] = process_identity(pid)
    if "controller" in changes and changes.pop("controller") is None:
        del data["controller"]
    data.get("controller", {}).update(changes)
    with open(path, "w") as fh:
        json.dump(data, fh)
    return run


def still_running(child, for_s=0.3):
    try:
        child.wait(for_s)
    except subprocess.TimeoutExpired:
        return True
    return False


# -- the identity that write_state records ------------------------------------

def test_write_state_records_who_the_controller_is(tmp_path):
    run = recorded_run(tmp_path)
    data = json.loads(open(run.file(STATE_FILE)).read())
    assert data["controller_pid"] == os.getpid()  # kept for older readers
    me = data["controller"]
    assert me == process_identity(os.getpid())
    assert me["host"] == socket.gethostname()
    assert me["boot_id"] == open("/proc/sys/kernel/random/boot_id").read().strip()
    with open(f"/proc/{os.getpid()}/stat") as fh:
        assert me["start_time"] == int(fh.read().rsplit(")", 1)[1].split()[19])
    assert me["cmdline"] == open(f"/proc/{os.getpid()}/cmdline").read().split("\0")[:-1]
    record = read_record(run)
    assert record.controller == me and record.controller_pid == os.getpid()
    assert record.state is RunState.RUNNING and controller_alive(record)


def test_process_identity_of_another_process(sleeper):
    identity = process_identity(sleeper.pid)
    assert identity["pid"] == sleeper.pid and identity["cmdline"] == ["sleep", "60"]
    assert identity["start_time"] >= process_identity(os.getpid())["start_time"]
    sleeper.kill()
    sleeper.wait()
    assert process_identity(sleeper.pid) is None


# -- a pid that is no longer the controller ----------------------------------

@pytest.mark.parametrize("change", [
    {"start_time": "+1"},                        # pid reused since
    {"cmdline": ["python", "-m", "ddp-orch", "up"]},
    {"boot_id": "00000000-0000-0000-0000-000000000000"},  # recorded before a reboot
])
def test_a_reused_pid_is_not_signalled_and_the_run_reads_interrupted(tmp_path, sleeper, how,
                                                                     change):
    if change.get("start_time") == "+1":
        change = {"start_time": process_identity(sleeper.pid)["start_time"] + 1}
    run = recorded_run(tmp_path, sleeper.pid, **change)
    record = read_record(run)
    assert not controller_alive(record)
    assert record.state is RunState.INTERRUPTED  # the run's controller is gone
    notes = []
    assert down_mod._stop_controller(record, 2, notes.append) is False
    assert still_running(sleeper), "an unrelated process was signalled"
    assert notes == []


def test_the_real_controller_is_signalled_and_awaited(tmp_path, sleeper, how):
    run = recorded_run(tmp_path, sleeper.pid)
    record = read_record(run)
    assert controller_alive(record) and record.state is RunState.RUNNING
    started = time.monotonic()
    assert down_mod._stop_controller(record, 10) is True
    assert time.monotonic() - started < 5  # waited for it to end, not the full timeout
    assert sleeper.wait(5) == -signal.SIGTERM
    assert read_record(run).state is RunState.INTERRUPTED


def test_a_controller_on_another_host_is_left_alone_and_its_run_keeps_its_state(
        tmp_path, sleeper, how):
    run = recorded_run(tmp_path, sleeper.pid, host="other-machine.example")
    record = read_record(run)
    assert record.state is RunState.RUNNING  # cannot be judged from here
    assert not controller_alive(record)
    notes = []
    assert down_mod._stop_controller(record, 2, notes.append) is False
    assert still_running(sleeper)
    assert len(notes) == 1 and "other-machine.example" in notes[0]


def test_old_records_without_identity_fall_back_to_the_pid(tmp_path, sleeper):
    run = recorded_run(tmp_path, sleeper.pid, controller=None)
    record = read_record(run)
    assert record.controller == {} and record.state is RunState.RUNNING
    assert controller_alive(record)
    sleeper.kill()
    sleeper.wait()
    assert read_record(run).state is RunState.INTERRUPTED


def test_a_dead_controller_is_not_signalled(tmp_path, sleeper, how):
    run = recorded_run(tmp_path, sleeper.pid)
    sleeper.kill()
    sleeper.wait()
    record = read_record(run)
    assert record.state is RunState.INTERRUPTED
    assert down_mod._stop_controller(record, 2) is False


_CONTROLLER = {"holder": "controller", "detached": False}
_KEPT = {"holder": "keepers", "detached": False}
_DETACHED = {"holder": "keepers", "detached": True}
_JOB = {"holder": "scheduler", "detached": False}
_DETACHED_JOB = {"holder": "scheduler", "detached": True}


@pytest.mark.parametrize("written, state, detached", [
    ({"owner": _CONTROLLER}, RunState.INTERRUPTED, False),
    ({"owner": _KEPT}, RunState.INTERRUPTED, False),  # attached keepers stop with it
    ({"owner": _JOB}, RunState.RUNNING, False),
    ({"owner": _DETACHED}, RunState.RUNNING, True),
    ({"owner": _DETACHED_JOB}, RunState.RUNNING, True),
])
def test_only_an_attached_run_ends_with_its_dead_controller(tmp_path, sleeper, written, state,
                                                            detached):
    """A scheduler's job is the scheduler's, a detached run its keepers':
    with the controller gone they are still running, and only their
    backend can say otherwise (``kept_without_controller``)."""
    run = recorded_run(tmp_path, sleeper.pid)
    data = json.loads(open(run.file(STATE_FILE)).read())
    data.pop("owner")
    run.write_json(STATE_FILE, {**data, **written})
    alive = read_record(run)
    assert alive.state is RunState.RUNNING
    assert kept_without_controller(alive) is detached  # else the controller records
    sleeper.kill()
    sleeper.wait()
    record = read_record(run)
    assert record.state is state
    assert kept_without_controller(record) is (state is RunState.RUNNING)


_V1 = "record version 1, before run owners"


@pytest.mark.parametrize("written, said", [
    ({"rule": "detached", "backend": "ssh"}, f"an older ddp-orch ({_V1})"),
    ({"backend": "local"}, f"an older ddp-orch ({_V1})"),
    ({"version": 4, "owner": _JOB}, "a newer ddp-orch (record version 4)"),
    ({"version": "3", "owner": _JOB}, "a newer ddp-orch (record version 3)"),
    ({"version": 2, "owner": _JOB}, "an older ddp-orch (record version 2)"),
    ({"owner": _JOB}, "an older ddp-orch (record version 2)"),
])
def test_a_run_recorded_by_another_record_version_is_listed_with_what_to_do_not_guessed(
        tmp_path, written, said):
    """Before owners a ``rule`` word stood for the owner, and it did not tell
    a detached Slurm job from a detached run its keepers held: such a run,
    or one a newer ddp-orch wrote, reads as damaged, naming who wrote it and
    what to read it with; nothing acts on a guess of its owner."""
    run = recorded_run(tmp_path, os.getpid())
    data = json.loads(open(run.file(STATE_FILE)).read())
    data.pop("owner")
    assert data.pop("version") == 3  # what this ddp-orch writes
    run.write_json(STATE_FILE, {**data, **written})
    record = read_record(run)
    assert (record.state, record.backend) == (RunState.DAMAGED,
                                              written.get("backend", data["backend"]))
    assert record.error == (f"recorded by {said}; this ddp-orch reads version 3: run "
                            "`ddp-orch ps`, `status` or `down` with the ddp-orch that wrote it")


# -- not allowed to signal ------------------------------------------------------

class _NoBackend:
    def cancel(self, record):
        return []


def test_permission_denied_is_reported_not_a_crash(tmp_path, sleeper, how, monkeypatch,
                                                   capsys):
    """A controller of another user: os.kill / pidfd_send_signal raise EPERM."""
    def denied(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", lambda pid, sig: denied() if sig else None)
    monkeypatch.setattr(signal, "pidfd_send_signal", denied, raising=False)
    monkeypatch.setattr(down_mod, "backend_of", lambda record, options: _NoBackend())
    record = read_record(recorded_run(tmp_path, sleeper.pid))
    notes: list[str] = []
    assert down_mod.down(record, grace_s=0, note=notes.append) == (False, [])
    assert capsys.readouterr().err == ""  # the library prints nothing; the CLI shows notes
    assert any(f"not allowed to signal its controller (pid {sleeper.pid}" in n for n in notes)
    monkeypatch.undo()
    assert still_running(sleeper)
