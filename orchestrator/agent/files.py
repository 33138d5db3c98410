"""File transfer on the node side: ``put`` and ``get`` over the agent's channel.

Both check what crosses: a ``put`` is written under a temporary name with
its final mode set before any byte lands, checked against the size and
SHA-256 the controller announced, then renamed into place, so nothing
half-written or corrupted is ever used. A ``get`` sends only a regular
file (no symlink is followed, no device is read) up to the size the
controller accepts.
"""

from __future__ import annotations

import os
import stat

from .protocol import MAX_TRANSFER, digest


class TransferError(Exception):
    """What went wrong, in words for the controller to show."""


def expand(path: str) -> str:
    """``~`` is the node's home: the controller may not know it yet."""
    return os.path.expanduser(path)


def private_dirs(directory: str) -> None:
    """``mkdir -p``, every directory it creates 0700 (``os.makedirs`` gives
    only the last one its mode), so a run's files are never readable by others."""
    missing = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for one in reversed(missing):
        try:
            os.mkdir(one, 0o700)  # the umask can only narrow it
        except FileExistsError:
            pass


def put(path: str, data: bytes, *, size: int, sha256: str, mode: int = 0o600) -> str:
    """Write ``data`` to ``path`` atomically after checking it; returns the path."""
    if len(data) != size or digest(data) != sha256:
        raise TransferError(f"{path}: arrived corrupted ({len(data)} of {size} bytes, "
                            "checksum mismatch)")
    path = expand(path)
    private_dirs(os.path.dirname(path) or ".")
    partial = f"{path}.part-{os.getpid()}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode & 0o777)
    try:
        os.fchmod(fd, mode & 0o777)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise
    return path


def get(path: str, max_bytes: int = MAX_TRANSFER) -> bytes | None:
    """The bytes of the regular file at ``path``; None if there is none.

    A symlink, a directory or a device is refused (TransferError), and so is
    a file larger than ``max_bytes``.
    """
    path = expand(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink
        raise TransferError(f"{path}: not fetched: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise TransferError(f"{path}: not fetched: not a regular file")
        if info.st_size > max_bytes:
            raise TransferError(f"{path}: not fetched: {info.st_size} bytes, "
                                f"more than the {max_bytes} accepted")
        return fh.read(max_bytes + 1)[:max_bytes]
