"""Plain-text tables for the terminal: left-aligned columns, two spaces apart."""

from __future__ import annotations

from typing import Sequence


def format_table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Align ``rows`` (the first is the header); the last column is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)
