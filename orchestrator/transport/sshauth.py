"""SSH host keys and login, the way OpenSSH does them (paramiko underneath).

* Host keys: checked against every known_hosts file of the target under
  ``[host]:port``; an unknown key is refused unless ``accept-new`` (then it
  is recorded), a changed key always, each with the command that fixes it.
* Login: public keys only, in OpenSSH's order: identity files, then the
  ssh-agent, then ``~/.ssh/id_*``; the error lists every key tried.
"""

from __future__ import annotations

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


def _known_keys(target: SshTarget) -> dict[str, tuple[paramiko.PKey, str]]:
    """Key type -> (recorded key, file) for ``target`` across its known_hosts files.

    Loaded file by file so a mismatch can name the file to fix. paramiko
    handles hashed names and ``[host]:port``; it skips ``@cert-authority``
    and ``@revoked`` lines.
    """
    found: dict[str, tuple[paramiko.PKey, str]] = {}
    for path in target.known_hosts:
        if not os.path.isfile(path):
            continue
        keys = paramiko.HostKeys()
        try:
            keys.load(path)
        except (OSError, UnicodeDecodeError):
            continue
        for key_type, key in (keys.lookup(target.known_hosts_name) or {}).items():
            found.setdefault(key_type, (key, path))
    return found


def _append_known_host(path: str, name: str, key: paramiko.PKey) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "rb+") as f:
        f.seek(0, os.SEEK_END)
        missing_newline = f.tell() > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
        line = f"{name} {key.get_name()} {key.get_base64()}\n"
        f.write((("\n" if missing_newline else "") + line).encode())


def _prefer_key_types(connection: paramiko.Transport, known_types: list[str]) -> None:
    """Ask the server first for a host key type we already know (as OpenSSH and
    paramiko's SSHClient do); otherwise a host with several keys may show one
    we have no record of and look "changed"."""
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
