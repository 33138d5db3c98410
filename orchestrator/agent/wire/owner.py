"""Who owns a run: the one answer every layer reads, decided once.

A run is held by the **controller** (``ddp-orch up``, attached: its nodes
stop when it goes), the nodes' **keepers** (for ``--max-restarts`` or
``--detach``: they hold the gang themselves), or a **scheduler** (Slurm:
its job holds the nodes, their liveness and signals). ``detached``: the
controller leaves once every node has started.

``Owner.decide`` decides it once; the result travels in the dry-run,
``state.json`` and every node's spec, and nothing re-derives it.
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
        """A scheduler's job holds the run; else restarts or ``--detach`` need
        the keepers, as the controller may be gone when the gang must be
        restarted or stopped; else the controller holds it."""
        if scheduler:
            return cls(Holder.SCHEDULER, detach)
        if detach or max_restarts > 0:
            return cls(Holder.KEEPERS, detach)
        return cls()

    @property
    def ends_with_controller(self) -> bool:
        """Does the run stop when its controller goes? Only an attached run
        that the controller or the keepers hold."""
        return not self.detached and self.holder is not Holder.SCHEDULER

    @property
    def pings(self) -> bool:
        """Does the controller ping the nodes, and so is silence a loss both
        ways? Its words reach each supervisor on stdin, and PEER_TIMEOUT_S
        without them stops the run there. Only where the controller holds
        the run: a scheduler owns its nodes' liveness (and its shared files
        may hold bytes back), and the keepers judge their own gang."""
        return self.holder is Holder.CONTROLLER

    @property
    def keepers_hold(self) -> bool:
        """Do the nodes' keepers hold the gang? They judge it, restart it and
        handle the supervisors' signals; the controller starts or follows them."""
        return self.holder is Holder.KEEPERS

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
