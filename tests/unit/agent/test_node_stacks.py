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


def fake_py_spy(tmp_path, native_failures: int, python_fails: bool = False) -> str:
    """A py-spy that fails its first ``native_failures`` ``--native`` dumps as
    the real one sometimes does, and (``python_fails``) every plain one."""
    count = tmp_path / "native-calls"
    count.write_text("0")
    script = tmp_path / "py-spy"
    script.write_text(f"""#!/bin/sh
case "$*" in
  *--native*)
    n=$(( $(cat {count}) + 1 )); echo $n > {count}
    if [ $n -le {native_failures} ]; then
      echo "Error: Failed to merge native and python frames (Have 3 native and 8 python)" >&2
      exit 1
    fi
    echo "Thread 1 (idle): \\"MainThread\\""; echo "    c10d::Work::wait (libtorch.so)";;
  *)
    {"echo 'Error: Permission denied (os error 13)' >&2; exit 1" if python_fails else ""}
    echo "Thread 1 (idle): \\"MainThread\\""; echo "    wait_for_peers (hang.py:8)";;
esac
""")
    script.chmod(0o755)
    return str(script)


def test_a_native_dump_that_py_spy_cannot_merge_is_tried_again(tmp_path):
    """CI: py-spy --native failed on 2 of 3 ranks ("Failed to merge native
    and python frames", a thread caught between the two) and the ranks went
    to faulthandler, with no C frames and no word why."""
    text, note = stacks._spied(fake_py_spy(tmp_path, native_failures=1), 1, True, 5.0)
    assert "c10d::Work::wait" in text and note == ""


def test_python_frames_by_py_spy_say_why_they_lack_the_c_frames(tmp_path):
    text, note = stacks._spied(fake_py_spy(tmp_path, native_failures=9), 1, True, 5.0)
    assert "wait_for_peers (hang.py:8)" in text and "c10d" not in text
    assert note == ("no C/C++ frames: py-spy --native failed: Error: Failed to merge native "
                    "and python frames (Have 3 native and 8 python)")
    assert (tmp_path / "native-calls").read_text().strip() == str(stacks.NATIVE_TRIES)
    plain, note = stacks._spied(fake_py_spy(tmp_path, native_failures=9), 1, False, 5.0)
    assert "wait_for_peers" in plain and note == ""
    assert (tmp_path / "native-calls").read_text().strip() == "0"


def test_a_rank_py_spy_cannot_read_at_all_says_each_reason_once(tmp_path):
    text, note = stacks._spied(fake_py_spy(tmp_path, 9, python_fails=True), 1, True, 5.0)
    assert text == "" and note == (
        "Error: Failed to merge native and python frames (Have 3 native and 8 python); "
        "Error: Permission denied (os error 13)")
