"""Small node-side checks: ports, Python and torch, GPUs, reaching the master.

Used by a launch (the master port) and by ``ddp-orch check``. torch is
probed in a child interpreter, never imported here: the agent stays
stdlib-only, and a torch that crashes on import cannot take it down.
"""

from __future__ import annotations

import os
import socket
import sys
import time

_TORCH = ("import json, torch; "
          "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda}))")


def bind(port: int) -> dict:
    """Can torchrun's store listen on ``port``? 0 asks the kernel for a free one.

    SO_REUSEADDR, as torch's TCPStore sets it: a port that a finished run left
    in TIME_WAIT is free for it, and so it is for this check; a port someone
    listens on is busy either way.
    """
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            return {"ok": False, "error": exc.strerror or str(exc)}
        return {"ok": True, "port": sock.getsockname()[1]}


def probe(gpus: bool, timeout_s: float = 60.0) -> dict:
    """This Python, its torch, and (when asked) the GPUs nvidia-smi lists."""
    import json
    import shutil
    import subprocess  # here: only `check` probes, a launch does not pay for them

    out: dict = {"ok": True, "python": sys.executable,
                 "python_version": sys.version.split()[0]}
    try:
        ran = subprocess.run([sys.executable, "-c", _TORCH], capture_output=True, text=True,
                             timeout=timeout_s)
        lines = ran.stdout.strip().splitlines()
        if ran.returncode == 0 and lines:
            out.update(json.loads(lines[-1]))
        else:
            last = (ran.stderr.strip().splitlines() or ["exit %d" % ran.returncode])[-1]
            out["torch_error"] = last[-300:]
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
    if gpus:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            out["gpu_error"] = "nvidia-smi not found"
        else:
            listing = subprocess.run([smi, "-L"], capture_output=True, text=True,
                                     timeout=timeout_s).stdout
            out["gpus"] = [int(l.split()[1].rstrip(":")) for l in listing.splitlines()
                           if l.startswith("GPU ")]
    return out


def listener(port: int) -> socket.socket:
    """A socket listening on ``port`` (OSError if it cannot), for ``serve_listener``."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))
        sock.listen(256)
    except OSError:
        sock.close()
        raise
    return sock


def serve_listener(sock: socket.socket, timeout_s: float, stop) -> None:
    """Accept (and close) connections until ``stop`` is set (the controller
    closed stdin) or ``timeout_s`` passes; the port is free again at once."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + timeout_s
    with sock:
        while time.monotonic() < deadline and not stop.is_set():
            try:
                sock.accept()[0].close()
            except socket.timeout:
                pass


def connect(addr: str, port: int, timeout_s: float) -> dict:
    """Can this node open a TCP connection to ``addr:port``?"""
    try:
        socket.create_connection((addr, port), timeout=timeout_s).close()
    except OSError as exc:
        return {"ok": False, "error": exc.strerror or str(exc) or type(exc).__name__}
    return {"ok": True}


def home() -> str:
    return os.path.expanduser("~")
