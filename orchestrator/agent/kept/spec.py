"""What a node's keeper is started with, typed: ``KeeperSpec``.

It crosses the wire as JSON and is checked before the keeper forks: a bad
spec is a ``SpecError`` naming the field, never a KeyError inside a daemon
nobody watches.
"""

from __future__ import annotations

import dataclasses

from ..node.spec import SpecError, SupervisorSpec
from ..wire import fields
from ..wire.owner import Holder, Owner


@dataclasses.dataclass(frozen=True)
class GangPort:
    """Node 0's gang port, where every other node's keeper links to the head."""

    addr: str  # the run's master address: what the other nodes reach node 0 at
    port: int  # 0 until node 0's keeper has bound it (its ``detach`` reply says it)
    token: str  # the run's random token; a hello without it is refused
    listen_note: str = ""  # node 0: how the port was bound, said once in its stream


@dataclasses.dataclass(frozen=True)
class KeeperSpec:
    supervisor: SupervisorSpec  # each attempt's, before ``keeper.attempt_spec``
    nnodes: int
    start_timeout_s: float  # every attempt's, and the gang's joining
    gang: GangPort
    max_restarts: int = 0
    hang_timeout_s: float | None = None  # the hang rule (``gangrule``); None: off

    @property
    def node_rank(self) -> int:
        return self.supervisor.node_rank

    @property
    def owner(self) -> Owner:
        """The run's owner, the keepers (attached: the controller's follower too)."""
        return self.supervisor.owner

    def to_dict(self) -> dict:
        return {"supervisor": self.supervisor.to_dict(), "nnodes": self.nnodes,
                "start_timeout_s": self.start_timeout_s,
                "gang": dataclasses.asdict(self.gang), "max_restarts": self.max_restarts,
                **({"hang_timeout_s": self.hang_timeout_s}
                   if self.hang_timeout_s is not None else {})}

    @classmethod
    def from_dict(cls, data: object) -> "KeeperSpec":
        """The spec ``data`` describes; SpecError naming the first bad field."""
        if not isinstance(data, dict):
            raise SpecError(f"bad keeper spec: not an object: {str(data)[:200]}")
        why = fields.why_bad(data, _FIELDS)
        if why is not None:
            raise SpecError(f"bad keeper spec: {why}")
        unknown = fields.unknown(data, _FIELDS, "supervisor")
        if unknown:
            raise SpecError(f"bad keeper spec: unknown field(s) {', '.join(map(repr, unknown))}")
        gang = data["gang"]
        supervisor = SupervisorSpec.from_dict(data.get("supervisor"))
        foreign = supervisor.owner.not_held_by(Holder.KEEPERS)
        if foreign:
            raise SpecError(f"bad keeper spec: {foreign}")
        return cls(supervisor, data["nnodes"], float(data["start_timeout_s"]),
                   GangPort(gang["addr"], gang["port"], gang["token"],
                            gang.get("listen_note", "")),
                   data.get("max_restarts", 0),
                   None if data.get("hang_timeout_s") is None
                   else float(data["hang_timeout_s"]))


def _gang(value: object) -> bool:
    return isinstance(value, dict) and isinstance(value.get("addr"), str) \
        and fields.PORT.check(value.get("port")) and isinstance(value.get("token"), str) \
        and isinstance(value.get("listen_note", ""), str)


# A keeper spec's fields beside its supervisor's (``fields.first_bad``; "?": may be absent).
_FIELDS = {
    "nnodes": fields.count(1),
    "start_timeout_s": fields.seconds(positive=True), "max_restarts?": fields.count(0),
    "hang_timeout_s?": fields.Field(fields.optional(fields.seconds(positive=True)).check,
                                    "seconds or null"),
    "gang": fields.Field(_gang, "{addr, port, token}"),
}
