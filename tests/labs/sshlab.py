"""A throwaway multi-host SSH cluster on loopback, for real (unmocked) tests.

Each simulated host is one ``sshd -D -e`` listening on its own loopback
address (127.0.55.10, .11, ...) and a free port. Everything it needs is
generated per lab in a temp dir: ed25519 host keys, a client key pair,
``authorized_keys``, a ``known_hosts`` with the hosts' keys in the
``[addr]:port`` form, and an ``ssh_config`` with aliases ``node0``, ``node1``
... so that both ``ssh -F <cfg> node0`` and paramiko can log in as the
current user. Nothing leaves 127.0.0.0/8, and nothing global is changed
except creating ``/run/sshd`` (sshd's privilege-separation dir) when root.

``SshLab(n, reverse_dns=False)`` gives hosts whose resolver does not answer,
as on servers without reverse DNS for their addresses: each sshd runs in a
mount namespace of its own (root only) where ``/etc/resolv.conf`` names a
nameserver nobody runs, so every session's lookup of a lab address fails
at once with EAI_AGAIN (what c10d warns about on every store connection).

The lead imports the fixtures into ``tests/conftest.py``::

    from sshlab import make_ssh_lab, ssh_lab  # noqa: F401

Without sshd the fixtures skip, unless ``CI=true``: CI must never skip the
multi-host tests silently, so there they fail with the install hint.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Iterator, NoReturn

import paramiko
import pytest

from ports import free_port

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
FIRST_ADDR = (127, 0, 55, 10)
NO_NAMESERVER = "127.0.55.254"  # no lab host has it: a query there is refused at once
INSTALL_HINT = "install it with scripts/install-system-deps"


@dataclass(frozen=True)
class LabHost:
    """One simulated node. ``host_public_key`` is ``"ssh-ed25519 AAAA..."``."""

    index: int
    alias: str
    addr: str
    port: int
    host_key_path: str
    host_public_key: str

    @property
    def known_hosts_name(self) -> str:
        return f"[{self.addr}]:{self.port}"

    @property
    def known_hosts_line(self) -> str:
        return f"{self.known_hosts_name} {self.host_public_key}"


class SshLabError(RuntimeError):
    pass


class SshLab:
    """``n_hosts`` real sshd instances; use as a context manager.

    Attributes after ``start()``: ``hosts`` (list of ``LabHost``), ``user``,
    ``dir``, ``client_key`` (private key path), ``client_public_key``,
    ``known_hosts``, ``ssh_config``.
    """

    def __init__(self, n_hosts: int = 2, *, startup_timeout: float = 15.0, sftp: bool = False,
                 extra_sshd: tuple[str, ...] | list[str] = (), reverse_dns: bool = True):
        if not 1 <= n_hosts <= 200:
            raise ValueError("n_hosts must be between 1 and 200")
        self.n_hosts = n_hosts
        self.startup_timeout = startup_timeout
        # No SFTP subsystem by default, as on hardened hosts: ddp-orch must not need it.
        self.sftp = sftp
        self.extra_sshd = list(extra_sshd)  # more sshd_config lines for every host
        self.reverse_dns = reverse_dns  # False: the hosts' resolver never answers
        self.user = getpass.getuser()
        self.hosts: list[LabHost] = []
        self.dir = ""
        self._procs: dict[int, subprocess.Popen] = {}  # host index -> its sshd

    # -- lifecycle -------------------------------------------------------

    def __enter__(self) -> "SshLab":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "SshLab":
        """Generate keys and configs, start every sshd, wait until each accepts logins."""
        missing = [p for p in (SSHD, SSH_KEYGEN) if not os.access(p, os.X_OK)]
        if missing:
            raise SshLabError(f"{', '.join(missing)} not found; {INSTALL_HINT}")
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="sshlab-")
        try:
            self.client_key = self._path("client_ed25519")
            self.client_public_key = self._keygen(self.client_key)
            self.authorized_keys = self._path("authorized_keys")
            _write(self.authorized_keys, self.client_public_key + "\n")
            self._spare_key = self._path("spare_ed25519")  # a key no host has
            self._spare_public_key = self._keygen(self._spare_key)
            self.hosts = [self._make_host(i) for i in range(self.n_hosts)]
            self.known_hosts = self._path("known_hosts")
            self.write_known_hosts(self.known_hosts)
            self.ssh_config = self._path("ssh_config")
            _write(self.ssh_config, self._client_config())
            for host in self.hosts:
                self.start_host(host)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the sshds this lab started (TERM, then KILL) and delete the lab dir."""
        for index in list(self._procs):
            self.stop_host(index)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def start_host(self, host: LabHost | int | str) -> None:
        """(Re)start one host's sshd on its address and port; wait until it accepts logins."""
        host = self.host(host)
        if host.index in self._procs and self._procs[host.index].poll() is None:
            return
        cfg = self._path(f"sshd_{host.alias}.conf")
        _write(cfg, self._sshd_config(host, with_penalties_off=self._supports_penalties()))
        log = open(self._path(f"sshd_{host.alias}.log"), "ab")
        with log:
            self._procs[host.index] = subprocess.Popen(
                [*self._resolver_down(), SSHD, "-D", "-e", "-f", cfg], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(host)

    def _resolver_down(self) -> list[str]:
        """The argv before sshd's that runs it where the resolver does not
        answer (``reverse_dns=False``): its own mount namespace, with a
        ``resolv.conf`` of ``NO_NAMESERVER`` over the machine's; [] otherwise.
        ``exec`` keeps sshd's pid the one this lab knows."""
        if self.reverse_dns:
            return []
        unshare = shutil.which("unshare")
        if os.geteuid() != 0 or unshare is None:
            raise SshLabError("a lab without reverse DNS needs root and unshare(1)")
        conf = self._path("resolv.conf")
        _write(conf, f"nameserver {NO_NAMESERVER}\noptions timeout:1 attempts:1\n")
        return [unshare, "--mount", "--", "sh", "-c",
                f'mount --bind {conf} /etc/resolv.conf && exec "$@"', "sh"]

    def stop_host(self, host: LabHost | int | str) -> None:
        """Stop one host's listener and its sessions, e.g. to simulate a dead node."""
        index = self.host(host).index
        proc = self._procs.pop(index, None)
        if proc is None:
            return
        sessions = self.session_pids(index, proc.pid)
        _terminate(proc)
        for pid in sessions:
            _kill_quietly(pid, signal.SIGKILL)

    # -- lookups ---------------------------------------------------------

    def host(self, key: LabHost | int | str) -> LabHost:
        """A host by ``LabHost``, index or alias."""
        if isinstance(key, LabHost):
            return key
        if isinstance(key, int):
            return self.hosts[key]
        for host in self.hosts:
            if key in (host.alias, host.addr):
                return host
        raise KeyError(key)

    def listener_pid(self, host: LabHost | int | str) -> int:
        return self._procs[self.host(host).index].pid

    def client(self, host: LabHost | int | str) -> paramiko.SSHClient:
        """A paramiko client logged in to ``host`` as the lab's user, its host
        key checked against the lab's ``known_hosts`` (an unknown one refused)."""
        host = self.host(host)
        client = paramiko.SSHClient()
        client.load_host_keys(self.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(host.addr, host.port, username=self.user, key_filename=self.client_key,
                       allow_agent=False, look_for_keys=False, timeout=5)
        return client

    def ssh_argv(self, host: LabHost | int | str, *command: str) -> list[str]:
        """Argv for the system ``ssh`` client to run ``command`` on ``host``."""
        return ["ssh", "-F", self.ssh_config, self.host(host).alias, *command]

    def sshd_log(self, host: LabHost | int | str) -> str:
        with open(self._path(f"sshd_{self.host(host).alias}.log"), errors="replace") as f:
            return f.read()

    # -- faults ----------------------------------------------------------

    def session_pids(self, host: LabHost | int | str, listener: int | None = None) -> list[int]:
        """PIDs of the per-connection sshd processes under ``host``'s listener.

        These are the listener's descendants that are sshd itself (the
        privileged monitor, the unprivileged ``user@notty`` child, and
        ``sshd-session`` on OpenSSH >= 9.8); the user's commands are not
        included. Found through /proc, so only processes this lab started.
        """
        listener = listener or self.listener_pid(host)
        children = _children_by_parent()
        found, todo = [], [listener]
        while todo:
            for child in children.get(todo.pop(), []):
                todo.append(child)
                if _is_sshd(child):
                    found.append(child)
        return found

    def kill_sessions(self, host: LabHost | int | str, sig: int = signal.SIGKILL) -> list[int]:
        """Kill ``host``'s per-connection sshds: every SSH connection to it drops.

        The listener stays up, so new connections work. Remote commands lose
        their stdin/stdout pipes (EOF / SIGPIPE), like on a real link loss
        where sshd notices first.
        """
        pids = self.session_pids(host)
        for pid in pids:
            _kill_quietly(pid, sig)
        return pids

    def write_known_hosts(self, path: str, *, omit: tuple = (), wrong: tuple = ()) -> str:
        """Write a known_hosts for the lab hosts to ``path``.

        Hosts in ``omit`` (indexes, aliases or ``LabHost``s) are left out
        (their key is *unknown*); hosts in ``wrong`` get a key that is not
        theirs (their key has *changed*).
        """
        omit_ix = {self.host(h).index for h in omit}
        wrong_ix = {self.host(h).index for h in wrong}
        lines = []
        for host in self.hosts:
            if host.index in omit_ix:
                continue
            key = self._spare_public_key if host.index in wrong_ix else host.host_public_key
            lines.append(f"{host.known_hosts_name} {key}\n")
        _write(path, "".join(lines))
        return path

    def host_key_mismatch(self, host: LabHost | int | str, path: str | None = None) -> str:
        """A known_hosts file where ``host`` has the WRONG key (others are right)."""
        path = path or self._path(f"known_hosts_wrong_{self.host(host).alias}")
        return self.write_known_hosts(path, wrong=(host,))

    # -- internals -------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _keygen(self, path: str) -> str:
        subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "sshlab", "-f", path],
                       check=True, stdin=subprocess.DEVNULL, capture_output=True)
        with open(path + ".pub") as f:
            kind, blob = f.read().split()[:2]
        return f"{kind} {blob}"

    def _make_host(self, index: int) -> LabHost:
        addr = ".".join(map(str, FIRST_ADDR[:3] + (FIRST_ADDR[3] + index,)))
        if FIRST_ADDR[3] + index > 254:
            raise SshLabError("too many lab hosts for 127.0.55.0/24")
        key_path = self._path(f"host_{index}_ed25519")
        return LabHost(index, f"node{index}", addr, free_port(addr), key_path,
                       self._keygen(key_path))

    def _sshd_config(self, host: LabHost, with_penalties_off: bool) -> str:
        lines = [
            f"ListenAddress {host.addr}:{host.port}",
            f"HostKey {host.host_key_path}",
            f"PidFile {self._path(f'sshd_{host.alias}.pid')}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",          # the lab dir lives in /tmp
            "PermitUserEnvironment no",  # no AcceptEnv either: env goes through env(1)
            "UseDNS no",
            "PrintMotd no",
            "X11Forwarding no",
            "AllowTcpForwarding yes",  # ProxyJump between lab hosts
            "MaxSessions 64",
            "MaxStartups 100",
            "MaxAuthTries 20",
            "LoginGraceTime 30",
            "LogLevel VERBOSE",
        ]
        if self.sftp:
            lines.append("Subsystem sftp internal-sftp")
        lines += self.extra_sshd
        if with_penalties_off:
            # OpenSSH >= 9.8 penalises sources that crash sessions or fail auth;
            # our fault tests do both on purpose from 127.0.0.1.
            lines.append("PerSourcePenalties no")
        return "\n".join(lines) + "\n"

    def _supports_penalties(self) -> bool:
        if not hasattr(self, "_penalties"):
            probe = self._path("probe.conf")
            _write(probe, f"HostKey {self.hosts[0].host_key_path}\nPerSourcePenalties no\n")
            self._penalties = subprocess.run(
                [SSHD, "-t", "-f", probe], capture_output=True).returncode == 0
        return self._penalties

    def _client_config(self) -> str:
        blocks = []
        for host in self.hosts:
            blocks.append("\n".join([
                f"Host {host.alias}",
                f"    HostName {host.addr}",
                f"    Port {host.port}",
                f"    User {self.user}",
                f"    IdentityFile {self.client_key}",
                "    IdentitiesOnly yes",
                f"    UserKnownHostsFile {self.known_hosts}",
                "    GlobalKnownHostsFile /dev/null",
                "    StrictHostKeyChecking yes",
                "    BatchMode yes",
                "    ConnectTimeout 5",
                "    LogLevel ERROR",
            ]))
        return "\n\n".join(blocks) + "\n"

    def _wait_ready(self, host: LabHost) -> None:
        """Poll a TCP connect, then a real key login, until ``startup_timeout``."""
        proc = self._procs[host.index]
        deadline = time.monotonic() + self.startup_timeout
        key = paramiko.Ed25519Key.from_private_key_file(self.client_key)
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SshLabError(f"sshd for {host.alias} exited with {proc.returncode}:\n"
                                  + self.sshd_log(host))
            try:
                with socket.create_connection((host.addr, host.port), timeout=1) as sock:
                    transport = paramiko.Transport(sock)
                    try:
                        transport.start_client(timeout=5)
                        transport.auth_publickey(self.user, key)
                    finally:
                        transport.close()
                break
            except (OSError, paramiko.SSHException) as exc:
                last_error = exc
                time.sleep(0.05)
        else:
            raise SshLabError(f"sshd for {host.alias} ({host.addr}:{host.port}) not ready after "
                              f"{self.startup_timeout:g}s: {last_error!r}\n" + self.sshd_log(host))
        # Let the probe's session process exit, so that a fresh lab has no
        # sessions and session_pids() only ever sees the tests' connections.
        while self.session_pids(host) and time.monotonic() < deadline:
            time.sleep(0.02)


# -- helpers -------------------------------------------------------------

def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _terminate(proc: subprocess.Popen, grace: float = 3.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _kill_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # the command name is in parentheses and may contain spaces
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def _is_sshd(pid: int) -> bool:
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    return exe.startswith("sshd")


# -- pytest fixtures ----------------------------------------------------

def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def lacking(reason: str) -> NoReturn:
    """This machine lacks what a lab or a test needs: skip, saying why;
    under ``CI=true`` fail instead, since CI must never skip by accident."""
    if _in_ci():
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def _require_sshd() -> None:
    for tool in (SSHD, SSH_KEYGEN):
        if not os.access(tool, os.X_OK):
            lacking(f"{tool} not found; {INSTALL_HINT}")


def lab_factory(lab_class: type, require: Callable[[], None]) -> Iterator[Callable[..., SshLab]]:
    """The body of a ``make_*_lab`` fixture: ``make(n_hosts, **kwargs)``
    starts a fresh ``lab_class`` for the test (after ``require``, which skips
    or fails where the lab cannot run); every lab made is stopped afterwards."""
    labs: list[SshLab] = []

    def make(n_hosts: int = 2, **kwargs) -> SshLab:
        require()
        lab = lab_class(n_hosts, **kwargs)
        labs.append(lab)
        return lab.start()

    try:
        yield make
    finally:
        for lab in labs:
            lab.stop()


@pytest.fixture
def make_ssh_lab() -> Iterator[Callable[..., SshLab]]:
    """Factory: ``make_ssh_lab(n)`` starts a fresh ``n``-host lab for this test
    (use it for tests that kill or stop things); all are stopped afterwards."""
    yield from lab_factory(SshLab, _require_sshd)


@pytest.fixture(scope="module")
def ssh_lab(request: pytest.FixtureRequest) -> Iterator[SshLab]:
    """A lab shared by a test module; 2 hosts unless parametrised indirectly:
    ``@pytest.mark.parametrize("ssh_lab", [3], indirect=True)``."""
    _require_sshd()
    with SshLab(getattr(request, "param", 2)) as lab:
        yield lab
