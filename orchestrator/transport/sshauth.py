"""SSH host keys and login, the way OpenSSH does them (paramiko underneath).

known_hosts is parsed here, not by paramiko's ``HostKeys``, which gives up on
a whole file at a marker line and knows no wildcards. Login is public keys
only; the error lists every key tried.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import os
import shlex
import threading

import paramiko

from ..errors import TransportError
from .sshconfig import SshTarget

DEFAULT_KEY_FILES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
NETWORK_ERRORS = (paramiko.SSHException, EOFError, OSError)
_known_hosts_lock = threading.Lock()  # check-and-append must not interleave


def prefer_known_key_types(connection: paramiko.Transport, target: SshTarget) -> None:
    """Before the handshake: ask first for key types we have on record."""
    _prefer_key_types(connection, [key.get_name() for key, _ in _known_keys(target).values()])


def check_host_key(connection: paramiko.Transport, target: SshTarget, host: str) -> None:
    """OpenSSH's StrictHostKeyChecking=yes / accept-new, on ``[host]:port``."""
    offered = connection.get_remote_server_key()
    name = target.known_hosts_name
    with _known_hosts_lock:
        revoked = revoked_entry(target.known_hosts, name, offered)
        if revoked:  # first, and in every mode: OpenSSH refuses these outright
            where, line = revoked
            raise TransportError(host,
                f"REFUSED: the host key of {name} is REVOKED: it offers "
                f"{offered.get_name()} {offered.fingerprint}, which {where}:{line} marks "
                "@revoked (a compromised or retired key)",
                "the host's key must be replaced: generate a new host key on it "
                "(its admin: ssh-keygen -A after removing the old one), check the new "
                "fingerprint and record it in known_hosts; accept-new does not override this")
        known = _known_keys(target)  # reread: another node may just have added it
        if known:
            match = known.get(offered.get_name())
            if match and match[0].asbytes() == offered.asbytes():
                return
            where = next(iter(known.values()))[1]
            raise TransportError(host, 
                f"REFUSED: the host key of {name} has CHANGED: it offers "
                f"{offered.get_name()} {offered.fingerprint}, which does not match {where} "
                "(a reinstalled host, or a man-in-the-middle)",
                f"if the change is expected: ssh-keygen -R {shlex.quote(name)} -f "
                f"{shlex.quote(where)}, then connect again")
        if target.strict_host_keys == "accept-new":
            _append_known_host(target.known_hosts[0], name, offered)
            return
    keyscan = "ssh-keyscan " + ("" if target.port == 22 else f"-p {target.port} ")
    raise TransportError(host, 
        f"REFUSED: unknown host key for {name} ({offered.get_name()} {offered.fingerprint}); "
        f"it is not in {', '.join(target.known_hosts) or 'any known_hosts file'}",
        f"after checking the fingerprint, trust it with: {keyscan}"
        f"{shlex.quote(target.hostname)} >> {shlex.quote(target.known_hosts[0])} "
        "-- or set `ssh: {strict_host_keys: accept-new}` in the cluster file")

def authenticate(connection: paramiko.Transport, target: SshTarget, host: str) -> None:
    """Public-key login: identity files, then ssh-agent, then default keys."""
    tried: list[str] = []
    agent = None
    try:
        candidates = [(path, _load_key(path, tried)) for path in target.identity_files]
        if not (target.identities_only and target.identity_files):
            agent = _agent()
            candidates += [(f"ssh-agent {key.get_name()} {key.fingerprint}", key)
                           for key in (agent.get_keys() if agent else ())]
            candidates += [(path, _load_key(path, tried))
                           for path in map(os.path.expanduser, DEFAULT_KEY_FILES)
                           if os.path.exists(path) and path not in target.identity_files]
        seen: set[bytes] = set()
        for label, key in candidates:
            if key is None or key.asbytes() in seen:
                continue
            seen.add(key.asbytes())
            try:
                remaining = connection.auth_publickey(target.user, key)
            except paramiko.BadAuthenticationType as exc:
                raise TransportError(host, f"authentication failed for user {target.user!r}: "
                                  f"{target.address} does not accept public keys "
                                  f"(it allows: {', '.join(exc.allowed_types)})") from None
            except paramiko.AuthenticationException:
                tried.append(f"{label} (rejected)")
                continue
            except NETWORK_ERRORS as exc:
                tried.append(f"{label} ({describe(exc)})")
                break
            if connection.is_authenticated():
                return
            raise TransportError(host, f"authentication for user {target.user!r} needs a further "
                              f"step ({', '.join(remaining)}), which is not supported")
    finally:
        if agent:
            agent.close()
    raise TransportError(host, 
        f"authentication failed for user {target.user!r} on {target.address}; tried: "
        + ("; ".join(tried) or "no keys (no identity file, ssh-agent or ~/.ssh/id_*)"),
        f"is the public key in ~{target.user}/.ssh/authorized_keys there? "
        "Or set ssh.identity_file / ssh.user in the cluster file")


def revoked_entry(paths, name: str, key: paramiko.PKey) -> tuple[str, int] | None:
    """(file, line number) of the first ``@revoked`` line for ``name`` and
    ``key`` across ``paths``, or None; bad lines are skipped, as OpenSSH does."""
    blob = key.asbytes()
    for path in paths:
        for number, fields in _known_hosts_entries(path):
            if len(fields) < 4 or fields[0] != "@revoked":
                continue
            try:
                recorded = base64.b64decode(fields[3], validate=True)
            except (binascii.Error, ValueError):
                continue
            if recorded == blob and host_pattern_matches(fields[1], name):
                return path, number
    return None


def host_pattern_matches(patterns: str, name: str) -> bool:
    """Whether ``name`` (``host`` or ``[host]:port``) matches a known_hosts host
    field as OpenSSH's ``match_hostname`` does: hashed, or wildcards; ``!`` vetoes."""
    name = name.lower()
    if patterns.startswith("|"):
        try:
            return paramiko.HostKeys.hash_host(name, patterns) == patterns
        except (AssertionError, binascii.Error, ValueError, IndexError, TypeError):
            return False  # not a well-formed |1|salt|hash entry
    positive = False
    for pattern in patterns.lower().split(","):
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        if not pattern:
            continue
        # fnmatch knows [seq] classes; OpenSSH has none, so make [ literal
        if fnmatch.fnmatchcase(name, pattern.replace("[", "[[]")):
            if negated:
                return False
            positive = True
    return positive


def _known_keys(target: SshTarget) -> dict[str, tuple[paramiko.PKey, str]]:
    """Key type -> (recorded key, file) for ``target``, file by file so a
    mismatch can name the file to fix; marker and bad lines skipped."""
    found: dict[str, tuple[paramiko.PKey, str]] = {}
    name = target.known_hosts_name
    for path in target.known_hosts:
        for _, fields in _known_hosts_entries(path):
            if fields[0].startswith("@") or len(fields) < 3 \
                    or not host_pattern_matches(fields[0], name):
                continue
            key = _parse_public_key(fields[1], fields[2])
            if key is not None:
                found.setdefault(key.get_name(), (key, path))
    return found


def _known_hosts_entries(path: str):
    """(line number, fields) of each non-comment line of ``path``; nothing if unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read().decode("utf-8", "surrogateescape")
    except OSError:
        return
    for number, line in enumerate(data.splitlines(), 1):
        fields = line.split()
        if fields and not fields[0].startswith("#"):
            yield number, fields


def _parse_public_key(key_type: str, blob: str) -> paramiko.PKey | None:
    try:
        return paramiko.PKey.from_type_string(key_type, base64.b64decode(blob, validate=True))
    except Exception:  # bad base64, unknown or corrupt key: OpenSSH skips the line too
        return None


def _append_known_host(path: str, name: str, key: paramiko.PKey) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "rb+") as f:
        f.seek(0, os.SEEK_END)
        missing_newline = f.tell() > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
        line = f"{name} {key.get_name()} {key.get_base64()}\n"
        f.write((("\n" if missing_newline else "") + line).encode())


def _prefer_key_types(connection: paramiko.Transport, known_types: list[str]) -> None:
    """Ask first for a host key type we know: a host with several keys may
    otherwise show one we have no record of and look "changed"."""
    wanted: list[str] = []
    for key_type in known_types:
        wanted += ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"] if key_type == "ssh-rsa" \
            else [key_type]
    options = connection.get_security_options()
    first = [t for t in wanted if t in options.key_types]
    options.key_types = first + [t for t in options.key_types if t not in first]


def _load_key(path: str, tried: list[str]) -> paramiko.PKey | None:
    if not os.path.exists(path):
        tried.append(f"{path} (missing)")
        return None
    try:
        return paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        tried.append(f"{path} (passphrase-protected: load it into ssh-agent)")
    except (paramiko.SSHException, OSError, ValueError) as exc:
        tried.append(f"{path} (unusable: {describe(exc)})")
    return None


def _agent() -> paramiko.Agent | None:
    if not os.environ.get("SSH_AUTH_SOCK"):
        return None
    try:
        return paramiko.Agent()
    except paramiko.SSHException:
        return None


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, paramiko.SSHException) else f"{type(exc).__name__}: {text}"
