"""Where each rank's stack stands, grouped, and the odd ranks named.

Pure, because the controller and a kept run's head keeper (a hang with no
controller there) both read stacks. Ranks whose main threads stand at the
same place (the innermost frame, and the innermost of the user's code) form
a group; the largest is what most ranks do, and the others are odd.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

# faulthandler: `  File "/x/train.py", line 42 in main`, under a header:
# `Stack (most recent call first):` for one thread, `Current thread 0x...` and
# `Thread 0x...` where it lists them all.
_FAULTHANDLER_HEADER = re.compile(r"^(Stack|Current thread 0x|Thread 0x)")
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
        """The user's code: not an installed package, the stdlib or the shim."""
        if _LIBRARY.search(self.file):
            return False
        return self.file.startswith("/") or "/" not in self.file

    def __str__(self) -> str:
        return f"{self.function} ({os.path.basename(self.file)}:{self.line})"


def main_thread(how: str, text: str) -> list[Frame]:
    """The frames of the main thread of one dump, innermost first."""
    blocks, current = [], None
    for line in text.splitlines():
        if how == "py-spy":
            if line.startswith("Thread "):
                current = (line, [])
                blocks.append(current)
            elif current and (m := _PY_SPY_FRAME.match(line)):
                current[1].append(Frame(m.group(1), m.group(2), int(m.group(3))))
        else:
            if _FAULTHANDLER_HEADER.match(line):
                current = (line, [])
                blocks.append(current)
            elif current and (m := _FAULTHANDLER_FRAME.match(line)):
                current[1].append(Frame(m.group(3), m.group(1), int(m.group(2))))
    if not blocks:
        return []
    if how == "py-spy":  # py-spy names it
        return next((b for b in blocks if "MainThread" in b[0]), blocks[0])[1]
    # The shim's dump is the main thread alone; where faulthandler lists every
    # thread it lists them newest first, so the main thread is the last one
    # ("Current thread" is whichever thread a signal landed on).
    return blocks[-1][1]


def where(frames: list[Frame]) -> str:
    """``all_reduce <- train.py:42``: the innermost call, and the user's line."""
    if not frames:
        return "(no stack)"
    own = next((f for f in frames if f.own), None)
    top = frames[0].function
    if own is None or own is frames[0]:
        return f"{top} ({os.path.basename(frames[0].file)}:{frames[0].line})"
    return f"{top} <- {os.path.basename(own.file)}:{own.line}"


def place(how: str, text: str, error: str = "") -> str:
    """Where one rank stands, from its dump (or why there is none)."""
    return where(main_thread(how, text)) if text else f"(no dump: {error})"


def group_places(places: Mapping[int, str]) -> list[tuple[str, list[int]]]:
    """(place, ranks) by group, the largest first (ties: the lowest rank)."""
    by_place: dict[str, list[int]] = {}
    for rank in sorted(places):
        by_place.setdefault(places[rank], []).append(rank)
    return sorted(by_place.items(), key=lambda item: (-len(item[1]), item[1][0]))


def odd_of(places: Mapping[int, str]) -> list[int]:
    """The ranks outside the largest group; none when all agree, and none when
    the largest groups tie (two ranks in two places: no majority to differ from)."""
    found = group_places(places)
    if len(found) < 2 or len(found[0][1]) == len(found[1][1]):
        return []
    return [rank for _place, members in found[1:] for rank in members]


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


def hang_summary(places: Mapping[int, str] | None, idle_s: float,
                 quiet_first: int | None = None) -> str:
    """The root cause of a hang (``hang: no progress for 20s; ranks 0-1 wait in
    all_reduce <- train.py:42; rank 2 is elsewhere: ...``), or who went quiet first."""
    head = f"hang: no progress for {idle_s:.0f}s"
    found = group_places(places) if places else []
    if not found:
        tail = f"; rank {quiet_first} went quiet first" if quiet_first is not None else ""
        return head + tail + "; no stacks could be dumped"
    where_most, members = found[0]
    tie = len(found) > 1 and len(found[1][1]) == len(members)
    verb = "wait in" if len(members) > 1 else "waits in"
    parts = [f"{rank_span(members)} {verb} {where_most}"]
    for other, odd in found[1:]:
        if tie:
            verb = "wait in" if len(odd) > 1 else "waits in"
            parts.append(f"{rank_span(odd)} {verb} {other}")
        else:
            verb = "are" if len(odd) > 1 else "is"
            parts.append(f"{rank_span(odd)} {verb} elsewhere: {other}")
    if (len(found) == 1 or tie) and quiet_first is not None:
        parts.append(f"rank {quiet_first} went quiet first")
    return head + "; " + "; ".join(parts)
