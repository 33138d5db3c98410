"""Small node-side checks: ports, Python and torch, GPUs, reaching the master.

torch is probed in a child interpreter, never imported here: the agent
stays stdlib-only, and a torch that crashes on import cannot take it down.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .holdings import Holdings

# What the node's CUDA driver and torch build say, as a child interpreter of
# the node's Python asks them without importing torch (the launch's probe,
# ``gpuclaim.TorchProbe``) and with it (``check``'s): the driver through
# ctypes, as torch.cuda.is_available() asks it (cuInit, then cuDeviceGetCount,
# each return code kept: an error's code is its fix, ``records/hints.py``),
# each GPU's compute capability in PCI bus order (nvidia-smi's), torch's arch
# list from the string libtorch_python.so holds for get_arch_list(), and NCCL's
# version from its wheel's metadata.
DRIVER_PROBE = """\
import ctypes, json, os, re
def cuda_driver():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return {"available": False, "why": "no CUDA driver here (%s)" % exc}
    count, version = ctypes.c_int(0), ctypes.c_int(0)
    rc = lib.cuInit(0)
    if rc != 0:
        return {"available": False, "cuda_error": {"call": "cuInit", "code": rc}}
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0:
        return {"available": False, "cuda_error": {"call": "cuDeviceGetCount", "code": rc}}
    lib.cuDriverGetVersion(ctypes.byref(version))
    caps = []
    for ordinal in range(count.value):
        dev, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0 \\
                or lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev) != 0 \\
                or lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev) != 0:
            caps.append(None)
        else:
            caps.append("%d.%d" % (major.value, minor.value))
    return {"available": count.value > 0, "count": count.value, "caps": caps,
            "driver_cuda": "%d.%d" % (version.value // 1000, version.value % 1000 // 10)}
ARCH = re.compile(rb"(?:(?:sm|compute)_\\d+[af]? )*(?:sm|compute)_\\d+[af]?")
def arch_list(torch_dir):
    import mmap
    best = b""
    try:
        with open(os.path.join(torch_dir, "lib", "libtorch_python.so"), "rb") as fh, \\
                mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mem:
            at = mem.find(b"sm_")
            while at != -1:
                start = mem.rfind(b"\\0", max(0, at - 512), at) + 1
                end = mem.find(b"\\0", at, at + 512)
                if end != -1 and ARCH.fullmatch(mem[start:end]) and end - start > len(best):
                    best = mem[start:end]
                at = mem.find(b"sm_", at + 3)
    except (OSError, ValueError):
        return None
    words = best.decode().split()
    return words if len(words) > 1 else None
def nccl_version():
    from importlib import metadata
    for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None
"""

# check's: torch imported (proof that it imports), then what the driver says.
_TORCH = DRIVER_PROBE + """\
import torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda,
       "available": bool(torch.cuda.is_available())}
try:
    if out["cuda"]:
        out.update({k: v for k, v in cuda_driver().items() if k != "available"})
        out["arch"] = torch.cuda.get_arch_list()
    if out["available"]:
        out["count"] = torch.cuda.device_count()
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as exc:
    out["nccl_error"] = type(exc).__name__
print(json.dumps(out))
"""


def family_of(host: str) -> int:
    """The family torchrun's store would use for ``host``: its literal's, else
    that of its first address here (AF_INET where it does not resolve)."""
    literal = host.strip("[]").split("%", 1)[0]
    try:
        return socket.AF_INET6 if ipaddress.ip_address(literal).version == 6 \
            else socket.AF_INET
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM)
    except OSError:
        return socket.AF_INET
    return found[0][0] if found and found[0][0] in (socket.AF_INET, socket.AF_INET6) \
        else socket.AF_INET


def _wildcard(family: int) -> str:
    return "::" if family == socket.AF_INET6 else ""


def bind(port: int, host: str | None = None, *, holdings: Holdings | None = None) -> dict:
    """Can torchrun's store listen on ``port`` (0: any free one)? Given
    ``holdings``, it stays bound, not listening, until torchrun starts."""
    family = family_of(host) if host else socket.AF_INET
    sock = None
    try:
        for reuse in (False, True):
            sock = socket.socket(family, socket.SOCK_STREAM)
            if reuse:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((_wildcard(family), port))
                break
            except OSError as exc:
                sock.close()
                if reuse or exc.errno != errno.EADDRINUSE or not port:
                    raise
    except OSError as exc:
        if sock is None:
            return {"ok": False, "error": f"no {_FAMILY_NAMES[family]} socket here: "
                                          f"{exc.strerror or exc}"}
        return {"ok": False, "error": exc.strerror or str(exc)}
    found = sock.getsockname()[1]
    if holdings is not None:
        holdings.ports.append(sock)
    else:
        sock.close()
    return {"ok": True, "port": found}


_FAMILY_NAMES = {socket.AF_INET: "IPv4", socket.AF_INET6: "IPv6"}


def probe(timeout_s: float = 60.0) -> dict:
    """This Python and its torch: version, CUDA build and the GPUs it sees."""
    import json
    import subprocess  # here: only `check` probes, a launch does not pay for them

    out: dict = {"ok": True, "python": sys.executable,
                 "python_version": sys.version.split()[0], **hostname_info(),
                 "limits": limits()}
    try:
        ran = subprocess.run([sys.executable, "-c", _TORCH], capture_output=True, text=True,
                             timeout=timeout_s, env=every_gpu_env())
        lines = ran.stdout.strip().splitlines()
        if ran.returncode == 0 and lines:
            out.update(json.loads(lines[-1]))
        else:
            last = (ran.stderr.strip().splitlines() or ["exit %d" % ran.returncode])[-1]
            out["torch_error"] = last[-300:]
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
    return out


SHM = "/dev/shm"
RDMA = "/sys/class/infiniband"


def limits() -> dict:
    """What this node gives NCCL besides GPUs, as its ranks inherit it:
    ``/dev/shm`` in MiB, the locked-memory limit in KiB (None: unlimited),
    and its RDMA devices."""
    import resource

    out: dict = {}
    try:
        found = os.statvfs(SHM)
        out["shm_mib"] = found.f_blocks * found.f_frsize >> 20
    except OSError:
        out["shm_mib"] = None
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    out["memlock_kib"] = None if soft == resource.RLIM_INFINITY else soft >> 10
    try:
        out["rdma"] = sorted(os.listdir(RDMA))[:16]
    except OSError:
        out["rdma"] = []
    return out


def every_gpu_env() -> dict[str, str]:
    """Every GPU visible in nvidia-smi's order, whatever the login's CUDA_VISIBLE_DEVICES."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def hostname_info() -> dict:
    """This host's name and its addresses in the resolver's order: Gloo without
    GLOO_SOCKET_IFNAME advertises the first (127.0.1.1 on Debian)."""
    name = socket.gethostname()
    try:
        found = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
    except OSError as exc:
        return {"hostname": name, "hostname_error": exc.strerror or str(exc)}
    addrs = list(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in found))
    return {"hostname": name, "hostname_addrs": addrs}


def interface_address(ifname: str, prefer: int = socket.AF_INET) -> str | None:
    """The address Gloo takes on ``ifname``: one of the family ``prefer``
    first, never an IPv6 link-local one (it needs a scope); None if it has none."""
    from .netroute import addresses

    held = [addr for name, addr in addresses() if name == ifname
            and not addr.lower().startswith("fe80:")]
    held.sort(key=lambda a: (":" in a) != (prefer == socket.AF_INET6))
    return held[0] if held else None


def listener(port: int, addr: str | None = None, host: str | None = None,
             ifname: str | None = None) -> socket.socket:
    """A socket on ``port`` (0: any): on one address, or all of a family as the store does."""
    if addr is None and ifname is not None:
        addr = interface_address(ifname, family_of(host) if host else socket.AF_INET)
        if addr is None:
            raise OSError(f"interface {ifname} has no usable address")
    family = family_of(addr) if addr is not None else \
        (family_of(host) if host else socket.AF_INET)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr if addr is not None else _wildcard(family), port))
        sock.listen(256)
    except OSError:
        sock.close()
        raise
    return sock


def serve_listener(sock: socket.socket, timeout_s: float, stop: threading.Event) -> None:
    """Accept and close connections until ``stop`` or ``timeout_s``; the port frees at once."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + timeout_s
    with sock:
        while time.monotonic() < deadline and not stop.is_set():
            try:
                sock.accept()[0].close()
            except (socket.timeout, OSError):
                pass


def connect(addr: str, port: int, timeout_s: float) -> dict:
    try:
        socket.create_connection((addr, port), timeout=timeout_s).close()
    except OSError as exc:
        return {"ok": False, "error": exc.strerror or str(exc) or type(exc).__name__}
    return {"ok": True}


def connect_all(targets: list, timeout_s: float) -> list[dict]:
    """``connect`` to every ``[addr, port]`` of ``targets`` at once; results in order."""
    results: list[dict] = [{"ok": False, "error": f"no answer within {timeout_s:g}s"}
                           for _ in targets]

    def one(i: int, addr: str, port: int) -> None:
        results[i] = connect(addr, port, timeout_s)

    threads = [threading.Thread(target=one, args=(i, str(a), int(p)), daemon=True)
               for i, (a, p) in enumerate(targets)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s + 1
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return list(results)


def home() -> str:
    return os.path.expanduser("~")


def disk_full(path: str) -> str:
    """Why the run failed where ``path``'s disk may be full, which hides its
    own cause; "" when there is room (or no way to tell)."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return ""
    if stat.f_bavail * stat.f_frsize >= 1 << 20:
        return ""
    return f"the node's disk is full at {path}: No space left on device"
