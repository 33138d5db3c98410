"""Work out where and how to SSH to a node, without touching the network.

Resolution order, per setting, is the one a user of ``ssh`` expects:

1. explicit values from the cluster file (the keyword arguments below);
2. ``~/.ssh/config`` (or the ``ssh_config`` path given, with the files its
   ``Include`` lines name): ``HostName``,
   ``Port``, ``User``, ``IdentityFile``, ``IdentitiesOnly``, ``ProxyJump``,
   ``UserKnownHostsFile``, ``ConnectTimeout``, ``StrictHostKeyChecking``;
3. defaults: port 22, the current user, ``~/.ssh/known_hosts``, and (at
   connect time) the ssh-agent and the default key files.

paramiko's ``SSHConfig`` only parses the file; applying what it finds is our
job, and this module is the one place that does it, so it can be unit-tested
on a config file alone.
"""

from __future__ import annotations

import getpass
import glob
import os
import re
import shlex
from dataclasses import dataclass, replace
from typing import Sequence

import paramiko

DEFAULT_SSH_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_CONNECT_TIMEOUT = 10.0
STRICT_MODES = ("yes", "accept-new")
_MAX_JUMPS = 8


@dataclass(frozen=True)
class SshTarget:
    """Everything needed to open one SSH connection, fully resolved.

    ``name`` is the node as the user wrote it (used in error messages);
    ``hostname``/``port`` are what we actually connect to and what the host
    key is looked up under in known_hosts. ``jump`` is the (already resolved)
    host to tunnel through, which may itself have a ``jump``.
    """

    name: str
    hostname: str
    port: int = 22
    user: str = ""
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    strict_host_keys: str = "yes"
    known_hosts: tuple[str, ...] = ()
    jump: "SshTarget | None" = None

    @property
    def known_hosts_name(self) -> str:
        """The key OpenSSH (and paramiko) use in known_hosts: ``[host]:port`` off port 22."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    @property
    def address(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{host}:{self.port}"

    def describe(self) -> str:
        via = f" via {self.jump.describe()}" if self.jump else ""
        return f"{self.user}@{self.address}{via}"


def resolve_target(host: str, *, user: str | None = None, port: int | None = None,
                   identity_file: str | None = None, connect_timeout: float | None = None,
                   strict_host_keys: str | None = None,
                   known_hosts: str | Sequence[str] | None = None,
                   ssh_config: str | None = DEFAULT_SSH_CONFIG,
                   proxy_jump: str | None = None) -> SshTarget:
    """Resolve ``host`` (a name or an ssh_config alias) into an ``SshTarget``.

    ``ssh_config=None`` ignores any config file; a missing file is ignored
    like ``ssh`` does. ``proxy_jump`` uses ProxyJump syntax
    (``[user@]host[:port][,...]``, or ``none``). Raises ``ValueError`` for
    settings we cannot honour (so the caller can name the node in its error).
    """
    config = _load_config(ssh_config)
    return _resolve(host, config, user=user, port=port, identity_file=identity_file,
                    connect_timeout=connect_timeout, strict_host_keys=strict_host_keys,
                    known_hosts=known_hosts, proxy_jump=proxy_jump, depth=0)


def _resolve(host: str, config: paramiko.SSHConfig, *, user, port, identity_file,
             connect_timeout, strict_host_keys, known_hosts, proxy_jump,
             depth: int) -> SshTarget:
    if depth > _MAX_JUMPS:
        raise ValueError(f"ProxyJump chain longer than {_MAX_JUMPS} hops (a loop?)")
    opts = config.lookup(host)
    jumps = proxy_jump if proxy_jump is not None else opts.get("proxyjump", "none")
    if jumps.strip().lower() == "none" and opts.get("proxycommand", "none").lower() != "none":
        raise ValueError(f"ProxyCommand (ssh config for {host!r}) is not supported; "
                         "use ProxyJump instead")

    identity_files = [identity_file] if identity_file else []
    identity_files += opts.get("identityfile", [])
    strict = strict_host_keys or _strict_from_config(opts.get("stricthostkeychecking"))
    if strict not in STRICT_MODES:
        raise ValueError(f"strict_host_keys must be one of {STRICT_MODES}, not {strict!r}")

    if known_hosts is None:
        known_hosts = opts.get("userknownhostsfile", DEFAULT_KNOWN_HOSTS).split()
    elif isinstance(known_hosts, str):
        known_hosts = [known_hosts]
    known_hosts = list(known_hosts) or [DEFAULT_KNOWN_HOSTS]
    timeout = connect_timeout if connect_timeout is not None else \
        float(opts.get("connecttimeout", DEFAULT_CONNECT_TIMEOUT))

    target = SshTarget(
        name=host,
        hostname=opts["hostname"],
        port=int(port if port is not None else opts.get("port", 22)),
        user=user or opts.get("user") or getpass.getuser(),
        identity_files=tuple(dict.fromkeys(_expand(p) for p in identity_files)),
        identities_only=opts.get("identitiesonly", "no").lower() == "yes",
        connect_timeout=timeout,
        strict_host_keys=strict,
        known_hosts=tuple(_expand(p) for p in known_hosts),
    )

    if jumps.strip().lower() == "none":
        return target
    # "a,b" means: reach a, through it reach b, through b reach the target.
    # Each hop is itself resolved through the config (like `ssh -J` does),
    # and inherits the explicit identity file as a last resort.
    jump: SshTarget | None = None
    for spec in jumps.split(","):
        jump_user, jump_host, jump_port = parse_jump_spec(spec)
        hop = _resolve(jump_host, config, user=jump_user, port=jump_port, identity_file=None,
                       connect_timeout=connect_timeout, strict_host_keys=strict_host_keys,
                       known_hosts=known_hosts, proxy_jump=None, depth=depth + 1)
        if identity_file and identity_file not in hop.identity_files:
            hop = replace(hop, identity_files=hop.identity_files + (_expand(identity_file),))
        if jump is not None:
            hop = replace(hop, jump=jump)
        jump = hop
    return replace(target, jump=jump)


def parse_jump_spec(spec: str) -> tuple[str | None, str, int | None]:
    """Split one ProxyJump hop ``[user@]host[:port]`` (IPv6 as ``[addr]:port``)."""
    spec = spec.strip()
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://"):]
    user, _, hostport = spec.rpartition("@")
    port: int | None = None
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif hostport.count(":") == 1:
        host, _, port_text = hostport.partition(":")
        port = int(port_text)
    else:
        host = hostport
    if not host:
        raise ValueError(f"invalid ProxyJump host {spec!r}")
    return (user or None), host, port


def _strict_from_config(value: str | None) -> str:
    """Map StrictHostKeyChecking onto the two modes we support.

    We never accept a *changed* key, so OpenSSH's ``no``/``off`` become
    ``accept-new`` (the closest mode that is still safe); ``ask`` becomes
    ``yes`` since there is nobody to ask.
    """
    value = (value or "yes").lower()
    return "accept-new" if value in ("accept-new", "no", "off") else "yes"


def _load_config(path: str | None) -> paramiko.SSHConfig:
    if path is None:
        return paramiko.SSHConfig()
    path = _expand(path)
    if not os.path.isfile(path):
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_text(_with_includes(path))
    except OSError as exc:
        raise ValueError(f"cannot read ssh config {path}: {exc}") from exc
    except Exception as exc:  # paramiko raises several types for bad syntax
        raise ValueError(f"cannot parse ssh config {path}: {exc}") from exc


_INCLUDE = re.compile(r"^\s*include(?:\s+|\s*=\s*)(?P<paths>.+?)\s*$", re.IGNORECASE)
_MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH


def _with_includes(path: str, depth: int = 0) -> str:
    """The file's text with each ``Include`` replaced by what it names, as
    ``ssh`` reads it: paramiko returns the keyword unread, so a host that
    only an included file describes would resolve as its bare name. Like
    OpenSSH, a relative path is taken under ``~/.ssh``, wildcards expand in
    sorted order, a pattern matching nothing is no error, and an included
    file's ``Host`` lines start blocks of their own."""
    if depth > _MAX_INCLUDE_DEPTH:
        raise ValueError(f"Include nested deeper than {_MAX_INCLUDE_DEPTH} (a loop?) at {path}")
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().splitlines()
    out = []
    for line in lines:
        match = _INCLUDE.match(line)
        if match is None:
            out.append(line)
            continue
        for word in shlex.split(match.group("paths"), comments=False):
            pattern = _expand(word)
            if not os.path.isabs(pattern):
                pattern = os.path.join(_expand("~/.ssh"), pattern)
            for included in sorted(glob.glob(pattern)):
                if os.path.isfile(included):
                    out.append(_with_includes(included, depth + 1))
    return "\n".join(out) + "\n"


def _expand(path: str) -> str:
    return os.path.expanduser(path)


def config_hostname(host: str, ssh_config: str | None = DEFAULT_SSH_CONFIG) -> str:
    """The ``HostName`` that ``~/.ssh/config`` gives alias ``host`` (else ``host``)."""
    return _load_config(ssh_config).lookup(host).get("hostname", host)
