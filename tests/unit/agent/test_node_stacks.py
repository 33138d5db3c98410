"""The node agent's stack dumps (agent/node/stacks.py): a dump is read only
once it is whole, and the main thread is the one a dump's place comes from."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from orchestrator.agent import stackgroups
from orchestrator.agent.node import stacks
from orchestrator.agent.worker.shim import STACK_SIGNAL, stacks_file

# A dump as faulthandler wrote it on a lab run (paths shortened): the flight
# recorder's thread, newest, first; the main thread, blocked in a collective, last.
WHOLE = '''Thread 0x00007febed39f6c0 (most recent call first):
  File "/r/node-0/code/ddp_orch_shim.py", line 138 in dump_flight_recorder
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007febee43cb80 (most recent call first):
  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3913 in all_reduce
  File "/r/node-0/project/hang_rank2.py", line 8 in wait_for_peers
  File "/r/node-0/project/hang_rank2.py", line 15 in <module>
  File "/r/node-0/code/ddp_orch_shim.py", line 284 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main
'''


def test_only_a_dump_that_reaches_the_main_threads_outermost_frame_is_whole():
    assert stacks.dump_looks_whole(WHOLE)
    lines = WHOLE.splitlines(keepends=True)
    for cut in range(1, len(lines)):  # every prefix a paused writer can leave
        assert not stacks.dump_looks_whole("".join(lines[:cut])), cut
    assert not stacks.dump_looks_whole(WHOLE[:-1])  # the last line half written
    deep = WHOLE.rsplit("  File", 2)[0] + "  ...\n"  # past faulthandler's depth limit
    assert stacks.dump_looks_whole(deep)
    # The shim's own dump: the main thread alone, under faulthandler's one-thread header.
    main_only = "Stack (most recent call first):\n" + WHOLE.split("first):\n")[-1]
    assert stacks.dump_looks_whole(main_only)
    assert stackgroups.place("faulthandler", main_only) == "all_reduce <- hang_rank2.py:8"


def test_the_main_thread_is_the_last_listed_even_where_another_caught_the_signal():
    elsewhere = WHOLE.replace("Current thread", "Thread").replace(
        "Thread 0x00007febed39f6c0", "Current thread 0x00007febed39f6c0")
    for text in (WHOLE, elsewhere):
        assert stackgroups.place("faulthandler", text) == "all_reduce <- hang_rank2.py:8"


# A rank whose dump handler pauses mid-dump, as a descheduled one does on a
# loaded node: half the dump, a pause longer than SETTLE_S, then the rest.
PAUSING = '''import os, signal, sys, time
head, tail = sys.argv[1], sys.argv[2]
def dump(signum, frame):
    with open(os.environ["DUMP"], "a") as fh:
        fh.write(open(head).read()); fh.flush(); time.sleep(0.7)
        fh.write(open(tail).read())
signal.signal(int(sys.argv[3]), dump)
print("ready", flush=True)
time.sleep(60)
'''


def test_a_dump_paused_mid_write_is_read_whole(tmp_path):
    lines = WHOLE.splitlines(keepends=True)
    (tmp_path / "head").write_text("".join(lines[:3]))
    (tmp_path / "tail").write_text("".join(lines[3:]))
    (tmp_path / "pausing.py").write_text(PAUSING)
    path = stacks_file(str(tmp_path), "0")
    os.makedirs(os.path.dirname(path))
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "pausing.py"), str(tmp_path / "head"),
         str(tmp_path / "tail"), str(int(STACK_SIGNAL))],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "DUMP": path, "DDP_ORCH_RUN_ID": "paused"})
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while not stacks.armed(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        [found] = stacks._faulthandler("paused", {0: (proc.pid, 0)}, {0: str(tmp_path)}, 5.0)
        assert found["text"] == WHOLE, found
        assert stackgroups.place("faulthandler", found["text"]) == "all_reduce <- hang_rank2.py:8"
    finally:
        proc.kill()
        proc.wait()
