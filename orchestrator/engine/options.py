"""How to launch, from the command line. Stdlib only, so the CLI and backends
name the options without loading the engine: ``--help``, ``ps`` and
``up --dry-run`` stay fast."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """How to launch, from the command line; the same for every backend."""

    grace_s: float = 10.0  # SIGTERM to SIGKILL on the nodes
    start_timeout_s: float = 300.0  # for every node to join the rendezvous
    accept_new_host_keys: bool = False
    check_timeout_s: float = 60.0
    queue_timeout_s: float | None = None  # a scheduler's queue: how long a job may wait
    hang_timeout_s: float | None = None  # no rank's progress this long: a hang (off: None)
    detach: bool = False  # the nodes keep the run; launch returns once every node started
    max_restarts: int = 0  # whole-gang restarts after a failure (agent/kept/restarts.py's rule)
    allow_busy_gpus: bool = False  # listed GPUs someone else uses: go anyway
    wait_gpus_s: float | None = None  # wait for free GPUs this long (None: the file's gpu_policy)
    # who ends a run through ``cancel`` (``down``: "stopped by `ddp-orch down` from HOST"),
    # for the nodes' records of how it ended
    stopped_by: str = ""
