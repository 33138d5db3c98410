"""Which rank holds the gang back: one rule for ``top``, ``status`` and the summary.

In synchronous DDP every rank steps at the slowest's rate. The evidence, best
first: (1) seconds per step outside collectives; (2) else the step rate, where
ranks do not move in lock-step; (3) always, a rank whose progress stopped while
others go on. A rank is compared with the median of the *other* ranks, so a gang
of two still names the slow one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..agent.wire.fields import is_time
from ..agent.wire.protocol import PACE_KEYS

SLOW_VS_MEDIAN = 1.5  # this many times the others' median time (or their rate over this)
MIN_GAP_S = 0.005  # and at least this much more per step: a tiny step's noise names nobody
# No progress for this long, while another rank's is at most half as old: stopped.
# (A node's heartbeat carries its ranks' steps every 5 s, and a controller
# rewrites progress.json every 2 s: a moving rank's age reaches about 7 s.)
STOPPED_S = 20.0
WINDOW_S = 10.0  # the rates are over the last this many seconds
SAME_REPORT_S = 1.0  # a step seen again this soon after is the same report
DATA_SHARE = 0.1  # a straggler's data-loading share worth naming
FAR = 999.0  # the ratio to others of a rank with no pace at all (JSON has no infinity)

OUTSIDE, RATE, STOPPED = "outside-collectives", "step-rate", "stopped"


@dataclass(frozen=True)
class RankPace:
    """One rank's pace now; ``age_s`` None: it never reported."""

    rank: int
    age_s: float | None
    compute_s: float | None = None
    data_s: float | None = None
    rate: float | None = None

    @property
    def outside_s(self) -> float | None:
        if self.compute_s is None or self.data_s is None:
            return None
        return self.compute_s + self.data_s


@dataclass(frozen=True)
class Straggler:
    """A rank named as holding the gang back; ``vs_others`` >= 1 (0 when stopped)."""

    rank: int
    evidence: str  # OUTSIDE, RATE or STOPPED
    vs_others: float
    why: str


def pace_of(seen: dict[str, Any]) -> dict[str, float]:
    """``compute_s`` and ``data_s`` of a rank's record, where both are seconds >= 0; else {}."""
    times = [seen.get(key) for key in PACE_KEYS]
    if all(is_time(t) for t in times):
        return dict(zip(PACE_KEYS, (float(t) for t in times)))
    return {}


def stragglers(ranks: Sequence[RankPace]) -> tuple[Straggler, ...]:
    """The ranks that hold the gang back, worst first: stopped, then rule 1 (else 2)."""
    ages = {r.rank: r.age_s for r in ranks if r.age_s is not None}
    stopped = []
    for rank, age in ages.items():
        others = [a for k, a in ages.items() if k != rank]
        if age >= STOPPED_S and others and min(others) <= age / 2:
            stopped.append(Straggler(rank, STOPPED, 0.0,
                                     f"no progress for {age:.0f}s while the others go on"))
    gone = {s.rank for s in stopped}
    going = [r for r in ranks if r.age_s is not None and r.rank not in gone]
    slow = _by_outside(going)
    if slow is None:  # no rule-1 evidence: the rates, where ranks step on their own
        slow = _by_rate(going)
    return (*sorted(stopped, key=lambda s: -(ages[s.rank])),
            *sorted(slow, key=lambda s: -s.vs_others))


def _by_outside(ranks: Sequence[RankPace]) -> list[Straggler] | None:
    """Rule 1; None where fewer than two ranks report their times (no evidence)."""
    timed = {r.rank: r for r in ranks if r.outside_s is not None}
    if len(timed) < 2:
        return None
    out = []
    for rank, r in timed.items():
        median = _median(o.outside_s for k, o in timed.items() if k != rank)
        if r.outside_s >= SLOW_VS_MEDIAN * median and r.outside_s - median >= MIN_GAP_S:
            ratio = r.outside_s / median if median > 0 else FAR
            share = r.data_s / r.outside_s if r.outside_s > 0 else 0.0
            data = f", {share:.0%} of it waiting for data" if share >= DATA_SHARE else ""
            out.append(Straggler(rank, OUTSIDE, ratio,
                                 f"{r.outside_s * 1000:.0f} ms/step outside collectives, "
                                 f"{_times(ratio)} the others' median "
                                 f"({median * 1000:.0f} ms){data}"))
    return out


def _by_rate(ranks: Sequence[RankPace]) -> list[Straggler]:
    rated = {r.rank: r.rate for r in ranks if r.rate is not None}
    if len(rated) < 2:
        return []
    out = []
    for rank, rate in rated.items():
        moving = [v for k, v in rated.items() if k != rank and v > 0]  # a still rank is no pace
        median = _median(moving) if moving else 0.0
        if median > 0 and rate * SLOW_VS_MEDIAN <= median:
            ratio = median / rate if rate > 0 else FAR
            out.append(Straggler(rank, RATE, ratio,
                                 f"{rate:.2f} steps/s, {_times(ratio)} slower than the "
                                 f"others' median ({median:.2f} steps/s)"))
    return out


def _median(values: Iterable[float]) -> float:
    """The median (``statistics`` costs ``status`` more to import than this)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _times(ratio: float) -> str:
    return "far" if ratio >= FAR else f"{ratio:.1f}x"


class PaceWindow:
    """Each rank's steps and samples per second over the last ``WINDOW_S``."""

    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self.seen: dict[int, deque] = {}

    def add(self, at: float, rank: int, step: object, samples: object) -> None:
        """``at`` is the report's own time: rates are over those, not when they were seen."""
        if not isinstance(step, int) or isinstance(step, bool):
            return
        points = self.seen.setdefault(rank, deque())
        if points and (at <= points[-1][0] or step == points[-1][1]
                       and at - points[-1][0] < SAME_REPORT_S):
            return  # the same report, seen again (its time read off another clock)
        points.append((at, step, samples if isinstance(samples, int) else None))
        while len(points) > 2 and at - points[1][0] >= self.window_s:
            points.popleft()

    def rate(self, rank: int) -> float | None:
        """Steps per second over the window; None before two snapshots."""
        return self._per_s(rank, 1)

    def samples_rate(self, rank: int) -> float | None:
        """Samples per second over the window, where the rank reports them."""
        return self._per_s(rank, 2)

    def _per_s(self, rank: int, field: int) -> float | None:
        points = self.seen.get(rank)
        if not points or len(points) < 2:
            return None
        first, last = points[0], points[-1]
        if first[field] is None or last[field] is None or last[0] <= first[0]:
            return None
        return max(0, last[field] - first[field]) / (last[0] - first[0])


def from_step_times(rows: object) -> list[RankPace]:
    """A finished run's ``rank_step_times``: rule 1 where times are known, else rule 2."""
    out = []
    for row in rows if isinstance(rows, list) else ():
        if not (isinstance(row, dict) and isinstance(row.get("rank"), int)):
            continue
        times = [row.get("forward_mean_s"), row.get("data_mean_s")]
        mean = row.get("mean_s")
        if all(is_time(t) for t in times):
            out.append(RankPace(row["rank"], 0.0, float(times[0]), float(times[1])))
        elif is_time(mean) and mean > 0:
            out.append(RankPace(row["rank"], 0.0, rate=1.0 / mean))
    return out


def marked(rows: Sequence[dict[str, Any]]) -> dict[int, str]:
    """{rank: why} for stragglers among ``live_progress`` rows seen once (rules 1 and 3)."""
    return {s.rank: s.why for s in stragglers(paces(rows))}


def paces(rows: Iterable[dict[str, Any]], window: PaceWindow | None = None) -> list[RankPace]:
    out = []
    for row in rows:
        pace = pace_of(row)
        out.append(RankPace(row["rank"], row.get("last_progress_s_ago"),
                            *(pace.get(key) for key in PACE_KEYS),
                            rate=window.rate(row["rank"]) if window else None))
    return out
