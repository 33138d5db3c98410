"""Names and bounds that the cluster file and the command line share.

It imports almost nothing, so the CLI builds its options (``--help``, ``ps``)
without paying for ``config.spec``'s dataclasses; plugins' names are read
only when needed.
"""

import functools

# The words a cluster file's ``backend:`` (and ``--backend``) may say: the
# built-in backends (the registry, ``backends/__init__.py``, loads each from
# the module of its name), then the plugins' names.
BACKENDS = ("local", "ssh", "slurm")
# Installed distributions' entry points, as torchx finds its schedulers:
# ``name = "package.module:BackendClass"`` in PLUGIN_GROUP, and a plugin's own
# top-level block of a cluster file, ``key = "package.module"``, in BLOCK_GROUP.
PLUGIN_GROUP = "ddp_orch.backends"
BLOCK_GROUP = "ddp_orch.blocks"


@functools.cache
def entry_points_of(group: str) -> dict:
    """The installed entry points of ``group`` by name, none loaded. Read once,
    and only when asked: a file naming only built-ins never pays for it."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=group)}


def distribution_of(entry) -> str:
    """``name version`` of the distribution an entry point comes from ("" if unknown)."""
    dist = getattr(entry, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else ""


def backend_names() -> tuple[str, ...]:
    """Every backend a cluster file may name here: the built-ins, then the
    plugins' (a built-in's name is the built-in's)."""
    return BACKENDS + tuple(sorted(set(entry_points_of(PLUGIN_GROUP)) - set(BACKENDS)))


# Progress reaches the controller with the agents' heartbeats (every 5 s), so a
# shorter hang timeout would take a quiet but healthy run for a hung one.
MIN_HANG_TIMEOUT = 10
MAX_HANG_TIMEOUT = 7 * 86400
MAX_RESTARTS = 100  # whole-gang restarts of one run
MAX_GPU_WAIT = 7 * 86400
# The collective smoke test's bound: seconds each pair of nodes, and then the
# whole gang, may take (``check --collective``, ``up --preflight collective``).
COLLECTIVE_BOUND_S = 30
