"""A node's stream on a disk that fills (agent/node/stream.py), on a real
small tmpfs: the room it keeps ahead is the node's voice once the disk is
full, and no write raises."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from orchestrator.agent.node.stream import AHEAD_BYTES, KEEP_FOR_CONTROL, Stream
from orchestrator.agent.wire.protocol import CONTROL_PREFIX


@pytest.fixture
def small_disk(tmp_path):
    path = tmp_path / "disk"
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "stream-test", str(path)],
                          capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield path
    subprocess.run(["umount", "-l", str(path)])


def fill(disk) -> None:
    """Another writer takes every free block (a checkpoint, another job)."""
    with open(disk / "fill", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def control(n: int) -> bytes:
    return CONTROL_PREFIX + b'{"event":"heartbeat","n":%d}\n' % n


def lines_of(path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


def open_stream(disk):
    return os.open(disk / "agent.out", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def test_control_lines_get_through_a_full_disk_and_output_leaves_them_room(small_disk):
    fd = open_stream(small_disk)
    stream = Stream(fd)
    stream.write(b"before\n")
    fill(small_disk)
    assert os.statvfs(small_disk).f_bavail == 0
    out = b"x" * 1000 + b"\n"
    for _ in range(AHEAD_BYTES // len(out)):  # more output than the room ahead
        stream.write(out)
    assert stream.full and stream.dropped > 0
    for n in range(20):  # heartbeats, an exit, the end: every one of them whole
        stream.write(control(n))
    os.close(fd)
    got = lines_of(small_disk / "agent.out")
    assert got[0] == b"before"
    assert [line for line in got if line.startswith(CONTROL_PREFIX)] == \
        [control(n).rstrip(b"\n") for n in range(20)]
    assert all(line in (b"", out.rstrip(b"\n")) for line in got[1:-21]), "a torn line"
    # output stopped while the control lines' share was still there
    size = (small_disk / "agent.out").stat().st_size
    assert size <= AHEAD_BYTES - KEEP_FOR_CONTROL + len(out) + 4096 + 21 * 64


def test_a_write_past_every_room_is_dropped_not_raised_and_the_next_line_starts_whole(
        small_disk):
    fd = open_stream(small_disk)
    stream = Stream(fd, fallocate=lambda fd, offset, length: errno.EOPNOTSUPP)  # a plain file
    stream.write(b"start\n")  # its page has room left, for part of the next write
    fill(small_disk)
    page = b"y" * 10000  # more than the last page holds: cut short
    assert stream.write(page) == len(page)  # no OSError reaches the relay
    assert 0 < stream.dropped < len(page)
    os.unlink(small_disk / "fill")  # somebody makes room
    stream.write(control(1))
    os.close(fd)
    got = lines_of(small_disk / "agent.out")
    assert control(1).rstrip(b"\n") in got, got[-3:]


def test_the_room_ahead_goes_back_to_the_disk_at_the_end(small_disk):
    fd = open_stream(small_disk)
    stream = Stream(fd)
    before = os.statvfs(small_disk).f_bfree
    stream.write(b"one line\n")
    held = os.statvfs(small_disk).f_bfree
    assert before - held <= 1 and stream.reserved_to >= AHEAD_BYTES  # reserved at the start
    stream.give_back()
    assert os.fstat(fd).st_size == len(b"one line\n")
    freed = os.statvfs(small_disk).f_bfree
    assert (freed - held) * os.statvfs(small_disk).f_frsize >= AHEAD_BYTES - 4096
    os.close(fd)
