"""Names and bounds that the cluster file and the command line share.

It imports nothing, so the CLI builds its options (``--help``, ``ps``) without
paying for ``config.spec``'s dataclasses; plugins' names are read only when needed.
"""

# The registry of built-in launch backends, the one list of them: a name
# (what a cluster file's ``backend:`` and ``--backend`` say) -> the module
# that defines its ``Backend`` class, and the module of its own top-level
# block of a cluster file (``config/blocks/``), if it has one.
BUILTIN_BACKENDS = {
    "local": ("orchestrator.backends.local", None),
    "ssh": ("orchestrator.backends.ssh", None),
    "slurm": ("orchestrator.backends.slurm", "orchestrator.config.blocks.slurm"),
}
BACKENDS = tuple(BUILTIN_BACKENDS)
# Backends from outside the tree: installed distributions' entry points in
# this group, ``name = "package.module:BackendClass"``, as torchx finds its
# schedulers. Only their names are read until one is named (``backends``).
PLUGIN_GROUP = "ddp_orch.backends"
_plugins: dict | None = None


def plugin_backends() -> dict:
    """The installed entry points of ``PLUGIN_GROUP`` by name, none loaded
    (a built-in's name is the built-in's: a plugin cannot take it)."""
    global _plugins
    if _plugins is None:
        from importlib.metadata import entry_points

        _plugins = {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)
                    if ep.name not in BUILTIN_BACKENDS}
    return _plugins


def backend_names() -> tuple[str, ...]:
    """Every backend a cluster file may name here: the built-ins, then the plugins'."""
    return BACKENDS + tuple(sorted(plugin_backends()))
# Progress reaches the controller with the agents' heartbeats (every 5 s), so a
# shorter hang timeout would take a quiet but healthy run for a hung one.
MIN_HANG_TIMEOUT = 10
MAX_HANG_TIMEOUT = 7 * 86400
MAX_RESTARTS = 100  # whole-gang restarts of one run
MAX_GPU_WAIT = 7 * 86400
# The collective smoke test's bound: seconds each pair of nodes, and then the
# whole gang, may take (``check --collective``, ``up --preflight collective``).
COLLECTIVE_BOUND_S = 30
