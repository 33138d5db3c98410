"""Names and bounds that the cluster file and the command line share.

The CLI builds its options (``--backend``, ``--hang-timeout``,
``--max-restarts``, ``--wait-gpus``) from these before it knows whether the
command will read a cluster file at all, so this module imports nothing:
``ddp-orch --help`` and ``ps`` must not pay for ``config.spec``'s dataclasses.
"""

# The launch backends a cluster file may name (``orchestrator/backends/<name>.py``).
BACKENDS = ("local", "ssh", "slurm")
# Progress reaches the controller with the agents' heartbeats (every 5 s), so a
# shorter hang timeout would take a quiet but healthy run for a hung one.
MIN_HANG_TIMEOUT = 10
MAX_HANG_TIMEOUT = 7 * 86400
MAX_RESTARTS = 100  # whole-gang restarts of one run
MAX_GPU_WAIT = 7 * 86400
