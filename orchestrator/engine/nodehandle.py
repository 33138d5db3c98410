"""One node of a running launch: its supervisor's output, control events and outcome."""

from __future__ import annotations

import re
import threading
import time
from typing import Callable

from ..agent.node.spec import SupervisorSpec
from ..agent.wire.files import mask_strings
from .gpuuse import GpuUse
from ..agent.wire.protocol import (CONTROL_PREFIX, PEER_TIMEOUT_S, Control,
                              Event, LineBuffer, ProtocolError, decode,
                              rank_progress)
from ..console import AGENT_SAYS, Console  # AGENT_SAYS: a line of the agent's own
from ..plan.dryrun import NodeLaunch
from ..plan.secrets import scrub, secret_values
from ..records.outcome import EndReason, NodeOutcome
from ..records.rundir import RunDir
from .agentlink import AgentHandle
from .channel import KeeperFollower, NodeChannel
from .nodestate import ATTEMPT_FROM, NEXT, Ask, NodeFacts, NodePhase, node_outcome

_RANK_LINE = re.compile(rb"^\[rank(\d+)\]:", re.MULTILINE)  # torchrun's prefix
class NodeHandle:
    """Turns a node's agent into its supervisor and relays what it prints;
    ``agent`` serves the requests around the run (``detach``, ``down``)."""

    def __init__(self, launch: NodeLaunch, agent: NodeChannel, run: RunDir, console: Console,
                 on_change: Callable[[], None] = lambda: None):
        self.launch = launch
        self.node = launch.node
        self.agent = agent
        self.channel: NodeChannel = agent
        self.on_change = on_change  # called once the node's command has ended
        self.run = run
        self.console = console
        self.phase = NodePhase.NEW  # how far its run has come (``advance``)
        self.asked = Ask.NOTHING  # what the controller asked of it
        self.control: dict | None = None  # its exit event (a kept run's: ``finished``)
        self.last_heard = time.monotonic()  # the node's last bytes (a heartbeat at least)
        self.secrets = secret_values(launch.env)
        self.secret_strings = [value.decode() for value in self.secrets]
        self.facts = NodeFacts()  # what is known of its end (``node_outcome``)
        self._relay: threading.Thread | None = None
        # Per global rank: (last step, monotonic time of its last progress): a
        # step heartbeat (workloads.contract.heartbeat, ddp_orch_progress.step)
        # or, with watch_output, an output line: what the hang rule, status
        # and --quiet's progress line count. ``output_at``: its last line alone.
        self.progress: dict[int, tuple[int | None, float]] = {}
        # Per global rank: the training samples its last step heartbeat said it
        # had processed so far, where that heartbeat said (``progress.json``).
        self.samples: dict[int, int] = {}
        # Per global rank: its seconds per step outside collectives, computing
        # and waiting for data, where its last step heartbeat said them.
        self.pace: dict[int, tuple[float, float]] = {}
        # Per global rank: the monotonic time of its last step report alone (an
        # output line moves ``progress``'s time, not this): what its rate is over.
        self.step_at: dict[int, float] = {}
        self.output_at: dict[int, float] = {}
        self.gpu_use = GpuUse()  # its GPUs' utilisation and memory, from its heartbeats
        # Settings of the relay, set before it runs:
        self.watch_output = False  # count output lines as progress (a stream read live)
        # A kept run (agent/kept/keeper.py): the stream holds every attempt; its
        # end is the keeper's ``finished`` event, not one attempt's ``exit``.
        self.relays_keeper = False
        self.attempt = 0
        self.exits: list[dict] = []  # each attempt's exit event, in a kept run
        self.log_mode = "ab"  # "wb": the stream is the node's whole log (attach from the start)

    def advance(self, to: NodePhase) -> bool:
        """Move to ``to`` where ``NEXT`` allows it; an event out of order changes nothing."""
        if to not in NEXT[self.phase]:
            return False
        self.phase = to
        return True

    # The phases and requests as the gang asks about them.
    supervising = property(lambda self: self.phase is not NodePhase.NEW)
    setup_ok = property(lambda self: self.phase >= NodePhase.SET_UP)  # past its setup
    go_sent = property(lambda self: self.phase >= NodePhase.GO)
    joined = property(lambda self: self.phase >= NodePhase.JOINED)
    started = property(lambda self: self.phase >= NodePhase.STARTED)
    stop_sent = property(lambda self: self.asked >= Ask.STOP)
    killed = property(lambda self: self.asked is Ask.KILL)

    def follow(self, **request) -> None:
        """Relay a kept run's stream (``agent/kept/daemon.follow``) from this channel."""
        self.relays_keeper = True
        self.channel = KeeperFollower(self.agent, request)
        self.channel.supervise()
        self.advance(NodePhase.SUPERVISED)
        self._relay = threading.Thread(target=self._relay_output, daemon=True,
                                       name=f"follow-node{self.node.node_rank}")
        self._relay.start()

    def start(self, spec: SupervisorSpec) -> None:
        self.channel.supervise(spec)
        self.advance(NodePhase.SUPERVISED)
        self._relay = threading.Thread(target=self._relay_output, daemon=True,
                                       name=f"relay-node{self.node.node_rank}")
        self._relay.start()

    def _relay_output(self) -> None:
        """Copy the node's output to its log and the console, and act on control
        lines up to the exit event. A block of lines per write: per-line relaying
        cost seconds of CPU on a chatty job.
        """
        secrets = self.secrets
        lines = LineBuffer()
        with NodeLog(self.run.node_log(self.node.node_rank), self.log_mode,
                     self.console.info) as log:
            while self.control is None:
                chunk = self.channel.read_chunk(65536)
                self.last_heard = time.monotonic()
                block = lines.feed(chunk) if chunk else lines.flush()
                kept, rest = self._take_control(block)
                if self.watch_output and kept:
                    now = time.monotonic()
                    for rank in map(int, set(_RANK_LINE.findall(kept))):
                        self.progress[rank] = (self.progress.get(rank, (None, 0.0))[0], now)
                        self.output_at[rank] = now
                if secrets:
                    kept = scrub(kept, secrets)
                if kept:
                    log.write(kept)
                    self.console.node_lines(self.node.node_rank, self.node.host,
                                            kept.decode("utf-8", "replace"))
                if not chunk:
                    break
            if self.control is not None:
                self.channel.unread(rest + lines.flush())
            else:  # the channel closed without an exit event: wait for its status
                try:
                    self.channel.wait(10.0)
                except TimeoutError:
                    pass
        self.on_change()

    def _take_control(self, block: bytes) -> tuple[bytes, bytes]:
        """``block``'s output lines, and what follows the exit event if it is there."""
        if CONTROL_PREFIX not in block:
            return block, b""
        kept = []
        lines = block.splitlines(keepends=True)
        for i, line in enumerate(lines):
            if not line.startswith(CONTROL_PREFIX):
                kept.append(line)
                continue
            kept.append(self._on_event(line))
            if self.control is not None:
                return b"".join(kept), b"".join(lines[i + 1:])
        return b"".join(kept), b""

    def _on_event(self, line: bytes) -> bytes:
        """Act on a control line; a malformed one is logged, never trusted.
        Secrets are masked in its decoded strings, never in its framing (a
        "secret" may read like JSON)."""
        try:
            event = mask_strings(decode(line), self.secret_strings)
        except ProtocolError as exc:
            note = f"ddp-orch: ignored a malformed control line from the node: {exc}\n"
            return scrub(note.encode(), self.secrets)
        if event["event"] == Event.JOINED:
            self.advance(NodePhase.JOINED)
        elif event["event"] == Event.STARTED:
            self.advance(NodePhase.STARTED)
        elif event["event"] == Event.SETUP:
            if event["ok"]:
                self.advance(NodePhase.SET_UP)
        elif event["event"] == Event.EXIT and self.relays_keeper:
            self.exits.append(event)
        elif event["event"] in (Event.EXIT, Event.FINISHED):
            self.control = event
        elif event["event"] == Event.ATTEMPT:
            self.attempt = event["attempt"]
            if event["attempt"]:
                if self.phase in ATTEMPT_FROM:  # torchrun again, its setup done
                    self.phase = NodePhase.SET_UP
                # new ranks; their step files are gone
                self.progress, self.samples, self.pace, self.step_at, self.output_at = \
                    {}, {}, {}, {}, {}
                return (f"{AGENT_SAYS}attempt {event['attempt']} (master port "
                        f"{event['master_port']})\n").encode()
        elif event["event"] == Event.HEARTBEAT:
            self._on_progress(event.get("progress"))
            self.gpu_use.add(event.get("gpus"))
        return b""

    def _on_progress(self, progress: object) -> None:
        """A heartbeat's {rank: entry} (``rank_progress``; ages on the node's clock)."""
        if not isinstance(progress, dict):
            return
        now = time.monotonic()
        for key, value in list(progress.items())[:4096]:
            entry = rank_progress(value) if isinstance(key, str) and key.isdigit() else None
            if entry is None or not isinstance(entry[0], int):
                continue
            rank, seen_at = int(key), now - entry.age_s
            if seen_at <= self.step_at.get(rank, float("-inf")):
                continue  # no newer than a report already seen
            # the step is the report's; the progress time the younger of it and
            # the rank's last output line (a rank that prints keeps its step too)
            self.step_at[rank] = seen_at
            self.progress[rank] = (entry.step,
                                   max(seen_at, self.progress.get(rank, (None, seen_at))[1]))
            _keep(self.samples, rank, entry.samples)
            _keep(self.pace, rank, entry.pace)

    def poll(self) -> int | None:
        """torchrun's exit code once the run is over; None before."""
        if not self.supervising:
            return None
        code = self.control["code"] if self.control is not None else self.channel.poll()
        if code is not None and self.facts.ended_at is None:
            self.facts.ended_at = time.time()
        return code

    def go(self) -> None:
        """Every node's setup is done: this node's torchrun may start."""
        if self.poll() is None and not self.killed and self.advance(NodePhase.GO):
            self.channel.send_control(Control.GO)

    def stop(self, why: str = "") -> None:
        """Ask for a graceful teardown; ``why`` becomes the node's reason for its end."""
        if self.supervising and self.poll() is None and not self.stop_sent:
            self.asked = Ask.STOP
            self.channel.send_control(Control.STOP, why)

    def kill(self) -> None:
        """Ask the supervisor to SIGKILL the run now; closing stdin backs it up."""
        if self.supervising and self.poll() is None:
            self.asked = Ask.STOP  # a kill is a stop, should the channel fail below
            self.channel.send_control(Control.KILL)
            self.channel.hang_up()
            self.asked = Ask.KILL

    @property
    def heard_s(self) -> float:
        """Seconds since the node was last heard."""
        return time.monotonic() - self.last_heard

    def drain(self, timeout: float) -> None:
        """Until the relay has copied everything the node sent (or ``timeout``)."""
        if self._relay is not None:
            self._relay.join(timeout)

    @property
    def silent(self) -> bool:
        """Nothing from the node for PEER_TIMEOUT_S while its run goes on."""
        return self.poll() is None and time.monotonic() - self.last_heard > PEER_TIMEOUT_S

    def ping(self) -> None:
        """Tell the node's supervisor the controller is still there."""
        if self.supervising and self.control is None and not self.killed:
            self.channel.send_control(Control.PING)

    def release(self) -> AgentHandle | None:
        """After the exit event: give the channel back to the agent, for
        fetching files; None when it is gone, cut or a kept run's follower."""
        if self.control is None or self.killed or self.channel.poll() is not None:
            return None
        return self.channel.release()

    def abort(self) -> None:
        """Cut the supervisor off. Last resort: only it can reach the workers."""
        if self.supervising and self.poll() is None:
            self.facts.find(EndReason.CUT_OFF)
            self.channel.abort()

    @property
    def given_up(self) -> bool:
        """Lost to the controller (silent, or its follower gone): nothing more is asked of it."""
        return self.facts.found in (EndReason.SILENT, EndReason.FOLLOWER_LOST)

    @property
    def unreachable(self) -> bool:
        """Given up on or cut off: nothing more is asked of the node after the run."""
        return self.given_up or self.facts.found is EndReason.CUT_OFF

    def give_up(self) -> None:
        """Silent past the peer timeout: it cannot hear a stop. Its end is
        dated when last heard, before any failure it caused elsewhere."""
        if self.poll() is None:
            self.facts.find(EndReason.SILENT)
            self.facts.ended_at = time.time() - self.heard_s
            self.abort()

    def finish(self, timeout: float = 5.0) -> NodeOutcome:
        """Drain the relay and describe how the node ended."""
        if self._relay is not None:
            self._relay.join(timeout)
        code = self.poll()
        self.facts.event = self.control
        if self.control is None:
            self.facts.code = code
        return node_outcome(self.node, self.facts, self.phase, self.asked)


class NodeLog:
    """A node's log, written as its relay reads it. A failed write (disk full)
    never stops the relay, which also carries the exit event: the trouble is
    said once, and writing resumes when it can."""

    def __init__(self, path: str, mode: str, say: Callable[[str], None]):
        self.path, self.say, self.trouble = path, say, ""
        try:
            self.file = open(path, mode, buffering=0)  # noqa: SIM115 (closed in __exit__)
        except OSError as exc:
            self.file = None
            self._failed(exc)

    def __enter__(self) -> "NodeLog":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()

    def write(self, block: bytes) -> None:
        try:
            if self.file is None:
                self.file = open(self.path, "ab", buffering=0)  # noqa: SIM115
            view = memoryview(block)
            while view:
                written = self.file.write(view)
                if not written:
                    raise OSError(f"no byte of {len(view)} written")
                view = view[written:]
            self.trouble = ""
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if not self.trouble:
            self.trouble = exc.strerror or str(exc)
            self.say(f"cannot write {self.path}: {self.trouble}; its lines are shown here, "
                     "not kept, until it can be written again")


def _keep(seen: dict, rank: int, value: object) -> None:
    """``seen[rank] = value``, or no entry for None (the rank said none)."""
    if value is None:
        seen.pop(rank, None)
    else:
        seen[rank] = value
