"""The keepers' own wire: node 0's gang port and one TCP link per other node.

A kept run has no controller to hold the gang, so the node agents do: node
0 (the head) listens, every other node connects, and both ends of each link
send a heartbeat every ``GANG_HEARTBEAT_S``. A link is lost when it closes
(a SIGKILLed keeper's socket closes at once) or is silent for
``GANG_TIMEOUT_S`` (a frozen node, a partition): either way the other side
learns it within ``GANG_TIMEOUT_S`` and starts the run's teardown.

Messages are ``protocol``'s control lines; the first on a link must be
``gang-hello`` with the run's token, so nobody else on the network can join
or stop the gang. A line that does not decode ends its link as lost.
"""

from __future__ import annotations

import hmac
import ipaddress
import queue
import select
import socket
import threading
import time
from typing import Callable

from ..wire.addr import hostport
from ..wire.protocol import Event, LineBuffer, ProtocolError, decode, encode, message

GANG_HEARTBEAT_S = 2.0
GANG_TIMEOUT_S = 10.0
MAX_LINE = 1 << 20
MAX_PENDING = 16  # connections waiting for their hello at once; the oldest gives way
MAX_HELLO = 4096  # a hello is one short line
ACCEPT_PAUSE_S = 0.1  # after an accept error (EMFILE...), before accepting again
HEARTBEAT = message(Event.HEARTBEAT)  # what each end of a link sends every GANG_HEARTBEAT_S
OUTBOX_MAX = 4096  # messages a link holds for a peer that does not read them
# How long closing a link waits for its outbox to be written: the last word
# to a peer (the head's "finished") goes before the socket does, but a
# peer that does not read never holds the end longer than this.
FLUSH_S = 2.0


class Link:
    """One end of a head-to-node link: received messages go to
    ``on_message(msg)``; ``on_lost(why)`` once, when the link is gone.
    ``send`` never waits on the network (a thread writes the outbox): the
    head sends holding its lock, which a frozen peer must not hold up."""

    def __init__(self, sock: socket.socket, on_message: Callable[[dict], None],
                 on_lost: Callable[[str], None], first: bytes = b""):
        self.sock = sock
        self.on_message = on_message
        self.on_lost = on_lost
        self.outbox: queue.Queue[bytes | None] = queue.Queue(OUTBOX_MAX)
        self.closed = threading.Event()
        self.written = threading.Event()  # the writer has ended: its outbox is out
        self.lines = LineBuffer(max_line=MAX_LINE)
        self.pending = first  # bytes already read past the hello
        # Wall clock, for the record of a loss: when the other end was last
        # heard (a heartbeat at least), and when the link was given up on.
        self.heard_at = time.time()
        self.lost_at: float | None = None
        sock.settimeout(GANG_TIMEOUT_S)

    def start(self) -> "Link":
        threading.Thread(target=self._read, daemon=True, name="gang-link").start()
        threading.Thread(target=self._write, daemon=True, name="gang-send").start()
        threading.Thread(target=self._beat, daemon=True, name="gang-beat").start()
        return self

    def send(self, message: dict) -> bool:
        """False when the link is gone, or its peer has read none of ``OUTBOX_MAX``."""
        if self.closed.is_set():
            return False
        try:
            self.outbox.put_nowait(encode(message))
            return True
        except queue.Full:
            return False

    def close(self) -> None:
        """What was sent goes out first (up to ``FLUSH_S``), so the head's last
        word to a node is not lost with the socket."""
        if not self.closed.is_set():
            try:
                self.outbox.put_nowait(None)  # the writer ends once it reaches it
            except queue.Full:
                pass
            if self.lost_at is None:
                self.written.wait(FLUSH_S)
        self.closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _write(self) -> None:
        """The outbox to the socket; a failed send ends the link."""
        try:
            while True:
                data = self.outbox.get()
                if data is None or self.closed.is_set():
                    return
                try:
                    self.sock.sendall(data)
                except OSError:
                    try:
                        self.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
        finally:
            self.written.set()

    def _beat(self) -> None:
        while not self.closed.wait(GANG_HEARTBEAT_S):
            self.send(HEARTBEAT)

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
                self.heard_at = time.time()
                block = self.lines.feed(data)
        except socket.timeout:
            why = f"nothing on the link for {GANG_TIMEOUT_S:g}s"
        except ProtocolError as exc:
            why = f"a malformed message: {exc}"
        except OSError as exc:
            why = f"the link broke: {exc}"
        except Exception as exc:  # noqa: BLE001 (a message we could not act on)
            # Never a reader that dies quietly: its link would look alive.
            why = f"a malformed message: {type(exc).__name__}: {exc}"[:300]
        if not self.closed.is_set():
            self.lost_at = time.time()
            self.close()
            self.on_lost(why)


def listener(addr: str, avoid: int | None = None) -> tuple[socket.socket, str]:
    """Node 0's gang port on ``addr`` (the run's master address), on any free
    port but ``avoid`` (the master port: only probed, so the kernel may hand
    it out again before torchrun's store needs it); and a note. Where this
    host has none of ``addr``'s addresses (NAT), or it resolves here only to
    loopback (Debian's ``127.0.1.1 host``), it listens on every interface
    and says so: the hello's token still keeps strangers out."""
    candidates, note = _bind_candidates(addr)
    for family, host in candidates:
        try:
            return _bind(family, host, avoid), ""
        except OSError as exc:  # not an address of this host
            note = f"node 0 has no address {host} ({exc.strerror or exc})"
    return _bind(socket.AF_INET, "", avoid), f"the gang port listens on every interface: {note}"


def _bind(family: int, host: str, avoid: int | None) -> socket.socket:
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, 0))
        except OSError:
            sock.close()
            raise
        if sock.getsockname()[1] != avoid:
            sock.listen(64)
            return sock
        sock.close()


def _bind_candidates(addr: str) -> tuple[list[tuple[int, str]], str]:
    """Where to listen for ``addr``: its addresses, IPv4 first; and why not,
    when none will do (the caller then listens on every interface)."""
    try:
        literal = ipaddress.ip_address(addr.strip("[]"))
    except ValueError:
        literal = None
    if literal is not None:
        family = socket.AF_INET6 if literal.version == 6 else socket.AF_INET
        return [(family, str(literal))], ""
    try:
        infos = socket.getaddrinfo(addr, 0, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return [], f"{addr!r} does not resolve on node 0 ({exc})"
    found: list[tuple[int, str]] = []
    for family, _t, _p, _n, sockaddr in sorted(infos, key=lambda i: i[0] != socket.AF_INET):
        if family in (socket.AF_INET, socket.AF_INET6) and (family, sockaddr[0]) not in found:
            found.append((family, sockaddr[0]))
    loopback_name = addr.lower() in ("localhost", "localhost.localdomain", "ip6-localhost")
    if not loopback_name and found and all(ipaddress.ip_address(h.split("%")[0]).is_loopback
                                           for _f, h in found):
        return [], (f"{addr!r} resolves to {found[0][1]} on node 0 itself, which the other "
                    f"nodes cannot reach")
    return found, ("" if found else f"{addr!r} has no address on node 0")


class Gate:
    """Node 0's gang port until every node has joined: each connection has
    ``GANG_TIMEOUT_S`` to say its hello, at most ``MAX_PENDING`` wait (a new
    one closes the oldest), all read by one thread, so a flood of hostile
    connections costs nothing past that cap."""

    def __init__(self, sock: socket.socket, token: str, nnodes: int,
                 on_hello: Callable[[int, socket.socket, bytes], None]):
        self.sock, self.token, self.nnodes, self.on_hello = sock, token, nnodes, on_hello
        self.closed = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self.pending: dict[socket.socket, list] = {}  # conn -> [deadline, data]
        self.sock.setblocking(False)

    def start(self) -> "Gate":
        threading.Thread(target=self._run, daemon=True, name="gang-gate").start()
        return self

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            try:
                self._wake_w.send(b"!")
            except OSError:
                pass

    def _run(self) -> None:
        try:
            while not self.closed.is_set():
                try:
                    self._step()
                except Exception:  # noqa: BLE001 (the gate must not end on anything)
                    self.closed.wait(ACCEPT_PAUSE_S)
        finally:
            for conn in list(self.pending):
                conn.close()
            self.pending.clear()
            self.sock.close()
            self._wake_r.close()
            self._wake_w.close()

    def _step(self) -> None:
        now = time.monotonic()
        for conn, (deadline, _data) in list(self.pending.items()):
            if now >= deadline:
                self._drop(conn)
        wait = min([d for d, _ in self.pending.values()], default=now + 1.0) - now
        poller = select.poll()  # not select(): no FD_SETSIZE limit on fd numbers
        by_fd = {conn.fileno(): conn for conn in (self.sock, self._wake_r, *self.pending)}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        for fd, _events in poller.poll(max(0, int(wait * 1000) + 1)):
            conn = by_fd[fd]
            if self.closed.is_set():
                return
            if conn is self.sock:
                self._accept()
            elif conn in self.pending:
                self._read(conn)

    def _accept(self) -> None:
        try:
            conn, _addr = self.sock.accept()
        except BlockingIOError:
            return
        except OSError:  # out of file descriptors, an aborted connection: later
            self.closed.wait(ACCEPT_PAUSE_S)
            return
        if len(self.pending) >= MAX_PENDING:  # the oldest has waited longest
            self._drop(min(self.pending, key=lambda c: self.pending[c][0]))
        conn.setblocking(False)
        self.pending[conn] = [time.monotonic() + GANG_TIMEOUT_S, b""]

    def _read(self, conn: socket.socket) -> None:
        entry = self.pending[conn]
        try:
            chunk = conn.recv(MAX_HELLO)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        entry[1] += chunk
        if not chunk or len(entry[1]) > MAX_HELLO and b"\n" not in entry[1]:
            self._drop(conn)
            return
        if b"\n" not in entry[1]:
            return
        del self.pending[conn]
        try:
            k, rest = check_hello(entry[1], self.token, self.nnodes)
        except ValueError:  # ProtocolError among them
            conn.close()
            return
        conn.setblocking(True)
        self.on_hello(k, conn, rest)

    def _drop(self, conn: socket.socket) -> None:
        self.pending.pop(conn, None)
        conn.close()


def accept_hello(conn: socket.socket, token: str, nnodes: int) -> tuple[int, bytes]:
    """The node rank a connection's ``gang-hello`` names, with the run's token,
    within ``GANG_TIMEOUT_S``; ProtocolError (or socket.timeout) otherwise."""
    deadline = time.monotonic() + GANG_TIMEOUT_S
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProtocolError("no hello in time")
        conn.settimeout(left)
        chunk = conn.recv(MAX_HELLO)
        if not chunk or len(data) > MAX_HELLO:
            raise ProtocolError("no hello")
        data += chunk
    return check_hello(data, token, nnodes)


def check_hello(data: bytes, token: str, nnodes: int) -> tuple[int, bytes]:
    """The node rank ``data``'s ``gang-hello`` names, and what followed it;
    ProtocolError unless it carries the run's token and a rank of this run."""
    line, rest = data.split(b"\n", 1)
    hello = decode(line + b"\n")
    try:
        said = hello["token"].encode()
    except UnicodeError:  # a lone surrogate, say
        raise ProtocolError("not a node of this run") from None
    if hello["event"] != "gang-hello" or not hmac.compare_digest(said, token.encode()):
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
            sock.sendall(encode(message(Event.GANG_HELLO, node_rank=node_rank, token=token)))
            return sock
        except OSError as exc:
            if time.monotonic() > deadline:
                raise ConnectionError(f"cannot reach node 0's gang port {hostport(addr, port)}: "
                                      f"{exc}") from None
            time.sleep(0.2)
