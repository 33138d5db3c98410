"""Unit tests of transport/sshauth.py: known_hosts matching."""

from __future__ import annotations

import paramiko
import pytest



@pytest.mark.parametrize("patterns, name, expected", [
    ("[10.0.0.1]:2222", "[10.0.0.1]:2222", True),   # brackets are literal, not a class
    ("[10.0.0.1]:2222", "1", False),
    ("[10.0.0.1]:2222", "[10.0.0.1]:22", False),
    ("10.0.0.1", "[10.0.0.1]:2222", False),           # a port-22 entry is not any port
    ("*", "[10.0.0.1]:2222", True),
    ("[10.0.0.1]:*", "[10.0.0.1]:2222", True),
    ("web?.example.com", "web1.example.com", True),
    ("web?.example.com", "web10.example.com", False),
    ("a.example.com,b.example.com", "b.example.com", True),
    ("WEB.Example.COM", "web.example.com", True),     # case-insensitive
    ("web.example.com", "WEB.EXAMPLE.COM", True),
    ("*.example.com,!bad.example.com", "bad.example.com", False),  # negation vetoes
    ("!bad.example.com,*.example.com", "bad.example.com", False),  # in any position
    ("*.example.com,!bad.example.com", "good.example.com", True),
    ("!bad.example.com", "good.example.com", False),  # negation alone matches nothing
    ("", "host", False),
    ("a,,b", "b", True),
])
def test_known_hosts_pattern_matching(patterns, name, expected):
    from orchestrator.transport.sshauth import host_pattern_matches
    assert host_pattern_matches(patterns, name) is expected


def test_hashed_known_hosts_names_match_only_their_host():
    from orchestrator.transport.sshauth import host_pattern_matches
    hashed = paramiko.HostKeys.hash_host("[10.0.0.1]:2222")
    assert host_pattern_matches(hashed, "[10.0.0.1]:2222")
    assert host_pattern_matches(hashed, "[10.0.0.1]:2222".upper())
    assert not host_pattern_matches(hashed, "[10.0.0.1]:2223")
    for broken in ("|1|", "|1|notbase64!|x", "|1|c2hvcnQ=|x", "|2|abc|def"):
        assert not host_pattern_matches(broken, "[10.0.0.1]:2222")


def test_revoked_entry_reads_only_revoked_lines_for_the_offered_key(tmp_path):
    from orchestrator.transport.sshauth import revoked_entry
    key = paramiko.RSAKey.generate(1024)
    other = paramiko.RSAKey.generate(1024)
    first, second = tmp_path / "kh1", tmp_path / "kh2"
    first.write_text(f"host {key.get_name()} {key.get_base64()}\n"       # plain: trusted
                     f"@cert-authority host {key.get_name()} {key.get_base64()}\n"
                     f"@revoked host {other.get_name()} {other.get_base64()}\n"
                     "@revoked host ssh-ed25519 !!!notbase64\n@revoked\n")
    second.write_bytes(b"\xff\xfe junk\n  @revoked other,host " +
                       f"{key.get_name()} {key.get_base64()} comment here\n".encode())
    paths = [str(tmp_path / "missing"), str(tmp_path), str(first), str(second)]
    assert revoked_entry(paths, "host", key) == (str(second), 2)
    assert revoked_entry(paths[:3], "host", key) is None
    assert revoked_entry(paths, "elsewhere", key) is None


# -- host-key checks against a fake transport --------------------------------------------

class FakeConnection:
    """What ``check_host_key`` asks of a paramiko Transport: the key the
    server offered in the handshake."""

    def __init__(self, key: paramiko.PKey):
        self.key = key

    def get_remote_server_key(self) -> paramiko.PKey:
        return self.key


@pytest.fixture(scope="module")
def host_keys():
    return paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()


def target(tmp_path, strict: str, port: int = 2222):
    from orchestrator.transport.sshconfig import SshTarget
    return SshTarget(name="node-a", hostname="10.0.0.7", port=port, strict_host_keys=strict,
                     known_hosts=(str(tmp_path / "known_hosts"), str(tmp_path / "global")))


def check(tmp_path, key, strict: str, port: int = 2222) -> None:
    from orchestrator.transport.sshauth import check_host_key
    check_host_key(FakeConnection(key), target(tmp_path, strict, port), "node-a")


@pytest.mark.parametrize("port, name", [(2222, "[10.0.0.7]:2222"), (22, "10.0.0.7")])
def test_an_unknown_host_is_refused_unless_accept_new(tmp_path, host_keys, port, name):
    from orchestrator.errors import TransportError
    key, _other = host_keys
    with pytest.raises(TransportError) as info:
        check(tmp_path, key, "yes", port)
    assert info.value.message.startswith(f"REFUSED: unknown host key for {name} (ecdsa-sha2-")
    assert "strict_host_keys: accept-new" in info.value.hint
    assert not (tmp_path / "known_hosts").exists()  # nothing recorded
    check(tmp_path, key, "accept-new", port)  # recorded, in the first file
    assert (tmp_path / "known_hosts").read_text() == (
        f"{name} {key.get_name()} {key.get_base64()}\n")
    check(tmp_path, key, "yes", port)  # known from now on


@pytest.mark.parametrize("strict", ["yes", "accept-new"])
def test_a_changed_host_key_is_always_refused(tmp_path, host_keys, strict):
    from orchestrator.errors import TransportError
    key, other = host_keys
    recorded = f"[10.0.0.7]:2222 {key.get_name()} {key.get_base64()}\n"
    (tmp_path / "global").write_text(recorded)
    check(tmp_path, key, strict)  # the recorded key: accepted
    with pytest.raises(TransportError) as info:
        check(tmp_path, other, strict)
    assert info.value.message.startswith("REFUSED: the host key of [10.0.0.7]:2222 has CHANGED")
    assert str(tmp_path / "global") in info.value.message
    assert info.value.hint.startswith("if the change is expected: ssh-keygen -R ")
    assert (tmp_path / "global").read_text() == recorded  # nothing changed on disk
    assert not (tmp_path / "known_hosts").exists()


def test_a_key_recorded_for_another_host_or_port_is_no_key_for_this_one(tmp_path, host_keys):
    from orchestrator.errors import TransportError
    key, _other = host_keys
    (tmp_path / "known_hosts").write_text(
        f"10.0.0.7 {key.get_name()} {key.get_base64()}\n"           # port 22, not 2222
        f"[10.0.0.70]:2222 {key.get_name()} {key.get_base64()}\n")  # another host
    with pytest.raises(TransportError, match="unknown host key"):
        check(tmp_path, key, "yes")
