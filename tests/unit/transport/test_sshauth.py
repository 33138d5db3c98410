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
