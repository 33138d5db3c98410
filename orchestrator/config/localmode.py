"""``up --local``: the same job on this machine, without SSH.

The local spec is an ordinary ``ClusterSpec`` with one ``localhost`` node,
so it goes through the same plan, launch and records as a cluster run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from workloads.catalog import CATALOG

from ..errors import ConfigError
from .loader import check_workload_args, parse_gpus
from .spec import AUTO_PORT, DEFAULT_WORKDIR, ClusterSpec, NodeSpec, SshSpec, WorkloadSpec
from .yamlsrc import closest_hint

CLI = "command line"


def local_spec(base: ClusterSpec | None, *, workload: str | None, gpus: str | None,
               procs: int | None, device: str | None, args: Mapping[str, Any]) -> ClusterSpec:
    """One localhost node running ``base``'s workload (or ``workload``)."""
    if gpus is not None and procs is not None:
        raise ConfigError("give --gpus or --procs, not both", source=CLI)
    if base is None and workload is None:
        raise ConfigError("nothing to run", source=CLI,
                          hint="pass a cluster file or --workload NAME (see `ddp-orch workloads`)")
    if gpus is not None:
        try:
            gpu_list, nproc = parse_gpus(gpus), None
        except ValueError as exc:
            raise ConfigError(exc.args[0], path="--gpus", source=CLI, hint=exc.args[1]) from None
    else:
        gpu_list, nproc = None, procs if procs is not None else _default_procs(base)
    chosen = choose_workload(base, workload, args)
    python = base.nodes[0].python if base else "python3"
    env = dict(base.env) if base else {}
    node = NodeSpec(host="localhost", gpus=gpu_list, procs=nproc, ssh=SshSpec(),
                    python=_local_python(python), env=env)
    fields = dict(backend="local", master_addr=None, master_port=AUTO_PORT, nodes=(node,), workload=chosen,
                  device=device or (base.device if base else "auto"))
    if base is not None:
        return dataclasses.replace(base, **fields)
    return ClusterSpec(name=chosen.label, workdir=DEFAULT_WORKDIR, env=env,
                       source=CLI, text="", **fields)


def _default_procs(base: ClusterSpec | None) -> int:
    """Without --gpus/--procs: node 0's process count, else 2 (a real DDP pair)."""
    return base.nodes[0].nproc if base else 2


def _local_python(python: str) -> str:
    """The cluster's interpreter, unless it is the bare default: then ours.

    A local run should use the Python that has torch next to ddp-orch (the
    venv it was installed in), not whatever ``python3`` is first on PATH.
    """
    import sys

    return sys.executable if python == "python3" else python


def with_args(spec: ClusterSpec, args: Mapping[str, Any]) -> ClusterSpec:
    """``spec`` with ``--arg`` values merged over its workload's args."""
    if not args:
        return spec
    return dataclasses.replace(spec, workload=choose_workload(spec, None, args))


def choose_workload(base: ClusterSpec | None, name: str | None,
                    args: Mapping[str, Any]) -> WorkloadSpec:
    """The file's workload (or the built-in ``name``) with ``args`` merged, checked."""
    if name is not None:
        if name not in CATALOG:
            raise ConfigError(f"unknown workload {name!r}", path="--workload", source=CLI,
                              hint=closest_hint(name, CATALOG) or "see `ddp-orch workloads`")
        chosen = WorkloadSpec(name=name, script=None, args={})
    else:
        chosen = base.workload
    merged = {**chosen.args, **args}
    if chosen.name is not None:
        try:
            check_workload_args(chosen.name, merged)
        except ValueError as exc:
            key, message, hint = exc.args
            raise ConfigError(message, path=f"--arg {key}", source=CLI, hint=hint) from None
    return dataclasses.replace(chosen, args=merged)
