"""Plain-text tables for the terminal, and the durations in them (``span``)."""

from __future__ import annotations

from typing import Sequence


def format_table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Align ``rows`` (the first is the header); the last column is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)


def span(seconds: float) -> str:
    """A duration as a person says it: ``45s``, ``2m10s``, ``1h02m``."""
    whole = max(0, int(round(seconds)))
    minutes, s = divmod(whole, 60)
    hours, m = divmod(minutes, 60)
    if hours:
        return f"{hours}h{m:02d}m"
    return f"{minutes}m{s:02d}s" if minutes else f"{s}s"
