"""Renderings of a ``RunPlan``: text (dry-run), json, and shell lines.

All three read the same plan object a launch consumes. Values of
environment variables whose names look secret are masked in every
rendering, because dry-run output and stored plans end up in terminals,
tickets and CI logs.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any, Mapping

from .plan import NodePlan, RunPlan
from .spec import AUTO_PORT
from .table import format_table

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)
MASK = "********"


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with the values of secret-looking names masked."""
    return {k: (MASK if SECRET_NAME.search(k) else v) for k, v in env.items()}


def secret_values(env: Mapping[str, str]) -> tuple[bytes, ...]:
    """The values to scrub from logs: those of secret-looking names, 4+ chars."""
    return tuple(sorted({v.encode() for k, v in env.items()
                         if SECRET_NAME.search(k) and len(v) >= 4}, key=len, reverse=True))


def scrub(line: bytes, secrets: tuple[bytes, ...]) -> bytes:
    for value in secrets:
        line = line.replace(value, MASK.encode())
    return line


def shell_word(word: str) -> str:
    """``shlex.quote``, except a leading ``~/`` stays expandable by the shell.

    ``'~/x'`` would reach the program as a literal tilde; ``"$HOME"/'x'``
    is what the user meant. ``NAME=~/x`` (an env word) is handled the same.
    """
    name, eq, value = word.partition("=")
    if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and value.startswith("~/"):
        return f"{name}=" + shell_word(value)
    if word == "~" or word.startswith("~/"):
        rest = word[2:]
        return '"$HOME"' + (("/" + shlex.quote(rest)) if rest else "")
    return shlex.quote(word)


def shell_join(words: list[str] | tuple[str, ...]) -> str:
    return " ".join(shell_word(w) for w in words)


def node_shell_line(node: NodePlan) -> str:
    """One copy-pasteable line that starts this node by hand."""
    env_words = ["env", *(w for name in node.unset_env for w in ("-u", name)),
                 *(f"{k}={v}" for k, v in mask_env(node.env).items())]
    return (f"mkdir -p {shell_word(node.run_dir)} && cd {shell_word(node.run_dir)} && "
            + shell_join([*env_words, *node.argv]))


def _port_text(plan: RunPlan) -> str:
    if plan.master_port == AUTO_PORT:
        return "auto (a free port on node 0, chosen at launch)"
    return str(plan.master_port)


def render_text(plan: RunPlan, *, source: str = "") -> str:
    """The human dry-run: rank table, then each node's env and command."""
    out = [
        f"run        {plan.run_id}",
        f"cluster    {source or '-'}: {len(plan.nodes)} node(s), world size {plan.world_size}, "
        f"device {plan.device}",
        f"master     {plan.master_addr}:{_port_text(plan)} (torchrun static rendezvous)",
        f"workload   {plan.workload}",
        "",
        _rank_table(plan),
    ]
    for node in plan.nodes:
        out += ["", _node_header(node), f"  run dir  {node.run_dir}", "  env"]
        out += [f"    {k}={v}" for k, v in mask_env(node.env).items()]
        out += [f"  unset    {' '.join(node.unset_env)}", "  command",
                f"    {shell_join(node.argv)}"]
    return "\n".join(out) + "\n"


def _node_header(node: NodePlan) -> str:
    where = "local subprocess" if node.is_local else "ssh " + _ssh_target(node)
    last = node.first_rank + node.nproc - 1
    return (f"node {node.node_rank}  {node.host}  ranks {node.first_rank}-{last} "
            f"({node.nproc} process{'es' if node.nproc != 1 else ''}, {where})")


def _ssh_target(node: NodePlan) -> str:
    user = f"{node.ssh.user}@" if node.ssh.user else ""
    port = f":{node.ssh.port}" if node.ssh.port else ""
    return f"{user}{node.host}{port}"


def _rank_table(plan: RunPlan) -> str:
    rows = [("RANK", "NODE", "HOST", "LOCAL_RANK", "GPU")]
    rows += [(str(r.rank), str(r.node_rank), r.host, str(r.local_rank),
              "-" if r.gpu is None else str(r.gpu)) for r in plan.ranks]
    return format_table(rows)


def plan_to_dict(plan: RunPlan) -> dict[str, Any]:
    """A JSON-ready dict of the plan (secret env values masked)."""
    return {
        "run_id": plan.run_id, "name": plan.name, "world_size": plan.world_size,
        "master_addr": plan.master_addr, "master_port": plan.master_port,
        "device": plan.device, "workload": plan.workload,
        "ranks": [vars(r) for r in plan.ranks],
        "nodes": [{
            "node_rank": n.node_rank, "host": n.host, "local": n.is_local,
            "ssh": vars(n.ssh), "python": n.python,
            "gpus": list(n.gpus) if n.gpus is not None else None,
            "ranks": [n.first_rank, n.first_rank + n.nproc - 1], "nproc": n.nproc,
            "run_dir": n.run_dir, "env": mask_env(n.env), "unset_env": list(n.unset_env),
            "argv": list(n.argv),
        } for n in plan.nodes],
    }


def render_json(plan: RunPlan) -> str:
    return json.dumps(plan_to_dict(plan), indent=2) + "\n"


def render_shell(plan: RunPlan) -> str:
    """Per-node lines to start the job by hand, like the manual two-machine launch."""
    out = [f"# {plan.run_id}: world size {plan.world_size}, master "
           f"{plan.master_addr}:{plan.master_port}",
           "# ddp-orch uploads the workload code into each run dir's code/ first;",
           "# to start by hand, copy it there, then run each line on its node.",
           "# Worker output goes to files (--redirects 3), which ddp-orch relays;",
           "# by hand: tail -F torchrun/*/attempt_0/*/std*.log in the run dir."]
    for node in plan.nodes:
        out += ["", f"# {_node_header(node)}", node_shell_line(node)]
    return "\n".join(out) + "\n"
