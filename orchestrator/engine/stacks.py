"""``ddp-orch stacks``: every rank's stack, grouped, with the odd ones marked.

A rank's dump (faulthandler's or py-spy's text) is reduced to its main
thread's frames. Ranks whose main threads stand at the same place (the
innermost frame and the innermost frame of the user's own code) form a
group; the largest group is what most ranks are doing, and every other
group is marked as the odd one out, which in a hang is usually the rank
that stopped calling collectives::

    ranks 0-1 (lab0, lab1): all_reduce <- train.py:42
  ! rank 2 (lab1): sleep <- train.py:17
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Sequence

from ..records.store import NodeRecord


STACKS_TIMEOUT_S = 5.0  # how long a node's agent waits for its ranks' dumps
MAX_STACK_BYTES = 1 << 20  # one rank's dump, as the agent caps it too


@dataclass(frozen=True)
class RankStack:
    """One rank's stack dump (``ddp-orch stacks``): ``how`` is py-spy or
    faulthandler; ``error`` says why ``text`` is empty."""

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
    """The agent's per-rank dumps (``agent/node/stacks.py``) as ``RankStack``s:
    checked, with each text capped, and each rank's host from the records."""
    out = []
    for r in reported if isinstance(reported, list) else ():
        if not (isinstance(r, dict) and isinstance(r.get("rank"), int)
                and isinstance(r.get("node_rank"), int) and 0 <= r["node_rank"] < len(nodes)):
            continue
        out.append(RankStack(r["rank"], r["node_rank"], nodes[r["node_rank"]].host,
                             str(r.get("how")), str(r.get("text") or "")[:MAX_STACK_BYTES],
                             str(r.get("error") or "")))
    return out


# faulthandler: `  File "/x/train.py", line 42 in main`
_FAULTHANDLER_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (.+)$')
# py-spy: `    all_reduce (torch/distributed/distributed_c10d.py:2050)`
_PY_SPY_FRAME = re.compile(r"^\s+(\S.*?) \((.+):(\d+)\)$")
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3|^<frozen |ddp_orch_shim\.py$")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    @property
    def own(self) -> bool:
        """The user's code: not an installed package, the stdlib or the shim.
        py-spy shows installed code by package-relative paths
        (``torch/distributed/...``), the user's by full path or bare name."""
        if _LIBRARY.search(self.file):
            return False
        return self.file.startswith("/") or "/" not in self.file

    def __str__(self) -> str:
        return f"{self.function} ({os.path.basename(self.file)}:{self.line})"


def main_thread(stack: RankStack) -> list[Frame]:
    """The frames of the main thread, innermost first."""
    blocks, current = [], None
    for line in stack.text.splitlines():
        if stack.how == "py-spy":
            if line.startswith("Thread "):
                current = (line, [])
                blocks.append(current)
            elif current and (m := _PY_SPY_FRAME.match(line)):
                current[1].append(Frame(m.group(1), m.group(2), int(m.group(3))))
        else:
            if "hread 0x" in line:  # "Current thread 0x..." / "Thread 0x..."
                current = (line, [])
                blocks.append(current)
            elif current and (m := _FAULTHANDLER_FRAME.match(line)):
                current[1].append(Frame(m.group(3), m.group(1), int(m.group(2))))
    if not blocks:
        return []
    # The signal handler runs on the main thread ("Current thread"); py-spy names it.
    main = next((b for b in blocks if b[0].startswith("Current thread") or "MainThread" in b[0]),
                blocks[0])
    return main[1]


def where(frames: list[Frame]) -> str:
    """``all_reduce <- train.py:42``: the innermost call, and the user's line."""
    if not frames:
        return "(no stack)"
    own = next((f for f in frames if f.own), None)
    top = frames[0].function
    if own is None or own is frames[0]:
        return f"{top} ({os.path.basename(frames[0].file)}:{frames[0].line})"
    return f"{top} <- {os.path.basename(own.file)}:{own.line}"


def groups(result: StacksResult) -> list[tuple[str, list[RankStack]]]:
    """(where, ranks) by group, the largest first (ties: the lowest rank)."""
    by_place: dict[str, list[RankStack]] = {}
    for stack in result.ranks:
        place = where(main_thread(stack)) if stack.text else f"(no dump: {stack.error})"
        by_place.setdefault(place, []).append(stack)
    return sorted(by_place.items(), key=lambda item: (-len(item[1]), item[1][0].rank))


def odd_ranks(result: StacksResult) -> list[RankStack]:
    """The ranks outside the largest group; none when all agree, and none when
    the largest groups tie (two ranks in two places: no majority to differ from)."""
    found = groups(result)
    if len(found) < 2 or len(found[0][1]) == len(found[1][1]):
        return []
    return [s for _place, members in found[1:] for s in members]


def rank_span(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2, 5"; [3] -> "rank 3"."""
    ranks = sorted(ranks)
    parts, start = [], None
    for i, rank in enumerate(ranks):
        if start is None:
            start = rank
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            parts.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return ("ranks " if len(ranks) > 1 else "rank ") + ", ".join(parts)


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
    for node_rank, host, why in result.unreachable:
        lines.append(f"  node {node_rank} ({host}): no stacks: {why}")
    if not result.ranks and not result.unreachable:
        lines.append("  no rank of this run is running")
    elif odd:
        lines.append("(! marks ranks that are not where most ranks are)")
    return "\n".join(lines) + "\n"


def hang_summary(result: StacksResult | None, idle_s: float,
                 quiet_first: int | None = None) -> str:
    """The root cause of a hang: ``hang: no progress for 20s; ranks 0-1 wait in
    all_reduce <- train.py:42; rank 2 is elsewhere: sleep <- train.py:17``.
    Without an odd group, the rank that went quiet first is named."""
    head = f"hang: no progress for {idle_s:.0f}s"
    found = groups(result) if result is not None and result.ranks else []
    if not found:
        tail = f"; rank {quiet_first} went quiet first" if quiet_first is not None else ""
        return head + tail + "; no stacks could be dumped"
    place, members = found[0]
    tie = len(found) > 1 and len(found[1][1]) == len(members)
    verb = "wait in" if len(members) > 1 else "waits in"
    parts = [f"{rank_span([s.rank for s in members])} {verb} {place}"]
    for other, odd in found[1:]:
        if tie:
            verb = "wait in" if len(odd) > 1 else "waits in"
            parts.append(f"{rank_span([s.rank for s in odd])} {verb} {other}")
        else:
            verb = "are" if len(odd) > 1 else "is"
            parts.append(f"{rank_span([s.rank for s in odd])} {verb} elsewhere: {other}")
    if (len(found) == 1 or tie) and quiet_first is not None:
        parts.append(f"rank {quiet_first} went quiet first")
    return head + "; " + "; ".join(parts)


def keep(run_path: str, result: StacksResult, run_id: str) -> tuple[str, str]:
    """Write each rank's dump and the summary under ``stacks/<time>/`` of the
    run directory; returns that directory and the summary (which names it)."""
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
