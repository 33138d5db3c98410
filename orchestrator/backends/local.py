"""The local backend: every node a subprocess here, with the same agent, gang and
records as SSH, so a heterogeneous layout can be rehearsed on one machine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from ..plan.model import NodePlan
from .agentbackend import AgentBackend
from .base import Capabilities

if TYPE_CHECKING:  # (a dry run starts no transport)
    from ..transport.base import Transport


class Backend(AgentBackend):
    name = "local"
    can = Capabilities(this_machine=True)

    def transport(self, node_rank: int, host: str, connection: Mapping[str, Any]) -> Transport:
        from ..transport.local import LocalTransport

        return LocalTransport(host)

    def where(self, node: NodePlan) -> str:
        return "local subprocess"
