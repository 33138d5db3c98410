"""What the gang needs of one node's stream: the node channel, declared.

A ``NodeHandle`` relays a node's output and control events and steers the
node with the ``Control`` words of ``agent/wire/protocol.py``; it never
learns what carries them. Three things do:

* ``AgentHandle`` (``agentlink.py``): a node agent over SSH or local pipes,
  which becomes the node's supervisor (``supervise``); the words go down its
  stdin, and after the exit event the channel is the agent's again
  (``release``), for fetching files.
* ``KeeperFollower`` (here): the same link after ``follow``, relaying a kept
  run's stream (``agent/kept/daemon.follow``); the words reach the node's
  keeper through the follower, and the channel ends with the stream.
* ``JobStream`` (``backends/scheduler/job.py``): a scheduled node's ``agent.out`` in
  the shared run directory; ``stop`` and ``kill`` become the scheduler's cancel.
"""

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
        """Tell the node ``word`` (a word with no meaning here is dropped);
        ``reason``: who asked and why, for a ``stop``."""

    def read_chunk(self, size: int) -> bytes:
        """The node's next output (up to ``size`` bytes); b"" at its end."""

    def unread(self, data: bytes) -> None:
        """Put back what the relay read past the end of the run's stream."""

    def poll(self) -> int | None:
        """The channel's own exit status: None while it is open."""

    def wait(self, timeout: float) -> int:
        """Block up to ``timeout`` seconds for the exit status; TimeoutError after."""

    def hang_up(self) -> None:
        """Close the way to the node (after ``kill``: nothing more will be sent)."""

    def abort(self) -> None:
        """Cut the node off now. Last resort: only its supervisor reaches the workers."""

    def release(self) -> "AgentHandle | None":
        """After the exit event: the agent, ready for requests again, or None
        where there is none to give back (a follower, a Slurm stream)."""


class KeeperFollower:
    """A kept run's stream followed over an agent's channel: ``follow`` is
    sent instead of ``supervise`` (the keeper runs the supervisor), ``stop``
    and ``kill`` reach the keeper through the follower (``daemon.follow``),
    and the stream ends with the keeper's ``finished`` event: nothing is
    given back."""

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
