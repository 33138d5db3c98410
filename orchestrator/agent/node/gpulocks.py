"""Per-GPU locks that a run holds for its whole life, across users.

One ``flock``ed file per GPU in a node-local directory (NFS locks are
unreliable, GPU indices repeat per host), world-writable so every user's
runs meet there: ``/run/lock`` before ``/tmp``, which tmpfiles ages and which
may be private. ``flock`` ends with the last process that has the file open,
so a dead run's lock goes with it. The holder record is only for a refusal's
words: the lock decides.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import re
import socket
import stat
import time

LOCK_SUBDIR = "ddp-orch-gpus"
# Where the default lock directory is made: the first that is a directory
# every user may make files in (world-writable and sticky, as /tmp is).
LOCK_PARENTS = ("/run/lock", "/tmp")
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
# holders() takes each free lock for an instant to see that it is free: a
# hold() that meets such a look retries for this long before it says held.
_LOOK_RETRY_S = 0.1
_LOOK_POLL_S = 0.01
_OPEN_TRIES = 50  # creations and removals racing ours, before giving up


class Held(Exception):
    """``key`` is another run's now; ``holder`` its record, None if unreadable."""

    def __init__(self, key: str, holder: dict | None):
        super().__init__(f"{key} is held by another run")
        self.key = key
        self.holder = holder


class Holds:
    """The locks one ``hold`` took. ``close`` leaves them held by a child
    given ``fds``; ``release`` would unlock them for it too."""

    def __init__(self, keys: list[str], fds: list[int]):
        self.keys = keys
        self.fds = fds

    def release(self) -> None:
        for fd in self.fds:
            fcntl.flock(fd, fcntl.LOCK_UN)
        self.close()

    def close(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> "Holds":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def hold(keys: "list[str] | tuple[str, ...]", holder: dict,
         directory: str | None = None) -> Holds:
    """Lock all of ``keys`` for ``holder``, or none (``Held``). A key given
    twice is held once: a second lock here would conflict."""
    if "run_id" not in holder:
        raise ValueError("a GPU lock's holder needs a run_id")
    directory = lock_dir(directory)
    record = {**_me(), **holder}
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    _make_dir(directory)
    taken = Holds([], [])
    try:
        for key in dict.fromkeys(keys):
            fd = _open(_path(directory, key), create=True)
            taken.fds.append(fd)
            if not _lock(fd):
                raise Held(key, _read_holder(fd))
            taken.keys.append(key)
            _write_holder(fd, line)
    except BaseException:
        taken.release()
        raise
    return taken


def holders(keys: "list[str] | tuple[str, ...]",
            directory: str | None = None) -> "dict[str, dict | None]":
    """Who holds each of ``keys``: None, or the record (``{}`` if unreadable)."""
    directory = lock_dir(directory)
    out: dict[str, dict | None] = {}
    for key in keys:
        try:
            fd = _open(_path(directory, key), create=False)
        except FileNotFoundError:
            out[key] = None
            continue
        try:
            if _try_lock(fd):
                fcntl.flock(fd, fcntl.LOCK_UN)  # at once, not at close: a fork may share fd
                out[key] = None
            else:
                out[key] = _read_holder(fd) or {}  # {}: held, by someone unknown
        finally:
            os.close(fd)
    return out


def held_by_others(keys: "list[str] | tuple[str, ...]", run_id: str,
                   directory: str | None = None) -> dict[str, dict]:
    """The keys another run than ``run_id`` holds (an unreadable holder counts)."""
    return {key: who for key, who in holders(keys, directory).items()
            if who is not None and who.get("run_id") != run_id}


def lock_dir(given: str | None = None) -> str:
    """``given``, else ``ddp-orch-gpus`` in the first of ``LOCK_PARENTS`` all may write."""
    if given:
        return given
    for parent in LOCK_PARENTS:
        try:
            info = os.stat(parent)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_mode & 0o1002 == 0o1002:
            return os.path.join(parent, LOCK_SUBDIR)
    return os.path.join(LOCK_PARENTS[-1], LOCK_SUBDIR)


def safe_name(key: str) -> str:
    """``key`` as a file name; an unsafe key gets a hash, so keys never share a file."""
    if _SAFE.fullmatch(key):
        return key + ".lock"
    import hashlib  # only here: an agent that takes no GPU lock never loads it (~3 ms)

    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return re.sub(r"[^A-Za-z0-9._-]", "_", key)[:100].lstrip(".") + f"-{digest}.lock"


def _path(directory: str, key: str) -> str:
    return os.path.join(directory, safe_name(key))


def _me() -> dict:
    """What a holder record says of this process unless told otherwise."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = f"uid {os.getuid()}"
    return {"user": user, "started": time.time(), "pid": os.getpid(),
            "host": socket.gethostname()}


def _make_dir(directory: str) -> None:
    """Mode 1777 where this user owns it. Parents are not made: they would
    be this user's alone."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory for GPU locks", directory)
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != 0o1777:
        os.chmod(directory, 0o1777)


def _open(path: str, create: bool) -> int:
    """A descriptor of ``path``, never through a link. An existing file is
    opened without O_CREAT, which ``fs.protected_regular`` refuses on another
    user's file in a sticky directory. Read-only where this user may not
    write: flock needs no write access."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_OPEN_TRIES):
        for mode in (os.O_RDWR, os.O_RDONLY):
            try:
                return _regular(os.open(path, mode | flags), path)
            except PermissionError:
                continue
            except FileNotFoundError:
                if not create:
                    raise
                break
        else:
            raise PermissionError(errno.EACCES, "cannot open the GPU lock", path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, 0o666)
        except FileExistsError:
            continue  # another run made it between our two opens
        os.fchmod(fd, 0o666)
        return fd
    raise OSError(errno.EAGAIN, "the GPU lock file keeps changing", path)


def _regular(fd: int, path: str) -> int:
    """``fd`` if it is a regular file: a fifo or a device planted in the
    directory must not be written to or block the agent."""
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    raise OSError(errno.EINVAL, "not a regular file for a GPU lock", path)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _lock(fd: int) -> bool:
    """Lock ``fd``, retrying a moment: so short a conflict is ``holders`` looking."""
    deadline = time.monotonic() + _LOOK_RETRY_S
    while not _try_lock(fd):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_LOOK_POLL_S)
    return True


def _write_holder(fd: int, line: bytes) -> None:
    """Replace the file's record with ``line``; skipped on a read-only descriptor."""
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, line, 0)


def _read_holder(fd: int) -> dict | None:
    """The lock file's record; None where there is none to read (mid-write, foreign)."""
    try:
        record = json.loads(os.pread(fd, 65536, 0).decode())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return record if isinstance(record, dict) else None
