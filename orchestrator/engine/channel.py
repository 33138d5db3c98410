"""What the gang needs of one node's stream: the node channel, declared, so a
``NodeHandle`` never learns what carries its words."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..agent.wire.protocol import Control

if TYPE_CHECKING:
    from ..agent.node.spec import SupervisorSpec
    from .agentlink import AgentHandle


class NodeChannel(Protocol):
    """One node's stream, as the gang sees it."""

    host: str

    def supervise(self, spec: "SupervisorSpec") -> None:
        """The node runs ``spec`` from now on, and its output follows."""

    def send_control(self, word: Control, reason: str = "") -> None:
        """Tell the node ``word`` (dropped where it means nothing); ``reason`` for a ``stop``."""

    def read_chunk(self, size: int) -> bytes:
        """The node's next output (up to ``size`` bytes); b"" at its end."""

    def unread(self, data: bytes) -> None:
        """Put back what the relay read past the end of the run's stream."""

    def poll(self) -> int | None:
        """The channel's own exit status: None while it is open."""

    def wait(self, timeout: float) -> int:
        """Up to ``timeout`` seconds for the exit status; TimeoutError after."""

    def hang_up(self) -> None:
        """Close the way to the node (after ``kill``: nothing more is sent)."""

    def abort(self) -> None:
        """Cut the node off now. Last resort: only its supervisor reaches the workers."""

    def release(self) -> "AgentHandle | None":
        """After the exit event: the agent, ready for requests, or None."""


class KeeperFollower:
    """A kept run's stream over an agent's channel: ``follow`` replaces
    ``supervise``, and the stream ends with ``finished``: nothing is given back."""

    def __init__(self, agent: "AgentHandle", request: dict[str, Any]):
        self.agent = agent
        self.host = agent.host
        self.request = request

    def supervise(self, spec: "SupervisorSpec | None" = None) -> None:
        self.agent.send("follow", **self.request)

    def send_control(self, word: Control, reason: str = "") -> None:
        self.agent.send_control(word, reason)

    def read_chunk(self, size: int) -> bytes:
        return self.agent.read_chunk(size)

    def unread(self, data: bytes) -> None:
        self.agent.unread(data)

    def poll(self) -> int | None:
        return self.agent.poll()

    def wait(self, timeout: float) -> int:
        return self.agent.wait(timeout)

    def hang_up(self) -> None:
        self.agent.hang_up()

    def abort(self) -> None:
        self.agent.abort()

    def release(self) -> None:
        return None
