"""The standby each node runs while the controller resolves and uploads
(``node.STANDBY``): one line makes it the supervisor, EOF makes it leave."""

from __future__ import annotations

import io
import json
import os
import socket
import sys

import pytest

from orchestrator.console import Console
from orchestrator.errors import LaunchError
from orchestrator.loader import load_cluster_file
from orchestrator.node import discard_standby, open_standby
from orchestrator.nodeprocs import proc_table
from orchestrator.session import up
from orchestrator.transport.local import LocalTransport

pytestmark = pytest.mark.live


def test_standby_becomes_the_argv_it_is_sent_and_keeps_the_rest_of_stdin():
    handle = open_standby(LocalTransport(), sys.executable)
    program = ("import os, sys; print(os.getpid()); print(sys.argv[1]); "
               "print(sys.stdin.read(), end='')")
    hostile = "it's $(touch nope) `x`; \"y\""
    # The go line and the supervisor's first commands in one write: the
    # standby must not swallow what follows its line.
    handle.send((json.dumps(["-c", program, hostile]) + "\n").encode() + b"stop\nkill\n")
    handle.close_stdin()
    assert handle.wait(timeout=30) == 0
    lines = handle.stdout.read().decode().splitlines()
    assert lines == [str(handle.pid), hostile, "stop", "kill"]  # same pid: exec, not a child


def test_standby_leaves_on_eof_having_started_nothing():
    handle = open_standby(LocalTransport(), sys.executable)
    discard_standby(handle)
    assert handle.poll() == 0
    assert handle.stdout.read() == b""


def _standbys_of_this_process() -> list[int]:
    found = []
    for pid, ppid, _state in proc_table():  # zombies too: a standby must be reaped
        if ppid != os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"os.execv(sys.executable" in fh.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def test_a_launch_that_fails_before_starting_releases_its_standbys(tmp_path):
    busy = socket.socket()
    busy.bind(("", 0))
    busy.listen(1)
    try:
        cluster = tmp_path / "c.yaml"
        cluster.write_text(f"master: {{port: {busy.getsockname()[1]}}}\n"
                           "nodes:\n  - {host: localhost, procs: 1}\n"
                           "  - {host: localhost, procs: 1}\n"
                           "workload: {name: noop}\n")
        with pytest.raises(LaunchError, match="already in use"):
            up(load_cluster_file(str(cluster)), runs_dir=str(tmp_path / "runs"),
               console=Console(stream=io.StringIO()))
    finally:
        busy.close()
    assert _standbys_of_this_process() == []
