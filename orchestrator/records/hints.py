"""What to try after a failure: one hint per kind of failure, read from its own words.

The root cause keeps the rank's own line (``RuntimeError: Gloo
connectFullMesh failed with ... remote=[127.0.1.1]:7569``); the summary adds
the hint these rules find for it, naming the node and the exact setting to
try. Each rule fits one failure: a hint that fits none is better left out
than a wrong one. Pure functions of the text, tested on real error lines
(``tests/unit/records/test_records_hints.py``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Iterable, Protocol, Sequence

from ..agent.layout import SHIM_MODULE


CHECK = "`ddp-orch check` shows the interface each node uses and tests every pair of nodes"
PYTHON = "set `python:` to an interpreter that has torch"

# Gloo: "... timed out connecting: SO_ERROR: Connection refused, remote=[127.0.1.1]:7569$0"
_GLOO_REMOTE = re.compile(r"remote=\[(?P<addr>[^\]]+)\]:(?P<port>\d+)")
# NCCL: "socketStartConnect: Connect to 10.0.0.2<45763> failed : Software caused ..."
_NCCL_REMOTE = re.compile(r"Connect to (?P<addr>[0-9A-Fa-f.:%\w]+)<(?P<port>\d+)>")
# Gloo with a GLOO_SOCKET_IFNAME the host lacks (gloo/transport/tcp/device.cc)
_GLOO_NO_IFACE = re.compile(r"Unable to find address for: ?(?P<name>\S+)")
_NCCL_NO_IFACE = re.compile(r"no socket interface found|No socket interface found"
                            r"|NET/Socket : no interface found", re.IGNORECASE)
_NCCL_NET = re.compile(r"ncclSystemError|ncclRemoteError|unhandled system error"
                       r"|remote process exited or there was a network error"
                       r"|NCCL WARN (?:socket|Net|Bootstrap)|bootstrap", re.IGNORECASE)
# torchrun's rendezvous store (c10d TCPStore) out of reach
_STORE = re.compile(r"failed to connect to any network address of \((?P<host>[^,]+), "
                    r"(?P<port>\d+)\)|client socket has timed out after \d+\w* while trying "
                    r"to connect to \((?P<host2>[^,]+), (?P<port2>\d+)\)")
_NO_TORCH = re.compile(r"No module named '?torch'?(?![\w.])")
# ModuleNotFoundError's words, and the shim's and `python -m`'s (no quotes)
_NO_MODULE = re.compile(r"No module named '?(?P<name>[A-Za-z_][\w.]*?)'?(?![\w.])")
_NOT_JOINED = "did not join the rendezvous before the start timeout"
# Docker's default bridge: the same address on every host, reaching nothing
_DOCKER = ipaddress.ip_network("172.17.0.0/16")


class Failed(Protocol):
    """What a hint reads of a node's outcome (``records.outcome.NodeOutcome``)."""

    node_rank: int
    host: str
    reason: str
    failures: tuple


def failure_hint(root: Failed, nodes: Sequence[Failed] = (), plan: Any = None) -> str | None:
    """The hint for ``root``, the run's root cause, or None when no rule fits.
    ``nodes`` (every node of the run) lets a hint name the peer at fault;
    ``plan`` (the run's ``plan.json``) tells the run's own module, whose
    absence is a matter of ``code:`` (``run_module``)."""
    return hint_for(_own_words(root), root.node_rank, root.host,
                    [(n.node_rank, n.host) for n in nodes if n.node_rank != root.node_rank],
                    module=run_module(plan))


def run_module(plan: Any) -> str | None:
    """The user's ``module:`` (``python -m``) a run ran, from its recorded
    ``plan.json``: the word after the shim's ``-m`` in node 0's argv, when
    it is the run's workload (a built-in's module, ``workloads.linear``, is
    not ``linear``); None for a script, a built-in or no record."""
    try:
        argv = [str(word) for word in plan["nodes"][0]["argv"]]
        at = argv.index(SHIM_MODULE)
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    module = argv[at + 2] if argv[at + 1:at + 2] == ["-m"] and len(argv) > at + 2 else None
    return module if module is not None and module == plan.get("workload") else None


# What says a failure was the network's: the rules above, and a node gone
# silent (a partition or a frozen host) or its connection lost.
_NETWORK = (_GLOO_REMOTE, _NCCL_REMOTE, _GLOO_NO_IFACE, _NCCL_NO_IFACE, _NCCL_NET, _STORE,
            re.compile(re.escape(_NOT_JOINED)),
            re.compile(r"nothing from the node for|connection lost|Connection closed by peer"
                       r"|Connection reset by peer|No route to host"))


def is_network_failure(root: Failed) -> bool:
    """Whether ``root``'s own words say the network failed it (the summary
    then lists each node's interface; after any other failure that list is
    noise)."""
    return any(rule.search(text) for rule in _NETWORK for text in _own_words(root))


def _own_words(root: Failed) -> list[str]:
    """What a failed node said of itself: its reason and its ranks' messages."""
    return [root.reason, *(str(f.get("message", "")) for f in root.failures
                           if isinstance(f, dict))]


def hint_for(texts: Iterable[str], node_rank: int, host: str,
             peers: Sequence[tuple[int, str]] = (), module: str | None = None) -> str | None:
    """The hint for a failure of node ``node_rank`` (``host``) whose own words
    are ``texts``; ``peers``: the run's other nodes, (rank, host);
    ``module``: the run's own ``module:``, if it ran one."""
    text = "\n".join(t for t in texts if t)
    node = f"node {node_rank} ({host})"
    nccl = "nccl" in text.lower() and "gloo" not in text.lower()
    var = "NCCL_SOCKET_IFNAME" if nccl else "GLOO_SOCKET_IFNAME"

    found = _GLOO_NO_IFACE.search(text)
    if found:
        return (f"{node} has no interface {found.group('name')} (GLOO_SOCKET_IFNAME names "
                f"one per host): set that node's own NIC in its `env:`, or remove the variable "
                f"and use network: {{interface: auto}}; {CHECK}")
    if _NCCL_NO_IFACE.search(text):
        return (f"NCCL found no interface on {node} matching NCCL_SOCKET_IFNAME: set that "
                f"node's own NIC in its `env:` (=NAME for an exact name), or use network: "
                f"{{interface: auto}}; {CHECK}")
    peer = _GLOO_REMOTE.search(text) or _NCCL_REMOTE.search(text)
    if peer:
        return _peer_hint(node, peer.group("addr"), peer.group("port"), var, peers)
    if "connectFullMesh failed" in text:
        return (f"{node}'s ranks could not connect to their peers (Gloo): set {var}=<the NIC "
                f"the nodes reach each other on> in each node's `env:`, or use network: "
                f"{{interface: auto}}; {CHECK}")
    store = _STORE.search(text)
    if store:
        from ..agent.wire.addr import hostport

        where = hostport(store.group("host") or store.group("host2"),
                          store.group("port") or store.group("port2"))
        return (f"{node} cannot reach the rendezvous at {where}: set `master.addr` to an "
                f"address of node 0 that every node reaches, and open that port in its "
                f"firewall; {CHECK}")
    if nccl and _NCCL_NET.search(text):
        return (f"NCCL's connections failed on {node}: set NCCL_DEBUG=INFO in `env:` to see "
                f"the interface and address it used, and NCCL_SOCKET_IFNAME=<the NIC the "
                f"nodes reach each other on> in each node's `env:` (or network: "
                f"{{interface: auto}}); {CHECK}")
    if _NOT_JOINED in text:
        if "no answer from the node" in text:
            return (f"{node}'s agent never answered: its login or its Python hangs (a "
                    f"shell profile waiting for input, a stuck mount); try `ssh {host} "
                    f"true` by hand")
        return (f"{node} never reached the rendezvous: usually `master.addr` is not "
                f"reachable from that node, or a firewall blocks the master port; {CHECK}")
    if _NO_TORCH.search(text):
        return f"{node} has no torch for its `python:`: {PYTHON}"
    missing = _NO_MODULE.search(text)
    if missing:
        return _module_hint(node, missing.group("name"), module)
    return None


def _module_hint(node: str, name: str, module: str | None) -> str:
    """A rank could not import ``name``; ``module`` is the run's own."""
    elsewhere = ("install it on the nodes with `setup:` (`pip install ...`, with the node's "
                 "`python:` first on PATH), or set `python:` to an interpreter that has it")
    if module is not None and (module == name or module.startswith(name + ".")):
        top = name.split(".")[0]
        whose = "the run's own module" if module == name else \
            f"the package of the run's own module {module}"
        return (f"{node} cannot import {name!r}, {whose}: every node gets the `code:` "
                f"directory, which is relative to the cluster file; point `code:` at the "
                f"directory that holds {top}/, or {elsewhere}")
    return f"{node} cannot import {name!r}: {elsewhere}"


def _peer_hint(node: str, addr: str, port: str, var: str,
               peers: Sequence[tuple[int, str]]) -> str:
    """A rank could not connect to a peer's advertised address ``addr``."""
    from ..agent.wire.addr import hostport

    where = hostport(addr, port)
    ip = _address(addr)
    if len(peers) == 1:
        owner = f"node {peers[0][0]} ({peers[0][1]})'s ranks"
    else:
        owner = f"a peer of {node}"
    if ip is not None and ip.is_loopback:
        return (f"{owner} advertised a loopback address ({where}), which ranks on other "
                f"hosts cannot reach (its host name resolves to {addr} there): set network: "
                f"{{interface: auto}} or {var}=<its NIC> in that node's `env:`; {CHECK}")
    if ip is not None and ip.version == 4 and ip in _DOCKER:
        return (f"{owner} advertised {where}, Docker's bridge (docker0), which has that "
                f"address on every host and reaches none: set network: {{interface: auto}} "
                f"or {var}=<its NIC> in that node's `env:`; {CHECK}")
    return (f"{node}'s ranks could not connect to a peer at {where}: a firewall between "
            f"the nodes, or {var} names an interface the others cannot reach; {CHECK}")


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


def transport_hint(message: str) -> str:
    """What to do about a node the controller could not start its agent on,
    from the transport's message (``""`` when nothing fits: no hint beats a
    wrong one, such as blaming the Python for a host name that does not resolve)."""
    if "cannot resolve host name" in message:
        return ("check the host name for a typo, its `HostName` in ~/.ssh/config, and that "
                "this machine's DNS or /etc/hosts knows it")
    if "cannot start" in message or "cannot run" in message or "No such file" in message:
        return PYTHON
    if "no answer from" in message or "timed out" in message:
        return ("is the host up, and does a firewall let this machine reach its SSH port? "
                "(`ssh: {connect_timeout: ...}` waits longer)")
    if "No route to host" in message or "Network is unreachable" in message:
        return "this machine has no route to the host: check its address and the network"
    return ""
