"""The controller's end of a node agent: one exec channel, requests and replies.
The agent and files arrive over the node's transport, files checked by SHA-256
on both ends, so a node needs no install and no SFTP."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..agent.wire import bootstrap
from ..agent.node.procs import own_marker
from ..agent.wire.protocol import (CONTROL_PREFIX, Control, ProtocolError, Reader, check_reply,
                                   decode, digest, request)
from ..errors import TransportError
from ..records.hints import PYTHON as _PYTHON_HINT
from ..records.hints import transport_hint
from ..transport.base import ProcessHandle, Transport
from .fanout import GroupResult, on_all

if TYPE_CHECKING:
    from ..agent.node.spec import SupervisorSpec

NOISE_KEPT = 20  # lines a node printed before its agent spoke, kept for the error


class AgentHandle:
    """A running agent on one node (``serve``), owned by the controller."""

    def __init__(self, transport: Transport, python: str, *, wait: bool = True,
                 run_id: str | None = None, boot: bool = True):
        """Start the agent. Without ``boot``, the caller holds the handle
        first, so a ``boot()`` that blocks can still be aborted by ``close``."""
        self.transport = transport
        self.host = transport.host
        self.python = python
        try:
            self.process: ProcessHandle = transport.start(bootstrap.command(python),
                                                          env=own_marker(run_id) or None)
        except TransportError as exc:  # a local node with no such python, a host not found
            raise TransportError(self.host, exc.message,
                                 exc.hint or transport_hint(exc.message)) from None
        self.reader = Reader(self.process.read_chunk)
        self.noise: list[str] = []
        self.hello: dict = {}
        if boot:
            self.boot(wait)

    def boot(self, wait: bool = True) -> "AgentHandle":
        """Send the agent's package; with ``wait``, wait for its hello too."""
        self.process.send(bootstrap.payload(["serve"]))
        if wait:
            self.await_hello()
        return self

    def await_hello(self) -> "AgentHandle":
        """Block until the agent runs (it arrives and says hello); returns self."""
        self.hello = self._message("hello")
        return self

    @property
    def home(self) -> str:
        return self.hello["home"]

    @property
    def cores(self) -> int:
        """The CPUs the node's agent may run on (its ranks' ``OMP_NUM_THREADS``)."""
        return self.hello["cores"]

    # -- requests -----------------------------------------------------------

    def call(self, op: str, payload: bytes = b"", *, max_reply: int = 1 << 20,
             **fields: Any) -> dict:
        """One request and its reply, both checked against ``protocol.OPS``."""
        self.send(op, payload, **fields)
        return self.reply(op, max_reply=max_reply)

    def send(self, op: str, payload: bytes = b"", **fields: Any) -> None:
        """Send without waiting: the agent answers in order, so several
        requests can be in flight, before its hello too."""
        self.process.send(request(op, **fields) + payload)

    def reply(self, op: str, *, max_reply: int = 1 << 20) -> dict:
        """The next reply; a node announcing more than ``max_reply`` is cut off, not read."""
        if not self.hello:
            self.await_hello()
        reply = self._message("reply")
        if reply.get("size", 0) > max_reply:
            self.process.abort()
            raise TransportError(self.host, f"{op}: the node announced {reply['size']} bytes, "
                                            f"more than the {max_reply} asked for; cut off")
        if "size" in reply and reply["size"]:
            try:
                reply["data"] = self.reader.read_exact(reply["size"])
            except ProtocolError as exc:
                raise self._gone(f"the agent's {op} reply broke off: {exc}") from None
            if reply.get("sha256") not in (None, digest(reply["data"])):
                raise TransportError(self.host, f"{op}: the data arrived corrupted "
                                                "(checksum mismatch)")
        try:
            return check_reply(op, reply)  # an ok reply has what ``OPS`` says
        except ProtocolError as exc:
            raise TransportError(self.host, f"the agent sent a malformed message: {exc}") \
                from None

    def put(self, data: bytes, path: str, mode: int = 0o600) -> str:
        """Write ``data`` to ``path`` on the node; returns the absolute path."""
        self.send_put(data, path, mode)
        return self.put_done(path)

    def send_put(self, data: bytes, path: str, mode: int = 0o600) -> None:
        self.send("put", data, path=path, size=len(data), sha256=digest(data), mode=mode)

    def put_done(self, path: str) -> str:
        reply = self.reply("put")
        if not reply["ok"]:
            raise TransportError(self.host, f"upload to {path} failed: {reply.get('error')}")
        return str(reply.get("path", path))

    def get(self, path: str, max_bytes: int, root: str | None = None) -> bytes | None:
        """The file at ``path`` on the node, or None; with ``root``, a path
        whose links lead out of it is refused."""
        reply = self.call("get", path=path, max=max_bytes, max_reply=max_bytes,
                          **({"root": root} if root is not None else {}))
        if reply["ok"]:
            return reply.get("data", b"")
        if reply.get("missing"):
            return None
        raise TransportError(self.host, str(reply.get("error")))

    def supervise(self, spec: "SupervisorSpec") -> None:
        """Make the agent the node's supervisor; its output follows (``read_chunk``)."""
        self.send("supervise", spec=spec.to_dict())

    # -- the node channel (``channel.NodeChannel``) while it supervises -----

    def send_control(self, word: Control, reason: str = "") -> None:
        self.process.send(word.encode(reason))

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def hang_up(self) -> None:
        self.process.close_stdin()

    def abort(self) -> None:
        self.process.abort()

    def release(self) -> "AgentHandle":
        """Give the channel back to the agent's request loop, the run reported."""
        self.send_control(Control.DONE)
        return self

    def read_chunk(self, size: int) -> bytes:
        """The channel's output, starting with whatever the reader holds."""
        if self.reader.buffer:
            data, self.reader.buffer = self.reader.buffer, b""
            return data
        return self.process.read_chunk(size)

    def unread(self, data: bytes) -> None:
        """Put back what the relay read past the supervisor's exit event."""
        self.reader.buffer = data + self.reader.buffer

    def close(self, timeout_s: float = 5.0) -> None:
        """EOF to the agent: it exits (a supervisor tears its run down first).
        A send blocked on a node that never reads its stdin holds the lock
        the EOF needs, so after ``timeout_s`` the command is aborted."""
        if not self.hello:
            self.process.abort()
            return
        closer = threading.Thread(target=self.process.close_stdin, daemon=True,
                                  name=f"close-{self.host}")
        closer.start()
        closer.join(timeout_s)
        if closer.is_alive():
            self.process.abort()
            return
        try:
            self.process.wait(timeout=timeout_s)
        except TimeoutError:
            self.process.abort()

    # -- replies ------------------------------------------------------------

    def _message(self, expected: str) -> dict:
        """The next control message, which must be ``expected``; other output
        (a login shell's warnings) is kept for errors."""
        while True:
            try:
                line = self.reader.readline()
            except ProtocolError as exc:
                raise self._gone(str(exc)) from None
            if not line:
                raise self._gone()
            if not line.startswith(CONTROL_PREFIX):
                self.noise = (self.noise + [line.decode("utf-8", "replace").rstrip()])[-NOISE_KEPT:]
                continue
            try:
                message = decode(line)
            except ProtocolError as exc:
                raise TransportError(self.host, f"the agent sent a malformed message: {exc}") \
                    from None
            if message["event"] != expected:
                raise TransportError(self.host, f"expected the agent's {expected}, got "
                                                f"{message['event']}")
            return message

    def _gone(self, why: str = "") -> TransportError:
        """Why the agent's output ended: no such Python, no exec, or its last words."""
        try:
            code = self.process.wait(timeout=5.0)
        except TimeoutError:
            code = None
        said = " | ".join(line for line in self.noise if line)[-400:]
        if code in (126, 127):
            return TransportError(self.host, f"cannot run {self.python!r} on the node "
                                             f"(exit {code}){': ' + said if said else ''}",
                                  _PYTHON_HINT)
        detail = why or (f"exit {code}" if code is not None else "no exit status")
        return TransportError(self.host, f"the ddp-orch agent did not answer ({detail})"
                                         f"{': ' + said if said else ''}",
                              "the node must run commands over SSH (exec sessions, "
                              f"no ForceCommand) and have a working {self.python!r}")


def open_agents(transports: Mapping[int, Transport], pythons: Mapping[int, str],
                timeout_s: float, first: Callable[[int, "AgentHandle"], Any] | None = None,
                run_id: str | None = None) -> tuple[GroupResult, dict[int, AgentHandle]]:
    """Start an agent on every node at once; ``first(k, agent)`` runs before
    its hello. Every agent started comes back, so the caller can close them all."""
    started: dict[int, AgentHandle] = {}

    def open_one(k: int) -> Any:
        # Held before the package is sent: a hung node blocks that send, and
        # must still be closed (aborted) at the end.
        started[k] = AgentHandle(transports[k], pythons[k], run_id=run_id, boot=False)
        started[k].boot(wait=False)
        if first is not None:
            return first(k, started[k])
        return started[k].await_hello()

    return on_all(open_one, transports, timeout_s=timeout_s), started
