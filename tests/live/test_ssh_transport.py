"""SshTransport against real sshd processes (the SSH lab). The pure settings
resolution has its unit tests in tests/unit/transport/ (test_sshconfig.py,
test_sshauth.py)."""

import ast
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import paramiko
import pytest
from hypothesis import given, settings, strategies as st

from ports import free_port  # noqa: E402
from sshlab import make_ssh_lab, ssh_lab  # noqa: E402,F401

from orchestrator.errors import TransportError  # noqa: E402
from orchestrator.transport.ssh import (  # noqa: E402
    EXIT_ABORTED, EXIT_CONNECTION_LOST, SshTransport)

live = pytest.mark.live

# Prints what the remote program received, as bytes, for exact comparison.
ECHO = ("import os, sys; sys.stdout.write(repr([os.fsencode(a) for a in sys.argv[1:]]"
        " + [os.environb.get(b'PROBE')]))")
NASTY = ["it's", '"double"', "$(touch {marker})", "`touch {marker}`", "; touch {marker}",
         "a\nb", "tab\there", "  spaces  ", "ünïcødé ✓ 日本", "*", "~", "$HOME", "\\", "",
         "-c", "--", "'; exit 7; '", "&& touch {marker}", "| touch {marker}", "\r\n"]


def echo_probe(transport, args, env_value):
    """Run ECHO remotely; returns (list of arg bytes, PROBE bytes)."""
    result = transport.run([sys.executable, "-c", ECHO, *args],
                           env={"PROBE": env_value}, timeout=30)
    assert result.exit_code == 0, result.output
    *got_args, got_env = ast.literal_eval(result.output)
    return got_args, got_env


@pytest.fixture(scope="module")
def node0(ssh_lab):
    with SshTransport("node0", ssh_config=ssh_lab.ssh_config) as transport:
        yield transport


def _transport(lab, host="node0", **kwargs):
    kwargs.setdefault("ssh_config", lab.ssh_config)
    return SshTransport(host, **kwargs)


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- running commands ------------------------------------------------------

@live
def test_run_returns_exit_code_and_merged_output_in_order(node0):
    result = node0.run(["sh", "-c", "echo one; echo two >&2; echo three; exit 3"])
    assert (result.host, result.exit_code, result.ok) == ("node0", 3, False)
    assert result.output == "one\ntwo\nthree\n"


@live
def test_hostile_argv_and_env_arrive_verbatim_and_run_nothing(node0, tmp_path):
    marker = tmp_path / "marker"
    args = [a.format(marker=marker) for a in NASTY]
    env_value = " ; ".join(args)
    got_args, got_env = echo_probe(node0, args, env_value)
    assert got_args == [a.encode() for a in args]
    assert got_env == env_value.encode()
    assert not marker.exists()


@live
def test_cwd_with_spaces_and_quotes(node0, tmp_path):
    odd = tmp_path / "it's a $(dir)"
    odd.mkdir()
    assert node0.run(["pwd"], cwd=str(odd)).output == f"{odd}\n"


@live
@settings(max_examples=25, deadline=None)
@given(args=st.lists(st.text(st.characters(blacklist_categories=("Cs",),
                                           blacklist_characters="\x00"), max_size=30),
                     max_size=4),
       env_value=st.text(st.characters(blacklist_categories=("Cs",),
                                       blacklist_characters="\x00"), max_size=30))
def test_any_text_survives_the_ssh_path(node0, args, env_value):
    got_args, got_env = echo_probe(node0, args, env_value)
    assert got_args == [a.encode() for a in args]
    assert got_env == env_value.encode()


@live
def test_closing_stdin_is_seen_as_eof(node0):
    handle = node0.start([sys.executable, "-c",
                          "import sys; print(len(sys.stdin.buffer.read()), flush=True)"])
    handle.send(b"hello")
    handle.close_stdin()
    assert handle.wait(15) == 0
    assert handle.stdout.read() == b"5\n"


@live
def test_readline_streams_output_while_the_command_runs(node0):
    handle = node0.start(["sh", "-c", "echo first; read x; echo second"])
    assert handle.stdout.readline() == b"first\n"
    assert handle.poll() is None
    handle.send(b"go\n")
    assert handle.stdout.readline() == b"second\n"
    assert handle.wait(15) == 0


@live
def test_abort_cuts_off_a_long_running_command(node0, tmp_path):
    pidfile = tmp_path / "pid"
    handle = node0.start(["sh", "-c", f'echo $$ > "{pidfile}"; '
                                      "while :; do echo tick; sleep 0.1; done"])
    assert handle.stdout.readline() == b"tick\n"
    handle.abort()
    # the loop never ends by itself: an exit at all is the abort's (a wide
    # margin on a loaded machine; the remote side is checked below)
    assert handle.wait(10) == EXIT_ABORTED
    handle.stdout.read()  # ends instead of hanging
    remote_pid = int(pidfile.read_text())
    # no pty and no signal for root sessions: the loop dies of SIGPIPE
    assert _wait_for(lambda: not os.path.exists(f"/proc/{remote_pid}"))


@live
def test_killed_by_signal_reports_minus_signum(node0):
    assert node0.start(["sh", "-c", "kill -KILL $$"]).wait(15) == -9


@live
def test_dropped_connection_is_reported_and_the_next_call_reconnects(make_ssh_lab):
    lab = make_ssh_lab(1)
    with _transport(lab) as transport:
        handle = transport.start(["cat"])  # ends by itself once its stdin is gone
        assert _wait_for(lambda: lab.session_pids(0))
        lab.kill_sessions(0)
        assert handle.wait(10) == EXIT_CONNECTION_LOST and handle.connection_lost
        assert transport.run(["echo", "back"]).output == "back\n"


@live
def test_one_connection_shared_by_many_threads(make_ssh_lab):
    lab = make_ssh_lab(1)
    outputs, errors = [], []

    def echo(i: int) -> None:
        try:
            outputs.append(transport.run(["echo", str(i)]).output)
        except Exception as exc:  # noqa: BLE001 (said in the assertion, not lost with the thread)
            errors.append(f"{i}: {exc!r}")

    with _transport(lab) as transport:
        threads = [threading.Thread(target=echo, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert sorted(outputs) == sorted(f"{i}\n" for i in range(8))
        assert len(lab.session_pids(0)) == 1  # one sshd session process: one connection


# -- files (over the agent's exec channel: the lab has no SFTP) ---------

@live
def test_files_and_home_move_over_exec_without_sftp(node0, tmp_path):
    from orchestrator.engine.agentlink import AgentHandle

    with pytest.raises(paramiko.SSHException):  # the lab host really has no SFTP
        paramiko.SFTPClient.from_transport(node0._connection())
    agent = AgentHandle(node0, sys.executable)
    try:
        assert agent.home == os.path.expanduser("~")
        data = bytes(range(256)) * 1000
        remote = tmp_path / "new" / "deep" / "dst.bin"
        agent.put(data, str(remote), mode=0o640)
        assert remote.read_bytes() == data
        assert stat.S_IMODE(remote.stat().st_mode) == 0o640
        assert stat.S_IMODE(remote.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(remote.parent.parent.stat().st_mode) == 0o700
        assert os.listdir(remote.parent) == ["dst.bin"]  # no leftover temp file
        assert agent.get(str(remote), 1 << 20) == data
        assert agent.get(str(tmp_path / "missing"), 100) is None
        blocker = tmp_path / "file"
        blocker.write_text("")
        with pytest.raises(TransportError, match="upload to .* failed"):
            agent.put(b"x", str(blocker / "below"))
    finally:
        agent.close()


@live
def test_a_host_that_refuses_exec_is_named_with_what_to_enable(make_ssh_lab, tmp_path):
    """sshd with ForceCommand runs its own command for every session: the agent
    never answers, and the error says exec sessions must be allowed."""
    from orchestrator.engine.agentlink import AgentHandle

    lab = make_ssh_lab(1, extra_sshd=["ForceCommand /bin/echo this host only runs its menu"])
    transport = SshTransport(lab.hosts[0].alias, ssh_config=lab.ssh_config)
    try:
        with pytest.raises(TransportError, match="agent did not answer") as err:
            AgentHandle(transport, sys.executable)
        assert "this host only runs its menu" in str(err.value)
        assert "exec sessions" in err.value.hint and "ForceCommand" in err.value.hint
    finally:
        transport.close()


# -- host keys ------------------------------------------------------------

@live
def test_unknown_host_key_is_refused_with_the_fix(ssh_lab, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = ssh_lab.hosts[0]
    with pytest.raises(TransportError) as caught:
        _transport(ssh_lab, known_hosts=str(empty)).run(["true"])
    text = str(caught.value)
    assert "REFUSED: unknown host key" in text and host.known_hosts_name in text
    assert f"ssh-keyscan -p {host.port} {host.addr} >> {empty}" in text
    assert "strict_host_keys: accept-new" in text
    assert empty.read_text() == ""


@live
def test_accept_new_records_the_key_in_openssh_format(ssh_lab, tmp_path):
    known = tmp_path / "sub" / "known_hosts"
    with _transport(ssh_lab, "node1", known_hosts=str(known),
                    strict_host_keys="accept-new") as transport:
        assert transport.run(["true"]).ok
    host = ssh_lab.hosts[1]
    assert known.read_text() == host.known_hosts_line + "\n"
    found = subprocess.run(["ssh-keygen", "-F", host.known_hosts_name, "-f", str(known)],
                           capture_output=True, text=True)
    assert found.returncode == 0, found.stderr  # OpenSSH finds it too
    with _transport(ssh_lab, "node1", known_hosts=str(known)) as strict:  # now known
        assert strict.run(["true"]).ok
    assert known.read_text().count("\n") == 1


@live
def test_changed_host_key_is_refused_even_with_accept_new(ssh_lab):
    wrong = ssh_lab.host_key_mismatch(0)
    before = open(wrong).read()
    for mode in ("yes", "accept-new"):
        with pytest.raises(TransportError, match="has CHANGED.*ssh-keygen -R"):
            _transport(ssh_lab, known_hosts=wrong, strict_host_keys=mode).run(["true"])
    assert open(wrong).read() == before


def _hashed_known_hosts_line(tmp_path, line):
    """``line`` with its host name hashed by OpenSSH's own ``ssh-keygen -H``."""
    plain = tmp_path / "to_hash"
    plain.write_text(line + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(plain)], check=True, capture_output=True)
    hashed = plain.read_text().strip()
    assert hashed.startswith("|1|"), hashed
    return hashed


@live
@pytest.mark.parametrize("hashed", [False, True], ids=["plain-name", "hashed-name"])
def test_revoked_host_key_is_refused_even_with_accept_new(ssh_lab, tmp_path, hashed):
    """paramiko skips @revoked lines: without our own check the host would look
    unknown, and accept-new would record (trust) the revoked key."""
    host = ssh_lab.hosts[0]
    line = _hashed_known_hosts_line(tmp_path, host.known_hosts_line) if hashed \
        else host.known_hosts_line
    known = tmp_path / "known_hosts"
    known.write_text("# retired after the breach\n@revoked " + line + " old key\n")
    before = known.read_text()
    for mode in ("accept-new", "yes"):
        with pytest.raises(TransportError) as caught:
            _transport(ssh_lab, known_hosts=str(known), strict_host_keys=mode).run(["true"])
        text = str(caught.value)
        assert "REVOKED" in text and f"{known}:2" in text and host.known_hosts_name in text
        assert "must be replaced" in caught.value.hint
    assert known.read_text() == before  # not appended as a new key
    # OpenSSH agrees that this host must be refused
    refused = subprocess.run([
        "ssh", "-F", ssh_lab.ssh_config, "-o", f"UserKnownHostsFile={known}",
        "-o", "StrictHostKeyChecking=accept-new", host.alias, "true"],
        capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0 and "REVOKED" in refused.stderr


@live
def test_a_revoked_key_of_another_host_or_another_key_does_not_block(ssh_lab, tmp_path):
    host, other = ssh_lab.hosts[0], ssh_lab.hosts[1]
    known = tmp_path / "known_hosts"
    # host 1's key revoked for host 0's name (not the key host 0 offers), and host 0's
    # key revoked only under another name: neither is about this host's key
    known.write_text(f"@revoked {host.known_hosts_name} {other.host_public_key}\n"
                     f"@revoked {other.known_hosts_name},*.example {host.host_public_key}\n"
                     f"@revoked *,!{host.known_hosts_name} {host.host_public_key}\n"
                     + host.known_hosts_line + "\n")
    with _transport(ssh_lab, known_hosts=str(known)) as transport:
        assert transport.run(["true"]).ok


# -- failures to connect ----------------------------------------------------

@live
def test_dead_host_is_unreachable_fast():
    """Refused at once: not after the connect timeout (30 s here) it would
    otherwise wait out; the bound leaves a loaded machine its margin."""
    port = free_port("127.0.55.200")  # a lab address nothing listens on
    started = time.monotonic()
    with pytest.raises(TransportError, match=rf"unreachable: connection refused by "
                                             rf"127\.0\.55\.200:{port}") as caught:
        SshTransport("127.0.55.200", port=port, ssh_config=None, connect_timeout=30).run(
            ["true"])
    assert time.monotonic() - started < 10
    assert caught.value.host == "127.0.55.200"


@live
def test_silent_server_times_out_within_connect_timeout():
    with socket.socket() as silent:  # accepts TCP, never speaks SSH
        silent.bind(("127.0.55.201", 0))
        silent.listen()
        started = time.monotonic()
        with pytest.raises(TransportError, match="unreachable: SSH handshake"):
            SshTransport("127.0.55.201", port=silent.getsockname()[1], ssh_config=None,
                         connect_timeout=1).run(["true"])
        assert time.monotonic() - started < 5


@live
def test_authentication_failure_names_user_and_keys(ssh_lab, tmp_path):
    with pytest.raises(TransportError) as caught:
        _transport(ssh_lab, user="nobody").run(["true"])
    text = str(caught.value)
    assert "authentication failed for user 'nobody'" in text
    assert f"{ssh_lab.client_key} (rejected)" in text
    missing = tmp_path / "no_such_key"
    host = ssh_lab.hosts[0]
    with pytest.raises(TransportError, match=rf"{missing} \(missing\)"):
        SshTransport(host.addr, port=host.port, ssh_config=None, identity_file=str(missing),
                     known_hosts=ssh_lab.known_hosts).run(["true"])


# -- settings resolution, live -----------------------------------------------

@live
def test_ssh_config_alias_supplies_hostname_port_user_and_key(ssh_lab):
    host = ssh_lab.hosts[1]
    transport = _transport(ssh_lab, "node1")
    assert (transport.target.hostname, transport.target.port, transport.target.user) == \
        (host.addr, host.port, ssh_lab.user)
    with transport:
        result = transport.run(["sh", "-c", 'echo "$(id -un) $SSH_CONNECTION"'])
    user, *connection = result.output.split()
    assert user == ssh_lab.user and connection[2:] == [host.addr, str(host.port)]


@live
@pytest.mark.parametrize("how", ["cluster-file", "ssh-config"])
def test_proxy_jump_tunnels_through_another_host(make_ssh_lab, tmp_path, how):
    lab = make_ssh_lab(2)
    target = lab.hosts[1]
    if how == "cluster-file":
        transport = _transport(lab, "node1", proxy_jump="node0")
    else:
        config = tmp_path / "ssh_config"
        config.write_text(f"Host behind\n    HostName {target.addr}\n    Port {target.port}\n"
                          "    ProxyJump node0\n    IdentityFile " + lab.client_key + "\n"
                          f"    UserKnownHostsFile {lab.known_hosts}\n\n"
                          + open(lab.ssh_config).read())
        transport = SshTransport("behind", ssh_config=str(config))
    assert transport.target.jump.hostname == lab.hosts[0].addr
    with transport:
        handle = transport.start(["cat"])  # ends by itself once its stdin is gone
        assert lab.session_pids(0), "no session on the jump host"
        lab.kill_sessions(0)  # cutting the jump host's side must cut the tunnel
        assert handle.wait(10) == EXIT_CONNECTION_LOST


@live
def test_proxy_jump_failures_name_the_hop(ssh_lab):
    dead_port = free_port("127.0.55.202")
    behind_dead = SshTransport("127.0.55.202", port=dead_port, ssh_config=ssh_lab.ssh_config,
                               known_hosts=ssh_lab.known_hosts, proxy_jump="node0")
    with pytest.raises(TransportError, match=rf"jump host \S+ cannot connect to "
                                             rf"127\.0\.55\.202:{dead_port}"):
        behind_dead.run(["true"])
    via_dead = _transport(ssh_lab, "node1", proxy_jump=f"127.0.55.202:{dead_port}")
    with pytest.raises(TransportError, match=r"jump host .*127\.0\.55\.202.*connection refused"):
        via_dead.run(["true"])


# -- settings resolution, pure ------------------------------------------------
