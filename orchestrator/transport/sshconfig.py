"""Work out where and how to SSH to a node, without touching the network.

Each setting comes, as a user of ``ssh`` expects, from the cluster file,
else ``~/.ssh/config`` (with its ``Include`` files), else the defaults.

Nothing in the file is dropped in silence: a keyword that applies to a host
and is neither ``USED`` nor ``IGNORED`` is a warning. A ``Match`` block with
a criterion paramiko cannot evaluate is not applied, with a warning:
paramiko would take an unknown criterion as matched.
"""

from __future__ import annotations

import getpass
import glob
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Sequence

import paramiko

DEFAULT_SSH_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_CONNECT_TIMEOUT = 10.0
STRICT_MODES = ("yes", "accept-new")
_MAX_JUMPS = 8


@dataclass(frozen=True)
class SshTarget:
    """One SSH connection, fully resolved: ``name`` is the node as written, for
    messages; ``hostname`` and ``port`` are dialled and looked up in known_hosts."""

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
    # What of ~/.ssh/config applies to this host (or a hop) but is not used.
    warnings: tuple[str, ...] = ()

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
    """Resolve ``host`` (a name or an ssh_config alias); ``ValueError`` for
    what cannot be honoured, so the caller can name the node."""
    config = load_config(ssh_config)
    return _resolve(host, config, user=user, port=port, identity_file=identity_file,
                    connect_timeout=connect_timeout, strict_host_keys=strict_host_keys,
                    known_hosts=known_hosts, proxy_jump=proxy_jump, depth=0)


def _resolve(host: str, config: "SshConfig", *, user, port, identity_file,
             connect_timeout, strict_host_keys, known_hosts, proxy_jump,
             depth: int) -> SshTarget:
    if depth > _MAX_JUMPS:
        raise ValueError(f"ProxyJump chain longer than {_MAX_JUMPS} hops (a loop?)")
    opts, warnings = config.lookup(host)
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
    # GlobalKnownHostsFile: keys are checked against these too, as OpenSSH
    # does, after the user's files (a new key is recorded in the first of
    # those, never here); "none" or /dev/null adds nothing.
    known_hosts += [p for p in opts.get("globalknownhostsfile", "").split()
                    if p.lower() != "none" and p not in known_hosts]
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
        warnings=warnings,
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
        warnings += hop.warnings
    return replace(target, jump=jump, warnings=tuple(dict.fromkeys(warnings)))


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
    """Map StrictHostKeyChecking onto our two modes. A *changed* key is never
    accepted, so ``no``/``off`` become ``accept-new``; ``ask`` is ``yes``."""
    value = (value or "yes").lower()
    return "accept-new" if value in ("accept-new", "no", "off") else "yes"


# The keywords applied above (the first three are read by paramiko's own
# lookup: Host and Match choose the blocks, Include is read by ``_read``).
USED = frozenset({
    "host", "match", "include", "hostname", "port", "user", "identityfile", "identitiesonly",
    "proxyjump", "proxycommand", "userknownhostsfile", "globalknownhostsfile", "connecttimeout",
    "stricthostkeychecking", "canonicalizehostname", "canonicaldomains",
    "canonicalizemaxdots", "canonicalizefallbacklocal"})

# The keywords ddp-orch leaves unused without a warning, by why they cannot
# change whether, or to which host and as whom, a run's non-interactive
# connection is made. Any other keyword that applies to a host is a warning.
IGNORED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("for an interactive session only: a terminal, escape characters, X11 and "
     "agent forwarding, commands run here after login",
     ("ForwardAgent", "ForwardX11", "ForwardX11Timeout", "ForwardX11Trusted", "XAuthLocation",
      "RequestTTY", "EscapeChar", "EnableEscapeCommandline", "ObscureKeystrokeTiming",
      "PermitLocalCommand", "LocalCommand", "SessionType", "StdinNull", "ForkAfterAuthentication",
      "AddKeysToAgent", "UseKeychain")),
    ("port forwarding and tunnels, which a run does not use",
     ("LocalForward", "RemoteForward", "DynamicForward", "GatewayPorts", "ExitOnForwardFailure",
      "ClearAllForwardings", "PermitRemoteOpen", "StreamLocalBindMask", "StreamLocalBindUnlink",
      "Tunnel", "TunnelDevice")),
    ("keepalives and connection sharing: ddp-orch keeps each of its own connections "
     "alive (every 15 s)",
     ("ServerAliveInterval", "ServerAliveCountMax", "TCPKeepAlive", "ControlMaster",
      "ControlPath", "ControlPersist")),
    ("what ssh prints or logs, and how fast it sends, not what it connects to",
     ("LogLevel", "LogVerbose", "SyslogFacility", "VisualHostKey", "FingerprintHash",
      "Compression", "IPQoS")),
    ("prompts ddp-orch never shows: it logs in with keys only",
     ("BatchMode", "PasswordAuthentication", "KbdInteractiveAuthentication",
      "ChallengeResponseAuthentication", "NumberOfPasswordPrompts")),
    ("how known_hosts is kept, not whether a key is accepted",
     ("HashKnownHosts", "UpdateHostKeys", "CheckHostIP")),
    ("the client's environment: a run's is the explicit env of each node",
     ("SendEnv",)),
    ("about reading the file itself", ("IgnoreUnknown",)),
)
_IGNORED = frozenset(word.lower() for _why, words in IGNORED for word in words)

# ``Match`` criteria paramiko evaluates; it takes any other as matched.
MATCH_EVALUATED = frozenset({"all", "canonical", "final", "host", "originalhost", "user",
                             "localuser"})
_MARK = "xddporchblock"  # a keyword of our own at the top of each block, to see it applied


@dataclass(frozen=True)
class _Line:
    """One setting of the file, where it was written."""

    keyword: str  # as written
    value: str
    text: str
    file: str
    number: int

    @property
    def where(self) -> str:
        home = os.path.expanduser("~")
        shown = "~" + self.file[len(home):] if self.file.startswith(home + os.sep) else self.file
        return f"{shown} line {self.number}"


@dataclass
class _Block:
    """A ``Host`` or ``Match`` block (``header`` None: the lines before any)."""

    header: _Line | None
    lines: list[_Line] = field(default_factory=list)
    unevaluated: tuple[str, ...] = ()  # its Match criteria paramiko cannot evaluate


class SshConfig:
    """An ssh config file read once, looked up per host. Each block carries
    a keyword of ours, so paramiko's lookup also says which blocks applied."""

    def __init__(self, lines: Sequence[_Line] = (), source: str = ""):
        self.blocks: list[_Block] = [_Block(None)]
        for line in lines:
            if line.keyword.lower() in ("host", "match"):
                self.blocks.append(_Block(line, unevaluated=_unevaluated(line)))
            else:
                self.blocks[-1].lines.append(line)
        text = []
        for n, block in enumerate(self.blocks):
            if block.header is not None:
                text.append(_evaluable_header(block) if block.unevaluated else block.header.text)
            text.append(f"{_MARK}{n} yes")
            if not block.unevaluated:  # a block we cannot evaluate is not applied
                text += [line.text for line in block.lines]
        try:
            self._paramiko = paramiko.SSHConfig.from_text("\n".join(text) + "\n")
        except Exception as exc:  # paramiko raises several types for bad syntax
            raise ValueError(f"cannot parse ssh config {source}: {exc}") from exc
        self._looked_up: dict[str, tuple[dict, tuple[str, ...]]] = {}

    def lookup(self, host: str) -> tuple[dict, tuple[str, ...]]:
        """``host``'s settings (lower-case keys) and warnings on what goes unused."""
        if host not in self._looked_up:
            found = self._paramiko.lookup(host)
            applied = sorted(int(key[len(_MARK):]) for key in found if key.startswith(_MARK))
            options = {k: v for k, v in found.items() if not k.startswith(_MARK)}
            self._looked_up[host] = (options, self._warnings(host, applied))
        options, warnings = self._looked_up[host]
        return dict(options), warnings

    def _warnings(self, host: str, applied: Sequence[int]) -> tuple[str, ...]:
        out, seen = [], set()
        for block in (self.blocks[n] for n in applied):
            if block.unevaluated:
                if block.lines:
                    assert block.header is not None
                    out.append(f"{block.header.where}: `{block.header.text}` may apply to "
                               f"host {host}, but ddp-orch cannot evaluate "
                               f"{', '.join(block.unevaluated)}; the block's settings are not "
                               f"applied (`ssh -G {host}` shows what ssh applies)")
                continue
            for line in block.lines:
                key = line.keyword.lower()
                if key in seen:
                    continue  # the first value is the one in effect
                seen.add(key)
                if key not in USED and key not in _IGNORED:
                    out.append(f"{line.where}: `{line.text}` applies to host {host}, but "
                               f"ddp-orch does not support {line.keyword}; it connects "
                               "without it")
        return tuple(out)


def _unevaluated(header: _Line) -> tuple[str, ...]:
    """The ``Match`` criteria of ``header`` that paramiko cannot evaluate."""
    if header.keyword.lower() != "match":
        return ()
    return tuple(dict.fromkeys(criterion for criterion, _words in _criteria(header)
                               if criterion not in MATCH_EVALUATED))


def _criteria(header: _Line) -> list[tuple[str, list[str]]]:
    """``Match``'s criteria, each with its words as written (as paramiko reads them)."""
    try:
        tokens = shlex.split(header.value)
    except ValueError as exc:
        raise ValueError(f"{header.where}: cannot parse `{header.text}`: {exc}") from None
    out = []
    while tokens:
        word = tokens.pop(0)
        criterion = word.lstrip("!").lower()
        words = [word] if criterion in ("all", "canonical", "final") or not tokens \
            else [word, tokens.pop(0)]
        out.append((criterion, words))
    return out


def _evaluable_header(block: _Block) -> str:
    """The block's ``Match`` line with only the criteria paramiko evaluates."""
    assert block.header is not None
    kept = [word for criterion, words in _criteria(block.header)
            if criterion in MATCH_EVALUATED for word in words]
    return "Match " + (shlex.join(kept) if kept else "all")


_CONFIGS: dict[tuple[str, int, int], SshConfig] = {}


def load_config(path: str | None) -> SshConfig:
    """The config at ``path``, cached while unchanged; empty for None or a missing file."""
    if path is None:
        return SshConfig()
    path = _expand(path)
    if not os.path.isfile(path):
        return SshConfig()
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise ValueError(f"cannot read ssh config {path}: {exc}") from exc
    key = (path, stat.st_mtime_ns, stat.st_size)
    if key not in _CONFIGS:
        try:
            _CONFIGS[key] = SshConfig(_read(path), path)
        except OSError as exc:
            raise ValueError(f"cannot read ssh config {path}: {exc}") from exc
    return _CONFIGS[key]


_INCLUDE = re.compile(r"^\s*include(?:\s+|\s*=\s*)(?P<paths>.+?)\s*$", re.IGNORECASE)
_MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH


def _read(path: str, depth: int = 0) -> list[_Line]:
    """The file's settings with file and line, ``Include`` expanded: paramiko
    leaves it unread, and an included host would resolve as its bare name."""
    if depth > _MAX_INCLUDE_DEPTH:
        raise ValueError(f"Include nested deeper than {_MAX_INCLUDE_DEPTH} (a loop?) at {path}")
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().splitlines()
    out = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        match = _INCLUDE.match(line)
        if match is not None:
            for word in shlex.split(match.group("paths"), comments=False):
                pattern = _expand(word)
                if not os.path.isabs(pattern):
                    pattern = os.path.join(_expand("~/.ssh"), pattern)
                for included in sorted(glob.glob(pattern)):
                    if os.path.isfile(included):
                        out += _read(included, depth + 1)
            continue
        setting = paramiko.SSHConfig.SETTINGS_REGEX.match(text)
        if setting is None:
            raise ValueError(f"cannot parse ssh config {path} line {number}: {text!r}")
        out.append(_Line(setting.group(1), setting.group(2), text, path, number))
    return out


def _expand(path: str) -> str:
    return os.path.expanduser(path)


def config_hostname(host: str, ssh_config: str | None = DEFAULT_SSH_CONFIG
                    ) -> tuple[str, tuple[str, ...]]:
    """The ``HostName`` ``~/.ssh/config`` gives alias ``host``, with its warnings."""
    options, warnings = load_config(ssh_config).lookup(host)
    return options.get("hostname", host), warnings
