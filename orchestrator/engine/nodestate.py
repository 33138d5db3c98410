"""One node's state and its outcome, for every backend and owner.

A node is how far its run came (``NodePhase``), what the controller asked
of it (``Ask``) and what is known of its end (``NodeFacts``).
``node_outcome`` is the one function that turns those into a
``NodeOutcome``: a live handle's, a kept run's attempt as node 0 recorded
it, a scheduler job's node, a run that never started. The end's words are
rendered from its ``EndReason`` here and parsed nowhere.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Protocol

from ..agent.wire.protocol import PEER_TIMEOUT_S, Ended
from ..console import AGENT_SAYS
from ..records.outcome import EndReason, NodeOutcome, NodeState, WorkerFailure

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


# What the controller may find out about a node on its own, strongest
# first: a later finding replaces an earlier one only if it is stronger (a
# hung node later given up on stays hung; a silent one later cut off stays
# silent).
FINDINGS = (EndReason.HUNG, EndReason.SILENT, EndReason.START_TIMEOUT, EndReason.PAUSED,
            EndReason.CUT_OFF)
# Findings that decide the end whatever the node said, or where it said nothing.
DECISIVE = frozenset(EndReason) - {EndReason.START_TIMEOUT, EndReason.PAUSED,
                                   EndReason.CUT_OFF}

# Each reason's node state; RUNNING's depends on the phase (``node_outcome``).
STATE_OF: Mapping[EndReason, NodeState] = {
    EndReason.EXITED: NodeState.SUCCEEDED,
    EndReason.FAILED: NodeState.FAILED,
    EndReason.STOPPED: NodeState.STOPPED,
    EndReason.HUNG: NodeState.FAILED,
    EndReason.START_TIMEOUT: NodeState.FAILED,
    EndReason.NO_ANSWER: NodeState.FAILED,
    EndReason.NOT_RUN: NodeState.FAILED,
    EndReason.SILENT: NodeState.LOST,
    EndReason.PAUSED: NodeState.LOST,
    EndReason.CUT_OFF: NodeState.LOST,
    EndReason.CONNECTION_LOST: NodeState.LOST,
    EndReason.AGENT_DIED: NodeState.LOST,
    EndReason.GIVEN_UP: NodeState.LOST,
    EndReason.KEEPER_UNHEARD: NodeState.LOST,
    EndReason.KEEPER_GONE: NodeState.LOST,
    EndReason.FOLLOWER_LOST: NodeState.LOST,
    EndReason.SCHEDULER_ENDED: NodeState.LOST,
    EndReason.SCHEDULER_STOPPED: NodeState.STOPPED,
    EndReason.NEVER_STARTED: NodeState.NOT_STARTED,
    EndReason.RUNNING: NodeState.STOPPED,
}
# The words of a reason that carries none of its own.
WORDS: Mapping[EndReason, str] = {
    EndReason.EXITED: "exited 0",
    EndReason.STOPPED: "stopped by the controller",
    EndReason.START_TIMEOUT: "did not join the rendezvous before the start timeout",
    EndReason.SILENT: (
        f"nothing from the node for {PEER_TIMEOUT_S:g}s (a silent partition or a frozen "
        f"node); its agent tears the run down after {PEER_TIMEOUT_S:g}s without us"),
    EndReason.CUT_OFF: (
        "answered neither the stop nor the kill, so it was cut off (a frozen host, or "
        "a dead path); its agent tears the run down there once it no longer hears us"),
    EndReason.CONNECTION_LOST: "connection lost without an exit status",
    EndReason.GIVEN_UP: "still running when the controller gave up on it",
    EndReason.NEVER_STARTED: "never started",
    EndReason.KEEPER_GONE: "its keeper is gone without finishing (killed?)",
    EndReason.FOLLOWER_LOST: (
        "lost contact with the node's follower (a dropped connection or a silent "
        "partition); its keeper stops on its own"),
}


@dataclass
class NodeFacts:
    """What is known of a node's end besides its phase: what it said (its
    exit event, or its command's status where it said nothing) and what
    the controller found out on its own (``find``)."""

    event: Mapping | None = None  # its exit event (a kept run's: its last attempt's)
    code: int | None = None  # its command's status where no event says (LOST: none came)
    ended_at: float | None = None  # time.time() when it ended, as best known
    found: EndReason | None = None  # the strongest finding (``FINDINGS``) or a decisive one
    words: str = ""  # that finding's own words, where they say more than ``WORDS``

    def find(self, reason: EndReason, words: str = "") -> None:
        """Record a finding, unless a stronger one is already on record."""
        if self.found in FINDINGS and reason in FINDINGS \
                and FINDINGS.index(reason) >= FINDINGS.index(self.found):
            return
        self.found, self.words = reason, words


class Place(Protocol):
    """What an outcome reads of a node's plan (a ``NodePlan`` has it)."""

    node_rank: int
    host: str
    first_rank: int


class NodePlace(NamedTuple):
    """A ``Place`` where no plan is at hand (a record's node)."""

    node_rank: int
    host: str
    first_rank: int = 0


def node_outcome(node: Place, facts: NodeFacts, phase: NodePhase = NodePhase.SUPERVISED,
                 asked: Ask = Ask.NOTHING) -> NodeOutcome:
    """How a node ended, from its state: the one place an outcome is made."""
    event = facts.event
    code = _code(event) if event is not None else facts.code
    failures = tuple(WorkerFailure.from_dict(f) for f in (event or {}).get("failures", ()))
    why, words = _reason(facts, event, failures, code, phase, asked)
    state = STATE_OF[why]
    if why is EndReason.RUNNING and phase is NodePhase.NEW:
        state = NodeState.NOT_STARTED
    if not words and why in (EndReason.FAILED, EndReason.STOPPED) and event is not None:
        words = _event_words(why, code, event, failures, node.first_rank)
    reason = words or WORDS[why]
    survivors = (event or {}).get("survivors")
    if survivors:
        reason += "; " + describe_survivors(survivors)
    return NodeOutcome(node.node_rank, node.host, state, code, reason, facts.ended_at,
                       failures, why=why)


def _reason(facts: NodeFacts, event: Mapping | None, failures: tuple[WorkerFailure, ...],
            code: int | None, phase: NodePhase, asked: Ask) -> tuple[EndReason, str]:
    """The end's reason, and its own words where they are not ``WORDS``'."""
    found = facts.found
    if found in DECISIVE:
        return found, facts.words
    if phase is NodePhase.NEW:
        return EndReason.NEVER_STARTED, ""
    if found is EndReason.PAUSED and (
            event.get("ended") == Ended.CONTROLLER_LOST if event is not None else code != 0):
        return found, facts.words  # it stopped because we were paused, not on its own
    if code is None:
        return EndReason.GIVEN_UP, ""
    if code == 0:
        return EndReason.EXITED, ""
    if found is EndReason.START_TIMEOUT:
        return found, facts.words
    if event is None:
        if found is EndReason.CUT_OFF:
            return found, ""
        if code == LOST:
            return EndReason.CONNECTION_LOST, ""
        how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
        return EndReason.AGENT_DIED, (f"the node agent ended without reporting ({how}); "
                                      "its guardian tears the run down there")
    if (asked >= Ask.STOP or event.get("ended") == Ended.SIGNAL) \
            and not _failed_on_its_own(event, failures):
        return EndReason.STOPPED, ""
    return EndReason.FAILED, ""


def _code(event: Mapping) -> int:
    return int(event.get("code", 1))


def _event_words(why: EndReason, code: int | None, event: Mapping,
                 failures: tuple[WorkerFailure, ...], first_rank: int) -> str:
    """A stop's words as the node gave them; a failure's from its first failed rank."""
    if why is EndReason.STOPPED:
        return str(event.get("reason") or WORDS[why])
    return _failure_reason(code, failures, first_rank, event.get("last_lines") or [])


def describe_survivors(survivors: list[dict]) -> str:
    """``2 process(es) survived the teardown: pid 12 (python x.py), ...``"""
    shown = ", ".join(f"pid {s['pid']} ({s['cmd'][:80]})" for s in survivors[:5])
    more = f" and {len(survivors) - 5} more" if len(survivors) > 5 else ""
    return f"{len(survivors)} process(es) survived the teardown: {shown}{more}"


def _failed_on_its_own(event: Mapping, failures: tuple[WorkerFailure, ...]) -> bool:
    """Did the node fail before anyone asked it to stop? A whole-second time
    ``t`` means "during [t, t + 1)", so only a second wholly before counts."""
    if event.get("ended") == Ended.ITSELF:
        return True
    stopped_at = event.get("stopped_at")
    if stopped_at is None:
        return False
    return any(f.timestamp + (1 if f.timestamp.is_integer() else 0) <= stopped_at
               for f in failures)


def _failure_reason(code: int | None, failures: tuple[WorkerFailure, ...], first_rank: int,
                    last_lines: list[str]) -> str:
    """``torchrun exited 1; rank 2 (local rank 1) failed: ...``, or with no
    worker failure on record, torchrun's own last line."""
    if not failures and last_lines and last_lines[-1].startswith(AGENT_SAYS):
        return last_lines[-1][len(AGENT_SAYS):].strip()[-500:]  # torchrun never ran
    if not failures:
        return f"torchrun exited {code}" + (f": {last_lines[-1].strip()[-300:]}" if last_lines else "")
    first = failures[0]
    rank = first_rank + first.local_rank
    message = first.message.strip().splitlines()
    same = sorted(first_rank + f.local_rank for f in failures[1:] if f.message == first.message)
    also = f"; the same on rank{'s' if len(same) > 1 else ''} {', '.join(map(str, same))}" \
        if same else ""
    return (f"torchrun exited {code}; rank {rank} (local rank {first.local_rank}) failed: "
            f"{message[-1] if message else '?'}{also}")
