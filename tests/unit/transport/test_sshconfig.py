"""Unit tests of transport/sshconfig.py: ~/.ssh/config resolution and jump specs."""

from __future__ import annotations

import getpass
import os

import pytest

from orchestrator.transport.sshconfig import SshTarget, parse_jump_spec, resolve_target  # noqa: E402
from orchestrator.errors import TransportError  # noqa: E402
from orchestrator.transport.ssh import SshTransport


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config"
    path.write_text(
        "Host web\n    HostName 10.1.2.3\n    Port 2200\n    User alice\n"
        "    IdentityFile ~/.ssh/web_key\n    UserKnownHostsFile /etc/kh1 ~/kh2\n"
        "    ProxyJump bob@bastion:2222,inner\n    ConnectTimeout 7\n\n"
        "Host bastion\n    HostName 192.0.2.1\n    IdentityFile /keys/bastion\n\n"
        "Host legacy\n    ProxyCommand nc %h %p\n\n"
        "Host lax\n    StrictHostKeyChecking no\n\n"
        "Host *\n    IdentityFile /keys/default\n")
    return str(path)


def test_resolve_applies_the_config_for_an_alias(config_file):
    target = resolve_target("web", ssh_config=config_file)
    home = os.path.expanduser("~")
    assert (target.name, target.hostname, target.port, target.user) == \
        ("web", "10.1.2.3", 2200, "alice")
    assert target.identity_files == (f"{home}/.ssh/web_key", "/keys/default")
    assert target.known_hosts == ("/etc/kh1", f"{home}/kh2")
    assert target.connect_timeout == 7 and target.strict_host_keys == "yes"
    assert target.known_hosts_name == "[10.1.2.3]:2200"
    # "bob@bastion:2222,inner": bastion first, then inner through it
    inner = target.jump
    assert (inner.hostname, inner.port, inner.jump.hostname) == ("inner", 22, "192.0.2.1")
    assert (inner.jump.user, inner.jump.port) == ("bob", 2222)
    assert inner.jump.identity_files == ("/keys/bastion", "/keys/default")
    assert inner.jump.jump is None


def test_explicit_values_beat_the_config(config_file):
    target = resolve_target("web", user="carol", port=22, identity_file="/k/explicit",
                            connect_timeout=3, strict_host_keys="accept-new",
                            known_hosts="/k/known", proxy_jump="none", ssh_config=config_file)
    assert (target.user, target.port, target.connect_timeout) == ("carol", 22, 3)
    assert target.identity_files[0] == "/k/explicit"
    assert target.known_hosts == ("/k/known",) and target.jump is None
    assert target.strict_host_keys == "accept-new" and target.known_hosts_name == "10.1.2.3"


def test_defaults_without_any_config(tmp_path):
    target = resolve_target("plain", ssh_config=str(tmp_path / "absent"))
    assert target == SshTarget(
        name="plain", hostname="plain", port=22, user=getpass.getuser(),
        known_hosts=(os.path.expanduser("~/.ssh/known_hosts"),))


def test_strict_host_key_checking_from_config_never_accepts_changed_keys(config_file):
    assert resolve_target("lax", ssh_config=config_file).strict_host_keys == "accept-new"
    with pytest.raises(ValueError, match="strict_host_keys"):
        resolve_target("web", strict_host_keys="no", ssh_config=config_file)


def test_unsupported_settings_are_clear_errors(config_file, tmp_path):
    with pytest.raises(TransportError, match="legacy: bad SSH settings: ProxyCommand"):
        SshTransport("legacy", ssh_config=config_file)
    looping = tmp_path / "looping"
    looping.write_text("Host a\n    ProxyJump b\nHost b\n    ProxyJump a\n")
    with pytest.raises(ValueError, match="a loop"):
        resolve_target("a", ssh_config=str(looping))


@pytest.mark.parametrize("spec, expected", [
    ("host", (None, "host", None)),
    ("u@host:2200", ("u", "host", 2200)),
    ("ssh://u@h", ("u", "h", None)),
    ("[::1]:2222", (None, "::1", 2222)),
    ("u@[fe80::1]", ("u", "fe80::1", None)),
])
def test_parse_jump_spec(spec, expected):
    assert parse_jump_spec(spec) == expected


def test_include_brings_in_the_hosts_its_files_describe(tmp_path, monkeypatch):
    """Issue #32: with `Include .../lab_ssh_config` in ~/.ssh/config, `check`
    said every node was unreachable ("cannot resolve host name 'nw0'") while
    `ssh nw0` worked: paramiko hands the keyword back unread. As ssh reads
    it: a relative path is under ~/.ssh, wildcards expand, a pattern that
    matches nothing is fine, and included files may include more."""
    monkeypatch.setenv("HOME", str(tmp_path))
    ssh_dir = tmp_path / ".ssh"
    (ssh_dir / "conf.d").mkdir(parents=True)
    lab = tmp_path / "lab" / "lab_ssh_config"
    lab.parent.mkdir()
    lab.write_text("Host nw0\n    HostName 10.9.0.10\n    Port 2222\n"
                   "Include conf.d/nested\n")
    (ssh_dir / "conf.d" / "nested").write_text("Host nw1\n    HostName 10.9.0.11\n")
    (ssh_dir / "conf.d" / "b.conf").write_text("Host nw2\n    User bee\n")
    config = ssh_dir / "config"
    config.write_text(f"Include {lab}\nInclude conf.d/*.conf nothing/here*\n"
                      "Host *\n    User everyone\n")
    nw0 = resolve_target("nw0", ssh_config=str(config))
    assert (nw0.hostname, nw0.port, nw0.user) == ("10.9.0.10", 2222, "everyone")
    assert resolve_target("nw1", ssh_config=str(config)).hostname == "10.9.0.11"
    assert resolve_target("nw2", ssh_config=str(config)).user == "bee"
    (ssh_dir / "loop").write_text("Include loop\n")
    with pytest.raises(ValueError, match="Include nested deeper than 16"):
        resolve_target("x", ssh_config=str(ssh_dir / "loop"))
