"""The rank plan's types: frozen facts about a run, with no backend in them:
they say who runs what, never how a backend reaches a node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from workloads import contract

from ..config.spec import AUTO_PORT


# Where each node's copy of the user's code directory (``workload.code``)
# lives in its run directory (``NodePlan.code_rel``); the built-in workloads
# come in ``code/``, with the shim.
PROJECT_DIR = "project"
BUILTIN_DIR = "code"


@dataclass(frozen=True)
class Entrypoint:
    """What every worker runs as torchrun runs it: ``argv`` is what you would
    type after torchrun in your project's root (``train.py --lr 0.1``)."""

    module: str | None
    script: str | None
    args: tuple[str, ...]

    def argv(self) -> tuple[str, ...]:
        head = ("-m", self.module) if self.module is not None else (self.script or "",)
        return (*head, *self.args)


@dataclass(frozen=True)
class GpuChoice:
    """The GPUs a node's agent chose at launch, in the ranks' order."""

    indices: tuple[int, ...]
    uuids: tuple[str, ...] = ()
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class RankPlan:
    rank: int
    node_rank: int
    host: str
    local_rank: int
    gpu: int | None
    gpu_uuid: str | None = None  # as the node's nvidia-smi names it, once launched
    gpu_model: str | None = None


@dataclass(frozen=True)
class NodePlan:
    """One node: where, how many processes on which devices, with which env."""

    node_rank: int
    host: str
    python: str
    gpus: tuple[int, ...] | None
    first_rank: int
    nproc: int
    run_dir: str
    env: Mapping[str, str]
    unset_env: tuple[str, ...]
    # The code root, relative to ``run_dir``: where the uploaded code lands on
    # the node (``project/``: the user's ``workload.code``; ``code/`` for the
    # built-ins). Every worker starts there (the supervisor's cwd for
    # torchrun), setup runs there and ``outputs`` are read from there.
    code_rel: str = BUILTIN_DIR
    # ``gpus: all | free | free:N``: what the node's agent chooses at launch
    # (``gpus`` is None until then); kept after, to say how they were chosen.
    gpu_request: str | None = None
    # The GPUs' UUIDs and models, in ``gpus`` order, where nvidia-smi answered at launch.
    gpu_uuids: tuple[str, ...] = ()
    gpu_models: tuple[str, ...] = ()
    # One process over all the node's GPUs (compare's DataParallel baseline).
    one_process: bool = False
    # The names in ``env`` the cluster file gave (``env:``, the node's over
    # it), not ddp-orch's own: the env that ``setup: when_changed`` weighs
    # (ddp-orch's own hold the run id and its paths, new every run).
    user_env: tuple[str, ...] = ()

    @property
    def gpus_pending(self) -> bool:
        """Asked for by what it wants and not chosen yet: a dry-run's node."""
        return self.gpu_request is not None and self.gpus is None

    @property
    def nproc_known(self) -> bool:
        """False while ``gpus: all`` or ``free`` waits for the launch (``free:N`` is N)."""
        return not (self.gpus_pending and self.gpu_request in ("all", "free"))

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)

    @property
    def is_local(self) -> bool:
        return self.host == "localhost"

    @property
    def code_dir(self) -> str:
        return f"{self.run_dir}/{BUILTIN_DIR}"

    @property
    def code_root(self) -> str:
        """The node's copy of the uploaded code: the one helper for a node's code root."""
        return f"{self.run_dir}/{self.code_rel}"

    @property
    def result_file(self) -> str:
        return self.env[contract.RESULT_FILE_ENV]


@dataclass(frozen=True)
class RunPlan:
    run_id: str
    name: str
    backend: str
    world_size: int
    master_addr: str
    master_port: int | str  # AUTO_PORT until resolve_plan
    device: str
    workload: str  # a built-in name, the module, or the script's path in the code directory
    code: str | None  # the user's code directory on this machine, uploaded to every node
    entrypoint: Entrypoint
    nodes: tuple[NodePlan, ...]
    ranks: tuple[RankPlan, ...]
    # ``setup:``, each command as the argv every node runs in its code root
    # (a string becomes ``sh -c STRING``), within ``setup_timeout_s`` in all.
    setup: tuple[tuple[str, ...], ...] = ()
    setup_timeout_s: float = 0.0
    # ``setup: {when_changed}``: files under the code root; a node skips its
    # setup while they, the commands, its env and python are as at its last
    # successful one (``agent/node/setupstamp.py``). (): setup runs every time.
    setup_when_changed: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()  # globs under node 0's code root, brought home

    @property
    def resolved(self) -> bool:
        return self.master_port != AUTO_PORT and not any(
            node.run_dir.startswith("~") or node.gpus_pending for node in self.nodes)

    @property
    def world_size_known(self) -> bool:
        """False while a node's ``gpus: all`` or ``free`` waits for the launch to say how many."""
        return all(node.nproc_known for node in self.nodes)
