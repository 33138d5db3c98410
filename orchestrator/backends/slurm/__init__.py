"""The Slurm backend: Slurm places and starts the nodes (``backend``); its
commands and their parsing (``ctl``), its preflight (``check``), and a job's
state and each node's stream (``job``)."""

from .backend import Backend  # noqa: F401 (the registry's name for it)
