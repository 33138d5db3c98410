"""What to try after a failure: one hint per kind of failure, read from its
typed reason and, for what the ranks said, their own words.

Each rule fits one failure and names the node and the exact setting to
try: no hint beats a wrong one. Pure functions of the outcome.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Iterable, Protocol, Sequence

from typing import TYPE_CHECKING

from ..agent.layout import SHIM_MODULE

if TYPE_CHECKING:
    from .outcome import EndReason


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
# NCCL's words that a connection, not the node, failed it (its "Last error:")
_NCCL_SOCKET = re.compile(r"ncclRemoteError|remote process exited or there was a network error"
                          r"|socket|Bootstrap|NET/|Connection (?:refused|reset|closed)"
                          r"|Network is unreachable|timed out", re.IGNORECASE)
# torch's words on every ncclSystemError, which name a socket whatever failed
_NCCL_BOILERPLATE = re.compile(r"System call \(e\.g\. socket, malloc\) or external library "
                               r"call failed or device error\.?")
# A node's own limits and GPUs, by NCCL's and CUDA's words as they print
# (each quoted from a public report in tests/unit/records/test_records_hints.py).
_SHM = re.compile(r"Error while creating shared memory segment|posix_fallocate failed"
                  r"|failed to extend /dev/shm|insufficient shared memory \(shm\)"
                  r"|out of shared memory"
                  r"|No space left on device.{0,80}/dev/shm|/dev/shm.{0,80}No space left",
                  re.IGNORECASE)
_MEMLOCK = re.compile(r"ibv_reg_mr\w* failed|Unable to register memory|ibv_create_cq\w* failed"
                      r".{0,40}Cannot allocate memory", re.IGNORECASE)
_DUPLICATE_GPU = re.compile(r"Duplicate GPU detected : rank (?P<a>\d+) and rank (?P<b>\d+) "
                            r"both on CUDA device (?P<bus>\w+)")
_NO_KERNEL = re.compile(r"no kernel image is available for execution on the device"
                        r"|is not compatible with the current PyTorch installation", re.IGNORECASE)
_BUSY_DEVICE = re.compile(r"all CUDA-capable devices are busy or unavailable"
                          r"|CUDA_ERROR_DEVICES_UNAVAILABLE", re.IGNORECASE)
_P2P = re.compile(r"peer access is not supported|cudaIpcOpenMemHandle|P2P/IPC.{0,60}fail"
                  r"|peer mapping resources exhausted|cudaErrorPeerAccess", re.IGNORECASE)
# A collective that timed out, by torch's watchdog (no network words: a hang)
_COLLECTIVE_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout"
                                 r"|collective operation timeout", re.IGNORECASE)
# torchrun's rendezvous store (c10d TCPStore) out of reach
_STORE = re.compile(r"failed to connect to any network address of \((?P<host>[^,]+), "
                    r"(?P<port>\d+)\)|client socket has timed out after \d+\w* while trying "
                    r"to connect to \((?P<host2>[^,]+), (?P<port2>\d+)\)")
_NO_TORCH = re.compile(r"No module named '?torch'?(?![\w.])")
# ModuleNotFoundError's words, and the shim's and `python -m`'s (no quotes)
_NO_MODULE = re.compile(r"No module named '?(?P<name>[A-Za-z_][\w.]*?)'?(?![\w.])")
# Docker's default bridge: the same address on every host, reaching nothing
_DOCKER = ipaddress.ip_network("172.17.0.0/16")


class Failed(Protocol):
    """What a hint reads of a node's outcome (``records.outcome.NodeOutcome``)."""

    node_rank: int
    host: str
    reason: str
    why: EndReason
    failures: tuple


def failure_hint(root: Failed, nodes: Sequence[Failed] = (), plan: Any = None) -> str | None:
    """The hint for ``root``, the run's root cause, or None. ``nodes`` lets a
    hint name the peer at fault; ``plan`` gives the run's own module."""
    return hint_for(_own_words(root), root.node_rank, root.host,
                    [(n.node_rank, n.host) for n in nodes if n.node_rank != root.node_rank],
                    module=run_module(plan), why=root.why)


def run_module(plan: Any) -> str | None:
    """The user's ``module:`` a run ran, from its ``plan.json`` (node 0's ``-m``
    word, if it is the workload); None for a script, a built-in or no record."""
    try:
        argv = [str(word) for word in plan["nodes"][0]["argv"]]
        at = argv.index(SHIM_MODULE)
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    module = argv[at + 2] if argv[at + 1:at + 2] == ["-m"] and len(argv) > at + 2 else None
    return module if module is not None and module == plan.get("workload") else None


# What the ranks say when the network failed them. A node gone silent, never
# joined or its connection lost says it by its reason (``NETWORK_REASONS``).
_NETWORK = (_GLOO_REMOTE, _NCCL_REMOTE, _GLOO_NO_IFACE, _NCCL_NO_IFACE, _NCCL_NET, _STORE,
            re.compile(r"Connection closed by peer|Connection reset by peer|No route to host"))


def is_network_failure(root: Failed) -> bool:
    """Whether ``root`` failed by the network, by its reason or its ranks' own
    words (only then does the summary list each node's interface)."""
    from .outcome import NETWORK_REASONS

    return root.why in NETWORK_REASONS or any(
        rule.search(text) for rule in _NETWORK for text in _own_words(root))


def _own_words(root: Failed) -> list[str]:
    """What a failed node said of itself: its reason and its ranks' messages."""
    return [root.reason, *(f.message for f in root.failures)]


def hint_for(texts: Iterable[str], node_rank: int, host: str,
             peers: Sequence[tuple[int, str]] = (), module: str | None = None,
             why: "EndReason | None" = None) -> str | None:
    """The hint for a failure of node ``node_rank`` (``host``) from its own
    words ``texts`` and, where there is one, its end's reason ``why``;
    ``peers``: the other nodes, as (rank, host)."""
    from .outcome import EndReason  # a dry run's hints (``CHECK``) need no outcome

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
    gpu = gpu_hint(text, node)
    if gpu is not None:
        return gpu
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
    if nccl and _NCCL_NET.search(text) and _NCCL_SOCKET.search(_NCCL_BOILERPLATE.sub("", text)):
        return (f"NCCL's connections failed on {node}: set NCCL_DEBUG=INFO in `env:` to see "
                f"the interface and address it used, and NCCL_SOCKET_IFNAME=<the NIC the "
                f"nodes reach each other on> in each node's `env:` (or network: "
                f"{{interface: auto}}); {CHECK}")
    if nccl and _NCCL_NET.search(text):
        return (f"NCCL failed on {node} without saying which call (an \"unhandled system "
                f"error\"): set NCCL_DEBUG=WARN in `env:` to see it; on a lab box it is most "
                f"often {SHM_FIX}; {MEMLOCK_FIX}; {P2P_FIX}; a GPU in exclusive compute mode "
                f"(`nvidia-smi -q -d COMPUTE`); or the interface (NCCL_SOCKET_IFNAME=<the NIC "
                f"the nodes reach each other on>); `ddp-orch check --collective` tries NCCL "
                f"across the run's layout")
    if why is EndReason.NO_ANSWER:
        return (f"{node}'s agent never answered: its login or its Python hangs (a "
                f"shell profile waiting for input, a stuck mount); try `ssh {host} "
                f"true` by hand")
    if why is EndReason.START_TIMEOUT:
        return (f"{node} never reached the rendezvous: usually `master.addr` is not "
                f"reachable from that node, or a firewall blocks the master port; {CHECK}")
    if _NO_TORCH.search(text):
        return f"{node} has no torch for its `python:`: {PYTHON}"
    missing = _NO_MODULE.search(text)
    if missing:
        return _module_hint(node, missing.group("name"), module)
    return None


SHM_FIX = ("a small /dev/shm (Docker gives 64 MiB: run the container with --shm-size=1g or "
           "--ipc=host; NCCL_SHM_DISABLE=1 goes slower without it)")
MEMLOCK_FIX = ("a low locked-memory limit where there is InfiniBand (`ulimit -l` must be "
               "unlimited: memlock in /etc/security/limits.conf, or docker --ulimit memlock=-1; "
               "NCCL_IB_DISABLE=1 as a test)")
P2P_FIX = ("GPU peer-to-peer that hangs behind an IOMMU or PCIe ACS, or on consumer cards "
           "(NCCL_P2P_DISABLE=1 in `env:` as a test; if that works, disable ACS or the IOMMU, "
           "or keep the variable)")

# The CUDA driver API's errors a node's driver may answer its first calls with
# (cuInit, cuDeviceGetCount), each with what it means there and its own fix.
CUDA_DRIVER_ERRORS: dict[int, tuple[str, str, str]] = {
    3: ("CUDA_ERROR_NOT_INITIALIZED", "the driver was not initialised",
        "run `nvidia-smi` there: the driver must load before CUDA can"),
    46: ("CUDA_ERROR_DEVICES_UNAVAILABLE", "every GPU is busy or unavailable (an exclusive or "
         "prohibited compute mode)", "see `nvidia-smi -q -d COMPUTE`; `sudo nvidia-smi -c "
         "DEFAULT` lets several processes use them"),
    100: ("CUDA_ERROR_NO_DEVICE", "no GPU is visible to it", "a container needs the GPUs "
          "passed in (docker --gpus all); a CUDA_VISIBLE_DEVICES set in the node's login may "
          "hide them"),
    101: ("CUDA_ERROR_INVALID_DEVICE", "CUDA_VISIBLE_DEVICES names a GPU there is not",
          "unset CUDA_VISIBLE_DEVICES in the node's login: ddp-orch sets it per rank"),
    803: ("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "the loaded kernel driver and its CUDA library "
          "differ (a driver upgraded without a reboot)", "reboot the node, or reload the "
          "nvidia kernel modules"),
    804: ("CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "a CUDA forward-compatibility library "
          "is in use on a GPU that does not support it", "remove the cuda-compat directory "
          "from LD_LIBRARY_PATH there, or upgrade the driver"),
    999: ("CUDA_ERROR_UNKNOWN", "the driver does not start (usually its nvidia-uvm module is "
          "not loaded, as after a reboot or a suspend)", "load it as root: `sudo modprobe "
          "nvidia-uvm` (after a suspend, `sudo modprobe -r nvidia_uvm` first; `sudo "
          "nvidia-modprobe -u -c=0` makes its device files too)"),
}


def cuda_error_words(call: str, code: int) -> tuple[str, str]:
    """What a CUDA driver answering ``call`` with ``code`` means, and its fix
    (``CUDA_DRIVER_ERRORS``, else the code itself)."""
    name, what, fix = CUDA_DRIVER_ERRORS.get(code, (f"error {code}", "", ""))
    said = f"its CUDA driver fails {call} with {code} ({name})" + (f": {what}" if what else "")
    return said, fix or ("see NVIDIA's CUDA driver API error codes; `nvidia-smi` and `dmesg` "
                         "on that node say more")


# A rank's own words for a CUDA driver error: torch's, CUDA's, or cuInit's.
_CUDA_TEXTS = (
    (999, re.compile(r"CUDA unknown error|CUDA_ERROR_UNKNOWN|cuInit\b.{0,40}\b999\b",
                     re.IGNORECASE)),
    (803, re.compile(r"system has unsupported display driver / cuda driver combination"
                     r"|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH|Driver/library version mismatch",
                     re.IGNORECASE)),
    (804, re.compile(r"forward compatibility was attempted on non supported HW"
                     r"|CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", re.IGNORECASE)),
    (100, re.compile(r"no CUDA-capable device is detected|CUDA_ERROR_NO_DEVICE", re.IGNORECASE)),
)
_OLD_DRIVER = re.compile(r"CUDA driver version is insufficient for CUDA runtime version"
                         r"|The NVIDIA driver on your system is too old", re.IGNORECASE)


def gpu_hint(text: str, node: str) -> str | None:
    """The hint for a failure the GPUs, driver or limits caused, from NCCL's and
    CUDA's words; else None."""
    duplicate = _DUPLICATE_GPU.search(text)
    if duplicate:
        return (f"ranks {duplicate.group('a')} and {duplicate.group('b')} on {node} both "
                f"opened the GPU at bus {duplicate.group('bus')}: each rank must take its "
                f"own, `torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"]))` before any "
                f"CUDA call (ddp-orch gives the node's ranks CUDA_VISIBLE_DEVICES; a program "
                f"that sets its own, or uses cuda:0 on every rank, puts them on one GPU)")
    if _SHM.search(text):
        return (f"{node} ran out of shared memory for NCCL (or a DataLoader): "
                f"{SHM_FIX}; `ddp-orch check` says each node's /dev/shm")
    if _MEMLOCK.search(text):
        return (f"NCCL could not register its buffers with the InfiniBand NIC on {node}: "
                f"{MEMLOCK_FIX}; `ddp-orch check` says each node's limit")
    if _NO_KERNEL.search(text):
        return (f"{node}'s torch has no kernel built for its GPU's compute capability: "
                f"install a torch built for it there (`python -c 'import torch; "
                f"print(torch.cuda.get_arch_list())'` lists what it has; a GPU newer than the "
                f"torch needs a newer CUDA build); `ddp-orch check` compares them")
    if _BUSY_DEVICE.search(text):
        return (f"a GPU on {node} takes one process at a time (exclusive or prohibited compute "
                f"mode), or another process holds it: `nvidia-smi -q -d COMPUTE` shows the "
                f"mode, `sudo nvidia-smi -i N -c DEFAULT` sets it back; and no rank may touch "
                f"another's GPU (`torch.cuda.set_device(LOCAL_RANK)` before any CUDA call)")
    for code, words in _CUDA_TEXTS:
        if words.search(text):
            said, fix = cuda_error_words("to start", code)
            return f"{node}: {said}; {fix}"
    if _OLD_DRIVER.search(text):
        return (f"{node}'s NVIDIA driver is older than the CUDA its torch was built with: "
                f"upgrade the driver there, or install a torch built for the CUDA the driver "
                f"supports (`nvidia-smi` says it, top right)")
    if _P2P.search(text):
        return f"GPU peer-to-peer failed on {node}: {P2P_FIX}"
    if _COLLECTIVE_TIMEOUT.search(text) and not _NCCL_SOCKET.search(text):
        return (f"a collective never completed on {node}: a rank that did not join it (see "
                f"the flight recorder's dumps in nccl_trace/ and the stacks), or, on one node, "
                f"{P2P_FIX}")
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
    """What to do about a node whose agent could not start, from the transport's
    message; ``""`` when nothing fits (no hint beats a wrong one)."""
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
