"""``slurm:``: the Slurm backend's block of a cluster file: sbatch options, and
the rules of the Slurm layout (one agent per Slurm node, no SSH, one python)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..yamlsrc import Located, shown

KEY = "slurm"
AFTER = "backend"
BACKEND = "slurm"
PLACES_NODES = True  # nodes: {count: N}: Slurm chooses the hosts
PLACED_WORDS = "nodes: {count: N} (Slurm places the nodes)"


def placed_host(node_rank: int) -> str:
    """A placed node's host until the job starts and the allocation names it."""
    return f"<slurm node {node_rank}>"


WORKDIR_UNUSED = ("under backend: slurm every node's files live in the run directory on the "
                  "shared file system (runs/<run id>/node-<k>)")

KEYS = ("partition", "account", "time", "qos", "extra")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# sbatch --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or no limit.
TIME_RE = re.compile(r"^(?:\d+(?::\d{1,2}){0,2}|\d+-\d{1,2}(?::\d{1,2}){0,2}"
                     r"|UNLIMITED|INFINITE|infinite|unlimited)$")
OPTION_RE = re.compile(r"^--[A-Za-z][A-Za-z0-9-]*(?:=[^\s]+)?$")
# Options the Slurm backend sets itself: a second value would fight it.
# sbatch also takes any unique prefix of a long option (--out= is --output=),
# so a prefix of one of these is refused as well.
OWN_OPTIONS = frozenset({
    "nodes", "nodelist", "ntasks", "ntasks-per-node", "output", "error", "parsable", "wrap",
    "job-name", "chdir", "gres", "gpus", "gpus-per-node", "gpus-per-task", "cpus-per-task",
    "cpus-per-gpu", "ntasks-per-gpu", "partition", "account", "time", "qos", "wait", "array",
    "hold", "export", "requeue", "test-only", "open-mode", "input",
})


@dataclass(frozen=True)
class SlurmSpec:
    """``slurm:`` settings, each an ``sbatch`` option; None leaves it to the
    cluster's defaults. ``extra`` holds more options, each ``--name[=value]``."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    qos: str | None = None
    extra: tuple[str, ...] = ()


Spec = SlurmSpec  # the name every block module gives its spec


def load(field: Located) -> Spec:
    entries = field.mapping(KEYS)
    values: dict[str, Any] = {}
    for key in ("partition", "account", "qos"):
        if key in entries:
            name = entries[key].string()
            if not NAME_RE.match(name):
                raise entries[key].error(f"{name!r} is not a Slurm {key} name",
                                         hint="letters, digits, '_', '.' or '-'")
            values[key] = name
    if "time" in entries:
        raw = entries["time"].scalar()
        if isinstance(raw, int) and ":" in str(entries["time"].node.value):
            raise entries["time"].error(
                f"{entries['time'].node.value} was read as the number {raw} (YAML reads "
                "h:m:s as base 60)", hint='quote it: time: "12:00:00"')
        text = str(raw) if isinstance(raw, (str, int)) and not isinstance(raw, bool) else ""
        if not TIME_RE.match(text):
            raise entries["time"].error(
                f"{shown(raw)} is not a Slurm time limit",
                hint='quote it, e.g. "04:00:00", "90" (minutes) or "1-12:00:00" (days-hours)')
        values["time"] = text
    if "extra" in entries:
        values["extra"] = tuple(_option(item) for item in entries["extra"].sequence())
    return Spec(**values)


def _option(field: Located) -> str:
    option = field.string()
    if not OPTION_RE.match(option):
        raise field.error(f"{option!r} is not an sbatch option",
                          hint='each entry is one long option, "--name" or "--name=value", '
                               'with no spaces; it is passed to sbatch, never to a shell')
    name = option[2:].split("=", 1)[0]
    own = sorted(o for o in OWN_OPTIONS if o == name or o.startswith(name))
    if own:
        full = name if name in own else own[0]
        hint = (f"use `slurm: {{{full}: ...}}`" if full in KEYS else
                "ddp-orch sets it from the nodes: list and the run")
        shown_as = f"--{name}" + (f" (--{full})" if full != name else "")
        raise field.error(f"{shown_as} is set by ddp-orch", hint=hint)
    return option


def check_layout(spec: Any, top: Mapping[str, Located], node_keys: tuple[str, ...]) -> None:
    """Rules of the Slurm backend: one agent per Slurm node, no SSH."""
    if "ssh" in top:
        raise top["ssh"].error("ssh: settings do not apply to backend: slurm",
                               hint="Slurm starts the nodes; remove the ssh: block")
    if spec.placed:
        return
    items = top["nodes"].sequence()
    seen: dict[str, int] = {}
    for k, (item, node) in enumerate(zip(items, spec.nodes)):
        entries = item.mapping(node_keys)
        if "ssh" in entries:
            raise entries["ssh"].error("ssh: settings do not apply to backend: slurm",
                                       hint="Slurm starts the nodes; remove the ssh: block")
        if "python" in entries:
            raise entries["python"].error(
                "under backend: slurm one python runs the whole job",
                hint="set the top-level `python:` (a path every node has, e.g. on the "
                     "shared file system)")
        if node.is_local:
            raise entries["host"].error(
                "with backend: slurm a host is a Slurm node name, not localhost",
                hint="use the names `sinfo -N` lists, or `nodes: {count: N, ...}`")
        if node.gpu_request is not None:
            count = node.gpu_request.partition(":")[2] or "G"
            raise entries["gpus"].error(
                f"under backend: slurm, Slurm chooses the GPUs: {node.gpu_request!r} is not "
                "asked of the node", hint=f"write `nodes: {{count: N, gpus: {count}}}` to have "
                "Slurm allocate that many GPUs on each of N nodes it chooses")
        if node.host in seen:
            raise entries["host"].error(
                f"{node.host} is already nodes[{seen[node.host]}]",
                hint="under Slurm each node runs one agent: list a Slurm node once, "
                     "with all its GPUs")
        seen[node.host] = k


def schema(mapping: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """``$defs.slurm``, built with the schema's ``mapping`` helper."""
    name = {"type": "string", "pattern": NAME_RE.pattern}
    return mapping(KEYS, {
        "partition": {**name, "description": "sbatch --partition."},
        "account": {**name, "description": "sbatch --account."},
        "time": {"type": ["string", "integer"], "pattern": TIME_RE.pattern,
                 "description": 'sbatch --time, e.g. "04:00:00" or "1-12:00:00".'},
        "qos": {**name, "description": "sbatch --qos."},
        "extra": {"type": "array",
                  "items": {"type": "string", "pattern": OPTION_RE.pattern,
                            "not": {"pattern": "^--(?:" + "|".join(
                                sorted(OWN_OPTIONS)) + ")(?:=|$)"}},
                  "description": 'More sbatch options, each "--name" or "--name=value".'},
    }, "slurm", "sbatch settings for backend: slurm; each is optional.")


def schema_rules(given: Callable[[str, Any], dict[str, Any]], localhost: dict[str, Any],
                 backends: tuple[str, ...]) -> list[dict[str, Any]]:
    """The loader's rules of this block and layout (``check_layout``, "need
    backend: slurm") as JSON Schema says them."""
    slurm = {"anyOf": [given("backend", "slurm"),
                       {"not": {"required": ["backend"]},
                        "anyOf": [{"required": ["slurm"]},
                                  {"properties": {"nodes": {"type": "object"}},
                                   "required": ["nodes"]}]}]}
    return [
        {"description": "slurm: settings and nodes: {count: N} go with backend: slurm",
         "if": {"properties": {"backend": {"enum": [b for b in backends if b != "slurm"]}},
                "required": ["backend"]},
         "then": {"not": {"required": ["slurm"]},
                  "properties": {"nodes": {"type": "array"}}}},
        {"description": "under backend: slurm, Slurm starts the nodes: no ssh:, no per-node "
                        "python:, no localhost, no workdir (every node's files are in the "
                        "shared run directory)",
         "if": slurm,
         "then": {"properties": {"ssh": False, "workdir": False, "nodes": {"items": {
             "properties": {"host": {"not": localhost}, "ssh": False, "python": False}}}}}},
    ]
