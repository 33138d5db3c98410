"""What ``ddp-orch check`` reports, whoever checks: the agent, a scheduler or a
plugin. Its rows and each node's GPUs, apart from the checks that make them, so
that a scheduler's submit checks without loading the agents' checks."""

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


@dataclass(frozen=True)
class NodeGpus:
    """A node's GPUs as ``check`` shows them, and which the run would get now."""

    node_rank: int
    host: str
    driver: str | None
    gpus: tuple[dict, ...]
    apps: tuple[dict, ...]
    chosen: tuple[int, ...]
    free: tuple[int, ...]
    torch_sees: int | None  # None: torch not asked, or it sees none
    lock_dir: str | None = None  # where the node keeps its GPU locks
    notes: tuple[str, ...] = ()  # nvidia-smi's own warnings (it answered in part)
    unreported: tuple[str, ...] = ()  # health fields this node's nvidia-smi does not know
    ignore: tuple[str, ...] = ()  # the health rules the site relaxes (gpu_policy.ignore)
    exclude: tuple[int, ...] = ()  # the GPUs taken out by hand (gpu_policy.exclude)


@dataclass(frozen=True)
class Preflight:
    results: tuple[CheckResult, ...]
    gpus: tuple[NodeGpus, ...] = ()

    @property
    def ok(self) -> bool:
        """Nothing failed (warnings do not count)."""
        return all(r.ok for r in self.results)

    @property
    def warnings(self) -> int:
        return sum(r.ok and r.warning for r in self.results)
