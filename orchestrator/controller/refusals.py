"""What a launch would fail on, found before anything starts, for ``--dry-run`` and
``up`` alike. GPUs busy or held are not refused here: that is the launch's to say,
as it may change by then."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from ..engine.options import LaunchOptions
from ..config.spec import LOCAL_HOSTS, ClusterSpec
from ..errors import ConfigError
from ..plan.model import RunPlan

CLI = "command line"


def _gpus_here() -> dict:
    from ..agent.node import gpus as node_gpus  # (only a localhost node with GPUs asks)

    return node_gpus.facts()


def _torch_here(python: str) -> dict:
    from ..agent.node.gpuclaim import TorchProbe

    return TorchProbe(python).result()


def refuse(spec: ClusterSpec, plan: RunPlan, options: LaunchOptions,
           gpus_here: Callable[[], dict] = _gpus_here,
           torch_here: Callable[[str], dict] = _torch_here) -> None:
    """Raise ``ConfigError`` for the first thing the launch would fail on;
    ``gpus_here`` asks nvidia-smi, and without one ``torch_here`` asks torch."""
    _local_gpus(spec, plan, gpus_here, torch_here)
    if plan.world_size_known:  # else once the nodes chose (``refuse_resolved``)
        _workload_rules(spec, plan, options)


def refuse_resolved(spec: ClusterSpec, plan: RunPlan, options: LaunchOptions) -> None:
    """A built-in's rules once the nodes chose their GPUs: only then is the world size known."""
    _workload_rules(spec, plan, options)


def _local_gpus(spec: ClusterSpec, plan: RunPlan, gpus_here: Callable[[], dict],
                torch_here: Callable[[str], dict]) -> None:
    """A localhost node's listed GPUs must be here, unless the run is on CPU."""
    local = [node for node in plan.nodes if node.is_local and node.gpus is not None]
    if plan.device == "cpu" or not local:
        return
    from ..engine.gpuplan import CPU_REHEARSAL, torch_problem  # GPUs here: a local run's

    found = gpus_here()
    for node in local:
        # as the launch asks; a localhost node's ``~`` is this machine's home
        seen = torch_here(os.path.expanduser(node.python)) if found.get("absent") else None
        problem = _missing(node.gpus or (), found, spec) if seen is None else \
            torch_problem(seen, {"chosen": node.gpus})
        if problem is not None and seen is not None:
            problem = f"nvidia-smi is not here, and {problem}"
        if problem is None:
            continue
        given = spec.nodes[node.node_rank]
        if given.line is None:  # --local --gpus
            raise ConfigError(f"{_listed(node.gpus)} asked for, but {problem}",
                              path="--gpus", source=CLI,
                              hint="add --device cpu for a CPU rehearsal (one CPU process per "
                                   "listed GPU), or run --procs N")
        raise ConfigError(f"node {node.node_rank} (localhost) lists {_listed(node.gpus)}, but "
                          f"{problem}", path=f"nodes[{node.node_rank}].gpus",
                          source=spec.source, line=given.line, hint=CPU_REHEARSAL)


def _missing(wanted: tuple[int, ...], found: dict, spec: ClusterSpec) -> str | None:
    """Why GPUs ``wanted`` cannot be had here whatever else runs (MIG mode, excluded)."""
    from ..agent.node import gpus as node_gpus

    if not found.get("ok"):
        return f"nvidia-smi failed here: {found.get('error')}"
    answer = node_gpus.choose(list(wanted), found["gpus"], found["apps"], allow_busy=True,
                              ignore=spec.gpu_ignore,
                              exclude=[k for host, k in spec.gpu_exclude if host in LOCAL_HOSTS])
    return None if answer["ok"] else str(answer["error"])


def _listed(gpus: Any) -> str:
    """``GPU 0``, ``GPUs 0,1``."""
    return f"GPU{'s' if len(gpus or ()) > 1 else ''} {','.join(map(str, gpus or ()))}"


def _workload_rules(spec: ClusterSpec, plan: RunPlan, options: LaunchOptions) -> None:
    name = spec.workload.name
    if name is None or not isinstance(spec.workload.args, Mapping):
        return
    info = spec.catalog[name]
    args = {key.replace("-", "_"): value for key, value in spec.workload.args.items()}
    found = info.refusal(args, layout(spec, plan, args.get("device"),
                                      restarts=options.max_restarts > 0))
    if found is None:
        return
    rule, message = found
    if spec.source == CLI:
        path, source = f"--arg {rule.arg}", CLI
    else:
        path, source = f"workload.args.{rule.arg}", spec.source
    raise ConfigError(message, path=path, source=source,
                      hint=f"{rule.hint} (every rank would refuse it after the start)"
                      if rule.hint else "every rank would refuse it after the start")


def layout(spec: ClusterSpec, plan: RunPlan, device_arg: str | None, *,
           restarts: bool) -> Any:
    """Where the ranks run, for the rank that fares worst (the catalog's
    ``layout``). A rank's GPUs count only where CUDA is certain: ``cuda``, or
    ``auto`` with every node on this machine."""
    where = spec.catalog.layout
    wanted = device_arg or plan.device
    seen = [0 if given.procs is not None else
            given.gpu_count if given.gpu_count is not None else node.nproc
            for given, node in zip(spec.nodes, plan.nodes)]
    if wanted == "cpu":
        return where(plan.world_size, device="cpu", gpus=0, restarts=restarts)
    if min(seen) == 0:  # CPU processes: CUDA_VISIBLE_DEVICES is empty there
        return where(plan.world_size, device="cpu" if wanted == "auto" else None, gpus=0,
                      restarts=restarts)
    if wanted == "cuda" or all(node.is_local for node in plan.nodes):
        return where(plan.world_size, device="cuda", gpus=min(seen), restarts=restarts)
    return where(plan.world_size, restarts=restarts)
