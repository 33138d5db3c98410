"""The Slurm backend: it fills in the scheduler base."""

from .backend import Backend  # noqa: F401 (the registry's name for it)
