"""Unit tests of console.py: what a node's records print."""

from __future__ import annotations

from orchestrator.console import visible


def test_control_characters_are_shown_not_obeyed():
    assert visible("a\x1b]0;pwned\x07b\tc\nd\x9b") == "a\\x1b]0;pwned\\x07b\tc\nd\\x9b"
