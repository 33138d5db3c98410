"""The controller's output relay and local port checks (fast, no processes)."""

from __future__ import annotations

import io
import socket

import pytest

from orchestrator import ports
from orchestrator.console import Console
from orchestrator.errors import LaunchError
from orchestrator.node import _line_blocks
from orchestrator.transport.local import LocalTransport


def reader(*chunks: bytes):
    it = iter(chunks)
    return lambda size: next(it, b"")


def test_blocks_end_at_newlines_and_keep_the_rest_for_later():
    blocks = list(_line_blocks(reader(b"ab", b"c\nde", b"f\ng\n", b"tail")))
    assert blocks == [b"abc\n", b"def\ng\n", b"tail"]


def test_a_line_longer_than_the_limit_is_passed_on_unsplit_by_newlines():
    blocks = list(_line_blocks(reader(b"x" * 6, b"y" * 6, b"\n"), max_line=10))
    assert blocks == [b"x" * 6 + b"y" * 6, b"\n"]
    assert b"".join(blocks) == b"x" * 6 + b"y" * 6 + b"\n"


def test_console_prefixes_every_line_of_a_block_blank_ones_too():
    out = io.StringIO()
    Console("all", out).node_lines(1, "h", "[rank1]: a\r\n\n[rank0]: b\n")
    assert out.getvalue() == "[node1 h] [rank1]: a\n[node1 h] \n[node1 h] [rank0]: b\n"


@pytest.mark.parametrize("view, expected", [("rank0", "[node0 h] [rank0]: b\n"), ("quiet", "")])
def test_console_views_filter_blocks(view, expected):
    out = io.StringIO()
    Console(view, out).node_lines(0, "h", "[rank1]: a\n[rank0]: b\nagent line\n")
    assert out.getvalue() == expected


def test_local_port_checks_bind_in_process():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LaunchError, match=f"master port {port} on localhost .* in use"):
            ports.check_port_free(LocalTransport(), "no-such-python", port)
    free = ports.pick_free_port(LocalTransport(), "no-such-python")
    assert 0 < free < 65536
    ports.check_port_free(LocalTransport(), "no-such-python", free)
