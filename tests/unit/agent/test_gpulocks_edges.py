"""The edges of the per-GPU locks (``agent/node/gpulocks.py``) that
``test_gpulocks.py`` leaves open: the look a ``hold`` retries through, what
a lock file and its directory are while being made, files this user may
only read or that keep changing, and the names and records of the locks.
Each expected value is worked out here by hand (a file name from hashlib,
an errno, a mode), never read back from the module."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat

import pytest

from orchestrator.agent.node import gpulocks
from orchestrator.agent.node.gpulocks import Held, hold, holders


@pytest.fixture
def locks(tmp_path):
    return str(tmp_path / "gpus")


class Clock:
    """``gpulocks.time`` for ``_lock``: ``monotonic`` reads ``times`` in
    turn (then the last again); ``sleep`` counts and runs ``on_sleep``."""

    def __init__(self, times, on_sleep=lambda: None):
        self.times, self.on_sleep, self.sleeps = list(times), on_sleep, 0

    def monotonic(self) -> float:
        return self.times.pop(0) if len(self.times) > 1 else self.times[0]

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.on_sleep()


def lock_held_by_another(tmp_path, monkeypatch, times, let_go: bool) -> tuple[bool, int]:
    """``_lock`` of a file another open description holds (as another
    process would: flock conflicts between descriptions), under a clock
    that reads ``times``; the holder lets go at the first sleep if
    ``let_go``. What ``_lock`` said, and how often it slept."""
    path = str(tmp_path / "k.lock")
    with open(path, "w"):
        pass
    holder, mine = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    clock = Clock(times, on_sleep=lambda: let_go and fcntl.flock(holder, fcntl.LOCK_UN))
    monkeypatch.setattr(gpulocks, "time", clock)
    try:
        return gpulocks._lock(mine), clock.sleeps
    finally:
        os.close(holder)
        os.close(mine)


# -- a look is retried through, a holder is not ------------------------------------------

def test_a_lock_held_for_an_instant_is_retried_until_it_is_free(tmp_path, monkeypatch):
    """holders() takes a free lock for an instant to look: a hold that meets
    it retries for _LOOK_RETRY_S (0.1 s) and gets it once the look is over."""
    assert lock_held_by_another(tmp_path, monkeypatch, [100.0, 100.05], True) == (True, 1)


def test_a_lock_still_held_when_the_retry_is_over_is_refused_at_once(tmp_path, monkeypatch):
    """At 0.1 s after the first try exactly, the retry is over: no more sleep."""
    times = [100.0, 100.0 + gpulocks._LOOK_RETRY_S, 100.5]
    assert lock_held_by_another(tmp_path, monkeypatch, times, False) == (False, 0)


# -- the directory and the files, as they are made ---------------------------------------

def modes_set(monkeypatch, name: str, stat_of) -> list[tuple[int, int]]:
    """``os.<name>`` (chmod, fchmod) recording at each call the mode its
    target had before and the mode it is given."""
    real, seen = getattr(os, name), []

    def spy(target, mode):
        seen.append((stat.S_IMODE(stat_of(target).st_mode), mode))
        real(target, mode)

    monkeypatch.setattr(gpulocks.os, name, spy)
    return seen


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_the_directory_is_private_until_it_is_made_sticky(locks, monkeypatch):
    """Made 0700 (the umask cannot add bits), then chmod 1777: no other user
    can plant a file in it before it is the shared sticky directory."""
    seen = modes_set(monkeypatch, "chmod", os.stat)
    with umask(0o022):
        gpulocks._make_dir(locks)
    assert seen == [(0o700, 0o1777)]
    gpulocks._make_dir(locks)  # already sticky and world-writable: left as it is
    assert len(seen) == 1


def test_another_users_directory_is_used_as_it_is(locks, monkeypatch):
    """Only its owner may chmod it: one another user made 0755 stays so."""
    os.makedirs(locks)
    os.chmod(locks, 0o755)
    monkeypatch.setattr(gpulocks.os, "getuid", lambda: os.stat(locks).st_uid + 1)
    gpulocks._make_dir(locks)
    assert stat.S_IMODE(os.stat(locks).st_mode) == 0o755


def test_a_link_in_place_of_the_directory_is_an_error_naming_it(locks, tmp_path):
    """A symbolic link to a directory (someone else's choice of where the
    locks go) is not the directory: refused, never followed."""
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", locks)
    with pytest.raises(NotADirectoryError) as refused:
        hold(["GPU-1"], {"run_id": "r"}, locks)
    assert (refused.value.errno, refused.value.filename) == (errno.ENOTDIR, locks)
    assert str(refused.value) == f"[Errno 20] not a directory for GPU locks: '{locks}'"


def test_a_new_lock_file_is_made_0666_before_its_mode_is_set_and_not_inherited(
        locks, monkeypatch):
    """Created with mode 0666 (less the umask), then set to 0666; its
    descriptor is close-on-exec, so a child holds a lock only when given it
    (``pass_fds``)."""
    made = modes_set(monkeypatch, "fchmod", os.fstat)
    with umask(0o022), hold(["GPU-1"], {"run_id": "r"}, locks) as taken:
        assert made == [(0o644, 0o666)]
        assert os.get_inheritable(taken.fds[0]) is False
        assert stat.S_IMODE(os.stat(os.path.join(locks, "GPU-1.lock")).st_mode) == 0o666


def test_a_fifo_in_place_of_a_lock_file_is_refused_by_name(locks):
    os.makedirs(locks)
    path = os.path.join(locks, "GPU-1.lock")
    os.mkfifo(path)
    with pytest.raises(OSError) as refused:
        hold(["GPU-1"], {"run_id": "r"}, locks)
    assert (refused.value.errno, refused.value.filename) == (errno.EINVAL, path)
    assert "not a regular file for a GPU lock" in str(refused.value)


# -- files this user may only read, or that keep changing -----------------------------------

def opens(monkeypatch, answer):
    """``os.open`` as ``answer(path, flags)`` says for the lock files (an
    exception to raise, or None for the real open), the real one elsewhere."""
    real = os.open

    def fake(path, flags, *mode):
        if str(path).endswith(".lock"):
            said = answer(path, flags)
            if said is not None:
                raise said
        return real(path, flags, *mode)

    monkeypatch.setattr(gpulocks.os, "open", fake)


def test_a_lock_file_this_user_may_only_read_is_locked_and_its_record_left(locks, monkeypatch):
    """Another user's file in the sticky directory, not writable here:
    opened read-only, locked all the same, its record (the other's) kept."""
    os.makedirs(locks)
    path = os.path.join(locks, "GPU-1.lock")
    with open(path, "w") as fh:
        fh.write('{"run_id": "theirs"}\n')
    opens(monkeypatch, lambda p, flags: PermissionError(errno.EACCES, "denied", p)
          if flags & os.O_ACCMODE == os.O_RDWR else None)
    with hold(["GPU-1"], {"run_id": "mine"}, locks) as taken:
        assert taken.keys == ["GPU-1"]
        with open(path) as fh:
            assert fh.read() == '{"run_id": "theirs"}\n'


def test_a_lock_file_this_user_may_not_open_at_all_is_an_error_naming_it(locks, monkeypatch):
    os.makedirs(locks)
    path = os.path.join(locks, "GPU-1.lock")
    with open(path, "w"):
        pass
    opens(monkeypatch, lambda p, flags: PermissionError(errno.EACCES, "denied", p))
    with pytest.raises(PermissionError) as refused:
        hold(["GPU-1"], {"run_id": "r"}, locks)
    assert (refused.value.errno, refused.value.filename) == (errno.EACCES, path)
    assert "cannot open the GPU lock" in str(refused.value)


def test_a_lock_file_another_run_made_between_our_two_opens_is_opened(locks, monkeypatch):
    os.makedirs(locks)
    path = os.path.join(locks, "GPU-1.lock")
    raced = []

    def answer(p, flags):
        if flags & os.O_EXCL and not raced:  # the other run's file appears now
            raced.append(p)
            with open(p, "w"):
                pass
        return None

    opens(monkeypatch, answer)
    with hold(["GPU-1"], {"run_id": "r"}, locks) as taken:
        assert raced == [path] and taken.keys == ["GPU-1"]


def test_a_lock_file_that_keeps_changing_is_given_up_with_eagain(locks, monkeypatch):
    """Gone at every open, there at every creation: 50 tries, then an error."""
    os.makedirs(locks)
    path = os.path.join(locks, "GPU-1.lock")
    tries = []

    def answer(p, flags):
        if flags & os.O_EXCL:
            tries.append(p)
            return FileExistsError(errno.EEXIST, "exists", p)
        return FileNotFoundError(errno.ENOENT, "gone", p)

    opens(monkeypatch, answer)
    with pytest.raises(OSError) as refused:
        hold(["GPU-1"], {"run_id": "r"}, locks)
    assert (refused.value.errno, refused.value.filename) == (errno.EAGAIN, path)
    assert "keeps changing" in str(refused.value) and len(tries) == 50


def test_looking_at_a_key_with_no_file_in_an_existing_directory_creates_nothing(locks):
    os.makedirs(locks)
    assert holders(["GPU-7"], locks) == {"GPU-7": None}
    assert os.listdir(locks) == []


# -- the records ----------------------------------------------------------------------------

def test_the_holder_record_is_one_line_of_sorted_keys_with_who_and_where(locks):
    import pwd

    with hold(["GPU-1"], {"run_id": "r", "gpus": ["GPU-1"]}, locks):
        with open(os.path.join(locks, "GPU-1.lock")) as fh:
            line = fh.read()
    record = json.loads(line)
    assert line == json.dumps(record, sort_keys=True) + "\n"
    assert list(record) == ["gpus", "host", "pid", "run_id", "started", "user"]
    assert (record["pid"], record["user"]) == (os.getpid(), pwd.getpwuid(os.getuid()).pw_name)


def test_a_user_the_password_file_does_not_know_is_named_by_uid(locks, monkeypatch):
    monkeypatch.setattr(gpulocks.os, "getuid", lambda: 987654)
    assert gpulocks._me()["user"] == "uid 987654"


def held_with(locks: str, content: bytes) -> int:
    """GPU-1's lock taken by a description of this process, its file ``content``."""
    os.makedirs(locks, exist_ok=True)
    fd = os.open(os.path.join(locks, "GPU-1.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, content)
    return fd


def test_a_record_that_is_not_an_object_is_a_holder_unknown(locks):
    fd = held_with(locks, b"[1, 2]\n")
    try:
        assert holders(["GPU-1"], locks) == {"GPU-1": {}}
    finally:
        os.close(fd)


def test_a_record_longer_than_64_kib_is_not_read(locks):
    """A record of 65537 bytes: only its first 65536 are read, which are no
    JSON object: the holder is unknown (a lock file is no place for more)."""
    record = json.dumps({"run_id": "r", "pad": ""}).encode()
    record = record[:-2] + b"x" * (65537 - len(record)) + b'"}'
    assert len(record) == 65537 and json.loads(record)["run_id"] == "r"
    fd = held_with(locks, record)
    try:
        assert holders(["GPU-1"], locks) == {"GPU-1": {}}
    finally:
        os.close(fd)


def test_held_says_which_key_in_its_words():
    refused = Held("GPU-1", {"run_id": "r"})
    assert str(refused) == "GPU-1 is held by another run"
    assert (refused.key, refused.holder) == ("GPU-1", {"run_id": "r"})


# -- file names -------------------------------------------------------------------------------

def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@pytest.mark.parametrize("key, stem", [
    ("GPU/Ab", "GPU_Ab"),  # upper and lower case kept, the slash replaced
    ("X..y z", "X..y_z"),  # a leading X is not a dot: kept
    ("..GPU 1", "GPU_1"),  # leading dots go: no hidden file
])
def test_an_unsafe_key_is_its_safe_characters_and_16_hex_of_its_hash(key, stem):
    assert gpulocks.safe_name(key) == f"{stem}-{digest(key)}.lock"


def test_a_long_unsafe_key_keeps_its_first_100_characters():
    key = "/" + "a" * 150
    assert gpulocks.safe_name(key) == "_" + "a" * 99 + f"-{digest(key)}.lock"
