"""A rank's step read from the lines it prints, for programs that make no step report.

Most programs print progress (``step 120 loss 2.31``, tqdm's ``120/500 [``)
rather than report it; a rank without a report of its own gets the last step
its lines said, so the straggler rule and ``status`` work for any program. A
bar that starts again counts on from where the last one ended: a rate needs
a step that only goes up.
"""

from __future__ import annotations

import re

PATTERN_ENV = "DDP_ORCH_PROGRESS_PATTERN"
# `step 120`, `Step: 120`, `global_step=120`, `iter 120`, `iteration #120`, and a
# tqdm-style bar's `120/500 [`; a word boundary each side, so `steps 5` or
# `step_size 3` say nothing.
DEFAULT_PATTERN = (r"(?i)\b(?:global[ _]?)?step\b[ \t:=#]*(\d+)"
                   r"|\biter(?:ation)?\b[ \t:=#]*(\d+)"
                   r"|(?<![\d/])(\d+)/\d+ \[")
_RANK = re.compile(rb"\[rank(\d+)\]:")
MAX_STEP = 10 ** 15


def compile_pattern(pattern: str | None) -> "re.Pattern[bytes]":
    """The pattern as the node matches it, on bytes; ``ValueError`` says why it cannot serve."""
    try:
        compiled = re.compile((pattern or DEFAULT_PATTERN).encode())
    except re.error as exc:
        raise ValueError(f"is not a regular expression: {exc}") from None
    if compiled.groups == 0:
        raise ValueError("has no group to read the step from")
    return compiled


class OutputSteps:
    """Each rank's last step as its output said it, and when (the supervisor's clock)."""

    def __init__(self, pattern: str | None = None):
        self.pattern = compile_pattern(pattern)
        self.named = self.pattern.groupindex.get("step")
        self.said: dict[int, tuple[int, float]] = {}  # rank -> (step, at)
        self.bars: dict[int, tuple[int, int]] = {}  # rank -> (counted before this bar, last raw)

    def feed(self, block: bytes, at: float) -> None:
        """Whole worker lines (``[rankN]: ...``), in one scan of the block."""
        for found in self.pattern.finditer(block):
            start = block.rfind(b"\n", 0, found.start()) + 1
            end = block.find(b"\n", start)
            if end != -1 and found.end() > end:
                continue  # a match runs past its line: not the step of one line
            rank = _RANK.match(block, start)
            raw = self._step_of(found)
            if rank is not None and raw is not None:
                self._count(int(rank.group(1)), raw, at)

    def _step_of(self, found: "re.Match[bytes]") -> int | None:
        digits = found.group(self.named) if self.named else next(
            (g for g in found.groups() if g is not None), None)
        if digits is None or not digits.isdigit() or len(digits) > 15:
            return None
        return int(digits)

    def _count(self, rank: int, raw: int, at: float) -> None:
        before, last = self.bars.get(rank, (0, 0))
        if raw < last:  # a bar that starts again counts on from the last one's end
            before += last
        self.bars[rank] = (before, raw)
        self.said[rank] = (min(before + raw, MAX_STEP), at)

    def progress(self, now: float) -> dict[str, list]:
        """{rank: [step, seconds since the line that said it]}."""
        return {str(rank): [step, round(max(0.0, now - at), 3)]
                for rank, (step, at) in self.said.items()}
