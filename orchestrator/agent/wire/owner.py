"""Who owns a run: the one answer every layer reads, decided once.

A run is held by one of three (``Holder``):

* the **controller** (``ddp-orch up``, attached): it supervises every node
  over its channel, judges the gang's rule and tears the gang down; its
  nodes stop when it goes;
* the nodes' **keepers** (``agent/kept/``): they hold the gang and its rule
  themselves, for gang restarts (``--max-restarts``) or ``--detach``;
* a **scheduler** (Slurm): its job holds the nodes, their liveness and their
  signals; the controller submits, follows and cancels.

``detached`` says whether the controller leaves once every node has started
(``up --detach``); the run then goes on without it, and ``attach`` follows it.

``Owner.decide`` is the one place this is decided (from the backend's
capabilities and the options: ``LaunchBackend.owner``). The result is carried
in the dry-run, recorded in ``state.json``, and sent to the nodes as it is,
in the supervisor's spec, the keeper's spec and a scheduler's job file
(``to_json``); the gang's watch loop, the supervisor and the keepers read it,
and nothing re-derives it.

Standard library only: it ships with the agent.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any


class Holder(str, Enum):
    """Who keeps a run alive, and so what ends it besides torchrun."""

    __str__ = str.__str__  # the word itself, in JSON and f-strings alike

    CONTROLLER = "controller"
    KEEPERS = "keepers"
    SCHEDULER = "scheduler"


class OwnerError(ValueError):
    """An owner that is not one (a hand-edited record, a spec from elsewhere)."""


@dataclasses.dataclass(frozen=True)
class Owner:
    holder: Holder = Holder.CONTROLLER
    detached: bool = False  # the controller leaves once every node has started

    def __post_init__(self) -> None:
        if self.detached and self.holder is Holder.CONTROLLER:
            raise OwnerError("a run the controller holds cannot be detached from it")

    @classmethod
    def decide(cls, *, scheduler: bool, detach: bool, max_restarts: int) -> Owner:
        """A scheduler's backend: its job holds the run. Otherwise gang
        restarts or ``--detach`` need the nodes' keepers, since the
        controller may be gone when the gang must be restarted or stopped;
        else the controller holds it."""
        if scheduler:
            return cls(Holder.SCHEDULER, detach)
        if detach or max_restarts > 0:
            return cls(Holder.KEEPERS, detach)
        return cls()

    @property
    def ends_with_controller(self) -> bool:
        """Does the run stop when its controller goes (Ctrl-C, kill, a lost
        link)? An attached run the controller or the keepers hold: yes. A
        detached run, or a scheduler's job: no, it goes on."""
        return not self.detached and self.holder is not Holder.SCHEDULER

    @property
    def peer_timeout_applies(self) -> bool:
        """Is a node's silence a loss? Only where the controller pings it.
        A scheduler owns its nodes' liveness (and a job's node streams come
        through a shared file system, which may hold bytes back for as long
        as the check would wait); the keepers judge their own gang."""
        return self.holder is Holder.CONTROLLER

    def not_held_by(self, holder: Holder) -> str:
        """Why a spec meant for ``holder``'s nodes (a keeper's, a scheduler
        job's) must be refused for this run; "" when ``holder`` owns it."""
        return "" if self.holder is holder else f"the run's owner is {self}, not the {holder}"

    def __str__(self) -> str:
        return f"{self.holder.value}, detached" if self.detached else self.holder.value

    def to_json(self) -> dict[str, Any]:
        return {"holder": self.holder.value, "detached": self.detached}

    @classmethod
    def from_json(cls, data: Any) -> Owner:
        """An owner as ``to_json`` wrote it; ``OwnerError`` names what is wrong."""
        if not isinstance(data, dict) or set(data) != {"holder", "detached"}:
            raise OwnerError(f"an owner is {{holder, detached}}, not {data!r}")
        holder, detached = data["holder"], data["detached"]
        if holder not in {h.value for h in Holder}:
            raise OwnerError(f"'holder' is {holder!r}: one of "
                             f"{', '.join(h.value for h in Holder)}")
        if not isinstance(detached, bool):
            raise OwnerError(f"'detached' is {detached!r}: true or false")
        return cls(Holder(holder), detached)
