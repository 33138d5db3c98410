"""One node of a running launch: its supervisor's output, control events and outcome."""

from __future__ import annotations

import enum
import re
import threading
import time
from typing import Callable

from ..agent import layout
from ..agent.node.spec import SupervisorSpec
from ..agent.wire.owner import Owner
from ..agent.wire.files import mask_strings
from .gpuuse import GpuUse
from ..agent.wire.protocol import (CONTROL_PREFIX, HEARTBEAT_S, PEER_TIMEOUT_S, Control, Ended,
                              Event, LineBuffer, ProtocolError, decode,
                              rank_progress)
from ..console import AGENT_SAYS, Console  # AGENT_SAYS: a line of the agent's own
from ..plan.dryrun import NodeLaunch
from ..plan.build import setup_path_first
from ..plan.model import NodePlan
from ..plan.secrets import scrub, secret_values
from ..records.outcome import NodeOutcome, NodeState
from ..records.rundir import RunDir
from .agentlink import AgentHandle
from .channel import KeeperFollower, NodeChannel

BUNDLE_NAME = layout.BUNDLE  # in each node's run directory
_RANK_LINE = re.compile(rb"^\[rank(\d+)\]:", re.MULTILINE)  # torchrun's prefix
# Exit code ProcessHandle.poll gives when the connection died without a status.
LOST = 255


class NodePhase(enum.IntEnum):
    """How far a node's run has come: forward only (``NEXT``), skipping allowed.
    A kept run's new attempt goes back to SET_UP. An ended node keeps the
    phase it reached, which the gang rule reads."""

    NEW = 0         # nothing asked of the node yet (the gang may never start it)
    SUPERVISED = 1  # its supervisor runs: its ``setup:``, if any, then torchrun
    SET_UP = 2      # past its ``setup:`` (it succeeded); torchrun waits for GO
    GO = 3          # told to go: every node's setup succeeded (the controller's barrier)
    JOINED = 4      # torchrun reached the rendezvous store on node 0
    STARTED = 5     # torchrun spawned its workers: the rendezvous completed


NEXT: dict[NodePhase, frozenset[NodePhase]] = {
    NodePhase.NEW: frozenset({NodePhase.SUPERVISED}),
    NodePhase.SUPERVISED: frozenset({NodePhase.SET_UP, NodePhase.JOINED, NodePhase.STARTED}),
    # a kept run's gang holds its own barrier: no GO from us before torchrun
    NodePhase.SET_UP: frozenset({NodePhase.GO, NodePhase.JOINED, NodePhase.STARTED}),
    NodePhase.GO: frozenset({NodePhase.JOINED, NodePhase.STARTED}),
    NodePhase.JOINED: frozenset({NodePhase.STARTED}),
    NodePhase.STARTED: frozenset(),
}
# A kept run's next attempt: torchrun again, after the setup it already did.
ATTEMPT_FROM = frozenset({NodePhase.SET_UP, NodePhase.JOINED, NodePhase.STARTED})


class Ask(enum.IntEnum):
    """What the controller asked of a node's run, the strongest so far."""

    NOTHING = 0
    STOP = 1
    KILL = 2


def supervisor_spec(launch: NodeLaunch, run_id: str, master_port: int,
                    grace_s: float, owner: Owner = Owner()) -> SupervisorSpec:
    """What the node supervisor runs: the dry-run's env and argv, verbatim."""
    node = launch.node
    return SupervisorSpec(
        run_id=run_id, node_rank=node.node_rank, run_dir=node.run_dir,
        cwd=node.code_root,  # torchrun's and so every worker's working directory
        first_rank=node.first_rank, nproc=node.nproc, master_port=master_port,
        argv=tuple(launch.argv), env=dict(launch.env), unset_env=tuple(launch.unset_env),
        bundle=BUNDLE_NAME, grace_s=grace_s, heartbeat_s=HEARTBEAT_S,
        secrets=tuple(value.decode() for value in secret_values(launch.env)),
        setup={"commands": [list(argv) for argv in launch.setup], "cwd": node.code_root,
               "timeout_s": launch.setup_timeout_s, "path_first": setup_path_first(node.python),
               **({"when_changed": {"paths": list(launch.setup_when_changed),
                                    "env": [k for k in node.user_env if k in launch.env]}}
                  if launch.setup_when_changed else {})}
        if launch.setup else None,
        owner=owner)


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
        self.control: dict | None = None
        self.last_heard = time.monotonic()  # the node's last bytes (a heartbeat at least)
        self.secrets = secret_values(launch.env)
        self.secret_strings = [value.decode() for value in self.secrets]
        # Facts about the node, which the gang finds out (not phases):
        self.partitioned = False  # silent for PEER_TIMEOUT_S: given up on
        # Cut off by the teardown: it answered neither the stop nor the kill
        # (a frozen host, a dead path), so a fresh connection would only wait
        # out its timeout on the same way (``unreachable``).
        self.cut_off = False
        self.timed_out = False  # not started within the start timeout
        self.ended_at: float | None = None
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
        self.hung_reason = ""  # a fact: set by the hang watchdog on the odd rank's node
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
        if code is not None and self.ended_at is None:
            self.ended_at = time.time()
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
            self.cut_off = True
            self.channel.abort()

    @property
    def unreachable(self) -> bool:
        """Given up on or cut off: nothing more is asked of the node after the run."""
        return self.partitioned or self.cut_off

    def give_up(self) -> None:
        """Silent past the peer timeout: it cannot hear a stop. Its end is
        dated when last heard, before any failure it caused elsewhere."""
        if self.poll() is None:
            self.partitioned = True
            self.ended_at = time.time() - self.heard_s
            self.abort()

    def finish(self, timeout: float = 5.0) -> NodeOutcome:
        """Drain the relay and describe how the node ended."""
        if self._relay is not None:
            self._relay.join(timeout)
        code = self.poll()
        control = self.control or {}
        failures = tuple(control.get("failures", ()))
        if not self.supervising:
            state, reason = NodeState.NOT_STARTED, "never started"
        elif self.hung_reason:
            state, reason = NodeState.FAILED, self.hung_reason
        elif self.partitioned:
            state, reason = NodeState.LOST, (
                f"nothing from the node for {PEER_TIMEOUT_S:g}s (a silent partition or a frozen "
                f"node); its agent tears the run down after {PEER_TIMEOUT_S:g}s without us")
        elif code is None:
            state, reason = NodeState.LOST, "still running when the controller gave up on it"
        elif code == 0:
            state, reason = NodeState.SUCCEEDED, "exited 0"
        elif self.timed_out:
            state, reason = NodeState.FAILED, "did not join the rendezvous before the start timeout"
        elif self.cut_off and not control:
            state, reason = NodeState.LOST, (
                "answered neither the stop nor the kill, so it was cut off (a frozen host, or "
                "a dead path); its agent tears the run down there once it no longer hears us")
        elif not control and code == LOST:
            state, reason = NodeState.LOST, "connection lost without an exit status"
        elif not control:  # the agent itself died (SIGKILL, OOM killer) before reporting
            how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
            state, reason = NodeState.LOST, (f"the node agent ended without reporting ({how}); "
                                             "its guardian tears the run down there")
        else:
            return exit_outcome(self.node, control, self.stop_sent, self.ended_at)
        if control.get("survivors"):
            reason += "; " + describe_survivors(control["survivors"])
        return NodeOutcome(self.node.node_rank, self.node.host, state, code, reason,
                           self.ended_at, failures)


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


def exit_outcome(node: NodePlan, control: dict, stop_sent: bool,
                 ended_at: float | None) -> NodeOutcome:
    """How a node ended, from its exit event: succeeded, stopped (asked to,
    and not failed before that), or failed with the first failure."""
    code = int(control.get("code", 1))
    failures = tuple(control.get("failures", ()))
    if code == 0:
        state, reason = NodeState.SUCCEEDED, "exited 0"
    elif (stop_sent or _signalled(control)) and not _failed_on_its_own(control):
        state, reason = NodeState.STOPPED, control.get("reason", "stopped by the controller")
    else:
        state, reason = NodeState.FAILED, _failure_reason(
            code, failures, node.first_rank, control.get("last_lines") or [])
    if control.get("survivors"):
        reason += "; " + describe_survivors(control["survivors"])
    return NodeOutcome(node.node_rank, node.host, state, code, reason, ended_at, failures)


def describe_survivors(survivors: list[dict]) -> str:
    """``2 process(es) survived the teardown: pid 12 (python x.py), ...``"""
    shown = ", ".join(f"pid {s['pid']} ({s['cmd'][:80]})" for s in survivors[:5])
    more = f" and {len(survivors) - 5} more" if len(survivors) > 5 else ""
    return f"{len(survivors)} process(es) survived the teardown: {shown}{more}"


def _signalled(control: dict) -> bool:
    """The supervisor was stopped by a signal: the scheduler's or an operator's."""
    return control.get("ended") == Ended.SIGNAL


def _failed_on_its_own(control: dict) -> bool:
    """Did the node fail before anyone asked it to stop? A whole-second time
    ``t`` means "during [t, t + 1)", so only a second wholly before counts."""
    if control.get("ended") == Ended.ITSELF:
        return True
    stopped_at = control.get("stopped_at")
    if stopped_at is None:
        return False
    return any(f["timestamp"] + (1 if float(f["timestamp"]).is_integer() else 0) <= stopped_at
               for f in control.get("failures", ()))


def _failure_reason(code: int, failures: tuple[dict, ...], first_rank: int,
                    last_lines: list[str]) -> str:
    """``torchrun exited 1; rank 2 (local rank 1) failed: ...``, or with no
    worker failure on record, torchrun's own last line."""
    if not failures and last_lines and last_lines[-1].startswith(AGENT_SAYS):
        return last_lines[-1][len(AGENT_SAYS):].strip()[-500:]  # torchrun never ran
    if not failures:
        return f"torchrun exited {code}" + (f": {last_lines[-1].strip()[-300:]}" if last_lines else "")
    first = failures[0]
    rank = first_rank + first["local_rank"]
    message = first["message"].strip().splitlines()
    same = sorted(first_rank + f["local_rank"] for f in failures[1:]
                  if f["message"] == first["message"])
    also = f"; the same on rank{'s' if len(same) > 1 else ''} {', '.join(map(str, same))}" \
        if same else ""
    return (f"torchrun exited {code}; rank {rank} (local rank {first['local_rank']}) failed: "
            f"{message[-1] if message else '?'}{also}")


def _keep(seen: dict, rank: int, value: object) -> None:
    """``seen[rank] = value``, or no entry for None (the rank said none)."""
    if value is None:
        seen.pop(rank, None)
    else:
        seen[rank] = value
