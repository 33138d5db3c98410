"""The SSH lab itself: real sshd processes that the system ssh client and
paramiko can log in to, and the fault helpers later tests rely on."""

import os
import socket
import subprocess
import sys

import paramiko
import pytest

from sshlab import SshLab, make_ssh_lab, ssh_lab, _require_sshd  # noqa: E402,F401
import sshlab  # noqa: E402

pytestmark = pytest.mark.live


def _ssh(lab, host, *command, known_hosts=None):
    argv = lab.ssh_argv(host, *command)
    if known_hosts:
        argv[1:1] = ["-o", f"UserKnownHostsFile={known_hosts}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("ssh_lab", [3], indirect=True)
def test_system_ssh_client_reaches_each_host_on_its_own_address(ssh_lab):
    assert [h.addr for h in ssh_lab.hosts] == ["127.0.55.10", "127.0.55.11", "127.0.55.12"]
    for host in ssh_lab.hosts:
        result = _ssh(ssh_lab, host, "echo", "$SSH_CONNECTION")
        assert result.returncode == 0, result.stderr
        assert result.stdout.split()[2:] == [host.addr, str(host.port)]


def test_paramiko_sees_the_host_key_listed_in_known_hosts(ssh_lab):
    host = ssh_lab.hosts[1]
    known = paramiko.HostKeys(ssh_lab.known_hosts)
    with ssh_lab.client(host) as client:
        offered = client.get_transport().get_remote_server_key()
        _, stdout, _ = client.exec_command("echo ok")
        assert stdout.read() == b"ok\n"
    assert known.lookup(host.known_hosts_name)["ssh-ed25519"] == offered
    assert host.known_hosts_line.split()[1:] == host.host_public_key.split()


def test_wrong_host_key_is_refused_by_system_ssh(ssh_lab):
    wrong = ssh_lab.host_key_mismatch(0)
    result = _ssh(ssh_lab, 0, "true", known_hosts=wrong)
    assert result.returncode == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr
    assert _ssh(ssh_lab, 1, "true", known_hosts=wrong).returncode == 0  # others untouched


def test_kill_sessions_drops_connections_but_not_the_listener(make_ssh_lab):
    lab = make_ssh_lab(1)
    assert lab.session_pids(0) == []  # the readiness probe has gone
    client = subprocess.Popen(lab.ssh_argv(0, "echo ready; cat"), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert client.stdout.readline() == b"ready\n"
        killed = lab.kill_sessions(0)
        assert killed and lab.listener_pid(0) not in killed
        assert client.wait(10) == 255
    finally:
        client.kill()
        client.wait()
    assert _ssh(lab, 0, "true").returncode == 0


def test_stopped_host_refuses_connections_until_restarted(make_ssh_lab):
    lab = make_ssh_lab(2)
    host = lab.hosts[1]
    lab.stop_host(host)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host.addr, host.port), timeout=2).close()
    lab.start_host(host)
    assert _ssh(lab, host, "true").returncode == 0


def test_teardown_stops_its_sshds_and_removes_the_lab_dir():
    _require_sshd()
    with SshLab(2) as lab:
        pids = [lab.listener_pid(h) for h in lab.hosts]
        lab_dir = lab.dir
    assert not os.path.exists(lab_dir)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)


def test_missing_sshd_skips_locally_but_fails_in_ci(monkeypatch):
    monkeypatch.setattr(sshlab, "SSHD", "/nonexistent/sshd")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="scripts/install-system-deps"):
        sshlab._require_sshd()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        sshlab._require_sshd()


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
