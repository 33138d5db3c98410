"""What an agent process holds for its run until torchrun, or a keeper, takes it."""

from __future__ import annotations

import socket

from . import gpulocks


class Holdings:
    """Node 0's master port, bound and not listening (``setup:`` may take half
    an hour, and another job's store could take the port meanwhile), and the
    run's GPU locks. One per serve session, Slurm node or keeper, never module
    state: a second session, or a test, holds only its own."""

    def __init__(self) -> None:
        self.ports: list[socket.socket] = []
        self.gpu_locks: list[gpulocks.Holds] = []

    def gpu_fds(self) -> list[int]:
        return [fd for holds in self.gpu_locks for fd in holds.fds]

    def fds(self) -> list[int]:
        return [sock.fileno() for sock in self.ports] + self.gpu_fds()

    def release_ports(self) -> None:
        """Let torchrun's store have the ports: right before it starts."""
        while self.ports:
            self.ports.pop().close()

    def release_gpus(self) -> None:
        """Let go of the GPUs (a launch abandoned)."""
        while self.gpu_locks:
            self.gpu_locks.pop().release()
