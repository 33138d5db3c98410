"""Renderings of a ``DryRun``: text, json and shell lines. Secret-looking env values
are masked; the shell lines take them from the nodes' environment instead."""

from __future__ import annotations

import json
from typing import Any

from ..agent.wire.addr import hostport
from ..config.spec import AUTO_PORT
from ..tables import format_table
from .build import setup_path_first
from ..agent.wire.owner import Owner
from .dryrun import DryRun, NodeLaunch, owner_words
from .model import RunPlan
from .secrets import mask_env
from .shell import render_shell, shell_join, shell_word
from .torchrun import NPROC_AT_LAUNCH

def _port_text(plan: RunPlan) -> str:
    if plan.master_port == AUTO_PORT:
        return "auto (a free port on node 0, chosen at launch)"
    return str(plan.master_port)


def render(info: DryRun, fmt: str, **shell: Any) -> str:
    """``--dry-run --format FMT``; ``shell``: how the shell lines write the bundle."""
    if fmt == "shell":
        return render_shell(info, **shell)
    return {"text": render_text, "json": render_json}[fmt](info)


def render_text(info: DryRun) -> str:
    """The human dry-run: rank table, then each node's env and command."""
    plan = info.plan
    out = [
        f"run        {plan.run_id}",
        f"backend    {info.backend}",
        f"cluster    {info.source or '-'}: {len(plan.nodes)} node(s), world size "
        f"{_world_size(plan)}, device {plan.device}",
        f"master     {hostport(plan.master_addr, _port_text(plan))} (torchrun static rendezvous)",
        f"workload   {plan.workload}",
        f"owner      {info.owner}: {info.owner_words or owner_words(info.owner)}",
        *([f"restarts   up to {info.max_restarts} whole-gang restart(s) after a failure"]
          if info.max_restarts else []),
        *_setup_lines(plan),
        *info.notes,
        "",
        _rank_table(plan),
    ]
    for node in info.nodes:
        out += ["", node.header(), f"  run dir  {node.run_dir}",
                f"  cwd      {node.node.code_root}", "  env"]
        out += [f"    {k}={v}" for k, v in mask_env(node.env).items()]
        out += [f"  unset    {' '.join(node.unset_env)}"]
        if node.setup:
            first = setup_path_first(node.node.python)
            out += [f"  setup    in {node.node.code_root}, {plan.setup_timeout_s:g}s in all"
                    + (f", {first} first on PATH" if first else "")]
            out += [f"    {shell_join(argv)}" for argv in node.setup]
        out += ["  command",  # what only the launch knows, in words as they are
                "    " + " ".join(w if w == NPROC_AT_LAUNCH else shell_word(w) for w in node.argv)]
    for title, text in info.extras.items():
        out += ["", title] + [f"  {line}".rstrip() for line in text.splitlines()]
    return "\n".join(out) + "\n"


def _setup_lines(plan: RunPlan) -> list[str]:
    """The header's ``setup`` and ``outputs`` lines, when the file has them."""
    out = []
    if plan.setup:
        count = len(plan.setup)
        out.append(f"setup      {count} command{'s' if count != 1 else ''} on every node in its "
                   f"code root before torchrun starts, once per run; timeout "
                   f"{plan.setup_timeout_s:g}s (setup_timeout)")
        if plan.setup_when_changed:
            out.append(f"           when_changed: {', '.join(plan.setup_when_changed)}: skipped on "
                       "a node where these files, the commands, env and python are as at its "
                       "last successful setup")
    if plan.outputs:
        out.append(f"outputs    {', '.join(plan.outputs)} (node 0's code root) -> the run "
                   f"directory's outputs/, after the run")
    return out


def _world_size(plan: RunPlan) -> str:
    if plan.world_size_known:
        return str(plan.world_size)
    asks = ", ".join(f"node {n.node_rank} gpus: {n.gpu_request}" for n in plan.nodes
                     if n.gpus_pending)
    return f"decided at launch ({asks}; the nodes' agents choose)"


def _rank_table(plan: RunPlan) -> str:
    """Each rank's node, host and GPU (model and UUID once known); a node whose
    GPUs are chosen at launch is one row saying what it asked for."""
    known = any(r.gpu_model for r in plan.ranks)
    rows = [("RANK", "NODE", "HOST", "LOCAL_RANK", "GPU", *(("MODEL", "UUID") if known else ()))]
    for node in plan.nodes:
        if node.gpus_pending:
            count = "?" if not plan.world_size_known else str(node.nproc)
            rows.append(("?", str(node.node_rank), node.host, f"{count} rank(s)",
                         f"{node.gpu_request}: chosen at launch", *(("", "") if known else ())))
            continue
        rows += [(str(r.rank), str(r.node_rank), r.host, str(r.local_rank),
                  "-" if r.gpu is None else str(r.gpu),
                  *((r.gpu_model or "-", r.gpu_uuid or "-") if known else ()))
                 for r in plan.ranks if r.node_rank == node.node_rank]
    return format_table(rows)


def dryrun_to_dict(info: DryRun) -> dict[str, Any]:
    """A JSON-ready dict of the dry-run (secret env values masked)."""
    plan = info.plan
    return {
        "backend": info.backend, "owner": info.owner.to_json(),
        "max_restarts": info.max_restarts,
        "run_id": plan.run_id, "name": plan.name, "world_size": plan.world_size,
        "master_addr": plan.master_addr, "master_port": plan.master_port,
        "device": plan.device, "workload": plan.workload,
        "setup": [list(argv) for argv in plan.setup],
        "setup_timeout_s": plan.setup_timeout_s,
        **({"setup_when_changed": list(plan.setup_when_changed)}
           if plan.setup_when_changed else {}),
        "outputs": list(plan.outputs),
        "ranks": [_rank_dict(r) for r in plan.ranks],
        "nodes": [{
            "node_rank": n.node_rank, "host": n.host, "where": n.where,
            "connection": dict(n.connection),
            "python": n.node.python,
            "gpus": list(n.node.gpus) if n.node.gpus is not None else None,
            **({"gpu_request": n.node.gpu_request} if n.node.gpu_request else {}),
            **({"gpu_uuids": list(n.node.gpu_uuids)} if n.node.gpu_uuids else {}),
            **({"gpu_models": list(n.node.gpu_models)} if n.node.gpu_models else {}),
            "ranks": [n.node.first_rank, n.node.first_rank + n.node.nproc - 1],
            "nproc": n.node.nproc, "run_dir": n.run_dir, "code_root": n.node.code_root,
            "env": mask_env(n.env),
            "unset_env": list(n.unset_env), "argv": list(n.argv),
        } for n in info.nodes],
        **({"extras": dict(info.extras)} if info.extras else {}),
    }


def _rank_dict(rank: Any) -> dict[str, Any]:
    """A rank as recorded; its GPU's UUID and model only where known."""
    return {k: v for k, v in vars(rank).items()
            if v is not None or k not in ("gpu_uuid", "gpu_model")}


def render_json(info: DryRun) -> str:
    return json.dumps(dryrun_to_dict(info), indent=2) + "\n"


def dryrun_from_dict(data: dict[str, Any]) -> DryRun:
    """A recorded run's dry-run (``plan.json``), read back for ``attach``, masked
    env values still masked; KeyError, TypeError or ValueError if it does not fit."""
    from .model import Entrypoint, NodePlan, RankPlan, RunPlan

    when_changed = tuple(map(str, data.get("setup_when_changed") or ()))
    nodes = []
    for n in data["nodes"]:
        node = NodePlan(node_rank=int(n["node_rank"]), host=str(n["host"]),
                        python=str(n["python"]),
                        gpus=tuple(map(int, n["gpus"])) if n.get("gpus") is not None else None,
                        first_rank=int(n["ranks"][0]), nproc=int(n["nproc"]),
                        run_dir=str(n["run_dir"]), env=dict(n["env"]),
                        unset_env=tuple(n["unset_env"]),
                        code_rel=_code_rel(str(n["run_dir"]), n.get("code_root")),
                        gpu_request=str(n["gpu_request"]) if n.get("gpu_request") else None,
                        gpu_uuids=tuple(map(str, n.get("gpu_uuids") or ())),
                        gpu_models=tuple(map(str, n.get("gpu_models") or ())))
        nodes.append(NodeLaunch(node=node, where=str(n["where"]), env=node.env,
                                unset_env=node.unset_env, argv=tuple(map(str, n["argv"])),
                                connection=dict(n.get("connection") or {}),
                                setup=tuple(tuple(map(str, argv))
                                            for argv in data.get("setup") or ()),
                                setup_timeout_s=float(data.get("setup_timeout_s") or 0),
                                setup_when_changed=when_changed))
    plan = RunPlan(run_id=str(data["run_id"]), name=str(data["name"]),
                   backend=str(data["backend"]), world_size=int(data["world_size"]),
                   master_addr=str(data["master_addr"]), master_port=data["master_port"],
                   device=str(data["device"]), workload=str(data["workload"]), code=None,
                   entrypoint=Entrypoint(None, None, ()), nodes=tuple(n.node for n in nodes),
                   ranks=tuple(RankPlan(**r) for r in data["ranks"]),
                   setup=tuple(tuple(map(str, argv)) for argv in data.get("setup") or ()),
                   setup_timeout_s=float(data.get("setup_timeout_s") or 0),
                   setup_when_changed=when_changed,
                   outputs=tuple(map(str, data.get("outputs") or ())))
    return DryRun(backend=plan.backend, plan=plan, nodes=tuple(nodes),
                  extras=dict(data.get("extras") or {}),
                  owner=Owner.from_json(data["owner"]),
                  max_restarts=int(data.get("max_restarts", 0)))


def _code_rel(run_dir: str, code_root: object) -> str:
    """A recorded node's code root, relative to its run directory ("code" if unrecorded)."""
    if isinstance(code_root, str) and code_root.startswith(run_dir.rstrip("/") + "/"):
        return code_root[len(run_dir.rstrip("/")) + 1:]
    return "code"

