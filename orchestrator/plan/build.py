"""The rank plan: pure code from a ``ClusterSpec`` to what every node runs;
``resolve_plan`` fills in only what a launch knows. Global ranks are prefix
sums of the nodes' process counts, in file order.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from types import MappingProxyType
from typing import Any, Mapping

from workloads import contract

from ..agent.node.outputsteps import PATTERN_ENV as PROGRESS_PATTERN_ENV
from ..agent.node.ompthreads import AT_LAUNCH, OMP_VAR, resolve_threads
from ..config.catalog import Catalog
from ..config.spec import ClusterSpec, NodeSpec, WorkloadSpec
from .model import (BUILTIN_DIR, PROJECT_DIR, Entrypoint, GpuChoice, NodePlan, RankPlan,
                    RunPlan)
from .network import interface_env, resolve_interfaces

# With it set, torchrun assumes every node has the same nproc and numbers
# heterogeneous layouts wrongly, so it is removed from every node's env.
UNSET_ENV = ("TORCH_ELASTIC_WORKER_IDENTICAL",)
# PyTorch's flight recorder: on a collective timeout (NCCL) or when asked (the
# hang watchdog), each rank dumps its recent collectives to <run dir>/
# nccl_trace_rank_<RANK>, fetched with the run (``NCCL_TRACE_PREFIX``). Set
# for every run unless the user set them.
NCCL_TRACE_PREFIX = "nccl_trace_rank_"


# torch 2.8 renamed the recorder's variables (TORCH_FR_*) and warns, on every
# rank, about the old names it still reads; older torch knows only the old
# ones. Both are set here, and the worker shim drops the old names where the
# node's torch knows the new (``agent/worker/shim.py``).
FLIGHT_RECORDER_RENAMED = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE",
                           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "TORCH_FR_DUMP_TEMP_FILE"}
# GPU indices as nvidia-smi numbers them (PCI bus order); CUDA's own default
# (fastest first) differs on a host with mixed models.
DEVICE_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def flight_recorder_env(run_dir: str, nccl: bool = True) -> dict[str, str]:
    """The recorder on, dumping into the node's run directory; a GPU run also
    gets the pipe the hang watchdog writes to before it stops the gang."""
    old = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{run_dir}/{NCCL_TRACE_PREFIX}",
           "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{run_dir}/{NCCL_TRACE_PREFIX}"}
    new = {new: old[name] for name, new in FLIGHT_RECORDER_RENAMED.items()}
    return {**old, **new} if nccl else new


def user_flight_recorder(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with a flight-recorder value given under one name set under the
    other too, so the node's torch reads the user's either way."""
    out = dict(env)
    for old, new in FLIGHT_RECORDER_RENAMED.items():
        if old in env and new not in env:
            out[new] = env[old]
        elif new in env and old not in env:
            out[old] = env[new]
    return out


def visible_devices(node: NodeSpec) -> str:
    """A node's planned CUDA_VISIBLE_DEVICES: its indices in the user's order,
    empty for CPU, and a placeholder for ``gpus: free:N`` until the launch."""
    if node.gpu_request is not None:
        return f"<{node.gpu_request}: chosen at launch>"
    return ",".join(map(str, node.gpus)) if node.gpus is not None else ""


def node_run_dir(spec: ClusterSpec, node_rank: int, run_id: str, local_run_dir: str,
                 shared: bool = False) -> str:
    """Each node its own directory, so two "nodes" on one machine never write
    over each other; a local node's lies in the local run directory."""
    if shared or spec.nodes[node_rank].is_local:
        return f"{local_run_dir}/node-{node_rank}"
    return f"{spec.workdir}/runs/{run_id}/node-{node_rank}"


def build_plan(spec: ClusterSpec, *, run_id: str, local_run_dir: str,
               master_addr: str | None = None, shared_run_dir: bool = False) -> RunPlan:
    """The rank plan for ``spec``; pure, so dry-run and launch agree."""
    master_addr = spec.master_addr or master_addr or _default_master(spec)
    device = "cpu" if any(n.procs is not None for n in spec.nodes) else spec.device
    starts = [0, *itertools.accumulate(node.nproc for node in spec.nodes)]
    nodes = []
    for k, node in enumerate(spec.nodes):
        run_dir = node_run_dir(spec, k, run_id, local_run_dir, shared_run_dir)
        env = dict(node.env)
        env = {**flight_recorder_env(run_dir, nccl=device != "cpu"),
               **user_flight_recorder(env)}  # the user's win
        if node.gpu_count is None:  # else the scheduler's GRES allocation sets it
            env["CUDA_VISIBLE_DEVICES"] = visible_devices(node)
        env.update(DEVICE_ORDER)
        env.update(interface_env(spec.interface, env))  # "auto" until the launch finds it
        env.setdefault(OMP_VAR, AT_LAUNCH)  # the node's cores over its ranks; the user's wins
        env[contract.DEVICE_ENV] = device
        env[contract.RUN_ID_ENV] = run_id
        env[contract.NODE_RANK_ENV] = str(k)
        env[contract.RESULT_FILE_ENV] = f"{run_dir}/{contract.RESULT_FILE_NAME}"
        env[contract.RESTART_COUNT_ENV] = "0"  # a kept run's keeper raises it per attempt
        env["PYTHONPATH"] = f"{run_dir}/{BUILTIN_DIR}"  # the built-ins, the contract, the shim
        env["PYTHONUNBUFFERED"] = "1"  # worker lines reach their log files as printed
        if spec.progress_pattern is not None:  # how its node reads a step from a line
            env[PROGRESS_PATTERN_ENV] = spec.progress_pattern
        nodes.append(NodePlan(
            node_rank=k, host=node.host, python=node.python, gpus=node.gpus,
            first_rank=starts[k], nproc=node.nproc, run_dir=run_dir,
            env=MappingProxyType(dict(sorted(env.items()))), unset_env=UNSET_ENV,
            code_rel=PROJECT_DIR if spec.workload.code else BUILTIN_DIR,
            gpu_request=node.gpu_request, one_process=node.one_process,
            user_env=tuple(sorted(node.env))))
    ranks = rank_plans(nodes)
    workload = spec.workload
    entrypoint = entrypoint_of(workload, spec.catalog)
    return RunPlan(run_id=run_id, name=spec.name, backend=spec.backend,
                   world_size=spec.world_size, master_addr=master_addr,
                   master_port=spec.master_port, device=device,
                   workload=workload.name or entrypoint.module or entrypoint.script or "?",
                   code=workload.code,
                   entrypoint=entrypoint, nodes=tuple(nodes), ranks=ranks,
                   setup=tuple(setup_argv(command) for command in spec.setup),
                   setup_timeout_s=spec.setup_timeout if spec.setup else 0.0,
                   setup_when_changed=spec.setup_when_changed if spec.setup else (),
                   outputs=spec.outputs)


def rank_plans(nodes: "list[NodePlan] | tuple[NodePlan, ...]") -> tuple[RankPlan, ...]:
    """Every rank, node by node: its GPU index, and its UUID and model once resolved."""
    def at(values: tuple, i: int):
        return values[i] if i < len(values) else None

    return tuple(
        RankPlan(rank=n.first_rank + i, node_rank=n.node_rank, host=n.host, local_rank=i,
                 gpu=n.gpus[i] if n.gpus is not None else None,
                 gpu_uuid=at(n.gpu_uuids, i), gpu_model=at(n.gpu_models, i))
        for n in nodes for i in range(n.nproc))


def entrypoint_of(workload: WorkloadSpec, catalog: Catalog) -> Entrypoint:
    """What every worker runs from its code root: a module or script, then its arguments."""
    args = workload.args if isinstance(workload.args, tuple) else args_to_argv(workload.args)
    if workload.name is not None:
        return Entrypoint(module=catalog[workload.name].module, script=None, args=tuple(args))
    script = None
    if workload.script is not None:
        script = os.path.relpath(workload.script, workload.code or os.path.dirname(
            workload.script)).replace(os.sep, "/")
    return Entrypoint(module=workload.module, script=script, args=tuple(args))


def args_to_argv(args: Mapping[str, Any]) -> tuple[str, ...]:
    """``{epochs: 10, amp: true}`` as ``--epochs 10 --amp``, as a workload's
    argparse reads it: a boolean is ``--x``/``--no-x``, a list one flag with
    each item a value, ``None`` the bare flag."""
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + str(key).replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is None:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv.append(flag)
            argv.extend(str(v) for v in value)
        else:
            argv.extend((flag, str(value)))
    return tuple(argv)


def setup_argv(command: str | tuple[str, ...]) -> tuple[str, ...]:
    """A ``setup:`` command as the node runs it: a string via ``sh -c``, a list as argv."""
    return ("sh", "-c", command) if isinstance(command, str) else tuple(command)


def setup_path_first(python: str) -> str | None:
    """The directory first on ``PATH`` for setup commands: that of ``python:``
    when it is a path, so ``pip`` is the run's own; None for a bare name."""
    if not python.startswith(("/", "~/")):
        return None
    return python.rsplit("/", 1)[0] or "/"


def _default_master(spec: ClusterSpec) -> str:
    """Node 0's host; an all-local job uses the IPv4 loopback explicitly."""
    first = spec.nodes[0]
    return "127.0.0.1" if first.is_local else first.host


def resolve_plan(plan: RunPlan, *, master_port: int, homes: Mapping[int, str],
                 hosts: Mapping[int, str] | None = None,
                 master_addr: str | None = None,
                 interfaces: Mapping[int, str] | None = None,
                 gpus: Mapping[int, GpuChoice] | None = None,
                 device: str | None = None,
                 cores: Mapping[int, int] | None = None) -> RunPlan:
    """Fill in the launch-time facts, the keyword arguments. Pure as well:
    nothing the dry-run showed changes except those facts."""
    def fix(value: str, home: str) -> str:
        if value == "~" or value.startswith("~/"):
            return home + value[1:]
        return value

    nodes = []
    first = 0
    for node in plan.nodes:
        home = homes.get(node.node_rank, "~")
        env = resolve_interfaces({k: fix(v, home) for k, v in node.env.items()},
                                 (interfaces or {}).get(node.node_rank))
        chosen = (gpus or {}).get(node.node_rank)
        if device is not None:
            env[contract.DEVICE_ENV] = device
        placed = {}
        if chosen is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, chosen.indices))
            if chosen.uuids:
                env[contract.GPU_UUIDS_ENV] = ",".join(chosen.uuids)
            placed = dict(gpus=chosen.indices,
                          nproc=1 if node.one_process else len(chosen.indices),
                          gpu_uuids=chosen.uuids, gpu_models=chosen.models)
        env = resolve_threads(env, (cores or {}).get(node.node_rank),
                              placed.get("nproc", node.nproc))
        nodes.append(dataclasses.replace(
            node, host=(hosts or {}).get(node.node_rank, node.host),
            run_dir=fix(node.run_dir, home), python=fix(node.python, home), first_rank=first,
            env=MappingProxyType(dict(sorted(env.items()))), **placed))
        first += nodes[-1].nproc
    return dataclasses.replace(plan, master_port=master_port, nodes=tuple(nodes),
                               ranks=rank_plans(nodes), world_size=first,
                               device=device or plan.device,
                               master_addr=master_addr or plan.master_addr)
