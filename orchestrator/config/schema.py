"""The cluster file as a JSON Schema (Draft 2020-12), for editors: ``ddp-orch
schema`` prints it and ``schema/cluster.schema.json`` is a checked-in copy, so
yaml-language-server can complete keys and flag mistakes as the file is typed.

The loader stays the authority (every error with its line and a hint). The
schema says what JSON Schema can: values, required keys, each built-in
workload's arguments and the rules between fields; the rest is
``LEFT_TO_THE_LOADER``. Key lists, choices, limits and patterns come from the
loader, ``spec`` and the workload catalog, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from .loader import (COUNT_KEYS, DEVICES, ENV_NAME_RE, HOST_RE, IFNAME_RE, MASTER_KEYS,
                     MAX_CONNECT_TIMEOUT, MAX_GPU_INDEX, MAX_HANG_TIMEOUT, MAX_MODULE_NAME,
                     MAX_NODES, MAX_RESTARTS, MIN_HANG_TIMEOUT, MAX_PROCS, MODULE_RE, NAME_RE,
                     NETWORK_KEYS, NODE_KEYS,
                     RESERVED_ENV, SSH_KEYS, CORE_KEYS, WORKLOAD_KEYS)
from .loader import MAX_OUTPUTS, MAX_SETUP_COMMANDS, MAX_SETUP_TIMEOUT, MAX_WHEN_CHANGED, SETUP_KEYS
from .loader import EXCLUDE_RE, FREE_N_RE, GPU_POLICY_KEYS, MAX_BUSY_MIB, MAX_EXCLUDED, MAX_GPU_WAIT
from ..agent.node.gpus import HEALTH_RULES
from .loader import MAX_PROGRESS_PATTERN, PROGRESS_KEYS
from .blocks import blocks, top_keys
from .catalog import Catalog, builtin
from .limits import backend_names
from .spec import (AUTO_PORT, BACKENDS, DEFAULT_GPU_BUSY_MIB, DEFAULT_GPU_BUSY_UTIL, DEFAULT_PORT,
                   DEFAULT_SETUP_TIMEOUT, DEFAULT_WORKDIR, GPU_REQUESTS, LOCAL_HOSTS)

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID = "urn:ddp-orch:schema:cluster"

_EXCLUDE = EXCLUDE_RE.pattern.replace("?P<host>", "?:").replace("?P<index>", "?:")  # ECMA 262
_NON_BLANK = r"\S"  # loader's Located.string(): a string with something besides spaces
_SCALAR = {"type": ["string", "number", "boolean", "null"]}


def index_regex(top: int) -> str:
    """A regex (no anchors) for the whole numbers 0..``top``, leading zeros allowed:
    ``index_regex(1023)`` -> ``0*(?:[0-9]{1,3}|10[0-1][0-9]|102[0-2]|1023)``."""
    digits = str(top)
    shorter = len(digits) - 1
    parts = [] if not shorter else ["[0-9]"] if shorter == 1 else [f"[0-9]{{1,{shorter}}}"]
    for i, digit in enumerate(digits):
        first = 1 if i == 0 and len(digits) > 1 else 0  # a leading 0 is covered by 0*
        if int(digit) > first:
            low = f"[{first}-{int(digit) - 1}]" if int(digit) - 1 > first else str(first)
            rest = len(digits) - i - 1
            parts.append(digits[:i] + low + (f"[0-9]{{{rest}}}" if rest > 1 else
                                             "[0-9]" if rest == 1 else ""))
    parts.append(digits)
    return "0*(?:" + "|".join(parts) + ")"


_GPU_INDEX = index_regex(MAX_GPU_INDEX)
GPU_STRING_PATTERN = rf"^\s*{_GPU_INDEX}\s*(?:,\s*{_GPU_INDEX}\s*)*$"
GPU_ITEM_PATTERN = rf"^{_GPU_INDEX}$"
# A GPU string naming one index twice ("0,1,1", "1, 01"): an entry, leading
# zeros aside, found again further on (a backreference, as ECMA-262 has).
GPU_DUPLICATE_PATTERN = r"(?:^|,)\s*0*([0-9]+)\s*,(?:.*,)?\s*0*\1\s*(?:,|$)"

# What the loader refuses and this schema cannot say, for docs/cluster-file.md; each
# has an example that passes the schema in tests/unit/config/test_schema.py.
LEFT_TO_THE_LOADER = (
    "YAML itself: a key given twice, anchors and aliases (and `<<` merge keys), tags, "
    "a second document",
    "a whole number written as a float (`procs: 2.0`, `epochs: 2.0`): JSON Schema counts "
    "2.0 as an integer",
    "YAML 1.1's readings: `time: 12:00:00` is the number 43200 to a schema",
    "one GPU listed twice in two spellings of a list (`[0, \"0\"]`, `[1, \"01\"]`)",
    "two nodes on one host sharing a GPU",
    "under backend: slurm, one host listed twice, or a node's GPUs asked for by what it "
    "wants (`gpus: free:2`): Slurm chooses them",
    "one host listed twice where an entry asks for `all`, `free` or `free:N`",
    "a `gpu_policy.exclude` entry whose host is not a node's",
    "what is on disk: the identity_file, the script (inside the code directory), the code "
    "directory itself (not the filesystem root or a home directory), a `setup.when_changed` "
    "file that is a directory there",
)


def _keyed(keys: Iterable[str], table: Mapping[str, dict[str, Any]], level: str) -> dict[str, Any]:
    """``properties`` in the loader's key order; a key without a schema (or a
    schema without a key) is a programming error, raised on every call."""
    keys = tuple(keys)
    if set(keys) != set(table):
        raise RuntimeError(f"{level}: schema keys {sorted(table)} differ from the loader's "
                           f"{sorted(keys)}")
    return {key: table[key] for key in keys}


def _mapping(keys: Iterable[str], table: Mapping[str, dict[str, Any]], level: str,
             description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "description": description,
            "properties": _keyed(keys, table, level), "additionalProperties": False, **extra}


def _port(description: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": 1, "maximum": 65535, "description": description}


def _ssh() -> dict[str, Any]:
    return _mapping(SSH_KEYS, {
        "user": {"type": "string", "pattern": _NON_BLANK,
                 "description": "SSH user name; default: ~/.ssh/config, then your local "
                                "user name."},
        "port": _port("SSH port; default: ~/.ssh/config, then 22."),
        "identity_file": {
            "type": "string", "pattern": r"^[/~]",
            "description": "Private key file, an absolute path or one under ~/ (e.g. "
                           "~/.ssh/id_ed25519); default: ~/.ssh/config, then ssh-agent and "
                           "~/.ssh/id_*. Passwords are never accepted."},
        "strict_host_keys": {
            "enum": ["yes", "accept-new", True],
            "description": "yes (the default): an unknown host key is refused; accept-new: "
                           "trust a host's first key. Checking cannot be turned off."},
        "connect_timeout": {"type": "integer", "minimum": 1, "maximum": MAX_CONNECT_TIMEOUT,
                            "description": "Seconds to wait for an SSH connection (default 10)."},
    }, "ssh", "SSH settings. At the top: defaults for every node; in a node: overrides "
              "for that node. Anything not given comes from ~/.ssh/config.")


def _env() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Environment variables exported on every node (a node's own `env:` "
                       "merges over the top-level one). Variables that torchrun or ddp-orch "
                       "set (RANK, MASTER_ADDR, CUDA_VISIBLE_DEVICES, DDP_ORCH_*, ...) cannot "
                       "be set here.",
        "propertyNames": {
            "pattern": ENV_NAME_RE.pattern,
            "not": {"anyOf": [{"enum": sorted(RESERVED_ENV)}, {"pattern": "^DDP_ORCH_"}]},
        },
        "additionalProperties": {
            "type": ["string", "number", "boolean"],
            "description": "The value (true/false become 1/0).",
        },
    }


def _python() -> dict[str, Any]:
    return {"type": "string", "pattern": r"^\S+$",
            "description": "Python interpreter on the nodes, with torch installed (one path, no "
                           "arguments; ~/ is each node's own home); default: python3, and for "
                           "localhost nodes the Python running ddp-orch."}


def _gpus() -> dict[str, Any]:
    return {
        "description": "GPU indices as nvidia-smi lists them, \"3,4,5\" or [3, 4, 5]: one "
                       "process per GPU, exported as CUDA_VISIBLE_DEVICES; or all, free, "
                       "free:N, chosen on the node at launch. Give gpus or procs.",
        "oneOf": [
            {"enum": list(GPU_REQUESTS),
             "description": "all: every GPU of the node; free: every free one (at least one), "
                            "chosen at launch."},
            {"type": "string", "pattern": FREE_N_RE.pattern,
             "description": "free:N: N free GPUs, chosen at launch (least memory used first)."},
            {"type": "string", "pattern": GPU_STRING_PATTERN,
             "not": {"pattern": GPU_DUPLICATE_PATTERN},
             "description": "Comma-separated GPU indices, each once, e.g. \"0,1\"."},
            {"type": "integer", "minimum": 0, "maximum": MAX_GPU_INDEX,
             "description": "One GPU index."},
            {"type": "array", "minItems": 1, "uniqueItems": True,
             "description": "A list of distinct GPU indices, e.g. [0, 1].",
             "items": {"oneOf": [
                 {"type": "integer", "minimum": 0, "maximum": MAX_GPU_INDEX},
                 {"type": "string", "pattern": GPU_ITEM_PATTERN},
             ]}},
        ],
    }


def _node() -> dict[str, Any]:
    return _mapping(NODE_KEYS, {
        "host": {"type": "string", "pattern": HOST_RE.pattern,
                 "description": "Host name (or ~/.ssh/config alias) or address; localhost runs "
                                "the node on this machine."},
        "gpus": _gpus(),
        "procs": {"type": "integer", "minimum": 1, "maximum": MAX_PROCS,
                  "description": "A node without GPUs: this many CPU processes (the job then "
                                 "runs on CPU). Give gpus or procs."},
        "ssh": {"$ref": "#/$defs/ssh"},
        "python": {"$ref": "#/$defs/python"},
        "env": {"$ref": "#/$defs/env"},
    }, "nodes[]", "One machine: its host and either gpus or procs, plus optional "
                  "python, env and ssh overrides.",
        required=["host"],
        oneOf=[{"required": ["gpus"]}, {"required": ["procs"]}])


def _placed() -> dict[str, Any]:
    return _mapping(COUNT_KEYS, {
        "count": {"type": "integer", "minimum": 1, "maximum": MAX_NODES,
                  "description": "How many nodes Slurm chooses (backend: slurm)."},
        "gpus": {"type": "integer", "minimum": 1, "maximum": MAX_GPU_INDEX + 1,
                 "description": "GPUs per node from Slurm's GRES; one process each."},
        "procs": {"type": "integer", "minimum": 1, "maximum": MAX_PROCS,
                  "description": "CPU processes per node (the job runs on CPU)."},
    }, "nodes", "Nodes that Slurm places: a count, and gpus or procs per node.",
        required=["count"], oneOf=[{"required": ["gpus"]}, {"required": ["procs"]}])


def _master() -> dict[str, Any]:
    return _mapping(MASTER_KEYS, {
        "addr": {"type": "string", "pattern": HOST_RE.pattern,
                 "description": "Address the other nodes reach global rank 0 at; default: the "
                                "first node's host (its HostName in ~/.ssh/config)."},
        "port": {
            "description": f"Rendezvous port, e.g. {DEFAULT_PORT}; default: {AUTO_PORT} (a free "
                           "port on node 0, picked at launch).",
            "default": AUTO_PORT,
            "oneOf": [_port("A fixed port."),
                      {"const": AUTO_PORT,
                       "description": "A free port on node 0, picked at launch."}],
        },
    }, "master", "Where torchrun's static rendezvous listens (global rank 0).")


def _workload(catalog: Catalog) -> dict[str, Any]:
    return _mapping(WORKLOAD_KEYS, {
        "name": {"enum": list(catalog),
                 "description": "A built-in workload (`ddp-orch workloads` lists them and their "
                                "arguments)."},
        "script": {"type": "string", "pattern": _NON_BLANK,
                   "description": "Your script, run as `python SCRIPT ARGS` in the code "
                                  "directory on every node: relative to `code` when given, "
                                  "else to this file (its directory is then the code)."},
        "module": {"type": "string", "pattern": MODULE_RE.pattern,
                   "maxLength": MAX_MODULE_NAME,
                   "description": "Your module, run as `python -m MODULE ARGS` in the code "
                                  "directory on every node, e.g. pkg.train."},
        "code": {"type": "string", "pattern": _NON_BLANK,
                 "description": "Your project's directory, relative to this file: uploaded "
                                "to every node (.gitignore'd, secret-looking files and caches "
                                "left out; 64 MiB at most) and the working directory of every "
                                "rank there. Default: the script's directory, else this "
                                "file's. Not the filesystem root or a home directory."},
        "args": {
            "description": "Arguments passed to the program: a mapping (epochs: 10 -> --epochs "
                           "10; true/false -> --x/--no-x; a list -> one flag, several values; "
                           "null -> the bare flag), or a list passed verbatim, each item one "
                           "argument as written ([configs/x.yaml, --lr=0.1, -v, 50]). A "
                           "built-in workload's arguments are a mapping, checked by ddp-orch.",
            "oneOf": [
                {"type": "object", "propertyNames": {"minLength": 1},
                 "additionalProperties": {"anyOf": [_SCALAR,
                                                    {"type": "array", "items": _SCALAR}]}},
                {"type": "array",
                 "items": {"type": ["string", "number", "boolean"]}},
            ],
        },
    }, "workload", "What to run: a built-in workload (name), or your script or module run "
                   "from your code directory (code), with args.",
        oneOf=[{"required": ["name"]}, {"required": ["script"]}, {"required": ["module"]}],
        # code goes with script or module; a built-in's args are a mapping,
        # each argument its own type, choices and minimum
        allOf=[{"if": {"required": ["name"]},
                "then": {"not": {"anyOf": [{"required": ["code"]},
                                           {"properties": {"args": {"type": "array"}},
                                            "required": ["args"]}]}}},
               *({"if": {"properties": {"name": {"const": name}}, "required": ["name"]},
                  "then": {"properties": {"args": _builtin_args(info)}}}
                 for name, info in catalog.workloads.items())])


def _builtin_args(info: Any) -> dict[str, Any]:
    """A built-in workload's arguments as ``loader.check_workload_args`` checks
    them: its names only ('-' or '_' between words), each value valid."""
    return {"type": "object", "additionalProperties": False,
            "description": f"The arguments of {info.name} (`ddp-orch workloads`).",
            "patternProperties": {"^" + arg.name.replace("_", "[-_]") + "$": _arg_value(arg)
                                  for arg in info.args}}


def _arg_value(arg: Any) -> dict[str, Any]:
    """One argument's value: the loader's ``_matches_type`` (a whole number is
    a fine float; a string argument takes a number too, never a bool)."""
    if arg.choices:
        value: dict[str, Any] = {"enum": list(arg.choices)}
    else:
        value = {"type": {bool: "boolean", int: "integer", float: "number"}.get(
            arg.type, ["string", "number"])}
    if arg.minimum is not None:
        value["minimum"] = arg.minimum
    return {**value, "description": arg.help}


def _setup() -> dict[str, Any]:
    shell = {"type": "string", "pattern": _NON_BLANK,
             "description": "Shell text, run by the node's `sh -c` in the code root, as "
                            "SkyPilot's setup (pipes, &&, $VARS and globs work)."}
    argv = {"type": "array", "minItems": 1, "items": {"type": ["string", "number"]},
            "description": "One program and its arguments, run as they are (no shell: "
                           "nothing is expanded or split)."}
    commands = [shell, {"type": "array", "maxItems": MAX_SETUP_COMMANDS,
                        "items": {"oneOf": [shell, argv]},
                        "description": "Several commands, run in turn; the first that fails "
                                       "ends the setup."}]
    path = {"type": "string", "pattern": _NON_BLANK,
            "not": {"anyOf": [{"pattern": r"^[/~\\]"},
                              {"pattern": r"(?:^|[/\\])\.\.(?:[/\\]|$)"},
                              {"pattern": r"[*?\[\x00-\x1f]"}, {"pattern": r"/$"},
                              {"pattern": r"^[/. ]*$"}]},
            "description": "A file relative to the code root (requirements.txt); never "
                           "absolute, ~, .., a glob or a directory."}
    block = {"type": "object", "additionalProperties": False, "required": ["commands"],
             "properties": _keyed(SETUP_KEYS, {
                 "commands": {"description": "The setup's commands, as setup: takes them.",
                              "oneOf": commands},
                 "when_changed": {
                     "description": "Run the setup on a node only when these files' content, "
                                    "the commands, the env or the python changed since its "
                                    "last successful setup there: for a setup whose effect "
                                    "outlives the run (a pip install into the node's python).",
                     "oneOf": [path, {"type": "array", "minItems": 1,
                                      "maxItems": MAX_WHEN_CHANGED, "uniqueItems": True,
                                      "items": path}]}}, "setup")}
    return {"description": "Commands run on every node, in parallel, before torchrun "
                           "starts: in the node's code root, with the run's environment, "
                           "once per run (not per restart). Output goes to the console and "
                           "the node log; a failure stops the run before any rank starts. "
                           "As a mapping, `commands` and `when_changed`.",
            "oneOf": [*commands, block]}


def _outputs() -> dict[str, Any]:
    pattern = {"type": "string", "pattern": _NON_BLANK,
               "not": {"anyOf": [{"pattern": r"^[/~\\]"},
                                 {"pattern": r"(?:^|[/\\])\.\.(?:[/\\]|$)"}]},
               "description": "A path or glob relative to the code root (out/metrics.json, "
                              "out/*.png, out/, checkpoints/**/*.pt); never absolute, ~ or "
                              ".."}
    return {"description": "Files brought home from node 0's code root after the run (also "
                           "after a failure), into the run directory's outputs/. Size-capped; "
                           "links, devices and paths outside the code root are refused.",
            "oneOf": [pattern, {"type": "array", "maxItems": MAX_OUTPUTS, "items": pattern}]}


def _given(key: str, value: Any) -> dict[str, Any]:
    """``key`` is given, with ``value``."""
    return {"properties": {key: {"const": value}}, "required": [key]}


_LOCALHOST = {"const": sorted(LOCAL_HOSTS)[0]} if len(LOCAL_HOSTS) == 1 else \
    {"enum": sorted(LOCAL_HOSTS)}
_ALL_LOCAL = {"type": "array", "items": {"properties": {"host": _LOCALHOST}}}


def _between_fields() -> list[dict[str, Any]]:
    """The loader's rules between fields, as far as JSON Schema says them; each
    puts its error on the field the loader names."""
    cpu_node = {"type": "object", "required": ["procs"]}
    remote_node = {"type": "object", "required": ["host"],
                   "properties": {"host": {"not": _LOCALHOST}}}
    return [
        {"description": "device: cuda: no procs: node (CPU processes cannot join a CUDA job)",
         "if": {"properties": {"nodes": {"anyOf": [
             cpu_node, {"type": "array", "contains": cpu_node}]}}, "required": ["nodes"]},
         "then": {"properties": {"device": {"not": {"const": "cuda"}}}}},
        {"description": "backend: local runs every node here: every host is localhost",
         "if": {"properties": {"nodes": {"type": "array", "contains": remote_node}},
                "required": ["nodes"]},
         "then": {"properties": {"backend": {"not": {"const": "local"}}}}},
        *[rule for block in blocks(plugins=True)
          for rule in block.schema_rules(_given, _LOCALHOST, BACKENDS)],
        {"description": "workdir is where runs live on remote nodes: not with every node "
                        "localhost (their files are in the local run directory)",
         "if": {"properties": {"nodes": _ALL_LOCAL}, "required": ["nodes"]},
         "then": {"properties": {"workdir": False}}},
        {"description": "a localhost node 0 among remote nodes needs master.addr (this "
                        "machine's address as the others see it)",
         "if": {"properties": {"nodes": {
             "type": "array",
             "prefixItems": [{"properties": {"host": _LOCALHOST}, "required": ["host"]}],
             "contains": remote_node}}, "required": ["nodes"]},
         "then": {"required": ["master"], "properties": {"master": {"required": ["addr"]}}}},
    ]


def cluster_schema(catalog: Catalog | None = None) -> dict[str, Any]:
    """The JSON Schema of a cluster file (a fresh dict on every call), with the
    installed plugins' backends and blocks, and ``catalog``'s workloads (the
    built-in ones by default)."""
    top = _keyed(top_keys(CORE_KEYS, plugins=True), {
        "name": {"type": ["string", "number"], "pattern": NAME_RE.pattern,
                 "description": "Run name, used in run ids (letters, digits, '.', '_' or '-'; "
                                "at most 64); default: the workload's name."},
        "master": {"$ref": "#/$defs/master"},
        "ssh": {"$ref": "#/$defs/ssh"},
        "python": {"$ref": "#/$defs/python"},
        "workdir": {"type": "string", "pattern": r"^(?:/|~(?:/|$))", "default": DEFAULT_WORKDIR,
                    "description": "Where runs live on the nodes: an absolute path or one "
                                   f"under ~/ (default {DEFAULT_WORKDIR})."},
        "env": {"$ref": "#/$defs/env"},
        "device": {"enum": list(DEVICES), "default": "auto",
                   "description": "auto | cuda | cpu. cpu: gloo on the CPU, each listed GPU index "
                                  "becomes one CPU process (handy for rehearsals)."},
        "backend": {"enum": list(backend_names()),
                    "description": "How nodes are launched: local (every node on this machine), "
                                   "ssh, or slurm (sbatch from a login host), or an installed "
                                   "plugin's (`ddp-orch backends`); default: slurm "
                                   "with a slurm: block or a node count, else local when every "
                                   "host is localhost, else ssh."},
        **{block.KEY: {"$ref": f"#/$defs/{block.KEY}"} for block in blocks(plugins=True)},
        "hang_timeout": {"type": "integer", "minimum": MIN_HANG_TIMEOUT,
                         "maximum": MAX_HANG_TIMEOUT,
                         "description": "Seconds without progress from any rank (output or a "
                                        "step heartbeat) after which the run counts as hung: "
                                        "stacks are dumped, the odd rank named, the run "
                                        "stopped; default off. `up --hang-timeout` overrides."},
        "max_restarts": {"type": "integer", "minimum": 0, "maximum": MAX_RESTARTS,
                         "description": "Whole-gang restarts after a failure, for the whole "
                                        "job (not per node): every node stops, and the job "
                                        "starts again on a fresh port with "
                                        "DDP_ORCH_RESTART_COUNT raised; not after an error "
                                        "that recurs, down or Ctrl-C. Default 0. "
                                        "`up --max-restarts` overrides."},
        "network": _mapping(NETWORK_KEYS, {
            "interface": {
                "description": "The interface the ranks' own connections use (Gloo's and "
                               "NCCL's *_SOCKET_IFNAME) on every node; a value set in env "
                               "wins. Default auto.",
                "default": "auto",
                "oneOf": [
                    {"const": "auto", "description": "Each node finds the interface it "
                                                     "reaches the rendezvous through."},
                    {"const": "off", "description": "Set nothing: Gloo and NCCL choose."},
                    {"const": False, "description": "off, as YAML 1.1 reads a bare off."},
                    {"type": "string", "pattern": IFNAME_RE.pattern,
                     "not": {"enum": ["auto", "off"]},
                     "description": "This interface on every node, e.g. eth0."}]},
        }, "network", "How the ranks reach each other."),
        "gpu_policy": _mapping(GPU_POLICY_KEYS, {
            "busy_memory_mib": {"type": "integer", "minimum": 0, "maximum": MAX_BUSY_MIB,
                                "default": DEFAULT_GPU_BUSY_MIB,
                                "description": "A GPU using more memory than this (MiB) is "
                                               "busy, even with no process in sight."},
            "busy_utilization": {"type": "integer", "minimum": 0, "maximum": 100,
                                 "default": DEFAULT_GPU_BUSY_UTIL,
                                 "description": "A GPU more utilised than this (percent) is "
                                                "busy, even with little memory in use; 100 "
                                                "turns the rule off."},
            "wait": {"type": "integer", "minimum": 0, "maximum": MAX_GPU_WAIT, "default": 0,
                     "description": "Seconds a launch waits for enough free GPUs, naming who "
                                    "holds them every 30 s; 0 refuses at once. `up "
                                    "--wait-gpus` overrides."},
            "ignore": {"description": "Health rules this site relaxes: a GPU that breaks only "
                                      "these is taken (one or a list).",
                       "oneOf": [{"enum": list(HEALTH_RULES)},
                                 {"type": "array", "items": {"enum": list(HEALTH_RULES)}}]},
            "exclude": {"description": "GPUs taken out by hand, HOST:INDEX (the host one of "
                                       "the nodes'; an IPv6 one in brackets): never chosen, "
                                       "refused when listed (one or a list).",
                        "oneOf": [{"type": "string", "pattern": _EXCLUDE},
                                  {"type": "array", "maxItems": MAX_EXCLUDED,
                                   "items": {"type": "string", "pattern": _EXCLUDE}}]},
            "lock_dir": {"type": "string", "pattern": "^/",
                         "description": "Where every node keeps its GPU locks: a directory on "
                                        "its own disk every user may write to (default "
                                        "/run/lock/ddp-orch-gpus where /run/lock is, else "
                                        "/tmp/ddp-orch-gpus)."},
        }, "gpu_policy", "What makes a GPU busy or unfit, how long a launch waits for free "
                         "ones, and where the locks live."),
        "nodes": {"description": "The machines in node-rank order (a list), or, under "
                                 "backend: slurm, a count of nodes that Slurm chooses.",
                  "oneOf": [
            {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/node"},
             "description": "The machines, in node-rank order; global ranks are prefix "
                            "sums of their process counts."},
            {"$ref": "#/$defs/placed"}]},
        "workload": {"$ref": "#/$defs/workload"},
        "setup": _setup(),
        "setup_timeout": {"type": "integer", "minimum": 1, "maximum": MAX_SETUP_TIMEOUT,
                          "default": int(DEFAULT_SETUP_TIMEOUT),
                          "description": "Seconds a node's whole setup may take (default "
                                         f"{DEFAULT_SETUP_TIMEOUT:g}); past it, the command "
                                         "running is ended and the run fails before any "
                                         "rank starts."},
        "outputs": _outputs(),
        "progress": _mapping(PROGRESS_KEYS, {
            "pattern": {"type": "string", "maxLength": MAX_PROGRESS_PATTERN,
                        "description": "A Python regular expression matched in each output "
                                       "line of a rank that makes no step report; its first "
                                       "group (or the group named step) is the step. Default: "
                                       "`step N`, `iter N` and progress bars' `N/M [`."},
        }, "progress", "How a rank's step is read from the lines it prints."),
    }, "top level")
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": SCHEMA_ID,
        "title": "ddp-orch cluster file",
        "description": "One DDP job on a few machines: its nodes and workload (both required), "
                       "and optional run name, rendezvous, SSH, Python, environment and device "
                       "settings. See cluster.yaml.example.",
        "type": "object",
        "properties": top,
        "additionalProperties": False,
        "required": ["nodes", "workload"],
        "allOf": _between_fields(),
        "$defs": {
            "master": _master(),
            "ssh": _ssh(),
            "python": _python(),
            "env": _env(),
            "node": _node(),
            "placed": _placed(),
            **{block.KEY: block.schema(_mapping) for block in blocks(plugins=True)},
            "workload": _workload(catalog or builtin()),
        },
    }
