"""The keepers' own wire: node 0's gang port and one TCP link per other node.

A kept run (``keeper.py``) has no controller to hold the gang together, so
the node agents hold it themselves: node 0 (the head) listens on a port of
its own, every other node connects to it, and from then on both ends of
each link send a heartbeat every ``GANG_HEARTBEAT_S``. A link is lost when
it closes (a keeper killed with SIGKILL: the kernel closes its socket at
once) or when nothing arrives on it for ``GANG_TIMEOUT_S`` (a frozen node, a
partition that sends no FIN or RST). Either way the other side learns it
within ``GANG_TIMEOUT_S``, and the run's teardown starts there.

Messages are the control lines of ``protocol`` (the same framing, the same
checks); the first line on a link must be ``gang-hello`` with the run's
token, which the controller sent to every node over its own channel, so
nobody else on the network can join the gang or stop it.
"""

from __future__ import annotations

import hmac
import socket
import threading
import time
from typing import Callable

from .protocol import LineBuffer, ProtocolError, decode, encode

GANG_HEARTBEAT_S = 2.0
GANG_TIMEOUT_S = 10.0
MAX_LINE = 1 << 20


class Link:
    """One end of a head-to-node link: send messages, hand received ones to
    ``on_message(msg)``; ``on_lost(why)`` once, when the link is gone."""

    def __init__(self, sock: socket.socket, on_message: Callable[[dict], None],
                 on_lost: Callable[[str], None], first: bytes = b""):
        self.sock = sock
        self.on_message = on_message
        self.on_lost = on_lost
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.lines = LineBuffer(max_line=MAX_LINE)
        self.pending = first  # bytes already read past the hello
        sock.settimeout(GANG_TIMEOUT_S)

    def start(self) -> "Link":
        threading.Thread(target=self._read, daemon=True, name="gang-link").start()
        threading.Thread(target=self._beat, daemon=True, name="gang-beat").start()
        return self

    def send(self, message: dict) -> bool:
        """False when the link is gone (the reader reports it)."""
        if self.closed.is_set():
            return False
        try:
            with self.lock:
                self.sock.sendall(encode(message))
            return True
        except OSError:
            return False

    def close(self) -> None:
        self.closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _beat(self) -> None:
        while not self.closed.wait(GANG_HEARTBEAT_S):
            self.send({"event": "heartbeat"})

    def _read(self) -> None:
        why = "the link closed"
        try:
            block = self.lines.feed(self.pending)
            while True:
                for line in block.splitlines(keepends=True):
                    message = decode(line)
                    if message["event"] != "heartbeat":
                        self.on_message(message)
                data = self.sock.recv(65536)
                if not data:
                    break
                block = self.lines.feed(data)
        except socket.timeout:
            why = f"nothing on the link for {GANG_TIMEOUT_S:g}s"
        except ProtocolError as exc:
            why = f"a malformed message: {exc}"
        except OSError as exc:
            why = f"the link broke: {exc}"
        if not self.closed.is_set():
            self.close()
            self.on_lost(why)


def listener(avoid: int | None = None) -> socket.socket:
    """Node 0's gang port: any free port but ``avoid``, on every interface
    (the peers reach node 0 at the run's master address). ``avoid`` is the
    master port: it was only probed, so it is free, and the kernel may well
    hand it out again, right before torchrun's store needs it."""
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", 0))
        if sock.getsockname()[1] != avoid:
            sock.listen(64)
            return sock
        sock.close()


def accept_hello(conn: socket.socket, token: str, nnodes: int) -> tuple[int, bytes]:
    """The node rank a new connection says it is, once its ``gang-hello``
    carries the run's token, within ``GANG_TIMEOUT_S`` in all; raises
    ProtocolError (or socket.timeout) otherwise."""
    deadline = time.monotonic() + GANG_TIMEOUT_S
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProtocolError("no hello in time")
        conn.settimeout(left)
        chunk = conn.recv(4096)
        if not chunk or len(data) > 4096:
            raise ProtocolError("no hello")
        data += chunk
    line, rest = data.split(b"\n", 1)
    hello = decode(line + b"\n")
    if hello["event"] != "gang-hello" or not hmac.compare_digest(
            hello["token"].encode(), token.encode()):
        raise ProtocolError("not a node of this run")
    if not 0 < hello["node_rank"] < nnodes:
        raise ProtocolError(f"node rank {hello['node_rank']} is not in this run")
    return hello["node_rank"], rest


def connect(addr: str, port: int, node_rank: int, token: str,
            deadline: float) -> socket.socket:
    """Connect to the head and say hello, retrying until ``deadline``
    (monotonic): the head may still be starting."""
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=GANG_TIMEOUT_S)
            sock.sendall(encode({"event": "gang-hello", "node_rank": node_rank,
                                 "token": token}))
            return sock
        except OSError as exc:
            if time.monotonic() > deadline:
                raise ConnectionError(f"cannot reach node 0's gang port {addr}:{port}: "
                                      f"{exc}") from None
            time.sleep(0.2)
