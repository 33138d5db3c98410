"""The Slurm backend: it fills in the scheduler base (``backend``); its
commands and their parsing (``ctl``) and its preflight (``check``)."""

from .backend import Backend  # noqa: F401 (the registry's name for it)
