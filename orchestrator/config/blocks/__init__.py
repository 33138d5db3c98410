"""The backends' own top-level blocks of a cluster file (``slurm:``), one
module each, so a backend adds its block without editing the loader or the
schema (they iterate ``blocks()``). A block module defines:

* ``KEY``; ``AFTER``, the key it follows; ``BACKEND``, chosen when the
  block is given and ``backend:`` is not;
* ``Spec`` (``Spec()`` when the block is absent) and ``load(field)``;
* ``PLACES_NODES``: whether ``nodes: {count: N}`` chooses this backend;
  ``PLACED_WORDS`` and ``placed_host(k)`` (node K until the job names it);
* ``check_layout(spec, top, node_keys)`` and ``schema_rules(given,
  localhost, backends)``: its rules between fields, for the loader and the
  schema; ``schema(mapping)``: its ``$defs[KEY]``;
* ``WORKDIR_UNUSED``: why ``workdir:`` reaches no node ("" when it does).

These modules import nothing above ``config``: config sits below the backends.
A plugin brings its own block the same way, as an entry point in
``ddp_orch.blocks`` (``KEY = "package.module"``); it is read only for a file
that names a plugin's backend or a key the built-ins do not know.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ...errors import ConfigError
from ..limits import BLOCK_GROUP, distribution_of, entry_points_of

# The built-in backends' blocks, one module each here.
BLOCK_MODULES = ("orchestrator.config.blocks.slurm",)
# What a block module must define (a plugin's is checked for it when loaded).
NEEDS = ("KEY", "AFTER", "BACKEND", "Spec", "load", "PLACES_NODES", "PLACED_WORDS",
         "placed_host", "check_layout", "schema_rules", "schema", "WORKDIR_UNUSED")


def blocks(plugins: bool = False) -> tuple[ModuleType, ...]:
    """Every backend block module: the built-ins', then, with ``plugins``, the
    installed plugins' (entry points in ``BLOCK_GROUP``, ``key = "pkg.module"``)."""
    found = tuple(importlib.import_module(name) for name in BLOCK_MODULES)
    if plugins:
        found += tuple(_plugin_block(name, ep, found)
                       for name, ep in sorted(entry_points_of(BLOCK_GROUP).items()))
    return found


def _plugin_block(name: str, entry, builtin: tuple[ModuleType, ...]) -> ModuleType:
    """A plugin's block module, refused by name where it does not fit."""
    origin = distribution_of(entry) or entry.value
    try:
        module = entry.load()
    except Exception as exc:  # noqa: BLE001 (whatever a plugin raises, said as its fault)
        raise ConfigError(f"the cluster-file block {name!r} of {origin} could not be loaded: "
                          f"{type(exc).__name__}: {exc}", hint="reinstall the plugin, or "
                          "ask its authors") from None
    missing = [attr for attr in NEEDS if not hasattr(module, attr)]
    if missing or module.KEY != name or name in {b.KEY for b in builtin}:
        why = (f"it lacks {', '.join(missing)}" if missing else
               f"its KEY is {getattr(module, 'KEY', None)!r}, not its entry point's name"
               if module.KEY != name else "a built-in block has that key")
        raise ConfigError(f"the cluster-file block {name!r} of {origin} does not fit: {why}",
                          hint="see docs/adding-a-backend.md, on a plugin's own block")
    return module


def top_keys(core: tuple[str, ...], plugins: bool = False) -> tuple[str, ...]:
    """The cluster file's top-level keys: ``core``, each block's key after its ``AFTER``."""
    keys = list(core)
    for block in blocks(plugins):
        keys.insert(keys.index(block.AFTER) + 1 if block.AFTER in keys else len(keys),
                    block.KEY)
    return tuple(keys)
