"""What a backend will run, before it runs it: the dry-run is this object.

A backend's ``dryrun(plan)`` builds a ``DryRun``; ``--dry-run`` renders it
(``render.py``) and ``launch`` consumes the same object, so what the user
previewed is what runs. (torchx calls it ``AppDryRunInfo``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .model import NodePlan, RunPlan


@dataclass(frozen=True)
class NodeLaunch:
    """One node's command as its backend will start it."""

    node: NodePlan
    where: str  # how the backend reaches it: "local subprocess", "ssh user@host:22"
    env: Mapping[str, str]
    unset_env: tuple[str, ...]
    argv: tuple[str, ...]
    connection: Mapping[str, Any] = field(default_factory=dict)  # the backend's settings
    # ``setup:`` as this node runs it, each an argv, in ``node.code_root``
    # before torchrun (``agent/nodesetup.py``); the plan's timeout holds for all.
    setup: tuple[tuple[str, ...], ...] = ()
    setup_timeout_s: float = 0.0

    @property
    def node_rank(self) -> int:
        return self.node.node_rank

    @property
    def host(self) -> str:
        return self.node.host

    @property
    def run_dir(self) -> str:
        return self.node.run_dir


@dataclass(frozen=True)
class DryRun:
    """A backend's request for a whole run; ``extras`` holds what only that
    backend has (a batch script, say), rendered after the nodes."""

    backend: str
    plan: RunPlan
    nodes: tuple[NodeLaunch, ...]
    source: str = ""
    notes: tuple[str, ...] = ()
    extras: Mapping[str, str] = field(default_factory=dict)
    # Who keeps the run alive (``LIVENESS``), and its whole-gang restarts.
    liveness: str = "attached"
    max_restarts: int = 0


LIVENESS = {
    "attached": "the nodes stop when this controller goes (Ctrl-C, kill, a lost link)",
    "detached": "the nodes' agents keep the run and its gang without a controller; "
                "`ddp-orch attach RUN` follows it",
    "slurm": "Slurm keeps the job; Ctrl-C on `up` cancels it",
}
