"""``ddp-orch stacks``: every rank's stack, grouped, with the odd ones marked.

Ranks whose main threads stand at the same place form a group. Any group
but the largest is marked odd: in a hang, usually the rank that stopped
calling collectives.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from ..agent.stackgroups import Frame, group_places, odd_of, place, rank_span
from ..agent.stackgroups import hang_summary as _hang_summary
from ..agent.stackgroups import main_thread as _main_thread
from ..records.store import NodeRecord


STACKS_TIMEOUT_S = 5.0  # how long a node's agent waits for its ranks' dumps
MAX_STACK_BYTES = 1 << 20  # one rank's dump, as the agent caps it too


@dataclass(frozen=True)
class RankStack:
    """One rank's stack dump: ``how`` is py-spy or faulthandler; ``error``
    says why ``text`` is empty, or what it lacks."""

    rank: int
    node_rank: int
    host: str
    how: str
    text: str
    error: str = ""


@dataclass(frozen=True)
class StacksResult:
    ranks: tuple[RankStack, ...]
    unreachable: tuple[tuple[int, str, str], ...] = ()  # (node rank, host, why)


def rank_stacks(reported: object, nodes: Sequence[NodeRecord]) -> list[RankStack]:
    """The agent's per-rank dumps, checked and capped, each with its host."""
    out = []
    for r in reported if isinstance(reported, list) else ():
        if not (isinstance(r, dict) and isinstance(r.get("rank"), int)
                and isinstance(r.get("node_rank"), int) and 0 <= r["node_rank"] < len(nodes)):
            continue
        out.append(RankStack(r["rank"], r["node_rank"], nodes[r["node_rank"]].host,
                             str(r.get("how")), str(r.get("text") or "")[:MAX_STACK_BYTES],
                             str(r.get("error") or "")))
    return out


def main_thread(stack: RankStack) -> list[Frame]:
    """The frames of the main thread, innermost first."""
    return _main_thread(stack.how, stack.text)


def groups(result: StacksResult) -> list[tuple[str, list[RankStack]]]:
    """(where, ranks) by group, the largest first (ties: the lowest rank)."""
    by_rank = {s.rank: s for s in result.ranks}
    return [(where, [by_rank[r] for r in ranks])
            for where, ranks in group_places(_places(result))]


def odd_ranks(result: StacksResult) -> list[RankStack]:
    """The ranks outside the largest group; none when the largest groups tie."""
    by_rank = {s.rank: s for s in result.ranks}
    return [by_rank[r] for r in odd_of(_places(result))]


def _places(result: StacksResult) -> dict[int, str]:
    return {s.rank: place(s.how, s.text, s.error) for s in result.ranks}


def render_stacks(result: StacksResult, run_id: str, saved_in: str = "") -> str:
    found = groups(result)
    hows = sorted({s.how for s in result.ranks})
    lines = [f"stacks of run {run_id}: {len(result.ranks)} rank(s), "
             f"{len({s.node_rank for s in result.ranks})} node(s), by {', '.join(hows) or '-'}"
             + (f"; kept in {saved_in}" if saved_in else "")]
    odd = {s.rank for s in odd_ranks(result)}
    for place, members in found:
        hosts = ", ".join(dict.fromkeys(s.host for s in members))
        mark = "! " if members[0].rank in odd else "  "
        lines.append(f"{mark}{rank_span([s.rank for s in members])} ({hosts}): {place}")
        frames = main_thread(members[0])
        for frame in reversed(frames):  # outermost first, as a traceback reads
            if frame.own or frame is frames[0]:
                lines.append(f"      {frame}")
    lines += [f"  rank {s.rank} ({s.host}): {s.error}" for s in result.ranks
              if s.text and s.error]
    for node_rank, host, why in result.unreachable:
        lines.append(f"  node {node_rank} ({host}): no stacks: {why}")
    if not result.ranks and not result.unreachable:
        lines.append("  no rank of this run is running")
    elif odd:
        lines.append("(! marks ranks that are not where most ranks are)")
    return "\n".join(lines) + "\n"


def hang_summary(result: StacksResult | None, idle_s: float,
                 quiet_first: int | None = None) -> str:
    """The root cause of a hang (``agent/stackgroups.hang_summary``)."""
    return _hang_summary(_places(result) if result is not None else None, idle_s, quiet_first)


def save_stacks(run_path: str, result: StacksResult, run_id: str) -> tuple[str, str]:
    """Write each dump and the summary under the run's ``stacks/<time>/``."""
    import time

    saved = os.path.join(run_path, "stacks", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(saved, mode=0o700, exist_ok=True)
    for stack in result.ranks:
        with open(os.path.join(saved, f"rank-{stack.rank}.txt"), "w", encoding="utf-8") as fh:
            fh.write(stack.text or f"(no dump: {stack.error})\n")
    text = render_stacks(result, run_id, saved)
    with open(os.path.join(saved, "summary.txt"), "w", encoding="utf-8") as fh:
        fh.write(text)
    return saved, text
