"""A second process per node that ends the run if its supervisor dies.

The supervisor can be killed with SIGKILL (the OOM killer, an operator), and
then nothing of it runs to tear the run down: torchrun and its workers,
each in a session of its own, train on. So the supervisor starts a guardian
first: a tiny interpreter in a session of its own, running ``procs`` and
the few lines below, whose stdin is a pipe that only the supervisor holds.
When the supervisor ends, however it ends, the kernel closes that pipe. A
supervisor that finished its own teardown writes ``done`` first and the
guardian leaves; otherwise the guardian finds the run's processes by their
marker variables and ends them (SIGTERM, the grace period, SIGKILL).

It needs no files: its source is this package's ``procs`` module, read
through the module's loader (from memory on a node), and ``_MAIN``.
"""

from __future__ import annotations

import subprocess
import sys

from . import procs

_MAIN = """

def _guard():
    import signal
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the supervisor's teardown is not ours to die in
    heard = b""
    while b"done" not in heard:
        chunk = os.read(0, 64)
        if not chunk:  # the supervisor is gone without its teardown
            marker = tuple(sys.argv[1:3])
            terminate(lambda: marked_processes(marker), float(sys.argv[3]),
                      still_ours=lambda pid: has_marker(pid, marker))
            return
        heard += chunk

import sys
_guard()
"""


def start(marker: tuple[str, str], grace_s: float) -> subprocess.Popen:
    """The guardian for the run marked ``marker``; write ``done`` to its stdin
    (``release``) once the supervisor has torn the run down itself."""
    source = procs.__loader__.get_source(procs.__name__) + _MAIN
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", source, *marker, str(grace_s)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def release(guardian: subprocess.Popen) -> None:
    try:
        guardian.stdin.write(b"done\n")
        guardian.stdin.close()
    except OSError:
        pass
    try:
        guardian.wait(timeout=5)
    except subprocess.TimeoutExpired:
        guardian.kill()
