"""The rank plan: pure code from a ``ClusterSpec`` to what every node runs.

No I/O happens here. ``build_plan`` is what ``--dry-run`` renders, and
``resolve_plan`` fills in the two things only a launch can know (a free
master port and each node's home directory) and returns the same structure,
which the launcher then consumes. torchx's ``schedule(submit_dryrun(...))``
is the model.

Rank layout: nodes in file order get node ranks 0..N-1; global ranks are
prefix sums of the per-node process counts (3 + 4 -> ranks 0-2 and 3-6);
torchrun with the static rendezvous numbers them that way because each
node passes its own ``--node-rank`` and ``--nproc-per-node``.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from workloads import contract
from workloads.catalog import CATALOG, args_to_argv

from .spec import AUTO_PORT, ClusterSpec, SshSpec

TORCHRUN = ("-m", "torch.distributed.run")
# With it set, torchrun assumes every node has the same nproc and numbers
# heterogeneous layouts wrongly, so it is removed from every node's env.
UNSET_ENV = ("TORCH_ELASTIC_WORKER_IDENTICAL",)


@dataclass(frozen=True)
class RankPlan:
    rank: int
    node_rank: int
    host: str
    local_rank: int
    gpu: int | None


@dataclass(frozen=True)
class NodePlan:
    """Everything one node runs: where, with which environment, which argv."""

    node_rank: int
    host: str
    is_local: bool
    ssh: SshSpec
    python: str
    gpus: tuple[int, ...] | None
    first_rank: int
    nproc: int
    run_dir: str
    env: Mapping[str, str]
    unset_env: tuple[str, ...]
    argv: tuple[str, ...]

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)

    @property
    def code_dir(self) -> str:
        return f"{self.run_dir}/code"

    @property
    def result_file(self) -> str:
        return self.env[contract.RESULT_FILE_ENV]


@dataclass(frozen=True)
class RunPlan:
    run_id: str
    name: str
    world_size: int
    master_addr: str
    master_port: int | str  # AUTO_PORT until resolve_plan
    device: str
    workload: str  # a built-in name, or the script's file name
    script: str | None  # the user's script on this machine, if any
    nodes: tuple[NodePlan, ...]
    ranks: tuple[RankPlan, ...]

    @property
    def resolved(self) -> bool:
        return self.master_port != AUTO_PORT and not any(
            node.run_dir.startswith("~") for node in self.nodes)


def node_run_dir(spec: ClusterSpec, node_rank: int, run_id: str, local_run_dir: str) -> str:
    """Local nodes live inside the local run directory; remote ones under workdir.

    Each node gets its own directory even on a shared host or file system,
    so two "nodes" on one machine never write over each other.
    """
    if spec.nodes[node_rank].is_local:
        return f"{local_run_dir}/node-{node_rank}"
    return f"{spec.workdir}/runs/{run_id}/node-{node_rank}"


def build_plan(spec: ClusterSpec, *, run_id: str, local_run_dir: str) -> RunPlan:
    """The rank plan for ``spec``; pure, so dry-run and launch agree."""
    master_addr = spec.master_addr or _default_master(spec)
    device = "cpu" if any(n.procs is not None for n in spec.nodes) else spec.device
    starts = [0, *itertools.accumulate(node.nproc for node in spec.nodes)]
    nodes = []
    for k, node in enumerate(spec.nodes):
        run_dir = node_run_dir(spec, k, run_id, local_run_dir)
        env = dict(node.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, node.gpus)) if node.gpus is not None else ""
        env[contract.DEVICE_ENV] = device
        env[contract.RUN_ID_ENV] = run_id
        env[contract.NODE_RANK_ENV] = str(k)
        env[contract.RESULT_FILE_ENV] = f"{run_dir}/{contract.RESULT_FILE_NAME}"
        env["PYTHONPATH"] = f"{run_dir}/code"
        env["PYTHONUNBUFFERED"] = "1"  # worker lines reach their log files as printed
        argv = (node.python, *TORCHRUN,
                "--nnodes", str(len(spec.nodes)), "--node-rank", str(k),
                "--nproc-per-node", str(node.nproc),
                "--master-addr", master_addr, "--master-port", str(spec.master_port),
                "--rdzv-backend", "static", "--rdzv-id", run_id, "--max-restarts", "0",
                # Workers write to files; the supervisor relays them (WorkerLogs).
                "--log-dir", f"{run_dir}/torchrun", "--redirects", "3",
                *_entrypoint(spec, run_dir))
        nodes.append(NodePlan(
            node_rank=k, host=node.host, is_local=node.is_local, ssh=node.ssh,
            python=node.python, gpus=node.gpus, first_rank=starts[k], nproc=node.nproc,
            run_dir=run_dir, env=MappingProxyType(dict(sorted(env.items()))),
            unset_env=UNSET_ENV, argv=argv))
    ranks = tuple(
        RankPlan(rank=n.first_rank + i, node_rank=n.node_rank, host=n.host, local_rank=i,
                 gpu=n.gpus[i] if n.gpus is not None else None)
        for n in nodes for i in range(n.nproc))
    return RunPlan(run_id=run_id, name=spec.name, world_size=spec.world_size,
                   master_addr=master_addr, master_port=spec.master_port, device=device,
                   workload=spec.workload.name or spec.workload.script.rsplit("/", 1)[-1],
                   script=spec.workload.script, nodes=tuple(nodes), ranks=ranks)


def _default_master(spec: ClusterSpec) -> str:
    """Node 0's host; an all-local job uses the IPv4 loopback explicitly."""
    first = spec.nodes[0]
    return "127.0.0.1" if first.is_local else first.host


def _entrypoint(spec: ClusterSpec, run_dir: str) -> tuple[str, ...]:
    args = args_to_argv(spec.workload.args)
    if spec.workload.name is not None:
        return ("-m", CATALOG[spec.workload.name].module, *args)
    script_name = spec.workload.script.rsplit("/", 1)[-1]
    return (f"{run_dir}/script/{script_name}", *args)


def resolve_plan(plan: RunPlan, *, master_port: int, homes: Mapping[int, str]) -> RunPlan:
    """Fill in the launch-time facts: the master port and each node's ``~``.

    Pure as well: the caller finds the port and the home directories. Every
    argv word and env value is rewritten the same way, so nothing the
    dry-run showed changes except those two facts.
    """
    def fix(value: str, home: str) -> str:
        if value == "~" or value.startswith("~/"):
            return home + value[1:]
        return value

    nodes = []
    for node in plan.nodes:
        home = homes.get(node.node_rank, "~")
        argv = list(node.argv)
        port_at = argv.index("--master-port") + 1
        argv[port_at] = str(master_port)
        nodes.append(dataclasses.replace(
            node,
            run_dir=fix(node.run_dir, home),
            argv=tuple(fix(word, home) for word in argv),
            env=MappingProxyType({k: fix(v, home) for k, v in node.env.items()})))
    return dataclasses.replace(plan, master_port=master_port, nodes=tuple(nodes))
