"""Unit tests of console.py: what a node's records print."""

from __future__ import annotations

import io
import threading

from orchestrator.console import Console, visible


def test_control_characters_are_shown_not_obeyed():
    assert visible("a\x1b]0;pwned\x07b\tc\nd\x9b") == "a\\x1b]0;pwned\\x07b\tc\nd\\x9b"


class StalledTerminal(io.StringIO):
    """A terminal that stops reading: every write blocks until ``reading`` is set."""

    def __init__(self):
        super().__init__()
        self.reading = threading.Event()

    def write(self, text: str) -> int:
        self.reading.wait()
        return super().write(text)


def test_a_terminal_that_stops_reading_never_holds_up_whoever_writes_to_the_console():
    """Issue 43: the relays wrote to the terminal while reading the nodes,
    so a terminal that stopped reading (``| less``, Ctrl-S) stopped the
    heartbeats, and a healthy run was judged lost. Writing returns at once;
    node lines past the buffer's cap are dropped and counted, never
    ddp-orch's own lines; once the terminal reads, it gets all that was
    kept, in order, and the count."""
    terminal = StalledTerminal()
    console = Console("all", terminal)
    console.HELD_MAX_BYTES = 200

    def say() -> None:
        console.info("first")
        for k in range(20):
            console.node_lines(0, "h", f"[rank0]: line {k}\n")  # 19 bytes and the prefix
        console.milestone("started")

    writer = threading.Thread(target=say, daemon=True)
    try:
        writer.start()
        writer.join(2.0)
        assert not writer.is_alive(), "a write waited on the terminal"
    finally:
        terminal.reading.set()
    console.close()
    shown = terminal.getvalue().splitlines()
    assert shown[0] == "ddp-orch: first"
    kept = [line for line in shown if line.startswith("[node0 h] [rank0]: line ")]
    assert kept == [f"[node0 h] [rank0]: line {k}" for k in range(len(kept))]
    assert 3 <= len(kept) < 20
    assert "ddp-orch: started" in shown
    assert shown[-1] == (f"ddp-orch: {20 - len(kept)} line(s) of the nodes' output not shown "
                         "here: the terminal did not read them in time (every node's log keeps "
                         "them: `ddp-orch logs`)")
