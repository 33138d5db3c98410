"""Cluster file → ``ClusterSpec``; each reader names its field path, so an
error in ``nodes[1].gpus`` says so, with the line, the value and a fix.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Mapping

import yaml

from ..agent.node.gpus import HEALTH_RULES
from ..agent.node.outputs import pattern_problem
from ..agent.node.outputsteps import compile_pattern
from ..agent.node.setupstamp import path_problem
from ..errors import ConfigError
from .blocks import blocks, top_keys
from .catalog import Catalog, Workload, builtin
from .limits import backend_names
from .spec import (AUTO_PORT, BACKENDS, DEFAULT_SETUP_TIMEOUT, DEFAULT_WORKDIR, GPU_REQUESTS,
                   LOCAL_HOSTS, MAX_GPU_WAIT, MAX_HANG_TIMEOUT, MAX_RESTARTS, MIN_HANG_TIMEOUT,
                   ClusterSpec, NodeSpec, SshSpec, WorkloadSpec, default_backend)
from .yamlsrc import Located, closest_hint, line_at, parse, shown

CORE_KEYS = ("name", "master", "ssh", "python", "workdir", "env", "device", "backend",
             "hang_timeout", "max_restarts", "network", "gpu_policy", "nodes", "workload",
             "setup", "setup_timeout", "outputs", "progress")
# The core keys, and each built-in backend's block after the key it follows.
TOP_KEYS = top_keys(CORE_KEYS)
MAX_SETUP_COMMANDS = 100
SETUP_KEYS = ("commands", "when_changed")  # ``setup:`` as a mapping
MAX_WHEN_CHANGED = 100
MAX_SETUP_TIMEOUT = 7 * 86400
MAX_OUTPUTS = 100
NODE_KEYS = ("host", "gpus", "procs", "ssh", "python", "env")
COUNT_KEYS = ("count", "gpus", "procs")  # nodes: {count: N, gpus: G} (Slurm places them)
MAX_NODES = 4096
SSH_KEYS = ("user", "port", "identity_file", "strict_host_keys", "connect_timeout")
MASTER_KEYS = ("addr", "port")
NETWORK_KEYS = ("interface",)
PROGRESS_KEYS = ("pattern",)
MAX_PROGRESS_PATTERN = 500
GPU_POLICY_KEYS = ("busy_memory_mib", "busy_utilization", "wait", "ignore", "exclude",
                   "lock_dir")
MAX_BUSY_MIB = 1 << 20
MAX_EXCLUDED = 4096
# ``exclude: [gpu-a:3]``: a node's host (an IPv6 one in brackets) and a GPU index.
EXCLUDE_RE = re.compile(r"^(?P<host>\[[^\]]+\]|[^:\[\]]+):(?P<index>[0-9]+)$")
# ``free:3``: three free GPUs (1 to 1024, as many as there are indices),
# chosen on the node at launch.
FREE_N_RE = re.compile(r"^free:(?:[1-9][0-9]{0,2}|10[01][0-9]|102[0-4])$")
# A Linux interface name (at most 15 bytes, no '/', ':', ',' or space), or auto | off.
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,15}$")
WORKLOAD_KEYS = ("name", "script", "module", "code", "args")
PROGRAM_KEYS = ("name", "script", "module")  # exactly one of them
# What ``python -m`` takes: a dotted name of identifiers (ASCII, as module files are named).
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_MODULE_NAME = 255
DEVICES = ("auto", "cuda", "cpu")
MAX_CONNECT_TIMEOUT = 600
MAX_GPU_INDEX = 1023
MAX_PROCS = 1024

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A host name or IPv4 address, or an IPv6 literal, bare or in brackets
# (``_host`` checks that it is one, and keeps it bare).
HOST_RE = re.compile(r"^(?:[A-Za-z0-9_.%-]+|\[?[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*"
                     r"(?:%[A-Za-z0-9_.-]+)?\]?)$")
_DIGITS_RE = re.compile(r"^[0-9]+$")  # ASCII only: "²".isdigit() is True, int("²") fails
# Set by torchrun or by ddp-orch itself; a user value would be silently wrong.
RESERVED_ENV = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCH_ELASTIC_WORKER_IDENTICAL",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTHONPATH", "PYTHONUNBUFFERED",
})


def load_cluster_file(path: str, catalog: Catalog | None = None) -> ClusterSpec:
    """Read and validate a cluster file; raise ``ConfigError`` on any problem."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise ConfigError(f"no such file: {path}",
                          hint="pass the path of a cluster file, e.g. cluster.yaml.example") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    text = _decode(data, path)
    return load_cluster_text(text, source=path, base_dir=os.path.dirname(os.path.abspath(path)),
                             catalog=catalog)


def _decode(data: bytes, path: str) -> str:
    """The file as UTF-8 text; a binary or Latin-1 file is an error at its line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[:exc.start].decode("utf-8")  # valid: the error is the first one
        line = line_at(before, len(before))
        raise ConfigError(f"not UTF-8 text: byte 0x{data[exc.start]:02x} cannot be decoded",
                          source=path, line=line,
                          hint="save the file as UTF-8 (a cluster file is plain text)") from None


def load_cluster_text(text: str, *, source: str = "<text>", base_dir: str = ".",
                      catalog: Catalog | None = None) -> ClusterSpec:
    """Validate cluster-file ``text``; relative script paths resolve from ``base_dir``;
    ``workload: {name}`` is one of ``catalog``'s (the built-in workloads' by default)."""
    catalog = catalog or builtin()
    root = parse(text, source)
    plugins = _names_a_plugin(root)
    known = blocks(plugins)
    top = root.mapping(top_keys(CORE_KEYS, plugins) if plugins else TOP_KEYS)
    ssh_default = _ssh(top["ssh"], SshSpec()) if "ssh" in top else SshSpec()
    python = _python(top["python"]) if "python" in top else None
    env = _env(top["env"]) if "env" in top else {}
    if "nodes" not in top:
        raise root.error("missing 'nodes'", hint="list at least one node with host and gpus")
    placed = top["nodes"].has_key("count")  # nodes: {count: N, ...}: a scheduler places them
    # The backend whose block says it places nodes (``PLACES_NODES``): it names them.
    placer = _placer(known, top) if placed else None
    warnings: list[str] = []
    nodes = _placed_nodes(top["nodes"], python, env, placer) if placed else \
        _nodes(top["nodes"], ssh_default, python, env, warnings)
    if "workload" not in top:
        raise root.error("missing 'workload'",
                         hint="add `workload: {name: linear}` (see `ddp-orch workloads`)")
    workload = _workload(top["workload"], base_dir, catalog)
    master_addr, master_port = _master(top["master"]) if "master" in top else (None, AUTO_PORT)
    device = _device(top["device"]) if "device" in top else "auto"
    given = [block for block in known if block.KEY in top]
    if "backend" in top:
        backend = top["backend"].scalar() if top["backend"].scalar() in BACKENDS \
            else _choice(top["backend"], backend_names())  # a plugin's, or a mistake
    elif placer or given:
        backend = (placer or given[0]).BACKEND
    else:
        backend = default_backend([node.host for node in nodes])
    spec = ClusterSpec(
        name=_run_name(top["name"]) if "name" in top else default_name(workload),
        backend=backend,
        master_addr=master_addr, master_port=master_port,
        workdir=_workdir(top["workdir"]) if "workdir" in top else DEFAULT_WORKDIR,
        device=device, env=env, nodes=nodes, workload=workload, source=source, text=text,
        blocks={block.KEY: block.load(top[block.KEY]) if block.KEY in top else block.Spec()
                for block in known if block.KEY in top or block.BACKEND == backend},
        placed=placed,
        hang_timeout=float(top["hang_timeout"].integer(MIN_HANG_TIMEOUT, MAX_HANG_TIMEOUT))
        if "hang_timeout" in top else None,
        max_restarts=top["max_restarts"].integer(0, MAX_RESTARTS) if "max_restarts" in top else 0,
        interface=_network(top["network"]) if "network" in top else "auto",
        **(_setup_block(top["setup"], workload, warnings) if "setup" in top else {}),
        setup_timeout=float(top["setup_timeout"].integer(1, MAX_SETUP_TIMEOUT))
        if "setup_timeout" in top else DEFAULT_SETUP_TIMEOUT,
        outputs=_outputs(top["outputs"]) if "outputs" in top else (),
        progress_pattern=_progress(top["progress"]) if "progress" in top else None,
        base_dir=os.path.abspath(base_dir),
        **(_gpu_policy(top["gpu_policy"], nodes) if "gpu_policy" in top else {}),
        warnings=tuple(warnings), catalog=catalog)
    for block in known:
        if block.BACKEND == backend:
            block.check_layout(spec, top, NODE_KEYS)
    _check_layout(spec, top)
    for block in known:
        if block.BACKEND != backend and (block.KEY in top or (placed and block.PLACES_NODES)):
            where = top[block.KEY] if block.KEY in top else top["nodes"]
            what = f"{block.KEY}: settings" if block.KEY in top else block.PLACED_WORDS
            raise where.error(f"{what} need backend: {block.BACKEND}, but the backend is "
                              f"{backend}", hint=f"set `backend: {block.BACKEND}`, or list the "
                                                 "nodes with their hosts")
    return spec


def _run_name(field: Located) -> str:
    value = field.scalar()
    if value is None or isinstance(value, (bool, bytes)):
        raise field.error(f"expected a run name, got {field.describe()}",
                          hint="use letters, digits, '.', '_' or '-' (at most 64)")
    name = str(value)
    if not NAME_RE.match(name):
        raise field.error(f"{name!r} is not usable in a run id",
                          hint="use letters, digits, '.', '_' or '-' (at most 64)")
    return name


def default_name(workload: WorkloadSpec) -> str:
    """A run name from the workload: ``linear``, ``train`` (train.py), ``pkg.train``."""
    stem = workload.name or workload.module or \
        os.path.splitext(os.path.basename(workload.script or "run"))[0]
    return re.sub(r"[^A-Za-z0-9._-]", "-", stem)[:64] or "run"


def _choice(field: Located, choices: tuple[str, ...]) -> str:
    value = field.scalar()
    if value not in choices:
        raise field.error(f"{value!r} is not one of {', '.join(choices)}",
                          hint=closest_hint(str(value), choices))
    return value


def _device(field: Located) -> str:
    """``device:``; ``gpu`` means ``cuda``, never a misspelt ``cpu``."""
    if str(field.scalar()).lower() in ("gpu", "gpus", "nvidia", "cuda:0"):
        raise field.error(f"{field.scalar()!r} is not one of {', '.join(DEVICES)}",
                          hint="did you mean 'cuda'? (GPUs; `cpu` runs on the CPU)")
    return _choice(field, DEVICES)


def _port(field: Located) -> int:
    return field.integer(1, 65535)


def _master(field: Located) -> tuple[str | None, int | str]:
    entries = field.mapping(MASTER_KEYS)
    addr = _host(entries["addr"]) if "addr" in entries else None
    port: int | str = AUTO_PORT
    if "port" in entries:
        port = AUTO_PORT if entries["port"].scalar() == AUTO_PORT else _port(entries["port"])
    return addr, port


def _network(field: Located) -> str:
    """``network: {interface: auto | off | NAME}`` (``plan/network.py``)."""
    entries = field.mapping(NETWORK_KEYS)
    if "interface" not in entries:
        return "auto"
    if entries["interface"].scalar() is False:  # YAML 1.1 reads a bare `off` as false
        return "off"
    value = entries["interface"].string()
    if not IFNAME_RE.match(value):
        raise entries["interface"].error(
            f"{value!r} is not an interface name",
            hint="auto (each node finds its own), off (leave it to Gloo and NCCL), or one "
                 "name such as eth0 that every node has; set GLOO_SOCKET_IFNAME in a "
                 "node's env where names differ")
    return value


def _progress(field: Located) -> str | None:
    """``progress: {pattern: REGEX}``: a rank's step, in a program's own words."""
    entries = field.mapping(PROGRESS_KEYS)
    if "pattern" not in entries:
        return None
    pattern = entries["pattern"].string()
    try:
        if len(pattern) > MAX_PROGRESS_PATTERN:
            raise ValueError(f"is longer than {MAX_PROGRESS_PATTERN} characters")
        compile_pattern(pattern)
    except ValueError as exc:
        raise entries["pattern"].error(
            f"{pattern!r} {exc}",
            hint="a Python regular expression matched in each output line, its first group "
                 "(or the group named step) the step's digits: 'it (\\d+)/' or "
                 "'(?P<step>\\d+) batches done'") from None
    return pattern


def _gpu_policy(field: Located, nodes: "tuple[NodeSpec, ...]") -> dict[str, Any]:
    """``gpu_policy:``: busy thresholds (MiB, percent), the launch ``wait``
    (seconds), ``ignore``d health rules, ``exclude``d GPUs and ``lock_dir``."""
    entries = field.mapping(GPU_POLICY_KEYS)
    out: dict[str, Any] = {}
    if "busy_memory_mib" in entries:
        out["gpu_busy_mib"] = entries["busy_memory_mib"].integer(0, MAX_BUSY_MIB)
    if "busy_utilization" in entries:
        out["gpu_busy_util"] = entries["busy_utilization"].integer(0, 100)
    if "wait" in entries:
        out["wait_gpus"] = float(entries["wait"].integer(0, MAX_GPU_WAIT))
    if "ignore" in entries:
        out["gpu_ignore"] = tuple(dict.fromkeys(
            _choice(item, HEALTH_RULES) for item in _one_or_list(entries["ignore"])))
    if "exclude" in entries:
        items = _one_or_list(entries["exclude"])
        if len(items) > MAX_EXCLUDED:
            raise entries["exclude"].error(f"{len(items)} GPUs excluded, more than "
                                           f"{MAX_EXCLUDED}")
        out["gpu_exclude"] = tuple(dict.fromkeys(_excluded(item, nodes) for item in items))
    if "lock_dir" in entries:
        out["gpu_lock_dir"] = _lock_dir(entries["lock_dir"])
    return out


def _one_or_list(field: Located) -> list[Located]:
    return field.sequence() if isinstance(field.node, yaml.SequenceNode) else [field]


def _excluded(field: Located, nodes: "tuple[NodeSpec, ...]") -> tuple[str, int]:
    """One ``gpu_policy.exclude`` entry, ``host:index``, as (host, index)."""
    value = field.scalar()
    found = EXCLUDE_RE.match(value) if isinstance(value, str) else None
    if found is None:
        raise field.error(f"{field.describe()} is not HOST:INDEX",
                          hint="name a node's host and a GPU index as nvidia-smi numbers "
                               "it there: gpu-a:3 (an IPv6 host in brackets: [fd77::10]:3)")
    host, index = found.group("host").strip("[]"), int(found.group("index"))
    hosts = list(dict.fromkeys(node.host for node in nodes))
    if host not in hosts:
        raise field.error(f"{host!r} is not the host of a node in this file",
                          hint=closest_hint(host, hosts) or f"its hosts: {', '.join(hosts)}")
    if index > MAX_GPU_INDEX:
        raise field.error(f"GPU index {index} is over {MAX_GPU_INDEX}")
    return host, index


def _lock_dir(field: Located) -> str:
    """``gpu_policy.lock_dir``: an absolute directory, node-local (never NFS)."""
    path = field.string()
    if not path.startswith("/") or "\0" in path or len(path) > 4000:
        raise field.error(f"{path!r} is not an absolute path",
                          hint="a directory on each node's own disk that every user may "
                               "write to, e.g. /run/lock/ddp-orch-gpus (never on NFS: flock "
                               "there is unreliable)")
    return path.rstrip("/") or "/"


def _host(field: Located) -> str:
    """A host name or address; IPv6 in brackets is kept bare, as torchrun and ssh take it."""
    host = field.string()
    if not HOST_RE.match(host):
        raise field.error(f"{host!r} is not a host name or address")
    if "[" in host or "]" in host or ":" in host:
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not _is_ipv6(bare):
            raise field.error(
                f"{host!r} is not a host name or address",
                hint="an IPv6 address is written fd77::10 or [fd77::10]; an SSH port goes in "
                     "`ssh: {port: N}`, the master's in `master: {port: N}`")
        host = bare
    return host


def _is_ipv6(text: str) -> bool:
    import ipaddress

    address, _, scope = text.partition("%")
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return False
    return "%" not in text or bool(re.match(r"^[A-Za-z0-9_.-]{1,15}$", scope))


def _python(field: Located) -> str:
    python = field.string()
    if any(ch.isspace() for ch in python):
        raise field.error(f"{python!r} contains spaces",
                          hint="give one interpreter path, e.g. /opt/conda/bin/python")
    return python


def _workdir(field: Located) -> str:
    workdir = field.string()
    if not (workdir.startswith("/") or workdir == "~" or workdir.startswith("~/")):
        raise field.error(f"{workdir!r} is a relative path",
                          hint="use an absolute path or one under ~/, e.g. ~/.ddp-orch")
    return workdir.rstrip("/") or "/"


def _env(field: Located, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(base or {})
    for name, value_field in field.mapping(None).items():
        problem = env_name_problem(name)
        if problem:
            raise value_field.error(problem[0], hint=problem[1] or "")
        value = value_field.scalar()
        if value is None or isinstance(value, (dict, list)):
            raise value_field.error(f"expected a string or number, got {value_field.describe()}")
        env[name] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return env


def env_name_problem(name: str) -> tuple[str, str | None] | None:
    """Why the user cannot set ``name``, with a hint; None if they can."""
    if not ENV_NAME_RE.match(name):
        return "not a valid environment variable name", None
    if name in RESERVED_ENV or name.startswith("DDP_ORCH_"):
        hint = "set GPUs with `gpus:`" if name == "CUDA_VISIBLE_DEVICES" else \
            "ddp-orch and torchrun set it for every process"
        return f"{name} cannot be set here", hint
    return None


def _ssh(field: Located, base: SshSpec) -> SshSpec:
    entries = field.mapping(SSH_KEYS + ("password",))
    if "password" in entries:
        raise entries["password"].error(
            "passwords are not accepted in a cluster file",
            hint="use an SSH key: identity_file, ssh-agent or ~/.ssh/config")
    values: dict[str, Any] = {}
    if "user" in entries:
        values["user"] = entries["user"].string()
    if "port" in entries:
        values["port"] = _port(entries["port"])
    if "identity_file" in entries:
        values["identity_file"] = _identity_file(entries["identity_file"])
    if "strict_host_keys" in entries:
        values["strict_host_keys"] = _strict(entries["strict_host_keys"])
    if "connect_timeout" in entries:
        values["connect_timeout"] = float(entries["connect_timeout"].integer(1, MAX_CONNECT_TIMEOUT))
    return SshSpec(**{**base.__dict__, **values})


def _strict(field: Located) -> str:
    value = field.scalar()
    if value is True or value == "yes":
        return "yes"
    if value == "accept-new":
        return "accept-new"
    raise field.error(f"{value!r} is not yes or accept-new",
                      hint="host keys are always checked; accept-new trusts a host's first key")


def _identity_file(field: Located) -> str:
    raw = field.string()
    path = os.path.expanduser(raw)
    if not os.path.isabs(path):
        raise field.error(f"{raw!r} is a relative path",
                          hint="use an absolute path or one under ~/, e.g. ~/.ssh/id_ed25519")
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise field.error(f"cannot read the key file {raw!r}",
                          hint="check the path and its permissions, or leave it out to use ssh-agent")
    return path


def _placed_nodes(field: Located, python: str | None, env: Mapping[str, str],
                  placer) -> tuple[NodeSpec, ...]:
    """``nodes: {count: N, gpus: G | procs: P}``: N nodes the scheduler places,
    named by ``placer.placed_host`` until the job runs."""
    entries = field.mapping(COUNT_KEYS)
    if "count" not in entries:
        raise field.error("missing 'count'", hint="nodes: {count: 2, gpus: 8} lets Slurm choose "
                                                  "2 nodes; or list the nodes with their hosts")
    if ("gpus" in entries) == ("procs" in entries):
        raise field.error("give exactly one of 'gpus' or 'procs'",
                          hint="gpus: G runs G processes per node on G GPUs from Slurm's "
                               "GRES; procs: P runs P CPU processes per node")
    count = entries["count"].integer(1, MAX_NODES)
    gpus = entries["gpus"].integer(1, MAX_GPU_INDEX + 1) if "gpus" in entries else None
    procs = entries["procs"].integer(1, MAX_PROCS) if "procs" in entries else None
    return tuple(NodeSpec(host=placer.placed_host(k), gpus=None, procs=procs, ssh=SshSpec(),
                          python=python or "python3", env=dict(env), line=field.line,
                          gpu_count=gpus) for k in range(count))


def _nodes(field: Located, ssh: SshSpec, python: str | None,
           env: Mapping[str, str], warnings: list[str]) -> tuple[NodeSpec, ...]:
    items = field.sequence()
    if not items:
        raise field.error("no nodes are listed", hint="add at least one node with host and gpus")
    nodes = []
    for item in items:
        entries = item.mapping(NODE_KEYS)
        if "host" not in entries:
            raise item.error("missing 'host'", hint="every node needs `host: NAME-OR-ADDRESS`")
        if ("gpus" in entries) == ("procs" in entries):
            raise item.error("give exactly one of 'gpus' or 'procs'",
                             hint="gpus: 0,1 runs one process per GPU; procs: N runs N CPU processes")
        host = _host(entries["host"])
        default_python = python or (sys.executable if host in LOCAL_HOSTS else "python3")
        gpus = _gpus(entries["gpus"]) if "gpus" in entries else None
        if gpus is not None:
            warned = one_index_warning(entries["gpus"].value(), gpus,
                                       f"{entries['gpus'].source}:{entries['gpus'].line}: "
                                       f"nodes[{len(nodes)}].gpus")
            warnings += [warned] if warned else []
        nodes.append(NodeSpec(
            host=host,
            gpus=gpus if not isinstance(gpus, str) else None,
            gpu_request=gpus if isinstance(gpus, str) else None,
            procs=entries["procs"].integer(1, MAX_PROCS) if "procs" in entries else None,
            ssh=_ssh(entries["ssh"], ssh) if "ssh" in entries else ssh,
            python=_python(entries["python"]) if "python" in entries else default_python,
            env=_env(entries["env"], env) if "env" in entries else dict(env),
            line=item.line,
        ))
    _check_overlaps(items, nodes)
    return tuple(nodes)


def _gpus(field: Located) -> tuple[int, ...] | str:
    try:
        return parse_gpus(field.value())
    except ValueError as exc:
        message, hint = exc.args
        raise field.error(message, hint) from None


def one_index_warning(raw: Any, gpus: tuple[int, ...] | str, where: str) -> str | None:
    """A warning that ``gpus: 4`` is one index where a torchrun or SkyPilot user
    may mean a count; None otherwise, and for 0 and 1."""
    one = (isinstance(raw, int) and not isinstance(raw, bool)) or \
        (isinstance(raw, str) and bool(_DIGITS_RE.match(raw.strip())))
    if not one or isinstance(gpus, str) or gpus[0] < 2:
        return None
    index = gpus[0]
    return (f"warning: {where}: {index} means GPU index {index}, one process; for {index} "
            f"GPUs write `gpus: free:{index}` (any {index} free ones) or list them, e.g. "
            f"`gpus: {','.join(map(str, range(min(index, 16))))}`")


def parse_gpus(raw: Any) -> tuple[int, ...] | str:
    """``"3,4,5"``, ``[3, 4, 5]`` or ``3`` → (3, 4, 5), in the user's order;
    ``all``, ``free`` and ``free:N`` stay words for the node to resolve.
    Raises ``ValueError(message, hint)``; callers add the field and line."""
    if isinstance(raw, str) and raw in GPU_REQUESTS:
        return raw
    if isinstance(raw, str) and raw.startswith("free:"):
        if not FREE_N_RE.match(raw):
            raise ValueError(f"{shown(raw)} is not a GPU request",
                             f"free:N asks for N free GPUs, N from 1 to {MAX_GPU_INDEX + 1}")
        return raw
    if isinstance(raw, str):
        parts: list[Any] = [p.strip() for p in raw.split(",")]
    elif isinstance(raw, list):
        parts = raw
    elif isinstance(raw, int) and not isinstance(raw, bool):
        parts = [raw]
    else:
        raise ValueError(f"expected GPU indices like \"0,1\" or [0, 1], got {shown(raw)}", "")
    if not parts:
        raise ValueError("the GPU list is empty", "list GPU indices, or use `procs: N`")
    gpus: list[int] = []
    for part in parts:
        index = _gpu_index(part, raw)
        if index in gpus:
            raise ValueError(f"duplicate GPU {index} in {shown(raw)}", "")
        gpus.append(index)
    return tuple(gpus)


def _gpu_index(part: Any, raw: Any) -> int:
    """One entry of a GPU list as an index 0..MAX_GPU_INDEX; ``ValueError`` as above."""
    if isinstance(part, str) and _DIGITS_RE.match(part):
        part = int(part) if len(part.lstrip("0")) <= 9 else part  # longer: shown as given
    elif isinstance(part, bool) or not isinstance(part, int):
        what = "an empty entry" if part == "" else shown(part)
        raise ValueError(f"{what} in {shown(raw)} is not a GPU index",
                         "GPU indices are whole numbers 0, 1, 2, ... as nvidia-smi lists them; "
                         "or ask by what you want: all, free, free:N")
    if isinstance(part, str) or not 0 <= part <= MAX_GPU_INDEX:
        raise ValueError(f"GPU {part if isinstance(part, int) else shown(part)} in {shown(raw)} "
                         f"is out of range 0-{MAX_GPU_INDEX}", "")
    return part


def _check_overlaps(items: list[Located], nodes: list[NodeSpec]) -> None:
    """Two entries for the same host must not claim the same GPU."""
    for j, node in enumerate(nodes):
        for i in range(j):
            other = nodes[i]
            if other.host != node.host:
                continue
            if node.gpu_request is not None or other.gpu_request is not None:
                raise _gpu_field(items[j]).error(
                    f"{node.host} is listed twice, and one entry asks for "
                    f"{node.gpu_request or other.gpu_request!r}",
                    hint="a host listed twice needs explicit, disjoint GPU lists; or list it "
                         "once with all its GPUs (`gpus: free:N` or `gpus: all`)")
            if node.gpus is None or other.gpus is None:
                continue
            shared = sorted(set(node.gpus) & set(other.gpus))
            if shared:
                raise _gpu_field(items[j]).error(
                    f"GPU {shared[0]} of {node.host} is already used by nodes[{i}]",
                    hint="a host may be listed twice only with disjoint GPUs")


def _gpu_field(item: Located) -> Located:
    return item.mapping(NODE_KEYS)["gpus"]


def _workload(field: Located, base_dir: str, catalog: Catalog) -> WorkloadSpec:
    """``workload:``: a built-in ``name``, or a ``script`` or ``module`` run from ``code``."""
    entries = field.mapping(WORKLOAD_KEYS)
    base_dir = os.path.abspath(base_dir)
    given = [key for key in PROGRAM_KEYS if key in entries]
    if len(given) != 1:
        both = f"; {given[0]!r} and {given[1]!r} are both given" if given else ""
        hint = "built-in workloads: " + catalog.names() if "name" in given or not given \
            else "script: train.py runs `python train.py`, module: pkg.train runs `python -m " \
                 "pkg.train`, both from the code directory"
        raise field.error("give exactly one of 'name' (a built-in workload), 'script' (your "
                          "file) or 'module' (your module, run as python -m)" + both, hint=hint)
    args = _args(entries["args"]) if "args" in entries else {}
    if "name" in entries:
        if "code" in entries:
            raise entries["code"].error(
                "'code' goes with 'script' or 'module': a built-in workload brings its own",
                hint="remove code:, or run your own program with script: or module:")
        name = entries["name"].string()
        if name not in catalog:
            close = closest_hint(name, catalog)
            raise entries["name"].error(f"unknown workload {name!r}",
                                        hint=close or "built-in workloads: " + catalog.names())
        if isinstance(args, tuple):
            raise entries["args"].error(
                "a built-in workload takes its args as a mapping (ddp-orch checks each one)",
                hint=f"e.g. args: {{epochs: 10}}; `ddp-orch workloads` lists {name}'s arguments")
        args = _check_builtin_args(catalog[name], entries["args"] if "args" in entries else None,
                                   args)
        return WorkloadSpec(name=name, script=None, args=args)
    code = code_dir(entries["code"], base_dir) if "code" in entries else None
    if "module" in entries:
        module = _module(entries["module"])
        code = code or _default_code(entries["module"], base_dir, "this file's directory")
        where = f"{entries['module'].source}:{entries['module'].line}: workload.module"
        given = f"from `code: {entries['code'].string()}`" if "code" in entries else \
            "without `code:` it is the cluster file's directory"
        warned = module_warning(module, code, where, given)
        return WorkloadSpec(name=None, script=None, args=args, module=module, code=code,
                            warnings=(warned,) if warned else ())
    raw = entries["script"].string()
    try:
        script = script_in(code or base_dir, raw, code is not None)
    except ValueError as exc:
        message, hint = exc.args
        raise entries["script"].error(message, hint) from None
    return WorkloadSpec(name=None, script=script, args=args, module=None,
                        code=code or _default_code(entries["script"], os.path.dirname(script),
                                                   "the script's directory"))


def script_in(root: str, raw: str, under_code: bool) -> str:
    """The absolute path of script ``raw`` under ``root``, inside the code
    directory when ``under_code``; else ``ValueError(message, hint)``."""
    script = os.path.normpath(os.path.join(root, os.path.expanduser(raw)))
    if not os.path.isfile(script):
        raise ValueError(f"script {raw!r} not found (looked for {script})",
                         "the script is relative to the code directory (workload.code)"
                         if under_code else "script paths are relative to the cluster file")
    if under_code and os.path.commonpath([script, root]) != root:
        raise ValueError(f"script {raw!r} ({script}) is outside the code directory {root}",
                         "the code directory is what every node gets; put the script in it, "
                         "or point code at a directory that holds both")
    return script


def _module(field: Located) -> str:
    try:
        return module_name(field.string())
    except ValueError as exc:
        message, hint = exc.args
        raise field.error(message, hint) from None


def module_name(module: str) -> str:
    """``module`` if ``python -m`` takes it; else ``ValueError(message, hint)``."""
    if len(module) > MAX_MODULE_NAME or not MODULE_RE.match(module):
        hint = "a module is named with dots, without .py: pkg.train for pkg/train.py" \
            if module.endswith(".py") or "/" in module else \
            "a dotted name as `python -m` takes it, e.g. pkg.train"
        raise ValueError(f"{module!r} is not a module name", hint)
    return module


def module_found(module: str, code: str) -> bool:
    """Whether ``python -m module`` would find it in ``code`` (a namespace
    package too): a few stat calls, no walk, no import."""
    parts = module.split(".")
    path = os.path.join(code, *parts)
    return (os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__init__.py"))
            or os.path.isfile(os.path.join(path, "__main__.py"))
            or os.path.isdir(os.path.join(code, parts[0])))


def module_warning(module: str, code: str, where: str, given: str) -> str | None:
    """A warning when ``module`` is not in ``code``, or None. Not a refusal: setup
    or the node's Python may provide it; else every rank fails with
    ``No module named ...``, with nothing pointing at ``code:``."""
    if module_found(module, code):
        return None
    rel = "/".join(module.split("."))
    top = module.split(".")[0]
    return (f"warning: {where}: module {module!r} is not in the code directory {code} (no "
            f"{rel}.py, {rel}/__init__.py, {rel}/__main__.py or {top}/ there; {given}): "
            f"every rank will fail with `No module named '{top}'` unless `setup:` installs "
            f"it or the nodes' `python:` has it; else set `code:` (relative to the cluster "
            f"file) to the directory that holds {top}/")


def code_dir(field: Located, base_dir: str) -> str:
    """``workload.code``, relative to the cluster file; uploaded to every node,
    so never ``/`` nor a home directory."""
    raw = field.string()
    path = os.path.normpath(os.path.join(base_dir, os.path.expanduser(raw)))
    if not os.path.exists(path):
        raise field.error(f"code directory {raw!r} not found (looked for {path})",
                          hint="code is relative to the cluster file, e.g. code: . for the "
                               "directory the file is in")
    if not os.path.isdir(path):
        raise field.error(f"code {raw!r} is not a directory ({path})",
                          hint="give your project's root directory, e.g. code: .")
    why = too_broad(path)
    if why:
        raise field.error(f"code {raw!r} ({path}) {why}; all of it would be uploaded to "
                          "every node", hint="point code at your project's own directory")
    return path


def _default_code(field: Located, directory: str, what: str) -> str:
    """The code directory when ``code`` is not given (``what`` says which)."""
    why = too_broad(directory)
    if why:
        raise field.error(f"the code directory, by default {what} {directory}, {why}; all of "
                          "it would be uploaded to every node",
                          hint="set workload.code to your project's own directory")
    return directory


def too_broad(directory: str) -> str | None:
    """Why ``directory`` may not be uploaded whole (the root, the home or above
    it), or None. The bundle keeps the same rule."""
    real = os.path.realpath(directory)
    home = os.path.realpath(os.path.expanduser("~"))
    if os.path.dirname(real) == real:
        return "is the filesystem root"
    if real == home:
        return "is your home directory"
    if os.path.commonpath([real, home]) == real:
        return f"contains your home directory {home}"
    return None


def _args(field: Located) -> dict[str, Any] | tuple[str, ...]:
    """``args:`` as a mapping (rendered as flags) or a list, passed verbatim."""
    if isinstance(field.node, yaml.SequenceNode):
        return _arg_list(field)
    if not isinstance(field.node, yaml.MappingNode):
        raise field.error(f"expected a mapping or a list, got {field.describe()}",
                          hint="args: {epochs: 10} passes --epochs 10; args: [configs/x.yaml, "
                               "--lr=0.1] passes those words as they are")
    args: dict[str, Any] = {}
    for key, value_field in field.mapping(None).items():
        value = value_field.value()
        items = value if isinstance(value, list) else [value]
        if isinstance(value, dict) or any(isinstance(v, (dict, list)) for v in items):
            raise value_field.error(f"expected a value or a list of values, got {value_field.describe()}")
        args[key] = value
    return args


def _arg_list(field: Located) -> tuple[str, ...]:
    """``args: [...]``: each item one argument, exactly as written (``0.10`` stays ``0.10``)."""
    words = []
    for item in field.sequence():
        hint = ("each item is one argument, as written: [configs/x.yaml, --lr=0.1, -v, 50]; "
                'quote one that YAML would read otherwise ("", "null", "a: b")')
        if not isinstance(item.node, yaml.ScalarNode):
            raise item.error(f"expected one argument (a string), got {item.describe()}", hint)
        if item.scalar() is None:  # also reads it: a bad tag is an error here
            raise item.error("expected one argument (a string), got nothing (null)", hint)
        word = item.node.value
        if "\0" in word:
            raise item.error("an argument cannot hold a NUL character")
        words.append(word)
    return tuple(words)


def _check_builtin_args(info: Workload, field: Located | None,
                        args: Mapping[str, Any]) -> dict[str, Any]:
    entries = field.mapping(None) if field is not None else {}
    try:
        return check_workload_args(info, args)
    except ValueError as exc:
        key, message, hint = exc.args
        raise entries[key].error(message, hint) from None


# The words YAML 1.1 (PyYAML's resolver) reads as booleans, by the value read.
_YAML_BOOL_WORDS = {True: ("true", "yes", "on", "y"), False: ("false", "no", "off", "n")}


def check_workload_args(info: Workload, args: Mapping[str, Any]) -> dict[str, Any]:
    """``args`` checked against workload ``info``'s; ``ValueError(key, message, hint)``.
    YAML reads ``amp: off`` as false; for a string argument with such a
    choice, the value is that choice as the user wrote it."""
    name = info.name
    checked = dict(args)
    for key, value in args.items():
        spec = info.arg(key)
        if spec is None:
            known = [a.name for a in info.args]
            close = closest_hint(key.replace("-", "_"), known)
            raise ValueError(key, f"workload {name!r} has no argument {key!r}",
                             close or ("it takes: " + ", ".join(known) if known else "it takes none"))
        if spec.type is str and isinstance(value, bool):
            words = [c for c in spec.choices if str(c).lower() in _YAML_BOOL_WORDS[value]]
            if len(words) == 1:
                value = checked[key] = words[0]
        if not _matches_type(spec.type, value):
            quote = ("YAML reads yes/no/on/off/true/false as a boolean: quote the word, "
                     f"{key}: 'off'" if spec.type is str and isinstance(value, bool) else "")
            raise ValueError(key, f"expected {spec.type.__name__}, got {shown(value)}", quote)
        if spec.choices and value not in spec.choices:
            choices = ", ".join(map(str, spec.choices))
            raise ValueError(key, f"{shown(value)} is not one of {choices}", "")
        if spec.minimum is not None and value < spec.minimum:
            raise ValueError(key, f"{shown(value)} is below the minimum {spec.minimum}", "")
    return checked


def _matches_type(kind: type, value: Any) -> bool:
    """YAML's value fits an argument of ``kind`` (an int is a fine float)."""
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float))
    if kind is int:
        return isinstance(value, int)
    return isinstance(value, (str, int, float))


def cuda_without_gpus(device: str, nodes: "tuple[NodeSpec, ...] | list[NodeSpec]") -> bool:
    """A ``procs:`` node runs CPU processes, which cannot join a CUDA job (the
    plan would otherwise run it on CPU without a word)."""
    return device == "cuda" and any(node.procs is not None for node in nodes)


def _names_a_plugin(root: Located) -> bool:
    """Whether the file needs the plugins' blocks: it names a backend that is
    not built in, or has a top-level key the built-ins do not know."""
    node = root.node
    if not isinstance(node, yaml.MappingNode):
        return False
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            continue
        if key.value not in TOP_KEYS or (key.value == "backend"
                                        and isinstance(value, yaml.ScalarNode)
                                        and value.value not in BACKENDS):
            return True
    return False


def _placer(known: tuple, top: Mapping[str, Located]):
    """The block that places ``nodes: {count: N}``: the named backend's, if it
    places nodes, else the first that does."""
    placing = [block for block in known if block.PLACES_NODES]
    named = top["backend"].scalar() if "backend" in top else None
    return next((b for b in placing if b.BACKEND == named), placing[0] if placing else None)


def workdir_unused(backend: str, nodes: "tuple[NodeSpec, ...] | list[NodeSpec]") -> str | None:
    """Why ``workdir:`` would reach no node, or None: it is for SSH nodes only;
    localhost and Slurm nodes keep their files in the run directory."""
    for block in blocks(plugins=backend not in BACKENDS):
        if block.BACKEND == backend and block.WORKDIR_UNUSED:
            return block.WORKDIR_UNUSED
    if all(node.is_local for node in nodes):
        return ("every node is localhost, whose files live in the run directory on this "
                "machine (runs/<run id>/node-<k>)")
    return None


def _check_layout(spec: ClusterSpec, top: Mapping[str, Located]) -> None:
    """Rules that involve several fields at once."""
    if cuda_without_gpus(spec.device, spec.nodes):
        raise top["device"].error("a `procs:` node has no GPUs and cannot join a CUDA job",
                                  hint="use `device: cpu` or give that node `gpus:`")
    unused = workdir_unused(spec.backend, spec.nodes) if "workdir" in top else None
    if unused:
        raise top["workdir"].error(
            f"no node would use it: {unused}; workdir is where runs live on remote (ssh) "
            "nodes",
            hint="remove workdir:; `ddp-orch up --runs-dir DIR` puts the runs (and these "
                 "nodes' files) in DIR. Each rank works in its node's code root, the copy of "
                 "workload.code (or of the built-in workloads) there")
    if spec.backend == "local":
        remote = [node for node in spec.nodes if not node.is_local]
        if remote:
            raise top["backend"].error(
                f"the local backend runs every node on this machine, but node "
                f"{spec.nodes.index(remote[0])} is {remote[0].host!r}",
                hint="use `backend: ssh` for remote hosts, or `host: localhost`")
    mixed = spec.nodes[0].is_local and not all(node.is_local for node in spec.nodes)
    if mixed and spec.master_addr is None:
        raise top["nodes"].error("node 0 is localhost but other nodes are remote",
                                 hint="set master.addr to this machine's address as the other nodes see it")


_WHEN_CHANGED_EXAMPLE = ("setup: {commands: [pip install -r requirements.txt], "
                         "when_changed: [requirements.txt]}")


def _setup_block(field: Located, workload: WorkloadSpec, warnings: list[str]) -> dict[str, Any]:
    """``setup:``: commands, or ``commands`` and ``when_changed``, the files whose
    content decides whether a node runs its setup again."""
    if not isinstance(field.node, yaml.MappingNode):
        return {"setup": _setup(field)}
    entries = field.mapping(SETUP_KEYS)
    if "commands" not in entries:
        raise field.error("missing 'commands'", hint=f"e.g. {_WHEN_CHANGED_EXAMPLE}")
    out: dict[str, Any] = {"setup": _setup(entries["commands"])}
    if "when_changed" in entries:
        out["setup_when_changed"] = _when_changed(entries["when_changed"], workload, warnings)
    return out


def _when_changed(field: Located, workload: WorkloadSpec, warnings: list[str]) -> tuple[str, ...]:
    """``setup.when_changed``: files under the code root. A directory is refused;
    a missing file is a warning (weighed as missing until it exists)."""
    items = [field] if not isinstance(field.node, yaml.SequenceNode) else field.sequence()
    if not items:
        raise field.error("no files are listed",
                          hint=f"list the files setup reads, e.g. {_WHEN_CHANGED_EXAMPLE}; "
                               "without when_changed the setup runs on every run")
    if len(items) > MAX_WHEN_CHANGED:
        raise field.error(f"{len(items)} files, more than {MAX_WHEN_CHANGED}",
                          hint="list the few files setup reads (requirements.txt, a lock file)")
    paths: list[str] = []
    for item in items:
        path = item.string()
        problem = path_problem(path)
        if problem:
            raise item.error(f"{path!r} {problem}",
                             hint="when_changed lists files relative to the code root "
                                  "(workload.code), e.g. requirements.txt or env/lock.txt")
        if path in paths:
            raise item.error(f"{path!r} is listed twice", hint="list each file once")
        where = f"{item.source}:{item.line}: {item.path}"
        if workload.code is None:
            warnings.append(f"warning: {where}: a built-in workload's code root is ddp-orch's "
                            f"code/, which has no {path}; it is weighed as missing")
        elif os.path.isdir(os.path.join(workload.code, path)):
            raise item.error(f"{path!r} is a directory in the code directory {workload.code}",
                             hint="list the files in it that setup reads")
        elif not os.path.isfile(os.path.join(workload.code, path)):
            warnings.append(f"warning: {where}: {path} is not in the code directory "
                            f"{workload.code}; it is weighed as missing, so setup runs again "
                            "once it is there")
        paths.append(path)
    return tuple(paths)


def _setup(field: Located) -> tuple[str | tuple[str, ...], ...]:
    """``setup:``: a string is shell text for ``sh -c``; a list is one argv, no shell."""
    items = [field] if not isinstance(field.node, yaml.SequenceNode) else field.sequence()
    if len(items) > MAX_SETUP_COMMANDS:
        raise field.error(f"{len(items)} setup commands, more than {MAX_SETUP_COMMANDS}",
                          hint="put them in a script in the code and run that")
    return tuple(_setup_command(item) for item in items)


_SETUP_HINT = ('each setup command is a string, run by the node\'s `sh -c` in the code root '
               '("pip install -r requirements.txt"), or a list, one program and its '
               'arguments run as they are ([python, -m, pip, install, -r, requirements.txt])')


def _setup_command(field: Located) -> str | tuple[str, ...]:
    if isinstance(field.node, yaml.SequenceNode):
        words = []
        for item in field.sequence():
            value = item.value()
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise item.error(f"expected a word of the command, got {item.describe()}",
                                 hint=_SETUP_HINT)
            words.append(str(value))
        if not words or not words[0].strip():
            raise field.error("the command is empty", hint=_SETUP_HINT)
        if any("\0" in word for word in words):
            raise field.error("a command word holds a NUL byte", hint=_SETUP_HINT)
        return tuple(words)
    if not isinstance(field.node, yaml.ScalarNode):
        raise field.error(f"a setup command must be a string or a list, got {field.describe()}",
                          hint=_SETUP_HINT)
    value = field.scalar()
    if not isinstance(value, str):
        raise field.error(f"a setup command must be a string or a list, got {field.describe()}",
                          hint=_SETUP_HINT + "; quote a command YAML reads as a number")
    if not value.strip():
        raise field.error("the command is empty", hint=_SETUP_HINT)
    if "\0" in value:
        raise field.error("the command holds a NUL byte", hint=_SETUP_HINT)
    return value


def _outputs(field: Located) -> tuple[str, ...]:
    """``outputs:``: paths or globs under node 0's code root, one or a list."""
    items = [field] if not isinstance(field.node, yaml.SequenceNode) else field.sequence()
    if len(items) > MAX_OUTPUTS:
        raise field.error(f"{len(items)} outputs, more than {MAX_OUTPUTS}",
                          hint="name a directory (out/) or a glob (out/*.json) instead")
    return tuple(_output_pattern(item) for item in items)


def _output_pattern(field: Located) -> str:
    pattern = field.string()
    problem = pattern_problem(pattern)
    if problem:
        raise field.error(f"{pattern!r} {problem}",
                          hint="outputs are paths or globs relative to the code root on node 0, "
                               "e.g. out/metrics.json, out/*.png, out/ or checkpoints/**/*.pt")
    return pattern
