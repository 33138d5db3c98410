"""A run's states: one word for each, from a node's keeper through
``state.json`` to every command. Here, at the bottom, as the keepers on the
nodes write them too."""

from __future__ import annotations

from enum import Enum


class RunState(str, Enum):
    STARTING = "starting"
    PENDING = "pending"  # a scheduler's job, submitted, waiting in its queue for nodes
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    # state.json is there but cannot be read (cut short, edited by hand, a
    # field out of its domain): listed, never guessed at (``store.read_record``)
    DAMAGED = "damaged"

    @property
    def live(self) -> bool:
        return self in (RunState.STARTING, RunState.PENDING, RunState.RUNNING)

    def __str__(self) -> str:
        return self.value


# What a keeper records of its run (``keeper.json``, node 0's attempts).
KEPT_STATES = (RunState.RUNNING, RunState.SUCCEEDED, RunState.FAILED, RunState.INTERRUPTED)
