"""The output relay's framing and the agent's port checks (fast, no processes)."""

from __future__ import annotations

import io
import socket

import pytest

from orchestrator.agent.node import probes, workerlogs
from orchestrator.agent.node.holdings import Holdings
from orchestrator.agent.wire.protocol import LineBuffer
from orchestrator.console import Console


def _line_blocks(chunks, max_line: int = 1 << 20) -> list[bytes]:
    """What the relay writes downstream for ``chunks``: blocks of whole lines, then the rest."""
    lines = LineBuffer(max_line)
    blocks = [block for chunk in chunks if (block := lines.feed(chunk))]
    return blocks + ([rest] if (rest := lines.flush()) else [])


def test_blocks_end_at_newlines_and_keep_the_rest_for_later():
    blocks = _line_blocks([b"ab", b"c\nde", b"f\ng\n", b"tail"])
    assert blocks == [b"abc\n", b"def\ng\n", b"tail"]


def test_a_line_longer_than_the_limit_is_passed_on_unsplit_by_newlines():
    blocks = _line_blocks([b"x" * 6, b"y" * 6, b"\n"], max_line=10)
    assert blocks == [b"x" * 6 + b"y" * 6, b"\n"]
    assert b"".join(blocks) == b"x" * 6 + b"y" * 6 + b"\n"


def test_console_prefixes_every_line_of_a_block_blank_ones_too():
    out = io.StringIO()
    with Console("all", out) as console:
        console.node_lines(1, "h", "[rank1]: a\r\n\n[rank0]: b\n")
    assert out.getvalue() == "[node1 h] [rank1]: a\n[node1 h] \n[node1 h] [rank0]: b\n"


@pytest.mark.parametrize("view, expected", [("rank0", "[node0 h] [rank0]: b\n"), ("quiet", "")])
def test_console_views_filter_blocks(view, expected):
    out = io.StringIO()
    with Console(view, out) as console:
        console.node_lines(0, "h", "[rank1]: a\n[rank0]: b\nagent line\n")
    assert out.getvalue() == expected


RESTART = ("ddp-orch: attempt 0 failed (node 1 (b) failed (exit 1)); restarting the whole gang "
           "in 1s (1 of 2 restart(s))")


@pytest.mark.parametrize("view", ["quiet", "rank0", "all"])
def test_every_view_shows_the_start_and_a_keepers_restart_line(view):
    """A quiet run still says that it started and that it restarted: the
    controller's start line and a node agent's own lines (``ddp-orch: ...``,
    which no rank's line and no torchrun line is), never the ranks' lines."""
    out = io.StringIO()
    console = Console(view, out)
    console.milestone("started 3 processes on 2 node(s); logs in runs/r")
    console.node_lines(0, "a", f"[rank1]: a\n{RESTART}\n[rank0]: b\n")
    console.close()
    shown = out.getvalue().splitlines()
    assert shown[0] == "ddp-orch: started 3 processes on 2 node(s); logs in runs/r"
    assert f"[node0 a] {RESTART}" in shown
    assert ("[node0 a] [rank1]: a" in shown) is (view == "all")


# torchrun's own output after two of its ranks failed (torch 2.x, paths shortened).
TORCHRUN_REPORT = """\
E1124 15:57:53.614000 22025 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 22087) of binary: /venv/bin/python
E1124 15:57:53.615000 22025 torch/distributed/elastic/multiprocessing/errors/error_handler.py:157] no error file defined for parent, to copy child error file (/r/node-0/torchrun/x/attempt_0/0/error.json)
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1142, in <module>
    main()
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 386, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
ddp_orch_shim FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-24_15:57:52
  rank      : 1 (local_rank: 1)
  traceback : Traceback (most recent call last):
    File "/r/node-0/code/workloads/mnist.py", line 72, in train
  workloads.harness.context.WorkloadError: --data real: no MNIST at ./data
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  traceback : Traceback (most recent call last):
    File "/r/node-0/code/workloads/mnist.py", line 72, in train
  workloads.harness.context.WorkloadError: --data real: no MNIST at ./data
============================================================
"""


@pytest.mark.parametrize("cut", [None, 1, 5, 12, 25])
def test_torchruns_failure_report_is_one_line_on_the_console_whatever_the_blocks(cut):
    """The ranks printed their errors already and the summary names the root
    cause: the console shows one line for torchrun's report (the log keeps it)."""
    out = io.StringIO()
    console = Console("all", out)
    text = "[rank0]: WorkloadError: --data real: no MNIST at ./data\n" + TORCHRUN_REPORT + \
        "agent: after\n"
    lines = text.splitlines(keepends=True)
    blocks = [text] if cut is None else ["".join(lines[:cut]), "".join(lines[cut:])]
    for block in blocks:
        console.node_lines(0, "h", block)
    console.close()
    assert out.getvalue().splitlines() == [
        "[node0 h] [rank0]: WorkloadError: --data real: no MNIST at ./data",
        "[node0 h] " + TORCHRUN_REPORT.splitlines()[0],
        "[node0 h] torchrun: its report of the failed ranks (each one's traceback) is in "
        "node-0.log; the summary names the root cause",
        "[node0 h] agent: after"]


# torchrun's own output when ddp-orch stops its node (SIGTERM; torch 2.14, paths shortened).
TORCHRUN_SIGNALLED = """\
W1126 21:16:08.994000 1291 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, shutting down workers
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1142, in <module>
    main()
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 923, in _invoke_run
    time.sleep(monitor_interval)
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 1291 got signal: 15
"""


@pytest.mark.parametrize("cut", [None, 2, 6])
def test_torchruns_traceback_when_stopped_by_a_signal_is_one_line(cut):
    """Issue #32: every node ddp-orch stopped printed torchrun's ~30-line
    SignalException traceback (123 lines on a Ctrl-C of a 3-node run)."""
    out = io.StringIO()
    console = Console("all", out)
    text = "[rank0]: step 3\n" + TORCHRUN_SIGNALLED + "agent: after\n"
    lines = text.splitlines(keepends=True)
    for block in [text] if cut is None else ["".join(lines[:cut]), "".join(lines[cut:])]:
        console.node_lines(1, "h", block)
    console.close()
    assert out.getvalue().splitlines() == [
        "[node1 h] [rank0]: step 3",
        "[node1 h] " + TORCHRUN_SIGNALLED.splitlines()[0],
        "[node1 h] torchrun: stopped by signal 15 (its traceback is in node-1.log)",
        "[node1 h] agent: after"]


# Node 0's first lines on hosts whose reverse DNS does not answer (torch 2.14.1,
# the SSH lab with its resolver down): c10d's warning once per connection to
# the rendezvous store, from torchrun itself and from every rank.
C10D_NO_HOSTNAME = """\
[W1128 13:01:46.494230374 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3
[rank0]: [W1128 13:01:52.849393717 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3
[rank1]: [W1128 13:01:52.209029588 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3
[rank0]: [linear plain1] global batch 32 = 4 x 8, lr 0.01
[rank0]: [W1128 13:01:53.000000000 socket.cpp:207] [c10d] The client socket has failed to connect to [node1]:29500 (errno: 111 - Connection refused).
"""


@pytest.mark.parametrize("view", ["all", "rank0"])
def test_c10ds_no_hostname_warning_is_on_no_console(view):
    """Issue #45: nine such lines on every run of a 7-rank gang over SSH.
    Another c10d warning (one a user can act on) is shown as it was."""
    out = io.StringIO()
    with Console(view, out) as console:
        console.node_lines(0, "h", C10D_NO_HOSTNAME)
    assert out.getvalue().splitlines() == [
        "[node0 h] [rank0]: [linear plain1] global batch 32 = 4 x 8, lr 0.01",
        "[node0 h] [rank0]: [W1128 13:01:53.000000000 socket.cpp:207] [c10d] The client socket "
        "has failed to connect to [node1]:29500 (errno: 111 - Connection refused)."]


def test_any_other_traceback_of_torchrun_is_shown_whole():
    out = io.StringIO()
    text = ("Traceback (most recent call last):\n  File \"run.py\", line 1, in <module>\n"
            "    main()\ntorch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: "
            "timed out\n")
    with Console("all", out) as console:
        console.node_lines(2, "h", text)
    assert out.getvalue() == "".join(f"[node2 h] {line}\n" for line in text.splitlines())


def test_port_probe_reports_a_busy_port_and_finds_a_free_one():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        answer = probes.bind(port)
        assert answer["ok"] is False and "in use" in answer["error"]
    free = probes.bind(0)
    assert free["ok"] and 0 < free["port"] < 65536
    assert probes.bind(free["port"])["ok"]


def test_a_port_left_in_time_wait_counts_as_free_as_it_does_for_torchrun():
    """TCPStore sets SO_REUSEADDR, so a port a finished run used is free to it;
    the probe must agree, or an explicit master.port fails for a minute."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its end goes to TIME_WAIT
    client.close()
    server.close()
    assert probes.bind(port)["ok"]


def worker_files(tmp_path, nproc: int = 2):
    attempt = tmp_path / "torchrun" / "run-1_ab12cd" / "attempt_0"
    for i in range(nproc):
        (attempt / str(i)).mkdir(parents=True)
    return attempt


def test_worker_logs_relay_whole_lines_with_the_global_rank(tmp_path):
    logs = workerlogs.WorkerLogs(str(tmp_path / "torchrun"), "run-1", first_rank=3, nproc=2)
    assert logs.read() == b""  # torchrun has not made its log dir yet
    attempt = worker_files(tmp_path)
    with open(attempt / "0" / "stdout.log", "ab", buffering=0) as out0, \
            open(attempt / "1" / "stderr.log", "ab", buffering=0) as err1:
        out0.write(b"step 1\nstep 2\nhalf a li")
        err1.write(b"Traceback\n")
        assert logs.read() == b"[rank3]: step 1\n[rank3]: step 2\n[rank4]: Traceback\n"
        out0.write(b"ne\n")
        assert logs.read() == b"[rank3]: half a line\n"  # never cut in two
        out0.write(b"no newline at exit")
        assert logs.read() == b""
        assert logs.read(final=True) == b"[rank3]: no newline at exit\n"


def test_a_line_torch_already_prefixed_keeps_one_rank_prefix(tmp_path):
    """torch.distributed's excepthook writes a traceback as ``[rankN]: ...``
    lines itself; they are relayed with the prefix once, not twice."""
    attempt = worker_files(tmp_path, nproc=1)
    (attempt / "0" / "stderr.log").write_bytes(
        b"[rank5]: Traceback (most recent call last):\n\n[rank5]: RuntimeError: boom\n"
        b"[rank6]: quoted from a peer\n")
    logs = workerlogs.WorkerLogs(str(tmp_path / "torchrun"), "run-1", first_rank=5, nproc=1)
    assert logs.read() == (b"[rank5]: Traceback (most recent call last):\n[rank5]: \n"
                           b"[rank5]: RuntimeError: boom\n[rank5]: [rank6]: quoted from a peer\n")


def test_a_partial_line_that_stays_partial_is_shown_anyway(tmp_path, monkeypatch):
    """A progress bar redrawn with \\r never ends its line; it must not stay hidden."""
    monkeypatch.setattr(workerlogs._FollowedFile, "STALE_S", 0.0)
    attempt = worker_files(tmp_path, nproc=1)
    (attempt / "0" / "stderr.log").write_bytes(b" 10%|#   |\r 20%|##  |")
    logs = workerlogs.WorkerLogs(str(tmp_path / "torchrun"), "run-1", first_rank=0, nproc=1)
    assert logs.read() == b"[rank0]:  10%|#   |\r 20%|##  |\n"


def test_escape_sequences_from_a_node_are_shown_not_obeyed():
    out = io.StringIO()
    with Console("all", out) as console:
        console.node_lines(0, "h", "[rank0]: \x1b[2J\x1b]0;owned\x07 \x9b6n done\tok\n")
    assert out.getvalue() == "[node0 h] [rank0]: \\x1b[2J\\x1b]0;owned\\x07 \\x9b6n done\tok\n"


def test_a_held_master_port_is_no_other_stores_until_released():
    """Issue 43: ``port: auto`` was probed free and closed, and torchrun
    bound it only after ``setup:``, minutes later; another job's store
    (SO_REUSEADDR, as torch's TCPStore binds) could take it meanwhile.
    Held, it cannot; released (right before torchrun starts), it can."""
    holdings = Holdings()
    found = probes.bind(0, "127.0.0.1", holdings=holdings)
    assert found["ok"], found
    try:
        other = socket.socket()
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with other, pytest.raises(OSError):
            other.bind(("", found["port"]))
        assert probes.bind(found["port"], "127.0.0.1")["ok"] is False
    finally:
        holdings.release_ports()
    store = socket.socket()
    store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    with store:
        store.bind(("", found["port"]))
        store.listen(1)
    assert probes.bind(found["port"], "127.0.0.1")["ok"] is True  # TIME_WAIT-free, as before


def test_a_full_disk_is_named_where_a_run_fails_on_it(monkeypatch, tmp_path):
    """Under 1 MiB free is full: torchrun's error files and the logs fail
    there in ways that hide why, so the node says it (issue 43)."""
    from types import SimpleNamespace

    free = {"blocks": 255}
    monkeypatch.setattr(probes.os, "statvfs",
                        lambda path: SimpleNamespace(f_bavail=free["blocks"], f_frsize=4096))
    assert probes.disk_full(str(tmp_path)) == (f"the node's disk is full at {tmp_path}: No space "
                                               "left on device")
    free["blocks"] = 256  # 1 MiB
    assert probes.disk_full(str(tmp_path)) == ""
