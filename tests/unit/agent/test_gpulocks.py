"""Per-GPU locks between processes: what one run holds another cannot take,
and a lock ends with the last process that has it, never with a file."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

import pytest

from orchestrator.agent.node import gpulocks
from orchestrator.agent.node.gpulocks import Held, hold, held_by_others, holders

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

# A run in a process of its own: holds KEYS, says so, then obeys stdin.
_RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from orchestrator.agent.node import gpulocks
keys, run_id, directory = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    holds = gpulocks.hold(keys, {"run_id": run_id, "gpus": keys}, directory)
except gpulocks.Held as exc:
    print("held", exc.key, json.dumps(exc.holder), flush=True)
    sys.exit(1)
print("holding", flush=True)
for line in sys.stdin:
    if line.strip() == "release":
        holds.release()
        print("released", flush=True)
"""

# A child given the lock's descriptors: it only waits for stdin to close.
_KEEPER = "import sys; sys.stdin.read()"


class Run:
    """Another run, in its own process, holding ``keys`` in ``directory``."""

    def __init__(self, directory, keys, run_id="run-a"):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _RUN, ROOT, json.dumps(keys), run_id, str(directory)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.said = self.proc.stdout.readline().rstrip("\n").split(" ", 2)

    def release(self):
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "released\n"

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def end(self):
        if self.proc.poll() is None:
            self.kill()
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def runs():
    started = []

    def start(*args, **kwargs):
        run = Run(*args, **kwargs)
        started.append(run)
        return run
    yield start
    for run in started:
        run.end()


@pytest.fixture
def locks(tmp_path):
    return str(tmp_path / "gpus")


def test_a_key_another_process_holds_cannot_be_taken_and_its_holder_is_named(runs, locks):
    other = runs(locks, ["GPU-1"])
    assert other.said == ["holding"]
    with pytest.raises(Held) as refused:
        hold(["GPU-1"], {"run_id": "run-b"}, locks)
    assert refused.value.key == "GPU-1"
    holder = refused.value.holder
    assert (holder["run_id"], holder["pid"], holder["gpus"]) == ("run-a", other.proc.pid,
                                                                 ["GPU-1"])
    assert {"user", "started", "host"} <= set(holder)
    assert holders(["GPU-1", "GPU-2"], locks) == {"GPU-1": holder, "GPU-2": None}


def test_a_released_key_can_be_taken(runs, locks):
    other = runs(locks, ["GPU-1"])
    other.release()
    with hold(["GPU-1"], {"run_id": "run-b"}, locks):
        assert holders(["GPU-1"], locks)["GPU-1"]["run_id"] == "run-b"
    assert holders(["GPU-1"], locks) == {"GPU-1": None}


def test_a_killed_holder_frees_its_keys_though_its_file_stays(runs, locks):
    other = runs(locks, ["GPU-1", "GPU-2"])
    other.kill()
    with open(os.path.join(locks, "GPU-1.lock")) as f:
        assert json.load(f)["run_id"] == "run-a"  # the stale record is still there
    assert holders(["GPU-1", "GPU-2"], locks) == {"GPU-1": None, "GPU-2": None}
    with hold(["GPU-2", "GPU-1", "GPU-2"], {"run_id": "run-b"}, locks) as taken:
        assert taken.keys == ["GPU-2", "GPU-1"] and len(taken.fds) == 2


def test_a_stale_file_of_a_dead_run_blocks_nobody_and_is_overwritten(locks):
    os.makedirs(locks)
    stale = os.path.join(locks, "GPU-1.lock")
    with open(stale, "w") as f:
        f.write(json.dumps({"run_id": "dead-run", "user": "ghost", "pid": 2 ** 30,
                            "note": "x" * 500}) + "\n")
    assert holders(["GPU-1"], locks) == {"GPU-1": None}
    with hold(["GPU-1"], {"run_id": "run-b"}, locks):
        with open(stale) as f:
            lines = f.read().splitlines()
        assert len(lines) == 1 and json.loads(lines[0])["run_id"] == "run-b"


def test_all_or_nothing_a_conflict_on_one_key_leaves_none_held(runs, locks):
    runs(locks, ["GPU-2"])
    with pytest.raises(Held) as refused:
        hold(["GPU-1", "GPU-2", "GPU-3"], {"run_id": "run-b"}, locks)
    assert refused.value.key == "GPU-2"
    assert holders(["GPU-1", "GPU-3"], locks) == {"GPU-1": None, "GPU-3": None}
    third = runs(locks, ["GPU-1", "GPU-3"], run_id="run-c")  # another process agrees
    assert third.said == ["holding"]


def test_a_refused_process_learns_the_holder(runs, locks):
    runs(locks, ["GPU-1"])
    refused = runs(locks, ["GPU-0", "GPU-1"], run_id="run-b")
    assert refused.said[:2] == ["held", "GPU-1"]
    assert json.loads(refused.said[2])["run_id"] == "run-a"
    assert holders(["GPU-0"], locks) == {"GPU-0": None}


def test_a_child_given_the_fds_keeps_the_locks_after_the_parent_closes_its_own(locks):
    taken = hold(["GPU-1"], {"run_id": "run-a"}, locks)
    keeper = subprocess.Popen([sys.executable, "-c", _KEEPER], stdin=subprocess.PIPE,
                              pass_fds=taken.fds)
    try:
        taken.close()
        assert taken.fds == []
        with pytest.raises(Held):
            hold(["GPU-1"], {"run_id": "run-b"}, locks)
        assert holders(["GPU-1"], locks)["GPU-1"]["run_id"] == "run-a"
    finally:
        keeper.stdin.close()
        keeper.wait(10)
    assert holders(["GPU-1"], locks) == {"GPU-1": None}


def test_release_unlocks_for_a_child_that_shares_the_fds_too(locks):
    """Why ``close`` exists: the lock belongs to the open file description,
    which the child shares, so unlocking here unlocks it there."""
    taken = hold(["GPU-1"], {"run_id": "run-a"}, locks)
    keeper = subprocess.Popen([sys.executable, "-c", _KEEPER], stdin=subprocess.PIPE,
                              pass_fds=taken.fds)
    try:
        taken.release()
        assert holders(["GPU-1"], locks) == {"GPU-1": None}
    finally:
        keeper.stdin.close()
        keeper.wait(10)


def test_held_by_others_leaves_out_this_run(locks):
    with hold(["GPU-1"], {"run_id": "run-a"}, locks):
        assert held_by_others(["GPU-1", "GPU-2"], "run-a", locks) == {}
        assert list(held_by_others(["GPU-1", "GPU-2"], "run-b", locks)) == ["GPU-1"]


def test_an_unreadable_record_is_held_by_someone_unknown(locks):
    with hold(["GPU-1"], {"run_id": "run-a"}, locks):
        with open(os.path.join(locks, "GPU-1.lock"), "w") as f:
            f.write("{not json")
        assert holders(["GPU-1"], locks) == {"GPU-1": {}}
        assert held_by_others(["GPU-1"], "run-a", locks) == {"GPU-1": {}}
        with pytest.raises(Held) as refused:
            hold(["GPU-1"], {"run_id": "run-b"}, locks)
        assert refused.value.holder is None


def test_looking_creates_nothing(locks):
    assert holders(["GPU-1"], locks) == {"GPU-1": None}
    assert not os.path.exists(locks)


def test_the_directory_is_sticky_and_world_writable_and_each_file_0666(locks):
    old = os.umask(0o077)
    try:
        with hold(["GPU-1"], {"run_id": "run-a"}, locks):
            assert stat.S_IMODE(os.stat(locks).st_mode) == 0o1777
            assert stat.S_IMODE(os.stat(os.path.join(locks, "GPU-1.lock")).st_mode) == 0o666
    finally:
        os.umask(old)


def test_a_link_in_place_of_a_lock_file_is_not_followed(tmp_path, locks):
    os.makedirs(locks)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.symlink(victim, os.path.join(locks, "GPU-1.lock"))
    with pytest.raises(OSError):
        hold(["GPU-1"], {"run_id": "run-a"}, locks)
    assert victim.read_text() == "precious\n"


def test_keys_become_safe_distinct_file_names(tmp_path, locks):
    assert gpulocks.safe_name("GPU-5f1e4c1a-9a8b") == "GPU-5f1e4c1a-9a8b.lock"
    assert gpulocks.safe_name("index-3") == "index-3.lock"
    odd = ["../escape", ".._escape", "a/b", "a_b", ""]
    names = [gpulocks.safe_name(key) for key in odd]
    assert len(set(names)) == len(odd)
    assert all("/" not in name and not name.startswith(".") for name in names)
    with hold(odd, {"run_id": "run-a"}, locks):
        assert sorted(os.listdir(locks)) == sorted(names)
    assert not (tmp_path / "escape.lock").exists()


def test_a_holder_needs_a_run_id(locks):
    with pytest.raises(ValueError, match="run_id"):
        hold(["GPU-1"], {"user": "me"}, locks)


def test_the_lock_directory_is_in_the_first_shared_sticky_parent_or_the_one_given(
        tmp_path, monkeypatch):
    """/run/lock before /tmp where it is world-writable and sticky (tmpfiles
    ages /tmp, a private /tmp is one user's alone); a parent a user cannot
    write to, or without the sticky bit, is passed over; the site's own
    directory wins."""
    private, plain, shared, last = (tmp_path / n for n in ("private", "plain", "shared", "tmp"))
    for path, mode in ((private, 0o755), (plain, 0o777), (shared, 0o1777), (last, 0o1777)):
        path.mkdir()
        os.chmod(path, mode)
    monkeypatch.setattr(gpulocks, "LOCK_PARENTS", (str(tmp_path / "none"), str(private),
                                                   str(plain), str(shared), str(last)))
    assert gpulocks.lock_dir() == str(shared / "ddp-orch-gpus")
    monkeypatch.setattr(gpulocks, "LOCK_PARENTS", (str(private), str(last)))
    assert gpulocks.lock_dir() == str(last / "ddp-orch-gpus")
    assert gpulocks.lock_dir("/srv/gpu-locks") == "/srv/gpu-locks"


def test_a_given_lock_directory_is_made_alone_never_its_parents(tmp_path):
    with pytest.raises(FileNotFoundError):
        hold(["GPU-a"], {"run_id": "r1"}, str(tmp_path / "no" / "such"))
    assert not (tmp_path / "no").exists()
    with hold(["GPU-a"], {"run_id": "r1"}, str(tmp_path / "locks")):
        assert stat.S_IMODE(os.stat(tmp_path / "locks").st_mode) == 0o1777
