"""One row of ``ddp-orch check``, whoever makes it: the agent, a scheduler or a plugin."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckResult:
    """One row of ``ddp-orch check``; ``node_rank`` -1 (``host`` "*") is about
    the whole cluster. A warning passes (``ok``) but is shown."""

    node_rank: int
    host: str
    check: str
    ok: bool
    detail: str
    warning: bool = False
