"""When a gang must stop, and why: the one stop rule of every gang.

The controller (an attached run) and node 0's keeper (a kept run) both
snapshot their nodes (``NodeView``) and ask ``judge``. In order:

1. **peer loss**: a running node that cannot be heard (where liveness is
   ours to watch: not under Slurm);
2. **first failure stops all**: a node whose torchrun exited non-zero;
3. **the hang rule**: once every node has started, no rank's progress (a
   step or a line) for ``hang_timeout_s``, among nodes still running (one
   that exited 0 while rank 0 checkpoints is not hung);
4. **the start timeout**: the rendezvous not complete ``start_timeout_s``
   after every node's ``setup:`` is done.

Pure: callers pass ``now`` (one monotonic clock) and keep the ``Clock``
that ``tick`` returns.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Sequence

from .stackgroups import hang_summary, odd_of


class Stop(enum.Enum):
    LOST = "lost"
    FAILED = "failed"
    HANG = "hang"
    START_TIMEOUT = "start timeout"


@dataclass(frozen=True)
class NodeView:
    """One node as its follower sees it now: ``heard_s`` is seconds since it
    was last heard (None where its liveness is not ours to watch); ``lost``
    why it cannot be heard; ``progress``: (rank, time) on the caller's clock."""

    node_rank: int
    label: str
    code: int | None = None
    joined: bool = False
    started: bool = False
    setup_done: bool = True
    heard_s: float | None = None
    lost: str = ""
    progress: tuple[tuple[int, float], ...] = ()

    @property
    def running(self) -> bool:
        return self.code is None


@dataclass(frozen=True)
class Timeouts:
    start_s: float
    peer_s: float | None = None  # None: liveness is someone else's (Slurm's)
    hang_s: float | None = None  # None: no hang rule
    attempt: int | None = None  # a kept run's attempt: the keepers' words for a start timeout


@dataclass(frozen=True)
class Clock:
    """What the rule remembers between snapshots."""

    start_from: float
    all_started_at: float | None = None


@dataclass(frozen=True)
class Verdict:
    """Stop the gang: ``why`` in the user's words; ``nodes`` to blame (for a
    hang, narrowed by ``hang_words`` once the stacks are in)."""

    stop: Stop
    why: str
    nodes: tuple[int, ...]
    idle_s: float = 0.0
    quiet_first: int | None = None


def tick(clock: Clock, nodes: Sequence[NodeView], now: float) -> Clock:
    """The clock after this snapshot: the start timeout restarts while a
    ``setup:`` runs; the hang rule counts from when every node had started."""
    if not all(n.setup_done for n in nodes):
        clock = replace(clock, start_from=now)
    if clock.all_started_at is None and nodes and all(n.started for n in nodes):
        clock = replace(clock, all_started_at=now)
    return clock


def stop_reason(why: str) -> str:
    """A node's reason for its end when its gang stopped for ``why``
    (``stopped: node 1 (b) failed (exit 1)``); one naming its stopper stays."""
    return why if why.startswith("stopped") else f"stopped: {why}"


def judge(nodes: Sequence[NodeView], timeouts: Timeouts, clock: Clock,
          now: float) -> Verdict | None:
    """Whether the gang must stop now, and why; None while it may go on."""
    if not nodes or all(not n.running for n in nodes):
        return None
    return (_lost(nodes, timeouts) or _failed(nodes) or _hung(nodes, timeouts, clock, now)
            or _start_overdue(nodes, timeouts, clock, now))


def _lost(nodes: Sequence[NodeView], timeouts: Timeouts) -> Verdict | None:
    gone = [n for n in nodes if n.running and n.lost]
    if gone:
        first = gone[0]
        return Verdict(Stop.LOST, f"lost {first.label} ({first.lost})", (first.node_rank,))
    if timeouts.peer_s is None:
        return None
    silent = [n for n in nodes if n.running and n.heard_s is not None
              and n.heard_s > timeouts.peer_s]
    if not silent:
        return None
    return Verdict(Stop.LOST, ", ".join(n.label for n in silent)
                   + f" silent for {timeouts.peer_s:g}s", tuple(n.node_rank for n in silent))


def _failed(nodes: Sequence[NodeView]) -> Verdict | None:
    failed = [n for n in nodes if n.code not in (None, 0)]
    if not failed:
        return None
    first = failed[0]
    return Verdict(Stop.FAILED, f"{first.label} failed (exit {first.code})", (first.node_rank,))


def _hung(nodes: Sequence[NodeView], timeouts: Timeouts, clock: Clock,
          now: float) -> Verdict | None:
    if timeouts.hang_s is None or clock.all_started_at is None:
        return None
    running = [n for n in nodes if n.running]
    seen = {rank: at for n in running for rank, at in n.progress}
    idle = now - max([clock.all_started_at, *seen.values()])
    if idle <= timeouts.hang_s:
        return None
    quiet_first = min(seen, key=seen.get) if seen else None
    return Verdict(Stop.HANG, hang_summary(None, idle, quiet_first),
                   tuple(n.node_rank for n in running), idle, quiet_first)


def _start_overdue(nodes: Sequence[NodeView], timeouts: Timeouts, clock: Clock,
                   now: float) -> Verdict | None:
    if now <= clock.start_from + timeouts.start_s or all(n.started for n in nodes):
        return None
    missing = [n for n in nodes if not n.joined] or [n for n in nodes if not n.started]
    if timeouts.attempt is not None:  # the keepers' words: one attempt of a kept run
        why = (f"attempt {timeouts.attempt} did not start within {timeouts.start_s:g}s on "
               f"{missing[0].label} (a node of the gang is missing)")
    else:
        why = (f"the rendezvous did not complete within {timeouts.start_s:g}s; "
               f"not joined: {', '.join(n.label for n in missing)}")
    return Verdict(Stop.START_TIMEOUT, why, tuple(n.node_rank for n in missing))


def hang_words(verdict: Verdict, places: dict[int, str] | None,
               ranks_of: dict[int, Sequence[int]]) -> tuple[str, tuple[int, ...]]:
    """A hang's root cause from the ranks' stacks (``places``), and the nodes
    to blame: the odd ranks', else the first quiet rank's, else all running."""
    why = hang_summary(places, verdict.idle_s, verdict.quiet_first)
    odd = set(odd_of(places)) if places else set()
    if not odd and verdict.quiet_first is not None:
        odd = {verdict.quiet_first}
    blamed = tuple(k for k in verdict.nodes if odd & set(ranks_of.get(k, ())))
    return why, blamed or verdict.nodes
