"""Masking secrets in the files a run leaves on a node (torchrun's per-rank
logs and error files).

Free of package imports on purpose: the guardian (``guardian.py``) runs
this module's source as plain text in a bare interpreter, so that a run
whose supervisor or keeper was killed (SIGKILL, the OOM killer) has its
logs scrubbed too, not only a run that ended cleanly.
"""

from __future__ import annotations

import os
import stat

MASK = b"********"


def scrub_tree(directory: str, secrets: list[str], mask: bytes = MASK) -> int:
    """Mask ``secrets`` in every regular file under ``directory``, each file
    rewritten atomically with its mode kept (a symlink is never followed),
    so a run directory keeps no secret in clear, a localhost node's inside
    the controller's run directory included. Returns how many files changed."""
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
    """``data`` into ``path`` whole or not at all: written beside it (never
    through a symlink), given ``mode`` whatever the umask, then renamed over
    it. Every file the agent writes on a node goes through here."""
    partial = f"{path}.part-{os.getpid()}"
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
