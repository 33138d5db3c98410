"""What a backend will run, before it runs it: ``--dry-run`` renders a ``DryRun``
and ``launch`` consumes the same object, so what the user previewed is what runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..agent.wire.owner import Holder, Owner
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
    # before torchrun (``agent/node/nodesetup.py``); the plan's timeout holds for all.
    setup: tuple[tuple[str, ...], ...] = ()
    setup_timeout_s: float = 0.0
    setup_when_changed: tuple[str, ...] = ()  # skipped while unchanged (``RunPlan``'s)

    @property
    def node_rank(self) -> int:
        return self.node.node_rank

    @property
    def host(self) -> str:
        return self.node.host

    @property
    def run_dir(self) -> str:
        return self.node.run_dir

    def header(self) -> str:
        """``node 1  host  ranks 3-6 (4 processes, ssh user@host:22)``."""
        plan = self.node
        if plan.gpus_pending:
            return (f"node {plan.node_rank}  {plan.host}  ranks chosen at launch (gpus: "
                    f"{plan.gpu_request}, {self.where})")
        last = plan.first_rank + plan.nproc - 1
        ranks = f"rank {last}" if plan.nproc == 1 else f"ranks {plan.first_rank}-{last}"
        return (f"node {plan.node_rank}  {plan.host}  {ranks} "
                f"({plan.nproc} process{'es' if plan.nproc != 1 else ''}, {self.where})")


@dataclass(frozen=True)
class ByHand:
    """How to reach the nodes by hand, as shell lines (``--format shell``); shown
    only, launch never reads it. ``reach`` runs a command on a node from here
    (none: it shares this machine's files), ``step`` from the shell ``allocate``
    opens; ``master_host`` prints node 0's address there, known only then."""

    reach: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    allocate: tuple[str, ...] = ()
    step: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    master_host: tuple[str, ...] = ()


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
    # Who owns the run (``agent/wire/owner.py``), decided once by the
    # backend (``LaunchBackend.owner``), in words for the dry-run
    # (``owner_words``), and its whole-gang restarts.
    owner: Owner = Owner()
    owner_words: str = ""
    max_restarts: int = 0
    by_hand: ByHand = field(default_factory=ByHand)


def owner_words(owner: Owner, scheduler: str = "") -> str:
    """What ``owner`` means for this run, in words, for the dry-run."""
    if owner.holder is Holder.SCHEDULER:
        return scheduler + ("; `up` leaves once every node runs, `ddp-orch attach RUN` follows "
                            "it and `ddp-orch down RUN` cancels it" if owner.detached
                            else "; Ctrl-C on `up` cancels it")
    if owner.detached:
        return ("the nodes' keepers hold the run and its gang without a controller; "
                "`ddp-orch attach RUN` follows it")
    if owner.holder is Holder.KEEPERS:
        return ("the nodes' keepers hold the gang and its restarts, and stop it when this "
                "controller goes (Ctrl-C, kill, a lost link)")
    return "the nodes stop when this controller goes (Ctrl-C, kill, a lost link)"
