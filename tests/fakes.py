"""Fakes the unit tests share: a clock that only moves when told, and the
parts of an agent channel that a fake node never uses."""

from __future__ import annotations


class FakeClock:
    """A stand-in for a module's ``time``: fake seconds from 0, on a wall
    clock that starts in 2023. ``sleep`` moves it; nothing else does."""

    EPOCH = 1_700_000_000.0

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.EPOCH + self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class QuietChannel:
    """The channel calls (``engine/channel.py``) a fake node answers with
    nothing: no bytes to put back, no process to poll, wait for or hang up."""

    def unread(self, data: bytes) -> None:
        pass

    def poll(self):
        return None

    def wait(self, timeout: float) -> int:
        raise TimeoutError

    def hang_up(self) -> None:
        pass

    def release(self):
        return None
