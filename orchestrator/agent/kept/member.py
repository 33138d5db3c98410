"""Every other node's keeper: a member of a kept run's gang.

It links to the head (node 0), runs the attempts the head starts, and tells
it of its failures, progress and end. A member that loses its head stops at
once: a gang cannot go on without node 0.
"""

from __future__ import annotations

import queue
import threading
import time

from . import peers
from .keeper import Keeper
from .spec import KeeperSpec
from ..gangrule import stop_reason
from ..node.holdings import Holdings
from ..wire.protocol import Event, message
from ..wire.runstate import RunState


class Member(Keeper):
    """A keeper on a node other than node 0; ``keep`` follows the head."""

    def __init__(self, spec: KeeperSpec, holdings: Holdings | None = None):
        super().__init__(spec, holdings)
        self.head: peers.Link | None = None  # the link to node 0, once made
        self.inbox: queue.Queue = queue.Queue()  # the head's gang-start and gang-finish

    def on_local_stop(self) -> None:
        if self.head is not None:  # else ``keep`` tells the head once linked
            self.head.send(message(Event.GANG_STOP, attempt=self.current, reason=self.final,
                                   final=True))

    def on_own_failure(self, attempt: int, code: int) -> None:
        if self.head is not None:
            self.head.send(message(Event.GANG_FAILING, attempt=attempt, code=code))

    def tell_progress(self, attempt: int, started: bool, progress: dict) -> None:
        if self.head is not None:
            self.head.send(message(Event.GANG_PROGRESS, attempt=attempt, started=started,
                                   progress=progress))

    def setup_done_here(self) -> None:
        if self.head is not None:
            self.head.send(message(Event.GANG_SETUP, node_rank=self.node_rank))

    def keep(self) -> tuple[int, str]:
        gang = self.spec.gang
        deadline = time.monotonic() + self.spec.start_timeout_s
        sock = peers.connect(gang.addr, gang.port, self.node_rank, gang.token, deadline)
        self.head = peers.Link(sock, self._from_head, self._head_lost).start()
        if self.final:  # signalled while connecting
            self.on_local_stop()
        code = 1
        while True:
            said = self.inbox.get()
            if said is None:
                return code, RunState.FAILED if not self.final else RunState.INTERRUPTED
            if said["event"] == Event.GANG_FINISH:
                self.head.close()
                return code, RunState(said["state"])
            if said["event"] == Event.GANG_START:
                ended = self.run_attempt(said["attempt"], said["master_port"])
                code = int(ended.get("code") or 0)
                self.head.send(message(Event.GANG_ENDED, attempt=said["attempt"], exit=ended))

    def _from_head(self, said: dict) -> None:
        """What the head said (checked by the link: ``protocol.validate``)."""
        event = said["event"]
        if event == Event.GANG_GO:
            self.setup_go.set()
            return
        if event == Event.GANG_STACKS:  # off the link's reader: a dump takes seconds
            threading.Thread(target=self._stacks_asked, args=(said["attempt"], said["stamp"]),
                             daemon=True, name="keeper-stacks").start()
            return
        if event == Event.GANG_FINISH:
            self.finishing = True  # the link closing next is no loss
        if event == Event.GANG_STOP:
            with self.lock:
                self.stop_for.setdefault(said["attempt"], said["reason"])
                if self.supervisor is not None and self.current == said["attempt"]:
                    self.supervisor.request_stop(stop_reason(said["reason"]))
            return
        self.inbox.put(said)

    def _head_lost(self, why: str) -> None:
        if self.finishing:
            return
        why = f"lost the gang's head, node 0 ({why})"
        with self.lock:
            self.final = self.final or why
            if self.supervisor is not None:
                self.supervisor.request_stop(why)
        self.inbox.put(None)
        self.say(f"ddp-orch: {why}; stopping this node")

    def _stacks_asked(self, attempt: int, stamp: str) -> None:
        """The head asks for this node's ranks' stacks (a hang)."""
        places = self._dump_stacks(stamp)
        if self.head is not None:
            self.head.send(message(Event.GANG_STACKS_DONE, attempt=attempt,
                                   places={str(k): v for k, v in places.items()}))
