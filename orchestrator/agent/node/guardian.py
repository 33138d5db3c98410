"""A second process per node that ends the run if its supervisor dies.

The supervisor can be killed with SIGKILL (the OOM killer, an operator), and
then nothing of it runs to tear the run down: torchrun and its workers,
each in a session of its own, train on. So the supervisor starts a guardian
first: a tiny interpreter in a session of its own, running ``procs``,
``scrub`` and the few lines below, whose stdin is a pipe that only the
supervisor holds. Its first line there is the guardian's orders (``arm``):
the torchrun log directory and the secrets to mask in it, which never go
on a command line (``ps`` shows those to everyone). When the supervisor
ends, however it ends, the kernel closes that pipe. A supervisor that
finished its own teardown writes ``done`` first and the guardian leaves;
otherwise the guardian finds the run's processes by their marker
variables and ends them (SIGTERM, the grace period, SIGKILL), then masks
the secrets in the logs they left, as the supervisor would have, and
writes ``guardian.json`` beside ``supervisor.json``: when its teardown was
over and what it ended (what bounds "a killed supervisor's run is gone at
once" is measured on it).

It needs no files: its source is this package's ``procs`` and ``scrub``
modules, read through the modules' loader (from memory on a node), and
``_MAIN``.
"""

from __future__ import annotations

import json
import subprocess
import sys

from . import procs, scrub
from ..wire.protocol import Control

_MAIN = """

def _guard():
    import json, signal
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the supervisor's teardown is not ours to die in
    orders, pending = {}, b""
    while True:
        chunk = os.read(0, 65536)
        if not chunk:  # the supervisor is gone without its teardown
            break
        pending += chunk
        while b"\\n" in pending:
            line, pending = pending.split(b"\\n", 1)
            if line == _DONE:
                return
            try:
                orders = json.loads(line)
            except ValueError:
                pass
    marker = tuple(sys.argv[1:3])
    began = time.time()
    ended, survivors = terminate(lambda: marked_processes(marker), float(sys.argv[3]),
                                 still_ours=lambda pid: has_marker(pid, marker))
    torn_down_at = time.time()
    if orders.get("log_dir") and orders.get("secrets"):
        scrub_tree(orders["log_dir"], orders["secrets"])
    if orders.get("record"):
        record = {"reason": "its supervisor ended without its teardown", "began": began,
                  "torn_down_at": torn_down_at, "ended": sorted(ended),
                  "survivors": [{"pid": p, "cmd": c} for p, c in survivors.items()]}
        try:  # never through a link planted in the run directory
            fd = os.open(orders["record"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                         | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump(record, fh)
        except OSError:
            pass

import sys
_guard()
"""


def start(marker: tuple[str, str], grace_s: float,
          gpu_fds: list[int] | tuple[int, ...] = ()) -> subprocess.Popen:
    """The guardian for the run marked ``marker``; ``arm`` it, and write
    ``done`` to it (``release``) once the supervisor has torn the run down
    itself. ``gpu_fds``: the run's GPU locks, which it holds too."""
    future = "from __future__ import annotations\n"
    source = future + "\n".join(module.__loader__.get_source(module.__name__).replace(future, "")
                                for module in (procs, scrub)) \
        + f"\n_DONE = {Control.DONE.encode().strip()!r}\n" + _MAIN
    # The run's GPU locks outlive a killed supervisor until the guardian has
    # ended the run's processes.
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", source, *marker, str(grace_s)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            pass_fds=tuple(gpu_fds))


def arm(guardian: subprocess.Popen, log_dir: str, secrets: list[str],
        record: str | None = None) -> None:
    """Tell the guardian where torchrun's logs are and what to mask in them,
    and where to record its teardown if it has to do one (``record``)."""
    try:
        guardian.stdin.write(json.dumps({"log_dir": log_dir, "secrets": secrets,
                                         "record": record}).encode() + b"\n")
        guardian.stdin.flush()
    except OSError:
        pass  # it is gone: the supervisor's own teardown is all there is


def release(guardian: subprocess.Popen) -> None:
    try:
        guardian.stdin.write(Control.DONE.encode())
        guardian.stdin.close()
    except OSError:
        pass
    try:
        guardian.wait(timeout=5)
    except subprocess.TimeoutExpired:
        guardian.kill()
