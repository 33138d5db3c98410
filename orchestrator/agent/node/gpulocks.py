"""Per-GPU locks that a run holds for its whole life, across users.

One file per GPU in the lock directory (``lock_dir``: ``gpu_policy.lock_dir``,
else ``/run/lock/ddp-orch-gpus``, else ``/tmp/ddp-orch-gpus``), named by
its UUID (``gpus.lock_key``), locked with ``flock``. The directory is
node-local on purpose: locks on an NFS ``/home`` are unreliable, and GPU
indices repeat on every host. It is sticky and world-writable like ``/tmp``,
so every user's runs meet there. ``/run/lock`` first: systemd-tmpfiles
ages files in ``/tmp`` (RHEL's 10 days), and a private ``/tmp``
(pam_namespace, a service's PrivateTmp, a container per user) is one
user's alone, where runs of two users would never meet; ``/run`` is
neither, and is emptied at boot, when no run is left to hold a GPU.

``flock`` belongs to the open file description and ends with the last
process that has it open, so a dead run's lock is gone with it (its file,
left behind, blocks nobody), and a child given the descriptors
(``Holds.fds`` through ``pass_fds``) keeps the lock after the agent that
took it has gone. The file holds the holder as one JSON line, for the
words of a refusal only: the lock decides, never the file.

Stdlib only, like the rest of the agent package.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
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
    """``key`` is another run's now; ``holder`` is its record, None where
    the file does not hold one that can be read."""

    def __init__(self, key: str, holder: dict | None):
        super().__init__(f"{key} is held by another run")
        self.key = key
        self.holder = holder


class Holds:
    """The locks one ``hold`` took: ``keys`` and their descriptors ``fds``.

    ``release`` unlocks and closes; as a context manager it releases on
    exit. ``close`` only closes this process's descriptors: a child given
    ``fds`` with ``pass_fds`` then holds the locks alone (unlocking here
    would unlock them for that child too, as they share the description).
    """

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
    """Lock every one of ``keys`` for ``holder`` (a dict with ``run_id``;
    ``user``, ``started``, ``pid`` and ``host`` are filled in where it lacks
    them), or none: at the first key another run holds, what was taken is
    let go and ``Held`` names that key and its holder. A key given twice is
    held once (a second lock of it here would conflict with the first)."""
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
    """Who holds each of ``keys`` now: None where nobody does, the holder's
    record where a run does (``{}`` when it cannot be read). Creates
    nothing: a key without a file, or no directory at all, is free."""
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
    """The keys another run than ``run_id`` holds now, with their holders
    (an unreadable holder counts as another run)."""
    return {key: who for key, who in holders(keys, directory).items()
            if who is not None and who.get("run_id") != run_id}


def lock_dir(given: str | None = None) -> str:
    """The directory of this node's GPU locks: ``given`` (``gpu_policy.lock_dir``),
    else ``ddp-orch-gpus`` in the first of ``LOCK_PARENTS`` that every user
    may write to (world-writable and sticky)."""
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
    """The lock file's name for ``key``: the key itself where it is a plain
    file name (a UUID, ``index-3``), else its safe characters and a hash of
    the whole, so two keys never share a file."""
    if _SAFE.fullmatch(key):
        return key + ".lock"
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
    """``directory``, sticky and world-writable (1777) where this user owns
    it (chmod after making it: the umask takes bits off); one another user
    made is used as it is, since only its owner may chmod it. Only the
    directory itself is made: parents made here would be this user's alone."""
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
    """A descriptor of the lock file ``path``, never through a link.

    An existing file is opened without O_CREAT: with
    ``fs.protected_regular`` (Debian's default) O_CREAT fails on another
    user's file in a sticky directory even when it exists. Otherwise it is
    made with O_EXCL, mode 0666 whatever the umask, for every user's runs.
    Read-only where the file does not let this user write it: flock needs
    no write access, only the holder's record is then left unwritten.
    """
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
    """Lock ``fd``, retrying a moment: a conflict that short is
    ``holders`` looking, not a run holding it."""
    deadline = time.monotonic() + _LOOK_RETRY_S
    while not _try_lock(fd):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_LOOK_POLL_S)
    return True


def _write_holder(fd: int, line: bytes) -> None:
    """Replace the file's record with ``line``; skipped on a read-only
    descriptor (another user's file this user may only lock)."""
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, line, 0)


def _read_holder(fd: int) -> dict | None:
    """The record in the lock file, None where there is none to read (being
    written this instant, or written by something else)."""
    try:
        record = json.loads(os.pread(fd, 65536, 0).decode())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return record if isinstance(record, dict) else None
