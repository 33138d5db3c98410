"""A node's stream on disk (``layout.STREAM``): its only voice where no
channel holds it (a kept run's keeper, a Slurm job's node).

A full disk must not silence it as the ranks' last lines are written, nor
make a write raise (that would stop the relay draining torchrun's pipes).
So it keeps room ahead of its end, unseen by readers: control lines may use
it all, output all but ``KEEP_FOR_CONTROL``; what does not fit is dropped.
"""

from __future__ import annotations

import errno
import os
import threading
import time

from ..wire.protocol import CONTROL_PREFIX

AHEAD_BYTES = 256 << 10  # room kept ahead of the end
KEEP_FOR_CONTROL = 64 << 10  # of it, what only control lines may use on a full disk
RETRY_S = 5.0  # how often a full disk is asked again for room
_KEEP_SIZE = 1  # FALLOC_FL_KEEP_SIZE
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def _fallocate():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.fallocate
    except (OSError, AttributeError, ImportError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    call.restype = ctypes.c_int

    def fallocate(fd: int, offset: int, length: int) -> int:
        return 0 if call(fd, _KEEP_SIZE, offset, length) == 0 else ctypes.get_errno()

    return fallocate


class Stream:
    """``write``/``flush`` over the stream's ``O_APPEND`` descriptor."""

    def __init__(self, fd: int, fallocate=None):
        self.fd = fd
        self._fallocate = fallocate if fallocate is not None else _fallocate()
        self.lock = threading.Lock()
        self.reserved_to = 0  # the file's blocks are allocated up to here
        self.full = ""  # why no more room was given (the disk is full), or ""
        self.asked_at = 0.0  # when room was last asked for, on a full disk
        self.dropped = 0  # bytes that did not fit
        self.torn = False  # a write stopped mid-line: the next one starts a line
        with self.lock:
            self._renew(self._end())

    def write(self, data: bytes) -> int:
        """``data`` appended whole, or what fits; never raises for a full disk."""
        with self.lock:
            end = self._end()
            if self.full or end + len(data) > self.reserved_to - AHEAD_BYTES // 2:
                self._renew(end)
            room = self.reserved_to - end
            control = data.startswith(CONTROL_PREFIX)
            if self.full and self._fallocate is not None and not control \
                    and room - len(data) < KEEP_FOR_CONTROL:
                self.dropped += len(data)
                return len(data)
            out = b"\n" + data if self.torn else data
            view = memoryview(out)
            while view:
                try:
                    view = view[os.write(self.fd, view):]
                except OSError as exc:
                    if exc.errno not in _NO_ROOM:
                        raise
                    self.full = self.full or (exc.strerror or str(exc))
                    self.dropped += len(view)
                    self.torn = self.torn or len(view) < len(out)
                    return len(data)
            self.torn = False
            if self._fallocate is None:
                self.full = ""  # a plain file: this write found room
            return len(data)

    def flush(self) -> None:
        """Every write went straight to the file."""

    def give_back(self) -> None:
        """The node's last line is written: give the room ahead back."""
        with self.lock:
            if self._fallocate is not None and self.reserved_to:
                try:
                    os.ftruncate(self.fd, self._end())
                except OSError:
                    pass
                self.reserved_to = 0

    def _end(self) -> int:
        try:
            return os.fstat(self.fd).st_size
        except OSError:
            return self.reserved_to

    def _renew(self, end: int) -> None:
        """Room ahead of ``end`` again; on a full disk, asked every ``RETRY_S`` at most."""
        if self._fallocate is None:
            return
        now = time.monotonic()
        if self.full and now - self.asked_at < RETRY_S:
            return
        self.asked_at = now
        failed = self._fallocate(self.fd, end, AHEAD_BYTES)
        if failed in _NO_ROOM:
            self.full = self.full or os.strerror(failed)
        elif failed:  # not supported here: a plain file
            self._fallocate = None
        else:
            self.reserved_to, self.full = end + AHEAD_BYTES, ""


def offset_of_last_lines(fh, lines: int) -> int:
    """Where the node's last ``lines`` lines of output begin (looking back
    8 MiB at most); control lines are never shown, so they do not count."""
    end = fh.seek(0, os.SEEK_END)
    start = max(0, end - (8 << 20))
    fh.seek(start)
    data = fh.read()
    parts = data.split(b"\n")  # the last one: what follows the last newline
    offset = len(data) - len(parts[-1])
    counted = 0
    for part in reversed(parts[:-1]):
        if counted >= lines:
            break
        offset -= len(part) + 1
        if not part.startswith(CONTROL_PREFIX):
            counted += 1
    return start + offset
