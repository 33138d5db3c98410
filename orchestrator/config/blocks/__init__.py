"""The backends' own top-level blocks of a cluster file (``slurm:``), one
module each, so a backend adds its block without editing the loader or the
schema: they iterate ``blocks()``.

A block module (``config/blocks/<name>.py``) defines:

* ``KEY``: its top-level key; ``AFTER``: the key it follows in the file's
  key order (``loader.TOP_KEYS``, the schema's properties); ``BACKEND``: the
  backend it configures (a name in ``limits.BUILTIN_BACKENDS``), chosen when the block
  is given and ``backend:`` is not;
* ``Spec``: the validated block (``ClusterSpec.blocks[KEY]``), and
  ``load(field)`` that reads it from the file, every error at its line;
  ``Spec()`` is the block when the backend is used without it;
* ``PLACES_NODES``: whether ``nodes: {count: N}`` (the backend places the
  nodes) chooses this backend, ``PLACED_WORDS``: that form, in words, and
  ``placed_host(k)``: what node K is called until the job names its host;
* ``check_layout(spec, top, node_keys)``: the loader's rules of this
  backend, between fields; ``WORKDIR_UNUSED``: why ``workdir:`` reaches no
  node under it ("" when it does);
* ``schema(mapping)``: its JSON-schema fragment (``$defs[KEY]``), and
  ``schema_rules(given, localhost, backends)``: its rules between fields.

Config sits below the backends: these modules import nothing above
``config``; the backend imports its block's ``Spec`` from here.
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
    """The cluster file's top-level keys: ``core`` with each block's key
    after the key it follows (``AFTER``)."""
    keys = list(core)
    for block in blocks():
        keys.insert(keys.index(block.AFTER) + 1, block.KEY)
    return tuple(keys)
