"""File transfer on the node side: ``put`` and ``get`` over the agent's channel.

A ``put`` is checked against the size and SHA-256 announced and renamed into
place, so nothing half-written or corrupted is ever used. A ``get`` sends
only a regular file, up to the size the controller accepts.
"""

from __future__ import annotations

import json
import os
import stat

from .protocol import MAX_TRANSFER, digest
from ..node.scrub import MASK, scrub_tree, write_atomically  # noqa: F401 (scrub_tree: re-exported)


class TransferError(Exception):
    """What went wrong, in words for the controller to show."""


def expand(path: str) -> str:
    """``~`` is the node's home: the controller may not know it yet."""
    return os.path.expanduser(path)


def private_dirs(directory: str) -> None:
    """``mkdir -p``, each new directory 0700 (``os.makedirs`` sets only the last's)."""
    missing = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for one in reversed(missing):
        try:
            os.mkdir(one, 0o700)  # the umask can only narrow it
        except FileExistsError:
            pass


def make_run_dir(run_dir: str, root: str) -> str:
    """Create ``run_dir`` (0700) under ``root``, refusing one that exists (used
    twice, or planted) and a directory on the way that is not ours alone: in a
    shared ``workdir`` (``/tmp/x``) its owner could swap what the run executes."""
    run_dir, root = expand(run_dir).rstrip("/"), expand(root).rstrip("/")
    if not run_dir.startswith(root + "/"):
        raise TransferError(f"{run_dir} is not under {root}")
    parts = run_dir[len(root) + 1:].split("/")
    here = root
    for part in [None, *parts[:-1]]:
        here = here if part is None else f"{here}/{part}"
        try:
            os.mkdir(here, 0o700)
        except FileExistsError:
            pass
        info = os.lstat(here)
        if not stat.S_ISDIR(info.st_mode):
            raise TransferError(f"{here} is not a directory (a link or a file); "
                                "remove it or choose another workdir")
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise TransferError(
                f"{here} is not ours alone (owner uid {info.st_uid}, mode "
                f"{stat.S_IMODE(info.st_mode):o}); another user could change what runs: "
                f"chmod go-w {here} if it is yours, or choose another workdir")
    try:
        os.mkdir(run_dir, 0o700)
    except FileExistsError:
        raise TransferError(f"{run_dir} already exists on the node: a run id used twice, or "
                            "a directory someone else prepared; choose another --run-id") from None
    return run_dir


def put(path: str, data: bytes, *, size: int, sha256: str, mode: int = 0o600) -> str:
    """Write ``data`` to ``path`` atomically after checking it; returns the path."""
    if len(data) != size or digest(data) != sha256:
        raise TransferError(f"{path}: arrived corrupted ({len(data)} of {size} bytes, "
                            "checksum mismatch)")
    path = expand(path)
    private_dirs(os.path.dirname(path) or ".")
    write_atomically(path, data, mode & 0o777)
    return path


def put_json(path: str, value: object) -> str:
    """Write ``value`` as JSON to ``path`` atomically, through no symlink."""
    data = json.dumps(value).encode()
    return put(path, data, size=len(data), sha256=digest(data))


def get(path: str, max_bytes: int = MAX_TRANSFER) -> bytes | None:
    """The regular file at ``path``, or None if absent; TransferError for anything else."""
    path = expand(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink
        raise TransferError(f"{path}: not fetched: {exc.strerror}") from None
    try:  # before fdopen, which refuses a directory in words of its own (and its fd)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TransferError(f"{path}: not fetched: not a regular file")
        if info.st_size > max_bytes:
            raise TransferError(f"{path}: not fetched: {info.st_size} bytes, "
                                f"more than the {max_bytes} accepted")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as fh:
        return fh.read(max_bytes + 1)[:max_bytes]




def mask(data: bytes, values: list[bytes]) -> bytes:
    """``data`` with each of ``values`` (longest first) replaced by MASK."""
    for value in sorted(values, key=len, reverse=True):
        if value:
            data = data.replace(value, MASK)
    return data


def mask_strings(value, secrets: list[str]):
    """``value`` (JSON-like) with each secret masked in every string in it."""
    if isinstance(value, str):
        for secret in sorted(secrets, key=len, reverse=True):
            if secret:
                value = value.replace(secret, MASK.decode())
        return value
    if isinstance(value, dict):
        return {k: mask_strings(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_strings(v, secrets) for v in value]
    return value
