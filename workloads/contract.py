"""The contract between ddp-orch and the programs it launches.

This module is the one place that defines it. It is stdlib-only on purpose:
the controller imports it (and must never import torch), and it is shipped
to the nodes together with the workloads, so a user's own script can use it
too, or simply follow the same rules:

* ``DDP_ORCH_RESULT_FILE``: where rank 0 writes its result, a JSON object.
  Only rank 0 writes it, and it writes it atomically (``write_json_atomic``),
  so the controller never copies a half-written file.
* ``DDP_ORCH_RUN_ID``: the run id, for log lines and for finding a run's
  processes again (``ddp-orch down`` matches on it, never on a process name).
* ``DDP_ORCH_NODE_RANK``: the node's rank; with the run id it marks every
  process of the run on a node, so the node supervisor can find them all.
* ``DDP_ORCH_DEVICE``: ``cuda`` or ``cpu``, decided by ddp-orch once for the
  whole gang (``auto`` only where a program runs without it). ``cpu`` means
  gloo on the CPU even where GPUs are visible; ``cuda`` means a GPU per local
  rank, or the rank fails at once (never a quiet CPU run).
* ``DDP_ORCH_GPU_UUIDS``: the UUIDs of the GPUs ddp-orch planned for this
  node's ranks (nvidia-smi's ``GPU-...`` form), comma-separated, in the order
  of CUDA_VISIBLE_DEVICES: local rank i should find ``planned[i]``. The
  built-in workloads refuse to run on any other GPU.
* ``DDP_ORCH_RESTART_COUNT``: which attempt of the run this is (0, then
  1, 2, ... after each whole-gang restart, ``up --max-restarts``). A program
  that checkpoints resumes from its latest checkpoint when it is above 0
  (``restart_count``); the built-in workloads do (``harness/checkpoint.py``).
  ``DDP_ORCH_MAX_RESTARTS``, set when a run may restart at all, tells a
  program that it should checkpoint.
* ``heartbeat(step, samples=None, compute_s=None, data_s=None)``: a rank's
  sign of progress for ddp-orch's hang watchdog (``up --hang-timeout``), and
  its step (and, where given, the training samples it has processed so far,
  and the step's seconds outside collectives: computing before the
  gradients' all-reduce, and waiting for data) for ``status`` and ``top``.
  The built-in workloads call it every step, with all of them; a user
  script may too. Without ddp-orch it does nothing.
"""

from __future__ import annotations

import json
import numbers
import os
from typing import Any

RESULT_FILE_ENV = "DDP_ORCH_RESULT_FILE"
RUN_ID_ENV = "DDP_ORCH_RUN_ID"
NODE_RANK_ENV = "DDP_ORCH_NODE_RANK"
DEVICE_ENV = "DDP_ORCH_DEVICE"
GPU_UUIDS_ENV = "DDP_ORCH_GPU_UUIDS"
# The planned GPUs' UUIDs, comma-separated in CUDA_VISIBLE_DEVICES order, where
# the node's nvidia-smi named them at launch: a rank checks its own against it.
GPU_UUIDS_ENV = "DDP_ORCH_GPU_UUIDS"
RESTART_COUNT_ENV = "DDP_ORCH_RESTART_COUNT"
MAX_RESTARTS_ENV = "DDP_ORCH_MAX_RESTARTS"  # set when the run may restart (up --max-restarts)

# A class attribute: an exception class that has it true is reported by the
# worker shim as one line (its type and message), not a traceback
# (``agent/worker/shim.py``). The built-in workloads' WorkloadError has it.
ONE_LINE_ERROR = "ddp_orch_one_line"

RESULT_FILE_NAME = "result.json"
DEVICE_CHOICES = ("auto", "cuda", "cpu")
# In the node's run directory: rank-<RANK> holds "<step> <time>", "<step> <time> <samples>"
# or "<step> <time> <samples or -> <compute_s> <data_s>" (the means since the last write).
PROGRESS_DIR = "progress"
HEARTBEAT_EVERY_S = 1.0
_last_heartbeat = [0.0]
_pace = [0.0, 0.0, 0]  # compute and data seconds since the last write, over this many steps


def heartbeat(step: int, samples: int | None = None, compute_s: float | None = None,
              data_s: float | None = None) -> None:
    """Record that this rank reached ``step``, having processed ``samples``
    training samples so far (cumulative, an int >= 0) where given, and spent
    ``compute_s`` seconds computing before the gradients' all-reduce and
    ``data_s`` waiting for its batch on this step where given (both or
    neither). A bad ``samples`` (negative, not an integer, a bool) or pair
    of times is left out. At most one small file write per
    HEARTBEAT_EVERY_S, holding the times' means since the last, so calling
    it every step costs nothing; the node agent reads these files and
    reports each rank's last step, its age, its samples and its times. The
    line is the step report's (``agent/worker/progress.py``), which a user's
    program imports
    (``tests/unit/agent/test_step_report.py`` holds the two to it)."""
    import math
    import time  # here: the controller imports this module and never calls this

    if RESULT_FILE_ENV not in os.environ:
        return
    if all(isinstance(t, numbers.Real) and not isinstance(t, bool) and math.isfinite(t)
           and t >= 0 for t in (compute_s, data_s)):
        _pace[0] += float(compute_s)
        _pace[1] += float(data_s)
        _pace[2] += 1
    now = time.monotonic()
    if now - _last_heartbeat[0] < HEARTBEAT_EVERY_S:
        return
    _last_heartbeat[0] = now
    pace, _pace[:] = list(_pace), [0.0, 0.0, 0]
    directory = os.path.join(os.path.dirname(os.environ[RESULT_FILE_ENV]), PROGRESS_DIR)
    path = os.path.join(directory, f"rank-{os.environ.get('RANK', '0')}")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(f"{int(step)} {time.time():.3f}{_fields(samples, pace)}\n")
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # progress reports are best effort; training goes on


def _fields(samples: object, pace: list) -> str:
    """What follows ``<step> <time>``: `` <samples>`` for a count (an integer
    >= 0, not a bool), and with the times of ``pace`` (compute and data
    seconds summed over its steps) `` <samples or -> <compute_s> <data_s>``,
    their means per step."""
    good = isinstance(samples, numbers.Integral) and not isinstance(samples, bool) \
        and samples >= 0
    counted = f" {int(samples)}" if good else ""
    if not pace[2]:
        return counted
    return f"{counted or ' -'} {pace[0] / pace[2]:.6f} {pace[1] / pace[2]:.6f}"


def restart_count() -> int:
    """This attempt's number (0 without ddp-orch, or before any restart)."""
    value = os.environ.get(RESTART_COUNT_ENV, "0")
    return int(value) if value.isdigit() else 0


def max_restarts() -> int:
    """How many whole-gang restarts this run may have (0 without ddp-orch)."""
    value = os.environ.get(MAX_RESTARTS_ENV, "0")
    return int(value) if value.isdigit() else 0


def write_json_atomic(path: str, payload: Any) -> None:
    """Write ``payload`` as JSON to ``path`` so readers see all of it or none.

    The data goes to a temporary file in the same directory (same file
    system), is flushed to disk, and is then renamed over ``path``.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    import tempfile  # imported here: the controller loads this module, a dry run never writes

    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2, sort_keys=True, allow_nan=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
