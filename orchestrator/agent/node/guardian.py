"""A second process per node that ends the run if its supervisor dies.

A supervisor killed with SIGKILL (the OOM killer, an operator) runs no
teardown, and torchrun and its workers, each in a session of its own, train
on. So the supervisor first starts a guardian, in a session of its own,
whose stdin is a pipe only the supervisor holds: the kernel closes it when
the supervisor ends, however it ends. Its orders (``arm``) hold secrets, so
they go on that pipe, never on a command line that ``ps`` shows to all. A
supervisor that tore the run down writes ``done`` first; otherwise the
guardian ends the run's marked processes, masks the secrets in their logs
and writes ``guardian.json``, on which a killed supervisor's teardown time
is measured.

It needs no files: its source is ``procs``, ``scrub`` and ``_MAIN``, read
through the modules' loader (from memory on a node).
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
    """The guardian for the run marked ``marker``; it holds the GPU locks ``gpu_fds`` too."""
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
    """Tell the guardian where torchrun's logs are, what to mask, and its teardown's ``record``."""
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
