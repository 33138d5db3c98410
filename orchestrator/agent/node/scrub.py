"""Masking secrets in the files a run leaves on a node (torchrun's per-rank
logs and error files).

Free of package imports on purpose: the guardian runs this source in a bare
interpreter, so a run whose supervisor or keeper was killed has its logs
scrubbed too.
"""

from __future__ import annotations

import os
import stat
import threading

MASK = b"********"


def scrub_tree(directory: str, secrets: list[str], mask: bytes = MASK) -> int:
    """Mask ``secrets`` in every regular file under ``directory``, never
    through a symlink, each rewritten atomically with its mode kept; returns
    how many files changed."""
    values = sorted({s.encode() for s in secrets if s}, key=len, reverse=True)
    changed = 0
    for root, _dirs, names in os.walk(directory) if values else ():
        for name in names:
            path = os.path.join(root, name)
            try:
                mode = os.lstat(path).st_mode
                if not stat.S_ISREG(mode):
                    continue
                with open(path, "rb") as fh:
                    data = fh.read()
                masked = data
                for value in values:
                    masked = masked.replace(value, mask)
                if masked != data:
                    write_atomically(path, masked, stat.S_IMODE(mode))
                    changed += 1
            except OSError:
                continue  # gone or unreadable: nothing of it is kept by us
    return changed


def write_atomically(path: str, data: bytes, mode: int) -> None:
    """``data`` into ``path`` whole or not at all, never through a symlink, in
    ``mode`` whatever the umask. Every file the agent writes on a node goes
    here, and the controller's run records: the partial file is the writing
    thread's own, so two threads may write one record."""
    partial = f"{path}.part-{os.getpid()}-{threading.get_ident()}"
    try:
        os.unlink(partial)  # a leftover of a crashed writer with our pid
    except FileNotFoundError:
        pass
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise
