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
* ``DDP_ORCH_DEVICE``: ``auto``, ``cuda`` or ``cpu``, from the cluster file.
  ``cpu`` means gloo on the CPU even where GPUs are visible.
"""

from __future__ import annotations

import json
import os
from typing import Any

RESULT_FILE_ENV = "DDP_ORCH_RESULT_FILE"
RUN_ID_ENV = "DDP_ORCH_RUN_ID"
NODE_RANK_ENV = "DDP_ORCH_NODE_RANK"
DEVICE_ENV = "DDP_ORCH_DEVICE"

RESULT_FILE_NAME = "result.json"
DEVICE_CHOICES = ("auto", "cuda", "cpu")


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
