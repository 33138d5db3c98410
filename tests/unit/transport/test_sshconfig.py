"""Unit tests of transport/sshconfig.py: ~/.ssh/config resolution and jump specs."""

from __future__ import annotations

import getpass
import os

import pytest

from orchestrator.transport.sshconfig import (IGNORED, USED, SshTarget, parse_jump_spec,  # noqa: E402
                                              resolve_target)
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


def test_a_keyword_that_matters_but_is_not_used_is_a_warning_naming_file_line_and_host(
        tmp_path, monkeypatch):
    """Issue #32: paramiko reads every keyword, ddp-orch applies a few; the
    rest of what applies to a host was dropped in silence. Now each one
    that could change the connection is a warning with its file and line
    (an included file's own), the first value only, and only for the hosts
    its block applies to; those that cannot (``IGNORED``) stay quiet."""
    monkeypatch.setenv("HOME", str(tmp_path))
    ssh_dir = tmp_path / ".ssh"
    ssh_dir.mkdir()
    (ssh_dir / "certs").write_text("# certificates\nHost web\n"
                                   "    CertificateFile ~/.ssh/web-cert.pub\n")
    config = ssh_dir / "config"
    config.write_text("Include certs\n"
                      "Host web\n"
                      "    HostName 10.1.2.3\n"
                      "    ForwardAgent yes\n"
                      "    ServerAliveInterval 30\n"
                      "    KnownHostsCommand /usr/bin/hosts %H\n"
                      "Host db\n"
                      "    HostKeyAlias shared\n"
                      "Host *\n"
                      "    CertificateFile ~/.ssh/other-cert.pub\n"
                      "    IdentityAgent none\n")
    web = SshTransport("web", ssh_config=str(config))
    assert web.target.hostname == "10.1.2.3"
    assert web.warnings == web.target.warnings == (
        "~/.ssh/certs line 3: `CertificateFile ~/.ssh/web-cert.pub` applies to host web, but "
        "ddp-orch does not support CertificateFile; it connects without it",
        "~/.ssh/config line 6: `KnownHostsCommand /usr/bin/hosts %H` applies to host web, but "
        "ddp-orch does not support KnownHostsCommand; it connects without it",
        "~/.ssh/config line 11: `IdentityAgent none` applies to host web, but ddp-orch does "
        "not support IdentityAgent; it connects without it")
    db = resolve_target("db", ssh_config=str(config))
    assert [w.split(":")[0] for w in db.warnings] == [
        "~/.ssh/config line 8", "~/.ssh/config line 10", "~/.ssh/config line 11"]
    assert "host db" in db.warnings[0] and "HostKeyAlias" in db.warnings[0]
    # a hop's warnings are the node's too: it connects through the hop
    config.write_text("Host node\n    ProxyJump gate\nHost gate\n    AddressFamily inet6\n")
    [hop] = resolve_target("node", ssh_config=str(config)).warnings
    assert hop.startswith("~/.ssh/config line 4: `AddressFamily inet6` applies to host gate")
    assert resolve_target("gate", ssh_config=str(config)).warnings == (hop,)


@pytest.mark.parametrize("why, keywords", IGNORED, ids=[why[:30] for why, _ in IGNORED])
def test_the_keywords_left_unused_in_silence_are_the_listed_ones(tmp_path, why, keywords):
    config = tmp_path / "config"
    config.write_text("Host h\n" + "".join(f"    {word} x\n" for word in keywords))
    assert resolve_target("h", ssh_config=str(config)).warnings == ()
    assert not {word.lower() for word in keywords} & USED


def test_a_match_paramiko_cannot_evaluate_is_not_applied_and_says_so(tmp_path):
    """paramiko took an unknown Match criterion as matched (its settings
    applied to every host) and ran `Match exec` only where `invoke` is
    installed. Now such a block is not applied, and a host whose other
    criteria it matches gets a warning naming the line; no command runs."""
    ran = tmp_path / "ran"
    config = tmp_path / "config"
    config.write_text("Host web\n"
                      "    User alice\n"
                      f"Match originalhost web exec \"touch {ran}\"\n"
                      "    HostName 10.9.9.9\n"
                      "Match localnetwork 10.0.0.0/8\n"
                      "    Port 2222\n"
                      "Match !originalhost web,gate localaddress 10.0.0.1\n"
                      "    User nobody\n"
                      "Match originalhost db\n"
                      "    HostName 10.1.1.1\n")
    web = resolve_target("web", ssh_config=str(config))
    assert (web.hostname, web.port, web.user) == ("web", 22, "alice")
    assert not ran.exists()
    where = str(config)
    assert web.warnings == (
        f"{where} line 3: `Match originalhost web exec \"touch {ran}\"` may apply to host web, "
        "but ddp-orch cannot evaluate exec; the block's settings are not applied "
        "(`ssh -G web` shows what ssh applies)",
        f"{where} line 5: `Match localnetwork 10.0.0.0/8` may apply to host web, but ddp-orch "
        "cannot evaluate localnetwork; the block's settings are not applied "
        "(`ssh -G web` shows what ssh applies)")
    db = resolve_target("db", ssh_config=str(config))
    assert (db.hostname, db.port) == ("10.1.1.1", 22)
    assert [w.split(":")[0] for w in db.warnings] == [f"{where} line 5", f"{where} line 7"]
    assert "cannot evaluate localaddress" in db.warnings[1]


def test_global_known_hosts_files_are_checked_after_the_users_and_never_warned(tmp_path):
    """OpenSSH checks a host key against GlobalKnownHostsFile too: a key a
    site lists there only was refused by ddp-orch, and the keyword drew an
    "unsupported" warning. The user's files come first (a new key is
    recorded in the first of them); "none" adds nothing."""
    config = tmp_path / "config"
    config.write_text("Host site\n    UserKnownHostsFile ~/kh\n"
                      "    GlobalKnownHostsFile /etc/ssh/site_hosts /etc/ssh/more\n"
                      "Host bare\n    GlobalKnownHostsFile none\n")
    home = os.path.expanduser("~")
    site = resolve_target("site", ssh_config=str(config))
    assert site.known_hosts == (f"{home}/kh", "/etc/ssh/site_hosts", "/etc/ssh/more")
    assert site.warnings == ()
    bare = resolve_target("bare", ssh_config=str(config))
    assert bare.known_hosts == (f"{home}/.ssh/known_hosts",) and bare.warnings == ()
