"""``ddp-orch prune`` on a node: remove one ended run's node directory.

The controller asks only for runs its records say have ended; the node
checks again, and refuses a path that is not a real ``<run id>/node-<k>``
directory of ours, or a run still alive here (a process with its marker
variables, or its keeper). ``<run id>/`` goes too once it holds no node's.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time

from . import procs
from .. import layout
from ..wire.runstate import RunState

KEEPER_EXIT_S = 10.0  # how long a keeper whose run is over may take to exit


def prune(run_dir: str, run_id: str, node_rank: int) -> dict:
    """The bytes ``freed``, or a refusal whose ``live`` says the run still runs here."""
    path = os.path.expanduser(run_dir).rstrip("/")
    if os.path.basename(path) != f"node-{node_rank}" \
            or os.path.basename(os.path.dirname(path)) != run_id:
        return {"ok": False, "live": False,
                "error": f"{path} is not node {node_rank}'s directory of run {run_id}"}
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return {"ok": True, "freed": 0, "path": path, "gone": True}
    if not stat.S_ISDIR(info.st_mode):
        return {"ok": False, "live": False,
                "error": f"{path} is not a directory (a link or a file); not removed"}
    if info.st_uid != os.getuid():
        return {"ok": False, "live": False, "error": f"{path} is not ours (owner uid "
                                                   f"{info.st_uid}); not removed"}
    alive = procs.marked_processes(procs.run_marker(run_id, node_rank))
    keeper = _running_keeper(path)
    if alive or keeper:
        what = f"{len(alive)} process(es) of the run" if alive else "its keeper"
        return {"ok": False, "live": True,
                "error": f"the run is alive here ({what}: pid "
                         f"{', '.join(map(str, sorted(alive or {keeper})))}); not removed"}
    freed = tree_bytes(path)
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
        return {"ok": False, "live": False, "error": f"{path} could not be removed entirely",
                "freed": freed - tree_bytes(path)}
    try:
        os.rmdir(os.path.dirname(path))  # the run's directory, once no node's is left
    except OSError:
        pass
    return {"ok": True, "freed": freed, "path": path}


def _running_keeper(path: str) -> int | None:
    """The run's keeper here if it still runs, given a few seconds to exit
    when its record says the run is over."""
    from ..kept.mailbox import keeper_pid

    deadline = time.monotonic() + KEEPER_EXIT_S
    while True:
        pid = keeper_pid(path)
        if pid is None or not procs.running(pid):
            return None
        try:
            with open(os.path.join(path, layout.KEEPER_STATE), encoding="utf-8") as fh:
                over = json.load(fh).get("state") not in (None, RunState.RUNNING)
        except (OSError, ValueError, AttributeError):
            over = False
        if not over or time.monotonic() > deadline:
            return pid
        time.sleep(0.1)


def tree_bytes(path: str) -> int:
    """The bytes of the files under ``path`` (links not followed)."""
    total = 0
    for here, _dirs, names in os.walk(path, followlinks=False):
        for name in names:
            try:
                info = os.lstat(os.path.join(here, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total
