"""What the user sees while a run goes: node output and ddp-orch's own lines.

Node lines are prefixed with node rank and host; worker lines already
carry torchrun's ``[rankN]:`` prefix. Views: ``all`` (default), ``rank0``
(only rank 0's lines) and ``quiet`` (only ddp-orch's messages and the
summary). Logs on disk always keep everything.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

VIEWS = ("all", "rank0", "quiet")
# Control characters from a node are shown, not obeyed: an escape sequence in
# a worker's output must not move the cursor, retitle or reprogram the
# terminal. Tab and newline pass; everything else in C0, DEL and C1 becomes
# visible text like ``\x1b``. The logs on disk keep the bytes as they came.
_VISIBLE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f, *range(0x80, 0xa0))
            if c not in (0x09, 0x0a)}


def visible(text: str) -> str:
    """``text`` as a terminal may show it: control characters as visible
    text, tab and newline as they are. Every line of ddp-orch's output goes
    through it (node lines, the summary, ``status``, ``logs``, ``down``):
    much of what those show came from a node."""
    return text.translate(_VISIBLE)


class Console:
    def __init__(self, view: str = "all", stream: TextIO | None = None):
        if view not in VIEWS:
            raise ValueError(f"unknown view {view!r}")
        self.view = view
        self.stream = stream or sys.stdout
        self._lock = threading.Lock()

    def node_lines(self, node_rank: int, host: str, text: str) -> None:
        """A block of complete lines (what the relay read in one go), in one
        write: a flush per line would cost more than the lines themselves."""
        if self.view == "quiet":
            return
        lines = (text[:-1] if text.endswith("\n") else text).split("\n")
        if self.view == "rank0":
            lines = [line for line in lines if line.startswith("[rank0]:")]
        if lines:
            head = f"[node{node_rank} {host}] "
            self._write("".join(f"{head}{line.rstrip()}\n" for line in lines))

    def info(self, message: str) -> None:
        if self.view != "quiet":
            self._write(f"ddp-orch: {message}\n")

    def always(self, text: str) -> None:
        self._write(text if text.endswith("\n") else text + "\n")

    def _write(self, text: str) -> None:
        text = visible(text)
        with self._lock:
            self.stream.write(text)
            self.stream.flush()
