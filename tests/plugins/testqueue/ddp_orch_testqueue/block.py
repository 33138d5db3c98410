"""``testqueue:``: the plugin's own block of a cluster file (an entry point
in ``ddp_orch.blocks``), read by ddp-orch's loader and schema like the
built-in ``slurm:``. ``hold: true`` holds each job in the queue until its
``hold`` file goes."""

from __future__ import annotations

from dataclasses import dataclass

KEY = "testqueue"
AFTER = "backend"
BACKEND = "testqueue"
PLACES_NODES = False
PLACED_WORDS = ""
WORKDIR_UNUSED = "the test queue runs every node on this machine, in the run directory"
KEYS = ("hold",)


def placed_host(node_rank):
    return f"<testqueue node {node_rank}>"


@dataclass(frozen=True)
class Spec:
    hold: bool = False


def load(field):
    entries = field.mapping(KEYS)
    hold = entries["hold"].scalar() if "hold" in entries else False
    if not isinstance(hold, bool):
        raise entries["hold"].error(f"hold is {hold!r}: true or false")
    return Spec(hold=hold)


def check_layout(spec, top, node_keys):
    """The queue runs on this machine: nothing more to check."""


def schema_rules(given, localhost, backends):
    return []


def schema(mapping):
    return mapping(KEYS, {"hold": {"type": "boolean", "default": False,
                                   "description": "Hold each job in the queue until its hold "
                                                  "file goes."}},
                   "testqueue", "The test queue's settings.")
