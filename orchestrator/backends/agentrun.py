"""The run of an ``AgentBackend``, as the engine follows it. Apart from
``agentbackend.py`` so that the backend loads without the engine (a dry-run,
``ps``); this module loads only when a run starts or is reached again."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.fanout import on_all
from ..engine.run import RunHandle, node_records

if TYPE_CHECKING:
    from ..engine.agentlink import AgentHandle
    from ..plan.dryrun import DryRun
    from ..records.outcome import RunOutcome
    from ..records.rundir import RunDir
    from ..records.store import NodeRecord
    from ..transport.base import Transport
    from .agentbackend import AgentBackend


class AgentRun(RunHandle):
    """A run whose nodes' agents this controller holds open: the gang's channels,
    then the fetch's (an agent whose supervisor ended cleanly serves it)."""

    def __init__(self, backend: AgentBackend, info: DryRun, run: RunDir,
                 transports: dict[int, Transport], agents: dict[int, AgentHandle], *,
                 watching: bool = False, records: tuple[NodeRecord, ...] = (),
                 lines: int | None = None):
        super().__init__(info, run, watching=watching, channels=agents, records=records,
                         lines=lines,
                         dump_stacks=lambda: backend.stacks_of(info.plan.run_id, self.records))
        self.backend = backend
        self.transports = transports
        self.agents = agents

    def resolved(self, info: DryRun) -> None:
        """The dry-run with each node's launch-time facts (port, home)."""
        self.dryrun = info
        self.records = node_records(info)

    def fetch(self, outcome: RunOutcome) -> dict | None:
        reusable = {h.node.node_rank: agent for h in self.gang.handles
                    if (agent := h.release()) is not None}
        return self.backend.fetch_results(self.dryrun, self.transports, outcome, self.run,
                                          reusable, self._unreachable())

    def tidy(self, outcome: RunOutcome) -> None:
        """What a lost node left behind is ended (not when only observing)."""
        if not self.watching:
            self.backend.sweep_lost(self.dryrun, self.transports, outcome, self.run,
                                     silent=self._unreachable())

    def _unreachable(self) -> set[int]:
        return {h.node.node_rank for h in self.gang.handles if h.unreachable}

    def close(self, left: bool = False) -> None:
        """EOF to every agent: each exits, its supervisor tearing its run down
        first (a keeper goes on: it is not the agent's child)."""
        on_all(lambda k: self.agents[k].close(), list(self.agents))
        for transport in self.transports.values():
            transport.close()
