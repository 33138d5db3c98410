"""A throwaway multi-host cluster where every host has a network of its own.

``SshLab`` (tests/labs/sshlab.py) puts every simulated host on one loopback, so
anything that binds "the address my host name resolves to" or "the first
interface" still works there and never reproduces the failures of real
clusters. ``NetLab`` is an ``SshLab`` whose hosts are Linux network
namespaces:

* host ``k`` is the namespace ``netlab-<pid>-<seq>-<k>`` with its own sshd
  (``ip netns exec NS nsenter --uts=FILE sshd -D -e -f CONFIG``), its own UTS
  namespace and host name ``nodeK``, and one NIC: a veth whose other end is a
  port of the lab's bridge in the root namespace;
* the bridge carries ``10.77.N.1/24`` (or ``fd77:N::1/64``) in the root
  namespace, so the controller (the tests, ``ddp-orch``) reaches host ``k``
  at ``10.77.N.(10+k)`` (or ``fd77:N::(10+k)``, the same digits read as
  hex: ``10.77.130.10`` and ``fd77:130::10``); ``N`` is picked per lab so
  that labs coexist, and no address of the machine's own network is used.

Traps that real machines have, all on by default:

1. the host name resolves to loopback: ``/etc/netns/NS/hosts`` (which
   ``ip netns exec`` binds over ``/etc/hosts``) says ``127.0.1.1 nodeK``,
   as Debian and Ubuntu install;
2. a ``docker0`` with ``172.17.0.1/16`` on every host, reaching nothing,
   created before the NIC (so its interface index is lower). The kernel
   here has no ``dummy`` links, so it is a veth pair with both ends in the
   namespace;
3. the NIC name differs per host: ``eth0``, ``ens5``, ``enp3s0``, ``eno1`` ...

Variants: ``family="ipv6"`` (the NICs carry only ``fd77:N::10+k``, sshd
listens there, and the ssh_config ``HostName`` is that address) and
``unreachable=[(src, dst)]``: a ``unreachable`` (or ``prohibit`` /
``blackhole``) route in ``src``'s namespace to ``dst``'s address. That
breaks TCP between the two in both directions (from ``src`` at once; from
``dst`` by timeout, as ``src``'s replies have no route); the controller
still reaches both. ``blocked=[(src, dst)]``: a firewall, as a real host's
would be: an nftables rule in ``dst``'s namespace that drops every packet
from ``src``'s address (``nft``, from ``scripts/install-system-deps``); both
directions time out, and every other path (the controller, the master
port on a third host) stays open.

Every namespace, link, ``/etc/netns/NS`` directory, UTS bind mount and
process in the lab's namespaces is removed on ``stop()`` (also after a
start that failed half way, and at interpreter exit if nobody called it;
not after SIGKILL). Needs root, ``ip`` (iproute2), ``nsenter`` and
``unshare`` (util-linux) and sshd. Checked on this project's test machine
(a Linux 6.18 kernel): namespaces, veth, bridges, IPv6 with ``nodad``, and
unreachable / prohibit / blackhole routes work; ``dummy`` links do not
exist. ``tests/conftest.py`` imports the fixtures ``net_lab`` and
``make_net_lab`` for every test module.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import pytest

from sshlab import (SSHD, SSH_KEYGEN, LabHost, SshLab, SshLabError, _kill_quietly, _write, lacking,
                    lab_factory)

IP = shutil.which("ip") or "/usr/sbin/ip"
NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
INSTALL_HINT = "install iproute2 and util-linux with scripts/install-system-deps, and run as root"
DEFAULT_NICS = ("eth0", "ens5", "enp3s0", "eno1", "enp0s31f6", "ens192")
DOCKER0_ADDR = "172.17.0.1/16"
LOOPBACK_NAME_ADDR = "127.0.1.1"   # Debian's "127.0.1.1 <hostname>"
RUN_DIR = "/run/netlab"            # UTS namespace bind mounts
LOCK_FILE = "/run/netlab.lock"     # N allocation, shared dirs (left in place)
NETNS_ETC = "/etc/netns"
ROUTE_KINDS = ("unreachable", "prohibit", "blackhole")
FAMILIES = ("ipv4", "ipv6")

_seq = itertools.count()


@dataclass(frozen=True)
class NetLabHost(LabHost):
    """A lab host: ``addr`` is its cluster address on ``nic`` in ``netns``."""

    nic: str
    netns: str
    hostname: str
    uts_file: str
    family: str

    @property
    def known_hosts_name(self) -> str:
        # ssh and paramiko look a host up as "addr" on port 22, "[addr]:port" otherwise.
        return self.addr if self.port == 22 else f"[{self.addr}]:{self.port}"

    @property
    def url_addr(self) -> str:
        """``addr`` as it goes before ``:port`` (bracketed for IPv6)."""
        return f"[{self.addr}]" if ":" in self.addr else self.addr


class NetLabError(SshLabError):
    pass


class NetLab(SshLab):
    """``n_hosts`` network namespaces with an sshd each; use as a context manager.

    Besides ``SshLab``'s attributes: ``family``, ``net`` (the lab's ``N``),
    ``bridge``, ``bridge_addr`` (the controller's address on the bridge),
    ``prefixlen``; hosts are ``NetLabHost`` (``nic``, ``netns``,
    ``hostname``). ``exec(host, argv)`` / ``popen(host, argv)`` run a command
    inside a host (its network, UTS namespace and /etc/hosts), ``ns_argv``
    gives the argv for that, and ``netns_pids(host)`` lists what runs there.
    """

    def __init__(self, n_hosts: int = 2, *, family: str = "ipv4",
                 nics: Iterable[str] = DEFAULT_NICS, unreachable: Iterable[tuple] = (),
                 unreachable_route: str = "unreachable", blocked: Iterable[tuple] = (),
                 hostname_loopback: bool = True,
                 docker0: bool = True, port: int = 22, startup_timeout: float = 20.0,
                 **kwargs):
        super().__init__(n_hosts, startup_timeout=startup_timeout, **kwargs)
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}")
        if unreachable_route not in ROUTE_KINDS:
            raise ValueError(f"unreachable_route must be one of {ROUTE_KINDS}")
        self.family = family
        self.nics = list(nics) or list(DEFAULT_NICS)
        for nic in self.nics:
            if not 0 < len(nic) <= 15 or nic in ("lo", "docker0") or "/" in nic:
                raise ValueError(f"bad NIC name {nic!r}")
        self.unreachable = [tuple(pair) for pair in unreachable]
        for src, dst in self.unreachable:
            if not (0 <= src < n_hosts and 0 <= dst < n_hosts) or src == dst:
                raise ValueError(f"bad unreachable pair {(src, dst)}")
        self.unreachable_route = unreachable_route
        self.blocked = [tuple(pair) for pair in blocked]
        for src, dst in self.blocked:
            if not (0 <= src < n_hosts and 0 <= dst < n_hosts) or src == dst:
                raise ValueError(f"bad blocked pair {(src, dst)}")
        if self.blocked and shutil.which("nft") is None:
            lacking("nft is missing: install nftables with scripts/install-system-deps")
        self.hostname_loopback = hostname_loopback
        self.docker0 = docker0
        self.port = port
        pid, seq = os.getpid(), next(_seq) % 256
        self.name = f"netlab-{pid}-{seq}"
        self._link_base = f"nl{pid:x}x{seq:x}"   # 'x' never occurs in hex digits
        self.bridge = self._link_base + "b"
        self.net: int | None = None
        self.bridge_addr = ""
        self.prefixlen = 24 if family == "ipv4" else 64
        # what exists, for stop(): namespaces, root-namespace links, /etc/netns dirs, UTS files
        self._netns: list[str] = []
        self._links: list[str] = []
        self._etc_dirs: list[str] = []
        self._uts_files: list[str] = []

    # -- lifecycle -------------------------------------------------------

    def start(self) -> "NetLab":
        """Build the network, then let ``SshLab.start`` make keys and start the sshds."""
        problem = netns_problem()
        if problem:
            raise NetLabError(problem)
        atexit.register(self.stop)   # a script that forgets stop() leaves nothing either
        try:
            self._build_network()
            super().start()   # calls _make_host, then start_host for each host
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the sshds, kill whatever else runs in the lab's namespaces, and
        delete the links, namespaces, UTS mounts and /etc/netns dirs (best effort,
        each step independent of the others)."""
        atexit.unregister(self.stop)
        super().stop()
        deadline = time.monotonic() + 5
        for ns in self._netns:   # the dead leave the namespace at once, zombies too
            while (pids := _netns_pids(ns)) and time.monotonic() < deadline:
                for pid in pids:
                    _kill_quietly(pid, signal.SIGKILL)
                time.sleep(0.02)
        for link in self._links:   # the veth pairs first, the bridge last
            _run(IP, "link", "del", link, check=False)
        self._links.clear()
        for ns in self._netns:
            _run(IP, "netns", "del", ns, check=False)
        self._netns.clear()
        with _lab_lock():
            for path in self._uts_files:
                _run("umount", path, check=False)
                _unlink(path)
            self._uts_files.clear()
            for path in self._etc_dirs:
                shutil.rmtree(path, ignore_errors=True)
            self._etc_dirs.clear()
            for empty in (NETNS_ETC, RUN_DIR):
                with contextlib.suppress(OSError):
                    os.rmdir(empty)   # only when no other lab uses it (empty)

    def start_host(self, host: LabHost | int | str) -> None:
        """(Re)start one host's sshd inside its namespaces; wait until it accepts logins."""
        host = self.host(host)
        if host.index in self._procs and self._procs[host.index].poll() is None:
            return
        cfg = self._path(f"sshd_{host.alias}.conf")
        _write(cfg, self._sshd_config(host, with_penalties_off=self._supports_penalties()))
        with open(self._path(f"sshd_{host.alias}.log"), "ab") as log:
            # ip netns exec and nsenter exec without forking: the pid is sshd's.
            self._procs[host.index] = subprocess.Popen(
                self.ns_argv(host, SSHD, "-D", "-e", "-f", cfg), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(host)

    # -- running things inside a host -------------------------------------

    def ns_argv(self, host: LabHost | int | str, *argv: str) -> list[str]:
        """Argv that runs ``argv`` inside ``host``: its network namespace (with its
        /etc/hosts) and its UTS namespace (its host name)."""
        host = self.host(host)
        return [IP, "netns", "exec", host.netns, NSENTER, f"--uts={host.uts_file}", *argv]

    def exec(self, host: LabHost | int | str, argv: Iterable[str], *, timeout: float = 60,
             check: bool = False, **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``host`` (text output captured unless told otherwise)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(self.ns_argv(host, *argv), timeout=timeout, check=check, **kwargs)

    def popen(self, host: LabHost | int | str, argv: Iterable[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside ``host`` in the background (stop() kills it if still there)."""
        return subprocess.Popen(self.ns_argv(host, *argv), **kwargs)

    def netns_pids(self, host_or_ns: LabHost | int | str) -> list[int]:
        """Every process inside a host's network namespace (sshds, sessions, commands)."""
        return _netns_pids(self.host(host_or_ns).netns)

    def cut(self, host: LabHost | int | str) -> None:
        """Cut ``host`` off the lab's network, silently: its link leaves the
        bridge, so nothing it sends arrives and nothing comes back, with no
        FIN, no RST and no error on either side (a pulled cable). Its own
        interface stays up."""
        _run(IP, "link", "set", self._outer(host), "nomaster")

    def mend(self, host: LabHost | int | str) -> None:
        """Undo ``cut``."""
        _run(IP, "link", "set", self._outer(host), "master", self.bridge, "up")

    # -- internals -------------------------------------------------------

    def _outer(self, host: LabHost | int | str) -> str:
        return f"{self._link_base}h{self.host(host).index}"

    def _addr(self, index: int) -> str:
        return self._net_addr(10 + index)

    def _net_addr(self, last: int) -> str:
        if self.family == "ipv4":
            return f"10.77.{self.net}.{last}"
        return f"fd77:{self.net}::{last}"   # N and the host part read as in IPv4

    def _make_host(self, index: int) -> NetLabHost:
        key_path = self._path(f"host_{index}_ed25519")
        return NetLabHost(index, f"node{index}", self._addr(index), self.port, key_path,
                          self._keygen(key_path), nic=self.nics[index % len(self.nics)],
                          netns=f"{self.name}-{index}", hostname=f"node{index}",
                          uts_file=os.path.join(RUN_DIR, f"{self.name}-{index}.uts"),
                          family=self.family)

    def _sshd_config(self, host: LabHost, with_penalties_off: bool) -> str:
        text = super()._sshd_config(host, with_penalties_off)
        return text.replace(f"ListenAddress {host.addr}:{host.port}",
                            f"ListenAddress {host.url_addr}:{host.port}", 1)

    def _build_network(self) -> None:
        with _lab_lock():   # pick N and claim it (the bridge's address) atomically
            self.net = _free_net()
            br = self.bridge
            _run(IP, "link", "add", br, "type", "bridge")
            self._links.append(br)
            self.bridge_addr = self._net_addr(1)
            self._add_addr(None, self.bridge_addr, br)
            _run(IP, "link", "set", br, "up")
        for index in range(self.n_hosts):
            self._build_host(index)
        for src, dst in self.unreachable:
            length = 32 if self.family == "ipv4" else 128
            _run(IP, "-n", self._ns(src), "route", "add", self.unreachable_route,
                 f"{self._addr(dst)}/{length}")
        for src, dst in self.blocked:
            self._block(src, dst)

    def _block(self, src: int, dst: int) -> None:
        """An nftables table in ``dst``'s namespace dropping what ``src`` sends."""
        nft = [IP, "netns", "exec", self._ns(dst), shutil.which("nft") or "nft"]
        family = "ip" if self.family == "ipv4" else "ip6"
        _run(*nft, "add", "table", "inet", "netlab")
        _run(*nft, "add chain inet netlab input { type filter hook input priority 0; "
                   "policy accept; }")
        _run(*nft, "add", "rule", "inet", "netlab", "input", family, "saddr",
             self._addr(src), "drop")

    def _ns(self, index: int) -> str:
        return f"{self.name}-{index}"

    def _build_host(self, index: int) -> None:
        ns, name = self._ns(index), f"node{index}"
        nic = self.nics[index % len(self.nics)]
        # /etc/hosts of the host, as Debian writes it (or naming its cluster address)
        etc = os.path.join(NETNS_ETC, ns)
        uts = os.path.join(RUN_DIR, f"{ns}.uts")
        with _lab_lock():   # stop() of another lab removes these dirs when empty
            os.makedirs(etc, exist_ok=True)
            self._etc_dirs.append(etc)
            os.makedirs(RUN_DIR, mode=0o755, exist_ok=True)
            _write(uts, "")
            self._uts_files.append(uts)
        named = LOOPBACK_NAME_ADDR if self.hostname_loopback else self._addr(index)
        _write(os.path.join(etc, "hosts"),
               f"127.0.0.1\tlocalhost\n{named}\t{name}\n"
               "::1\tlocalhost ip6-localhost ip6-loopback\n")
        _run(IP, "netns", "add", ns)
        self._netns.append(ns)
        # a persistent UTS namespace (a bind mount, like ip netns's) with the host name
        _run(UNSHARE, f"--uts={uts}", "hostname", name)
        # no DAD in the namespace: addresses (link-local too) are usable at once
        _run(IP, "netns", "exec", ns, "sh", "-c",
             "for f in /proc/sys/net/ipv6/conf/default/accept_dad "
             "/proc/sys/net/ipv6/conf/all/accept_dad; do [ -w $f ] && echo 0 > $f; done; true")
        _run(IP, "-n", ns, "link", "set", "lo", "up")
        if self.docker0:   # before the NIC: lower ifindex, as on a real host
            _run(IP, "-n", ns, "link", "add", "docker0", "type", "veth", "peer", "name",
                 "vethd0c")
            _run(IP, "-n", ns, "addr", "add", DOCKER0_ADDR, "dev", "docker0")
            _run(IP, "-n", ns, "link", "set", "vethd0c", "up")
            _run(IP, "-n", ns, "link", "set", "docker0", "up")
        outer = f"{self._link_base}h{index}"
        if len(outer) > 15 or len(self.bridge) > 15:
            raise NetLabError(f"link name {outer!r} too long")
        _run(IP, "link", "add", outer, "type", "veth", "peer", "name", nic, "netns", ns)
        self._links.insert(0, outer)   # deleted before the bridge
        _run(IP, "link", "set", outer, "master", self.bridge, "up")
        self._add_addr(ns, self._addr(index), nic)
        _run(IP, "-n", ns, "link", "set", nic, "up")

    def _add_addr(self, ns: str | None, addr: str, dev: str) -> None:
        argv = [IP] + (["-n", ns] if ns else [])
        if self.family == "ipv4":
            _run(*argv, "addr", "add", f"{addr}/{self.prefixlen}", "dev", dev)
        else:
            _run(*argv, "-6", "addr", "add", f"{addr}/{self.prefixlen}", "dev", dev, "nodad")


# -- helpers -------------------------------------------------------------


def ipv6_loopback() -> bool:
    """Whether this machine's loopback has IPv6 ("::1" binds)."""
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


def require_ipv6_loopback() -> None:
    """Skip a test that needs ``::1`` only where this kernel has no IPv6 at
    all; where it has IPv6 but loopback does not bind ``::1``, skip, and
    under ``CI=true`` fail, as the labs do: CI must not skip by accident."""
    if ipv6_loopback():
        return
    if not os.path.exists("/proc/net/if_inet6"):
        pytest.skip("this kernel has no IPv6 (no /proc/net/if_inet6)")
    lacking("IPv6 is off on loopback: ::1 does not bind "
            "(sysctl net.ipv6.conf.lo.disable_ipv6=0 turns it on)")


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                            timeout=30)
    if check and result.returncode != 0:
        raise NetLabError(f"{' '.join(argv)} failed ({result.returncode}): "
                          f"{result.stderr.strip()}")
    return result


def _netns_pids(ns: str) -> list[int]:
    return [int(pid) for pid in _run(IP, "netns", "pids", ns, check=False).stdout.split()]


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


@contextlib.contextmanager
def _lab_lock() -> Iterator[None]:
    """Serialise labs of every process on this machine (N allocation, shared dirs)."""
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _root_networks() -> list:
    """Every address and route prefix of the root namespace."""
    nets = []
    for link in json.loads(_run(IP, "-j", "addr", "show").stdout or "[]"):
        for info in link.get("addr_info", []):
            with contextlib.suppress(KeyError, ValueError):
                nets.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}",
                                                 strict=False))
    for family in ("-4", "-6"):
        for route in json.loads(_run(IP, "-j", family, "route", "show", "table", "all").stdout
                                or "[]"):
            with contextlib.suppress(ValueError):   # "default" and the like
                nets.append(ipaddress.ip_network(route.get("dst", ""), strict=False))
    return nets


def _free_net() -> int:
    """An ``N`` in 1..254 such that neither 10.77.N.0/24 nor fd77:N::/64 overlaps
    anything the root namespace has (the machine's networks, other labs)."""
    taken = _root_networks()
    start = os.getpid() % 254
    for offset in range(254):
        n = (start + offset) % 254 + 1
        mine = (ipaddress.ip_network(f"10.77.{n}.0/24"), ipaddress.ip_network(f"fd77:{n}::/64"))
        if not any(net.version == m.version and net.overlaps(m) and net.prefixlen > 0
                   for net in taken for m in mine):
            return n
    raise NetLabError("no free 10.77.N.0/24 for a network lab")


_problem: list[str] = []


def netns_problem() -> str:
    """Why this machine cannot run a NetLab ("" when it can); probed once."""
    if not _problem:
        _problem.append(_probe())
    return _problem[0]


def _probe() -> str:
    for tool in (SSHD, SSH_KEYGEN, IP, NSENTER, UNSHARE):
        if not os.access(tool, os.X_OK):
            return f"{tool} not found; {INSTALL_HINT}"
    if os.geteuid() != 0:
        return f"network namespaces need root; {INSTALL_HINT}"
    probe = f"netlab-probe-{os.getpid()}"
    made = subprocess.run([IP, "netns", "add", probe], capture_output=True, text=True)
    subprocess.run([IP, "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        return f"`ip netns add` does not work here ({made.stderr.strip()}); {INSTALL_HINT}"
    return ""


# -- pytest fixtures ----------------------------------------------------

def _require_netns() -> None:
    reason = netns_problem()
    if reason:
        lacking(reason)


@pytest.fixture
def make_net_lab() -> Iterator[Callable[..., NetLab]]:
    """Factory: ``make_net_lab(n_hosts=2, family="ipv4", nics=..., unreachable=[(0, 1)],
    unreachable_route=..., hostname_loopback=True, docker0=True)`` starts a fresh
    lab for this test; all are stopped afterwards."""
    yield from lab_factory(NetLab, _require_netns)


@pytest.fixture(scope="module")
def net_lab(request: pytest.FixtureRequest) -> Iterator[NetLab]:
    """A 2-host IPv4 lab with every trap on, shared by a test module (another
    host count: ``@pytest.mark.parametrize("net_lab", [3], indirect=True)``)."""
    _require_netns()
    with NetLab(getattr(request, "param", 2)) as lab:
        yield lab
