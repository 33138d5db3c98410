"""What the user sees while a run goes: node output and ddp-orch's own lines.

Every view shows the agents' own lines (``AGENT_SAYS``), so a quiet run
still says it started and restarted. torchrun's failure report (30 lines
and more per rank) becomes one line; the logs on disk keep everything.
"""

from __future__ import annotations

import re
import sys
import threading
from typing import TextIO

VIEWS = ("all", "rank0", "quiet")
# How a node agent's own line starts (a keeper's restart, a setup step): no
# worker line does (torchrun prefixes them ``[rankN]:``), nor torchrun's own.
AGENT_SAYS = "ddp-orch: "
# Control characters from a node are shown, not obeyed: an escape sequence in
# a worker's output must not move the cursor, retitle or reprogram the
# terminal. Tab and newline pass; everything else in C0, DEL and C1 becomes
# visible text like ``\x1b``. The logs on disk keep the bytes as they came.
_VISIBLE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f, *range(0x80, 0xa0))
            if c not in (0x09, 0x0a)}


def visible(text: str) -> str:
    """``text`` as a terminal may show it: control characters made visible, tab
    and newline kept. All output goes through it: much of it came from a node."""
    return text.translate(_VISIBLE)


_TRACEBACK = "Traceback (most recent call last):"
_CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
# torchrun's traceback when a signal ends it (every node ddp-orch stops)
_SIGNALLED = re.compile(r"torch\.distributed\.elastic\.multiprocessing\.api\.SignalException: "
                        r"Process \d+ got signal: (\d+)")
_RULER = "=" * 60  # torchrun's report starts and ends with one
# Lines that tell the user nothing, whatever their prefix (``noise``): torchrun's
# error log line after a failed rank, and c10d's, once per store connection
# (torchrun's and each rank's), where a peer's address has no name in DNS.
_NOISE = re.compile(r"no error file defined for parent, to copy child error file"
                    r"|\[c10d\] The hostname of the client socket cannot be retrieved\. err=")
_MAX_HELD = 2000  # lines of an unfinished traceback held back before it is shown as is


class TorchrunReport:
    """Takes torchrun's failure report out of one node's lines: a traceback ending
    in ``ChildFailedError:`` becomes one line; any other is shown as it was."""

    def __init__(self, node_rank: int):
        self.node_rank = node_rank
        self.held: list[str] = []
        self.rulers = -1  # >= 0: inside the report, counting its rulers

    def feed(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        for line in lines:
            if self.rulers >= 0:
                self.rulers += line.rstrip() == _RULER
                if self.rulers >= 2:
                    self.rulers = -1
                    out.append(f"torchrun: its report of the failed ranks (each one's "
                               f"traceback) is in node-{self.node_rank}.log; the summary "
                               "names the root cause")
            elif self.held:
                self.held.append(line)
                if line[:1] in (" ", "\t") and len(self.held) < _MAX_HELD:
                    continue  # a frame of the traceback
                signalled = _SIGNALLED.match(line)
                if line.startswith(_CHILD_FAILED):
                    self.rulers = 0
                elif signalled:
                    out.append(f"torchrun: stopped by signal {signalled.group(1)} (its "
                               f"traceback is in node-{self.node_rank}.log)")
                else:
                    out.extend(self.held)
                self.held = []
            elif line == _TRACEBACK:
                self.held = [line]
            else:
                out.append(line)
        return out


def noise(line: str) -> bool:
    """Is ``line`` one of torchrun's or c10d's that no view shows (the log keeps it)?"""
    return _NOISE.search(line) is not None


class Console:
    """``rank``: only that rank's lines. Never waits on the terminal: one that
    stops reading would stop the relays and their heartbeats. Past
    ``HELD_MAX_BYTES`` node lines are dropped and counted, never ddp-orch's own."""

    HELD_MAX_BYTES = 16 << 20

    def __init__(self, view: str = "all", stream: TextIO | None = None,
                 rank: int | None = None):
        if view not in VIEWS:
            raise ValueError(f"unknown view {view!r}")
        self.view = view
        self.rank = 0 if view == "rank0" else rank
        self.stream = stream or sys.stdout
        self._reports: dict[int, TorchrunReport] = {}
        self._cond = threading.Condition()
        self._held: list[str] = []  # written by the writer thread, in order
        self._held_bytes = 0
        self._dropped = 0  # node lines not shown since the last write
        self._writing = False
        self._writer: threading.Thread | None = None

    def __enter__(self) -> "Console":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def node_lines(self, node_rank: int, host: str, text: str) -> None:
        """A block of complete lines in one write: a flush per line costs more than the lines."""
        if self.view == "quiet" and AGENT_SAYS not in text:
            return
        lines = (text[:-1] if text.endswith("\n") else text).split("\n")
        if _NOISE.search(text):  # rare: one search of the block, not one per line
            lines = [line for line in lines if not noise(line)]
        if self.view == "quiet":
            lines = [line for line in lines if line.startswith(AGENT_SAYS)]
        elif self.rank is not None:
            lines = [line for line in lines
                     if line.startswith((f"[rank{self.rank}]:", AGENT_SAYS))]
        else:
            report = self._reports.setdefault(node_rank, TorchrunReport(node_rank))
            lines = report.feed(lines)
        if lines:
            head = f"[node{node_rank} {host}] "
            self._write("".join(f"{head}{line.rstrip()}\n" for line in lines), droppable=True)

    def info(self, message: str) -> None:
        if self.view != "quiet":
            self._write(f"ddp-orch: {message}\n")

    def milestone(self, message: str) -> None:
        """ddp-orch's own line that every view shows: the run started."""
        self._write(f"{AGENT_SAYS}{message}\n")

    def always(self, text: str) -> None:
        self._write(text if text.endswith("\n") else text + "\n")

    def close(self) -> None:
        """Wait until everything said so far is written (the terminal read it)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._held and not self._dropped and not self._writing)

    def _write(self, text: str, droppable: bool = False) -> None:
        text = visible(text)
        with self._cond:
            if droppable and self._held_bytes + len(text) > self.HELD_MAX_BYTES:
                self._dropped += text.count("\n")
                return
            self._held.append(text)
            self._held_bytes += len(text)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_held, daemon=True,
                                                name="console")
                self._writer.start()
            self._cond.notify_all()

    def _write_held(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._held or self._dropped))
                text, dropped = "".join(self._held), self._dropped
                self._held, self._held_bytes, self._dropped = [], 0, 0
                self._writing = True
            if dropped:
                text += (f"{AGENT_SAYS}{dropped} line(s) of the nodes' output not shown here: "
                         "the terminal did not read them in time (every node's log keeps "
                         "them: `ddp-orch logs`)\n")
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):  # a closed terminal or pipe: nobody to show it to
                pass
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()
