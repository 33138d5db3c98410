"""One job of the test queue, start to end (``python -m ddp_orch_testqueue.runner JOB_DIR``).

Started by ``Backend.submit_job`` in a session of its own, with the
environment the controller gave the submission (secrets, the run's
marker). While ``hold`` exists the job is PENDING; then one task per node
runs the agent argv with the placement variables set, and the job is
RUNNING. A ``cancel`` file ends it: SIGTERM to every task's process group,
SIGKILL after ``GRACE_S`` (at once for ``KILL``), then CANCELLED. When every
task has exited: COMPLETED, or FAILED if one did not exit 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from ddp_orch_testqueue import _write_state

GRACE_S = 10.0


def main(job: str) -> int:
    with open(os.path.join(job, "job.json"), encoding="utf-8") as fh:
        spec = json.load(fh)
    place = spec["placement"]
    while os.path.exists(os.path.join(job, "hold")):
        if os.path.exists(os.path.join(job, "cancel")):
            _write_state(job, {"state": "CANCELLED", "reason": "cancelled while queued"})
            return 0
        time.sleep(0.1)
    tasks = []
    for k, host in enumerate(spec["hosts"]):
        env = {**os.environ, place["node_name"]: host, place["node_index"]: str(k)}
        tasks.append(subprocess.Popen(spec["argv"], cwd=spec["cwd"], env=env,
                                      stdin=subprocess.DEVNULL, start_new_session=True))
    _write_state(job, {"state": "RUNNING", "nodelist": ",".join(spec["hosts"])})
    cancelled_at = None
    while any(t.poll() is None for t in tasks):
        cancel = os.path.join(job, "cancel")
        if os.path.exists(cancel):
            with open(cancel, encoding="utf-8") as fh:
                word = fh.read().strip()
            if cancelled_at is None:
                cancelled_at = time.monotonic()
                _signal(tasks, signal.SIGTERM)
            if word == "KILL" or time.monotonic() - cancelled_at > GRACE_S:
                _signal(tasks, signal.SIGKILL)
        time.sleep(0.1)
    codes = [t.returncode for t in tasks]
    state = "CANCELLED" if cancelled_at is not None else \
        "COMPLETED" if all(c == 0 for c in codes) else "FAILED"
    _write_state(job, {"state": state, "reason": f"exit codes {codes}"})
    return 0


def _signal(tasks, sig) -> None:
    for task in tasks:
        if task.poll() is None:
            try:
                os.killpg(task.pid, sig)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
