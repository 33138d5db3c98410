"""A port for a lab's server, or a test's torchrun store, to listen on."""

from __future__ import annotations

import random
import socket


def free_port(addr: str = "") -> int:
    """A port no one holds on ``addr`` (every address by default), picked
    below the kernel's ephemeral range (32768 and up on Linux).

    The server binds it some seconds later. A port the kernel hands out for
    the asking (bind to 0) comes from the ephemeral range, where the other
    tests' ssh, Slurm and store clients are given ports all the time: one of
    them can take it meanwhile, and the server fails to bind. Below it only a
    server asking for that very port can. torch's default, 29500, and its
    neighbours are left to the runs that use them.
    """
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(20000, 32000)
        if 29400 <= port < 29600:
            continue
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((addr, port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port on {addr or 'any address'} in 20000-32000")
