"""``procs.terminate`` (``agent/node/procs.py``) against real child processes:
SIGTERM, the grace period, then SIGKILL for what ignored it; the call
always returns. Each child says it is ready (its handler set) before it is
signalled; grace periods are short, bounds generous."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.agent.node import procs

IGNORES_TERM = ("import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('ready', flush=True)\n"
                "while True: time.sleep(1)\n")
OBEYS_TERM = ("import sys, time\n"
              "print('ready', flush=True)\n"
              "while True: time.sleep(1)\n")


@pytest.fixture
def child():
    started = []

    def start(program: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE)
        started.append(proc)
        assert proc.stdout.readline() == b"ready\n"
        return proc

    yield start
    for proc in started:  # whatever the test did, nothing is left
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stdout.close()


def alive(proc: subprocess.Popen):
    """``find`` for ``terminate``: the child while it runs (poll reaps it)."""
    return lambda: {proc.pid} if proc.poll() is None else set()


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(child):
    proc = child(IGNORES_TERM)
    grace = 0.5
    begun = time.monotonic()
    seen, survivors = procs.terminate(alive(proc), grace)
    took = time.monotonic() - begun
    assert proc.wait(10) == -signal.SIGKILL
    assert seen == {proc.pid} and survivors == {}
    assert grace <= took < grace + 5.0, took


def test_a_child_that_obeys_sigterm_is_not_killed_and_the_grace_is_not_waited_out(child):
    proc = child(OBEYS_TERM)
    begun = time.monotonic()
    seen, survivors = procs.terminate(alive(proc), 60.0)
    assert proc.wait(10) == -signal.SIGTERM
    assert (seen, survivors) == ({proc.pid}, {})
    assert time.monotonic() - begun < 30.0  # well inside the 60 s grace period


def test_hurry_cuts_the_grace_period_short(child):
    proc = child(IGNORES_TERM)
    hurry = threading.Event()
    hurry.set()
    begun = time.monotonic()
    procs.terminate(alive(proc), 60.0, hurry=hurry)
    assert proc.wait(10) == -signal.SIGKILL
    assert time.monotonic() - begun < 30.0


def test_what_cannot_be_killed_is_reported_and_the_call_returns():
    """A process that never goes (here: a pid ``find`` keeps naming after it
    is gone, standing for one in uninterruptible sleep) ends the call with it
    listed as a survivor, not in a loop."""
    proc = subprocess.Popen([sys.executable, "-c", IGNORES_TERM], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        seen, survivors = procs.terminate(lambda: {proc.pid}, 0.2)
        assert seen == {proc.pid} and list(survivors) == [proc.pid]
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stdout.close()


# A parent of three children: one started from a second thread, one that has
# exited and is left unreaped (a zombie). It prints their pids, then waits.
PARENT = ("import json, subprocess, sys, threading, time\n"
          "sleep = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
          "kids = [subprocess.Popen(sleep)]\n"
          "t = threading.Thread(target=lambda: kids.append(subprocess.Popen(sleep)))\n"
          "t.start(); t.join()\n"
          "gone = subprocess.Popen([sys.executable, '-c', 'pass'])\n"
          "while open(f'/proc/{gone.pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z':\n"
          "    time.sleep(0.01)\n"
          "print(json.dumps([k.pid for k in kids]), flush=True)\n"
          "print('ready', flush=True)\n"
          "try:\n    time.sleep(60)\nfinally:\n    [k.kill() for k in kids]\n")


def test_the_live_children_are_found_whichever_thread_started_them():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
    try:
        kids = json.loads(proc.stdout.readline())
        assert proc.stdout.readline() == b"ready\n"
        assert sorted(procs.children_of(proc.pid)) == sorted(kids)
        table = [p for p, ppid, state in procs.proc_table() if ppid == proc.pid and state != "Z"]
        assert sorted(table) == sorted(kids)  # the scan, where the kernel has no children files
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
    assert procs.children_of(proc.pid) == []


def test_a_connection_is_found_by_its_remote_port_and_no_table_read_without_a_socket(
        child, monkeypatch):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    connected = child("import socket, sys, time\n"
                      f"s = socket.create_connection(('127.0.0.1', {port}))\n"
                      "print('ready', flush=True)\n"
                      "time.sleep(60)\n")
    idle = child(OBEYS_TERM)
    try:
        peer, _ = listener.accept()
        assert procs.connected_to(connected.pid, port)
        assert not procs.connected_to(connected.pid, port + 1)
        assert not procs.connected_to(os.getpid(), port)  # listening is not connected

        def no_tables(path, *args, **kwargs):
            raise AssertionError(f"read {path}")

        monkeypatch.setattr(procs, "open", no_tables, raising=False)
        assert not procs.connected_to(idle.pid, port)  # no socket: the tables are not read
        peer.close()
    finally:
        listener.close()
