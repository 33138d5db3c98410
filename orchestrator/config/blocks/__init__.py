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
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..limits import BUILTIN_BACKENDS

# From the one registry of backends (``limits.BUILTIN_BACKENDS``): each
# built-in backend's block module, if it has one.
BLOCK_MODULES = tuple(block for _module, block in BUILTIN_BACKENDS.values() if block)


def blocks() -> tuple[ModuleType, ...]:
    """Every backend block module, in the registry's order."""
    return tuple(importlib.import_module(name) for name in BLOCK_MODULES)


def top_keys(core: tuple[str, ...]) -> tuple[str, ...]:
    """The cluster file's top-level keys: ``core``, each block's key after its ``AFTER``."""
    keys = list(core)
    for block in blocks():
        keys.insert(keys.index(block.AFTER) + 1, block.KEY)
    return tuple(keys)
